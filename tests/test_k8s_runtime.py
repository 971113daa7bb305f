"""Unit tests of the in-cluster runtime's pure parts: token bucket, keyed pool, the binder's JSON patch, status
shapes, cache assumptions and relists, event suppression, and the Lease protocol (against a fake API)."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import numpy as np
import pytest
from kubernetes.client.exceptions import ApiException

from kai_opt.api import Pod
from kai_opt.k8s import binder as binder_mod
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s import leader as leader_mod
from kai_opt.k8s import status as status_mod
from kai_opt.k8s.binder import Binder, BindRequest, binding_annotations
from kai_opt.k8s.cache import ClusterCache, Resource
from kai_opt.k8s.events import EventRecorder
from kai_opt.k8s.status import (
    SCHEDULING_CONDITION,
    merge_scheduling_conditions,
    podgroup_status,
    queue_status,
    resource_list,
    scheduling_condition,
)
from kai_opt.k8s.workqueue import TokenBucket, WorkPool, classify
from kai_opt.plan import Reason
from kai_opt.snapshot import Issue


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- token bucket and pool --------------------------------------------------------------------------------------------
def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, 3, clock=clock)
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]
    clock.t += 0.5  # one token back
    assert bucket.try_acquire() and not bucket.try_acquire()
    clock.t += 100  # never more than the burst
    assert sum(bucket.try_acquire() for _ in range(10)) == 3


def test_work_pool_runs_a_key_once_unless_replacing() -> None:
    pool = WorkPool("t", 2)
    gate = threading.Event()
    ran: list[str] = []
    assert pool.submit("a", lambda: (gate.wait(5), ran.append("a1")))
    time.sleep(0.05)
    assert pool.busy("a")
    assert not pool.submit("a", lambda: ran.append("a2")), "a running key is refused"
    assert pool.submit("a", lambda: ran.append("a3"), replace=True), "replace: runs after the running one"
    gate.set()
    assert pool.wait_idle(5)
    assert ran == ["a1", "a3"]
    assert not pool.busy("a")
    pool.stop()
    assert not pool.submit("b", lambda: None)


def test_a_drain_runs_queued_jobs_within_its_time_then_drops_the_rest() -> None:
    """Shutdown drains the status pools this way: with the apiserver gone every write fails slowly, and the process
    must still end (it used to keep retrying queued writes for minutes)."""
    pool = WorkPool("t", 1)
    ran: list[int] = []
    for i in range(3):
        assert pool.submit(f"k{i}", lambda i=i: ran.append(i))
    assert pool.drain(5) == 0 and ran == [0, 1, 2], "quick jobs all run"
    slow = WorkPool("s", 1)
    gate = threading.Event()
    for i in range(20):
        slow.submit(f"k{i}", lambda: gate.wait(0.2))
    t = time.monotonic()
    dropped = slow.drain(0.3)
    assert time.monotonic() - t < 2 and 10 <= dropped < 20, "bounded: what did not run in time is dropped"
    assert slow.wait_idle(2)
    assert not slow.submit("late", lambda: None)


def test_classify_separates_transient_from_permanent_errors() -> None:
    assert classify(ApiException(status=503)).transient
    assert classify(ApiException(status=429)).transient
    assert not classify(ApiException(status=409)).transient
    assert classify(ConnectionResetError("reset")).transient
    assert not classify(ValueError("bad")).transient


# -- binder's patch ---------------------------------------------------------------------------------------------------
def _req(devices: tuple[int, ...]) -> BindRequest:
    return BindRequest("ns", "p", "uid-1", "n1", devices)


def test_binding_records_the_gpu_devices() -> None:
    assert binding_annotations({"metadata": {"uid": "uid-1"}}, _req((2, 3))) == {"kai-opt.io/gpu-devices": "2,3"}
    assert binding_annotations(None, _req((1,))) == {"kai-opt.io/gpu-devices": "1"}  # not cached: still recorded
    stale = {"metadata": {"uid": "uid-1", "annotations": {"x": "y", "kai-opt.io/gpu-devices": "5"}}}
    assert binding_annotations(stale, _req((1,))) == {"kai-opt.io/gpu-devices": "1"}


def test_binding_of_a_pod_without_gpus_writes_nothing_or_clears_a_stale_record() -> None:
    assert binding_annotations({"metadata": {"uid": "uid-1"}}, _req(())) == {}  # CPU pod: a plain Binding
    stale = {"metadata": {"uid": "uid-1", "annotations": {"kai-opt.io/gpu-devices": "0"}}}
    assert binding_annotations(stale, _req(())) == {"kai-opt.io/gpu-devices": ""}
    assert Pod.from_k8s({**stale, "metadata": {"name": "p", "annotations": {"kai-opt.io/gpu-devices": ""}}}
                        ).gpu_devices is None  # "" reads as no devices



def test_a_conflict_counts_as_our_earlier_bind_only_on_our_node_and_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 409 after a lost answer: the pod bound to our node on our devices is ours; on other devices (an earlier
    run chose them) it is a conflict, so the cache's assumption is dropped and the real devices are read."""
    found: dict[str, Any] = {}

    def fake_request(api: Any, method: str, path: str, **kw: Any) -> Any:
        if method == "POST":
            raise ApiException(status=409, reason="Conflict")
        return found

    monkeypatch.setattr(binder_mod, "request", fake_request)
    results: list[Any] = []
    binder = Binder(None, ClusterCache(None, kinds=[]), TokenBucket(100, 10), retries=0,  # type: ignore[arg-type]
                    on_result=results.append)
    for devices_on_pod, ours in (("2,3", True), ("1", False), (None, False)):
        found.clear()
        found.update({"metadata": {"uid": "uid-1", "annotations": {"kai-opt.io/gpu-devices": devices_on_pod}},
                      "spec": {"nodeName": "n1"}})
        results.clear()
        binder._bind(_req((2, 3)))
        assert [(r.ok, r.reason) for r in results] == [(True, "")] if ours else [(False, "conflict")]
    found.update({"metadata": {"uid": "uid-1"}, "spec": {"nodeName": "n1"}})
    results.clear()
    binder._bind(_req(()))  # a pod without GPUs bound here: ours
    assert [r.ok for r in results] == [True]

