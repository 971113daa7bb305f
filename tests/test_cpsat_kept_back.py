"""The CP-SAT worker that keeps the greedy plan it was given sends back only its account (solve.KeptGiven): the
cycle's process puts it on its own copy of that plan, which it returns itself; a plan of the worker's own comes
back whole."""

from __future__ import annotations

from typing import Any

import pytest
from test_cpsat_hint_solution import CONFIG, _the_hint

from kai_opt.bench.instances import Instance
from kai_opt.engine import greedy_plan
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation import solve
from kai_opt.formulation.child import can_fork
from kai_opt.formulation.model import Built
from kai_opt.formulation.runner import SolveResult
from kai_opt.plan import Plan
from kai_opt.state import ClusterState, build_state


@pytest.fixture(scope="module")
def state() -> ClusterState:
    return build_state(Instance("fragmentation", 30, 0).snapshot())


def _solved_as_hint(built: Built, *_a: Any, **_k: Any) -> SolveResult:
    return SolveResult("FEASIBLE", _the_hint(built), 0.0, 0.0, 0.0, 0.01)


@pytest.mark.skipif(not can_fork(), reason="the worker runs in this process without fork")
def test_a_kept_plan_comes_back_as_the_cycles_own_object(state: ClusterState,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, CONFIG)
    decisions = (list(greedy.placements), list(greedy.evictions), dict(greedy.pending))
    monkeypatch.setattr(solve, "run_with_watchdog", _solved_as_hint)  # (the forked worker inherits it)
    plan = solve.cpsat_plan(state, fs, CONFIG, greedy=greedy)
    assert plan is greedy  # not a copy rebuilt from the worker's pickle
    assert plan.solver.status == "GREEDY_KEPT" and plan.engine == "cpsat"
    assert "the CP-SAT solution is its hint" in (plan.solver.note or "")
    assert (plan.placements, plan.evictions, plan.pending) == decisions


def test_a_plan_of_the_workers_own_comes_back_whole(state: ClusterState) -> None:
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, CONFIG)
    own = Plan(engine="cpsat")
    assert solve.taken_back(greedy, own) is own
    kept = solve.taken_back(greedy, solve.KeptGiven(own.solver))
    assert kept is greedy and kept.solver is own.solver and kept.engine == "cpsat"
