"""The chart on a real apiserver: rendered by `helm template` and applied with server-side apply it brings up a
scheduler that schedules a gang (the Deployment's own args, ConfigMap and ServiceAccount, run here as a process);
re-applying keeps the fields other field managers own and reports conflicts; an upgrade to changed values
applies; and helm itself installs and upgrades the chart."""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import MERGE_PATCH, apply_objects, object_path, request
from kai_opt.k8s.manifests import CONFIG_PATH, NAME
from kai_opt.k8s.ssa import ApplyConflictError, server_side_apply
from kai_opt.k8s.webhook import ensure_ca_bundle, generate_tls

from .helmtool import CHART, helm, helm_template, write_values
from .schedharness import FAST_RUNTIME, bound, create, node, pod, podgroup, queue, wait_for
from .test_run_shards import in_pool, job, scheduling_shards
from .testcluster import LocalCluster, delete_cluster_rbac, ensure_namespace, free_port, write_kubeconfig

pytestmark = pytest.mark.e2e

WORK_NS = "sched"
_COUNT = itertools.count()


@pytest.fixture
def ns(clean_cluster: LocalCluster) -> Iterator[str]:
    """A new release namespace (as `helm install --create-namespace` makes it: namespaces never finish deleting
    here, so each test gets its own); kai-opt's cluster-scoped RBAC removed afterwards (a reset leaves it)."""
    name = f"kai-opt-helm-{os.getpid()}-{next(_COUNT)}"
    with clean_cluster.api_client() as api:
        ensure_namespace(api, name)
    try:
        yield name
    finally:
        with clean_cluster.api_client() as api:
            for role in (NAME, f"{NAME}-webhook"):
                delete_cluster_rbac(api, role)


def _deployment(ns: str) -> str:
    return object_path("apps/v1", "deployments", ns, NAME)


def _render(tmp_path: Path, ns: str, values: dict[str, Any], name: str = "values.yaml") -> list[dict[str, Any]]:
    return helm_template(write_values(tmp_path / name, values), ns)


@contextlib.contextmanager
def _run_deployment(cluster: LocalCluster, api: ApiClient, ns: str, workdir: Path,
                    deployment: str = NAME) -> Iterator[subprocess.Popen[bytes]]:
    """The applied Deployment's container run here: its args, the applied ConfigMap as its config file and its
    ServiceAccount's token (what a kubelet would give the pod)."""
    dep = request(api, "GET", object_path("apps/v1", "deployments", ns, deployment))
    [container] = dep["spec"]["template"]["spec"]["containers"]
    cm = request(api, "GET", object_path("v1", "configmaps", ns, f"{deployment}-config"))
    config = workdir / "config.yaml"
    config.write_text(cm["data"]["config.yaml"], encoding="utf-8")
    token = cluster.service_account_token(ns, dep["spec"]["template"]["spec"]["serviceAccountName"])
    kubeconfig = write_kubeconfig(workdir / "kubeconfig-sa", host=cluster.host, token=token,
                                  ca_file=cluster.ca_file, user="sa")
    args = [str(config) if a == CONFIG_PATH else a for a in container["args"]]
    env = {**os.environ, "POD_NAME": "kai-opt-0", "POD_NAMESPACE": ns, "PYTHONPATH": os.getcwd()}
    with (workdir / "scheduler.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kai_opt.cli.main", *args, "--kubeconfig", str(kubeconfig)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(port: int) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
        return r.status == 200
    return False


def test_chart_brings_up_a_scheduler_that_schedules_a_gang(clean_cluster: LocalCluster, ns: str,
                                                           tmp_path: Path) -> None:
    metrics_port, webhook_port = free_port(), free_port()
    objs = _render(tmp_path, ns, {"replicas": 1, "engine": "greedy", "metrics": {"port": metrics_port},
                              "webhook": {"port": webhook_port},
                              "config": {"schedule_period_s": 0.2, "runtime": FAST_RUNTIME}})
    with clean_cluster.api_client() as api:
        applied = server_side_apply(api, objs)
        assert len(applied) == len(objs)
        ensure_namespace(api, WORK_NS)
        create(api, [node("n1", 4), node("n2", 4), queue("team"), podgroup("gang", 6, "team"),
                     *[pod(f"gang-{i}", gpus=1, group="gang") for i in range(6)]])
        with _run_deployment(clean_cluster, api, ns, tmp_path) as proc:
            wait_for("the scheduler ready", lambda: _ready(metrics_port) or proc.poll() is not None, timeout=60)
            assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()
            placed = wait_for("the gang bound", lambda: len(bound(api, WORK_NS)) == 6 and bound(api, WORK_NS),
                              timeout=60)
        assert sorted(placed) == [f"gang-{i}" for i in range(6)]
        assert sorted(set(placed.values())) == ["n1", "n2"]
        # the webhook's certificate, made by kai-opt as its ServiceAccount, and the caBundle it set
        secret = request(api, "GET", object_path("v1", "secrets", ns, "kai-opt-webhook-tls"))
        assert set(secret["data"]) >= {"ca.crt", "tls.crt", "tls.key"}
        mwc = request(api, "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kai-opt")
        assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]


