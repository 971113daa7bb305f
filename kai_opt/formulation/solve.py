"""The CP-SAT engine end to end: scope -> model (hinted with the greedy plan) -> solve under a watchdog ->
decode -> verify -> keep the better of the CP-SAT and greedy plans. Every plan reports how it was obtained."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import traceback
from collections.abc import Callable
from operator import attrgetter

import numpy as np

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.formulation.child import ChildResult, Send, Waiting, can_fork, run_in_child
from kai_opt.formulation.decode import DecodeError, decode
from kai_opt.formulation.failures import last_line
from kai_opt.formulation.hint import add_greedy_hint
from kai_opt.formulation.model import Built, build_model
from kai_opt.formulation.objective import Objective
from kai_opt.formulation.packing import less_fragmented
from kai_opt.formulation.pattern_plan import MODEL_SHARE, pattern_plan
from kai_opt.formulation.runner import run_with_watchdog
from kai_opt.formulation.scope import (
    Scope,
    apply_consolidation,
    build_scope,
    placed_per_group,
    window_groups,
    window_pods,
)
from kai_opt.formulation.second_hint import SLOWDOWN, SecondHint, action_seconds, compute, wanted
from kai_opt.heuristics.actions import Actions, run_outside_model
from kai_opt.heuristics.cycle import plan_from_session
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan, SolverInfo, failure_note
from kai_opt.state import ClusterState

log = logging.getLogger("kai_opt.solver")

DECODE_RESERVE = 0.15  # fraction of the budget kept for decoding and checking, and at least DECODE_PER_POD per
# pending and movable pod in the model plus CHECK_PER_DECISION per decision of the plan (the checker and the scores
# walk the whole plan, the model's part and the greedy's outside it): measured in docs/DESIGN-NOTES.md
DECODE_PER_POD = 0.00015
CHECK_PER_DECISION = 0.00003
SLOWDOWN_MAX = 4.0  # the reserve grows with the worker's wall/CPU ratio while building, up to this factor
INLINE_SHARE = 0.25  # a second hint not ready when the worker starts is computed there if it costs at most this
# share of the budget (SLOWDOWN x the KAI-scored cycle)
HARD_GRACE = 0.1  # s past the budget before the hard watchdog kills the CP-SAT worker
PATTERN_ALONE = 0.4  # once the pattern plan is taken, the model is built only if at most this share of the budget
# is gone (scope, model, solve, decode and check do not fit in the rest, and the model rarely betters that plan)


def plan_score(state: ClusterState, fs: FairShare, plan: Plan) -> tuple[float, float]:
    """(work placed, eviction cost): tiers 1 and 2 of the cycle's objective (kai_opt.formulation.objective)."""
    return Objective(state, fs).score(plan)


def model_scope(state: ClusterState, fs: FairShare, config: Config, greedy: Plan,
                actions: tuple[str, ...] | None = None) -> tuple[Session, Scope]:
    """The session (cycle start) and what the model covers, for the greedy plan `greedy`."""
    sess = Session(state, fs, config)
    apply_consolidation(sess, greedy)
    acts = Actions(sess)
    decisions = len(greedy.placements) + len(greedy.evictions)
    scope = build_scope(sess, acts, greedy, max_pods=window_pods(config, decisions),
                        max_groups=window_groups(config, decisions))
    if actions is not None:
        if "preempt" not in actions:
            for v in scope.victims:
                v.beneficiaries = [j for j in v.beneficiaries if v.reason_for[j] != "preempt"]
        if "reclaim" not in actions:
            for v in scope.victims:
                v.beneficiaries = [j for j in v.beneficiaries if v.reason_for[j] != "reclaim"]
        scope.victims = [v for v in scope.victims if v.beneficiaries]
    return sess, scope


