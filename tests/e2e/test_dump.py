"""`kai-opt dump` against a real apiserver: what `kai-opt show` reads back is exactly what was created."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kai_opt.k8s.client import apply_objects, parse_yaml, request
from kai_opt.k8s.dump import SOURCES, dump_cluster, list_objects

from .testcluster import LocalCluster, ensure_namespace, free_port, write_kubeconfig

pytestmark = pytest.mark.e2e

GIB = 1024**3


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_opt.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def _node(name: str, gpus: int, zone: str, rack: str) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": zone, "rack": rack,
                                                  "nvidia.com/gpu.memory": "81920",
                                                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"capacity": res, "allocatable": res, "conditions": [{"type": "Ready", "status": "True"}]}}


def _queue(name: str, parent: str | None, resources: dict[str, Any], priority: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": resources}
    if parent:
        spec["parentQueue"] = parent
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _pod(ns: str, name: str, *, gpus: int, queue: str | None, podgroup: str | None = None,
         scheduler: str = "kai-opt", gates: tuple[str, ...] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": {}, "annotations": {}}
    if queue:
        meta["labels"]["kai.scheduler/queue"] = queue
    if podgroup:
        meta["annotations"]["pod-group-name"] = podgroup
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{
        "name": "main", "image": "busybox",
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _bind(v1: client.CoreV1Api, ns: str, name: str, node: str) -> None:
    v1.create_namespaced_pod_binding(name, ns, client.V1Binding(
        metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=node)),
        _preload_content=False)  # the server answers with a Status, not a Binding


def populate(cluster: LocalCluster) -> None:
    """3 GPU nodes (8+8+4), a 2-level queue tree, a topology, a priority class, a pending 2-pod gang (8 GPUs),
    a running kai-opt pod (2 GPUs), another scheduler's bound pod (1 GPU) and a gated pod."""
    gpu = {"quota": 16, "overQuotaWeight": 1, "limit": 20}
    unlimited = {"quota": -1, "overQuotaWeight": 1, "limit": -1}
    objects = [
        _node("node-a", 8, "z1", "r1"), _node("node-b", 8, "z1", "r2"), _node("node-c", 4, "z2", "r3"),
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "research-high"},
         "value": 150},
        {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": "dc"},
         "spec": {"levels": [{"nodeLabel": "zone"}, {"nodeLabel": "rack"}, {"nodeLabel": "kubernetes.io/hostname"}]}},
        _queue("research", None, {"gpu": gpu, "cpu": unlimited, "memory": unlimited}),
        _queue("team-a", "research", {"gpu": {"quota": 8, "overQuotaWeight": 2, "limit": 12},
                                      "cpu": {"quota": 32000, "limit": 64000},
                                      "memory": {"quota": 256000, "limit": -1}}, priority=150),
        _queue("team-b", "research", {"gpu": {"quota": 4}}),
        {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
         "metadata": {"name": "train", "namespace": "team-a"},
         "spec": {"minMember": 2, "queue": "team-a", "priorityClassName": "research-high",
                  "topologyConstraint": {"topology": "dc", "requiredTopologyLevel": "rack"}}},
        {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
         "metadata": {"name": "serve", "namespace": "team-b"},
         "spec": {"minMember": 1, "queue": "team-b", "preemptibility": "non-preemptible"}},
        _pod("team-a", "train-0", gpus=4, queue="team-a", podgroup="train"),
        _pod("team-a", "train-1", gpus=4, queue="team-a", podgroup="train"),
        _pod("team-b", "serve-0", gpus=2, queue="team-b", podgroup="serve"),
        _pod("team-b", "waiting", gpus=1, queue="team-b", gates=("example.com/hold",)),
        _pod("kube-system", "agent", gpus=1, queue=None, scheduler="default-scheduler"),
    ]
    with cluster.api_client() as api:
        for ns in ("team-a", "team-b"):
            ensure_namespace(api, ns)
        apply_objects(api, objects)  # nodes keep the status they are created with (pods do not)
        v1 = client.CoreV1Api(api)
        _bind(v1, "team-b", "serve-0", "node-a")
        _bind(v1, "kube-system", "agent", "node-b")
        # pod status can only be written through the status subresource (create resets it); no kubelet here
        v1.patch_namespaced_pod_status("serve-0", "team-b", {"status": {"phase": "Running"}})


