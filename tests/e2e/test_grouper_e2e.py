"""Pod grouper on a real apiserver: a batch Job and a PyTorchJob (its CRD installed here, minimal schema) get their
PodGroups created once (idempotent), their pods annotated, and a scaled PyTorchJob has its minMember patched."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.api.pod import PODGROUP_ANNOTATION
from kai_opt.k8s.client import apply_objects, object_path, request
from kai_opt.k8s.grouper import OWNER_KINDS, annotate_pods, group_pods, sync_podgroups

from .testcluster import LocalCluster, ensure_namespace

pytestmark = pytest.mark.e2e

NS = "grouper-e2e"
PYTORCHJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"group": "kubeflow.org", "scope": "Namespaced",
             "names": {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob", "listKind":
                       "PyTorchJobList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}
PLURALS = {(v, k): p for v, k, p in OWNER_KINDS}


def _get_owner(api: client.ApiClient) -> Any:
    def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        plural = PLURALS.get((api_version, kind)) or ("pods" if kind == "Pod" else None)
        if plural is None:
            return None
        try:
            return request(api, "GET", object_path(api_version, plural, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
    return get


def _owner_ref(o: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"],
            "uid": o["metadata"]["uid"], "controller": True}


def _pod(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "ownerReferences": [_owner_ref(owner)]},
            "spec": {"schedulerName": "kai-opt", "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "busybox"}]}}


def _our_pods(api: client.ApiClient) -> list[dict[str, Any]]:
    return [p for p in request(api, "GET", object_path("v1", "pods", NS))["items"]
            if p["spec"].get("schedulerName") == "kai-opt"]


def _podgroups(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    items = request(api, "GET", object_path("scheduling.run.ai/v2alpha2", "podgroups", NS))["items"]
    return {pg["metadata"]["name"]: pg for pg in items}


def _cycle(api: client.ApiClient) -> tuple[int, list[str]]:
    pods = _our_pods(api)
    grouping = group_pods(pods, _get_owner(api), "default-queue")
    existing = list(_podgroups(api).values())
    sync_podgroups(api, grouping.podgroups, existing)
    return annotate_pods(api, pods, grouping.assignments), grouping.deferred


def test_grouper_creates_podgroups_for_a_job_and_a_pytorchjob(clean_cluster: LocalCluster) -> None:
    with clean_cluster.api_client() as api:
        apply_objects(api, [PYTORCHJOB_CRD])
        ensure_namespace(api, NS)
        batch = client.BatchV1Api(api)
        co = client.CustomObjectsApi(api)
        job = batch.create_namespaced_job(NS, {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "etl", "labels": {"kai.scheduler/queue": "team-a"}},
            "spec": {"parallelism": 2, "suspend": True, "template": {"spec": {
                "schedulerName": "kai-opt", "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]}}}})
        job_obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "etl", "uid": job.metadata.uid}}
        ptj = co.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "labels": {"priorityClassName": "build"}},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}}})
        try:
            v1 = client.CoreV1Api(api)
            for name, owner in [("etl-a", job_obj), ("etl-b", job_obj), ("train-master-0", ptj),
                                *[(f"train-worker-{i}", ptj) for i in range(3)]]:
                v1.create_namespaced_pod(NS, _pod(name, owner))

            annotated, deferred = _cycle(api)
            assert (annotated, deferred) == (6, [])
            pgs = _podgroups(api)
            job_uid, ptj_uid = job.metadata.uid, ptj["metadata"]["uid"]
            assert set(pgs) == {f"pg-etl-a-{job_uid}", f"pg-etl-b-{job_uid}", f"pg-train-{ptj_uid}"}
            assert pgs[f"pg-etl-a-{job_uid}"]["spec"] == {"minMember": 1, "queue": "team-a",
                                                          "priorityClassName": "train"}
            gang = pgs[f"pg-train-{ptj_uid}"]
            assert gang["spec"] == {"minMember": 4, "queue": "default-queue", "priorityClassName": "build"}
            assert gang["metadata"]["ownerReferences"][0]["uid"] == ptj_uid
            pods = {p["metadata"]["name"]: p for p in _our_pods(api)}
            assert pods["train-worker-2"]["metadata"]["annotations"][PODGROUP_ANNOTATION] == f"pg-train-{ptj_uid}"
            assert pods["etl-b"]["metadata"]["annotations"][PODGROUP_ANNOTATION] == f"pg-etl-b-{job_uid}"

            versions = {n: pg["metadata"]["resourceVersion"] for n, pg in pgs.items()}
            assert _cycle(api) == (0, [])  # idempotent: nothing created, patched or annotated again
            assert {n: pg["metadata"]["resourceVersion"] for n, pg in _podgroups(api).items()} == versions

            co.patch_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", "train", {
                "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 5}}}})
            _cycle(api)
            assert _podgroups(api)[f"pg-train-{ptj_uid}"]["spec"]["minMember"] == 6
        finally:
            with contextlib.suppress(ApiException):
                batch.delete_namespaced_job("etl", NS, propagation_policy="Orphan")
            with contextlib.suppress(ApiException):
                co.delete_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", "train")