def prepare_worker(state: ClusterState, fs: FairShare, config: Config, actions: tuple[str, ...] | None,
                   second: SecondHint | None) -> Waiting | None:
    """The CP-SAT worker forked at the start of the cycle, waiting for the greedy plan (cpsat_plan `waiting`): the
    fork and the copy-on-write faults of a large process are paid while the greedy cycle runs, not inside the
    budget (measured in docs/DESIGN-NOTES.md, CP-SAT engine). None without fork or when the fork fails (cpsat_plan
    then forks its worker itself)."""
    if not can_fork():
        return None
    try:  # not daemonic: it forks the solver worker itself
        return Waiting(_prepared_worker, (state, fs, config, actions, second), daemon=False)
    except OSError:
        return None


def _prepared_worker(send: Send, state: ClusterState, fs: FairShare, config: Config,
                     actions: tuple[str, ...] | None, second: SecondHint | None, greedy: Plan,
                     use_second: bool, started: float) -> Plan | KeptGiven:
    return _worker(send, state, fs, config, greedy, actions, second if use_second else None, started)


def cpsat_plan(state: ClusterState, fs: FairShare, config: Config, *, greedy: Plan,
               actions: tuple[str, ...] | None = None, second: SecondHint | None = None,
               waiting: Waiting | None = None) -> Plan:
    """The CP-SAT plan of the cycle, or the greedy one with the reason. The whole of it (scope, model, hint,
    solve, decode, check: _worker) runs in a forked worker (kai_opt.formulation.child); with wall time the hard
    watchdog kills it when the budget is over (model building is not interruptible from inside either).
    Deterministic mode runs the same worker, never killed by wall time, with a deterministic solver (fixed seed,
    one search worker, a deterministic time limit).
    `second`: the FGD-scored greedy plan being computed beside (second_hint); the worker starts from it when it is
    ready in time, else it is weighed against the worker's plan until the deadline. `waiting`: the worker forked
    beforehand (prepare_worker, with the same state, fair share, config, actions and second hint), run here.
    Every stage here is optional: whatever fails (raises, dies, overruns; kai_opt.plan.FAILURE_KINDS) leaves the
    verified greedy plan `greedy`, FALLBACK_GREEDY, the failure in `SolverInfo.failures` and the note, and a log
    line; this never raises for it."""
    start = time.perf_counter()
    budget = config.solver.time_budget_s
    phase = ["starting"]
    deadline = None if config.solver.deterministic else start + budget + HARD_GRACE
    def said(what: str) -> None:
        phase[0] = what

    if waiting is not None:
        ended = waiting.run((greedy, second is not None, start), deadline=deadline, on_message=said)
    else:  # not daemonic: it forks the solver worker itself
        ended = run_in_child(_worker, (state, fs, config, greedy, actions, second, start), deadline=deadline,
                             on_message=said, daemon=False)
    plan = taken_back(greedy, ended.value) if ended.ok else _fail(greedy, start, _stage_of(phase[0]),
                                                                  *_worker_failure(ended, phase[0], budget))
    if second is not None and plan.solver is not None and plan.solver.hint != "fgd":
        plan = _at_the_end(state, fs, config, greedy, plan, second, start + budget)
    return _reported(plan, ended.trace)


@dataclasses.dataclass
class KeptGiven:
    """The worker's answer when its plan is the greedy plan it was given (kept or fallen back to): only the
    solver's account goes back, and the parent puts it on its own copy of that plan (`taken_back`), instead of
    every placement, eviction and reason pickled and rebuilt."""

    solver: SolverInfo


def _worker(send: Send, state: ClusterState, fs: FairShare, config: Config, greedy: Plan,
            actions: tuple[str, ...] | None, second: SecondHint | None,
            started: float | None = None) -> Plan | KeptGiven:
    """The CP-SAT worker: its phases sent as it goes, its plan returned, or KeptGiven when that is the plan it
    was given (a raise or a death is the parent's to report; it keeps the greedy plan). `started`: when the parent
    started the stage (time.perf_counter(), one clock for both processes), which its watchdog counts the budget
    from."""
    plan = _cpsat_plan(state, fs, config, greedy=greedy, actions=actions, progress=send, second=second,
                       started=started)
    if second is not None and second.failure is not None:  # it failed when taken here, as the starting plan
        plan.solver.add_failure("second_hint", *second.failure)
    return KeptGiven(plan.solver) if plan is greedy else plan


