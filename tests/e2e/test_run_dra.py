"""`kai-opt run` with DRA on a real apiserver (resource.k8s.io/v1): a fake driver's ResourceSlices (4 nodes x 8 GPUs
with a `productName` attribute) and a DeviceClass; claims are allocated and reserved before the bind, shared
claims keep their pods together, gangs of DRA pods bind all-or-nothing, reclaim releases the victim's claim, a
stale slice generation drops the claim write, consumable capacity (a claim for two shares gets two distinct
devices), a device on two counter sets, network-attached devices (nodeSelector / allNodes slices) are given
once each to pods on nodes they reach, and a DeviceTaintRule (on an apiserver with that beta API on) keeps
its devices from claims that do not tolerate it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.api.dra import AllocationResult
from kai_opt.k8s.cache import ClusterCache, Resource
from kai_opt.k8s.client import object_path, request
from kai_opt.k8s.dra import ClaimError, ClaimWrite, ClaimWriter

from .schedharness import NS, bound, create, fresh, namespace, node, pod, podgroup, pods, queue, scheduler, served
from .schedharness import wait_for as _wait_for
from .testcluster import LocalCluster

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture
V = "resource.k8s.io/v1"
DRIVER = "gpu.example.com"
PRODUCTS = {"n0": "H100", "n1": "H100", "n2": "A100", "n3": "A100"}
DRA_KINDS = ("resourceclaims", "resourceclaimtemplates", "resourceslices", "deviceclasses")


def wait_for(what: str, check: Any, timeout: float = 40.0) -> Any:
    return _wait_for(what, check, timeout=timeout)


@pytest.fixture
def dra(fresh: LocalCluster) -> Iterator[LocalCluster]:
    with fresh.api_client() as api:
        assert served(api, V), "the test apiserver (1.36) must serve resource.k8s.io/v1 (GA since 1.35)"
        _clear(api)
        create(api, [namespace(), queue("team"), *[node(n, 0) for n in PRODUCTS]])
        request(api, "POST", object_path(V, "deviceclasses", None), body=device_class())
        for n, prod in PRODUCTS.items():
            request(api, "POST", object_path(V, "resourceslices", None), body=rslice(n, prod))
    try:
        yield fresh
    finally:
        with fresh.api_client() as api:
            _clear(api)


def _clear(api: ApiClient) -> None:
    for plural in DRA_KINDS:
        items = request(api, "GET", object_path(V, plural, None))["items"]
        for item in items:
            meta = item["metadata"]
            with contextlib.suppress(ApiException):
                request(api, "DELETE", object_path(V, plural, meta.get("namespace"), meta["name"]))


def device_class() -> dict[str, Any]:
    return {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": "gpu.example.com"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}


def rslice(node_name: str, product: str, generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": f"{node_name}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"productName": {"string": product}}}
                                 for i in range(8)]}}


def claim_spec(count: int, product: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.example.com", "count": count}
    if product:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].productName == "{product}"'}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def template(name: str, count: int, product: str | None = None) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": claim_spec(count, product)}}


def shared_slice(node_name: str, memory: str = "80Gi", devices: int = 1) -> dict[str, Any]:
    """A slice of `devices` consumable-capacity devices (allowMultipleAllocations) of `memory` each on a node."""
    return {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": f"{node_name}-shared"},
            "spec": {"driver": "mem.example.com", "nodeName": node_name,
                     "pool": {"name": f"{node_name}-shared", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"shared-{i}", "allowMultipleAllocations": True,
                                  "capacity": {"memory": {"value": memory}}} for i in range(devices)]}}


def shared_class() -> dict[str, Any]:
    return {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": "shared.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "mem.example.com"'}}]}}


def shared_template(name: str, memory: str, count: int = 1) -> dict[str, Any]:
    """A template of one request for `count` shares of `memory` on the shared devices."""
    exactly: dict[str, Any] = {"deviceClassName": "shared.example.com", "capacity": {"requests": {"memory": memory}}}
    if count != 1:
        exactly["count"] = count
    return {"apiVersion": V, "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}


def assert_two_shares_of_50gi(c: dict[str, Any] | None) -> None:
    """The claim holds a 50Gi share of each of n0's two shared devices, each with its own shareID."""
    assert c is not None
    results = c["status"]["allocation"]["devices"]["results"]
    assert sorted((r["pool"], r["device"]) for r in results) == [("n0-shared", "shared-0"), ("n0-shared", "shared-1")]
    assert {str(r["consumedCapacity"]["memory"]) for r in results} in ({"50Gi"}, {str(50 * 2**30)})
    assert len({r["shareID"] for r in results}) == 2


