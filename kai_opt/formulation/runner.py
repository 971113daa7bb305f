"""Run CP-SAT in a forked worker under a hard wall-clock watchdog (presolve cannot be interrupted from inside; the
fork, pipe and watchdog are kai_opt.formulation.child's).

The worker solves lexicographically: first the most work placed (tier 1), then, with tier 1 held at its best
(less an optional tolerance), the fewest and cheapest evictions and the best packing (tiers 2 and 3). When tier 1
is proved at the starting plan's own value, only a lower eviction cost could make the plan choice take the model's
plan: that is searched first, and a proof that there is none ends the solve (settled). It sends back the status,
bounds and every variable's value; if it overruns, the parent kills it and the caller falls back.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from kai_opt.config import Solver
from kai_opt.formulation.child import Send, run_in_child
from kai_opt.formulation.hint import hinted_values
from kai_opt.formulation.model import Built

STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
          cp_model.MODEL_INVALID: "MODEL_INVALID", cp_model.UNKNOWN: "UNKNOWN"}


@dataclass
class SolveResult:
    status: str
    values: list[int]
    objective: float
    bound: float
    value_tier: float  # tier-1 value reached
    solve_s: float
    note: str = ""
    failure: str | None = None  # the worker failed (kai_opt.plan.FAILURE_KINDS: exception, crash); the note says
    # how. With values: the tier-1 solution it sent before
    settled: bool = False  # proved that no solution is a plan the choice would take over the one hinted (_settled)


PRESOLVE_MIN_S = 0.4  # and solves shorter than this (wall time, times how much slower than its CPU time the
# build ran: a loaded machine presolves as much slower) too: the complete hint is then the first solution at once,
# where presolve alone could take the whole slot
PRESOLVE_MAX_VARS = 50_000  # larger models skip presolve (it can take longer than the budget; the complete hint
# is the first solution without it)


def _params(solver: cp_model.CpSolver, cfg: Solver, seconds: float, n_vars: int = 0, slowdown: float = 1.0) -> None:
    p = solver.parameters
    # (set either way: one solver object runs every tier, and _settled turns presolve on for its proof)
    p.cp_model_presolve = not (n_vars > PRESOLVE_MAX_VARS
                               or (seconds < PRESOLVE_MIN_S * slowdown and not cfg.deterministic))
    p.random_seed = cfg.seed
    # no probing and one presolve pass: presolve must not stand between the model and its complete hint
    p.cp_model_probing_level = 0
    p.max_presolve_iterations = 1
    # no symmetry detection (identical nodes make it slow before the first solution); LNS improves from the hint
    p.symmetry_level = 0
    if cfg.deterministic:
        p.num_workers = 1
        p.max_deterministic_time = max(0.05, seconds)  # reproducible: a deterministic limit, one search
        p.max_time_in_seconds = max(1.0, 20 * seconds)
    else:
        p.num_workers = cfg.workers
        p.max_time_in_seconds = max(0.01, seconds)


def solve_lexicographic(built: Built, cfg: Solver, seconds: float, report: Send | None = None,
                        slowdown: float = 1.0) -> SolveResult:
    """`report(result)`, when given, receives the tier-1 result as soon as it is known (the watchdog keeps it if
    tiers 2-3 overrun)."""
    start = time.perf_counter()
    m = built.model
    # the starting plan's (the hint's) tiers 1 and 2, before any solve replaces the hint
    hinted = hinted_values(m, built.value, built.eviction_cost)
    solver = cp_model.CpSolver()
    tier1_share = 0.85  # tier 1 (work placed) is the objective that decides; tiers 2-3 polish
    moves = sum(built.move) if built.move else 0
    # among plans placing as much, the fewest moves (each move 1 < MOVE_SCALE, one unit of work placed): tiers
    # 2-3 may get too little time to undo needless moves
    m.maximize(built.value * MOVE_SCALE - moves if built.move else built.value)
    det_used = 0.0  # deterministic mode: the solves' deterministic time, so no wall clock decides a result

    def spent() -> float:
        return det_used if cfg.deterministic else time.perf_counter() - start

    before = (_without_moves(solver, built, cfg, seconds * tier1_share * MOVE_FREE_SHARE, slowdown)
              if built.move else None)
    if before is not None or built.move:
        det_used += solver.response_proto.deterministic_time
    _params(solver, cfg, seconds * tier1_share - spent(), len(m.proto.variables), slowdown)
    status = solver.solve(m)
    det_used += solver.response_proto.deterministic_time
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        v1 = float(solver.value(built.value))
        bound1 = solver.best_objective_bound
        if built.move:
            bound1 = math.floor((bound1 + _most_moves(built)) / MOVE_SCALE)
        first = list(solver.response_proto.solution)
    elif before is not None:  # nothing in the time left with moves: the plan without them (bound unknown)
        first, v1 = before
        bound1 = math.inf
        status = cp_model.FEASIBLE
    else:
        return SolveResult(STATUS.get(status, "UNKNOWN"), [], 0.0, 0.0, 0.0, time.perf_counter() - start)
    status1 = status
    # tier 2 and 3 with tier 1 held
    tol = cfg.objective.lexicographic_tolerance
    m.add(built.value >= int(v1 * (1 - tol)))

    def tier1(note: str, settled: bool = False) -> SolveResult:
        return SolveResult(STATUS[status1], first, v1, bound1, v1, time.perf_counter() - start, note, settled=settled)

    left = seconds - spent()
    if left <= 0.02:
        return tier1("no time left for tiers 2-3")
    if report is not None:
        report(tier1("tiers 2-3 did not finish in time"))
    if status1 == cp_model.OPTIMAL and tol == 0 and None not in hinted and v1 == hinted[0]:
        proof = _settled(solver, built, cfg, int(hinted[1] or 0), first, left * PROOF_SHARE, slowdown)
        det_used += solver.response_proto.deterministic_time
        if proof is None:
            return tier1("no plan of the model can be chosen: it places no more than the starting plan (tier 1 "
                         "proved at its value) and evicts no less (its least eviction cost proved)", settled=True)
        first = proof or first  # (a solution evicting less than the starting plan: tiers 2-3 start from it)
        left = seconds - spent()
        if left <= 0.02:
            return tier1("no time left for tiers 2-3")
    w = cfg.objective
    m.maximize(built.packing * w.packing_weight - built.eviction_cost * max(1, w.eviction_weight // 1000))
    _hint_all(m, first)
    _params(solver, cfg, left, len(m.proto.variables), slowdown)
    status2 = solver.solve(m)
    if status2 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(STATUS[status1], first, v1, bound1, v1, time.perf_counter() - start,
                           "tiers 2-3 found nothing better")
    final = "OPTIMAL" if (status1 == cp_model.OPTIMAL and status2 == cp_model.OPTIMAL) else "FEASIBLE"
    return SolveResult(final, list(solver.response_proto.solution), v1, bound1, v1, time.perf_counter() - start)


PROOF_SHARE = 0.8  # of the time left after tier 1: the proof that no plan of the model can be chosen (_settled;
# what the choice weighs there is the eviction cost alone: tiers 2-3 only polish the packing of a plan it finds)


def _settled(solver: cp_model.CpSolver, built: Built, cfg: Solver, hinted_cost: int, first: list[int],
             seconds: float, slowdown: float) -> list[int] | None:
    """With tier 1 proved at the starting plan's value (held), the plan choice (solve.plan_score) takes the
    model's plan only if it evicts less: the least eviction cost, searched alone. None when it is proved no less
    than the starting plan's (the model's answer would only tie: tiers 2-3 and the decode are skipped); else the
    best solution found (below the starting plan's cost: a start for tiers 2-3), or [] when none is."""
    if hinted_cost <= 0:  # (every eviction and move costs more than nothing: none can evict less)
        return None
    m = built.model
    m.minimize(built.eviction_cost)
    _hint_all(m, first)
    _params(solver, cfg, seconds, len(m.proto.variables), slowdown)
    if len(m.proto.variables) <= PRESOLVE_MAX_VARS:
        solver.parameters.cp_model_presolve = True  # a proof, not a first solution: presolve is what bounds it
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return []
    if solver.best_objective_bound >= hinted_cost:
        return None
    found = list(solver.response_proto.solution)
    return found if solver.objective_value < hinted_cost else []


def _most_moves(built: Built) -> int:
    m = built.model
    return sum(int(list(m.proto.variables[v.index].domain)[-1]) for v in built.move)


MOVE_SCALE = 1 << 13  # > every move of one model (MOVE_BUDGET pods)
MOVE_FREE_SHARE = 0.7  # of tier 1's time: first without moves (the moves widen the search where none is
# needed), then with them from that solution


def _without_moves(solver: cp_model.CpSolver, built: Built, cfg: Solver,
                   seconds: float, slowdown: float = 1.0) -> tuple[list[int], float] | None:
    """Solve tier 1 with every move held at 0, then hint the full model with that solution (moves at 0): the
    search with moves starts from the best plan that needs none. Returns that solution and its tier-1 value."""
    m = built.model
    domains = [list(m.proto.variables[v.index].domain) for v in built.move]  # [lo, hi] each
    for v in built.move:
        m.proto.variables[v.index].domain[1] = 0
    _params(solver, cfg, seconds, len(m.proto.variables), slowdown)
    status = solver.solve(m)
    for v, dom in zip(built.move, domains, strict=True):
        m.proto.variables[v.index].domain[1] = dom[1]
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    values = list(solver.response_proto.solution)
    _hint_all(m, values)
    return values, float(solver.value(built.value))


def _hint_all(m: cp_model.CpModel, values: list[int]) -> None:
    """Replace the model's hint by a complete solution (every variable, in index order)."""
    m.clear_hints()  # type: ignore[no-untyped-call]  # (ortools declares it without annotations)
    m.proto.solution_hint.vars.extend(range(len(values)))
    m.proto.solution_hint.values.extend(values)


def solve_weighted(built: Built, cfg: Solver, seconds: float, report: Send | None = None,
                        slowdown: float = 1.0) -> SolveResult:
    start = time.perf_counter()
    w = cfg.objective
    m = built.model
    m.maximize(built.value * max(1, w.placement_weight // 1000) + built.packing * w.packing_weight
               - built.eviction_cost * max(1, w.eviction_weight // 1000))
    solver = cp_model.CpSolver()
    _params(solver, cfg, seconds, len(m.proto.variables), slowdown)
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(STATUS.get(status, "UNKNOWN"), [], 0.0, 0.0, 0.0, time.perf_counter() - start)
    values = list(solver.response_proto.solution)
    return SolveResult(STATUS[status], values, solver.objective_value, solver.best_objective_bound,
                       float(solver.value(built.value)), time.perf_counter() - start)


def _solve(send: Send, built: Built, cfg: Solver, seconds: float, slowdown: float) -> SolveResult:
    """The solver worker: each result as it comes (the tier-1 one first), the final one returned."""
    solve = solve_lexicographic if cfg.objective.mode == "lexicographic" else solve_weighted
    return solve(built, cfg, seconds, report=send, slowdown=slowdown)


def run_with_watchdog(built: Built, cfg: Solver, seconds: float, grace: float = 0.15,
                      slowdown: float = 1.0) -> SolveResult | None:
    """Solve in a forked worker (kai_opt.formulation.child); kill it if it is not done after `seconds` + grace.
    The latest result it sent (the tier-1 solution once known), or None when it sent nothing in time. A worker that
    raised or died (signal, out of memory) gives a result with `failure` set, keeping the tier-1 solution if it sent
    one. It dies with the process that forked it (the CP-SAT worker, killed by its own watchdog)."""
    limit = seconds + grace if not cfg.deterministic else max(seconds * 40, 30.0)
    start = time.perf_counter()
    sent: list[SolveResult] = []
    ended = run_in_child(_solve, (built, cfg, seconds, slowdown), deadline=start + limit, on_message=sent.append,
                         die_with_parent=True)
    if ended.ok:
        return ended.value
    latest = sent[-1] if sent else None
    if ended.failure == "timeout":
        return latest  # overran: the latest result (or None) stands, as the budget rules
    if ended.failure == "crash":
        note = f"the solver worker died ({ended.detail})"
    else:
        note = f"the solver worker {'raised ' if ended.trace is not None else ''}{ended.detail}"
    if latest is not None and latest.values:
        return dataclasses.replace(latest, note=note, failure=ended.failure)  # tier 1 stays
    return SolveResult("CRASH" if ended.failure == "crash" else "ERROR", [], 0.0, 0.0, 0.0,
                       time.perf_counter() - start if ended.failure == "crash" else 0.0, note, failure=ended.failure)
