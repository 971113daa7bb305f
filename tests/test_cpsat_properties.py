"""Property tests of the CP-SAT engine on random clusters (fractions, gangs, topology, queues with limits), in the
deterministic mode: the checker never fires on a CP-SAT plan (the engine never had to fall back because its own
plan was invalid), and the plan returned is never worse than the greedy one on the primary objective."""

from __future__ import annotations

import pytest
from builders import snapshot
from hypothesis import HealthCheck, given, settings
from strategies import clusters

from kai_opt.bench.instances import Instance, families
from kai_opt.checker import check_plan
from kai_opt.config import Config, Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.formulation.solve import plan_score
from kai_opt.state import ClusterState, build_state

CONFIG = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 1, "seed": 0}})
# the model may drop groups the greedy placed: more freedom, so more ways for an encoding bug to show
FREE = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 1, "seed": 0,
                                                   "keep_greedy_groups": False}})
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(clusters())
def test_cpsat_plans_pass_the_checker_and_never_lose_to_greedy(objs: list) -> None:
    assert_valid_and_not_worse(build_state(snapshot(objs)))


@pytest.mark.parametrize("family", sorted(families()))
def test_cpsat_on_every_bench_family_passes_the_checker_and_never_loses(family: str) -> None:
    assert_valid_and_not_worse(build_state(Instance(family, 30, 0).snapshot()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_without_keeping_greedy_groups_plans_stay_valid_and_never_lose(objs: list) -> None:
    assert_valid_and_not_worse(build_state(snapshot(objs)), FREE)


@pytest.mark.parametrize("family", ["fragmentation", "topology", "contention"])
def test_without_keeping_greedy_groups_on_adversarial_families(family: str) -> None:
    assert_valid_and_not_worse(build_state(Instance(family, 30, 0).snapshot()), FREE)


@pytest.mark.parametrize(("instance", "window"), [(("gangs", 100, 1), 1), (("openb", 100, 0), 20),
                                                  (("contention", 100, 0), 5)])
def test_a_window_of_the_highest_ranked_work_stays_valid(instance: tuple, window: int) -> None:
    """solver.max_model_pods: groups beyond the window are left to the greedy fill, except those the greedy's
    replayed evictions were made for (these instances had reclaim and preempt victims without their beneficiary)."""
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 1, "seed": 0,
                                                         "max_model_pods": window}})
    assert_valid_and_not_worse(build_state(Instance(*instance).snapshot()), config)


def assert_valid_and_not_worse(state: ClusterState, config: Config = CONFIG) -> None:
    greedy, fs = run_cycle(state, config, engine=Engine.greedy)
    plan, _ = run_cycle(state, config, engine=Engine.cpsat)
    check_plan(state, plan, fs, config)
    info = plan.solver
    assert info is not None and info.status != "ERROR", info
    note = info.note or ""
    assert "failed the checker" not in note and "decode failed" not in note, note
    assert info.status not in ("INFEASIBLE", "MODEL_INVALID"), info
    ours, theirs = plan_score(state, fs, plan), plan_score(state, fs, greedy)
    assert ours[0] > theirs[0] or (ours[0] == theirs[0] and ours[1] <= theirs[1]), (ours, theirs, note)
    placed = {int(state.pod_pg[p.pod]) for p in plan.placements if not p.moved}
    for e in plan.evictions:
        assert e.reason == "stale-gang" or e.beneficiary in placed
