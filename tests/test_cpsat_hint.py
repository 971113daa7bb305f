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
from kai_opt.snapshot import RawObject
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


def _preempt_after_reclaim() -> ClusterState:
    """Queue a holds 1 of its fair share of 3 GPUs. Its pending gang `p` (lower index, 2 pods x 1 GPU, only on node
    n1 where a's low-priority pod holds 1 of 2 GPUs) cannot reclaim there and later preempts; `r` (1 pod x 2 GPUs)
    reclaims one of b's pods first, when a's allocation is 1 + 2: the reclaim rule holds at r's turn, not with p's
    work counted."""
    from builders import node, pod, podgroup, queue

    objs = [node("n1", gpus=2, labels={"slot": "one"}), node("n2", gpus=4),
            queue("a", gpu=(3, 1, -1)), queue("b", gpu=(3, 1, -1)),
            podgroup("low", "a"), pod("low-0", "low", gpus=1, node_name="n1"),
            podgroup("b1", "b"), pod("b1-0", "b1", gpus=2, node_name="n2"),
            podgroup("b2", "b"), pod("b2-0", "b2", gpus=2, node_name="n2"),
            podgroup("p", "a", min_member=2, priority_class="build-preemptible"),
            pod("p-0", "p", gpus=1, nodeSelector={"slot": "one"}),
            pod("p-1", "p", gpus=1, nodeSelector={"slot": "one"}),
            podgroup("r", "a", priority_class="build-preemptible", created_min=1), pod("r-0", "r", gpus=2)]
    return build_state(snapshot(objs))


def test_plan_turns_are_the_decision_order_and_the_reclaim_row_counts_only_earlier_turns() -> None:
    state = _preempt_after_reclaim()
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, CONFIG)
    names = [state.pg_keys[g] for g in greedy.turns]
    reasons = {state.pods[e.pod].name: e.reason for e in greedy.evictions}
    assert names == ["default/r", "default/p"], names  # r reclaimed, then p preempted (p has the lower index)
    assert sorted(reasons.items()) == [("b1-0", "reclaim"), ("low-0", "preempt")] or \
        sorted(reasons.items()) == [("b2-0", "reclaim"), ("low-0", "preempt")], reasons
    assert_hint_feasible(state)


def test_reclaim_row_leaves_out_later_turns_of_groups_outside_the_model() -> None:
    """As above with a window that holds `r` alone (its pod and the pod evicted for it, VICTIM_WEIGHT pods; `p` would
    take 2 + VICTIM_WEIGHT): `p` keeps the greedy's decisions outside the model (its placement and its preempt
    eviction are in the model's session), yet r's reclaim row must not count them."""
    from kai_opt.formulation.scope import VICTIM_WEIGHT

    state = _preempt_after_reclaim()
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 5, "seed": 0,
                                                         "max_model_pods": 1 + VICTIM_WEIGHT}})
    fs = compute_fair_share(state)
    _sess, scope = model_scope(state, fs, config, greedy_plan(state, fs, config))
    assert [state.pg_keys[g] for g in scope.excluded] == ["default/p"]
    assert [state.pg_keys[g.group] for g in scope.groups] == ["default/r"]
    assert_hint_feasible(state, config)


def _gang_grown_then_reclaimed() -> ClusterState:
    """Hypothesis's shrunk failure (seed 7, 1,500 examples): j0 (min 1) runs j0-0 (0.25 GPU) on the one GPU node and
    allocate places its two pending 0.25 pods there; j2 (q2, 0.5 GPU) then reclaims. j0-0 is j0's core (its bound
    pods up to the minimum): it is no victim while j0 has pods placed this cycle, or the plan would evict a running
    pod of the job it grows (the model forbids a placed group's core going)."""
    from builders import node, pod, podgroup, queue

    topo = RawObject("Topology", {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": "rack"}]}})
    rack = {"topologyConstraint": {"topology": "t", "requiredTopologyLevel": "rack"}}
    objs = [node("n0", gpus=0, cpu="8", memory="32Gi", labels={"rack": "rack0"}),
            node("n1", gpus=1, cpu="8", memory="32Gi", labels={"rack": "rack0"}), topo,
            queue("dept", gpu=(-1, 1, -1)), queue("q0", "dept", gpu=(0, 0, -1)),
            queue("q1", "dept", gpu=(0, 0, -1), created_min=1),
            queue("q2", "dept", gpu=(0, 0, -1), priority=50, created_min=2),
            podgroup("j0", "q0"), pod("j0-0", "j0", gpus=0.25, node_name="n1", started_min_ago=1),
            pod("j0-1", "j0", gpus=0.25), pod("j0-2", "j0", gpus=0.25),
            podgroup("j1", "q0", created_min=1, **rack), pod("j1-0", "j1"),
            podgroup("j2", "q2", created_min=2, **rack), pod("j2-0", "j2", gpus=0.5)]
    return build_state(snapshot(objs))


def test_a_group_placed_this_cycle_keeps_its_core() -> None:
    state = _gang_grown_then_reclaimed()
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, CONFIG)
    placed = {state.pods[p.pod].name for p in greedy.placements}
    evicted = {state.pods[e.pod].name for e in greedy.evictions}
    assert {"j0-1", "j0-2"} <= placed and "j0-0" not in evicted, (placed, evicted)
    assert_hint_feasible(state)