def claim(name: str, count: int, product: str | None = None) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": claim_spec(count, product)}


def dra_pod(name: str, group: str, *, template_name: str | None = None, claim_name: str | None = None,
            queue_name: str = "team") -> dict[str, Any]:
    p = pod(name, group=group, queue_name=queue_name)
    ref: dict[str, Any] = {"name": "gpus"}
    if template_name:
        ref["resourceClaimTemplateName"] = template_name
    else:
        ref["resourceClaimName"] = claim_name
    p["spec"]["resourceClaims"] = [ref]
    return p


def post(api: ApiClient, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        plural = {"ResourceClaimTemplate": "resourceclaimtemplates", "ResourceClaim": "resourceclaims"}.get(obj["kind"])
        if plural:
            request(api, "POST", object_path(V, plural, NS), body=obj)
        else:
            create(api, [obj])


def claims(api: ApiClient) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in request(api, "GET", object_path(V, "resourceclaims", NS))["items"]}


def claim_of(api: ApiClient, pod_name: str) -> dict[str, Any] | None:
    for c in claims(api).values():
        if any(r.get("name") == pod_name for r in (c.get("status") or {}).get("reservedFor") or []):
            return c
    return None


def allocated_devices(c: dict[str, Any]) -> list[tuple[str, str]]:
    results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [(r["pool"], r["device"]) for r in results]


def test_a_template_claim_for_two_gpus_of_one_product_is_allocated_reserved_and_bound(dra: LocalCluster) -> None:
    with dra.api_client() as api:
        post(api, [template("a100x2", 2, "A100"), podgroup("g", 1, "team"), dra_pod("p", "g", template_name="a100x2")])
        with scheduler(dra):
            where = wait_for("p bound", lambda: bound(api).get("p"))
        assert PRODUCTS[where] == "A100"
        c = claim_of(api, "p")
        assert c is not None and c["metadata"]["name"].startswith("p-gpus-")
        devs = allocated_devices(c)
        assert len(devs) == 2 and {pool for pool, _ in devs} == {where} and len(set(devs)) == 2
        sel = c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
        assert sel["values"] == [where]
        assert c["metadata"]["ownerReferences"][0]["name"] == "p"
        statuses = pods(api)["p"]["status"]["resourceClaimStatuses"]
        assert statuses == [{"name": "gpus", "resourceClaimName": c["metadata"]["name"]}]


def test_two_pods_sharing_one_claim_land_on_the_same_node(dra: LocalCluster) -> None:
    with dra.api_client() as api:
        post(api, [claim("shared", 1, "H100"), podgroup("a", 1, "team"), podgroup("b", 1, "team"),
                   dra_pod("pa", "a", claim_name="shared"), dra_pod("pb", "b", claim_name="shared")])
        with scheduler(dra):
            placed = wait_for("both bound", lambda: (lambda b: b if {"pa", "pb"} <= set(b) else None)(bound(api)))
        assert placed["pa"] == placed["pb"] and PRODUCTS[placed["pa"]] == "H100"
        c = claims(api)["shared"]
        assert len(allocated_devices(c)) == 1  # allocated once
        assert sorted(r["name"] for r in c["status"]["reservedFor"]) == ["pa", "pb"]


