"""Unit tests of coexistence with other schedulers: which PodGroups and Queues kai-opt writes, KAI detection, the
pre-bind re-check's rules, the binder dropping a bind that no longer fits, and kubelet rejections in the cache."""

from __future__ import annotations

import threading
from typing import Any

import builders as b
import pytest
from kubernetes.client.exceptions import ApiException

from kai_opt.api import Node, Pod
from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.errors import ConfigError
from kai_opt.k8s import binder as binder_mod
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s import coexist as coexist_mod
from kai_opt.k8s import events as events_mod
from kai_opt.k8s import status as status_mod
from kai_opt.k8s.binder import Binder, BindRequest
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.coexist import KaiDetector, kubelet_rejection, owned_podgroups, writes_queue_status
from kai_opt.k8s.events import EventRecorder
from kai_opt.k8s.recheck import GPU_DEVICE, NODE_GONE, PreBindCheck, check_fit
from kai_opt.k8s.workqueue import TokenBucket, WorkPool
from kai_opt.state import R_GPU, build_state


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _raw(o: Any) -> dict[str, Any]:
    return o.obj


def _load(objects: list[Any]) -> ClusterCache:
    c = ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS)  # type: ignore[arg-type]
    for o in objects:
        store = next(s for (av, kind), s in c._stores.items() if kind == o.kind)
        meta = o.obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{o.kind}-{meta.get('namespace', '')}-{meta['name']}")
        meta.setdefault("resourceVersion", "1")
        c._apply(store.res, "ADDED", cache_mod.clean(o.obj, store.res))
    return c


# -- ownership and queue status ----------------------------------------------------------------------------------------
def test_a_podgroup_is_ours_when_some_pod_of_ours_names_it() -> None:
    pods = [Pod.from_k8s(_raw(b.pod("a", group="mine", ns="x"))),
            Pod.from_k8s(_raw(b.pod("b", group="kai", ns="x", scheduler="kai-scheduler"))),
            Pod.from_k8s(_raw(b.pod("c", group="mixed", ns="x", scheduler="kai-scheduler"))),
            Pod.from_k8s(_raw(b.pod("d", group="mixed", ns="x", phase="Succeeded"))),
            Pod.from_k8s(_raw(b.pod("e", ns="x")))]
    assert owned_podgroups(pods, ("kai-opt",)) == {"x/mine", "x/mixed"}
    assert owned_podgroups(pods, ("other",)) == set()


def test_queue_status_is_written_always_never_or_while_kai_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = []

    def fake_request(api: Any, method: str, path: str, **kw: Any) -> Any:
        assert (method, path) == ("GET", "/apis/scheduling.run.ai/v1alpha2")
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr(coexist_mod, "request", fake_request)
    clock = Clock()
    served = {"resources": [{"name": "bindrequests"}, {"name": "bindrequests/status"}]}
    d = KaiDetector(None, recheck_s=30, clock=clock)
    answers[:] = [ConnectionResetError("down")]
    assert d.installed(), "unknown yet: counts as installed (never write over KAI's status)"
    clock.t += 31
    answers[:] = [ApiException(status=404)]
    assert not d.installed()
    assert writes_queue_status("auto", d) and not answers
    clock.t += 31
    answers[:] = [served]
    assert d.installed() and not writes_queue_status("auto", d)
    clock.t += 10
    assert d.installed(), "answered from memory within recheck_s"
    clock.t += 31
    answers[:] = [ApiException(status=500)]
    assert d.installed(), "a failed look keeps the last answer"
    clock.t += 31
    answers[:] = [{"resources": [{"name": "somethingelse"}]}]
    assert not d.installed()
    assert writes_queue_status("always", None) and not writes_queue_status("never", None)
    assert parse_config({"runtime": {"queue_status": "never"}}).runtime.queue_status.value == "never"
    with pytest.raises(ConfigError):
        parse_config({"runtime": {"queue_status": "sometimes"}})


