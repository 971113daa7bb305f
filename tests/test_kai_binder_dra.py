"""`binder: kai` with DRA claims, without a cluster: the BindRequest carries each claim's allocation as KAI's
`ResourceClaimAllocation` (the pod's claim entry name, a resource.k8s.io/v1 AllocationResult), a template's claim
is made first (KAI's binder finds it through the pod's status), the same checks as kai-opt's own binder fail the
bind, and a failed bind lets the pod's claims go."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kai_opt.api.dra import AllocationResult
from kai_opt.config import KaiBinder
from kai_opt.k8s import binder as binder_mod
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s import dra as dra_mod
from kai_opt.k8s import kaibind
from kai_opt.k8s.binder import Binder, BindRequest, BindResult
from kai_opt.k8s.cache import ClusterCache, Resource
from kai_opt.k8s.dra import ClaimWrite
from kai_opt.k8s.workqueue import TokenBucket

BR = Resource(kaibind.API_VERSION, kaibind.KIND, kaibind.PLURAL, True)
BR_PATH = "/apis/scheduling.run.ai/v1alpha2/namespaces/ns/bindrequests"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
DRIVER = "gpu.example.com"
ON_N1 = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
GIB = 1 << 30


def _pod(name: str = "p", uid: str = "u1", *, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "kai-opt", "containers": [{"name": "main"}], "resourceClaims": [
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
        {"name": "shared", "resourceClaimName": "team-claim"},
        {"name": "mem", "resourceClaimName": "mem-claim"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": spec, "status": {"phase": "Pending"}}


def _claim(name: str, *, allocation: dict[str, Any] | None = None,
           reserved: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocation is not None:
        status["allocation"] = allocation
    if reserved is not None:
        status["reservedFor"] = reserved
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": f"c-{name}", "resourceVersion": "7"},
            "spec": {"devices": {"requests": []}}, "status": status}


SHARED_ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-5"}]},
                     "nodeSelector": ON_N1}


def _slice(generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n1-gpus", "uid": "s1", "resourceVersion": str(generation)},
            "spec": {"driver": DRIVER, "nodeName": "n1", "pool": {"name": "n1", "generation": generation,
                                                                  "resourceSliceCount": 1}, "devices": []}}


class FakeApi:
    """An API server of claims (GET, POST with generateName, PUT status) that records every request."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.claims = {c["metadata"]["name"]: copy.deepcopy(c) for c in claims}

    def __call__(self, api: Any, method: str, path: str, *, body: Any = None, **kw: Any) -> Any:
        self.calls.append((method, path, copy.deepcopy(body)))
        if path.startswith(CLAIMS):
            rest = path[len(CLAIMS):].strip("/").split("/")
            if method == "POST":
                made = {**body, "metadata": {**body["metadata"], "name": body["metadata"]["generateName"] + "x7k2q",
                                             "uid": "c-made", "resourceVersion": "1"}, "status": {}}
                self.claims[made["metadata"]["name"]] = made
                return made
            if method == "GET":
                return copy.deepcopy(self.claims[rest[0]])
            if method == "PUT":
                self.claims[rest[0]] = copy.deepcopy(body)
                return body
        return body

    def of(self, method: str, prefix: str = "") -> list[tuple[str, Any]]:
        return [(p, b) for m, p, b in self.calls if m == method and p.startswith(prefix)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    f = FakeApi(_claim("team-claim", allocation=SHARED_ALLOCATION,
                       reserved=[{"resource": "pods", "name": "other", "uid": "u9"}]),
                _claim("mem-claim"))
    for mod in (kaibind, binder_mod, dra_mod):
        monkeypatch.setattr(mod, "request", f)
    return f


def _cache(*objs: dict[str, Any]) -> ClusterCache:
    c = ClusterCache(api=None, kinds=[*cache_mod.SCHEDULING_KINDS, BR])  # type: ignore[arg-type]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "node-uid"}}
    for o in (node, _slice(), *objs):
        c._apply(c._stores[(o["apiVersion"], o["kind"])].res, "ADDED", o)
    return c


def _binder(c: ClusterCache, results: list[BindResult]) -> Binder:
    return Binder(None, c, TokenBucket(1000, 1000), retries=0, on_result=results.append,  # type: ignore[arg-type]
                  kai=KaiBinder())


def _writes(generation: int = 1) -> tuple[ClaimWrite, ...]:
    """What the cycle chose (kai_opt.k8s.dra.ClaimDevices.for_bind): two GPUs from the template, the shared
    claim allocated already, a 20 GiB share of a device with consumable capacity."""
    slices = (("n1-gpus", generation),)
    gpus = tuple(AllocationResult(request="gpu", driver=DRIVER, pool="n1", device=f"gpu-{i}") for i in (0, 1))
    share = AllocationResult(request="mem", driver=DRIVER, pool="n1", device="gpu-7",
                             consumed={f"{DRIVER}/memory": 20 * GIB}, share_id="3f0c8a52-0d7e-4a8e-9b52-6a1e2f6c1d10")
    return (ClaimWrite("gpus", None, "two-gpus", gpus, slices), ClaimWrite("", "team-claim", None, None),
            ClaimWrite("", "mem-claim", None, (share,), slices))


def test_the_bindrequest_carries_each_claims_allocation_as_kais_binder_reads_it(
        fake: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    c = _cache(_pod())
    results: list[BindResult] = []
    b = _binder(c, results)
    template = {"spec": {"metadata": {"labels": {"team": "a"}}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}}]}}}}
    real = fake.__call__

    def with_template(api: Any, method: str, path: str, **kw: Any) -> Any:
        if method == "GET" and path.endswith("/resourceclaimtemplates/two-gpus"):
            return template
        if method == "GET" and path == "/api/v1/namespaces/ns/pods/p":
            return _pod()
        return real(api, method, path, **kw)

    for mod in (kaibind, binder_mod, dra_mod):
        monkeypatch.setattr(mod, "request", with_template)
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (), claims=_writes())])
    assert b.wait_idle(5)
    assert results == [], "the result comes when KAI's binder is done"
    # the template's claim is made first, owned by the pod and named in its status (KAI's binder looks there)
    [(_, made)] = fake.of("POST", CLAIMS)
    assert made["metadata"]["generateName"] == "p-gpus-" and made["spec"] == template["spec"]["spec"]
    assert made["metadata"]["ownerReferences"][0]["uid"] == "u1"
    [(_, status)] = fake.of("PATCH", "/api/v1/namespaces/ns/pods/p/status")
    assert status == {"status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x7k2q"}]}}
    [(_, body)] = fake.of("POST", BR_PATH)
    assert body["spec"]["resourceClaimAllocations"] == [
        {"name": "gpus", "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}]}, "nodeSelector": ON_N1}},
        {"name": "shared", "allocation": SHARED_ALLOCATION},  # allocated already: as the claim has it
        {"name": "mem", "allocation": {"devices": {"results": [
            {"request": "mem", "driver": DRIVER, "pool": "n1", "device": "gpu-7",
             "consumedCapacity": {"memory": str(20 * GIB)}, "shareID": "3f0c8a52-0d7e-4a8e-9b52-6a1e2f6c1d10"}]},
            "nodeSelector": ON_N1}}]
    assert not fake.of("PUT"), "KAI's binder writes the claims, not kai-opt"
    b.stop()


def test_a_stale_slice_or_a_claim_allocated_elsewhere_fails_the_bind_before_any_bindrequest(fake: FakeApi) -> None:
    c = _cache(_pod())
    results: list[BindResult] = []
    b = _binder(c, results)
    _gpus, shared, mem = _writes(generation=0)  # chosen from generation 0, the cache has 1
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (), claims=(shared, mem))])
    assert b.wait_idle(5)
    [r] = results
    assert (r.ok, r.reason) == (False, "stale-slice") and "generation 1" in r.message
    fake.claims["team-claim"]["status"]["allocation"] = {**SHARED_ALLOCATION, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (), claims=(shared,))])
    assert b.wait_idle(5)
    assert (results[-1].ok, results[-1].reason) == (False, "claim-conflict")
    assert "allocated elsewhere" in results[-1].message
    fake.claims["team-claim"]["status"] = {}  # planned as allocated, released meanwhile
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (), claims=(shared,))])
    assert b.wait_idle(5)
    assert (results[-1].ok, results[-1].reason) == (False, "claim-conflict")
    assert not fake.of("POST", BR_PATH)
    b.stop()