def test_a_gang_of_four_pods_with_two_dra_gpus_each_binds_all_or_nothing(dra: LocalCluster) -> None:
    with dra.api_client() as api:
        post(api, [template("x2", 2), template("h100x8", 8, "H100"), podgroup("fits", 4, "team"),
                   podgroup("toolarge", 3, "team")]
             + [dra_pod(f"fits-{i}", "fits", template_name="x2") for i in range(4)]
             + [dra_pod(f"big-{i}", "toolarge", template_name="h100x8") for i in range(3)])
        with scheduler(dra):
            wait_for("the gang bound", lambda: sum(n.startswith("fits") for n in bound(api)) == 4)
            time.sleep(1.5)  # more cycles: the gang of 3 x 8 H100 (2 nodes have them) binds nothing
            placed = bound(api)
        assert not any(n.startswith("big") for n in placed)
        taken = [d for n in placed for d in allocated_devices(claim_of(api, n) or {})]
        assert len(taken) == 8 and len(set(taken)) == 8  # no device given twice
        assert not any(claim_of(api, f"big-{i}") for i in range(3))


def test_reclaim_releases_the_victims_claim_and_allocates_the_reclaimers(dra: LocalCluster) -> None:
    with dra.api_client() as api, dra.kwok():  # kwok plays the kubelet: evicted pods go away
        post(api, [queue("greedy", 0), queue("owner", 8), template("x8", 8)]
             + [podgroup(f"g{i}", 1, "greedy") for i in range(4)]
             + [dra_pod(f"fill-{i}", f"g{i}", template_name="x8", queue_name="greedy") for i in range(4)])
        with scheduler(dra):
            wait_for("the cluster full", lambda: len(bound(api)) == 4)
            before = {n: allocated_devices(claim_of(api, n) or {}) for n in bound(api)}
            post(api, [podgroup("own", 1, "owner", priority_class="train"),
                       dra_pod("own-0", "own", template_name="x8", queue_name="owner")])
            where = wait_for("the reclaimer bound", lambda: bound(api).get("own-0"), timeout=60)
        c = claim_of(api, "own-0")
        assert c is not None and len(allocated_devices(c)) == 8
        victims = [n for n in before if n not in bound(api)]
        assert victims, "no pod was reclaimed"
        assert set(allocated_devices(c)) <= {d for v in victims for d in before[v]}
        for v in victims:  # the victim's claim gave its devices back
            own = [x for x in claims(api).values() if x["metadata"]["name"].startswith(f"{v}-gpus-")]
            assert all(not (x.get("status") or {}).get("reservedFor") and not allocated_devices(x) for x in own)
        assert PRODUCTS[where]


def test_a_stale_slice_generation_drops_the_claim_write(dra: LocalCluster) -> None:
    with dra.api_client() as api:
        post(api, [claim("c", 1)])
        cache = ClusterCache(api, kinds=[Resource(V, "ResourceSlice", "resourceslices", False)])
        cache.start()
        try:
            assert cache.wait_synced(10)
            writer = ClaimWriter(api, cache, 10.0)
            w = ClaimWrite("", "c", None, (AllocationResult(request="gpus", driver=DRIVER, pool="n0", device="gpu-0"),),
                           slices=(("n0-gpus", 0),))  # planned on generation 0; the slice is at 1
            with pytest.raises(ClaimError) as exc:
                writer.prepare(NS, "p", "uid-1", "n0", (w,))
            assert exc.value.reason == "stale-slice"
            assert not (claims(api)["c"].get("status") or {}).get("allocation")  # never allocated
            ok = ClaimWrite("", "c", None, w.results, slices=(("n0-gpus", 1),))
            writer.prepare(NS, "p", "uid-1", "n0", (ok,))
            assert allocated_devices(claims(api)["c"]) == [("n0", "gpu-0")]
        finally:
            cache.stop()


