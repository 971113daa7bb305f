"""One scheduling cycle as a pure function: (state, config) -> verified plan.

fair share -> greedy plan (always: the hint and the fallback) -> CP-SAT plan when configured -> the checker ->
the plan. A long CP-SAT cycle with room to spare first tries the FGD-scored greedy plan alone
(formulation/fgd_first.py): kept when nothing could beat it. Engines never apply anything; sinks (CLI, simulate,
the in-cluster binder) consume the plan.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config, Engine
from kai_opt.fairshare import FairShare, compute_fair_share
from kai_opt.fairshare.history import HistoricalUsage
from kai_opt.gcpause import gc_paused
from kai_opt.heuristics.cycle import ACTION_ORDER, Progress, greedy_plan, plan_from_session
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan, SolverInfo
from kai_opt.state import ClusterState, PodStatus

if TYPE_CHECKING:
    from kai_opt.formulation.second_hint import SecondHint

log = logging.getLogger("kai_opt.solver")

FORK_EARLY_WORK = 1_000_000  # pending groups x nodes from which fork_early holds
FORK_AT_START_WORK = 10_000_000  # ... and from which the second hint is forked at the cycle start (about 0.26 s
# of allocate at 10,000 nodes: below it, SLOWDOWN x the greedy cycle fits in what the default 1 s budget leaves free)

__all__ = ["ACTION_ORDER", "Progress", "greedy_plan", "plan_from_session", "run_cycle"]


def run_cycle(state: ClusterState, config: Config, *, engine: Engine | None = None,
              actions: tuple[str, ...] | None = None, progress: Progress | None = None,
              history: HistoricalUsage | None = None) -> tuple[Plan, FairShare]:
    """Compute and verify one cycle's plan; `history`: past usage per queue for time-based fair share (None:
    off). Raises PlanViolation if an engine produced an invalid plan. The cyclic
    GC is paused meanwhile (kai_opt.gcpause: a cycle makes no garbage cycles worth a collection walking the whole
    state)."""
    with gc_paused():
        return _run_cycle(state, config, engine=engine, actions=actions, progress=progress, history=history)


def fork_early(state: ClusterState) -> bool:
    """Whether the greedy cycle is long enough for the second hint and the CP-SAT worker to be forked once
    allocate ran, when the plan may be beaten: the forks and the pages the cycle writes afterwards are then paid
    beside the rest of it, and the second hint has the other core for as long. A short cycle would pay the forks
    for more than it computes the FGD-scored plan inline for. From FORK_AT_START_WORK the second hint is forked at
    the cycle start, whatever allocate leaves: such a cycle could not compute the FGD-scored plan inline in the
    budget an unbeatable plan leaves free. Measured by pending groups x nodes (placement_work), the size of the
    greedy's placement work (docs/DESIGN-NOTES.md, CP-SAT engine)."""
    return placement_work(state) >= FORK_EARLY_WORK


def placement_work(state: ClusterState) -> int:
    """Pending groups of ours x nodes."""
    pending = (state.pod_status == PodStatus.PENDING) & state.pod_ours & (state.pod_pg >= 0)
    return len(np.unique(state.pod_pg[pending])) * state.n_nodes


def _second_hint_late(state: ClusterState, fs: FairShare, config: Config, actions: tuple[str, ...] | None,
                      greedy: Plan) -> SecondHint | None:
    """The second hint of a cycle that forked nothing at its start (fork_early), started when the model is to run:
    it has the model's budget on the other core, so only when SLOWDOWN x the greedy cycle fits in it."""
    from kai_opt.formulation.second_hint import SLOWDOWN, SecondHint, action_seconds

    if SLOWDOWN * action_seconds(greedy) > config.solver.time_budget_s:
        return None
    return SecondHint.start(state, fs, config, actions)


