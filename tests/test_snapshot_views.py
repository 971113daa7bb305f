"""The watch cache's snapshot views make again only what changed: over cycles of watch events, assumptions,
releases, holds, groups of the cycle, bad objects and relists, every snapshot equals the one a cache without views
gives (the same objects, in the same order, with the same warnings and rejections) and so does the state built
from it."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from test_state_reuse import NAMES, _bump, _load, _mutate, _same

from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s.cache import ClusterCache
from kai_opt.snapshot import Snapshot
from kai_opt.state import build_state
from models.generators import families

LISTS = ("nodes", "pods", "podgroups", "queues", "priority_classes", "topologies", "device_classes",
         "resource_slices", "resource_claims", "claim_templates", "device_taint_rules", "warnings", "rejected")


def _store(c: ClusterCache, kind: str) -> Any:
    return next(s for (_av, k), s in c._stores.items() if k == kind)


def _equal(a: Snapshot, b: Snapshot, where: str) -> None:
    for name in LISTS:
        x, y = getattr(a, name), getattr(b, name)
        assert len(x) == len(y), f"{where}: {name}"
        for u, v in zip(x, y, strict=True):
            assert u == v, f"{where}: {name}"
    assert a.scheduler_names == b.scheduler_names


def _cycle_inputs(c: ClusterCache, rng: np.random.Generator, step: int) -> tuple[dict[str, str], set[str]]:
    """Assumptions and releases made on `c` (the same on both caches, as the rng is), and this cycle's groups
    of pods without the annotation and the pods held out."""
    pods = _store(c, "Pod").items
    keys = sorted(pods)
    pending = [k for k in keys if not (pods[k].get("spec") or {}).get("nodeName")]
    running = [k for k in keys if (pods[k].get("spec") or {}).get("nodeName")]
    nodes = sorted(_store(c, "Node").items)
    for k in rng.choice(pending, size=min(3, len(pending)), replace=False).tolist() if pending else []:
        meta = pods[k]["metadata"]
        what = int(rng.integers(3))
        if what == 0:
            c.assume_bound(meta["uid"], meta["namespace"], meta["name"], str(rng.choice(nodes)),
                           tuple(int(x) for x in rng.choice(4, size=int(rng.integers(0, 3)), replace=False)))
        elif what == 1:
            c.forget_bound(meta["uid"])
    for k in rng.choice(running, size=min(2, len(running)), replace=False).tolist() if running else []:
        uid = pods[k]["metadata"]["uid"]
        if rng.integers(2):
            c.assume_releasing(uid)
        else:
            c.forget_releasing(uid)
    groups = {k: f"grp-{int(rng.integers(3))}" for k in keys if rng.random() < 0.2}
    hold = {k for k in pending if rng.random() < 0.1}
    return groups, hold


def _strip_annotation(c: ClusterCache, rng: np.random.Generator) -> None:
    """A pod loses its pod-group-name annotation (the grouper's group of the cycle then applies to it)."""
    store = _store(c, "Pod")
    key = sorted(store.items)[int(rng.integers(len(store.items)))]
    pod = store.items[key]
    meta = {**pod["metadata"], "annotations": {k: v for k, v in (pod["metadata"].get("annotations") or {}).items()
                                               if k != "pod-group-name"},
            "resourceVersion": str(int(pod["metadata"]["resourceVersion"]) + 1)}
    c._apply(store.res, "MODIFIED", {**pod, "metadata": meta})


def _bad_objects(c: ClusterCache, step: int) -> None:
    """A pod the models refuse (rejected), then fixed two steps later; a pod naming a PodGroup that does not
    exist, a PodGroup naming a queue and one naming a topology that do not exist (warnings); the pod and the
    first group are gone two steps later."""
    store = _store(c, "Pod")
    groups = _store(c, "PodGroup")
    if step == 1:
        pod = copy.deepcopy(store.items[sorted(store.items)[1]])
        pod["metadata"].update(name="lost-pod", uid="uid-lost", resourceVersion="1")
        pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), "pod-group-name": "nowhere"}
        pod["spec"].pop("nodeName", None)
        pod["status"] = {"phase": "Pending"}
        c._apply(store.res, "ADDED", pod)
        group = copy.deepcopy(groups.items[sorted(groups.items)[0]])
        group["metadata"].update(name="lost-group", uid="uid-lost-group", resourceVersion="1")
        group["spec"]["queue"] = "no-such-queue"
        c._apply(groups.res, "ADDED", group)
        group = copy.deepcopy(groups.items[sorted(groups.items)[1]])
        group["metadata"].update(name="lost-topology", uid="uid-lost-topology", resourceVersion="1")
        group["spec"]["topologyConstraint"] = {"topology": "no-such-topology", "requiredTopologyLevel": "rack"}
        c._apply(groups.res, "ADDED", group)
    elif step == 3:
        c._apply(store.res, "DELETED", store.items["default/lost-pod"] if "default/lost-pod" in store.items
                 else next(p for p in store.items.values() if p["metadata"]["name"] == "lost-pod"))
        c._apply(groups.res, "DELETED", next(g for g in groups.items.values()
                                              if g["metadata"]["name"] == "lost-group"))
    template = store.items[sorted(store.items)[0]]
    bad = copy.deepcopy(template)
    bad["metadata"].update(name="bad-pod", uid="uid-bad", resourceVersion=str(step + 1))
    bad["spec"]["containers"][0].setdefault("resources", {})["requests"] = {"cpu": "lots"}
    if step == 2:
        c._apply(store.res, "ADDED", bad)
    elif step == 4:
        bad["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
        c._apply(store.res, "MODIFIED", bad)


@pytest.mark.parametrize("family,seed", [("fractions", 0), ("topology", 1), ("gangs", 2), ("contention", 3)])
def test_snapshots_from_views_equal_snapshots_made_from_scratch(family: str, seed: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    objects = getattr(families, family)(40, seed)
    a, b = _load(objects), _load(objects)  # a keeps its views; b makes every snapshot from scratch
    ra, rb = np.random.default_rng(seed), np.random.default_rng(seed)
    rejected_seen = warned = 0
    for step in range(10):
        monkeypatch.setattr(cache_mod, "_now_rfc3339", lambda step=step: f"2026-01-01T00:00:{step:02d}Z")
        ga, ha = _cycle_inputs(a, ra, step)
        gb, hb = _cycle_inputs(b, rb, step)
        assert ga == gb and ha == hb
        if step == 6:  # a relist replaces a store's items (one changed, one gone: watch events were missed)
            for c in (a, b):
                store = _store(c, "PodGroup")
                items = dict(store.items)
                first, second = sorted(items)[:2]
                items[first] = _bump(items[first], spec__minMember=7)
                del items[second]
                store.replace(items)
        sa = a.snapshot(scheduler_names=NAMES, now=1.8e9, pod_groups=ga, hold=ha)
        b._views.clear()
        sb = b.snapshot(scheduler_names=NAMES, now=1.8e9, pod_groups=gb, hold=hb)
        _equal(sa, sb, f"step {step}")
        pure = Snapshot.from_objects(b.scheduling_objects(NAMES, pod_groups=gb, hold=hb), strict=False,
                                     scheduler_names=NAMES, now=1.8e9, source="cluster")
        _equal(sa, pure, f"step {step}, read from the objects")
        assert sa.any_pod_claims == any(p.resource_claims for p in sa.pods)
        rejected_seen += len(sa.rejected)
        warned += sum(w.reason in ("PodGroupDoesNotExist", "QueueDoesNotExist", "TopologyDoesNotExist")
                      for w in sa.warnings)
        objs_a = a.scheduling_objects(NAMES, pod_groups=ga, hold=ha)
        b._views.clear()
        objs_b = b.scheduling_objects(NAMES, pod_groups=gb, hold=hb)
        assert [(o.kind, o.obj) for o in objs_a] == [(o.kind, o.obj) for o in objs_b]
        _same(build_state(sa, now=sa.now), build_state(sb, now=sb.now))
        for c, rng in ((a, ra), (b, rb)):
            _mutate(c, rng, step)
            if step % 2:
                _strip_annotation(c, rng)
            _bad_objects(c, step)
    assert rejected_seen  # the bad pod was seen and set aside
    assert warned >= 6  # the lost pod and the lost groups were warned about in steps 2 and 3


def test_the_views_know_whether_some_pod_has_claims() -> None:
    """The state build asks whether any pod has resource claims (DRA); the views keep the answer as pods come and
    go, so it visits no pod for it."""
    c = _load(families.fractions(20, 0))
    assert c.snapshot(scheduler_names=NAMES, now=1.8e9).any_pod_claims is False
    store = _store(c, "Pod")
    pod = copy.deepcopy(store.items[sorted(store.items)[0]])
    pod["metadata"].update(name="claims", uid="uid-claims", resourceVersion="1")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "some-claim"}]
    c._apply(store.res, "ADDED", pod)
    snap = c.snapshot(scheduler_names=NAMES, now=1.8e9)
    assert snap.any_pod_claims is True and any(p.resource_claims for p in snap.pods)
    c._apply(store.res, "DELETED", pod)
    assert c.snapshot(scheduler_names=NAMES, now=1.8e9).any_pod_claims is False