def test_consumable_capacity_four_claims_of_20gi_share_one_80gi_device_and_a_fifth_waits(dra: LocalCluster) -> None:
    shared = shared_slice("n0")
    cls = shared_class()
    tmpl = shared_template("mem20", "20Gi")
    with dra.api_client() as api:
        request(api, "POST", object_path(V, "resourceslices", None), body=shared)
        request(api, "POST", object_path(V, "deviceclasses", None), body=cls)
        back = request(api, "GET", object_path(V, "resourceslices", None, "n0-shared"))
        assert back["spec"]["devices"][0].get("allowMultipleAllocations"), \
            "the test apiserver dropped allowMultipleAllocations (DRAConsumableCapacity, beta and on in 1.36)"
        post(api, [tmpl] + [x for i in range(5) for x in (podgroup(f"m{i}", 1, "team"),
                                                         dra_pod(f"m{i}", f"m{i}", template_name="mem20"))])
        with scheduler(dra):
            wait_for("four bound", lambda: len(bound(api)) == 4)
            time.sleep(1.5)  # more cycles: the fifth has no room on the device
            placed = bound(api)
        assert len(placed) == 4 and set(placed.values()) == {"n0"}
        results = [r for n in placed for r in
                   ((claim_of(api, n) or {}).get("status") or {})["allocation"]["devices"]["results"]]
        assert [(r["pool"], r["device"]) for r in results] == [("n0-shared", "shared-0")] * 4
        assert {str(r["consumedCapacity"]["memory"]) for r in results} in ({"20Gi"}, {str(20 * 2**30)})
        assert len({r["shareID"] for r in results}) == 4  # one share each
        waiting = next(f"m{i}" for i in range(5) if f"m{i}" not in placed)
        assert claim_of(api, waiting) is None


def test_consumable_capacity_a_claim_for_two_shares_gets_two_distinct_devices(dra: LocalCluster) -> None:
    """Two shared 80Gi devices on n0, claims for 2 x 50Gi: the first gets a share of each device (two results,
    their own shareIDs), the second waits (30Gi left on each)."""
    shared = shared_slice("n0", devices=2)
    cls = shared_class()
    tmpl = shared_template("mem50x2", "50Gi", count=2)
    with dra.api_client() as api:
        request(api, "POST", object_path(V, "resourceslices", None), body=shared)
        request(api, "POST", object_path(V, "deviceclasses", None), body=cls)
        post(api, [tmpl] + [x for i in range(2) for x in (podgroup(f"m{i}", 1, "team"),
                                                         dra_pod(f"m{i}", f"m{i}", template_name="mem50x2"))])
        with scheduler(dra):
            wait_for("one bound", lambda: len(bound(api)) == 1)
            time.sleep(1.5)  # more cycles: the second has no room for two shares
            placed = bound(api)
        assert len(placed) == 1 and set(placed.values()) == {"n0"}
        assert_two_shares_of_50gi(claim_of(api, next(iter(placed))))
        assert claim_of(api, next(f"m{i}" for i in range(2) if f"m{i}" not in placed)) is None


def test_consumable_capacity_shared_devices_of_different_capacities_on_two_nodes_both_take_shares(
        dra: LocalCluster) -> None:
    """A shared 80Gi device on n0 and a 40Gi one on n1 (one device class): claims of 30Gi take two shares on
    n0 and one on n1 (each device's own consumedCapacity); the fourth waits. Before, the two capacities were
    kinds of separate columns and no claim of the class was placed."""
    cls = shared_class()
    tmpl = shared_template("mem30", "30Gi")
    with dra.api_client() as api:
        for n, mem in (("n0", "80Gi"), ("n1", "40Gi")):
            request(api, "POST", object_path(V, "resourceslices", None), body=shared_slice(n, mem))
        request(api, "POST", object_path(V, "deviceclasses", None), body=cls)
        post(api, [tmpl] + [x for i in range(4) for x in (podgroup(f"m{i}", 1, "team"),
                                                         dra_pod(f"m{i}", f"m{i}", template_name="mem30"))])
        with scheduler(dra):
            wait_for("three bound", lambda: len(bound(api)) == 3)
            time.sleep(1.5)  # more cycles: the fourth has no room on either device
            placed = bound(api)
        assert sorted(placed.values()) == ["n0", "n0", "n1"]
        for name, n in placed.items():
            c = claim_of(api, name)
            assert c is not None
            [r] = c["status"]["allocation"]["devices"]["results"]
            assert (r["pool"], r["device"]) == (f"{n}-shared", "shared-0")
            assert str(r["consumedCapacity"]["memory"]) in ("30Gi", str(30 * 2**30))
        assert claim_of(api, next(f"m{i}" for i in range(4) if f"m{i}" not in placed)) is None