def test_a_failed_bindrequest_lets_the_pods_claims_go(fake: FakeApi) -> None:
    """KAI's binder reserved the claims (its DRA plugin undoes nothing on a failed bind): kai-opt drops the pod
    from their reservedFor, and the allocation of a claim nobody else reserves, as its own binder's rollback."""
    mine = {"resource": "pods", "name": "p", "uid": "u1"}
    fake.claims["team-claim"]["status"]["reservedFor"].append(mine)
    fake.claims["mem-claim"]["status"] = {"allocation": SHARED_ALLOCATION, "reservedFor": [mine]}
    c = _cache(_pod(), fake.claims["team-claim"], fake.claims["mem-claim"])
    results: list[BindResult] = []
    b = _binder(c, results)
    _gpus, shared, _mem = _writes()
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (), claims=(shared,))])
    assert b.wait_idle(5) and b.kai is not None
    [(_, body)] = fake.of("POST", BR_PATH)
    obj = {**body, "metadata": {**body["metadata"], "uid": "br-p", "resourceVersion": "2"},
           "status": {"phase": "Failed", "failedAttempts": 3, "reason": "the test failed it"}}
    c._apply(c._stores[(kaibind.API_VERSION, kaibind.KIND)].res, "ADDED", obj)
    b.kai.sync()
    [r] = results
    assert (r.ok, r.reason) == (False, "bind-request-failed")
    team, mem = fake.claims["team-claim"]["status"], fake.claims["mem-claim"]["status"]
    assert team["reservedFor"] == [{"resource": "pods", "name": "other", "uid": "u9"}]
    assert team["allocation"] == SHARED_ALLOCATION, "still reserved by another pod: still allocated"
    assert mem == {"reservedFor": []}, "nobody left: the allocation goes"
    b.stop()