# -- status shapes ----------------------------------------------------------------------------------------------------
def test_scheduling_condition_uses_the_plans_reasons_verbatim() -> None:
    reasons = [Reason("Unschedulable", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", {"nodes": 2}),
               Reason("OverLimit", "queue 'a' limit", {"queueDetails": {"name": "a"}})]
    cond = scheduling_condition(reasons, "default")
    assert cond["type"] == SCHEDULING_CONDITION and cond["status"] == "True"
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.; queue 'a' limit"
    assert cond["reasons"] == [{"reason": "Unschedulable", "message": reasons[0].message},
                               {"reason": "OverLimit", "message": "queue 'a' limit",
                                "details": {"queueDetails": {"name": "a"}}}]


def test_transition_ids_count_up_and_an_unchanged_condition_is_kept() -> None:
    other = {"type": SCHEDULING_CONDITION, "nodePool": "pool-b", "transitionID": "4", "reason": "x",
             "message": "m", "status": "True"}
    first = merge_scheduling_conditions([other], scheduling_condition([Reason("A", "a")], "default"), "default",
                                        "t1")
    assert first[-1]["transitionID"] == "5" and first[-1]["lastTransitionTime"] == "t1" and first[0] == other
    same = merge_scheduling_conditions(first, scheduling_condition([Reason("A", "a")], "default"), "default", "t2")
    assert same is first
    changed = merge_scheduling_conditions(first, scheduling_condition([Reason("B", "b")], "default"), "default",
                                          "t3")
    assert [c["nodePool"] for c in changed] == ["pool-b", "default"]
    assert changed[-1]["transitionID"] == "6" and changed[-1]["reason"] == "B"
    assert merge_scheduling_conditions(changed, None, "default", "t4") == [other]


def test_podgroup_status_counts_and_phase() -> None:
    from kai_opt.api import Pod

    def p(name: str, node: str | None = None, phase: str = "Pending") -> Pod:
        spec: dict[str, Any] = {"containers": [{"name": "c"}]}
        if node:
            spec["nodeName"] = node
        return Pod.from_k8s({"metadata": {"name": name, "namespace": "ns"}, "spec": spec,
                             "status": {"phase": phase}})

    obj = {"metadata": {"name": "g"}, "spec": {"minMember": 2},
           "status": {"schedulingConditions": [{"type": SCHEDULING_CONDITION, "nodePool": "default",
                                                "reason": "A", "transitionID": "1"}]}}
    running = podgroup_status(obj, [p("a", "n1", "Running"), p("b", "n1")], None, "t")
    assert running["phase"] == "Running" and running["running"] == 2 and running["pending"] == 0
    assert running["schedulingConditions"] == [], "no pod pending: the condition goes"
    waiting = podgroup_status(obj, [p("a", "n1", "Running"), p("b")], None, "t")
    assert waiting["phase"] == "Pending" and len(waiting["schedulingConditions"]) == 1, "kept while placing"
    done = podgroup_status(obj, [p("a", phase="Succeeded"), p("b", phase="Succeeded")], None, "t")
    assert done["phase"] == "Succeeded" and done["succeeded"] == 2
    quiet = podgroup_status(obj, [p("a", "n1", "Running"), p("b", "n1")], None, "t", with_counts=False)
    assert quiet["schedulingConditions"] == running["schedulingConditions"], "conditions as with counts"
    assert all(quiet[k] is None for k in status_mod.COUNT_FIELDS)
    assert status_mod._changed({}, quiet) == {}, "nothing to write on a group without status"
    assert status_mod._changed(running, quiet) == dict.fromkeys(status_mod.COUNT_FIELDS), \
        "counts written before are cleared (a merge patch's null)"


def test_queue_status_quantities_and_validity() -> None:
    assert resource_list(np.array([1.5, 2500.0, 3e9])) == {"nvidia.com/gpu": "1.5", "cpu": "2500m",
                                                           "memory": "3000000000"}
    assert resource_list(np.array([2.0, 4000.0, 0.0]))["cpu"] == "4"
    issue = Issue("Queue", "q", "ParentQueueDoesNotExist", "parent queue 'x' does not exist")
    bad = queue_status({"metadata": {"name": "q"}}, None, -1, [], issue, "t")
    assert bad == {"conditions": [{"type": "Valid", "status": "False", "reason": "ParentQueueDoesNotExist",
                                   "message": "parent queue 'x' does not exist", "lastTransitionTime": "t"}]}
    fixed = queue_status({"metadata": {"name": "q"}, "status": bad}, None, -1, [], None, "t2")
    assert fixed["conditions"][0]["status"] == "True"
    assert queue_status({"metadata": {"name": "q"}}, None, -1, [], None, "t") == {}



def test_status_writes_wait_for_binds_and_later_cycles_replace_queued_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, Any]] = []
    monkeypatch.setattr(status_mod, "request", lambda api, method, path, **kw: written.append((path, kw["body"])))
    busy = threading.Event()
    busy.set()
    pool = WorkPool("status-test", 1)
    w = status_mod.StatusWriter(None, ClusterCache(None, kinds=[]), pool, TokenBucket(1000, 100),  # type: ignore[arg-type]
                                None, busy=busy.is_set, defer_max_s=3600)  # type: ignore[arg-type]
    w._submit("podgroup/a", "/a", {"phase": "Pending"})  # taken by the worker, which waits for the binds
    w._submit("podgroup/b", "/b", {"phase": "Pending"})
    w._submit("podgroup/b", "/b", {"phase": "Running"})  # the next cycle's: replaces the queued one
    assert written == []
    busy.clear()  # the binds are done
    assert pool.wait_idle(30)
    assert written == [("/a", {"status": {"phase": "Pending"}}), ("/b", {"status": {"phase": "Running"}})]
    pool.stop()