def _cluster() -> list[Any]:
    ns = "team"
    return [
        b.node("n1", gpus=4), b.queue("q", gpu=(-1, 1, -1)), b.queue("kai-q", gpu=(-1, 1, -1)),
        b.podgroup("ours", "q", 2, ns=ns), b.pod("o-0", group="ours", gpus=1, ns=ns),
        b.pod("o-1", group="ours", gpus=1, ns=ns),
        b.podgroup("big", "q", 1, ns=ns), b.pod("big-0", group="big", gpus=8, ns=ns),
        b.podgroup("kai-pg", "kai-q", 2, ns=ns),
        b.pod("k-0", group="kai-pg", gpus=1, ns=ns, scheduler="kai-scheduler", node_name="n1"),
        b.pod("k-1", group="kai-pg", gpus=8, ns=ns, scheduler="kai-scheduler"),
        b.podgroup("kai-bad", "no-such-queue", 1, ns=ns),
        b.pod("kb-0", group="kai-bad", ns=ns, scheduler="kai-scheduler"),
        b.podgroup("empty", "q", 1, ns=ns),
    ]


@pytest.mark.parametrize("queues", [True, False])
def test_status_and_events_go_only_to_our_podgroups_and_pods(monkeypatch: pytest.MonkeyPatch, queues: bool) -> None:
    written: list[str] = []
    sent: list[dict[str, Any]] = []
    lock = threading.Lock()

    def fake_status(api: Any, method: str, path: str, **kw: Any) -> None:
        with lock:
            written.append(path)

    def fake_event(api: Any, method: str, path: str, **kw: Any) -> None:
        with lock:
            sent.append(kw["body"])

    monkeypatch.setattr(status_mod, "request", fake_status)
    monkeypatch.setattr(events_mod, "request", fake_event)
    cache = _load(_cluster())
    snap = cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW)
    state = build_state(snap, now=snap.now)
    plan, fs = run_cycle(state, parse_config({"engine": "greedy"}))
    assert len(plan.binds) == 2  # o-0, o-1 beside KAI's k-0 (which keeps its GPU): 3 of 4 in use
    pool = WorkPool("status-test", 2)
    recorder = EventRecorder(None, pool)  # type: ignore[arg-type]
    w = status_mod.StatusWriter(None, cache, pool, TokenBucket(1000, 1000), recorder,  # type: ignore[arg-type]
                                write_queues=lambda: queues)
    counts = w.update(snap, state, plan, fs)
    assert pool.wait_idle(30)
    pool.stop()
    pgs = sorted(p.split("/podgroups/")[1] for p in written if "/podgroups/" in p)
    assert pgs == ["big/status", "ours", "ours/status"], written  # ours: status + last-start annotation
    qs = sorted(p.split("/queues/")[1] for p in written if "/queues/" in p)
    assert qs == (["kai-q/status", "q/status"] if queues else []), written
    assert counts["queues"] == (2 if queues else 0)
    about = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in sent}
    assert about == {("PodGroup", "big"), ("Pod", "big-0")}, about


# -- the pre-bind re-check -------------------------------------------------------------------------------------------
def _node(gpus: int = 4, cpu: str = "8", memory: str = "16Gi", pods: int = 110) -> Node:
    return Node.from_k8s(_raw(b.node("n1", gpus=gpus, cpu=cpu, memory=memory, pods=pods)))


def _pod(name: str, **kw: Any) -> Pod:
    return Pod.from_k8s(_raw(b.pod(name, **kw)))


def test_a_bind_fits_while_every_resource_of_the_node_stays_within_allocatable() -> None:
    n = _node()
    me = _pod("me", gpus=2, cpu="4", memory="8Gi")
    assert check_fit(n, [_pod("a", gpus=2, cpu="4", memory="8Gi", node_name="n1")], me) is None
    for other, resource in ((_pod("a", gpus=3, cpu="1", node_name="n1"), "nvidia.com/gpu"),
                            (_pod("a", cpu="5", node_name="n1"), "cpu"),
                            (_pod("a", cpu="1", memory="9Gi", node_name="n1"), "memory")):
        misfit = check_fit(n, [other], me)
        assert misfit is not None and misfit.resource == resource, (resource, misfit)
    done = _pod("a", gpus=4, cpu="8", node_name="n1", phase="Succeeded")
    assert check_fit(n, [done], me) is None, "finished pods hold nothing"
    leaving = _pod("a", gpus=4, node_name="n1", deleting=True)
    assert check_fit(n, [leaving], me).resource == "nvidia.com/gpu", "terminating pods still hold theirs"
    full = check_fit(_node(pods=2), [_pod("a", node_name="n1"), _pod("b", node_name="n1")], _pod("me"))
    assert full is not None and full.resource == "pods"
    assert check_fit(None, [], me).resource == NODE_GONE


