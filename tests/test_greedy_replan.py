"""A greedy plan the checker finds over capacity on some nodes is planned again once without them (engine.
_verified_greedy): one node the engine misjudges does not stop the scheduling of the rest; any other violation
still stops the cycle."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt import engine
from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.plan import FAILURE_STAGES, Placement, Plan


def _cluster() -> Any:
    return state([node("a", gpus=1), node("b", gpus=1), node("c", gpus=1), queue("q", gpu=(-1, 1, -1)),
                  pod("run", gpus=1, node_name="a", queue_name="q"),
                  podgroup("g", "q"), pod("g-0", group="g", gpus=1),
                  podgroup("h", "q", min_member=2), pod("h-0", group="h", gpus=1), pod("h-1", group="h", gpus=1)])


def _misjudging(monkeypatch: pytest.MonkeyPatch, spoil: Any) -> list[Any]:
    """engine.greedy_plan whose first plan of each cycle is spoilt by `spoil(state, plan)`; the states it got."""
    real = engine.greedy_plan
    seen: list[Any] = []

    def greedy(st: Any, *a: Any, **k: Any) -> Plan:
        seen.append(st)
        plan = real(st, *a, **k)
        if len(seen) % 2 == 1:
            spoil(st, plan)
        return plan

    monkeypatch.setattr(engine, "greedy_plan", greedy)
    return seen


def test_a_plan_over_a_nodes_capacity_is_made_again_without_that_node(monkeypatch: pytest.MonkeyPatch) -> None:
    st = _cluster()
    a = st.node_names.index("a")
    g0 = int(st.pod_index["default/g-0"])

    def onto_a(_st: Any, plan: Plan) -> None:  # g-0 onto a, whose GPU the running pod holds
        plan.placements = [Placement(g0, a, (0,)) if p.pod == g0 else p for p in plan.placements]

    for eng in (Engine.greedy, Engine.cpsat):
        seen = _misjudging(monkeypatch, onto_a)
        config = Config(engine=eng)
        plan, fs = run_cycle(st, config)
        check_plan(st, plan, fs, config)
        assert len(seen) == 2 and not seen[1].node_ok[a] and seen[1].node_ok.sum() == st.node_ok.sum() - 1
        assert a not in {p.node for p in plan.placements} and g0 in {p.pod for p in plan.placements}, eng
        assert ("greedy", "violation") in plan.solver.failures and "greedy" in FAILURE_STAGES
        assert "planned again without node(s) a" in (plan.solver.note or ""), plan.solver.note
        monkeypatch.undo()


def test_a_violation_that_names_no_node_still_stops_the_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    st = _cluster()
    h1 = int(st.pod_index["default/h-1"])

    def half_a_gang(_st: Any, plan: Plan) -> None:  # the gang h keeps one of its two pods: below its minimum
        plan.placements = [p for p in plan.placements if p.pod != h1]

    seen = _misjudging(monkeypatch, half_a_gang)
    with pytest.raises(PlanViolation) as exc:
        run_cycle(st, Config(engine=Engine.greedy))
    assert not exc.value.nodes and len(seen) == 1