def taken_back(greedy: Plan, answer: Plan | KeptGiven) -> Plan:
    """The worker's plan in the parent: `greedy` (the plan the worker was given) with the worker's account when
    it kept that plan, else the plan it sent."""
    if not isinstance(answer, KeptGiven):
        return answer
    greedy.solver = answer.solver
    greedy.engine = "cpsat"
    return greedy


def _worker_failure(ended: ChildResult, phase: str, budget: float) -> tuple[str, str]:
    """The failure kind and the note's words for a CP-SAT worker that ended without a plan while in `phase`."""
    if ended.failure == "timeout":
        return "timeout", f"hard watchdog: the {budget:g}s budget ran out while {phase}"
    if ended.failure == "crash":
        return "crash", f"no plan from the CP-SAT worker ({ended.detail}) while {phase}"
    if ended.trace is not None:
        return "exception", f"the CP-SAT worker raised while {phase}: {ended.detail}"
    return "exception", f"the CP-SAT worker {ended.detail} (while {phase})"  # could not start, unreadable message


def _stage_of(phase: str) -> str:
    """The stage (kai_opt.plan.FAILURE_STAGES) a worker's phase belongs to: decoding is 'decode', the FGD-scored
    greedy plan (computed in the worker in deterministic mode) 'second_hint', the rest 'cpsat'."""
    if phase.startswith("decod"):
        return "decode"
    return "second_hint" if "FGD scoring" in phase else "cpsat"


def _fail(greedy: Plan, start: float, stage: str, kind: str, detail: str, info: SolverInfo | None = None) -> Plan:
    """The verified greedy plan for a failed stage: FALLBACK_GREEDY, the failure counted and named in the note
    (`info`: what the cycle knows so far, e.g. build and solve times)."""
    info = info if info is not None else SolverInfo()
    info.failures.append((stage, kind))
    return _keep(greedy, info, start, failure_note(stage, kind, detail), "FALLBACK_GREEDY")


def _reported(plan: Plan, trace: str | None = None) -> Plan:
    """One log line per failed stage of the plan (the parent's log: a forked worker's would be lost with it)."""
    for stage, kind in plan.solver.failures:
        log.warning("optional stage %s failed (%s); the cycle goes on with plan %s (%s): %s%s", stage, kind,
                    plan.solver.status, plan.solver.hint or "kai", plan.solver.note,
                    f"\n{trace.rstrip()}" if trace and kind == "exception" else "")
    return plan


def _at_the_end(state: ClusterState, fs: FairShare, config: Config, greedy: Plan, plan: Plan,
                second: SecondHint | None, deadline: float) -> Plan:
    """_second_at_the_end, itself an optional stage: what goes wrong there is the second hint's failure."""
    if second is None:
        return plan
    try:
        return _second_at_the_end(state, fs, config, greedy, plan, second, deadline)
    except Exception:
        plan.solver.add_failure("second_hint", "exception", "weighing the FGD-scored plan at the end raised "
                                f"{last_line(traceback.format_exc())}")
        return plan


def _second_at_the_end(state: ClusterState, fs: FairShare, config: Config, greedy: Plan, plan: Plan,
                       second: SecondHint, deadline: float) -> Plan:
    """The FGD-scored greedy plan instead of the worker's when it arrives before the deadline, is acceptable
    against the KAI-scored plan (second_hint_note) and beats the worker's plan lexicographically, fragmentation
    last (a tie on the primary objective goes to the plan leaving less fragmented GPU share: packing.py)."""
    alt = second.take(deadline - time.perf_counter())
    if alt is None:  # an optional hint: the cycle goes on, the note says what went wrong
        failure = second.failure or (None if second.taken else
                                     ("timeout", "the FGD-scored second hint was not ready by the deadline"))
        if failure is not None:
            plan.solver.add_failure("second_hint", *failure)
        return plan
    note = second_hint_note(state, fs, greedy, alt, config)
    if not note:
        return plan
    ours, theirs = plan_score(state, fs, alt), plan_score(state, fs, plan)
    if not _beats(ours, theirs) and not (_ties(ours, theirs)
                                         and less_fragmented(state, fs, config, alt, plan) is not None):
        return plan
    info = dataclasses.replace(plan.solver, hint="fgd", status="GREEDY_KEPT" if plan.solver.status in (
        "OPTIMAL", "FEASIBLE", "GREEDY_KEPT") else "FALLBACK_GREEDY")
    info.note = (f"the greedy plan with FGD scoring (computed beside, in {second.seconds:.2f}s) beats the plan of "
                 f"the model ({plan.solver.status}: {plan.solver.note}): {note}")
    alt.solver = info
    alt.engine = "cpsat"
    alt.phases = plan.phases  # the cycle's own phases (the KAI-scored greedy's); this plan was computed beside
    return alt


