"""A CP-SAT solution that is its hint (the starting plan's own decisions) keeps that plan without decoding and
checking it again (solve._is_the_hint); any other solution is decoded, checked and weighed as before."""

from __future__ import annotations

from typing import Any

import pytest

from kai_opt.bench.instances import Instance
from kai_opt.config import parse_config
from kai_opt.engine import greedy_plan
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation import solve
from kai_opt.formulation.model import Built
from kai_opt.formulation.runner import SolveResult
from kai_opt.state import ClusterState, build_state

CONFIG = parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": 5, "seed": 0,
                                                     "fgd_hint": False, "pattern_hint": False}})


@pytest.fixture(scope="module")
def state() -> ClusterState:
    return build_state(Instance("fragmentation", 30, 0).snapshot())  # the CP-SAT plan beats the greedy one


def _the_hint(built: Built) -> list[int]:
    """A complete solution: the hint, and every variable it leaves out at its fixed value."""
    proto = built.model.proto
    values = [int(v.domain[0]) for v in proto.variables]
    for i, x in zip(proto.solution_hint.vars, proto.solution_hint.values, strict=True):
        values[i] = int(x)
    return values


def _run(state: ClusterState, monkeypatch: pytest.MonkeyPatch, change: int | None) -> tuple[Any, list[int]]:
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, CONFIG)
    decoded: list[int] = []
    real_decode = solve.decode

    def solved(built: Built, *_a: Any, **_k: Any) -> SolveResult:
        values = _the_hint(built)
        if change is not None:  # one hinted decision another way: a gang placed or not
            gang = built.gang[change].index
            values[gang] = 1 - values[gang]
        return SolveResult("FEASIBLE", values, 0.0, 0.0, 0.0, 0.01)

    def decode(*a: Any, **k: Any) -> Any:
        decoded.append(1)
        return real_decode(*a, **k)

    monkeypatch.setattr(solve, "run_with_watchdog", solved)
    monkeypatch.setattr(solve, "decode", decode)
    plan = solve._cpsat_plan(state, fs, CONFIG, greedy=greedy)
    return (plan, greedy), decoded


def test_a_solution_that_is_its_hint_keeps_the_plan_undecoded(state: ClusterState,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (plan, greedy), decoded = _run(state, monkeypatch, None)
    assert plan is greedy and plan.solver.status == "GREEDY_KEPT" and plan.engine == "cpsat"
    assert "the CP-SAT solution is its hint" in plan.solver.note
    assert not decoded


def test_any_other_solution_is_decoded_and_weighed(state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    (plan, _greedy), decoded = _run(state, monkeypatch, 0)
    assert decoded
    assert "the CP-SAT solution is its hint" not in plan.solver.note