def test_a_bind_on_gpu_devices_fits_only_while_those_devices_have_room() -> None:
    n = _node(gpus=4)
    half = _pod("me", gpus=0.5)
    on0 = _pod("a", gpus=0.5, node_name="n1", annotations={"kai-opt.io/gpu-devices": "0"})
    assert check_fit(n, [on0], half, (0,)) is None
    whole0 = _pod("a", gpus=1, node_name="n1", annotations={"kai-opt.io/gpu-devices": "0"})
    assert check_fit(n, [whole0], half, (0,)).resource == GPU_DEVICE
    assert check_fit(n, [whole0], half, (1,)) is None
    # three whole GPUs of kube-scheduler (no device record) and one shared device: no device left for another
    foreign = _pod("f", gpus=3, node_name="n1", scheduler="default-scheduler")
    assert check_fit(n, [foreign, on0], _pod("me", gpus=0.5), (1,)).resource == GPU_DEVICE
    assert check_fit(n, [foreign, on0], _pod("me", gpus=0.5), (0,)) is None
    mem = _pod("me", annotations={"gpu-memory": "40960"})  # half of an 81920 MiB device
    assert check_fit(n, [on0], mem, (0,)) is None
    more = _pod("me", annotations={"gpu-memory": "50000"})
    assert check_fit(n, [on0], more, (0,)).resource == GPU_DEVICE


def _cache_with(*objs: Any) -> ClusterCache:
    return _load(list(objs))


def test_the_recheck_sees_pods_bound_since_the_snapshot_and_our_binds_in_flight() -> None:
    c = _cache_with(b.node("n1", gpus=4), b.pod("me", gpus=2), b.pod("mate", gpus=2))
    check = PreBindCheck(c)
    uid = "uid-Pod-default-me"
    assert check.check("default", "me", uid, "n1", (0, 1)) is None
    c.assume_bound(uid, "default", "me", "n1", (0, 1))
    assert check.check("default", "me", uid, "n1", (0, 1)) is None, "its own assumption is not counted twice"
    c.assume_bound("uid-Pod-default-mate", "default", "mate", "n1", (2, 3))
    assert check.check("default", "me", uid, "n1", (0, 1)) is None, "the plan's two binds fit together"
    pods = c._stores[("v1", "Pod")].res
    foreign = b.pod("kube", gpus=1, node_name="n1", scheduler="default-scheduler").obj
    foreign["metadata"].update(uid="uid-kube", resourceVersion="2")
    c._apply(pods, "ADDED", cache_mod.clean(foreign, pods))  # kube-scheduler bound it after the snapshot
    misfit = check.check("default", "me", uid, "n1", (0, 1))
    assert misfit is not None and misfit.resource == "nvidia.com/gpu"
    c.forget_bound("uid-Pod-default-mate")  # the mate's bind went elsewhere: room again
    assert check.check("default", "me", uid, "n1", (0, 1)) is None
    assert check.check("default", "me", uid, "n2", (0, 1)).resource == NODE_GONE
    gone = cache_mod.clean(foreign, pods)
    c._apply(pods, "DELETED", gone)
    assert c.node_view("n1")[1] == [], "the index follows deletions"


def test_a_bind_that_no_longer_fits_is_dropped_without_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[str] = []
    monkeypatch.setattr(binder_mod, "request", lambda api, method, path, **kw: posted.append(path))
    c = ClusterCache(None, kinds=[])  # type: ignore[arg-type]
    results: list[Any] = []
    verdict: list[str | None] = ["n1 is full"]
    binder = Binder(None, c, TokenBucket(100, 10), retries=0, on_result=results.append,  # type: ignore[arg-type]
                    recheck=lambda req: verdict[0])
    req = BindRequest("ns", "p", "uid-1", "n1", ())
    assert binder.submit([req]) == [req]
    assert binder.wait_idle(10)
    assert [(r.ok, r.reason, r.message) for r in results] == [(False, "no-fit", "n1 is full")]
    assert posted == [] and c.assumed()[0] == {}, "no request, and the pod is pending again"
    verdict[0] = None
    results.clear()
    assert binder.submit([req]) == [req]
    assert binder.wait_idle(10)
    assert [r.ok for r in results] == [True] and posted == ["/api/v1/namespaces/ns/pods/p/binding"]
    binder.stop()