def kept_unbeatable(state: ClusterState, fs: FairShare, config: Config, greedy: Plan,
                    actions: tuple[str, ...] | None, second: SecondHint | None, note: str,
                    deadline: float | None = None) -> Plan:
    """The plan of a cycle whose greedy plan nothing beats on the primary objective (unbeatable.py): the model is
    not run, and the FGD-scored plan still stands in on a tie when it leaves less fragmented GPU share. No model
    uses the budget, so until `deadline` (the cycle's budget, a time.perf_counter() value; None: now) the plan is
    computed here when it fits in the time left, else waited for (_starting_plan)."""
    start = time.perf_counter()
    info = SolverInfo(hint="kai")
    try:
        plan, via = _starting_plan(state, fs, config, greedy, actions, second, lambda _what: None,
                                   deadline=deadline)
    except Exception:  # the second hint is optional: the greedy plan stays
        info.add_failure("second_hint", "exception", f"the FGD-scored plan raised {last_line(traceback.format_exc())}")
        plan, via = greedy, ""
    if via:  # checked where it was computed (second_hint.compute), as every FGD-scored plan
        info.hint = "fgd"
    return _keep(plan, info, start, note + (f"; {via}" if via else ""), "GREEDY_KEPT")


def _ties(ours: tuple[float, float], theirs: tuple[float, float]) -> bool:
    """As much priority-weighted work placed for the same eviction cost."""
    eps = 1e-9
    return abs(ours[0] - theirs[0]) <= eps and abs(ours[1] - theirs[1]) <= eps


def _beats(ours: tuple[float, float], theirs: tuple[float, float]) -> bool:
    """More priority-weighted work placed, or as much for a smaller eviction cost (the primary objective)."""
    eps = 1e-9
    return ours[0] > theirs[0] + eps or (abs(ours[0] - theirs[0]) <= eps and ours[1] < theirs[1] - eps)


