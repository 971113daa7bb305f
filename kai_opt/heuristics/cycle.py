"""The greedy engine's cycle on one session: KAI's actions in order, and the plan a session's decisions make.

It is the hint and the fallback of every engine, so the engine module and the CP-SAT stage both read it from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kai_opt.actions import ACTION_ORDER as ACTION_ORDER  # re-exported (kai_opt.engine)
from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.actions import REGISTRY, ActionContext, enabled_actions
from kai_opt.heuristics.session import Session
from kai_opt.plan import WITHDRAWN, Eviction, Placement, Plan, Reason, SolverInfo
from kai_opt.state import ClusterState, PodStatus

Progress = Callable[[str], None]  # told what a long cycle is doing now (a phase name), for a status line
AfterAction = Callable[[str, Session], None]  # told each action's name and the session once the action ran


def greedy_plan(state: ClusterState, fs: FairShare, config: Config,
                actions: tuple[str, ...] | None = None, progress: Progress | None = None,
                after: AfterAction | None = None) -> Plan:
    """KAI-like heuristics: each enabled action in order on one session. `after` sees the session after each
    action (it must not change it)."""
    start = time.perf_counter()
    sess = Session(state, fs, config)
    ctx = ActionContext(sess)
    enabled = enabled_actions(config, actions)
    phases: dict[str, float] = {}
    for action in REGISTRY:
        if action.name not in enabled:
            continue
        if progress is not None:
            progress(f"greedy: {action.name.replace('_', '-')}")
        t = time.perf_counter()
        action.run(ctx)
        phases[action.name] = time.perf_counter() - t
        if after is not None:
            after(action.name, sess)
    plan = plan_from_session(sess, ctx.reasons, "greedy")
    plan.phases.update(phases)
    plan.solver = SolverInfo(status="HEURISTIC", wall_s=time.perf_counter() - start)
    return plan


def plan_from_session(sess: Session, reasons: dict[int, list[Reason]], engine: str) -> Plan:
    st = sess.state
    # placements of this cycle that a later victim search took back (kai_opt.heuristics.victims.victim_pods): the
    # pods are neither placed nor evicted, and their groups stay pending, saying so
    withdrawn = {p: e for p, e in sess.evictions.items() if p in sess.placements}
    turns = list(dict.fromkeys(int(st.pod_pg[p]) for p in sess.placements  # (insertion order: decision order)
                               if p not in withdrawn))
    placements: list[Placement] = sorted((pl for pl in sess.placements.values() if pl.pod not in withdrawn),
                                         key=lambda p: p.pod)
    placements += sorted(sess.moves.values(), key=lambda p: p.pod)
    evictions: list[Eviction] = sorted((e for e in sess.evictions.values() if e.pod not in withdrawn),
                                       key=lambda e: e.pod)
    pending: dict[int, list[Reason]] = {}
    still = (sess.status == PodStatus.PENDING) & (st.pod_pg >= 0)
    for g in sorted(set(st.pod_pg[still].tolist())):
        pending[g] = reasons.get(g) or [Reason("Pending", "waiting for its turn: earlier pods of this elastic "
                                                          "group were placed this cycle")]
    for p, e in sorted(withdrawn.items()):
        g = int(st.pod_pg[p])
        rs = pending.setdefault(g, list(reasons.get(g, [])))
        if all(r.code != WITHDRAWN for r in rs):
            by = st.pg_keys[e.beneficiary] if e.beneficiary >= 0 else ""
            rs.append(Reason(WITHDRAWN, f"placed in this cycle, then taken back as a victim ({e.reason}) for {by}",
                             {"action": e.reason, "for": by}))
    return Plan(engine=engine, placements=placements, evictions=evictions, pending=pending, turns=turns)
