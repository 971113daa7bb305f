"""The test cluster itself: apiserver ready with our CRDs, RBAC enforced for test identities, kwok plays kubelet."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from kai_opt.k8s import CRDS
from kai_opt.k8s.client import request

from .testcluster import LocalCluster, ensure_namespace

pytestmark = pytest.mark.e2e


def _until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_apiserver_serves_our_crds_with_rbac(clean_cluster: LocalCluster) -> None:
    with clean_cluster.api_client() as api:
        version = request(api, "GET", "/version")
        assert version["gitVersion"].startswith("v1.")
        groups = {g["name"]: [v["version"] for v in g["versions"]] for g in request(api, "GET", "/apis")["groups"]}
        for crd in CRDS:
            assert crd.version in groups[crd.group]
            listed = request(api, "GET", f"/apis/{crd.api_version}/{crd.plural}")
            assert listed["items"] == []
    with clean_cluster.api_client("kai-opt") as api, pytest.raises(client.ApiException) as err:
        client.CoreV1Api(api).list_node()
    assert err.value.status == 403


def test_crd_schema_is_kais_and_rejects_bad_podgroups(clean_cluster: LocalCluster) -> None:
    with clean_cluster.api_client() as api:
        co = client.CustomObjectsApi(api)
        co.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", {
            "apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"},
            "spec": {"resources": {"gpu": {"quota": 2, "limit": 4, "overQuotaWeight": 1, "lendingLimit": 1}}}})
        co.patch_cluster_custom_object_status("scheduling.run.ai", "v2", "queues", "q", {
            "status": {"allocated": {"nvidia.com/gpu": "1"}, "fairShare": {"gpu": 1.5}}})
        q = co.get_cluster_custom_object("scheduling.run.ai", "v2", "queues", "q")
        # KAI's schema: the fields KAI knows are kept, the ones it lacks (fairShare, lendingLimit) are pruned
        assert q["status"] == {"allocated": {"nvidia.com/gpu": "1"}}
        assert q["spec"]["resources"]["gpu"] == {"quota": 2, "limit": 4, "overQuotaWeight": 1}
        ensure_namespace(api, "crd-test")
        with pytest.raises(client.ApiException) as err:
            co.create_namespaced_custom_object("scheduling.run.ai", "v2alpha2", "crd-test", "podgroups", {
                "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": {"name": "bad"},
                "spec": {"minMember": 0, "preemptibility": "sometimes"}})
        assert err.value.status == 422
        with pytest.raises(client.ApiException) as err:
            co.create_cluster_custom_object("kai.scheduler", "v1alpha1", "topologies", {
                "apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": "t"},
                "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}, {"nodeLabel": "rack"}]}})
        assert err.value.status == 422


def test_kwok_makes_bound_pods_running_and_completes_deletions(clean_cluster: LocalCluster) -> None:
    with clean_cluster.api_client() as api, clean_cluster.kwok():
        v1 = client.CoreV1Api(api)
        v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "kw-1"}, "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4", "pods": "110"},
            "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4", "pods": "110"}}})
        ensure_namespace(api, "kwok-test")
        v1.create_namespaced_pod("kwok-test", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                               "spec": {"schedulerName": "kai-opt",
                                                        "containers": [{"name": "c", "image": "busybox"}]}})
        v1.create_namespaced_pod_binding("p", "kwok-test", client.V1Binding(
            metadata=client.V1ObjectMeta(name="p"), target=client.V1ObjectReference(kind="Node", name="kw-1")),
            _preload_content=False)
        _until("pod Running", lambda: v1.read_namespaced_pod("p", "kwok-test").status.phase == "Running")
        node = _until("node Ready", lambda: (n := v1.read_node("kw-1")).status.conditions
                      and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions) and n)
        assert node.status.allocatable["nvidia.com/gpu"] == "4"  # kwok keeps the resources
        v1.delete_namespaced_pod("p", "kwok-test")  # default grace period: only a kubelet finishes it

        def gone() -> bool:
            try:
                v1.read_namespaced_pod("p", "kwok-test")
            except client.ApiException as exc:
                return exc.status == 404
            return False

        _until("pod deleted", gone)
