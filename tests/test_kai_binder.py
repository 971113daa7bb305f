"""`binder: kai` without a cluster: the BindRequests kai-opt writes for KAI's binder (kai_opt/k8s/kaibind.py), KAI's
rule for a failed one, and how the binder follows them (bound, failed, timed out, gone, met after a restart)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kai_opt.config import KaiBinder
from kai_opt.k8s import binder as binder_mod
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s import kaibind
from kai_opt.k8s.binder import Binder, BindRequest, BindResult
from kai_opt.k8s.cache import ClusterCache, Resource
from kai_opt.k8s.kaibind import bind_request_body, state_of
from kai_opt.k8s.workqueue import TokenBucket

BR = Resource(kaibind.API_VERSION, kaibind.KIND, kaibind.PLURAL, True)
BR_PATH = "/apis/scheduling.run.ai/v1alpha2/namespaces/ns/bindrequests"


def _pod(name: str, uid: str, *, gpus: int = 0, fraction: str | None = None, memory: str | None = None,
         node: str | None = None, phase: str = "Pending", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    ann = dict(annotations or {})
    if fraction:
        ann["gpu-fraction"] = fraction
    if memory:
        ann["gpu-memory"] = memory
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {"schedulerName": "kai-opt", "containers": [{"name": "main", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": ann, "labels": {}},
            "spec": spec, "status": {"phase": phase}}


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "node-uid",
                                                        "labels": {"nvidia.com/gpu.memory": "40000"}}}


def _put(c: ClusterCache, obj: dict[str, Any], etype: str = "ADDED") -> None:
    kind = obj["kind"]
    store = c._stores[(obj["apiVersion"], kind)]
    c._apply(store.res, etype, obj)


def _cache(*objs: dict[str, Any]) -> ClusterCache:
    c = ClusterCache(api=None, kinds=[*cache_mod.SCHEDULING_KINDS, BR])  # type: ignore[arg-type]
    for o in (NODE, *objs):
        _put(c, o)
    return c


class FakeApi:
    """Records every request; POSTs of BindRequests succeed unless `conflict` holds the existing object."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.conflict: dict[str, Any] | None = None

    def __call__(self, api: Any, method: str, path: str, *, body: Any = None, **kw: Any) -> Any:
        self.calls.append((method, path, body))
        if method == "POST" and path == BR_PATH and self.conflict is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        if method == "GET" and path.startswith(BR_PATH):
            return self.conflict
        if method == "DELETE" and path.startswith(BR_PATH):
            self.conflict = None
        return body

    def of(self, method: str, prefix: str = "") -> list[tuple[str, Any]]:
        return [(p, b) for m, p, b in self.calls if m == method and p.startswith(prefix)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    f = FakeApi()
    monkeypatch.setattr(kaibind, "request", f)
    monkeypatch.setattr(binder_mod, "request", f)
    return f


def _binder(c: ClusterCache, results: list[BindResult], **cfg: Any) -> Binder:
    return Binder(None, c, TokenBucket(1000, 1000), retries=0, on_result=results.append,  # type: ignore[arg-type]
                  kai=KaiBinder(**cfg))


def _stored(c: ClusterCache, body: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A BindRequest as the watch would show it (uid, and a status)."""
    obj = {**body, "metadata": {**body["metadata"], "uid": "br-" + body["metadata"]["name"],
                                "resourceVersion": str(time.monotonic_ns())}}
    if status:
        obj["status"] = status
    _put(c, obj, "MODIFIED" if c.get(kaibind.API_VERSION, kaibind.KIND, "ns", body["metadata"]["name"]) else "ADDED")
    return obj


def _bound_in_snapshot(c: ClusterCache, name: str) -> str | None:
    for o in c.scheduling_objects(("kai-opt",)):
        if o.kind == "Pod" and o.obj["metadata"]["name"] == name:
            return o.obj["spec"].get("nodeName")
    raise AssertionError(name)


# -- the object -----------------------------------------------------------------------------------------------------
def test_a_whole_gpu_pod_gets_a_regular_bindrequest_owned_by_it() -> None:
    body = bind_request_body(_pod("p", "u1", gpus=2), "n1", (2, 3), groups=[], node_obj=NODE, backoff_limit=1)
    assert body["apiVersion"] == "scheduling.run.ai/v1alpha2" and body["kind"] == "BindRequest"
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("p", "ns")
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1"}]
    assert meta["labels"] == {"selected-node": "n1", "app.kubernetes.io/managed-by": "kai-opt"}
    assert meta["annotations"] == {"kai-opt.io/gpu-devices": "2,3"}
    assert body["spec"] == {"podName": "p", "selectedNode": "n1", "receivedResourceType": "Regular",
                            "receivedGPU": {"count": 2, "portion": "1.00"}, "resourceClaimAllocations": [],
                            "backoffLimit": 1}


def test_a_cpu_pod_receives_no_gpu() -> None:
    spec = bind_request_body(_pod("c", "u2"), "n1", (), groups=[], node_obj=NODE, backoff_limit=0)["spec"]
    assert spec["receivedResourceType"] == "Regular" and spec["receivedGPU"] == {"count": 0, "portion": "0.00"}
    assert "selectedGPUGroups" not in spec and spec["backoffLimit"] == 0


def test_sharing_pods_get_a_fraction_with_their_groups_and_portion() -> None:
    spec = bind_request_body(_pod("f", "u3", fraction="0.5"), "n1", (1,), groups=["g1"], node_obj=NODE,
                             backoff_limit=1)["spec"]
    assert spec["receivedResourceType"] == "Fraction"
    assert spec["receivedGPU"] == {"count": 1, "portion": "0.50"} and spec["selectedGPUGroups"] == ["g1"]
    multi = _pod("m", "u4", fraction="0.25", annotations={"gpu-fraction-num-devices": "2"})
    spec = bind_request_body(multi, "n1", (0, 1), groups=["g0", "g1"], node_obj=NODE, backoff_limit=1)["spec"]
    assert spec["receivedGPU"] == {"count": 2, "portion": "0.25"} and spec["selectedGPUGroups"] == ["g0", "g1"]
    spec = bind_request_body(_pod("g", "u5", memory="10000"), "n1", (0,), groups=["g"], node_obj=NODE,
                             backoff_limit=1)["spec"]
    assert spec["receivedGPU"] == {"count": 1, "portion": "0.25"}  # 10000 of the node's 40000 MiB


@pytest.mark.parametrize(("spec", "status", "state"), [
    ({"backoffLimit": 1}, None, "pending"),
    ({"backoffLimit": 1}, {"phase": "Pending"}, "pending"),
    ({"backoffLimit": 1}, {"phase": "Succeeded"}, "succeeded"),
    ({}, {"phase": "Failed"}, "failed"),  # no limit: failed at once
    ({"backoffLimit": 2}, {"phase": "Failed", "failedAttempts": 1}, "pending"),  # KAI's binder tries again
    ({"backoffLimit": 1}, {"phase": "Failed", "failedAttempts": 1}, "failed"),
    ({"backoffLimit": 0}, {"phase": "Failed"}, "failed"),
])
def test_failed_follows_kais_rule(spec: dict[str, Any], status: dict[str, Any] | None, state: str) -> None:
    obj: dict[str, Any] = {"spec": spec}
    if status is not None:
        obj["status"] = status
    assert state_of(obj) == state


# -- handing off and following ---------------------------------------------------------------------------------------
def test_hand_off_records_devices_then_writes_the_bindrequest_and_holds_the_pod(fake: FakeApi) -> None:
    c = _cache(_pod("p", "u1", gpus=1))
    results: list[BindResult] = []
    b = _binder(c, results)
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (1,))])
    assert b.wait_idle(5)
    [(path, patch)] = fake.of("PATCH")
    assert path == "/api/v1/namespaces/ns/pods/p"
    assert patch == {"metadata": {"uid": "u1", "annotations": {"kai-opt.io/gpu-devices": "1"}}}
    [(_, body)] = fake.of("POST", BR_PATH)
    assert body["spec"]["selectedNode"] == "n1" and body["spec"]["receivedGPU"] == {"count": 1, "portion": "1.00"}
    assert not fake.of("POST", "/api/v1/namespaces/ns/pods/p/binding"), "kai-opt does not bind itself"
    assert results == [], "the result comes when KAI's binder is done"
    assert _bound_in_snapshot(c, "p") == "n1"
    assert not b.submit([BindRequest("ns", "p", "u1", "n1", (1,))]), "a pod handed off is not handed off again"
    b.stop()


def test_a_failed_bindrequest_is_a_failed_bind_and_the_pod_is_placed_again(fake: FakeApi) -> None:
    c = _cache(_pod("p", "u1", gpus=1))
    results: list[BindResult] = []
    b = _binder(c, results, backoff_limit=1)
    b.submit([BindRequest("ns", "p", "u1", "n1", (0,))])
    assert b.wait_idle(5)
    [(_, body)] = fake.of("POST", BR_PATH)
    _stored(c, body, phase="Failed", failedAttempts=0)  # below backoffLimit 1: KAI's binder tries again
    assert b.kai is not None
    b.kai.sync()
    assert results == [] and _bound_in_snapshot(c, "p") == "n1"
    _stored(c, body, phase="Failed", failedAttempts=1, reason="node n1 cannot take it")
    b.kai.sync()
    [r] = results
    assert (r.ok, r.reason) == (False, "bind-request-failed") and "node n1 cannot take it" in r.message
    assert [p for p, _ in fake.of("DELETE")] == [f"{BR_PATH}/p"]
    assert _bound_in_snapshot(c, "p") is None, "the cache's assumption is dropped"
    b.kai.sync()  # the watch still shows it: not deleted nor reported twice
    assert len(fake.of("DELETE")) == 1 and len(results) == 1
    # next cycle: placed again, the stale BindRequest still there (409) is replaced
    fake.conflict = {**body, "metadata": {**body["metadata"], "uid": "br-p"},
                     "status": {"phase": "Failed", "failedAttempts": 1}}
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (0,))])
    assert b.wait_idle(5)
    assert len(fake.of("POST", BR_PATH)) == 3 and len(fake.of("DELETE")) == 2
    assert _bound_in_snapshot(c, "p") == "n1"
    b.stop()


def test_a_pending_bindrequest_of_this_pod_elsewhere_is_a_conflict(fake: FakeApi) -> None:
    c = _cache(_pod("p", "u1"))
    results: list[BindResult] = []
    b = _binder(c, results)
    body = bind_request_body(_pod("p", "u1"), "n2", (), groups=[], node_obj=None, backoff_limit=1)
    fake.conflict = {**body, "metadata": {**body["metadata"], "uid": "br-p"}}
    b.submit([BindRequest("ns", "p", "u1", "n1", ())])
    assert b.wait_idle(5)
    [r] = results
    assert (r.ok, r.reason) == (False, "conflict") and not fake.of("DELETE")
    fake.conflict = {**body, "spec": {**body["spec"], "selectedNode": "n1"}, "metadata": {**body["metadata"]}}
    b.submit([BindRequest("ns", "p", "u1", "n1", ())])  # ours from an earlier attempt: fine
    assert b.wait_idle(5) and len(results) == 1
    b.stop()


def test_bound_by_kais_binder_is_a_successful_bind(fake: FakeApi) -> None:
    c = _cache(_pod("p", "u1"))
    results: list[BindResult] = []
    b = _binder(c, results)
    b.submit([BindRequest("ns", "p", "u1", "n1", ())])
    assert b.wait_idle(5) and b.kai is not None
    [(_, body)] = fake.of("POST", BR_PATH)
    _stored(c, body, phase="Succeeded")
    b.kai.sync()
    assert results == [] and _bound_in_snapshot(c, "p") == "n1"  # the pod watch has not shown it yet
    _put(c, _pod("p", "u1", node="n1"), "MODIFIED")
    b.kai.sync()
    assert [(r.ok, r.request.node) for r in results] == [(True, "n1")]
    assert not fake.of("DELETE"), "a running pod's BindRequest stays (its owner reference removes it)"
    _put(c, _pod("p", "u1", node="n1", phase="Succeeded"), "MODIFIED")
    b.kai.sync()
    assert [p for p, _ in fake.of("DELETE")] == [f"{BR_PATH}/p"], "a finished pod's goes (KAI frees its groups)"
    b.stop()


def test_a_bindrequest_nobody_acts_on_times_out(fake: FakeApi) -> None:
    c = _cache(_pod("p", "u1"))
    results: list[BindResult] = []
    b = _binder(c, results, bind_timeout_s=0.05)
    b.submit([BindRequest("ns", "p", "u1", "n1", ())])
    assert b.wait_idle(5) and b.kai is not None
    [(_, body)] = fake.of("POST", BR_PATH)
    _stored(c, body)
    b.kai.sync()
    assert results == []
    time.sleep(0.1)
    b.kai.sync()
    [r] = results
    assert (r.ok, r.reason) == (False, "bind-request-timeout") and len(fake.of("DELETE")) == 1
    assert _bound_in_snapshot(c, "p") is None
    b.stop()


def test_a_bindrequest_deleted_before_the_bind_fails_it(fake: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kaibind, "SETTLE_S", 0.0)
    c = _cache(_pod("p", "u1"))
    results: list[BindResult] = []
    b = _binder(c, results)
    b.submit([BindRequest("ns", "p", "u1", "n1", ())])
    assert b.wait_idle(5) and b.kai is not None
    time.sleep(0.01)
    b.kai.sync()  # never in the watch (KAI's scheduler deletes failed ones too)
    assert [(r.ok, r.reason) for r in results] == [(False, "bind-request-gone")]
    assert _bound_in_snapshot(c, "p") is None
    b.stop()


def test_after_a_restart_a_pending_bindrequest_still_holds_its_pod(fake: FakeApi) -> None:
    c = _cache(_pod("p", "u1", gpus=1), _pod("gone", "u9"))
    results: list[BindResult] = []
    b = _binder(c, results)
    assert b.kai is not None
    _stored(c, bind_request_body(_pod("p", "u1", gpus=1), "n1", (3,), groups=[], node_obj=NODE, backoff_limit=1))
    stale = bind_request_body(_pod("gone", "u-old"), "n1", (), groups=[], node_obj=NODE, backoff_limit=1)
    _stored(c, stale)  # of an earlier pod of that name
    b.kai.sync()
    assert _bound_in_snapshot(c, "p") == "n1" and c.assumed()[0]["u1"].devices == (3,)
    assert [p for p, _ in fake.of("DELETE")] == [f"{BR_PATH}/gone"]
    assert b.kai.tracking("u1")
    _put(c, _pod("p", "u1", gpus=1, node="n1"), "MODIFIED")
    b.kai.sync()
    assert [(r.ok, r.request.name, r.request.devices) for r in results] == [(True, "p", (3,))]
    b.stop()


def test_foreign_bindrequests_are_left_alone(fake: FakeApi) -> None:
    c = _cache(_pod("k", "u1"))
    b = _binder(c, [])
    body = bind_request_body(_pod("k", "u1"), "n1", (), groups=[], node_obj=NODE, backoff_limit=1)
    del body["metadata"]["labels"]["app.kubernetes.io/managed-by"]  # KAI's scheduler's
    _stored(c, body, phase="Failed")
    assert b.kai is not None
    b.kai.sync()
    assert fake.calls == [] and _bound_in_snapshot(c, "k") is None
    b.stop()


def test_sharing_pods_of_one_device_share_a_group_and_get_a_configmap_prefix(fake: FakeApi) -> None:
    c = _cache(_pod("a", "ua", fraction="0.5"), _pod("b", "ub", fraction="0.5"), _pod("x", "ux", fraction="0.5"),
               _pod("w", "uw", fraction="0.5", annotations={"runai/shared-gpu-configmap": "given-shared-gpu"}))
    b = _binder(c, [])
    b.submit([BindRequest("ns", "a", "ua", "n1", (0,)), BindRequest("ns", "x", "ux", "n1", (1,))])
    assert b.wait_idle(5)
    b.submit([BindRequest("ns", "b", "ub", "n1", (0,))])
    assert b.wait_idle(5)
    bodies = {body["metadata"]["name"]: body for _, body in fake.of("POST", BR_PATH)}
    groups = {n: bodies[n]["spec"]["selectedGPUGroups"] for n in "abx"}
    assert groups["a"] == groups["b"] != groups["x"]
    assert all(bodies[n]["spec"]["receivedResourceType"] == "Fraction" for n in "abx")
    patches = {p.rsplit("/", 1)[1]: body["metadata"]["annotations"] for p, body in fake.of("PATCH")}
    assert patches["a"]["runai/shared-gpu-configmap"].endswith("-shared-gpu")
    assert patches["a"]["kai-opt.io/gpu-devices"] == "0" and patches["x"]["kai-opt.io/gpu-devices"] == "1"
    # a pod bound on device 0 with its BindRequest keeps device 0's group for later pods (after SETTLE_S)
    b.kai._recent.clear()  # type: ignore[union-attr]
    _stored(c, bodies["a"], phase="Succeeded")
    _put(c, _pod("a", "ua", fraction="0.5", node="n1", annotations={"kai-opt.io/gpu-devices": "0"}), "MODIFIED")
    b.submit([BindRequest("ns", "w", "uw", "n1", (0,))])
    assert b.wait_idle(5)
    [w] = [body for _, body in fake.of("POST", BR_PATH) if body["metadata"]["name"] == "w"]
    assert w["spec"]["selectedGPUGroups"] == groups["a"]
    assert "runai/shared-gpu-configmap" not in patches.get("w", {}), "a prefix the pod has is kept"
    b.stop()


def test_a_sharing_pod_without_a_device_fails_without_a_bindrequest(fake: FakeApi) -> None:
    c = _cache(_pod("a", "ua", fraction="0.5"))
    results: list[BindResult] = []
    b = _binder(c, results)
    b.submit([BindRequest("ns", "a", "ua", "n1", ())])
    assert b.wait_idle(5)
    assert [(r.ok, r.reason) for r in results] == [(False, "invalid")] and not fake.of("POST")
    b.stop()


def test_the_runner_hands_off_with_binder_kai_and_binds_itself_otherwise() -> None:
    from kai_opt.config import parse_config
    from kai_opt.k8s.runner import Runner

    kai = Runner(None, parse_config({"runtime": {"binder": "kai"}}), identity="t",  # type: ignore[arg-type]
                 leader_elect=False)
    assert kai.binder.kai is not None and kai.binder.sharing is None, "KAI's binder does the GPU-sharing contract"
    assert (kaibind.API_VERSION, kaibind.KIND) in kai.cache._stores
    own = Runner(None, parse_config({}), identity="t", leader_elect=False)  # type: ignore[arg-type]
    assert own.binder.kai is None and own.binder.sharing is not None
    assert (kaibind.API_VERSION, kaibind.KIND) not in own.cache._stores
