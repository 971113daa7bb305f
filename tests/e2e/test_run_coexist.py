"""`kai-opt run` beside other schedulers on a real apiserver: KAI-Scheduler's PodGroups and Queues keep their status
byte for byte (and KAI's pods keep their capacity) while kai-opt schedules its own gang; a node filled by another
scheduler between the cycle's snapshot and the bind makes kai-opt drop the bind instead of overcommitting; a pod the
kubelet rejects is counted and gets an Event."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.config import parse_config
from kai_opt.k8s.binder import BindRequest
from kai_opt.k8s.client import MERGE_PATCH, object_path, request
from kai_opt.k8s.metrics import SchedulerMetrics

from .schedharness import (
    FAST_RUNTIME,
    NS,
    bound,
    create,
    events,
    fresh,
    get_podgroup,
    namespace,
    node,
    pod,
    podgroup,
    pods,
    queue,
    scheduler,
    served,
    wait_for,
)
from .testcluster import LocalCluster

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

KAI = "kai-scheduler"
CYCLES = 20  # kai-opt cycles the KAI objects must survive unchanged
PG, QUEUES = "scheduling.run.ai/v2alpha2", "scheduling.run.ai/v2"

BINDREQUEST_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "bindrequests.scheduling.run.ai"},
    "spec": {"group": "scheduling.run.ai", "scope": "Namespaced",
             "names": {"kind": "BindRequest", "plural": "bindrequests", "singular": "bindrequest",
                       "listKind": "BindRequestList"},
             "versions": [{"name": "v1alpha2", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def config(**runtime: Any) -> Any:
    return parse_config({"engine": "greedy", "schedule_period_s": 0.2, "runtime": {**FAST_RUNTIME, **runtime}})


def bind(api: ApiClient, name: str, node_name: str, ns: str = NS) -> None:
    """Bind as another scheduler would (KAI's binder, kube-scheduler): the pods/binding subresource."""
    request(api, "POST", object_path("v1", "pods", ns, name) + "/binding", body={
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}})


@contextlib.contextmanager
def kai_installed(api: ApiClient) -> Iterator[None]:
    """KAI-Scheduler's BindRequest CRD installed (what kai-opt detects KAI by); removed afterwards."""
    request(api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=BINDREQUEST_CRD)
    try:
        wait_for("BindRequests served", lambda: served(api, "scheduling.run.ai/v1alpha2"))
        yield
    finally:
        with contextlib.suppress(ApiException):
            request(api, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                    "bindrequests.scheduling.run.ai")
        wait_for("BindRequests gone", lambda: not served(api, "scheduling.run.ai/v1alpha2"), timeout=60)


