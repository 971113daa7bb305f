"""Helpers for the end-to-end tests of `kai-opt run`: object builders, the scheduler in-process (a thread) or as a
`kai-opt run` subprocess, and polling."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.config import Config, parse_config
from kai_opt.k8s.client import apply_objects, make_api_client, object_path, request
from kai_opt.k8s.runner import Runner

from .testcluster import LocalCluster, ensure_namespace, reset_cluster

NS = "sched"
FAST_RUNTIME: dict[str, Any] = {
    "client_qps": 500, "client_burst": 500, "retry_backoff_s": 0.05, "event_repeat_s": 30,
    "absent_kind_recheck_s": 1, "backoff_max_s": 1, "watch_timeout_s": 30, "sync_timeout_s": 20,
    "blocked_eviction_retry_s": 0.5,
    "leader_election": {"lease_duration_s": 2.0, "renew_deadline_s": 1.5, "retry_period_s": 0.25},
}


def fast_config(period: float = 0.2, **runtime: Any) -> Config:
    rt = {**FAST_RUNTIME, **runtime}
    return parse_config({"engine": "greedy", "schedule_period_s": period, "runtime": rt})  # the CP-SAT engine
    # in a cluster: test_run_cpsat.py


RESERVATION_NS = "kai-resource-reservation"  # kai-opt's default for GPU reservation pods
RESERVED_GPU = "run.ai/reserve_for_gpu_index"


@pytest.fixture
def fresh(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """`clean_cluster` plus what it leaves: Events, Leases and PodDisruptionBudgets of the tests' namespaces; with
    what GPU nodes provide for GPU sharing: the reservation namespace, the `nvidia` RuntimeClass, and the node side
    of every reservation pod's report (`gpu_node`) while the test runs."""
    reset_cluster(cluster)
    with cluster.api_client() as api:
        ensure_namespace(api, NS)
        ensure_namespace(api, RESERVATION_NS)
        with contextlib.suppress(ApiException):  # 409: there from an earlier test
            request(api, "POST", "/apis/node.k8s.io/v1/runtimeclasses", body={
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                "handler": "nvidia"})
        for ns in (NS, "default"):
            delete_all(api, "v1", "events", ns)
            delete_all(api, "coordination.k8s.io/v1", "leases", ns)
            delete_all(api, "policy/v1", "poddisruptionbudgets", ns)
    with cluster.api_client() as api, gpu_node(api):
        yield cluster


@contextlib.contextmanager
def gpu_node(api: ApiClient, namespace: str = RESERVATION_NS, *,
             report: threading.Event | None = None) -> Iterator[None]:
    """Plays the GPU nodes for GPU sharing (there is no device plugin here): every reservation pod in `namespace`
    gets the annotation its container writes on a real node, `run.ai/reserve_for_gpu_index: GPU-<node>-<n>`, once
    `report` is set (at once when None)."""
    stop = threading.Event()
    count = [0]

    def loop() -> None:
        while not stop.wait(0.05):
            if report is not None and not report.is_set():
                continue
            with contextlib.suppress(Exception):  # the namespace may be reset meanwhile
                for p in request(api, "GET", object_path("v1", "pods", namespace))["items"]:
                    meta = p["metadata"]
                    if (meta.get("annotations") or {}).get(RESERVED_GPU) or meta.get("deletionTimestamp"):
                        continue
                    count[0] += 1
                    request(api, "PATCH", object_path("v1", "pods", namespace, meta["name"]),
                            body={"metadata": {"annotations": {
                                RESERVED_GPU: f"GPU-{p['spec'].get('nodeName')}-{count[0]}"}}},
                            content_type="application/merge-patch+json")

    thread = threading.Thread(target=loop, name="gpu-node", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


# -- objects -------------------------------------------------------------------------------------------------------
def node(name: str, gpus: int, labels: dict[str, str] | None = None, *, cpu: str = "64",
         memory: str = "512Gi") -> dict[str, Any]:
    res = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "nvidia.com/gpu.memory": "81920", **(labels or {})}},
            "status": {"capacity": res, "allocatable": res, "conditions": [{"type": "Ready", "status": "True"}]}}


