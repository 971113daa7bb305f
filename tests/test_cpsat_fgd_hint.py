"""The second hint: the greedy engine with FGD scoring, used only when it keeps every group the KAI-scored plan
places, scores higher and evicts no more."""

from __future__ import annotations

import dataclasses

from kai_opt.bench.instances import Instance
from kai_opt.checker import check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.engine import greedy_plan, run_cycle
from kai_opt.formulation import second_hint, solve
from kai_opt.formulation.solve import plan_score
from kai_opt.state import build_state

SOLVER = {"deterministic": True, "time_budget_s": 3, "seed": 0}


def _state():
    return build_state(Instance("fragmentation", 200, 0).snapshot())  # FGD scoring dodges some of its traps


def _groups(st, plan) -> set[int]:
    return {int(st.pod_pg[p.pod]) for p in plan.placements if not p.moved}


def test_cpsat_starts_from_the_fgd_scored_plan_when_it_is_better() -> None:
    st = _state()
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    kai, fs = run_cycle(st, config, engine=Engine.greedy)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    assert plan.solver is not None and "started from the greedy plan with FGD scoring" in (plan.solver.note or "")
    fgd = greedy_plan(st, fs, parse_config({"engine": "greedy", "placement": {"gpu": "fgd", "cpu": "fgd"}}))
    assert plan_score(st, fs, plan)[0] >= plan_score(st, fs, fgd)[0] > plan_score(st, fs, kai)[0]
    assert _groups(st, kai) <= _groups(st, plan)

    off = parse_config({"engine": "cpsat", "solver": {**SOLVER, "fgd_hint": False}})
    plan_off, _ = run_cycle(st, off, engine=Engine.cpsat)
    assert "FGD scoring" not in (plan_off.solver.note or "")


def test_an_fgd_plan_that_drops_a_kai_group_is_not_used() -> None:
    st = _state()
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    kai, fs = run_cycle(st, config, engine=Engine.greedy)
    fgd = second_hint.compute(st, fs, config, None)
    assert fgd is not None
    gone = min(_groups(st, kai))  # a group the KAI-scored plan places
    dropping = dataclasses.replace(fgd, placements=[p for p in fgd.placements if int(st.pod_pg[p.pod]) != gone])
    assert solve.second_hint_note(st, fs, kai, dropping) == ""
    assert solve.second_hint_note(st, fs, kai, fgd)  # the undoctored FGD-scored plan is taken: the check above is
    # the drop
