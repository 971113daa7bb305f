"""Apply a plan to a snapshot in memory, and run several cycles (`kai-opt simulate`).

What a cluster would do with a plan: binds become Running on their node (with their GPU devices recorded),
pipelined pods wait nominated onto their node (or go back to Pending, as KAI's test harness does), evicted pods
leave their node and come back Pending (their controller recreates them) unless their workload is being deleted,
and pods that were already being released are gone.

A simulation stops early once the cluster has settled: a cycle changed nothing and no later cycle of the run could
(see `settled`), since every further cycle would repeat the same empty plan.

With past usage (time-based fair share, a usage file) the run keeps a usage ledger: it starts from the file's
amounts and adds what each queue held between cycles, so the usage term moves as the run goes. Such a run never
stops early (the fair share changes with every cycle's usage).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from kai_opt.api import Pod, PodPhase
from kai_opt.api.meta import ObjectMeta
from kai_opt.config import Config
from kai_opt.dra.allocate import claims_after
from kai_opt.engine import run_cycle
from kai_opt.fairshare.usage_ledger import UsageLedger, UsageWindow, held
from kai_opt.loaders.usage_file import UsageFile
from kai_opt.plan import Plan
from kai_opt.snapshot import Snapshot
from kai_opt.state import ClusterState, PodStatus, build_state
from kai_opt.validation import plan_summary

MAX_CYCLES = 10_000  # `kai-opt simulate --cycles` above this is a usage error


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
    original = {p.key: p for p in snapshot.pods}  # the state's pods carry DRA's derived requests: not kept
    bound: dict[str, tuple[str, str | None]] = {}
    left: set[str] = set()
    for i, pod in enumerate(state.pods):
        pod = original.get(pod.key, pod)
        if i in placements and not placements[i].pipelined:
            bound[pod.key] = (state.node_names[placements[i].node], pod.meta.uid)
        elif i in evicted or state.pod_status[i] == PodStatus.RELEASING:
            left.add(pod.key)
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
                   source=snapshot.source, device_classes=snapshot.device_classes,
                   resource_slices=snapshot.resource_slices, claim_templates=snapshot.claim_templates,
                   resource_claims=(claims_after(snapshot.resource_claims, state.dra, bound, left)
                                    if state.dra is not None else snapshot.resource_claims))
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
    queues: dict[str, dict[str, float]] = field(default_factory=dict)  # with usage: per queue GPUs (see simulate)


@dataclass
class SimulationResult:
    cycles: list[CycleReport] = field(default_factory=list)
    final: Snapshot | None = None
    stable: bool = False  # the last cycle changed nothing
    settled_after: int | None = None  # the cycle after which nothing could change any more (the run stopped)


def settled(state: ClusterState, plan: Plan, config: Config, until: float) -> bool:
    """True when this cycle's plan is empty, applying it changes nothing (no pipelined pod waits to bind, no pod is
    being released) and no time rule lets a cycle up to time `until` act differently: no min-runtime protection of
    a running group ends while work is pending, no stale gang's grace period ends."""
    if plan.placements or plan.evictions:
        return False
    status = state.pod_status
    if ((status == PodStatus.PIPELINED) | (status == PodStatus.RELEASING)).any():
        return False
    at = next_time_rule(state, config)
    return at is None or at > until


def next_time_rule(state: ClusterState, config: Config) -> float | None:
    """The earliest time after `state.now` at which a time rule changes: a stale gang's grace period ends, or (with
    pending work of ours) a running preemptible group's preempt or reclaim min runtime ends (it may become a victim
    then; non-preemptible work never is). None: no such time."""
    times: list[float] = []
    stale = state.pg_stale_since + config.stale_gang_grace_s
    times += stale[~np.isnan(stale) & (stale >= state.now)].tolist()  # evicted once now > since + grace
    if ((state.pod_status == PodStatus.PENDING) & state.pod_ours).any():
        for per_queue, default in ((state.q_preempt_min_runtime, config.preempt_min_runtime_s),
                                   (state.q_reclaim_min_runtime, config.reclaim_min_runtime_s)):
            for g in np.flatnonzero(state.pg_preemptible).tolist():
                start = _group_start(state, g)
                if start is None:
                    continue
                q = int(state.pg_queue[g])
                limit = float(per_queue[q]) if q >= 0 and not math.isnan(per_queue[q]) else default
                if limit > 0 and start + limit > state.now:  # protected while its runtime < limit
                    times.append(start + limit)
    return min(times) if times else None