# -- cache ------------------------------------------------------------------------------------------------------------
def _pod(name: str, uid: str, *, node: str | None = None, scheduler: str = "kai-opt",
         nominated: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": "Pending"}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": spec, "status": status}


def _cache(*pods: dict[str, Any]) -> ClusterCache:
    c = ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS)  # type: ignore[arg-type]
    res = c._stores[("v1", "Pod")].res
    for p in pods:
        c._apply(res, "ADDED", p)
    return c


def _objects(c: ClusterCache, **kw: Any) -> dict[str, dict[str, Any]]:
    return {o.obj["metadata"]["name"]: o.obj for o in c.scheduling_objects(("kai-opt",), **kw) if o.kind == "Pod"}


def test_assumed_binds_and_evictions_show_in_the_snapshot_until_the_watch_confirms() -> None:
    original = _pod("a", "u1")
    c = _cache(original, _pod("b", "u2", node="n1"))
    before = copy.deepcopy(original)
    c.assume_bound("u1", "ns", "a", "n2", (3,))
    c.assume_releasing("u2")
    objs = _objects(c)
    assert objs["a"]["spec"]["nodeName"] == "n2"
    assert objs["a"]["metadata"]["annotations"]["kai-opt.io/gpu-devices"] == "3"
    assert objs["b"]["metadata"]["deletionTimestamp"]
    assert original == before, "stored objects are never modified"
    res = c._stores[("v1", "Pod")].res
    c._apply(res, "MODIFIED", _pod("a", "u1", node="n2"))  # the watch shows the bind
    assert "u1" not in c.assumed()[0]
    c._apply(res, "DELETED", _pod("b", "u2", node="n1"))
    assert c.assumed() == ({}, set())


