"""The greedy plan is a feasible solution of the CP-SAT model: every variable fixed to its hinted (greedy) value, the
model must be FEASIBLE. A failure is an encoding bug (the model forbids something the KAI-like rules allow), and the
message names the constraints the hint breaks. Random clusters (fractions, gangs, topology, queues with limits) and
every benchmark family at a small size."""

from __future__ import annotations

import pytest
from builders import snapshot
from hypothesis import HealthCheck, given, settings
from ortools.sat.python import cp_model
from strategies import clusters

from kai_opt.bench.instances import Instance, families
from kai_opt.config import Config, parse_config
from kai_opt.engine import greedy_plan
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation.hint import add_greedy_hint, hint_violations
from kai_opt.formulation.model import build_model
from kai_opt.formulation.solve import model_scope
from kai_opt.state import ClusterState, build_state

CONFIG = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 5, "seed": 0}})


def assert_hint_feasible(state: ClusterState, config: Config = CONFIG) -> None:
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, config)
    sess, scope = model_scope(state, fs, config, greedy)
    if not scope.groups:
        return
    built = build_model(sess, scope)
    add_greedy_hint(built, scope, greedy, sess)
    broken = hint_violations(built.model)
    assert not broken, "\n".join(broken[:10])
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.fix_variables_to_their_hinted_value = True
    p.num_workers = 1
    p.random_seed = 0
    p.max_deterministic_time = 30.0
    status = solver.solve(built.model)
    assert status in (cp_model.OPTIMAL, cp_model.FEASIBLE), solver.status_name(status)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_greedy_plan_is_a_solution_of_the_model_on_random_clusters(objs: list) -> None:
    assert_hint_feasible(build_state(snapshot(objs)))


@pytest.mark.parametrize("family", sorted(families()))
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_plan_is_a_solution_of_the_model_on_every_bench_family(family: str, seed: int) -> None:
    state = build_state(Instance(family, 30, seed).snapshot())
    assert_hint_feasible(state)
