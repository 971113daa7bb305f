"""LiveGrouping (the grouper kept up to date from the cache's changes) gives what a full `group_pods` pass over the
cache's pods of our schedulers gives, after any sequence of watch events and relists, including changes that
reach a pod only through an owner (a Job's labels, a PyTorchJob's minAvailable, an LWS leader pod, an owner that
arrives after its pods)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_opt.api.pod import PODGROUP_ANNOTATION
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s.cache import SCHEDULING_KINDS, ClusterCache, Resource, watch_kinds_of
from kai_opt.k8s.grouper import OWNER_KINDS, Grouping, group_pods
from kai_opt.k8s.live_grouping import LiveGrouping

NS = "team"
NAMES = ("kai-opt",)
OWNERS = {  # kind -> (api_version, spec variants)
    "Job": ("batch/v1", [{}]),
    "PyTorchJob": ("kubeflow.org/v1", [
        {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}},
        {"runPolicy": {"schedulingPolicy": {"minAvailable": 2}}, "pytorchReplicaSpecs": {"Worker": {}}},
        {"pytorchReplicaSpecs": {}},  # no valid group: an error
    ]),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", [
        {"leaderWorkerTemplate": {"size": 3}}, {"leaderWorkerTemplate": {"size": 2}, "startupPolicy": "LeaderReady"},
    ]),
    "Deployment": ("apps/v1", [{}]),
}


def _kinds() -> list[Resource]:
    return [*SCHEDULING_KINDS, *watch_kinds_of(OWNER_KINDS)]


def _owner(kind: str, i: int, variant: int, label: int, uid_gen: int) -> dict[str, Any]:
    api_version, specs = OWNERS[kind]
    meta: dict[str, Any] = {"name": f"{kind.lower()}-{i}", "namespace": NS, "uid": f"{kind}-{i}-{uid_gen}"}
    if label:
        meta["labels"] = {"kai.scheduler/queue": f"q{label}"}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": specs[variant % len(specs)]}


def _pod(i: int, owner: tuple[str, int, int] | None, *, bound: bool, ours: bool, phase: str | None,
         annotation: int, label: int, worker: int, leader: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"pod-{i}", "namespace": NS, "uid": f"pod-{i}"}
    labels: dict[str, str] = {"leaderworkerset.sigs.k8s.io/group-index": "0",
                              "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}
    if label:
        labels["kai.scheduler/queue"] = f"pq{label}"
    meta["labels"] = labels
    if owner is not None:
        kind, j, uid_gen = owner
        meta["ownerReferences"] = [{"apiVersion": OWNERS[kind][0], "kind": kind, "name": f"{kind.lower()}-{j}",
                                    "uid": f"{kind}-{j}-{uid_gen}", "controller": True}]
    elif leader is not None:  # owned by another pod (an LWS worker's leader)
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": f"pod-{leader}",
                                    "uid": f"pod-{leader}", "controller": True}]
    if annotation == 1:
        meta["annotations"] = {PODGROUP_ANNOTATION: "users-own"}
    spec: dict[str, Any] = {"schedulerName": "kai-opt" if ours else "default-scheduler", "containers": [{"name": "c"}]}
    if bound:
        spec["nodeName"] = "n1"
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase:
        out["status"] = {"phase": phase}
    return out


_kind = st.sampled_from(sorted(OWNERS))
# (kind, index, spec variant, label, uid generation, delete)
_owner_ev = st.tuples(st.just("owner"), _kind, st.integers(0, 1), st.integers(0, 2), st.integers(0, 2),
                      st.integers(0, 1), st.sampled_from([False, False, True]))
_pod_owner = st.one_of(st.none(), st.tuples(_kind, st.integers(0, 1), st.integers(0, 1)))
_pod_ev = st.tuples(st.just("pod"), st.integers(0, 7), _pod_owner,
                    st.booleans(), st.booleans(), st.sampled_from([None, None, "Running", "Succeeded"]),
                    st.integers(0, 2), st.integers(0, 2), st.integers(0, 2), st.one_of(st.none(), st.integers(0, 3)),
                    st.sampled_from([False, False, False, True]))
_relist = st.tuples(st.just("relist"), st.sampled_from(["Pod", "Job", "PyTorchJob"]))
_annotate_own = st.tuples(st.just("annotate"), st.integers(0, 7))  # a pod annotated with the group found for it


def _expected(c: ClusterCache) -> Grouping:
    pods = [p for p in c.list("Pod", "v1") if (p.get("spec") or {}).get("schedulerName") in NAMES]
    return group_pods(pods, c.get, "default-queue")


def _same(a: Grouping, b: Grouping) -> None:
    assert a.podgroups == b.podgroups
    assert a.assignments == b.assignments
    assert a.annotated == b.annotated
    assert a.deferred == b.deferred
    assert a.errors == b.errors
    assert a.unbound == b.unbound


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(_owner_ev, _pod_ev, _pod_ev, _pod_ev, _relist, _annotate_own), max_size=12),
                min_size=2, max_size=6))
def test_live_grouping_equals_a_full_pass_after_any_events(cycles: list[list[tuple[Any, ...]]]) -> None:
    c = ClusterCache(api=None, kinds=_kinds())  # type: ignore[arg-type]
    stores = {(r.api_version, r.kind): r for r in _kinds()}
    res = {kind: stores[(api_version, kind)] for kind, (api_version, _) in OWNERS.items()}
    res["Pod"] = stores[("v1", "Pod")]
    live = LiveGrouping("default-queue")
    for events in cycles:
        for ev in events:
            if ev[0] == "owner":
                _, kind, i, variant, label, gen, delete = ev
                o = _owner(kind, i, variant, label, gen)
                c._apply(res[kind], "DELETED" if delete else "ADDED", cache_mod.clean(o, res[kind]))
            elif ev[0] == "pod":
                _, i, owner, bound, ours, phase, annotation, label, worker, leader, delete = ev
                p = _pod(i, (owner[0], owner[1], owner[2]) if owner else None, bound=bound, ours=ours, phase=phase,
                         annotation=annotation, label=label, worker=worker, leader=leader if leader != i else None)
                c._apply(res["Pod"], "DELETED" if delete else "MODIFIED", cache_mod.clean(p, res["Pod"]))
            elif ev[0] == "relist":
                store = c._stores[(res[ev[1]].api_version, ev[1])]
                with c._lock:
                    store.replace(dict(reversed(list(store.items.items()))))
            else:  # the runner annotates a pod with the group the grouper found for it
                got = _expected(c).assignments.get(f"{NS}/pod-{ev[1]}")
                p = c.get("v1", "Pod", NS, f"pod-{ev[1]}")
                if got is not None and p is not None:
                    q = {**p, "metadata": {**p["metadata"], "annotations": {PODGROUP_ANNOTATION: got}}}
                    c._apply(res["Pod"], "MODIFIED", q)
        _same(live.update(c, NAMES), _expected(c))


def test_a_steady_cycle_redoes_only_what_changed() -> None:
    """Unchanged pods are not walked again: only the pod written and the pods under the owner written are."""
    c = ClusterCache(api=None, kinds=_kinds())  # type: ignore[arg-type]
    res = {(r.api_version, r.kind): r for r in _kinds()}
    job_res, pod_res = res[("batch/v1", "Job")], res[("v1", "Pod")]
    for j in range(3):
        c._apply(job_res, "ADDED", cache_mod.clean(_owner("Job", j, 0, 0, 0), job_res))
        for k in range(4):
            p = _pod(4 * j + k, ("Job", j, 0), bound=False, ours=True, phase=None, annotation=0, label=0, worker=0,
                     leader=None)
            c._apply(pod_res, "ADDED", p)
    live = LiveGrouping("default-queue")
    _same(live.update(c, NAMES), _expected(c))
    asked: list[tuple[str, str]] = []
    real_get = c.get

    def counting_get(api_version: str, kind: str, namespace: str | None, name: str) -> Any:
        asked.append((kind, name))
        return real_get(api_version, kind, namespace, name)

    c.get = counting_get  # type: ignore[method-assign]
    _same(live.update(c, NAMES), _expected(c))  # (the full pass asks too: count only the live one's)
    asked.clear()
    assert live.update(c, NAMES).assignments and asked == []  # nothing changed: no owner read
    c._apply(job_res, "MODIFIED", cache_mod.clean(_owner("Job", 1, 0, 2, 0), job_res))  # job-1 relabelled
    got = live.update(c, NAMES)
    assert asked == [("Job", "job-1")]  # one walk shared by its four pods
    assert {pg["spec"]["queue"] for pg in got.podgroups if "job-1" in pg["metadata"]["ownerReferences"][0]["name"]} \
        == {"q2"}
    _same(got, _expected(c))


def test_a_gang_keeps_the_cache_order_of_its_pods_when_one_is_modified() -> None:
    """The PodGroup takes pod-level fallbacks (here the queue label) from its first pod in the cache's order; a
    MODIFIED event keeps a pod's place in that order, so modifying the first pod keeps it first."""
    c = ClusterCache(api=None, kinds=_kinds())  # type: ignore[arg-type]
    res = {(r.api_version, r.kind): r for r in _kinds()}
    job_res, pod_res = res[("kubeflow.org/v1", "PyTorchJob")], res[("v1", "Pod")]
    c._apply(job_res, "ADDED", cache_mod.clean(_owner("PyTorchJob", 0, 0, 0, 0), job_res))
    for i, label in ((0, 1), (1, 2)):
        c._apply(pod_res, "ADDED", _pod(i, ("PyTorchJob", 0, 0), bound=False, ours=True, phase=None, annotation=0,
                                        label=label, worker=0, leader=None))
    live = LiveGrouping("default-queue")
    [pg] = live.update(c, NAMES).podgroups
    assert pg["spec"]["queue"] == "pq1"
    c._apply(pod_res, "MODIFIED", _pod(0, ("PyTorchJob", 0, 0), bound=True, ours=True, phase=None, annotation=0,
                                       label=1, worker=0, leader=None))
    got = live.update(c, NAMES)
    assert [pg["spec"]["queue"] for pg in got.podgroups] == ["pq1"]
    _same(got, _expected(c))