def _cpsat_plan(state: ClusterState, fs: FairShare, config: Config, *, greedy: Plan,
                actions: tuple[str, ...] | None = None, progress: Callable[[str], None] | None = None,
                second: SecondHint | None = None, started: float | None = None) -> Plan:
    def phase(what: str) -> None:
        if progress is not None:
            progress(what)

    start, cpu_start = time.perf_counter(), time.process_time()
    # the budget is the stage's from `started` (the parent's watchdog counts from there: handing the greedy plan
    # over comes out of it); the build's slowdown is judged on this process's own time
    stage_start = start if started is None else min(started, start)
    budget = config.solver.time_budget_s
    greedy, via = _starting_plan(state, fs, config, greedy, actions, second, phase)
    hint = "fgd" if via else "kai"
    greedy, pattern_via, pattern_failed = _pattern_start(state, fs, config, greedy, actions, phase)
    if pattern_via:  # (its base, the plan above, stays named)
        via, hint = f"{via}; then {pattern_via}" if via else pattern_via, "pattern"
        used = time.perf_counter() - stage_start
        if used > PATTERN_ALONE * budget and not config.solver.deterministic:
            return _keep(greedy, SolverInfo(hint=hint), start, f"{via}; the model was not built: {used:.2f}s of the "
                         f"{budget:g}s budget were gone", "GREEDY_KEPT")
    phase("building the scope (pending groups, victims, candidate nodes)")
    sess, scope = model_scope(state, fs, config, greedy, actions)
    if via:
        scope.notes.insert(0, via)
    info = SolverInfo(hint=hint)
    if pattern_failed is not None:
        info.failures.append(("pattern_hint", pattern_failed[0]))
        scope.notes.append(failure_note("pattern_hint", *pattern_failed))
    if actions is not None and "allocate" not in actions:
        return _keep(greedy, info, start, "the model decides whole cycles (allocate included); this run asked "
                     f"only for {', '.join(actions)}", "GREEDY_KEPT")
    if not scope.groups:
        return _keep(greedy, info, start, "nothing pending for the model", "GREEDY_KEPT")
    phase(f"building the model ({len(scope.groups)} groups, {len(scope.shapes)} shapes)")
    built = build_model(sess, scope)
    phase(f"adding the hint ({len(built.model.proto.variables)} variables)")
    add_greedy_hint(built, scope, greedy, sess)
    hinted = _hint_of(built)
    phase(f"solving ({len(built.model.proto.variables)} variables, {len(built.model.proto.constraints)} constraints)")
    info.build_s = time.perf_counter() - start
    pods = sum(len(s.pods) for s in scope.shapes) + sum(len(mv.pods) for mv in scope.movers)
    decisions = len(greedy.placements) + len(greedy.evictions)
    # the decode and check run as much slower than their CPU time as the build did (a loaded machine)
    slowdown = 1.0 if config.solver.deterministic else min(
        SLOWDOWN_MAX, max(1.0, info.build_s / max(time.process_time() - cpu_start, 1e-3)))
    reserve = max(budget * DECODE_RESERVE, (DECODE_PER_POD * pods + CHECK_PER_DECISION * decisions) * slowdown)
    # deterministic mode: the budget less the reserve, no wall clock (a deterministic limit, reproducible)
    used = time.perf_counter() - stage_start
    left = budget - reserve - (0.0 if config.solver.deterministic else used)
    if left <= 0.01 and not config.solver.deterministic:
        slow = f", {slowdown:.1f}x its CPU time" if slowdown > 1.2 else ""
        handover = f" ({used:.3f}s with the greedy plan's handover)" if used > info.build_s + 0.005 else ""
        return _keep(greedy, info, start, f"building the model took {info.build_s:.3f}s{handover} of the "
                     f"{budget:g}s budget{slow}, and decoding and checking need {reserve:.3f}s", "FALLBACK_GREEDY")
    result = run_with_watchdog(built, config.solver, max(left, 0.05), slowdown=slowdown)
    info.solve_s = time.perf_counter() - start - info.build_s
    if result is None:
        return _fail(greedy, start, "cpsat", "timeout", "the watchdog stopped the solver (time budget)", info)
    if result.failure and not result.values:
        return _fail(greedy, start, "cpsat", result.failure, result.note, info)
    if result.failure:  # the solver worker failed after sending its tier-1 solution, which goes on
        info.failures.append(("cpsat", result.failure))
        scope.notes.append(failure_note("cpsat", result.failure, f"{result.note} (after its tier-1 solution)"))
    if not result.values:
        return _keep(greedy, info, start, f"no solution ({result.status}{': ' + result.note if result.note else ''})",
                     "FALLBACK_GREEDY")
    info.objective = result.value_tier
    info.bound = result.bound if not math.isinf(result.bound) else None
    info.gap = (abs(result.bound - result.value_tier) / max(1.0, abs(result.value_tier))
                if result.bound and not math.isinf(result.bound) else None)
    if result.settled:
        return _keep(greedy, info, start, f"greedy plan kept: {result.note} ({result.status}; not decoded)"
                     + _notes(scope.notes), "GREEDY_KEPT")
    if _is_the_hint(built, hinted, result.values):
        return _keep(greedy, info, start, f"greedy plan kept: the CP-SAT solution is its hint, the greedy plan's own "
                     f"decisions ({result.status}; not decoded nor checked again)" + _notes(scope.notes), "GREEDY_KEPT")
    phase("decoding")
    t = time.perf_counter()
    # the model's session is the cycle start with the greedy's replayed moves and its decisions outside the model
    # applied (model_scope), untouched since: the solution goes on top of it. What the model decides stays as it
    # decides (no greedy pass refills the room it left: it decided that room, within its candidates)
    dacts = Actions(sess)
    try:
        decode(sess, dacts, scope, built, result.values)
    except DecodeError as exc:
        info.decode_s = time.perf_counter() - t
        return _fail(greedy, start, "decode", "exception", f"decode failed: {exc}", info)
    run_outside_model(dacts, config, actions)  # stale-gang: a rule, not an optimisation
    plan = plan_from_session(sess, dacts.reasons, "cpsat")
    for g, reasons in greedy.pending.items():
        if g in plan.pending and plan.pending[g] and plan.pending[g][0].code == "Pending":
            plan.pending[g] = reasons
    info.decode_s = time.perf_counter() - t
    phase("checking")
    try:
        check_plan(state, plan, fs, config)
    except PlanViolation as exc:
        return _fail(greedy, start, "cpsat", "violation", f"the CP-SAT plan failed the checker: {exc.problems[0]}",
                     info)
    return _chosen(state, fs, greedy, plan, info, result.status, scope.notes, start)