def test_dump_then_show_reproduces_the_cluster(clean_cluster: LocalCluster, tmp_path: Path) -> None:
    populate(clean_cluster)
    out = tmp_path / "snap.yaml"
    res = run_cli("dump", "--kubeconfig", str(clean_cluster.kubeconfig()), "--file", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""

    dumped = yaml.safe_load(out.read_text())
    assert dumped["apiVersion"] == "v1" and dumped["kind"] == "List"
    kinds: dict[str, int] = {}
    for item in dumped["items"]:
        assert item["apiVersion"] and item["kind"]
        assert "managedFields" not in item["metadata"]
        kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
    assert kinds == {"Node": 3, "Pod": 5, "PodGroup": 2, "Queue": 3, "PriorityClass": 3, "Topology": 1}
    assert "wrote 3 Node, 5 Pod, 2 PodGroup, 3 Queue, 3 PriorityClass, 1 Topology" in res.stderr

    shown = run_cli("show", str(out), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["nodes"] == 3 and data["nodes_schedulable"] == 3
    assert data["gpus"]["total"] == 20 and data["gpus"]["used"] == 3
    assert data["pods"] == {"running": 2, "releasing": 0, "pending": 2, "gated": 1}
    assert data["warnings"] == []

    queues = {q["name"]: q for q in data["queues"]}
    assert set(queues) == {"research", "team-a", "team-b"}
    assert {n: q["parent"] for n, q in queues.items()} == {"research": None, "team-a": "research",
                                                           "team-b": "research"}
    assert {n: q["priority"] for n, q in queues.items()} == {"research": 100, "team-a": 150, "team-b": 100}
    assert {n: (q["gpu"]["quota"], q["gpu"]["limit"], q["gpu"]["over_quota_weight"]) for n, q in queues.items()} \
        == {"research": (16, 20, 1), "team-a": (8, 12, 2), "team-b": (4, -1, 1)}
    assert (queues["team-a"]["cpu"]["quota"], queues["team-a"]["cpu"]["limit"]) == (32000, 64000)
    assert queues["team-a"]["memory"]["quota"] == 256000 * 10**6
    assert queues["research"]["memory"]["quota"] == -1
    assert queues["team-b"]["gpu"]["allocated"] == 2
    assert queues["team-a"]["gpu"]["requested"] == 8 and queues["team-a"]["gpu"]["allocated"] == 0

    assert data["pending_podgroups"] == [{
        "podgroup": "team-a/train", "queue": "team-a", "pending_pods": 2, "running_pods": 0, "min_member": 2,
        "priority": 150, "preemptible": False, "gpus": 8.0, "problem": None}]


def test_dump_reads_lists_in_pages(clean_cluster: LocalCluster) -> None:
    populate(clean_cluster)
    with clean_cluster.api_client() as api:
        pods = list_objects(api, SOURCES[1], page_size=2)
        assert sorted(p["metadata"]["name"] for p in pods) == ["agent", "serve-0", "train-0", "train-1", "waiting"]
        data = dump_cluster(api)
    assert [i["kind"] for i in data["items"]] == ["Node"] * 3 + ["Pod"] * 5 + ["PodGroup"] * 2 + ["Queue"] * 3 \
        + ["PriorityClass"] * 3 + ["Topology"]


def test_dump_to_stdout_skips_a_missing_crd_with_a_note(clean_cluster: LocalCluster) -> None:
    with clean_cluster.api_client() as api:
        request(api, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/topologies.kai.scheduler")
        deadline = time.monotonic() + 30
        while True:
            try:
                request(api, "GET", "/apis/kai.scheduler/v1alpha1/topologies")
            except client.ApiException as exc:
                if exc.status == 404:
                    break
            assert time.monotonic() < deadline, "topologies still served after deleting the CRD"
            time.sleep(0.1)
    try:
        res = run_cli("dump", "--kubeconfig", str(clean_cluster.kubeconfig()))
        assert res.returncode == 0, res.stderr
        assert [line for line in res.stderr.splitlines() if "note:" in line] == [
            "kai-opt: note: Topology (topologies.kai.scheduler) is not served by the cluster (CRD not installed); "
            "skipped"]
        dumped = yaml.safe_load(res.stdout)
        assert dumped["kind"] == "List"
        assert "Topology" not in {i["kind"] for i in dumped["items"]}
    finally:
        clean_cluster.install_crds()


def test_dump_needs_only_read_access(clean_cluster: LocalCluster, tmp_path: Path) -> None:
    """Without RBAC the reader gets one line (403, exit 1); with get/list on the six kinds the dump works."""
    kubeconfig = str(clean_cluster.kubeconfig("reader"))
    res = run_cli("dump", "--kubeconfig", kubeconfig)
    assert res.returncode == 1  # a refused request: a runtime failure (issue 22)
    assert len(res.stderr.splitlines()) == 1 and "403" in res.stderr and "list nodes" in res.stderr
    rbac = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kai-opt-dump}
rules:
- {apiGroups: [""], resources: [nodes, pods], verbs: [list]}
- {apiGroups: [scheduling.k8s.io], resources: [priorityclasses], verbs: [list]}
- {apiGroups: [scheduling.run.ai], resources: [queues, podgroups], verbs: [list]}
- {apiGroups: [kai.scheduler], resources: [topologies], verbs: [list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kai-opt-dump-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kai-opt-dump}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: reader}]
"""
    with clean_cluster.api_client() as api:
        assert apply_objects(api, parse_yaml(rbac)) == [
            "clusterrole.rbac.authorization.k8s.io/kai-opt-dump created",
            "clusterrolebinding.rbac.authorization.k8s.io/kai-opt-dump-reader created"]
        assert apply_objects(api, parse_yaml(rbac))[0].endswith("configured")
    deadline = time.monotonic() + 20  # the RBAC authorizer sees new bindings after a moment
    while (res := run_cli("dump", "--kubeconfig", kubeconfig, "--file", str(tmp_path / "d.yaml"))).returncode:
        assert time.monotonic() < deadline, res.stderr
        time.sleep(0.2)
    assert yaml.safe_load((tmp_path / "d.yaml").read_text())["kind"] == "List"


@pytest.mark.parametrize("problem", ["unreachable", "bad-token"])
def test_dump_connection_problems_are_one_line(problem: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if problem == "unreachable":
        kc = tmp_path / "kc"
        kc.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                   "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": "nope"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        expected = "cannot connect to the API server"
    else:
        cluster: LocalCluster = request.getfixturevalue("cluster")
        kc = write_kubeconfig(tmp_path / "kc", host=cluster.host, token="wrong", ca_file=cluster.ca_file)
        expected = "401 Unauthorized"
    res = run_cli("dump", "--kubeconfig", str(kc), "--file", str(tmp_path / "out.yaml"))
    assert res.returncode == 1  # the cluster cannot be read: a runtime failure (issue 22)
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("kai-opt: error: list nodes: ") and expected in lines[0]
    assert not (tmp_path / "out.yaml").exists()