def test_a_device_on_two_counter_sets_is_allocated_and_keeps_a_whole_gpu_of_either_off(dra: LocalCluster) -> None:
    """Partitionable devices: two GPUs' counter sets (a slice of their own), a whole device per GPU and a pair
    consuming 80Gi of both; the pair's claim is allocated, then a whole GPU's waits until the pair's pod is
    gone."""
    pool = {"name": "n0-parts", "generation": 1, "resourceSliceCount": 2}
    counters = {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": "n0-parts-counters"},
                "spec": {"driver": "part.example.com", "nodeName": "n0", "pool": pool, "sharedCounters": [
                    {"name": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}} for g in range(2)]}}
    whole = [{"name": f"gpu-{g}", "attributes": {"profile": {"string": "whole"}},
              "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}}]}
             for g in range(2)]
    pair = {"name": "pair", "attributes": {"profile": {"string": "pair"}},
            "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}}
                                 for g in range(2)]}
    devices = {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": "n0-parts-devices"},
               "spec": {"driver": "part.example.com", "nodeName": "n0", "pool": pool, "devices": [*whole, pair]}}
    cls = {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": "part.example.com"},
           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "part.example.com"'}}]}}

    def tmpl(name: str) -> dict[str, Any]:
        sel = [{"cel": {"expression": f'device.attributes["part.example.com"].profile == "{name}"'}}]
        return {"apiVersion": V, "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": NS},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                    "deviceClassName": "part.example.com", "selectors": sel}}]}}}}
    with dra.api_client() as api, dra.kwok():
        for body in (counters, devices):
            request(api, "POST", object_path(V, "resourceslices", None), body=body)
        request(api, "POST", object_path(V, "deviceclasses", None), body=cls)
        back = request(api, "GET", object_path(V, "resourceslices", None, "n0-parts-devices"))
        assert len(back["spec"]["devices"][2].get("consumesCounters") or []) == 2, \
            "the test apiserver dropped consumesCounters (DRAPartitionableDevices)"
        post(api, [tmpl("pair"), tmpl("whole"), podgroup("a", 1, "team"), dra_pod("a", "a", template_name="pair")])
        with scheduler(dra):
            wait_for("the pair bound", lambda: bound(api).get("a"))
            assert allocated_devices(claim_of(api, "a") or {}) == [("n0-parts", "pair")]
            post(api, [podgroup("b", 1, "team"), dra_pod("b", "b", template_name="whole")])
            time.sleep(1.5)  # more cycles: neither GPU's counter set has room for a whole GPU
            assert "b" not in bound(api) and claim_of(api, "b") is None
            request(api, "DELETE", object_path("v1", "pods", NS, "a"), query={"gracePeriodSeconds": 0})
            wait_for("the whole GPU bound", lambda: bound(api).get("b"))
        devs = allocated_devices(claim_of(api, "b") or {})
        assert len(devs) == 1 and devs[0][1] in ("gpu-0", "gpu-1")


