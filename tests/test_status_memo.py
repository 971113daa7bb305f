"""The status writer's memos (PodGroup status, PodGroup annotations, Queue status) skip only what cannot have changed:
over cycles of watch changes (pods bound, pods deleted, pending reasons changing, fair share changing, queue
positions changing, the writes landing), a writer that keeps its memos issues exactly the writes a fresh writer
issues on the same cycle."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import builders as b
import pytest

from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.heuristics.positions import queue_positions
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s import events as events_mod
from kai_opt.k8s import status as status_mod
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.chart_values import merge as merge_patch  # Helm's values rule is RFC 7386's
from kai_opt.k8s.events import EventRecorder
from kai_opt.k8s.workqueue import TokenBucket
from kai_opt.state import build_state

NS = "team"
CONFIG = parse_config({"engine": "greedy"})


class SyncPool:
    """Runs each job at once (the writes are recorded by the patched `request`)."""

    def submit(self, key: str, job: Any, *, replace: bool = False) -> bool:
        job()
        return True


class LaterPool:
    """Keeps the jobs until `run` (the writes land after the writer's cycle)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}

    def submit(self, key: str, job: Any, *, replace: bool = False) -> bool:
        self.jobs[key] = job
        return True

    def run(self) -> None:
        jobs, self.jobs = self.jobs, {}
        for job in jobs.values():
            job()


def _cluster() -> list[Any]:
    return [
        b.node("n1", gpus=4), b.node("n2", gpus=4),
        b.queue("top"), b.queue("qa", parent="top"), b.queue("qb", parent="top"),
        # running: a whole gang on n1, a gang below minMember (stale) and a single pod on n2
        b.podgroup("ra", "qa", 2, ns=NS), b.pod("ra-0", group="ra", gpus=1, ns=NS, node_name="n1"),
        b.pod("ra-1", group="ra", gpus=1, ns=NS, node_name="n1"),
        b.podgroup("sg", "qb", 3, ns=NS), b.pod("sg-0", group="sg", gpus=1, ns=NS, node_name="n2"),
        b.pod("sg-1", group="sg", gpus=1, ns=NS, node_name="n2"),
        b.podgroup("rb", "qb", 1, ns=NS), b.pod("rb-0", group="rb", gpus=2, ns=NS, node_name="n2"),
        # pending: a gang that fits on n1, and one that never fits (its reason changes with its request)
        b.podgroup("pa", "qa", 2, ns=NS), b.pod("pa-0", group="pa", gpus=1, ns=NS),
        b.pod("pa-1", group="pa", gpus=1, ns=NS),
        b.podgroup("huge", "qb", 1, ns=NS), b.pod("huge-0", group="huge", gpus=8, ns=NS),
    ]


def _load(objects: list[Any]) -> ClusterCache:
    c = ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS)  # type: ignore[arg-type]
    for o in objects:
        _put(c, o.kind, o.obj)
    return c


def _store(c: ClusterCache, kind: str) -> Any:
    return next(s for (_av, k), s in c._stores.items() if k == kind)


def _put(c: ClusterCache, kind: str, obj: dict[str, Any], etype: str = "ADDED") -> None:
    store = _store(c, kind)
    meta = obj.setdefault("metadata", {})
    meta.setdefault("uid", f"uid-{kind}-{meta.get('namespace', '')}-{meta['name']}")
    meta.setdefault("resourceVersion", "1")
    c._apply(store.res, etype, cache_mod.clean(obj, store.res))


def _modify(c: ClusterCache, kind: str, name: str, change: dict[str, Any]) -> None:
    """The watch's MODIFIED event: a new object, `change` merged in (a JSON merge patch)."""
    store = _store(c, kind)
    key = next(k for k in store.items if k.rsplit("/", 1)[-1] == name)
    old = store.items[key]
    new = merge_patch(old, change)
    new["metadata"] = {**new["metadata"], "resourceVersion": str(int(old["metadata"]["resourceVersion"]) + 1)}
    c._apply(store.res, "MODIFIED", new)


def _delete(c: ClusterCache, kind: str, name: str) -> None:
    store = _store(c, kind)
    key = next(k for k in store.items if k.rsplit("/", 1)[-1] == name)
    c._apply(store.res, "DELETED", store.items[key])


def _land(c: ClusterCache, writes: list[tuple[str, str]]) -> None:
    """The written status and annotations show up in the watch."""
    for path, body in writes:
        parts = path.strip("/").split("/")
        if parts[-1] == "status":
            parts = parts[:-1]
        kind = {"podgroups": "PodGroup", "queues": "Queue"}[parts[-2]]
        _modify(c, kind, parts[-1], json.loads(body))