def _chosen(state: ClusterState, fs: FairShare, greedy: Plan, plan: Plan, info: SolverInfo, status: str,
            scope_notes: list[str], start: float) -> Plan:
    """The plan choice between the checked CP-SAT plan and the plan it started from (the cycle's one rule)."""
    ours, theirs = plan_score(state, fs, plan), plan_score(state, fs, greedy)
    info.status = status
    info.wall_s = time.perf_counter() - start
    # chosen only when it beats the greedy plan on the primary objective, lexicographically: more priority-weighted
    # work placed, or as much for a smaller eviction cost; a tie keeps the greedy (KAI-compatible) plan
    better = _beats(ours, theirs)
    notes = _notes(scope_notes)
    if better:
        info.note = f"CP-SAT plan chosen: value {ours[0]:g} vs greedy {theirs[0]:g}, eviction cost {ours[1]:g} " \
                    f"vs {theirs[1]:g}" + notes
        plan.solver = info
        plan.phases.update(greedy.phases)
        return plan
    if _ties(ours, theirs):
        info.note = f"greedy plan kept: the CP-SAT plan is no better ({status})" + notes
        info.status = "GREEDY_KEPT"
    else:
        info.note = f"greedy plan kept: the CP-SAT plan is worse (value {ours[0]:g} vs {theirs[0]:g}, eviction " \
                    f"cost {ours[1]:g} vs {theirs[1]:g}; solver {status})" + notes
        info.status = "FALLBACK_GREEDY"
    greedy.solver = info
    greedy.engine = "cpsat"
    return greedy


def _notes(scope_notes: list[str]) -> str:
    """The scope's notes, as the end of a plan-choice note."""
    return f"; {'; '.join(scope_notes)}" if scope_notes else ""


def _hint_of(built: Built) -> tuple[np.ndarray, np.ndarray]:
    """The model's hint (variable indices, values), as the worker wrote it before solving."""
    hint = built.model.proto.solution_hint
    return np.array(hint.vars, dtype=np.int64), np.array(hint.values, dtype=np.int64)


def _is_the_hint(built: Built, hinted: tuple[np.ndarray, np.ndarray], values: list[int]) -> bool:
    """Whether a solution is the hint itself: every hinted variable at its hinted value, every other one fixed by
    its domain. The hint is every decision of the starting plan (add_greedy_hint), a checked plan: decoding the
    solution would give those decisions back, which score as that plan does, so the plan choice keeps it (a tie)."""
    at, want = hinted
    if not len(at) or len(values) != len(built.model.proto.variables):
        return False
    vals = np.asarray(values, dtype=np.int64)
    if not np.array_equal(vals[at], want):
        return False
    free = np.ones(len(vals), dtype=bool)
    free[at] = False
    domains = built.model.proto.variables
    return all(len(d := domains[int(i)].domain) == 2 and d[0] == d[1] for i in np.flatnonzero(free))