def test_a_failed_bind_or_a_vanished_pod_drops_the_assumption() -> None:
    c = _cache(_pod("a", "u1"), _pod("b", "u2"))
    c.assume_bound("u1", "ns", "a", "n1", ())
    c.forget_bound("u1")
    assert "nodeName" not in _objects(c)["a"]["spec"]
    c.assume_bound("u2", "ns", "b", "n1", ())
    with c._lock:
        c._reconcile_assumptions({})  # a relist without the pod
    assert c.assumed() == ({}, set())


def test_an_accepted_bind_the_watch_never_shows_expires() -> None:
    c = _cache(_pod("a", "u1"))
    c.assume_ttl_s = 0.05
    c.assume_bound("u1", "ns", "a", "n1", ())
    time.sleep(0.1)
    assert "u1" in c.assumed()[0], "not accepted yet: no expiry"
    c.bind_accepted("u1")
    time.sleep(0.1)
    assert c.assumed()[0] == {}


def test_the_cache_tells_whether_a_pod_of_ours_waits_for_a_placement() -> None:
    c = _cache(_pod("bound", "u1", node="n1"), _pod("theirs", "u2", scheduler="other"))
    assert not c.has_unscheduled(("kai-opt",))
    res = c._stores[("v1", "Pod")].res
    c._apply(res, "ADDED", _pod("new", "u3"))
    assert c.has_unscheduled(("kai-opt",))
    c.assume_bound("u3", "ns", "new", "n1", ())  # the binder has it
    assert not c.has_unscheduled(("kai-opt",))
    c.forget_bound("u3")  # the bind failed: it waits again
    assert c.has_unscheduled(("kai-opt",))
    done = _pod("new", "u3")
    done["status"]["phase"] = "Succeeded"
    c._apply(res, "MODIFIED", done)
    assert not c.has_unscheduled(("kai-opt",))


def test_a_cycle_is_skipped_only_when_the_last_did_nothing_and_no_pod_waits() -> None:
    from kai_opt.config import Config
    from kai_opt.k8s import runner as runner_mod

    r = runner_mod.Runner(None, Config(), identity="t", leader_elect=False)  # type: ignore[arg-type]
    r.cache = _cache(_pod("bound", "u1", node="n1"))
    idle = runner_mod.CycleReport(1, pods=1)
    assert not r._idle(None, 0.0), "the first cycle runs"
    assert r._idle(idle, 0.5)
    assert not r._idle(idle, runner_mod.IDLE_CYCLE_S), "an idle cycle still runs every IDLE_CYCLE_S"
    for busy in ({"binds": 3}, {"pending_pods": 1}, {"evictions": 1}, {"pipelined": 1}, {"error": "x"}):
        assert not r._idle(runner_mod.CycleReport(1, pods=1, **busy), 0.5), busy  # type: ignore[arg-type]
    r.cache._apply(r.cache._stores[("v1", "Pod")].res, "ADDED", _pod("new", "u2"))
    assert not r._idle(idle, 0.5), "a new pod of ours is placed at once"


def test_our_nominations_are_dropped_and_held_pods_left_out() -> None:
    c = _cache(_pod("ours", "u1", nominated="n1"), _pod("theirs", "u2", scheduler="other", nominated="n1"),
               _pod("held", "u3"), _pod("ungrouped", "u4"))
    objs = _objects(c, hold={"ns/held"}, pod_groups={"ns/ungrouped": "pg-x"})
    assert "nominatedNodeName" not in objs["ours"]["status"]
    assert objs["theirs"]["status"]["nominatedNodeName"] == "n1"
    assert "held" not in objs
    assert objs["ungrouped"]["metadata"]["annotations"]["pod-group-name"] == "pg-x"