# -- kubelet rejections ------------------------------------------------------------------------------------------------
def test_kubelet_rejections_are_recognised_and_kept_once_per_transition() -> None:
    def failed(reason: str, node: str | None = "n1") -> dict[str, Any]:
        p = b.pod("p", node_name=node, phase="Failed").obj
        p["status"]["reason"] = reason
        return p

    for reason in ("OutOfcpu", "OutOfmemory", "OutOfnvidia.com/gpu", "OutOfpods", "UnexpectedAdmissionError"):
        assert kubelet_rejection(failed(reason)) == reason
    assert kubelet_rejection(failed("Evicted")) is None
    assert kubelet_rejection(failed("OutOfcpu", node=None)) is None
    assert kubelet_rejection(b.pod("p", node_name="n1").obj) is None

    running = b.pod("p", node_name="n1").obj
    running["metadata"].update(uid="u1", resourceVersion="1")
    c = _cache_with()
    res = c._stores[("v1", "Pod")].res
    c._apply(res, "ADDED", cache_mod.clean(running, res))
    rejected = failed("OutOfcpu")
    rejected["metadata"].update(uid="u1", resourceVersion="2")
    c._apply(res, "MODIFIED", cache_mod.clean(rejected, res))
    c._apply(res, "MODIFIED", cache_mod.clean({**rejected, "metadata": {**rejected["metadata"],
                                                                       "resourceVersion": "3"}}, res))
    taken = c.take_kubelet_rejections()
    assert [p["metadata"]["resourceVersion"] for p in taken] == ["2"], "once per transition"
    assert c.take_kubelet_rejections() == []
    other = failed("OutOfmemory")
    other["metadata"].update(uid="u2", name="q", resourceVersion="4")
    c._apply(res, "ADDED", cache_mod.clean(other, res))
    assert c.take_kubelet_rejections() == [], "a pod first seen rejected is old news"


def test_a_gpu_reservation_pod_is_counted_by_the_pods_sharing_its_device() -> None:
    """As in the snapshot: the reservation pod's GPU is the device its sharing pods hold parts of, so a second half
    fits beside the first on that device, and a whole GPU does not fit on it."""
    reservation = b.pod("gpu-reservation-n1-abcde", namespace="kai-resource-reservation", gpus=1, node_name="n1",
                        labels={"app": "kai-resource-reservation"}, annotations={"kai-opt.io/gpu-devices": "0"},
                        scheduler="default-scheduler")
    first = b.pod("first", gpus=0.5, node_name="n1", annotations={"kai-opt.io/gpu-devices": "0"})
    c = _load([b.node("n1", gpus=4), reservation, first, b.pod("me", gpus=0.5), b.pod("whole", gpus=1)])
    c.reservation_app = "kai-resource-reservation"
    check = PreBindCheck(c)
    assert check.check("default", "me", "uid-Pod-default-me", "n1", (0,)) is None
    misfit = check.check("default", "whole", "uid-Pod-default-whole", "n1", (0,))
    assert misfit is not None and misfit.resource == GPU_DEVICE
    c.reservation_app = None  # counted as a pod of its own, the device would look full for the second half
    assert check.check("default", "me", "uid-Pod-default-me", "n1", (0,)) is not None


