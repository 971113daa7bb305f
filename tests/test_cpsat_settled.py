"""Once tier 1 is proved at the starting plan's own value, the plan choice takes the model's plan only if it evicts
less; when the least eviction cost is proved no lower than the starting plan's, the worker says so (settled) and
the cycle keeps its plan without tiers 2-3 and without decoding (runner._settled). Otherwise everything goes on as
before: a solution evicting less is found and returned, a model that places more is not asked."""

from __future__ import annotations

from typing import Any

import pytest
from ortools.sat.python import cp_model
from test_cpsat_hint_solution import CONFIG, state  # noqa: F401  (the module's instance fixture)

from kai_opt.config import parse_config
from kai_opt.engine import greedy_plan
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation import runner, solve
from kai_opt.formulation.hint import hinted_values
from kai_opt.formulation.model import Built
from kai_opt.formulation.runner import SolveResult
from kai_opt.state import ClusterState

SOLVER = parse_config({"solver": {"deterministic": True, "seed": 0}}).solver


def _model(hint: dict[str, int]) -> tuple[Built, dict[str, cp_model.IntVar]]:
    """One pod worth 10 that fits only once victim a goes (cost 5); victim b (cost 7) frees nothing it needs."""
    m = cp_model.CpModel()
    v = {name: m.new_bool_var(name) for name in ("x", "a", "b")}
    m.add(v["x"] <= v["a"])
    built = Built(model=m)
    built.value = 10 * v["x"]
    built.eviction_cost = 5 * v["a"] + 7 * v["b"]
    built.packing = 3 * v["x"]
    for name, value in hint.items():
        m.add_hint(v[name], value)
    return built, v


def _solve(built: Built) -> SolveResult:
    return runner.solve_lexicographic(built, SOLVER, 2.0)


def test_no_lower_eviction_cost_settles_the_cycle() -> None:
    built, _ = _model({"x": 1, "a": 1, "b": 0})
    result = _solve(built)
    assert result.settled and result.status == "OPTIMAL" and result.value_tier == 10
    assert "evicts no less" in result.note


def test_a_solution_evicting_less_is_returned_not_settled() -> None:
    built, v = _model({"x": 1, "a": 1, "b": 1})  # the starting plan evicts b for nothing
    result = _solve(built)
    assert not result.settled and result.value_tier == 10
    values = result.values
    assert (values[v["x"].index], values[v["a"].index], values[v["b"].index]) == (1, 1, 0)


def test_a_model_that_places_more_is_not_asked() -> None:
    built, v = _model({"x": 0, "a": 0, "b": 0})  # the starting plan leaves the pod pending
    result = _solve(built)
    assert not result.settled and result.value_tier == 10 and result.values[v["x"].index] == 1


def test_an_incomplete_hint_proves_nothing() -> None:
    built, v = _model({"x": 1, "a": 1})  # b not hinted: the starting plan's eviction cost is unknown
    assert hinted_values(built.model, built.value, built.eviction_cost) == [10, None]
    result = _solve(built)
    assert not result.settled and result.values[v["b"].index] == 0


def test_a_settled_answer_keeps_the_starting_plan_undecoded(state: ClusterState,  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, CONFIG)
    decisions = (list(greedy.placements), list(greedy.evictions), dict(greedy.pending))
    decoded: list[int] = []

    def settled(built: Built, *_a: Any, **_k: Any) -> SolveResult:
        return SolveResult("OPTIMAL", [0] * len(built.model.proto.variables), 1.0, 1.0, 1.0, 0.01,
                           "no plan of the model can be chosen", settled=True)

    monkeypatch.setattr(solve, "run_with_watchdog", settled)
    monkeypatch.setattr(solve, "decode", lambda *a, **k: decoded.append(1))
    plan = solve._cpsat_plan(state, fs, CONFIG, greedy=greedy)
    assert plan is greedy and plan.solver.status == "GREEDY_KEPT" and not decoded
    assert "no plan of the model can be chosen" in (plan.solver.note or "")
    assert plan.solver.decode_s == 0
    assert (plan.placements, plan.evictions, plan.pending) == decisions


def test_a_starting_plan_that_evicts_nothing_settles_without_a_search(monkeypatch: pytest.MonkeyPatch) -> None:
    solves: list[int] = []
    real = cp_model.CpSolver.solve
    monkeypatch.setattr(cp_model.CpSolver, "solve", lambda self, *a, **k: solves.append(1) or real(self, *a, **k))
    m = cp_model.CpModel()
    x, y = m.new_bool_var("x"), m.new_bool_var("y")
    m.add(x + y <= 1)  # one pod worth 10, room for one: nothing to evict for it
    built = Built(model=m)
    built.value, built.eviction_cost, built.packing = 10 * x + 10 * y, 5 * y, 0 * x
    m.add_hint(x, 1)
    m.add_hint(y, 0)
    result = _solve(built)
    assert result.settled and result.value_tier == 10
    assert len(solves) == 1  # tier 1 only