@pytest.mark.parametrize(("with_positions", "counts"), [(True, True), (False, True), (True, False)])
def test_a_memoized_writer_writes_what_a_fresh_writer_writes_every_cycle(monkeypatch: pytest.MonkeyPatch,
                                                                          with_positions: bool, counts: bool) -> None:
    written: list[tuple[str, str]] = []
    monkeypatch.setattr(status_mod, "request",
                        lambda api, method, path, **kw: written.append((path, json.dumps(kw["body"], sort_keys=True))))
    monkeypatch.setattr(events_mod, "request", lambda *a, **k: None)
    monkeypatch.setattr(status_mod, "now_rfc3339", lambda: "2026-01-01T00:00:00Z")  # both writers, one time
    calls: Counter[str] = Counter()
    for name in ("podgroup_status", "queue_status", "position_annotations"):
        real = getattr(status_mod, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(status_mod, name, counted)
    cache = _load(_cluster())
    pool = SyncPool()

    def writer() -> status_mod.StatusWriter:
        return status_mod.StatusWriter(None, cache, pool, TokenBucket(1000, 1000),  # type: ignore[arg-type]
                                       EventRecorder(None, pool), resend_s=0.0,  # type: ignore[arg-type]
                                       counts=counts)

    memo = writer()
    full_passes = [0]
    every_group = status_mod.StatusWriter._podgroup_objects

    def counted_pass(self: status_mod.StatusWriter) -> Any:
        full_passes[0] += self is memo
        return every_group(self)

    monkeypatch.setattr(status_mod.StatusWriter, "_podgroup_objects", counted_pass)
    log: list[tuple[str, list[tuple[str, str]]]] = []

    def cycle(what: str, land: bool = True) -> list[tuple[str, str]]:
        """One cycle: both writers on the same snapshot, state and plan; the memo's writes land (unless `land` is
        False: they failed); the plan's binds are confirmed by the watch."""
        snap = cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW)
        state = build_state(snap, now=snap.now)
        plan, fs = run_cycle(state, CONFIG)
        positions = queue_positions(state, fs, CONFIG, among=set(plan.pending)) if with_positions else None
        written.clear()
        calls.clear()
        memo.update(snap, state, plan, fs, positions)
        mine, computed = sorted(written), dict(calls)
        written.clear()
        writer().update(snap, state, plan, fs, positions)
        assert mine == sorted(written), f"{what}: the memoized writer's writes differ from a fresh writer's"
        log.append((what, mine))
        if land:
            _land(cache, mine)
        for bind in plan.binds:
            pod = state.pods[bind.pod]
            _modify(cache, "Pod", pod.name, {"spec": {"nodeName": state.node_names[bind.node]},
                                             "status": {"phase": "Running"}})
        calls.clear()
        calls.update(computed)
        return mine

    def still() -> None:
        """The writes of the last change land and its binds are confirmed; then a cycle where nothing changed
        computes nothing."""
        for _ in range(4):
            if not cycle("the writes land, the binds are confirmed"):
                break
        assert cycle("nothing changed") == []
        assert calls["podgroup_status"] == calls["queue_status"] == calls["position_annotations"] == 0, calls

    assert cycle("first"), "the first cycle writes every status"
    cycle("the first writes land, pa's pods are bound")
    still()
    _delete(cache, "Pod", "ra-1")  # ra below minMember (stale), qa's allocation down
    assert cycle("a pod deleted")
    still()
    _modify(cache, "Pod", "ra-0", {"status": {"phase": "Succeeded"}})  # ra: as many pods, none running
    assert cycle("a pod finished")
    still()
    _modify(cache, "Node", "n1", {"spec": {"unschedulable": True}})  # huge's reason, nothing of huge's
    assert cycle("a node cordoned")
    still()
    _put(cache, "PodGroup", b.podgroup("pc", "qa", 1, ns=NS).obj)
    _put(cache, "Pod", b.pod("pc-0", group="pc", gpus=2, ns=NS).obj)  # pending beside huge: positions move
    assert cycle("a group arrives")
    still()
    _delete(cache, "Pod", "rb-0")  # room on n2: pc starts; qb's allocation down
    assert cycle("a pod deleted, a pending group starts")
    still()
    _modify(cache, "Pod", "huge-0", {"spec": {"containers": [{"name": "main", "resources": {  # another reason
        "requests": {"cpu": "1000", "memory": "1Gi"}, "limits": {}}}]}})
    assert cycle("a pending pod's request changed")
    still()
    _put(cache, "PodGroup", b.podgroup("pd", "qnew", 1, ns=NS).obj)  # its queue does not exist yet
    _put(cache, "Pod", b.pod("pd-0", group="pd", gpus=1, ns=NS).obj)
    assert cycle("a group of a missing queue arrives")
    still()
    _put(cache, "Queue", b.queue("qnew", parent="top").obj)  # the group is valid now; nothing of it changed
    assert cycle("its queue arrives")
    still()
    _modify(cache, "Pod", "pd-0", {"metadata": {"annotations": {"pod-group-name": "huge"}}})  # another group
    cycle("a pod moves to another group")
    still()
    _delete(cache, "PodGroup", "pc")  # its pod stays, naming a group that is gone
    cycle("a PodGroup deleted")
    still()
    _modify(cache, "PodGroup", "pa", {"spec": {"minMember": 3}})  # 2 running of 3: pending and stale
    assert cycle("a PodGroup's minMember raised", land=False), "its status and annotations are written"
    assert cycle("the writes failed: written again"), "a group out of sync is looked at again"
    still()
    paths = {p for _what, writes in log for p, _body in writes}
    assert any("/queues/" in p for p in paths) and any(p.endswith("/podgroups/ra") for p in paths), paths
    bodies = [json.loads(body) for _what, writes in log for _p, body in writes]
    assert any("phase" in (body.get("status") or {}) for body in bodies) == counts, "phase and counts only when on"
    assert full_passes == [1], "after the first cycle only the groups whose inputs changed are looked at"