class _FakeCustomObjects:
    calls: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, api: Any) -> None:
        pass

    def create_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, body: Any) -> None:
        self.calls.append(("create", body["metadata"]["name"]))

    def patch_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str,
                                       body: Any) -> None:
        self.calls.append(("patch", name))


def test_podgroup_sync_compares_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PodGroup found in sync is not compared again until its desired object or the cache's object changes;
    one whose create did not land (no watch event) is tried again."""
    from kai_opt.k8s import grouper
    from kai_opt.k8s.live_grouping import PodGroupSync

    monkeypatch.setattr(grouper.client, "CustomObjectsApi", _FakeCustomObjects)
    c = ClusterCache(api=None, kinds=_kinds())  # type: ignore[arg-type]
    pg_res = next(r for r in _kinds() if r.kind == "PodGroup")
    desired = [{"apiVersion": pg_res.api_version, "kind": "PodGroup",
                "metadata": {"name": f"g{i}", "namespace": NS}, "spec": {"minMember": 1, "queue": "q"}}
               for i in range(3)]
    sync = PodGroupSync()
    compared: list[str] = []
    real_get = c.get

    def counting_get(api_version: str, kind: str, namespace: str | None, name: str) -> Any:
        compared.append(name)
        return real_get(api_version, kind, namespace, name)

    c.get = counting_get  # type: ignore[method-assign]
    _FakeCustomObjects.calls = []
    sync.sync(None, desired, c, workers=1)  # type: ignore[arg-type]
    assert sorted(_FakeCustomObjects.calls) == [("create", "g0"), ("create", "g1"), ("create", "g2")]
    for pg in desired[:2]:  # the watch shows two of the creates; the third did not land
        c._apply(pg_res, "ADDED", cache_mod.clean(pg, pg_res))
    _FakeCustomObjects.calls, compared[:] = [], []
    sync.sync(None, desired, c, workers=1)  # type: ignore[arg-type]
    assert _FakeCustomObjects.calls == [("create", "g2")] and sorted(compared) == ["g0", "g1", "g2"]
    _FakeCustomObjects.calls, compared[:] = [], []
    sync.sync(None, desired, c, workers=1)  # type: ignore[arg-type]
    assert _FakeCustomObjects.calls == [("create", "g2")] and compared == ["g2"]  # g0, g1 known in sync
    stale = {**desired[0], "spec": {"minMember": 3, "queue": "q"}}  # someone changed g0 in the cluster
    c._apply(pg_res, "MODIFIED", cache_mod.clean(stale, pg_res))
    desired[1] = {**desired[1], "spec": {"minMember": 2, "queue": "q"}}  # the grouper wants g1 changed
    _FakeCustomObjects.calls, compared[:] = [], []
    sync.sync(None, desired, c, workers=1)  # type: ignore[arg-type]
    assert sorted(_FakeCustomObjects.calls) == [("create", "g2"), ("patch", "g0"), ("patch", "g1")]