def test_a_charts_shard_reads_its_scheduling_shard_and_schedules_its_pool(clean_cluster: LocalCluster, ns: str,
                                                                          tmp_path: Path) -> None:
    """values `shards`: the shard's Deployment, run as its ServiceAccount (the chart's RBAC: the SchedulingShard
    read, its own Lease), takes its partition from KAI's SchedulingShard and binds its pool's pods only."""
    metrics_port = free_port()
    objs = _render(tmp_path, ns, {"replicas": 1, "engine": "greedy", "metrics": {"port": metrics_port},
                                  "gpuSharing": {"enabled": False},
                                  "config": {"schedule_period_s": 0.2, "runtime": FAST_RUNTIME},
                                  "shards": [{"name": "gpu-shard"}]})
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"] == [f"{NAME}-gpu-shard"]
    shard = {"apiVersion": "kai.scheduler/v1", "kind": "SchedulingShard", "metadata": {"name": "gpu-shard"},
             "spec": {"partitionLabelValue": "gpu-nodes"}}
    with clean_cluster.api_client() as api, scheduling_shards(api, shard):
        server_side_apply(api, objs)
        ensure_namespace(api, WORK_NS)
        create(api, [in_pool(node("n1", 4), "gpu-nodes"), node("n2", 4), in_pool(queue("team"), "gpu-nodes"),
                     queue("other"), *[job(f"p-{i}", "gpu-nodes", "team") for i in range(3)],
                     pod("unpooled", gpus=1, queue_name="other")])
        with _run_deployment(clean_cluster, api, ns, tmp_path, f"{NAME}-gpu-shard") as proc:
            placed = wait_for("the pool's pods bound", lambda: len(bound(api, WORK_NS)) >= 3 and bound(api, WORK_NS),
                              timeout=60)
            time.sleep(2)
            log = (tmp_path / "scheduler.log").read_text()
            assert proc.poll() is None, log
            assert bound(api, WORK_NS) == placed == {f"p-{i}": "n1" for i in range(3)}, log
            lease = request(api, "GET", object_path("coordination.k8s.io/v1", "leases", ns, f"{NAME}-gpu-shard"))
            assert lease["spec"]["holderIdentity"].startswith("kai-opt-0")
            assert "SchedulingShard gpu-shard read" in log


def test_reapply_keeps_other_managers_fields_and_reports_conflicts(clean_cluster: LocalCluster, ns: str,
                                                                   tmp_path: Path) -> None:
    objs = _render(tmp_path, ns, {})
    with clean_cluster.api_client() as api:
        server_side_apply(api, objs)
        # other managers: kai-opt's runtime sets the webhook's caBundle, KAI's Helm release labels the shared CRD,
        # a team annotates the Deployment
        ca = generate_tls(["x"]).ca_pem
        assert ensure_ca_bundle(api, ca)
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/queues.scheduling.run.ai"
        request(api, "PATCH", crd, body={"metadata": {"labels": {"app.kubernetes.io/managed-by": "Helm"},
                                                      "annotations": {"meta.helm.sh/release-name": "kai"}}},
                query={"fieldManager": "helm"}, content_type=MERGE_PATCH)
        request(api, "PATCH", _deployment(ns), body={"metadata": {"annotations": {"team.example/owner": "ml"}}},
                query={"fieldManager": "team"}, content_type=MERGE_PATCH)

        again = server_side_apply(api, objs)
        assert all(line.endswith("serverside-applied") for line in again)
        mwc = request(api, "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kai-opt")
        assert base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"]).decode() == ca
        live_crd = request(api, "GET", crd)
        assert live_crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert live_crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == "kai"
        assert request(api, "GET", _deployment(ns))["metadata"]["annotations"]["team.example/owner"] == "ml"

        # a field another manager set to another value: a conflict (exit code 2 from the CLI), unless forced
        scaler = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, "namespace": ns},
                  "spec": {"replicas": 5}}
        server_side_apply(api, [scaler], field_manager="autoscaler", force=True)
        with pytest.raises(ApplyConflictError, match=r"autoscaler.*--force-conflicts"):
            server_side_apply(api, objs)
        assert request(api, "GET", _deployment(ns))["spec"]["replicas"] == 5
        server_side_apply(api, objs, force=True)
        assert request(api, "GET", _deployment(ns))["spec"]["replicas"] == 2

        # the old create-then-replace drops what the others set: what server-side apply is for
        [dep] = [o for o in objs if o["kind"] == "Deployment"]
        apply_objects(api, [dep])
        assert "team.example/owner" not in (request(api, "GET", _deployment(ns))["metadata"].get("annotations") or {})


