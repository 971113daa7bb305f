"""The state build reuses what it read from unchanged objects (the grouper's and the state's per-object memos): over
cycles of watch changes, every state equals the one a build without any memo gives."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from kai_opt.api import DEFAULT_PRIORITY_CLASSES
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s.cache import ClusterCache
from kai_opt.state import ClusterState, build_state
from kai_opt.state import build as build_mod
from models.generators import families

NAMES = ("kai-opt",)


def _load(objects: list[Any]) -> ClusterCache:
    c = ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS)  # type: ignore[arg-type]
    for i, o in enumerate(objects):
        store = next((s for (_av, kind), s in c._stores.items() if kind == o.kind), None)
        if store is None:
            continue
        obj = copy.deepcopy(o.obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{i}")
        meta.setdefault("resourceVersion", "1")
        c._apply(store.res, "ADDED", cache_mod.clean(obj, store.res))
    return c


def _eq(x: Any, y: Any, where: str) -> None:
    if isinstance(x, np.ndarray):
        assert isinstance(y, np.ndarray) and x.shape == y.shape and x.dtype == y.dtype, where
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), where
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        assert type(x) is type(y), where
        for f in dataclasses.fields(x):
            _eq(getattr(x, f.name), getattr(y, f.name), f"{where}.{f.name}")
    elif isinstance(x, (list, tuple)):
        assert isinstance(y, (list, tuple)) and len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _eq(u, v, f"{where}[{i}]")
    else:
        assert x == y, where


def _same(a: ClusterState, b: ClusterState) -> None:
    for f in dataclasses.fields(ClusterState):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "pods":
            assert [p.key for p in x] == [p.key for p in y]
        elif f.name != "dra":
            _eq(x, y, f.name)


def _bump(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    meta = {**obj["metadata"], "resourceVersion": str(int(obj["metadata"]["resourceVersion"]) + 1)}
    out = {**obj, "metadata": meta}
    for path, value in changes.items():
        part, _, key = path.partition("__")
        if key:
            out[part] = {**(out.get(part) or {}), key: value}
        else:
            out[part] = value
    return out


def _mutate(c: ClusterCache, rng: np.random.Generator, step: int) -> None:
    pods = next(s for (_av, kind), s in c._stores.items() if kind == "Pod")
    nodes = next(s for (_av, kind), s in c._stores.items() if kind == "Node")
    keys = sorted(pods.items)
    node_names = sorted(n["metadata"]["name"] for n in nodes.items.values())
    for k in rng.choice(keys, size=min(6, len(keys)), replace=False).tolist():
        pod = pods.items[k]
        what = int(rng.integers(6))
        spec = pod.get("spec") or {}
        if what == 0:
            c._apply(pods.res, "DELETED", pod)
        elif what == 1:  # a copy arrives pending
            new = copy.deepcopy(pod)
            new["metadata"].update(name=f"{new['metadata']['name']}-c{step}", uid=f"{k}-c{step}",
                                   resourceVersion="1")
            new["spec"].pop("nodeName", None)
            new["status"] = {"phase": "Pending"}
            c._apply(pods.res, "ADDED", new)
        elif what == 2 and not spec.get("nodeName"):  # bound somewhere
            c._apply(pods.res, "MODIFIED", _bump(pod, spec__nodeName=str(rng.choice(node_names)),
                                                 status={"phase": "Running"}))
        elif what == 3:
            c._apply(pods.res, "MODIFIED", _bump(pod, status__phase="Succeeded"))
        elif what == 4:
            meta = {**pod["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
            c._apply(pods.res, "MODIFIED", _bump({**pod, "metadata": meta}))
        else:
            c._apply(pods.res, "MODIFIED", _bump(pod, spec__priorityClassName="build-preemptible"
                                                 if spec.get("priorityClassName") != "build-preemptible"
                                                 else "train"))
    groups = next(s for (_av, kind), s in c._stores.items() if kind == "PodGroup")
    for k in rng.choice(sorted(groups.items), size=min(3, len(groups.items)), replace=False).tolist():
        pg = groups.items[k]
        what = int(rng.integers(3))
        if what == 0:
            c._apply(groups.res, "DELETED", pg)
        elif what == 1:
            c._apply(groups.res, "MODIFIED", _bump(pg, spec__minMember=int(rng.integers(1, 4))))
        else:
            c._apply(groups.res, "MODIFIED", _bump(pg, spec__priorityClassName=str(rng.choice(
                ["train", "inference", "build-preemptible", "no-such-class"]))))
    if step % 3 == 2:  # a node changes
        node = nodes.items[sorted(nodes.items)[int(rng.integers(len(nodes.items)))]]
        status = {**node["status"], "allocatable": {**node["status"]["allocatable"], "cpu": str(int(rng.integers(
            16, 64)))}}
        c._apply(nodes.res, "MODIFIED", _bump(node, status=status))


@pytest.mark.parametrize("family,seed", [("fractions", 0), ("topology", 1), ("gangs", 2), ("contention", 3)])
def test_states_built_with_the_memos_equal_fresh_builds_over_changing_cycles(family: str, seed: int) -> None:
    c = _load(getattr(families, family)(40, seed))
    rng = np.random.default_rng(seed)
    for step in range(8):
        snap = c.snapshot(scheduler_names=NAMES, now=1.8e9)
        with_memo = build_state(snap, now=snap.now)
        build_mod.reset_memos()
        _same(with_memo, build_state(snap, now=snap.now))
        _mutate(c, rng, step)


def test_a_pod_rows_restart_makes_the_group_rows_read_again() -> None:
    """The groups' key ids are interned in the pods' key table: when that table starts again (PodRows does when
    keys of pods long gone pile up), the group rows are read again rather than keep ids of the old table."""
    c = _load(families.gangs(40, 5))
    snap = c.snapshot(scheduler_names=NAMES, now=1.8e9)
    build_state(snap, now=snap.now)
    build_mod._POD_ROWS.__init__()  # type: ignore[misc]  # (what PodRows.columns does on too many keys)
    build_mod._POD_ROWS.keys.id("another/key")  # the new table's ids differ from the old one's
    with_memo = build_state(snap, now=snap.now)
    build_mod.reset_memos()
    _same(with_memo, build_state(snap, now=snap.now))


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.sampled_from([None, "train", "build", "no-such-class"]),
                            hst.lists(hst.tuples(hst.sampled_from([None, "inference", "build", "nope"]),
                                                 hst.sampled_from([None, -5, 0, 75])), max_size=3),
                            hst.sampled_from([None, "preemptible", "non-preemptible"])),
                 min_size=1, max_size=12))
def test_a_podgroup_without_a_known_class_takes_its_pods_priority(groups: list) -> None:
    """A PodGroup with no known priority class of its own takes its first pod's known class, else its first pod's
    priority, else the default (read in bulk from the pods' rows: build._member_priorities, which must agree with
    the one-group rule build._priority_of), and is preemptible by that priority unless its spec says."""
    from builders import node, pod, podgroup, queue, snapshot

    objs = [node("n"), queue("q")]
    for i, (pc, pods, preemptibility) in enumerate(groups):
        pg = podgroup(f"g{i}", "q")
        if pc is None:
            del pg.obj["spec"]["priorityClassName"]
        else:
            pg.obj["spec"]["priorityClassName"] = pc
        if preemptibility:
            pg.obj["spec"]["preemptibility"] = preemptibility
        objs.append(pg)
        for j, (pod_pc, prio) in enumerate(pods):
            extra: dict[str, Any] = {}
            if pod_pc:
                extra["priorityClassName"] = pod_pc
            if prio is not None:
                extra["priority"] = prio
            objs.append(pod(f"g{i}-{j}", f"g{i}", gpus=1, **extra))
    build_mod.reset_memos()
    snap = snapshot(objs)
    st = build_state(snap)
    pc_value = dict(DEFAULT_PRIORITY_CLASSES)  # (no PriorityClass objects here: the default classes, default 0)
    for i, (pc, pods, preemptibility) in enumerate(groups):
        g = st.pg_index[f"default/g{i}"]
        members = [p for p in snap.pods if p.podgroup == f"g{i}"]  # (in the snapshot's order)
        if pc and pc in pc_value:
            assert st.pg_priority[g] == pc_value[pc]
        else:
            assert st.pg_priority[g] == build_mod._priority_of(members, pc_value, 0), (pc, pods)
        if preemptibility:
            assert bool(st.pg_preemptible[g]) == (preemptibility == "preemptible")
        else:
            assert bool(st.pg_preemptible[g]) == (st.pg_priority[g] < build_mod.NON_PREEMPTIBLE_PRIORITY)


def test_the_snapshot_lists_objects_in_the_stores_order_when_a_model_goes_and_comes_back() -> None:
    """A pod whose model goes away (rejected) and comes back keeps its place in the store: the snapshot lists
    the pods as a cache loaded afresh with the store's objects does (the models dict's own order then differs)."""
    c = _load(families.gangs(20, 0))
    pods = next(s for (_av, kind), s in c._stores.items() if kind == "Pod")
    c.snapshot(scheduler_names=NAMES, now=1.8e9)
    key = sorted(pods.items)[3]
    pod = pods.items[key]
    containers = copy.deepcopy(pod["spec"]["containers"])
    bad = copy.deepcopy(containers)
    bad[0].setdefault("resources", {}).setdefault("requests", {})["cpu"] = "not-a-quantity"
    c._apply(pods.res, "MODIFIED", _bump(pod, spec__containers=bad))
    snap = c.snapshot(scheduler_names=NAMES, now=1.8e9)
    assert key not in [p.key for p in snap.pods]
    c._apply(pods.res, "MODIFIED", _bump(pods.items[key], spec__containers=containers))
    snap = c.snapshot(scheduler_names=NAMES, now=1.8e9)
    fresh = ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS)  # type: ignore[arg-type]
    for (_av, _kind), s in c._stores.items():
        for o in s.items.values():
            fresh._apply(s.res, "ADDED", o)
    want = fresh.snapshot(scheduler_names=NAMES, now=1.8e9)
    assert key in [p.key for p in snap.pods]
    assert [p.key for p in snap.pods] == [p.key for p in want.pods]
    assert [g.key for g in snap.podgroups] == [g.key for g in want.podgroups]


def test_the_views_keep_the_stores_order_as_pods_come_and_go() -> None:
    """Several pods added between two looks go into the view in the store's order (so the snapshot reads the
    models in order instead of looking each key up), deleted ones leave it, changed ones keep their place."""
    c = _load(families.gangs(20, 1))
    pods = next(s for (_av, kind), s in c._stores.items() if kind == "Pod")
    view_key = next(k for k in c._stores if k[1] == "Pod")
    rng = np.random.default_rng(5)
    for step in range(4):
        c.snapshot(scheduler_names=NAMES, now=1.8e9)
        assert list(c._views[view_key].model) == list(pods.items)
        _mutate(c, rng, step)
        for i, k in enumerate(sorted(pods.items)[:5]):  # five new pending pods at once
            new = copy.deepcopy(pods.items[k])
            new["metadata"].update(name=f"extra-{step}-{i}", uid=f"extra-{step}-{i}", resourceVersion="1")
            new["spec"].pop("nodeName", None)
            new["status"] = {"phase": "Pending"}
            c._apply(pods.res, "ADDED", new)
    snap = c.snapshot(scheduler_names=NAMES, now=1.8e9)
    assert list(c._views[view_key].model) == list(pods.items)
    assert [p.key for p in snap.pods] == list(pods.items)


def test_changed_keys_are_read_with_the_new_ones_in_the_stores_order() -> None:
    """Keys with a model keep their place whatever their order; new keys go in in the store's order, so the
    models dict needs no reordering after a look that adds several."""
    keys = [f"k{i}" for i in range(10)]
    models = {k: object() for k in keys[:6]}
    unread = {"k8", "k2", "k6", "k9", "k7"}
    order = cache_mod._read_order(unread, models, keys)
    assert order[0] == "k2" and order[1:] == ["k6", "k7", "k8", "k9"]
    assert cache_mod._read_order({"k1", "k9"}, models, keys)[-1] == "k9"