def test_partitions_of_different_sizes_on_two_nodes_are_both_allocated_within_their_counters(
        dra: LocalCluster) -> None:
    """A GPU of 80Gi counters on n0 and on n1, partitioned in 4 x 20Gi on n0 and 2 x 40Gi on n1: "a partition"
    claims go to both nodes, each node's partitions within its counter set (a new claim asks 40Gi of the
    counters, the larger size; allocated ones count at their own size). Before, the two sizes were kinds of
    separate columns and no claim was placed."""
    cls = {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": "part.example.com"},
           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "part.example.com"'}}]}}
    size = {"n0": ("20Gi", 4), "n1": ("40Gi", 2)}

    def node_slices(n: str) -> list[dict[str, Any]]:  # (counters in a slice of their own, as 1.36 wants)
        part, k = size[n]
        devices = [{"name": f"p{i}", "attributes": {"profile": {"string": "part"}},
                    "consumesCounters": [{"counterSet": "gpu-0-cs", "counters": {"memory": {"value": part}}}]}
                   for i in range(k)]
        pool = {"name": f"{n}-parts", "generation": 1, "resourceSliceCount": 2}
        return [{"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": f"{n}-parts{what}"},
                 "spec": {"driver": "part.example.com", "nodeName": n, "pool": pool, **spec}}
                for what, spec in (("-counters", {"sharedCounters": [
                    {"name": "gpu-0-cs", "counters": {"memory": {"value": "80Gi"}}}]}), ("", {"devices": devices}))]
    sel = [{"cel": {"expression": 'device.attributes["part.example.com"].profile == "part"'}}]
    tmpl = {"apiVersion": V, "kind": "ResourceClaimTemplate", "metadata": {"name": "part", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "part.example.com", "selectors": sel}}]}}}}
    with dra.api_client() as api, dra.kwok():
        for body in (b for n in size for b in node_slices(n)):
            request(api, "POST", object_path(V, "resourceslices", None), body=body)
        request(api, "POST", object_path(V, "deviceclasses", None), body=cls)
        back = request(api, "GET", object_path(V, "resourceslices", None, "n0-parts"))
        assert back["spec"]["devices"][0].get("consumesCounters"), \
            "the test apiserver dropped consumesCounters (DRAPartitionableDevices)"
        post(api, [tmpl] + [x for i in range(5) for x in (podgroup(f"q{i}", 1, "team"),
                                                         dra_pod(f"q{i}", f"q{i}", template_name="part"))])
        with scheduler(dra):
            wait_for("all five bound", lambda: len(bound(api)) == 5)
            placed = bound(api)
        # n1 full (2 x 40Gi); n0: two in the first cycle, a third once the first two count at their own 20Gi
        assert sorted(placed.values()) == ["n0", "n0", "n0", "n1", "n1"]
        for name, n in placed.items():
            devs = allocated_devices(claim_of(api, name) or {})
            assert len(devs) == 1 and devs[0][0] == f"{n}-parts"
        assert len({allocated_devices(claim_of(api, name) or {})[0] for name in placed}) == 5


def test_the_default_apiserver_does_not_serve_device_taint_rules(dra: LocalCluster) -> None:
    """Kubernetes 1.36: DeviceTaintRule is resource.k8s.io/v1beta2, a beta API off by default (so kai-opt's cache
    finds it absent and goes on; the rules are read where an admin turned them on, next test)."""
    with dra.api_client() as api:
        assert not served(api, "resource.k8s.io/v1beta2")


@pytest.fixture(scope="module")
def taint_rule_cluster() -> Iterator[LocalCluster]:
    """An apiserver of its own with DeviceTaintRules on (the beta API and its feature gate)."""
    from .testcluster import find_testbin

    c = LocalCluster(find_testbin(), apiserver_args=["--runtime-config=resource.k8s.io/v1beta2=true",
                                                     "--feature-gates=DRADeviceTaintRules=true"])
    c.start()
    try:
        c.install_crds()
        yield c
    finally:
        c.stop()


