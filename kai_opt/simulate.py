"""Apply a plan to a snapshot in memory, and run several cycles (`kai-opt simulate`).

What a cluster would do with a plan: binds become Running on their node (with their GPU devices recorded),
pipelined pods wait nominated onto their node (or go back to Pending, as KAI's test harness does), evicted pods
leave their node and come back Pending (their controller recreates them) unless their workload is being deleted,
and pods that were already being released are gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from kai_opt.api import Pod, PodPhase
from kai_opt.api.meta import ObjectMeta
from kai_opt.config import Config
from kai_opt.engine import run_cycle
from kai_opt.plan import Plan
from kai_opt.snapshot import Snapshot
from kai_opt.state import ClusterState, PodStatus, build_state
from kai_opt.validation import plan_summary


class PipelinedAs(StrEnum):
    nominated = "nominated"  # keeps waiting on its node (kai-opt in a cluster)
    pending = "pending"  # back to pending without a node (KAI's test harness between rounds)


def apply_plan(snapshot: Snapshot, state: ClusterState, plan: Plan, *, now: float,
               pipelined_as: PipelinedAs = PipelinedAs.nominated, keep_releasing: set[str] | None = None,
               released_leave: bool = True) -> Snapshot:
    """The snapshot after the plan has landed. `keep_releasing`: podgroup keys whose evicted or releasing pods
    stay Releasing on their node (a workload being deleted); `released_leave`: pods that were already releasing
    are gone (otherwise they come back pending, as KAI's harness does)."""
    keep = keep_releasing or set()
    by_key: dict[str, Pod] = {}
    placements = {p.pod: p for p in plan.placements if not p.moved}
    evicted = {e.pod for e in plan.evictions}
    started_groups: set[str] = set()
    for i, pod in enumerate(state.pods):
        g = int(state.pod_pg[i])
        gkey = state.pg_keys[g] if g >= 0 else None
        if i in placements:
            pl = placements[i]
            if pl.pipelined:
                if pipelined_as == PipelinedAs.nominated:
                    by_key[pod.key] = pod.model_copy(update={"nominated_node": state.node_names[pl.node],
                                                             "gpu_devices": tuple(pl.devices) or None})
                else:
                    by_key[pod.key] = _pending(pod)
            else:
                by_key[pod.key] = pod.model_copy(update={
                    "node_name": state.node_names[pl.node], "phase": PodPhase.RUNNING, "nominated_node": None,
                    "gpu_devices": tuple(pl.devices) or None, "start_time": now, "gpu_group": None})
                if gkey:
                    started_groups.add(gkey)
        elif i in evicted or state.pod_status[i] == PodStatus.RELEASING:
            if gkey in keep:
                by_key[pod.key] = pod if pod.meta.deletion_timestamp else pod.model_copy(
                    update={"meta": pod.meta.model_copy(update={"deletion_timestamp": now})})
            elif i in evicted or not released_leave:
                by_key[pod.key] = _pending(pod)
            else:
                by_key[pod.key] = None  # type: ignore[assignment]  # gone
        elif state.pod_status[i] == PodStatus.PIPELINED:
            if pipelined_as == PipelinedAs.pending:
                by_key[pod.key] = _pending(pod)
            else:  # its victims were released during the last cycle: the binder binds it now
                by_key[pod.key] = pod.model_copy(update={
                    "node_name": pod.nominated_node, "phase": PodPhase.RUNNING, "nominated_node": None,
                    "start_time": now})
                if gkey:
                    started_groups.add(gkey)
        elif state.pod_status[i] == PodStatus.BOUND and pod.gpu_devices is None and len(state.pod_devices(i)):
            # record the devices the state gave it, so pods sharing a device stay together next cycle
            base = int(state.dev_start[int(state.pod_node[i])])
            by_key[pod.key] = pod.model_copy(update={
                "gpu_devices": tuple(int(d) - base for d in state.pod_devices(i))})
    pods = []
    for pod in snapshot.pods:
        new = by_key.get(pod.key, pod)
        if new is not None:
            pods.append(new)
    groups = []
    for pg in snapshot.podgroups:
        if pg.key in started_groups and not _had_running(state, pg.key):
            pg = pg.model_copy(update={"last_start": now})
        groups.append(pg)
    out = Snapshot(nodes=snapshot.nodes, pods=pods, podgroups=groups, queues=snapshot.queues,
                   priority_classes=snapshot.priority_classes, topologies=snapshot.topologies,
                   warnings=list(snapshot.warnings), scheduler_names=snapshot.scheduler_names, now=now,
                   source=snapshot.source)
    return out


def _had_running(state: ClusterState, gkey: str) -> bool:
    g = state.pg_index.get(gkey)
    if g is None:
        return False
    pods = state.group_pods(g)
    return bool((state.pod_status[pods] == PodStatus.BOUND).any())


def _pending(pod: Pod) -> Pod:
    meta: ObjectMeta = pod.meta
    if meta.deletion_timestamp is not None:
        meta = meta.model_copy(update={"deletion_timestamp": None})
    return pod.model_copy(update={"node_name": None, "phase": PodPhase.PENDING, "nominated_node": None,
                                  "gpu_devices": None, "gpu_group": None, "start_time": None, "meta": meta})


@dataclass
class CycleReport:
    cycle: int
    summary: dict
    wall_s: float


@dataclass
class SimulationResult:
    cycles: list[CycleReport] = field(default_factory=list)
    final: Snapshot | None = None
    stable: bool = False  # the last cycle changed nothing


def simulate(snapshot: Snapshot, config: Config, cycles: int, *, now: float | None = None,
             period_s: float | None = None, progress: Callable[[str], None] | None = None) -> SimulationResult:
    """`progress`, when given, is told the cycle and its phase as they go."""
    result = SimulationResult()
    t = now if now is not None else (snapshot.now if snapshot.now is not None else time.time())
    step = period_s if period_s is not None else config.schedule_period_s
    for c in range(cycles):
        state = build_state(snapshot, now=t, default_queue=config.default_queue)
        start = time.perf_counter()
        tell = None if progress is None else (lambda what, c=c: progress(f"cycle {c + 1}/{cycles}: {what}"))
        plan, _ = run_cycle(state, config, progress=tell)
        wall = time.perf_counter() - start
        result.cycles.append(CycleReport(c + 1, plan_summary(state, plan), wall))
        changed = bool(plan.placements or plan.evictions)
        snapshot = apply_plan(snapshot, state, plan, now=t)
        t += step
        result.stable = not changed
    result.final = snapshot
    return result
