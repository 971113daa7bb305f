"""`kai-opt run` with `binder: kai` on a real apiserver, beside KAI-Scheduler's own binder built from KAI's source
(tests/e2e/kaipeer.py) with KAI's BindRequest CRD: kai-opt writes BindRequests carrying what KAI's binder needs, and
KAI's binder binds the pods from them: whole-GPU and CPU pods, and GPU-sharing pods (`--fake-gpu-nodes`; KAI's
reservation pod, reported by the `gpu_node` helper playing the device plugin, and the pods' shared-GPU ConfigMaps
are KAI's), and pods with DRA claims (KAI's binder writes the allocations the BindRequest carries and reserves the
claims; kai-opt releases them when the pod goes). A BindRequest that fails (KAI's binder timing out on a
reservation, or a status the test sets to Failed) is a failed bind: kai-opt deletes it, reports it, places the pod
again, and the pod is bound in the end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from kai_opt.k8s.client import MERGE_PATCH, apply_objects, object_path, request
from kai_opt.k8s.manifests import NAME, build_manifests

from .kaipeer import KaiPeer, bindrequest_crd, build_binder, kai_binder
from .schedharness import (
    NS,
    bound,
    create,
    delete_all,
    events,
    fast_config,
    fresh,
    gpu_node,
    namespace,
    node,
    pod,
    pods,
    queue,
    scheduler,
    served,
    wait_for,
)
from .testcluster import LocalCluster, delete_cluster_rbac, ensure_namespace

# a cold build of KAI's binder (Go modules from the proxy) takes a while: it runs in the first test's setup
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]
__all__ = ["fresh"]  # the fixture

BR = "scheduling.run.ai/v1alpha2"
RESV_NS = "kai-resource-reservation"
SLOW_NS = "kai-resv-slow"  # reservation pods the test reports only when it wants to


@pytest.fixture(scope="module")
def peer() -> KaiPeer:
    return build_binder()


@pytest.fixture(scope="module")
def kai_crd(cluster: LocalCluster, peer: KaiPeer) -> Iterator[None]:
    with cluster.api_client() as api, bindrequest_crd(api, peer):
        yield


@pytest.fixture
def kai_cluster(kai_crd: None, fresh: LocalCluster) -> LocalCluster:
    """`fresh` with KAI's BindRequest CRD and no BindRequest left by an earlier test."""
    with fresh.api_client() as api:
        delete_all(api, BR, "bindrequests", NS)
    return fresh


def config(**kai_binder: Any) -> Any:
    return fast_config(binder="kai", kai_binder=kai_binder)


def bindrequests(api: ApiClient, ns: str = NS) -> dict[str, dict[str, Any]]:
    return {b["metadata"]["name"]: b for b in request(api, "GET", object_path(BR, "bindrequests", ns))["items"]}