def _group_start(state: ClusterState, g: int) -> float | None:
    """When group g's min runtime counts from (its last start, else its first running pod's start); None when it
    has no running pod."""
    pods = state.group_pods(g)
    running = pods[state.pod_status[pods] == PodStatus.BOUND]
    if not len(running):
        return None
    if not math.isnan(state.pg_last_start[g]):
        return float(state.pg_last_start[g])
    starts = state.pod_start[running]
    starts = starts[~np.isnan(starts)]
    return float(starts.min()) if len(starts) else None


def simulate(snapshot: Snapshot, config: Config, cycles: int, *, now: float | None = None,
             period_s: float | None = None, progress: Callable[[str], None] | None = None,
             stop_when_settled: bool = True, usage: UsageFile | None = None,
             queue_stats: bool = False) -> SimulationResult:
    """`progress`, when given, is told the cycle and its phase as they go. With `stop_when_settled`, the run ends
    after the first cycle that leaves the cluster settled (`settled`); `result.settled_after` names it. With
    `usage` (past usage as of the first cycle), every cycle's fair share has a usage term. With usage or
    `queue_stats`, each report records per queue: GPUs allocated at the cycle's start and after its plan, GPU fair
    share and (with usage) GPU usage."""
    queue_stats = queue_stats or usage is not None
    result = SimulationResult()
    t = now if now is not None else (snapshot.now if snapshot.now is not None else time.time())
    step = period_s if period_s is not None else config.schedule_period_s
    last = t + step * (cycles - 1)  # the time of the run's last cycle
    params = config.usage_db.usage_params
    ledger = window = None
    if usage is not None:
        ledger = UsageLedger.seeded(usage.used, usage.capacity, at=t, bucket_s=config.usage_db.ledger.bucket)
        window = UsageWindow.of(params)
    for c in range(cycles):
        state = build_state(snapshot, now=t, default_queue=config.default_queue)
        history = None
        if queue_stats:
            amounts, capacity = held(state)  # held since the last cycle: what the last plan left
            if result.cycles:
                _after(result.cycles[-1], amounts)
            if ledger is not None and window is not None:
                ledger.record(t, amounts, capacity, max_gap_s=math.inf)
                ledger.prune(window, t)
                history = ledger.usage(window, t)
        start = time.perf_counter()
        tell = None if progress is None else (lambda what, c=c: progress(f"cycle {c + 1}/{cycles}: {what}"))
        plan, fs = run_cycle(state, config, progress=tell, history=history)
        wall = time.perf_counter() - start
        report = CycleReport(c + 1, plan_summary(state, plan), wall)
        if queue_stats:
            report.queues = {name: {"gpu_allocated": float(fs.allocated[q, 0]),
                                    "gpu_fair_share": float(fs.fair_share[q, 0])}
                             for q, name in enumerate(state.q_names)}
            if fs.usage is not None:
                for q, name in enumerate(state.q_names):
                    report.queues[name]["gpu_usage"] = float(fs.usage[q, 0])
        result.cycles.append(report)
        changed = bool(plan.placements or plan.evictions)
        snapshot = apply_plan(snapshot, state, plan, now=t)
        result.stable = not changed
        if ledger is None and stop_when_settled and settled(state, plan, config, last):
            result.settled_after = c + 1
            break
        t += step
    result.final = snapshot
    if queue_stats and result.cycles:
        _after(result.cycles[-1], held(build_state(snapshot, now=t, default_queue=config.default_queue))[0])
    return result


def _after(report: CycleReport, amounts: dict[str, np.ndarray]) -> None:
    for name, row in report.queues.items():
        row["gpu_allocated_after"] = float(amounts.get(name, np.zeros(3))[0])