def test_a_bound_pod_keeps_its_claims_when_a_late_result_says_failed(fake: FakeApi) -> None:
    mine = {"resource": "pods", "name": "p", "uid": "u1"}
    fake.claims["mem-claim"]["status"] = {"allocation": SHARED_ALLOCATION, "reservedFor": [mine]}
    c = _cache(_pod(node="n1"), fake.claims["mem-claim"])
    b = _binder(c, [])
    b.claims.release_pod("ns", "p", "u1")
    assert not fake.of("PUT") and fake.claims["mem-claim"]["status"]["reservedFor"] == [mine]
    b.stop()


def test_a_pending_bindrequests_claims_count_as_allocated_and_reserved_for_its_pod(fake: FakeApi) -> None:
    """As KAI's scheduler assumes its pending BindRequests' claims: until KAI's binder writes them (and after a
    restart of kai-opt), the snapshot shows them allocated as the BindRequest says, reserved for the pod."""
    pod = _pod()
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "p-gpus-x7k2q"}]
    made = _claim("p-gpus-x7k2q")
    c = _cache(pod, made, fake.claims["team-claim"], fake.claims["mem-claim"])
    results: list[BindResult] = []
    b = _binder(c, results)
    _gpus, shared, mem = _writes()
    fake.claims["p-gpus-x7k2q"] = made
    gpus = ClaimWrite("", "p-gpus-x7k2q", None, _gpus.results, _gpus.slices)  # the template's claim exists
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (), claims=(gpus, shared, mem))])
    assert b.wait_idle(5) and b.kai is not None
    [(_, body)] = fake.of("POST", BR_PATH)
    assert [e["name"] for e in body["spec"]["resourceClaimAllocations"]] == ["gpus", "shared", "mem"]
    obj = {**body, "metadata": {**body["metadata"], "uid": "br-p", "resourceVersion": "2"}}
    c._apply(c._stores[(kaibind.API_VERSION, kaibind.KIND)].res, "ADDED", obj)
    b.kai.sync()
    claims = {o.obj["metadata"]["name"]: o.obj["status"] for o in c.scheduling_objects(("kai-opt",))
              if o.kind == "ResourceClaim"}
    entries = {e["name"]: e["allocation"] for e in body["spec"]["resourceClaimAllocations"]}
    assert claims["p-gpus-x7k2q"] == {"allocation": entries["gpus"],
                                      "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    assert claims["mem-claim"]["allocation"] == entries["mem"]
    assert claims["team-claim"] == fake.claims["team-claim"]["status"], "allocated already: as it is"
    b.cache.forget_bound("u1")
    claims = {o.obj["metadata"]["name"]: o.obj["status"] for o in c.scheduling_objects(("kai-opt",))
              if o.kind == "ResourceClaim"}
    assert claims["p-gpus-x7k2q"] == {} and claims["mem-claim"] == {}, "the bind failed: not assumed any more"
    b.stop()
