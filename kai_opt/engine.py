"""One scheduling cycle as a pure function: (state, config) -> verified plan.

fair share -> greedy plan (always: the hint and the fallback) -> CP-SAT plan when configured -> the checker ->
the plan. Engines never apply anything; sinks (CLI, simulate, the in-cluster binder) consume the plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kai_opt.checker import check_plan
from kai_opt.config import Config, Engine
from kai_opt.fairshare import FairShare, compute_fair_share
from kai_opt.gcpause import gc_paused
from kai_opt.heuristics.actions import Actions
from kai_opt.heuristics.session import Session
from kai_opt.plan import Eviction, Placement, Plan, Reason, SolverInfo
from kai_opt.state import ClusterState, PodStatus

log = logging.getLogger("kai_opt.solver")

ACTION_ORDER = ("allocate", "consolidate", "reclaim", "preempt", "stale_gang")


Progress = Callable[[str], None]  # told what a long cycle is doing now (a phase name), for a status line


def greedy_plan(state: ClusterState, fs: FairShare, config: Config,
                actions: tuple[str, ...] | None = None, progress: Progress | None = None) -> Plan:
    """KAI-like heuristics: each enabled action in order on one session."""
    start = time.perf_counter()
    sess = Session(state, fs, config)
    acts = Actions(sess)
    enabled = actions if actions is not None else tuple(a for a in ACTION_ORDER if getattr(config.actions, a))
    phases: dict[str, float] = {}
    for name in ACTION_ORDER:
        if name not in enabled:
            continue
        if progress is not None:
            progress(f"greedy: {name.replace('_', '-')}")
        t = time.perf_counter()
        {"allocate": acts.allocate, "consolidate": acts.consolidate, "reclaim": acts.reclaim,
         "preempt": acts.preempt, "stale_gang": acts.stale_gangs}[name]()
        phases[name] = time.perf_counter() - t
    plan = plan_from_session(sess, acts.reasons, "greedy")
    plan.phases.update(phases)
    plan.solver = SolverInfo(status="HEURISTIC", wall_s=time.perf_counter() - start)
    return plan


def plan_from_session(sess: Session, reasons: dict[int, list[Reason]], engine: str) -> Plan:
    st = sess.state
    placements: list[Placement] = sorted(sess.placements.values(), key=lambda p: p.pod)
    placements += sorted(sess.moves.values(), key=lambda p: p.pod)
    evictions: list[Eviction] = sorted(sess.evictions.values(), key=lambda e: e.pod)
    pending: dict[int, list[Reason]] = {}
    still = (sess.status == PodStatus.PENDING) & (st.pod_pg >= 0)
    for g in sorted(set(st.pod_pg[still].tolist())):
        pending[g] = reasons.get(g) or [Reason("Pending", "waiting for its turn: earlier pods of this elastic "
                                                          "group were placed this cycle")]
    return Plan(engine=engine, placements=placements, evictions=evictions, pending=pending)


def run_cycle(state: ClusterState, config: Config, *, engine: Engine | None = None,
              actions: tuple[str, ...] | None = None, progress: Progress | None = None) -> tuple[Plan, FairShare]:
    """Compute and verify one cycle's plan. Raises PlanViolation if an engine produced an invalid plan. The cyclic
    GC is paused meanwhile (kai_opt.gcpause: a cycle makes no garbage cycles worth a collection walking the whole
    state; 10,000-node greedy cycle 54 -> 50 s when it was measured)."""
    with gc_paused():
        return _run_cycle(state, config, engine=engine, actions=actions, progress=progress)


def _run_cycle(state: ClusterState, config: Config, *, engine: Engine | None,
               actions: tuple[str, ...] | None, progress: Progress | None) -> tuple[Plan, FairShare]:
    def say(what: str) -> None:
        if progress is not None:
            progress(what)

    t0 = time.perf_counter()
    say("fair share")
    fs = compute_fair_share(state)
    t_fs = time.perf_counter() - t0
    engine = engine or config.engine
    second = None
    if engine == Engine.cpsat:  # the FGD-scored greedy plan, computed beside on the other core (second_hint)
        from kai_opt.formulation.second_hint import SecondHint

        second = SecondHint.start(state, fs, config, actions)
    try:
        plan = greedy_plan(state, fs, config, actions, progress)
        if second is not None and not second.keep_going(time.perf_counter() - t0, config.solver.time_budget_s):
            second = None
        say("checking the greedy plan")
        check_plan(state, plan, fs, config)
        if engine == Engine.cpsat:
            say(f"CP-SAT (budget {config.solver.time_budget_s:g}s)")
            from kai_opt.formulation.solve import cpsat_plan

            try:
                plan = cpsat_plan(state, fs, config, greedy=plan, actions=actions, second=second)
            except Exception as exc:  # an optional stage never loses the cycle (cpsat_plan names what it knows
                # of; this is the net for the rest): the greedy plan, checked above, stays
                log.exception("the CP-SAT stage raised; the cycle goes on with the greedy plan")
                plan.engine = "cpsat"
                plan.solver = SolverInfo(status="FALLBACK_GREEDY", wall_s=plan.solver.wall_s)
                plan.solver.add_failure("cpsat", "exception", f"{type(exc).__name__}: {exc}"[:300])
    finally:
        if second is not None:
            second.close()
    plan.phases["fair_share"] = t_fs
    plan.phases["total"] = time.perf_counter() - t0
    return plan, fs
