"""`kai-opt manifests` on a real apiserver: everything applies (twice: idempotent), and the ServiceAccount's RBAC
allows every verb the scheduler needs and nothing more (access reviews and real calls with its own token)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import apply_objects, object_path, request
from kai_opt.k8s.manifests import NAME, build_manifests

from .testcluster import LocalCluster, delete_cluster_rbac, ensure_namespace

pytestmark = pytest.mark.e2e

NS = "kai-opt-e2e"
RESV_NS = "kai-resource-reservation"
RESV_SA = "kai-opt-reservation"

# (verb, group, resource, subresource, namespace): what the scheduler does, written down independently of the
# manifests (cache, binder, evictor, status, grouper, events, leader election)
NEEDED = [
    *[(v, "", "nodes", "", None) for v in ("get", "list", "watch")],
    *[(v, "", "pods", "", None) for v in ("get", "list", "watch", "patch")],
    ("create", "", "pods", "binding", "team"),
    ("patch", "", "pods", "status", "team"),
    ("create", "", "pods", "eviction", "team"),
    *[(v, "scheduling.run.ai", "podgroups", "", None) for v in ("get", "list", "watch", "create", "patch")],
    *[(v, "scheduling.run.ai", "podgroups", "status", "team") for v in ("update", "patch")],
    *[(v, "scheduling.run.ai", "queues", "", None) for v in ("get", "list", "watch")],
    *[(v, "scheduling.run.ai", "queues", "status", None) for v in ("update", "patch")],
    *[(v, "scheduling.k8s.io", "priorityclasses", "", None) for v in ("get", "list", "watch")],
    *[(v, "kai.scheduler", "topologies", "", None) for v in ("get", "list", "watch")],
    *[(v, "", "events", "", "team") for v in ("create", "patch")],
    *[(v, "events.k8s.io", "events", "", "team") for v in ("create", "patch")],
    *[(v, "coordination.k8s.io", "leases", "", NS) for v in ("get", "create", "update")],
    *[(v, "", "configmaps", "", "team") for v in ("create", "patch")],  # shared-GPU ConfigMaps
    *[(v, "", "pods", "", RESV_NS) for v in ("create", "delete")],  # GPU reservation pods
    *[(v, g, r, "", None) for g, r in [("batch", "jobs"), ("apps", "replicasets"), ("apps", "deployments"),
                                       ("apps", "statefulsets"), ("kubeflow.org", "pytorchjobs"),
                                       ("kubeflow.org", "tfjobs"), ("kubeflow.org", "mpijobs"),
                                       ("jobset.x-k8s.io", "jobsets"), ("leaderworkerset.x-k8s.io",
                                                                        "leaderworkersets"),
                                       ("ray.io", "rayclusters")] for v in ("get", "list", "watch")],
]
FORBIDDEN = [
    ("get", "", "secrets", "", "team"),
    ("list", "", "secrets", "", None),
    ("delete", "", "nodes", "", None),
    ("patch", "", "nodes", "", None),
    ("create", "", "pods", "", "team"),
    ("delete", "", "pods", "", "team"),
    ("update", "", "pods", "", "team"),
    ("update", "", "pods", "status", "team"),
    ("delete", "scheduling.run.ai", "podgroups", "", "team"),
    ("update", "scheduling.run.ai", "queues", "", None),
    ("create", "scheduling.run.ai", "queues", "", None),
    ("delete", "scheduling.run.ai", "queues", "", None),
    ("create", "scheduling.k8s.io", "priorityclasses", "", None),
    ("update", "kai.scheduler", "topologies", "", None),
    ("delete", "batch", "jobs", "", "team"),
    ("create", "coordination.k8s.io", "leases", "", "default"),
    ("delete", "coordination.k8s.io", "leases", "", NS),
    ("get", "", "configmaps", "", NS),
    ("get", "", "configmaps", "", "team"),
    ("delete", "", "configmaps", "", "team"),
    ("update", "", "configmaps", "", "team"),
    ("create", "", "pods", "", NS),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", None),
    ("create", "", "serviceaccounts", "token", NS),
]


def _allowed(api: client.ApiClient, verb: str, group: str, resource: str, sub: str, ns: str | None,
             name: str = "") -> bool:
    attrs = {"verb": verb, "group": group, "resource": resource, "subresource": sub, "namespace": ns or "",
             "name": name}
    review = request(api, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs}})
    return bool(review["status"].get("allowed"))


def _status(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


@pytest.fixture
def installed(clean_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The manifests applied into NS; the cluster-scoped RBAC removed afterwards."""
    try:
        yield clean_cluster
    finally:
        with clean_cluster.api_client() as api:
            delete_cluster_rbac(api, NAME)


def test_manifests_apply_cleanly_and_idempotently(installed: LocalCluster) -> None:
    objs = build_manifests(NS, "kai-opt:test")
    with installed.api_client() as api:
        first = apply_objects(api, objs)
        second = apply_objects(api, objs)
        assert len(first) == len(second) == len(objs)
        assert all(line.endswith("configured") for line in second)
        dep = request(api, "GET", object_path("apps/v1", "deployments", NS, NAME))
        assert dep["spec"]["replicas"] == 2
        pod_spec = dep["spec"]["template"]["spec"]
        assert pod_spec["serviceAccountName"] == NAME
        [container] = pod_spec["containers"]
        assert container["image"] == "kai-opt:test" and "--leader-elect" in container["args"]
        assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        pcs = {pc["metadata"]["name"]: pc["value"]
               for pc in request(api, "GET", "/apis/scheduling.k8s.io/v1/priorityclasses")["items"]}
        assert {k: pcs[k] for k in ("train", "build-preemptible", "build", "inference")} == {
            "train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
        queue = request(api, "GET", object_path("scheduling.run.ai/v2", "queues", None, "default-queue"))
        assert queue["spec"]["resources"]["gpu"]["quota"] == -1


def test_cli_output_applies(installed: LocalCluster) -> None:
    out = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "--namespace", NS,
                          "--image", "registry.local/kai-opt:1"], capture_output=True, text=True, check=True).stdout
    objs = [d for d in yaml.safe_load_all(out) if d]
    with installed.api_client() as api:
        assert len(apply_objects(api, objs)) == len(objs)