def test_the_watch_loop_relists_on_410_and_resumes_after_connection_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    c = ClusterCache(api=None, kinds=[], backoff_initial_s=0.01, backoff_max_s=0.02)  # type: ignore[arg-type]
    res = Resource("v1", "Pod", "pods", True)
    c.add_kind(res.api_version, res.kind, res.plural, res.namespaced)
    calls: list[str] = []
    script = iter(["gone", "event", "resume"])

    def fake_list(r: Resource) -> str:
        calls.append("list")
        with c._lock:
            store = c._stores[("v1", "Pod")]
            store.synced, store.resource_version = True, "10"
        return "10"

    def fake_watch(r: Resource, rv: str) -> str:
        step = next(script)
        calls.append(f"{step}@{rv}")
        if step == "gone":
            raise cache_mod._Gone()
        if step == "event":  # an event moves the resume point, then the connection breaks
            c._apply(r, "ADDED", _pod("a", "u1"), "12")
            raise ConnectionResetError("reset")
        c._stop.set()
        return rv

    monkeypatch.setattr(c, "_list", fake_list)
    monkeypatch.setattr(c, "_watch", fake_watch)
    c._run(res)
    assert calls == ["list", "gone@10", "list", "event@10", "resume@12"], "no relist after a broken connection"
    assert c.status()["pods.v1"]["errors"] == 1


def test_a_kind_that_is_not_served_counts_as_synced_and_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    c = ClusterCache(api=None, kinds=[], absent_recheck_s=0.01)  # type: ignore[arg-type]
    c.add_kind("ray.io/v1", "RayCluster", "rayclusters", True)
    res = c._stores[("ray.io/v1", "RayCluster")].res

    def fake_list(r: Resource) -> str:
        c._stop.set()
        raise ApiException(status=404)

    monkeypatch.setattr(c, "_list", fake_list)
    c._run(res)
    assert c.synced() and c.absent_kinds() == ["rayclusters.ray.io/v1"]
    assert c.get("ray.io/v1", "RayCluster", "ns", "x") is None and c.list("RayCluster") == []


# -- events -----------------------------------------------------------------------------------------------------------
class _Pool:
    def __init__(self) -> None:
        self.jobs: list[str] = []

    def submit(self, key: str, job: Any, *, replace: bool = False) -> bool:
        self.jobs.append(key)
        return True


def test_events_are_not_repeated_within_the_window_and_respect_the_budget() -> None:
    clock, pool = Clock(), _Pool()
    rec = EventRecorder(None, pool, qps=1.0, burst=2, repeat_s=60, clock=clock)  # type: ignore[arg-type]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    assert rec.emit(pod, "Warning", "FailedScheduling", "m1")
    assert not rec.emit(pod, "Warning", "FailedScheduling", "m1"), "same message within the window"
    assert rec.emit(pod, "Warning", "FailedScheduling", "m2")
    assert not rec.emit(pod, "Warning", "FailedScheduling", "m3"), "over the budget: dropped"
    assert rec.dropped == 1
    clock.t += 61
    assert rec.emit(pod, "Warning", "FailedScheduling", "m1"), "window passed, budget refilled"
    assert len(pool.jobs) == 3