def on(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return p


def shared(name: str, fraction: str) -> dict[str, Any]:
    return pod(name, queue_name="team", fraction=fraction)


def bound_by_kai(p: dict[str, Any]) -> bool:
    """KAI's binder bound it: bound, with the PodBound condition KAI's binder sets (it also sets it on a failed
    attempt it will retry, so the condition alone is not enough)."""
    conditions = (p.get("status") or {}).get("conditions") or []
    return bool(p["spec"].get("nodeName")) and any(
        c.get("type") == "PodBound" and c.get("status") == "True" and c.get("reason") == "Bound" for c in conditions)


def configmap(api: ApiClient, name: str) -> dict[str, Any]:
    return request(api, "GET", object_path("v1", "configmaps", NS, name))


def failed_binding(api: ApiClient, name: str, text: str) -> list[dict[str, Any]]:
    return [e for e in events(api, reason="FailedBinding")
            if e["involvedObject"]["name"] == name and text in e.get("message", "")]


def test_kais_binder_binds_what_kai_opt_hands_it(kai_cluster: LocalCluster, peer: KaiPeer) -> None:
    with kai_cluster.api_client() as api, kai_cluster.kwok():
        create(api, [namespace(), node("n1", 2), node("n2", 1), queue("team"),
                     on(pod("w1", queue_name="team", gpus=1), "n1"), on(pod("w2", queue_name="team", gpus=1), "n1"),
                     pod("cpu", queue_name="team"), on(shared("f", "0.5"), "n2"), on(shared("g", "0.5"), "n2")])
        names = {"w1", "w2", "cpu", "f", "g"}
        with kai_binder(kai_cluster, peer) as binder, scheduler(kai_cluster, config()):
            wait_for("every pod bound by KAI's binder",
                     lambda: {n for n, p in pods(api).items() if bound_by_kai(p)} == names, timeout=90)
            # (KAI's binder writes Succeeded after the bind; a first try of a shared pod may have failed on its cache)
            wait_for("every BindRequest Succeeded", lambda: {n for n, b in bindrequests(api).items()
                                                             if (b.get("status") or {}).get("phase") == "Succeeded"}
                     == names)
            assert binder.running(), binder.log_tail()
        all_pods, brs = pods(api), bindrequests(api)
        assert set(brs) == names
        for name, br in brs.items():
            p, spec = all_pods[name], br["spec"]
            assert br["status"]["phase"] == "Succeeded", br.get("status")
            assert spec["podName"] == name and spec["selectedNode"] == p["spec"]["nodeName"]
            assert spec["backoffLimit"] == 3 and not spec.get("resourceClaimAllocations")
            assert [(o["kind"], o["name"], o["uid"]) for o in br["metadata"]["ownerReferences"]] == \
                [("Pod", name, p["metadata"]["uid"])]
            assert br["metadata"]["labels"]["selected-node"] == spec["selectedNode"]
        # whole GPUs: Regular, one device each, the devices kai-opt chose recorded on the pods
        for name in ("w1", "w2"):
            assert brs[name]["spec"]["receivedResourceType"] == "Regular"
            assert brs[name]["spec"]["receivedGPU"] == {"count": 1, "portion": "1.00"}
            assert "selectedGPUGroups" not in brs[name]["spec"]
        assert {all_pods[n]["metadata"]["annotations"]["kai-opt.io/gpu-devices"] for n in ("w1", "w2")} == {"0", "1"}
        assert brs["cpu"]["spec"]["receivedGPU"] == {"count": 0, "portion": "0.00"}
        # sharing: one group for the device, KAI's reservation pod holding it, KAI's ConfigMaps
        groups = {tuple(brs[n]["spec"]["selectedGPUGroups"]) for n in ("f", "g")}
        assert len(groups) == 1
        ((group,),) = groups
        for name in ("f", "g"):
            spec = brs[name]["spec"]
            assert spec["receivedResourceType"] == "Fraction" and spec["receivedGPU"] == {"count": 1,
                                                                                          "portion": "0.50"}
        reservations = [r for r in pods(api, RESV_NS).values() if not r["metadata"].get("deletionTimestamp")]
        assert [(r["spec"]["nodeName"], r["metadata"]["labels"]["runai-gpu-group"]) for r in reservations] == \
            [("n2", group)]
        assert "app.kubernetes.io/managed-by" not in reservations[0]["metadata"]["labels"], "KAI's, not kai-opt's"
        gpu = reservations[0]["metadata"]["annotations"]["run.ai/reserve_for_gpu_index"]
        for name in ("f", "g"):
            meta = all_pods[name]["metadata"]
            assert meta["labels"]["runai-gpu-group"] == group
            assert meta["annotations"]["received-resource-type"] == "Fraction"
            prefix = meta["annotations"]["runai/shared-gpu-configmap"]
            assert configmap(api, f"{prefix}-0")["data"]["GPU_PORTION"] == "0.50"
            assert configmap(api, f"{prefix}-0-evar")["data"]["NVIDIA_VISIBLE_DEVICES"] == gpu


def test_a_bindrequest_kais_binder_fails_is_a_failed_bind_and_the_pod_is_retried(
        kai_cluster: LocalCluster, peer: KaiPeer) -> None:
    """KAI's binder gives up on a reservation pod that does not report its GPU in time (its BindRequest Failed,
    failedAttempts 1 = backoffLimit 1): kai-opt reports the failed bind, deletes the BindRequest, places the pod
    again and writes a new one; once the GPU reports, the pod is bound."""
    report = threading.Event()
    with kai_cluster.api_client() as api, kai_cluster.kwok(), gpu_node(api, SLOW_NS, report=report):
        ensure_namespace(api, SLOW_NS)
        create(api, [namespace(), node("n1", 1), queue("team"), shared("f", "0.5")])
        with kai_binder(kai_cluster, peer, reservation_namespace=SLOW_NS, allocation_timeout_s=2) as binder, \
                scheduler(kai_cluster, config(backoff_limit=1)):
            first = wait_for("f's BindRequest", lambda: bindrequests(api).get("f"))["metadata"]["uid"]
            wait_for("the failed bind reported", lambda: failed_binding(api, "f", "bind-request-failed"), timeout=30)
            assert "reservation" in failed_binding(api, "f", "bind-request-failed")[0]["message"]
            assert not pods(api)["f"]["spec"].get("nodeName")
            # (KAI's binder may still be retrying the deleted one: the GPU reports only once the new one is there)
            wait_for("a new BindRequest", lambda: (b := bindrequests(api).get("f")) is not None
                     and b["metadata"]["uid"] != first)
            report.set()
            wait_for("f bound by KAI's binder", lambda: bound_by_kai(pods(api)["f"]), timeout=60)
            assert binder.running(), binder.log_tail()
        assert bound(api) == {"f": "n1"}
        # kept while its pod runs (a later one than the failed: KAI's first try of it may fail on its cache too)
        assert bindrequests(api)["f"]["metadata"]["uid"] != first


def test_a_bindrequest_set_to_failed_is_a_failed_bind_and_the_pod_is_retried(
        kai_cluster: LocalCluster, peer: KaiPeer) -> None:
    """Without KAI's binder the BindRequest stays pending and holds its pod (no second one, no other placement);
    set to Failed with failedAttempts = backoffLimit (3), it is deleted, the bind reported failed and a new one
    written, which KAI's binder binds."""
    with kai_cluster.api_client() as api:
        create(api, [namespace(), node("n1", 1), queue("team"), pod("w", queue_name="team", gpus=1)])
        with scheduler(kai_cluster, config()):
            first = wait_for("w's BindRequest", lambda: bindrequests(api).get("w"))
            time.sleep(1.5)  # several cycles: the pending BindRequest keeps the pod counted as bound
            assert bindrequests(api)["w"]["metadata"]["uid"] == first["metadata"]["uid"]
            assert not failed_binding(api, "w", "")
            request(api, "PATCH", object_path(BR, "bindrequests", NS, "w") + "/status", content_type=MERGE_PATCH,
                    body={"status": {"phase": "Failed", "failedAttempts": 3, "reason": "set by the test"}})
            second = wait_for("a new BindRequest", lambda: (b := bindrequests(api).get("w")) is not None
                              and b["metadata"]["uid"] != first["metadata"]["uid"] and b)
            assert wait_for("the failed bind reported", lambda: failed_binding(api, "w", "set by the test"))
            assert not pods(api)["w"]["spec"].get("nodeName")
            with kai_binder(kai_cluster, peer, log_name="kai-binder-late") as binder:
                wait_for("w bound by KAI's binder", lambda: bound_by_kai(pods(api)["w"]), timeout=60)
                assert binder.running(), binder.log_tail()
        final = bindrequests(api)["w"]
        assert final["metadata"]["uid"] == second["metadata"]["uid"] and final["status"]["phase"] == "Succeeded"


def test_the_existing_kai_manifests_rbac_lets_kai_opt_hand_off_and_clean_up(
        kai_cluster: LocalCluster, peer: KaiPeer) -> None:
    """kai-opt as the ServiceAccount of `kai-opt manifests --existing-kai` (binder: kai): it writes, watches and
    deletes BindRequests and records devices on pods with that RBAC alone."""
    sa_ns = "kai-opt-sa"
    objs = [o for o in build_manifests(sa_ns, "kai-opt:test", existing_kai=True)
            if o["kind"] not in ("Deployment", "MutatingWebhookConfiguration")]  # no webhook server runs here
    with kai_cluster.api_client() as api:
        try:
            apply_objects(api, objs)
            create(api, [namespace(), node("n1", 1), queue("team"), pod("w", queue_name="team", gpus=1)])
            token = kai_cluster.service_account_token(sa_ns, NAME)
            with scheduler(kai_cluster, config(), token=token):
                first = wait_for("w's BindRequest", lambda: bindrequests(api).get("w"))
                request(api, "PATCH", object_path(BR, "bindrequests", NS, "w") + "/status",
                        content_type=MERGE_PATCH, body={"status": {"phase": "Failed", "failedAttempts": 3}})
                wait_for("deleted and written again", lambda: (b := bindrequests(api).get("w")) is not None
                         and b["metadata"]["uid"] != first["metadata"]["uid"])
                with kai_binder(kai_cluster, peer, log_name="kai-binder-rbac"):
                    wait_for("w bound by KAI's binder", lambda: bound_by_kai(pods(api)["w"]), timeout=60)
            assert pods(api)["w"]["metadata"]["annotations"]["kai-opt.io/gpu-devices"] == "0"
        finally:
            delete_cluster_rbac(api, NAME)


def test_kais_binder_allocates_and_reserves_the_dra_claims_kai_opt_hands_it(
        kai_cluster: LocalCluster, peer: KaiPeer) -> None:
    """DRA through KAI's binder: a template claim (2 A100s; kai-opt makes the claim, KAI's binder finds it through
    the pod's status), one claim shared by two pods, and two 20 GiB shares of an 80 GiB device: each pod's
    BindRequest carries its claims' allocations, KAI's binder writes them and reserves the claims for the pods and
    binds them; a deleted pod's claim is released by kai-opt as with its own binder."""
    from .test_run_dra import (
        PRODUCTS,
        V,
        allocated_devices,
        claim,
        claim_of,
        claims,
        device_class,
        dra_pod,
        post,
        rslice,
        shared_class,
        shared_slice,
        shared_template,
        template,
    )
    from .test_run_dra import _clear as clear_dra

    shared_dev = shared_slice("n0")
    mem_class = shared_class()
    mem20 = shared_template("mem20", "20Gi")
    with kai_cluster.api_client() as api, kai_cluster.kwok():
        if not served(api, V):
            pytest.skip("the test apiserver does not serve resource.k8s.io/v1")
        clear_dra(api)
        try:
            create(api, [namespace(), queue("team"), *[node(n, 0) for n in PRODUCTS]])
            for obj, plural in [(device_class(), "deviceclasses"), (mem_class, "deviceclasses"),
                                (shared_dev, "resourceslices"), *[(rslice(n, prod), "resourceslices")
                                                                  for n, prod in PRODUCTS.items()]]:
                request(api, "POST", object_path(V, plural, None), body=obj)
            capacity = bool(request(api, "GET", object_path(V, "resourceslices", None, "n0-shared"))
                            ["spec"]["devices"][0].get("allowMultipleAllocations"))
            objs = [template("a100x2", 2, "A100"), claim("shared", 1, "H100"),
                    dra_pod("p", "", template_name="a100x2"), dra_pod("pa", "", claim_name="shared"),
                    dra_pod("pb", "", claim_name="shared")]
            if capacity:  # (DRAConsumableCapacity on: the apiserver keeps allowMultipleAllocations)
                objs += [mem20, dra_pod("m0", "", template_name="mem20"), dra_pod("m1", "", template_name="mem20")]
            post(api, objs)
            names = {o["metadata"]["name"] for o in objs if o["kind"] == "Pod"}
            with kai_binder(kai_cluster, peer) as binder, scheduler(kai_cluster, config()):
                wait_for("every DRA pod bound by KAI's binder",
                         lambda: {n for n, p in pods(api).items() if bound_by_kai(p)} == names, timeout=90)
                all_pods, brs, cs = pods(api), bindrequests(api), claims(api)
                # the template's claim: made by kai-opt, allocated and reserved by KAI's binder
                c = claim_of(api, "p")
                assert c is not None and c["metadata"]["name"].startswith("p-gpus-")
                where = all_pods["p"]["spec"]["nodeName"]
                assert PRODUCTS[where] == "A100"
                devs = allocated_devices(c)
                assert len(devs) == 2 and {pool for pool, _ in devs} == {where} and len(set(devs)) == 2
                assert c["status"]["reservedFor"] == [{"resource": "pods", "name": "p",
                                                       "uid": all_pods["p"]["metadata"]["uid"]}]
                [entry] = brs["p"]["spec"]["resourceClaimAllocations"]
                assert entry["name"] == "gpus" and entry["allocation"] == c["status"]["allocation"]
                # the shared claim: allocated once, both pods on its node and in its reservedFor
                shared = cs["shared"]
                assert len(allocated_devices(shared)) == 1
                assert all_pods["pa"]["spec"]["nodeName"] == all_pods["pb"]["spec"]["nodeName"]
                assert PRODUCTS[all_pods["pa"]["spec"]["nodeName"]] == "H100"
                assert sorted(r["name"] for r in shared["status"]["reservedFor"]) == ["pa", "pb"]
                for n in ("pa", "pb"):
                    assert [e["name"] for e in brs[n]["spec"]["resourceClaimAllocations"]] == ["gpus"]
                if capacity:  # two shares of one device, each with its consumed capacity and own shareID
                    results = [r for n in ("m0", "m1") for r in
                               (claim_of(api, n) or {})["status"]["allocation"]["devices"]["results"]]
                    assert [(r["pool"], r["device"]) for r in results] == [("n0-shared", "shared-0")] * 2
                    assert {str(r["consumedCapacity"]["memory"]) for r in results} in ({"20Gi"},
                                                                                        {str(20 * 2**30)})
                    assert len({r["shareID"] for r in results}) == 2
                # released as with kai-opt's own binder: the pod goes, its claim lets it go and loses its devices
                request(api, "DELETE", object_path("v1", "pods", NS, "p"), query={"gracePeriodSeconds": 0})
                name = c["metadata"]["name"]
                wait_for("p's claim released", lambda: not (claims(api)[name].get("status") or {}).get(
                    "reservedFor") and not allocated_devices(claims(api)[name]))
                assert binder.running(), binder.log_tail()
        finally:
            clear_dra(api)


def test_kais_binder_writes_a_claim_for_two_shares_on_two_distinct_devices(
        kai_cluster: LocalCluster, peer: KaiPeer) -> None:
    """count 2 on shared devices through KAI's binder: two 80Gi shared devices on n0, claims for 2 x 50Gi: the
    first pod's BindRequest carries one result per device (its consumedCapacity and own shareID), KAI's binder
    writes them as they are and binds the pod; the second waits (30Gi left on each device)."""
    from .test_run_dra import (
        PRODUCTS,
        V,
        assert_two_shares_of_50gi,
        claim_of,
        dra_pod,
        post,
        shared_class,
        shared_slice,
        shared_template,
    )
    from .test_run_dra import _clear as clear_dra

    shared_dev = shared_slice("n0", devices=2)
    mem_class = shared_class()
    tmpl = shared_template("mem50x2", "50Gi", count=2)
    with kai_cluster.api_client() as api, kai_cluster.kwok():
        if not served(api, V):
            pytest.skip("the test apiserver does not serve resource.k8s.io/v1")
        clear_dra(api)
        try:
            create(api, [namespace(), queue("team"), *[node(n, 0) for n in PRODUCTS]])
            for obj, plural in [(mem_class, "deviceclasses"), (shared_dev, "resourceslices")]:
                request(api, "POST", object_path(V, plural, None), body=obj)
            if not request(api, "GET", object_path(V, "resourceslices", None, "n0-shared"))["spec"]["devices"][0].get(
                    "allowMultipleAllocations"):
                pytest.skip("the test apiserver dropped allowMultipleAllocations (DRAConsumableCapacity off)")
            post(api, [tmpl, dra_pod("m0", "", template_name="mem50x2"), dra_pod("m1", "", template_name="mem50x2")])
            with kai_binder(kai_cluster, peer) as binder, scheduler(kai_cluster, config()):
                wait_for("one pod bound by KAI's binder",
                         lambda: len([n for n, p in pods(api).items() if bound_by_kai(p)]) == 1, timeout=90)
                time.sleep(2)  # more cycles: the second has no room for two shares
                done = [n for n, p in pods(api).items() if bound_by_kai(p)]
                assert len(done) == 1 and pods(api)[done[0]]["spec"]["nodeName"] == "n0"
                c = claim_of(api, done[0])
                assert_two_shares_of_50gi(c)
                assert c is not None
                [entry] = bindrequests(api)[done[0]]["spec"]["resourceClaimAllocations"]
                assert entry["allocation"] == c["status"]["allocation"]  # written as kai-opt chose it
                assert c["status"]["reservedFor"][0]["name"] == done[0]
                waiting = next(n for n in ("m0", "m1") if n not in done)
                assert not ((claim_of(api, waiting) or {}).get("status") or {}).get("allocation")
                assert binder.running(), binder.log_tail()
        finally:
            clear_dra(api)