def gpu_requests_by_node(api: ApiClient) -> dict[str, int]:
    used: dict[str, int] = {}
    for p in pods(api).values():
        n = p["spec"].get("nodeName")
        if not n or p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in p["spec"]["containers"]:
            g = (c.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu")
            used[n] = used.get(n, 0) + int(g or 0)
    return used


def kai_objects(api: ApiClient) -> dict[str, Any]:
    """KAI's objects as the API server has them (resourceVersion, metadata and status)."""
    out: dict[str, Any] = {}
    for name in ("kai-pg", "kai-pending"):
        out[f"podgroup/{name}"] = get_podgroup(api, name)
    out["queue/kai-q"] = request(api, "GET", object_path(QUEUES, "queues", None, "kai-q"))
    for name, p in pods(api).items():
        if p["spec"]["schedulerName"] == KAI:
            out[f"pod/{name}"] = p
    return out


def fingerprint(obj: dict[str, Any]) -> tuple[Any, ...]:
    meta = obj["metadata"]
    return (meta["resourceVersion"], meta.get("generation"), meta.get("annotations"), meta.get("labels"),
            obj.get("status"))


@pytest.mark.parametrize("mode", ["auto-kai-installed", "never"])
def test_kai_podgroups_and_queues_keep_their_status_while_kai_opt_schedules_beside_them(
        fresh: LocalCluster, mode: str) -> None:
    with fresh.api_client() as api, (kai_installed(api) if mode.startswith("auto") else contextlib.nullcontext()):
        create(api, [namespace(), node("n1", 4), node("n2", 4), queue("kai-q"), queue("team"),
                     podgroup("kai-pg", 2, "kai-q"), podgroup("kai-pending", 1, "kai-q"),
                     pod("kai-0", gpus=1, group="kai-pg", scheduler=KAI),
                     pod("kai-1", gpus=1, group="kai-pg", scheduler=KAI),
                     pod("kai-2", gpus=8, group="kai-pending", scheduler=KAI),
                     podgroup("g", 6, "team"), *[pod(f"g-{i}", gpus=1, group="g") for i in range(6)],
                     podgroup("huge", 1, "team"), pod("huge-0", gpus=8, group="huge")])
        # KAI binds its gang onto n1 and writes its status, conditions and annotations
        bind(api, "kai-0", "n1")
        bind(api, "kai-1", "n1")
        pg_path = object_path(PG, "podgroups", NS, "kai-pg")
        request(api, "PATCH", pg_path, content_type=MERGE_PATCH, body={"metadata": {"annotations": {
            "kai.scheduler/last-start-timestamp": "2026-12-01T10:00:00Z"}}})
        request(api, "PATCH", pg_path + "/status", content_type=MERGE_PATCH, body={"status": {
            "phase": "Running", "running": 2, "pending": 0,
            "resourcesStatus": {"allocated": {"nvidia.com/gpu": "2"}, "requested": {"nvidia.com/gpu": "2"}}}})
        request(api, "PATCH", object_path(PG, "podgroups", NS, "kai-pending") + "/status",
                content_type=MERGE_PATCH, body={"status": {"phase": "Pending", "pending": 1, "schedulingConditions": [{
                    "type": "UnschedulableOnNodePool", "nodePool": "default", "status": "True",
                    "reason": "Unschedulable", "message": "KAI: 0/2 nodes are available", "transitionID": "7",
                    "lastTransitionTime": "2026-12-01T10:00:00Z"}]}})
        request(api, "PATCH", object_path(QUEUES, "queues", None, "kai-q") + "/status", content_type=MERGE_PATCH,
                body={"status": {"allocated": {"nvidia.com/gpu": "2"}, "requested": {"nvidia.com/gpu": "10"},
                                 "childQueues": []}})
        before = kai_objects(api)
        assert before["podgroup/kai-pending"]["status"]["schedulingConditions"][0]["transitionID"] == "7"
        assert before["queue/kai-q"]["status"]["requested"] == {"nvidia.com/gpu": "10"}
        cfg = config(queue_status="auto" if mode.startswith("auto") else "never")
        with scheduler(fresh, cfg) as runner:
            wait_for("kai-opt's gang bound", lambda: len([n for n in bound(api) if n.startswith("g-")]) == 6)
            wait_for("kai-opt's own annotation", lambda: (get_podgroup(api, "g")["metadata"].get("annotations")
                                                          or {}).get("kai.scheduler/last-start-timestamp"))
            wait_for("kai-opt's own condition", lambda: get_podgroup(api, "huge").get("status", {}).get(
                "schedulingConditions"))
            start = runner.cycles
            wait_for(f"{CYCLES} more cycles", lambda: runner.cycles >= start + CYCLES, timeout=60)
            runner.drain(timeout=10)
            time.sleep(0.5)  # let writes of the last cycles land
            assert runner.cycles >= start + CYCLES
        after = kai_objects(api)
        assert set(after) == set(before)
        for key in before:
            assert fingerprint(after[key]) == fingerprint(before[key]), key
        # KAI's pods kept their capacity: kai-opt's gang took n1's two free GPUs and all of n2
        placed = bound(api)
        assert sorted(placed[f"g-{i}"] for i in range(6)).count("n1") == 2
        assert gpu_requests_by_node(api) == {"n1": 4, "n2": 4}
        assert "kai-2" not in placed and "huge-0" not in placed
        # no kai-opt Event about KAI's objects; ours still get theirs
        about = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for ns in (NS, "default")
                 for e in events(api, ns)}
        assert not {x for x in about if x[1].startswith("kai-")}, about
        assert ("PodGroup", "huge") in about and ("Pod", "huge-0") in about
        # Queue status is KAI's queue controller's here: kai-opt's own queue gets none either
        team = request(api, "GET", object_path(QUEUES, "queues", None, "team"))
        assert not team.get("status"), team.get("status")