def test_a_status_patch_on_its_way_is_not_worked_out_again_until_it_may_be_resent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A PodGroup whose status write has not shown up in the watch yet is computed again only once its inputs
    change, its write failed, or `resend_s` passed: the writes are those of the rule that skips an identical
    patch within `resend_s` (the writer's _submit), without working the patch out every cycle."""
    written: list[str] = []
    fail = [False]

    def send(api: Any, method: str, path: str, **kw: Any) -> None:
        if fail[0]:
            raise OSError("the apiserver is away")
        written.append(path)

    monkeypatch.setattr(status_mod, "request", send)
    monkeypatch.setattr(events_mod, "request", lambda *a, **k: None)
    monkeypatch.setattr(status_mod, "now_rfc3339", lambda: "2026-01-01T00:00:00Z")
    computed: Counter[str] = Counter()
    real = status_mod.podgroup_status

    def counted(obj: dict[str, Any], *a: Any, **k: Any) -> Any:
        computed[obj["metadata"]["name"]] += 1
        return real(obj, *a, **k)

    monkeypatch.setattr(status_mod, "podgroup_status", counted)
    cache = _load(_cluster())
    clock = [1000.0]
    pool = LaterPool()  # the writes run after the cycle, as the status pool's workers do
    w = status_mod.StatusWriter(None, cache, pool, TokenBucket(1000, 1000),  # type: ignore[arg-type]
                                EventRecorder(None, pool), resend_s=30.0,  # type: ignore[arg-type]
                                clock=lambda: clock[0])

    def cycle() -> list[str]:
        snap = cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW)
        state = build_state(snap, now=snap.now)
        plan, fs = run_cycle(state, CONFIG)
        written.clear()
        computed.clear()
        w.update(snap, state, plan, fs)
        pool.run()
        return sorted(p for p in written if "/podgroups/" in p and p.endswith("/status"))

    huge = f"/apis/scheduling.run.ai/v2alpha2/namespaces/{NS}/podgroups/huge/status"
    assert huge in cycle(), "the first cycle writes huge's condition (its writes never show up in this test)"
    assert huge not in cycle() and computed["huge"] == 0, "on its way, the same inputs: not worked out again"
    clock[0] += 31.0
    assert huge in cycle() and computed["huge"] == 1, "resend_s passed: worked out and sent again"
    assert cycle() == [] and computed["huge"] == 0, "within resend_s of the last send"
    clock[0] += 31.0
    fail[0] = True
    cycle()  # the write is sent and fails after the cycle: the writer forgets it
    fail[0] = False
    assert huge in cycle() and computed["huge"] == 1, "a failed write: worked out and sent again at once"
    _modify(cache, "Pod", "huge-0", {"spec": {"containers": [{"name": "main", "resources": {
        "requests": {"cpu": "1000", "memory": "1Gi"}, "limits": {}}}]}})  # another reason
    assert huge in cycle() and computed["huge"] == 1, "new inputs: worked out again (and the patch changed)"
