"""Small builders of Kubernetes object dicts for tests (nodes, queues, podgroups, pods) and a Snapshot/state."""

from __future__ import annotations

from typing import Any

from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.state import ClusterState, build_state

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def node(name: str, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None, gpu_memory_mib: int = 81920, ready: bool = True,
         unschedulable: bool = False, pods: int = 110) -> RawObject:
    lab = {"kubernetes.io/hostname": name, "nvidia.com/gpu.memory": str(gpu_memory_mib)}
    lab.update(labels or {})
    return RawObject("Node", {
        "metadata": {"name": name, "labels": lab},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": str(pods)},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })


def queue(name: str, parent: str | None = None, gpu: tuple[float, float, float] = (0, 1, -1),
          cpu: tuple[float, float, float] = (-1, 1, -1), memory: tuple[float, float, float] = (-1, 1, -1),
          priority: int | None = None, created_min: int = 0, **spec: Any) -> RawObject:
    """gpu/cpu/memory = (quota, overQuotaWeight, limit); memory in MB as in the CRD."""
    res = {k: {"quota": v[0], "overQuotaWeight": v[1], "limit": v[2]}
           for k, v in (("gpu", gpu), ("cpu", cpu), ("memory", memory))}
    s: dict[str, Any] = {"resources": res, **spec}
    if parent:
        s["parentQueue"] = parent
    if priority is not None:
        s["priority"] = priority
    return RawObject("Queue", {"metadata": {"name": name, "creationTimestamp": _ts(NOW + 60 * created_min)},
                               "spec": s})


def podgroup(name: str, queue_name: str, min_member: int = 1, priority_class: str = "train",
             ns: str = "default", created_min: int = 0, **spec: Any) -> RawObject:
    return RawObject("PodGroup", {
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": _ts(NOW - 3600 + 60 * created_min)},
        "spec": {"minMember": min_member, "queue": queue_name, "priorityClassName": priority_class, **spec}})


def pod(name: str, group: str | None = None, gpus: float = 0, cpu: str = "1", memory: str = "1Gi",
        node_name: str | None = None, ns: str = "default", queue_name: str | None = None,
        annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        phase: str | None = None, deleting: bool = False, started_min_ago: float = 60,
        scheduler: str = "kai-opt", **spec: Any) -> RawObject:
    ann = dict(annotations or {})
    lab = dict(labels or {})
    req: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus and gpus < 1:
        ann["gpu-fraction"] = str(gpus)
    elif gpus:
        req["nvidia.com/gpu"] = str(int(gpus))
    if group:
        ann["pod-group-name"] = group
    if queue_name:
        lab["kai.scheduler/queue"] = queue_name
    md: dict[str, Any] = {"name": name, "namespace": ns, "annotations": ann, "labels": lab,
                          "creationTimestamp": _ts(NOW - 3600)}
    if deleting:
        md["deletionTimestamp"] = _ts(NOW - 1)
    body: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [{"name": "c", "resources": {"requests": req,
                                                                       "limits": {k: v for k, v in req.items()
                                                                                  if k == "nvidia.com/gpu"}}}],
                            **spec}
    status: dict[str, Any] = {}
    if node_name:
        body["nodeName"] = node_name
        status = {"phase": phase or "Running", "startTime": _ts(NOW - 60 * started_min_ago)}
    elif phase:
        status = {"phase": phase}
    return RawObject("Pod", {"metadata": md, "spec": body, "status": status})


def _ts(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def snapshot(objects: list[RawObject], **kw: Any) -> Snapshot:
    return Snapshot.from_objects(objects, now=NOW, **kw)


def state(objects: list[RawObject], **kw: Any) -> ClusterState:
    return build_state(snapshot(objects, **kw))


def run_cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    """Run the kai-opt CLI in-process: (exit code, stdout, stderr). `capsys` is pytest's capture fixture."""
    from kai_opt.cli.main import main

    code: Any = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    return (0 if code is None else int(code)), cap.out, cap.err


def departments(d2_running: int, d3_running: int = 4) -> ClusterState:
    """KAI case reclaim/009: 16 GPUs, departments d1-d4 deserving 4 each; d1's project p2 (deserved 1) runs 4, d2
    runs `d2_running`, d3 `d3_running`, d4 waits for 5; d1's project p1 (deserved 3) wants 1 GPU of inference."""
    objs = [node("n0", gpus=16)]
    for d in ("d1", "d2", "d3", "d4"):
        objs.append(queue(d, gpu=(4, 4, -1)))
    objs += [queue("d1_p1", parent="d1", gpu=(3, 3, -1)), queue("d1_p2", parent="d1", gpu=(1, 1, -1))]
    objs += [queue(f"{d}_p1", parent=d, gpu=(4, 4, -1)) for d in ("d2", "d3", "d4")]
    for q, n in (("d1_p2", 4), ("d2_p1", d2_running), ("d3_p1", d3_running)):
        for i in range(n):
            objs += [podgroup(f"{q}-{i}", q), pod(f"{q}-{i}", group=f"{q}-{i}", gpus=1, node_name="n0")]
    objs += [podgroup("d4", "d4_p1"), pod("d4-0", group="d4", gpus=5)]
    objs += [podgroup("inf", "d1_p1", priority_class="inference"), pod("inf-0", group="inf", gpus=1)]
    return state(objs)


def assert_evictions_served(state: ClusterState, plan: Any) -> None:
    """Every eviction (stale-gang excepted) names a beneficiary that ends placed, or one placed in this cycle and
    taken back by a later victim search (PlacementWithdrawn) whose room went to the group it was taken for, when
    that group is served in turn (DESIGN's invariant as the checker reads it: checker._served)."""
    placed = {int(state.pod_pg[p.pod]) for p in plan.placements if not p.moved}
    taken = {g: r.details["for"] for g, rs in plan.pending.items() for r in rs if r.code == "PlacementWithdrawn"}
    keys = {state.pg_keys[g] for g in placed}
    for _ in range(len(taken)):
        keys |= {state.pg_keys[g] for g, by in taken.items() if by in keys}
    for e in plan.evictions:
        assert e.reason == "stale-gang" or state.pg_keys[e.beneficiary] in keys, e