def test_kai_opt_writes_queue_status_when_kai_is_not_installed(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        assert not served(api, "scheduling.run.ai/v1alpha2")
        create(api, [namespace(), node("n1", 4), queue("team"), pod("p", gpus=1, queue_name="team")])
        with scheduler(fresh, config(queue_status="auto")):
            wait_for("queue status with the pod's GPU", lambda: request(api, "GET", object_path(
                QUEUES, "queues", None, "team")).get("status", {}).get("allocated", {}).get("nvidia.com/gpu") == "1")


@pytest.mark.parametrize("recheck", [True, False])
def test_a_node_filled_by_another_scheduler_after_the_snapshot_is_not_overcommitted(
        fresh: LocalCluster, recheck: bool) -> None:
    """Between kai-opt's snapshot and its bind, kube-scheduler binds a 2-GPU pod onto the node kai-opt chose for a
    4-GPU pod. With the re-check kai-opt drops that bind (counted) and binds the pod on the other node next cycle;
    without it both binds go through and the node is overcommitted (the race of KAI-Scheduler issue #1454)."""
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 4), node("n2", 4), queue("team"),
                     pod("theirs", gpus=2, scheduler="default-scheduler")])
        metrics = SchedulerMetrics()
        with scheduler(fresh, config(prebind_recheck=recheck), metrics=metrics) as runner:
            real = runner.binder.recheck
            raced: list[str] = []

            def race(req: BindRequest) -> str | None:
                if not raced and req.name == "mine":  # the other scheduler's bind lands first
                    raced.append(req.node)
                    bind(api, "theirs", req.node)
                    wait_for("the watch to show it", lambda: (runner.cache.pod(NS, "theirs") or {}).get(
                        "spec", {}).get("nodeName"))
                return real(req) if real is not None else None

            runner.binder.recheck = race
            create(api, [pod("mine", gpus=4, queue_name="team")])
            wait_for("kai-opt's pod bound", lambda: "mine" in bound(api))
            time.sleep(0.5)
            text = metrics.text()
        placed = bound(api)
        assert placed["theirs"] == raced[0]
        used = gpu_requests_by_node(api)
        if recheck:
            assert placed["mine"] != raced[0], "bound onto the node the other scheduler filled"
            assert used == {raced[0]: 2, placed["mine"]: 4}, used
            assert 'kai_opt_binds_dropped_total{reason="nvidia.com/gpu"} 1.0' in text
            dropped = [e for e in events(api, reason="FailedBinding") if e["involvedObject"]["name"] == "mine"]
            assert dropped and "no longer fits" in dropped[0]["message"], dropped
            assert "kai_opt_bind_failures_total{" not in text, "a drop is not a failed request"
        else:
            assert placed["mine"] == raced[0] and used[raced[0]] == 6, used  # the race, unguarded
            assert "kai_opt_binds_dropped_total{" not in text


def test_a_pod_the_kubelet_rejects_is_counted_and_gets_an_event(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 4), queue("team"), pod("mine", cpu="2", queue_name="team"),
                     pod("theirs", cpu="2", scheduler="default-scheduler")])
        metrics = SchedulerMetrics()
        with scheduler(fresh, metrics=metrics):
            wait_for("kai-opt's pod bound", lambda: "mine" in bound(api))
            bind(api, "theirs", "n1")
            for name, reason in (("mine", "OutOfcpu"), ("theirs", "OutOfmemory")):  # as the kubelet does
                request(api, "PATCH", object_path("v1", "pods", NS, name) + "/status", content_type=MERGE_PATCH,
                        body={"status": {"phase": "Failed", "reason": reason, "message": (
                            f"Pod was rejected: Node didn't have enough resource: {reason[5:]}")}})
            event = wait_for("the RejectedByKubelet event", lambda: [
                e for e in events(api, reason="RejectedByKubelet")])
            time.sleep(0.5)
            text = metrics.text()
        assert [e["involvedObject"]["name"] for e in event] == ["mine"]
        assert event[0]["type"] == "Warning" and "OutOfcpu" in event[0]["message"] and "n1" in event[0]["message"]
        assert 'kai_opt_pods_rejected_by_kubelet_total{reason="OutOfcpu"} 1.0' in text
        assert "OutOfmemory" not in text, "another scheduler's pod is not ours to count"
        assert not [e for e in events(api, reason="RejectedByKubelet") if e["involvedObject"]["name"] == "theirs"]