def _run_cycle(state: ClusterState, config: Config, *, engine: Engine | None,
               actions: tuple[str, ...] | None, progress: Progress | None,
               history: HistoricalUsage | None) -> tuple[Plan, FairShare]:
    def say(what: str) -> None:
        if progress is not None:
            progress(what)

    t0 = time.perf_counter()
    say("fair share")
    fs = compute_fair_share(state, history=history, k_value=config.k_value)
    t_fs = time.perf_counter() - t0
    engine = engine or config.engine
    second = None
    worker = None
    work = placement_work(state) if engine == Engine.cpsat else 0
    first_failed = ""
    if engine == Engine.cpsat:  # a long cycle with room to spare: the FGD-scored plan first, kept if unbeatable
        from kai_opt.formulation.fgd_first import fgd_first

        try:
            first = fgd_first(state, fs, config, actions, work, progress)
        except Exception as exc:  # an optional stage: the cycle goes the usual way, saying so
            log.exception("the FGD-scored plan computed first raised; the cycle goes on as usual")
            first, first_failed = None, f"the FGD-scored plan computed first raised {type(exc).__name__}: {exc}"
        if first is not None:
            first.phases["fair_share"] = t_fs
            first.phases["total"] = time.perf_counter() - t0
            return first, fs
    early = engine == Engine.cpsat and work >= FORK_EARLY_WORK  # fork_early
    at_start = early and work >= FORK_AT_START_WORK
    if at_start:  # the FGD-scored greedy plan, computed beside on the other core
        from kai_opt.formulation.second_hint import SecondHint

        second = SecondHint.start_watched(state, fs, config, actions, t0)

    def after(action: str, sess: Session) -> None:
        """Once allocate ran in a long cycle whose plan may be beaten, the FGD-scored greedy plan is forked to be
        computed beside on the other core (second_hint; unless it was forked at the start), then the CP-SAT
        worker, waiting for the greedy plan (it inherits the second hint's pipe). A plan unbeatable so far (nothing
        left a model could place without evictions) forks nothing more: kept_unbeatable computes the FGD-scored
        plan inline, and a later eviction makes the plan beatable, when cpsat_plan forks the worker (and
        _second_hint_late the second hint)."""
        nonlocal worker, second
        if action != "allocate":
            return
        from kai_opt.formulation.second_hint import SecondHint
        from kai_opt.formulation.solve import prepare_worker
        from kai_opt.formulation.unbeatable import may_be_beaten

        try:
            if not may_be_beaten(state, fs, config, sess):
                return
            if not at_start:
                second = SecondHint.start_watched(state, fs, config, actions, t0)
            with second.paused() if second is not None else nullcontext():
                worker = prepare_worker(state, fs, config, actions, second)
        except Exception:  # (an optional stage: cpsat_plan forks the worker itself when the model runs)
            log.exception("forking the CP-SAT worker early raised; it is forked when the model runs")

    replanned = ""
    try:
        plan = greedy_plan(state, fs, config, actions, progress, after if early else None)
        if second is not None and not second.keep_going(time.perf_counter() - t0, config.solver.time_budget_s):
            second = None
        say("checking the greedy plan")
        plan, replanned = _verified_greedy(state, fs, config, plan, actions, progress)
        if engine == Engine.cpsat:
            say(f"CP-SAT (budget {config.solver.time_budget_s:g}s)")
            from kai_opt.formulation.solve import cpsat_plan, kept_unbeatable
            from kai_opt.formulation.unbeatable import unbeatable_note

            try:
                unbeatable = unbeatable_note(state, fs, config, plan)
                if unbeatable:  # the model could only tie: its worker is stopped now (its exit overlaps the
                    # wait for the FGD-scored plan, which may still win the tie on fragmentation)
                    if worker is not None:
                        worker.cancel()
                        worker = None
                    plan = kept_unbeatable(state, fs, config, plan, actions, second, unbeatable,
                                            deadline=t0 + config.solver.time_budget_s)
                else:
                    if worker is None and second is None:  # a short cycle that runs the model: the FGD-scored
                        # plan beside it now, weighed against the model's plan at the end
                        second = _second_hint_late(state, fs, config, actions, plan)
                    plan = cpsat_plan(state, fs, config, greedy=plan, actions=actions, second=second,
                                      waiting=worker)
            except Exception as exc:  # an optional stage never loses the cycle (cpsat_plan names what it knows
                # of; this is the net for the rest): the greedy plan, checked above, stays
                log.exception("the CP-SAT stage raised; the cycle goes on with the greedy plan")
                plan.engine = "cpsat"
                plan.solver = SolverInfo(status="FALLBACK_GREEDY", wall_s=plan.solver.wall_s)
                plan.solver.add_failure("cpsat", "exception", f"{type(exc).__name__}: {exc}"[:300])
    finally:
        if worker is not None:
            worker.cancel()
        if second is not None:
            second.close()
    if replanned:
        plan.solver.add_failure("greedy", "violation", replanned)
    if first_failed:
        plan.solver.add_failure("second_hint", "exception", first_failed[:300])
    plan.phases["fair_share"] = t_fs
    plan.phases["total"] = time.perf_counter() - t0
    return plan, fs


def _verified_greedy(state: ClusterState, fs: FairShare, config: Config, plan: Plan,
                     actions: tuple[str, ...] | None, progress: Progress | None) -> tuple[Plan, str]:
    """The greedy plan, checked. One the checker finds over capacity on some nodes (the engine misjudged their
    state, e.g. a pod holding node resources no device shows) is planned again once with those nodes out of the
    cycle, and that plan is checked against the cluster as it is: one node the engine cannot judge does not stop
    the scheduling of the rest. Returns the plan and, when planned again, what happened ('' otherwise). Any other
    violation, or one the second plan still has, is raised: nothing is applied."""
    try:
        check_plan(state, plan, fs, config)
        return plan, ""
    except PlanViolation as exc:
        if not exc.nodes:
            raise
        first = exc
    ok = state.node_ok.copy()
    ok[sorted(first.nodes)] = False
    again = greedy_plan(dataclasses.replace(state, node_ok=ok), fs, config, actions, progress)
    check_plan(state, again, fs, config)
    names = sorted(state.node_names[n] for n in first.nodes)
    said = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    log.error("the greedy plan failed the checker (%s); planned again without node(s) %s",
              "; ".join(first.problems[:3]), said)
    return again, f"the greedy plan failed the checker ({first.problems[0]}); planned again without node(s) {said}"