def _starting_plan(state: ClusterState, fs: FairShare, config: Config, greedy: Plan,
                   actions: tuple[str, ...] | None, second: SecondHint | None,
                   phase: Callable[[str], None], *, deadline: float | None = None) -> tuple[Plan, str]:
    """The plan the model starts from (scope, keep, hint, fallback): the KAI-scored greedy plan, or the FGD-scored
    one when second_hint_note accepts it. With wall time the plan computed beside (`second`) if it is ready now,
    else computed here when that is cheap (_inline_is_cheap); deterministic mode computes it here. With a
    `deadline` no model runs after this (kept_unbeatable): the time until then is free, so the plan is computed
    here when SLOWDOWN x the KAI-scored cycle fits in it (the process beside is stopped first: it would only
    compete for the cores), else waited for until the deadline. Returns the plan and a note ('' when the
    KAI-scored plan stays)."""
    if not wanted(config, actions):
        return greedy, ""
    ready = second is not None and second.ready()
    free_s = None if deadline is None else deadline - time.perf_counter()
    if second is not None and (ready or not _inline_is_cheap(config, greedy, free_s)
                               or (free_s is not None and _beside_is_sooner(second, greedy))):
        # ready: taken; with time no model needs: waited for until the deadline; else left (the model may use it)
        alt = second.take() if ready else second.take(free_s) if free_s is not None else None
    elif second is not None or config.solver.deterministic or _inline_is_cheap(config, greedy, free_s):
        # late but cheap, not started beside (a short cycle: engine.fork_early), or deterministic mode: computed
        # here, at the worker's priority, rather than waited for at nice 10 on a loaded machine
        # (docs/DESIGN-NOTES.md, CP-SAT engine: the second hint inline)
        if second is not None and free_s is not None:
            second.close()  # (the engine's process started it, so it may stop it; the worker may not)
        phase("the greedy engine with FGD scoring (a second hint)")
        alt = compute(state, fs, config, actions)
    else:
        return greedy, ""
    note = second_hint_note(state, fs, greedy, alt, config) if alt is not None else ""
    if alt is None or not note:
        return greedy, ""
    alt.solver = greedy.solver
    alt.phases = greedy.phases  # the cycle's own phases (the KAI-scored greedy's)
    return alt, "started from " + note


def _pattern_start(state: ClusterState, fs: FairShare, config: Config, start: Plan, actions: tuple[str, ...] | None,
                   phase: Callable[[str], None]) -> tuple[Plan, str, tuple[str, str] | None]:
    """The pattern model's plan (pattern_plan.py) instead of the starting plan when it keeps every group that plan
    places, evicts no more and scores higher. Returns (the plan, its note or '', a failure (kind, detail) or None):
    an optional stage, whatever goes wrong leaves the starting plan."""
    budget = config.solver.time_budget_s
    if not config.solver.pattern_hint or (actions is not None and "allocate" not in actions):
        return start, "", None
    phase("the pattern model over node classes (a third hint)")
    try:
        pm = pattern_plan(state, fs, config, start, MODEL_SHARE * budget)
        alt = pm.plan
        if alt is None:
            return start, "", None
        check_plan(state, alt, fs, config)
    except PlanViolation as exc:
        return start, "", ("violation", f"the pattern plan failed the checker: {exc.problems[0]}")
    except Exception:
        return start, "", ("exception", f"the pattern plan raised {last_line(traceback.format_exc())}")
    scores = keeps_and_scores(state, fs, start, alt)
    if scores is None or not _beats(*scores):
        return start, "", None
    dropped = ", without the consolidation" if pm.moves_dropped else ""
    return alt, (f"started from the pattern model's plan (value {scores[0][0]:g} vs {scores[1][0]:g}, eviction "
                 f"cost {scores[0][1]:g} vs {scores[1][1]:g}: {len(pm.chosen)} more groups{dropped}; {pm.classes} "
                 f"node classes, {pm.patterns} patterns, {pm.seconds:.2f}s)"), None