def test_a_device_taint_rule_keeps_its_devices_from_claims_that_do_not_tolerate_it(
        taint_rule_cluster: LocalCluster) -> None:
    """A DeviceTaintRule taints every device of n2's pool (A100s) NoExecute: a claim for 2 A100s goes to n3, a
    second one waits (n2's are tainted); the rule deleted, it is allocated on n2."""
    c = taint_rule_cluster
    with c.api_client() as api:
        assert served(api, "resource.k8s.io/v1beta2")
        create(api, [namespace(), queue("team"), *[node(n, 0) for n in PRODUCTS]])
        request(api, "POST", object_path(V, "deviceclasses", None), body=device_class())
        for n, prod in PRODUCTS.items():
            request(api, "POST", object_path(V, "resourceslices", None), body=rslice(n, prod))
        rule = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "drain-n2"},
                "spec": {"deviceSelector": {"driver": DRIVER, "pool": "n2"},
                         "taint": {"key": "example.com/drain", "value": "maintenance", "effect": "NoExecute"}}}
        request(api, "POST", object_path("resource.k8s.io/v1beta2", "devicetaintrules", None), body=rule)
        post(api, [template("a100x8", 8, "A100"), podgroup("a", 1, "team"), podgroup("b", 1, "team"),
                   dra_pod("a", "a", template_name="a100x8"), dra_pod("b", "b", template_name="a100x8")])
        with scheduler(c):
            first = wait_for("one bound", lambda: bound(api) or None)
            time.sleep(1.5)  # more cycles: the other has only tainted A100s left
            assert first == bound(api) and list(first.values()) == ["n3"]
            request(api, "DELETE", object_path("resource.k8s.io/v1beta2", "devicetaintrules", None, "drain-n2"))
            placed = wait_for("both bound", lambda: (lambda b: b if len(b) == 2 else None)(bound(api)))
        assert sorted(placed.values()) == ["n2", "n3"]
        waiting = next(n for n in placed if n not in first)
        devs = allocated_devices(claim_of(api, waiting) or {})
        assert len(devs) == 8 and {pool for pool, _ in devs} == {"n2"}


def test_network_attached_devices_go_to_pods_on_the_nodes_they_reach_and_each_only_once(dra: LocalCluster) -> None:
    """A slice of 2 network-attached devices reachable from n0 and n1 (`nodeSelector`) and one of 1 device
    reachable from every node (`allNodes`); 5 pods with a claim for 1 such device each: the two selected devices
    go to pods on n0 / n1, the allNodes one to a pod anywhere, every device once (the allocation's node selector
    is the pod's node), the other two pods wait."""
    reach = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                          "values": ["n0", "n1"]}]}]}
    slices = [{"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": "fabric-rack"},
               "spec": {"driver": "net.example.com", "nodeSelector": reach,
                        "pool": {"name": "rack", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": f"nic-{i}", "attributes": {"kind": {"string": "rack"}}}
                                    for i in range(2)]}},
              {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": "fabric-all"},
               "spec": {"driver": "net.example.com", "allNodes": True,
                        "pool": {"name": "all", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "nic-all", "attributes": {"kind": {"string": "all"}}}]}}]
    cls = {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": "net.example.com"},
           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "net.example.com"'}}]}}
    tmpl = {"apiVersion": V, "kind": "ResourceClaimTemplate", "metadata": {"name": "nic", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "net.example.com", "count": 1}}]}}}}
    with dra.api_client() as api:
        request(api, "POST", object_path(V, "deviceclasses", None), body=cls)
        for s in slices:
            request(api, "POST", object_path(V, "resourceslices", None), body=s)
        post(api, [tmpl] + [x for i in range(5) for x in (podgroup(f"q{i}", 1, "team"),
                                                         dra_pod(f"q{i}", f"q{i}", template_name="nic"))])
        with scheduler(dra):
            wait_for("three bound", lambda: len(bound(api)) == 3)
            time.sleep(1.5)  # more cycles: no fourth device
            placed = bound(api)
        assert len(placed) == 3
        got = {n: allocated_devices(claim_of(api, n) or {}) for n in placed}
        assert sorted(d for devs in got.values() for d in devs) == [("all", "nic-all"), ("rack", "nic-0"),
                                                                    ("rack", "nic-1")]
        for n, devs in got.items():
            [(pool, _dev)] = devs
            if pool == "rack":
                assert placed[n] in ("n0", "n1")
            c = claim_of(api, n) or {}
            sel = c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
            assert sel["values"] == [placed[n]]  # the pod's node
        assert all(claim_of(api, f"q{i}") is None for i in range(5) if f"q{i}" not in placed)