def queue(name: str, gpu_quota: float = -1, *, parent: str | None = None, gpu_limit: float = -1,
          priority: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": gpu_quota, "limit": gpu_limit, "overQuotaWeight": 1},
                                          "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                                          "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def podgroup(name: str, min_member: int, queue_name: str, *, ns: str = NS, priority_class: str = "train",
             topology: dict[str, str] | None = None, sub_groups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member, "queue": queue_name, "priorityClassName": priority_class}
    if topology:
        spec["topologyConstraint"] = topology
    if sub_groups:
        spec["subGroups"] = sub_groups
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def pod(name: str, *, gpus: int = 0, group: str | None = None, queue_name: str | None = None, ns: str = NS,
        fraction: str | None = None, labels: dict[str, str] | None = None, scheduler: str = "kai-opt",
        cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": dict(labels or {}), "annotations": {}}
    if group:
        meta["annotations"]["pod-group-name"] = group
    if queue_name:
        meta["labels"]["kai.scheduler/queue"] = queue_name
    if fraction:
        meta["annotations"]["gpu-fraction"] = fraction
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulerName": scheduler,
                     "containers": [{"name": "main", "image": "busybox", "resources": resources}]}}


def served(api: ApiClient, group_version: str) -> bool:
    """Whether the apiserver serves `group_version` (e.g. a CRD's group installed or removed)."""
    try:
        request(api, "GET", f"/apis/{group_version}")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def namespace(name: str = NS) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def create(api: ApiClient, objects: list[dict[str, Any]]) -> None:
    apply_objects(api, objects)


# -- reading -------------------------------------------------------------------------------------------------------
def pods(api: ApiClient, ns: str = NS) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in request(api, "GET", object_path("v1", "pods", ns))["items"]}


def bound(api: ApiClient, ns: str = NS) -> dict[str, str]:
    """pod name -> node of every bound pod."""
    return {n: p["spec"]["nodeName"] for n, p in pods(api, ns).items() if p["spec"].get("nodeName")}


def get_podgroup(api: ApiClient, name: str, ns: str = NS) -> dict[str, Any]:
    return request(api, "GET", object_path("scheduling.run.ai/v2alpha2", "podgroups", ns, name))


def events(api: ApiClient, ns: str = NS, *, reason: str | None = None) -> list[dict[str, Any]]:
    items = request(api, "GET", object_path("v1", "events", ns))["items"]
    return [e for e in items if reason is None or e.get("reason") == reason]


def devices(p: dict[str, Any]) -> str | None:
    return (p["metadata"].get("annotations") or {}).get("kai-opt.io/gpu-devices")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except ApiException as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {str(last)[:500]})")


def delete_all(api: ApiClient, api_version: str, plural: str, ns: str | None = None) -> None:
    for item in request(api, "GET", object_path(api_version, plural, ns))["items"]:
        meta = item["metadata"]
        with contextlib.suppress(ApiException):
            request(api, "DELETE", object_path(api_version, plural, meta.get("namespace"), meta["name"]),
                    query={"gracePeriodSeconds": 0})


# -- the scheduler -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def scheduler(cluster: LocalCluster, config: Config | None = None, *, identity: str = "test",
              leader_elect: bool = False, metrics: Any = None, user: str | None = None,
              token: str | None = None) -> Iterator[Runner]:
    """`kai-opt run` in a thread of this process (as the admin, test identity `user`, or whoever `token` is, e.g. a
    ServiceAccount's); stopped and joined on exit."""
    api = make_api_client(host=cluster.host, token=token or cluster.token(user), ca_file=cluster.ca_file,
                          pool_size=64)
    runner = Runner(api, config or fast_config(), identity=identity, leader_elect=leader_elect,
                    lease_namespace="default", metrics=metrics)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            runner.run()
        except BaseException as exc:  # re-raised in the test
            errors.append(exc)

    thread = threading.Thread(target=main, name="kai-opt-run", daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(15)
        api.close()
    assert not thread.is_alive(), "the scheduler did not stop"
    if errors:
        raise errors[0]


class SchedulerProcess:
    """`kai-opt run` as a subprocess (for SIGKILL and leader-election tests); output in `log`."""

    def __init__(self, cluster: LocalCluster, workdir: Path, config: dict[str, Any], *, identity: str,
                 leader_elect: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.identity = identity
        self.log = workdir / f"kai-opt-{identity}.log"
        cfg_file = workdir / f"config-{identity}.yaml"
        cfg_file.write_text(yaml.safe_dump(config), encoding="utf-8")
        args = [sys.executable, "-m", "kai_opt.cli.main", "run", "--kubeconfig", str(cluster.kubeconfig()),
                "--config", str(cfg_file), "--identity", identity, "--lease-namespace", "default",
                "--leader-elect" if leader_elect else "--no-leader-elect", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env)

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        if self.running():
            self.proc.terminate()
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")
