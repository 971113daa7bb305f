"""Run KAI-Scheduler behaviour cases (../shared/scenarios/kai) and compare with what KAI's tests expect.

Single-round cases run the one named action on the case's cluster. Integration cases run all actions for
`until_match` rounds, rewriting the cluster between rounds as KAI's harness does (binds become Running, pipelined
and evicted pods go back to Pending, workloads being deleted stay Releasing), compare, then run `after_match`
more rounds that must leave the expectation intact (stability).

Result per case: `match`; `better` (kai-opt places strictly more work, or the same work with fewer evictions,
and its plan passed the invariant checker); `mismatch` (with the differences); `skipped` (its unsupported
reasons); `error` (an exception, e.g. the checker firing: that is a bug).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kai_opt.actions import KAI_ACTION_NAMES
from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.loaders.kaicase import Case, ExpectedResult, load_cases
from kai_opt.plan import Plan
from kai_opt.simulate import PipelinedAs, apply_plan
from kai_opt.snapshot import Snapshot
from kai_opt.state import ClusterState, PodStatus, build_state

ACTION_NAMES = KAI_ACTION_NAMES  # a case's KAI action name -> ours (kai_opt.actions)
ACTIVE_STATUSES = {"Running", "Binding", "Pipelined", "Allocated", "Bound"}
EPS = 1e-6


@dataclass
class Outcome:
    """What each pod is after a round, in the harness's vocabulary (Running, Binding, Pipelined, Releasing,
    Pending, ...), and on which node."""

    status: dict[str, str]
    node: dict[str, str | None]
    counts: dict[str, int]
    idle_gpus: dict[str, float]
    releasing_gpus: dict[str, float]


@dataclass
class CaseResult:
    file: str
    name: str
    result: str  # match | better | mismatch | skipped | error
    detail: str = ""
    differences: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "name": self.name, "result": self.result, "detail": self.detail,
                **({"differences": self.differences} if self.differences else {})}


def case_config(case: Case, base: Config) -> Config:
    grace = float(case.session.get("staleness_grace_period_seconds", 0.0))
    # KAI's test sessions (test_utils_builder.go): unlimited consolidation preemptees, scheduling signatures off
    # (SchedulerParams left at zero)
    return base.model_copy(update={"stale_gang_grace_s": grace, "max_consolidation_preemptees": -1,
                                   "use_scheduling_signatures": False})


def outcome(state: ClusterState, plan: Plan, *, after_transition: bool = False) -> Outcome:
    status: dict[str, str] = {}
    node: dict[str, str | None] = {}
    placed = {p.pod: p for p in plan.placements if not p.moved}
    moved = {p.pod: p for p in plan.placements if p.moved}
    evicted = {e.pod for e in plan.evictions}
    for i, pod in enumerate(state.pods):
        s = int(state.pod_status[i])
        n = int(state.pod_node[i])
        if i in moved:
            status[pod.key], n = "Pipelined", moved[i].node
        elif i in placed:
            status[pod.key] = "Pipelined" if placed[i].pipelined else "Binding"
            n = placed[i].node
        elif i in evicted:
            status[pod.key] = "Releasing"
        elif s == PodStatus.BOUND:
            status[pod.key] = "Running"
        elif s == PodStatus.RELEASING:
            status[pod.key] = "Releasing"
        elif s == PodStatus.PIPELINED:
            status[pod.key] = "Pipelined"
        elif s == PodStatus.GATED:
            status[pod.key] = "Gated"
        else:
            status[pod.key] = "Pending"
            n = -1
        node[pod.key] = state.node_names[n] if n >= 0 else None
    counts = {"binds": len(plan.binds), "pipelined": len(plan.pipelines) + len(plan.moves),
              "evictions": len(plan.evictions)}
    idle, releasing = _device_counts(state, plan)
    return Outcome(status, node, counts, idle, releasing)


def _device_counts(state: ClusterState, plan: Plan) -> tuple[dict[str, float], dict[str, float]]:
    """Per node: devices with nothing on them now, and devices with something being released (a shared device
    counts as one), after the plan's binds, pipelines and evictions (KAI's session node accounting)."""
    held = state.dev_used - state.dev_releasing + state.dev_pipelined
    rel = np.maximum(state.dev_releasing - state.dev_pipelined, 0)
    held, rel = held.copy(), rel.copy()
    for e in plan.evictions:
        n = int(state.pod_node[e.pod])
        per = state.pod_gpu_per_device(e.pod, n)
        for d in state.pod_devices(e.pod):
            held[d] -= per
            rel[d] += per
    for p in plan.placements:
        per = state.pod_gpu_per_device(p.pod, p.node)
        for d in p.devices:
            g = int(state.dev_start[p.node]) + d
            held[g] += per
            if p.pipelined:
                take = min(per, rel[g])
                rel[g] -= take
    idle: dict[str, float] = {}
    releasing: dict[str, float] = {}
    for n, name in enumerate(state.node_names):
        a, b = int(state.dev_start[n]), int(state.dev_start[n + 1])
        idle[name] = float(((held[a:b] + rel[a:b]) <= 0).sum())
        releasing[name] = float((rel[a:b] > 0).sum())
    return idle, releasing


def _gpus_required(state: ClusterState, pods: list[int]) -> float:
    total = 0.0
    for p in pods:
        if state.pod_gpu_whole[p]:
            total += float(state.pod_gpu_whole[p])
        elif state.pod_gpu_frac[p]:
            total += float(state.pod_gpu_frac[p]) / 1000 * int(state.pod_gpu_ndev[p])
    return total


def compare(case: Case, state: ClusterState, out: Outcome, *, check_counts: bool,
            check_node_resources: bool) -> list[str]:
    diffs: list[str] = []
    idx = state.pod_index
    exp = case.expected

    def check(label: str, pods: list[str], e: ExpectedResult) -> None:
        present = [p for p in pods if p in out.status]
        for p in present:
            if out.status[p] != e.status:
                diffs.append(f"{label}: pod {p} is {out.status[p]}, expected {e.status}")
            elif e.node is not None and e.status != "Pending" and out.node[p] != e.node:
                # a Pending task's node in KAI's harness is only the spec.nodeName it was given (README)
                diffs.append(f"{label}: pod {p} on {out.node[p]}, expected {e.node}")
        have = _gpus_required(state, [idx[p] for p in present])
        if abs(have - e.gpus_required) > EPS:
            diffs.append(f"{label}: requests {have:g} GPUs, expected {e.gpus_required:g}")

    for job, e in exp.jobs.items():
        check(f"job {job}", [case.task_pod[t] for t in case.job_tasks.get(job, [])], e)
    for task, e in exp.tasks.items():
        if task in case.task_pod:
            check(f"task {task}", [case.task_pod[task]], e)
    if check_counts:
        bounds = exp.counts.model_dump() if exp.counts else {"binds": 0, "evictions": 0, "pipelined": 0}
        for k, limit in bounds.items():
            if out.counts[k] > limit:
                diffs.append(f"{out.counts[k]} {k}, at most {limit} allowed")
    if check_node_resources:
        for name, nr in exp.node_resources.items():
            if abs(out.idle_gpus.get(name, 0) - nr.idle_gpus) > EPS:
                diffs.append(f"node {name}: {out.idle_gpus.get(name, 0):g} idle GPUs, expected {nr.idle_gpus:g}")
            if abs(out.releasing_gpus.get(name, 0) - nr.releasing_gpus) > EPS:
                diffs.append(f"node {name}: {out.releasing_gpus.get(name, 0):g} releasing GPUs, expected "
                             f"{nr.releasing_gpus:g}")
    return diffs


def _expected_status(case: Case) -> dict[str, str]:
    status: dict[str, str] = {}
    for job, e in case.expected.jobs.items():
        for t in case.job_tasks.get(job, []):
            status[case.task_pod[t]] = e.status
    for task, e in case.expected.tasks.items():
        if task in case.task_pod:
            status[case.task_pod[task]] = e.status
    return status


def _initial_status(st: ClusterState) -> dict[str, str]:
    names = {PodStatus.BOUND: "Running", PodStatus.RELEASING: "Releasing", PodStatus.PIPELINED: "Pipelined",
             PodStatus.GATED: "Gated"}
    return {p.key: names.get(PodStatus(int(st.pod_status[i])), "Pending") for i, p in enumerate(st.pods)}


def _work(st: ClusterState, status: dict[str, str]) -> tuple[set[str], float, int]:
    """(active pods, active GPUs, pods evicted from running) of a whole outcome."""
    idx = st.pod_index
    active = {p for p, s in status.items() if s in ACTIVE_STATUSES and p in idx}
    was_running = {p for p in idx if st.pod_status[idx[p]] == PodStatus.BOUND}
    evicted = sum(1 for p, s in status.items() if s in ("Releasing", "Pending") and p in was_running)
    gpus = sum(float(st.pod_req[idx[p], 2]) / 1000 for p in active)
    return active, gpus, evicted


def _better(case: Case, out: Outcome) -> str | None:
    """kai-opt is better when it keeps every pod KAI's outcome has active (on any node) and runs strictly more
    work in total, or the same work with fewer evictions (pods the case does not list are taken as KAI left
    them), its plan having passed the invariant checker."""
    st = build_state(case.snapshot, now=case.now)
    listed = _expected_status(case)
    expected = {**_initial_status(st), **listed}
    exp_active, exp_gpus, exp_evicted = _work(st, expected)
    our_active, gpus, evicted = _work(st, out.status)
    if not {p for p in exp_active if p in listed} <= our_active:
        return None
    more_work = gpus > exp_gpus + EPS or (abs(gpus - exp_gpus) <= EPS and len(our_active) > len(exp_active))
    same_work = abs(gpus - exp_gpus) <= EPS and len(our_active) == len(exp_active)
    if (more_work and evicted <= exp_evicted) or ((more_work or same_work) and evicted < exp_evicted):
        return (f"kai-opt: {len(our_active)} pods / {gpus:g} GPUs active, {evicted} evicted; expected "
                f"{len(exp_active)} pods / {exp_gpus:g} GPUs, {exp_evicted} evicted (every pod KAI runs runs too)")
    return None


def run_case(case: Case, base: Config, engine: Engine) -> CaseResult:
    name = str(case.path)
    if not case.supported:
        return CaseResult(name, case.name, "skipped", "; ".join(case.unsupported))
    cfg = case_config(case, base)
    try:
        if case.mode == "single-round":
            state = build_state(case.snapshot, now=case.now)
            plan, _ = run_cycle(state, cfg, engine=engine, actions=(ACTION_NAMES[case.actions[0]],))
            out = outcome(state, plan)
            diffs = compare(case, state, out, check_counts=True, check_node_resources=True)
        else:
            out, diffs = _run_integration(case, cfg, engine)
    except Exception as exc:  # a checker violation or a crash: report it, keep going
        return CaseResult(name, case.name, "error", f"{type(exc).__name__}: {exc}",
                          traceback.format_exc().splitlines()[-6:])
    if not diffs:
        return CaseResult(name, case.name, "match")
    why = _better(case, out)
    if why:
        return CaseResult(name, case.name, "better", why, diffs)
    return CaseResult(name, case.name, "mismatch", diffs[0], diffs)


def _run_integration(case: Case, cfg: Config, engine: Engine) -> tuple[Outcome, list[str]]:
    rounds = case.rounds
    until, after = (rounds.until_match, rounds.after_match) if rounds else (2, 5)
    actions = tuple(ACTION_NAMES[a] for a in case.actions)
    deleting = {case.job_podgroup[j] for j in case.deleting_jobs if j in case.job_podgroup}
    snap: Snapshot = case.snapshot
    diffs: list[str] = []
    for r in range(until):
        state = build_state(snap, now=case.now)
        plan, _ = run_cycle(state, cfg, engine=engine, actions=actions)
        counts = outcome(state, plan).counts
        diffs += [f"round {r + 1}: {d}" for d in _count_diffs(case, counts)]
        snap = apply_plan(snap, state, plan, now=case.now, pipelined_as=PipelinedAs.pending,
                          keep_releasing=deleting, released_leave=False)
    state = build_state(snap, now=case.now)
    empty = Plan(engine="none")
    out = outcome(state, empty)
    diffs += compare(case, state, out, check_counts=False, check_node_resources=False)
    if diffs:
        return out, diffs
    for r in range(after):
        state = build_state(snap, now=case.now)
        plan, _ = run_cycle(state, cfg, engine=engine, actions=actions)
        post = outcome(state, plan)
        extra = compare(case, state, post, check_counts=False, check_node_resources=False)
        extra += _count_diffs(case, post.counts)
        if extra:
            return post, [f"stability round {r + 1}: {d}" for d in extra]
        snap = apply_plan(snap, state, plan, now=case.now, pipelined_as=PipelinedAs.pending,
                          keep_releasing=deleting, released_leave=False)
    return out, []


def _count_diffs(case: Case, counts: dict[str, int]) -> list[str]:
    bounds = case.expected.counts.model_dump() if case.expected.counts else None
    if bounds is None:
        return []
    return [f"{counts[k]} {k}, at most {v} allowed" for k, v in bounds.items() if counts[k] > v]


def run_conformance(directory: str | Path, base: Config, engine: Engine,
                    progress: Any = None) -> list[CaseResult]:
    cases = load_cases(directory)
    results = []
    for case in cases:
        results.append(run_case(case, base, engine))
        if progress is not None:
            progress()
    return results


def summarize_results(results: list[CaseResult]) -> dict[str, int]:
    out = {"total": len(results), "match": 0, "better": 0, "mismatch": 0, "skipped": 0, "error": 0}
    for r in results:
        out[r.result] += 1
    return out