def test_podgroups_in_sync_are_skipped_only_while_their_objects_and_reasons_stay_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer remembers which PodGroups were in sync; its writes over cycles where objects change (a write
    lands, a pod finishes) are exactly those of a writer that computes every PodGroup afresh."""
    written: list[tuple[str, str]] = []
    lock = threading.Lock()

    def fake_status(api: Any, method: str, path: str, **kw: Any) -> None:
        import json
        with lock:
            written.append((path, json.dumps(kw.get("body"), sort_keys=True)))

    monkeypatch.setattr(status_mod, "request", fake_status)
    monkeypatch.setattr(events_mod, "request", lambda *a, **k: None)
    monkeypatch.setattr(status_mod, "now_rfc3339", lambda: "2026-01-01T00:00:00Z")  # both writers, one time
    cache = _load(_cluster())
    pg_store = next(s for (av, kind), s in cache._stores.items() if kind == "PodGroup")
    pod_store = next(s for (av, kind), s in cache._stores.items() if kind == "Pod")
    calls = [0]
    real = status_mod.podgroup_status

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(status_mod, "podgroup_status", counted)

    def writes(w: status_mod.StatusWriter, pool: WorkPool) -> list[tuple[str, str]]:
        snap = cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW)
        state = build_state(snap, now=snap.now)
        plan, fs = run_cycle(state, parse_config({"engine": "greedy"}))
        written.clear()
        calls[0] = 0
        w.update(snap, state, plan, fs)
        assert pool.wait_idle(30)
        return sorted(p for p in written if "/podgroups/" in p[0] and p[0].endswith("/status"))

    def land(patches: list[tuple[str, str]]) -> None:  # the written status shows up in the watch
        import json
        for path, body in patches:
            name = path.split("/podgroups/")[1].removesuffix("/status")
            key = next(k for k in pg_store.items if k.endswith("/" + name))
            obj = pg_store.items[key]
            status = {**(obj.get("status") or {}), **json.loads(body)["status"]}
            cache._apply(pg_store.res, "MODIFIED", {**obj, "status": status})

    pool = WorkPool("status-test", 1)
    recorder = EventRecorder(None, pool)  # type: ignore[arg-type]
    memo = status_mod.StatusWriter(None, cache, pool, TokenBucket(1000, 1000), recorder,  # type: ignore[arg-type]
                                   resend_s=0.0)

    def fresh() -> status_mod.StatusWriter:
        return status_mod.StatusWriter(None, cache, pool, TokenBucket(1000, 1000), recorder,  # type: ignore[arg-type]
                                       resend_s=0.0)

    first = writes(memo, pool)
    assert first == writes(fresh(), pool) and first, "the first cycle computes everything"
    land(first)
    assert writes(memo, pool) == writes(fresh(), pool) == [], "written and shown: in sync"
    computed = calls[0]
    assert writes(memo, pool) == [] and calls[0] == 0, "the same objects again: nothing computed"
    key = next(k for k, o in pod_store.items.items() if o["metadata"]["name"] == "o-0")
    done = {**pod_store.items[key], "status": {"phase": "Succeeded"}}
    done["metadata"] = {**done["metadata"], "resourceVersion": "2"}
    cache._apply(pod_store.res, "MODIFIED", done)
    changed = writes(memo, pool)
    assert calls[0] >= 1 and calls[0] < computed + 1
    assert changed == writes(fresh(), pool), "a changed pod: its group computed again, as a fresh writer does"
    pool.stop()


def test_the_state_build_reads_node_arrays_again_only_when_a_node_changed() -> None:
    """The in-cluster cache hands the same Node models while nodes do not change: their arrays are shared
    (read-only, so no state can change another's); a changed node gives new arrays with its new values."""
    cache = _load(_cluster())
    first = build_state(cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW))
    again = build_state(cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW))
    assert again.node_alloc is first.node_alloc and not first.node_alloc.flags.writeable
    with pytest.raises(ValueError):
        first.node_alloc[0, 0] = 1
    store = next(s for (av, kind), s in cache._stores.items() if kind == "Node")
    key = next(iter(store.items))
    node = store.items[key]
    status = {**node["status"], "allocatable": {**node["status"]["allocatable"], "nvidia.com/gpu": "2"}}
    cache._apply(store.res, "MODIFIED", {**node, "metadata": {**node["metadata"], "resourceVersion": "2"},
                                         "status": status})
    changed = build_state(cache.snapshot(scheduler_names=("kai-opt",), now=b.NOW))
    assert changed.node_alloc is not first.node_alloc
    n = changed.node_names.index(node["metadata"]["name"])
    assert changed.node_alloc[n, R_GPU] == 2000 and first.node_alloc[n, R_GPU] != 2000