def test_service_account_may_do_what_the_scheduler_needs_and_nothing_more(installed: LocalCluster) -> None:
    with installed.api_client() as admin:
        apply_objects(admin, build_manifests(NS, "kai-opt:test"))
        ensure_namespace(admin, "team")
    with installed.service_account_client(NS, NAME) as sa:
        who = request(sa, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{NS}:{NAME}"
        denied = [n for n in NEEDED if not _allowed(sa, *n)]
        assert denied == []
        allowed = [f for f in FORBIDDEN if _allowed(sa, *f)]
        assert allowed == []
        # the webhook's certificate: create Secrets in its namespace, read only its own; its configuration's caBundle
        named = [("create", "", "secrets", "", NS, ""), ("get", "", "secrets", "", NS, "kai-opt-webhook-tls"),
                 *[(v, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", None, "kai-opt")
                   for v in ("get", "patch")]]
        assert [n for n in named if not _allowed(sa, *n)] == []
        not_named = [("get", "", "secrets", "", NS, "other"), ("update", "", "secrets", "", NS, "kai-opt-webhook-tls"),
                     ("create", "", "secrets", "", "team", ""),
                     *[(v, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", None, "other")
                       for v in ("get", "patch")],
                     ("create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", None, "")]
        assert [f for f in not_named if _allowed(sa, *f)] == []


def test_reservation_service_account_may_only_read_and_patch_pods_of_its_namespace(installed: LocalCluster) -> None:
    with installed.api_client() as admin:
        apply_objects(admin, build_manifests(NS, "kai-opt:test"))
        ensure_namespace(admin, "team")
    with installed.service_account_client(RESV_NS, RESV_SA) as sa:
        assert [n for n in [("get", "", "pods", "", RESV_NS), ("patch", "", "pods", "", RESV_NS)]
                if not _allowed(sa, *n)] == []
        assert [f for f in [("get", "", "pods", "", "team"), ("patch", "", "pods", "", "team"),
                            ("create", "", "pods", "", RESV_NS), ("delete", "", "pods", "", RESV_NS),
                            ("list", "", "pods", "", RESV_NS), ("get", "", "secrets", "", RESV_NS)]
                if _allowed(sa, *f)] == []


def test_service_account_real_calls(installed: LocalCluster) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "rbac-node"},
            "status": {"allocatable": {"cpu": "8", "pods": "110"}, "capacity": {"cpu": "8", "pods": "110"}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
           "spec": {"schedulerName": "kai-opt", "containers": [{"name": "c", "image": "busybox"}]}}
    with installed.api_client() as admin:
        apply_objects(admin, build_manifests(NS, "kai-opt:test"))
        ensure_namespace(admin, "team")
        client.CoreV1Api(admin).create_node(node)
        client.CoreV1Api(admin).create_namespaced_pod("team", pod)
    with installed.service_account_client(NS, NAME) as sa:
        v1 = client.CoreV1Api(sa)
        co = client.CustomObjectsApi(sa)
        coord = client.CoordinationV1Api(sa)
        assert [n.metadata.name for n in v1.list_node().items] == ["rbac-node"]
        assert _status(lambda: co.list_cluster_custom_object("scheduling.run.ai", "v2alpha2", "podgroups")) == 200
        assert _status(lambda: co.create_namespaced_custom_object("scheduling.run.ai", "v2alpha2", "team",
                                                                  "podgroups", {
            "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": {"name": "pg"},
            "spec": {"minMember": 1, "queue": "default-queue"}})) == 200
        assert _status(lambda: v1.patch_namespaced_pod("p", "team", {"metadata": {"annotations": {
            "pod-group-name": "pg"}}})) == 200
        assert _status(lambda: v1.create_namespaced_pod_binding("p", "team", client.V1Binding(
            metadata=client.V1ObjectMeta(name="p"), target=client.V1ObjectReference(kind="Node", name="rbac-node")),
            _preload_content=False)) == 200
        assert _status(lambda: v1.create_namespaced_pod_eviction("p", "team", client.V1Eviction(
            metadata=client.V1ObjectMeta(name="p", namespace="team")))) == 200
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": NAME},
                 "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
        assert _status(lambda: coord.create_namespaced_lease(NS, lease)) in (200, 409)
        assert _status(lambda: coord.create_namespaced_lease("default", lease)) == 403
        assert _status(lambda: v1.list_namespaced_secret(NS)) == 403
        assert _status(lambda: v1.delete_node("rbac-node")) == 403
        assert _status(lambda: v1.create_namespaced_pod("team", {**pod, "metadata": {"name": "q"}})) == 403
        assert _status(lambda: co.patch_cluster_custom_object("scheduling.run.ai", "v2", "queues", "default-queue",
                                                              {"spec": {"priority": 1}})) == 403