# -- leader election --------------------------------------------------------------------------------------------------
class FakeLeases:
    """One Lease with resourceVersion conflicts, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0

    def request(self, api: Any, method: str, path: str, *, body: Any = None, **_kw: Any) -> Any:
        if method == "GET":
            if self.lease is None:
                raise ApiException(status=404)
            return copy.deepcopy(self.lease)
        current = self.lease["metadata"]["resourceVersion"] if self.lease is not None else None
        if (method == "POST" and current is not None) or (
                method == "PUT" and (current is None or body["metadata"].get("resourceVersion") != current)):
            raise ApiException(status=409)
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.lease)


def _elector(identity: str, clock: Clock) -> leader_mod.LeaderElector:
    return leader_mod.LeaderElector(None, namespace="ns", name="lease", identity=identity,  # type: ignore[arg-type]
                                    lease_duration_s=15, renew_deadline_s=10, retry_period_s=2, clock=clock)


def test_lease_is_taken_over_only_after_it_stopped_changing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, clock = FakeLeases(), Clock()
    monkeypatch.setattr(leader_mod, "request", fake.request)
    a, b = _elector("a", clock), _elector("b", clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew()
    for _ in range(10):  # a keeps renewing: b never takes over
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    clock.t += 10  # a stops renewing: it loses its fence first ...
    assert not a.is_leader()
    assert not b.try_acquire_or_renew()
    clock.t += 6  # ... b takes over once the record was unchanged for the lease duration
    assert b.try_acquire_or_renew() and b.is_leader()
    assert fake.lease is not None and fake.lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew() and not a.is_leader()


def test_release_hands_the_lease_over_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, clock = FakeLeases(), Clock()
    monkeypatch.setattr(leader_mod, "request", fake.request)
    a, b = _elector("a", clock), _elector("b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert fake.lease is not None
    assert fake.lease["spec"]["holderIdentity"] == "" and fake.lease["spec"]["leaseDurationSeconds"] == 1
    assert not a.try_acquire_or_renew(), "a released replica never takes the lease again"
    assert b.try_acquire_or_renew() and b.is_leader()


# -- evictor ----------------------------------------------------------------------------------------------------------
def test_a_budget_refusal_is_not_retried_every_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    from kai_opt.k8s import evictor as evictor_mod

    calls: list[str] = []

    def refuse(api: Any, method: str, path: str, **_kw: Any) -> Any:
        calls.append(path)
        raise ApiException(status=429, reason="Too Many Requests")

    def budget_body(*_a: Any, **_kw: Any) -> bool:
        return True

    monkeypatch.setattr(evictor_mod, "request", refuse)
    monkeypatch.setattr(evictor_mod, "_disruption_budget", budget_body)
    c = _cache(_pod("v", "u1", node="n1"))
    results: list[Any] = []
    ev = evictor_mod.Evictor(None, c, TokenBucket(1000, 1000), blocked_retry_s=0.3,  # type: ignore[arg-type]
                             on_result=results.append)
    req = evictor_mod.EvictRequest("ns", "v", "u1", "reclaim", beneficiary="ns/b")
    assert ev.submit([req]) == [req]
    assert ev.wait_idle(5)
    assert results[-1].blocked and not results[-1].ok and c.assumed()[1] == set(), "the victim keeps running"
    assert ev.submit([req]) == [], "refused recently: not tried again yet"
    time.sleep(0.35)
    assert ev.submit([req]) == [req]
    assert ev.wait_idle(5)
    assert len(calls) == 2
    ev.stop()


def test_snapshots_reuse_the_parsed_model_of_unchanged_objects() -> None:
    a, b = _pod("a", "u1"), _pod("b", "u2")
    a["metadata"]["resourceVersion"], b["metadata"]["resourceVersion"] = "1", "1"
    c = _cache(a, b)
    first = {p.name: p for p in c.snapshot(scheduler_names=("kai-opt",)).pods}
    changed = _pod("b", "u2", nominated="n1")
    changed["metadata"]["resourceVersion"] = "2"
    c._apply(c._stores[("v1", "Pod")].res, "MODIFIED", changed)
    c.assume_bound("u1", "ns", "a", "n1", ())
    second = {p.name: p for p in c.snapshot(scheduler_names=("kai-opt",)).pods}
    assert second["a"].node_name == "n1" and first["a"].node_name is None, "an assumption is never memoised"
    c.forget_bound("u1")
    third = {p.name: p for p in c.snapshot(scheduler_names=("kai-opt",)).pods}
    assert third["a"] is first["a"], "unchanged: the same parsed model"
    assert third["b"] is not first["b"]


def test_unchanged_objects_keep_their_snapshot_entry_across_cycles() -> None:
    """A stored object the snapshot uses as is keeps its RawObject (no new entry, no memo key computed again); a
    changed object, or one with an assumption laid over it, gets a new one."""
    def with_rv(p: dict[str, Any], rv: str) -> dict[str, Any]:
        return {**p, "metadata": {**p["metadata"], "resourceVersion": rv}}

    c = _cache(with_rv(_pod("a", "u1"), "1"), with_rv(_pod("b", "u2"), "1"), with_rv(_pod("c", "u3"), "1"))

    def entries() -> dict[str, Any]:
        return {o.obj["metadata"]["name"]: o for o in c.scheduling_objects(("kai-opt",)) if o.kind == "Pod"}

    first = entries()
    assert first["a"].memo_key == ("Pod", "u1", "1")
    c._apply(c._stores[("v1", "Pod")].res, "MODIFIED", with_rv(_pod("b", "u2"), "2"))
    c.assume_bound("u3", "ns", "c", "n1", ())
    second = entries()
    assert second["a"] is first["a"]
    assert second["b"] is not first["b"] and second["b"].memo_key == ("Pod", "u2", "2")
    assert second["c"] is not first["c"] and second["c"].obj["spec"]["nodeName"] == "n1"
    assert second["c"].memo_key == ("Pod", "u3", "1", "bound", "n1", "")
    assert entries()["a"] is first["a"]