def test_cli_apply_conflict_is_a_one_line_error(clean_cluster: LocalCluster, ns: str, tmp_path: Path) -> None:
    with clean_cluster.api_client() as api:
        request(api, "POST", object_path("v1", "configmaps", ns), body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{NAME}-config"},
            "data": {"config.yaml": "engine: greedy\n"}}, query={"fieldManager": "someone"})
    kubeconfig = clean_cluster.kubeconfig()
    args = [sys.executable, "-m", "kai_opt.cli.main", "manifests", "-n", ns, "--apply", "--kubeconfig",
            str(kubeconfig)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "someone" in proc.stderr and "--force-conflicts" in proc.stderr
    proc = subprocess.run([*args, "--force-conflicts"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "configmap/kai-opt-config serverside-applied" in proc.stdout.splitlines()


OLD = {"priorityClassName": "system-cluster-critical", "config": {"schedule_period_s": 1.0}}
NEW = {"replicas": 1, "image": {"tag": "0.2.0"}, "gpuSharing": {"enabled": False}, "priorityClassName": "",
       "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": None}, "metrics": {"port": 9090},
       "podDisruptionBudget": {"maxUnavailable": 0}, "config": {"schedule_period_s": 0.5}}


def test_upgrade_from_previous_values_applies(clean_cluster: LocalCluster, ns: str, tmp_path: Path) -> None:
    with clean_cluster.api_client() as api:
        server_side_apply(api, _render(tmp_path, ns, OLD, "old.yaml"))
        dep = request(api, "GET", _deployment(ns))
        assert dep["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
        server_side_apply(api, _render(tmp_path, ns, NEW, "new.yaml"))
        dep = request(api, "GET", _deployment(ns))
        spec = dep["spec"]["template"]["spec"]
        [container] = spec["containers"]
        assert dep["spec"]["replicas"] == 1 and container["image"] == "kai-opt:0.2.0"
        # fields kai-opt applied before and no longer sets are removed
        assert "priorityClassName" not in spec
        assert "--webhook-port" not in container["args"] and container["args"][-1] == "9090"
        assert [p["name"] for p in container["ports"]] == ["metrics"]
        assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
        cm = request(api, "GET", object_path("v1", "configmaps", ns, f"{NAME}-config"))
        assert "schedule_period_s: 0.5" in cm["data"]["config.yaml"]
        pdb = request(api, "GET", object_path("policy/v1", "poddisruptionbudgets", ns, NAME))
        assert pdb["spec"]["maxUnavailable"] == 0
        svc = request(api, "GET", object_path("v1", "services", ns, f"{NAME}-metrics"))
        assert svc["spec"]["ports"][0]["port"] == 9090


def test_helm_installs_and_upgrades_the_chart(clean_cluster: LocalCluster, ns: str, tmp_path: Path) -> None:
    ns = f"{ns}-release"  # helm creates it (--create-namespace)
    resv = f"{ns}-resv"  # helm adopts no object it did not create: a reservation namespace of its own
    kubeconfig = str(clean_cluster.kubeconfig())
    old = write_values(tmp_path / "old.yaml", {**OLD, "gpuSharing": {"reservationNamespace": resv}})
    new = write_values(tmp_path / "new.yaml", NEW)
    common = ["--kubeconfig", kubeconfig, "-n", ns, "--wait=false"]
    proc = helm("install", "kai-opt", str(CHART), "--create-namespace", "-f", str(old), *common, check=False)
    assert proc.returncode == 0, proc.stderr
    proc = helm("upgrade", "kai-opt", str(CHART), "-f", str(new), *common, check=False)
    assert proc.returncode == 0, proc.stderr
    with clean_cluster.api_client() as api:
        dep = request(api, "GET", object_path("apps/v1", "deployments", ns, NAME))
        assert dep["spec"]["replicas"] == 1 and "priorityClassName" not in dep["spec"]["template"]["spec"]
        # helm deletes what the new values no longer render
        with pytest.raises(ApiException) as err:
            request(api, "GET", object_path("v1", "services", ns, "kai-opt-webhook"))
        assert err.value.status == 404
        assert request(api, "GET", "/apis/scheduling.run.ai/v2/queues/default-queue")["metadata"]["name"]