def _beside_is_sooner(second: SecondHint, greedy: Plan) -> bool:
    """Whether the plan computed beside is expected before the same plan computed here would be done (SLOWDOWN x
    the KAI-scored cycle's action phases, on this process's core), at the share of a core it got so far."""
    work_s = SLOWDOWN * action_seconds(greedy)
    expected = second.expected_s(work_s)
    return expected is not None and expected < work_s


def _inline_is_cheap(config: Config, greedy: Plan, free_s: float | None = None) -> bool:
    """Whether the FGD-scored cycle, SLOWDOWN x the KAI-scored one (its action phases), fits in INLINE_SHARE of
    the budget, or in `free_s` seconds when given (time no model needs)."""
    greedy_s = action_seconds(greedy)
    limit = INLINE_SHARE * config.solver.time_budget_s if free_s is None else free_s
    return SLOWDOWN * greedy_s <= limit


def second_hint_note(state: ClusterState, fs: FairShare, greedy: Plan, alt: Plan, config: Config | None = None) -> str:
    """Why the FGD-scored plan `alt` may stand in for the KAI-scored `greedy` ('' when it may not): it places every
    group `greedy` places with as many pods (KAI's queue order keeps its say), evicts no more, and scores higher by
    plan_score or (with `config`) ties it and leaves less fragmented GPU share (packing.py). fractions-1000-s1:
    2,417.7 GPUs placed instead of 2,404.9, where the model alone found nothing better; on fractions-300-s0 FGD
    scoring dropped 3 KAI-placed groups, and the KAI-scored plan stays."""
    if _same_decisions(greedy, alt):  # (every measure below would tie)
        return ""
    scores = keeps_and_scores(state, fs, greedy, alt)
    if scores is None:
        return ""
    ours, theirs = scores
    counts, alt_counts = placed_per_group(state, greedy), placed_per_group(state, alt)
    if ours[0] > theirs[0] + 1e-9:
        return (f"the greedy plan with FGD scoring (value {ours[0]:g} vs {theirs[0]:g} KAI-scored, the same groups "
                f"and {len(set(alt_counts) - set(counts))} more)")
    if config is None or not _ties(ours, theirs) or set(alt_counts) != set(counts):
        return ""
    frag = less_fragmented(state, fs, config, alt, greedy)
    if frag is None:
        return ""
    return (f"the greedy plan with FGD scoring (the same groups for the same value {ours[0]:g}, GPU "
            f"fragmentation with CPU balance and share fill cost {frag[0]:.1f} vs {frag[1]:.1f} GPUs KAI-scored)")


def keeps_and_scores(state: ClusterState, fs: FairShare, base: Plan,
                     alt: Plan) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """(alt's plan_score, base's) when `alt` places every group `base` places with at least as many pods and evicts
    no more (KAI's queue order keeps its say over a starting plan); None otherwise."""
    counts, alt_counts = placed_per_group(state, base), placed_per_group(state, alt)
    ours, theirs = plan_score(state, fs, alt), plan_score(state, fs, base)
    if any(alt_counts[g] < k for g, k in counts.items()) or ours[1] > theirs[1] + 1e-9:
        return None
    return ours, theirs


def _same_decisions(a: Plan, b: Plan) -> bool:
    """The two plans place, pipeline, move and evict the same pods the same way."""
    if len(a.placements) != len(b.placements) or len(a.evictions) != len(b.evictions):
        return False
    by_pod = attrgetter("pod")
    return sorted(a.placements, key=by_pod) == sorted(b.placements, key=by_pod) \
        and sorted(a.evictions, key=by_pod) == sorted(b.evictions, key=by_pod)


def _keep(greedy: Plan, info: SolverInfo, start: float, why: str, status: str) -> Plan:
    info.status = status
    info.note = why
    info.wall_s = time.perf_counter() - start
    greedy.solver = info
    greedy.engine = "cpsat"
    return greedy
