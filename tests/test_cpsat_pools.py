"""Shape pools: interchangeable pending pods of different groups share the model's per-node variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_opt.bench.instances import Instance
from kai_opt.checker import check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.formulation.scope import _shape_key, subgroup_domains
from kai_opt.formulation.solve import model_scope
from kai_opt.state import build_state

CONFIG = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 2, "seed": 0}})


@pytest.mark.parametrize(("family", "nodes"), [("fragmentation", 100), ("contention", 100), ("topology", 60),
                                               ("fractions", 60)])
def test_pools_partition_the_shapes_into_interchangeable_pods(family: str, nodes: int) -> None:
    st = build_state(Instance(family, nodes, 0).snapshot())
    greedy, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    sess, scope = model_scope(st, fs, CONFIG, greedy)
    members = sorted(s for pool in scope.pools for s in pool.shapes)
    assert members == list(range(len(scope.shapes)))
    assert sorted(c for pool in scope.pools for c in pool.movers) == list(range(len(scope.movers)))
    required = {i for g in scope.groups if g.topology >= 0 and g.required_level >= 0 for i in g.shapes}
    for pool in scope.pools:
        pods = [scope.shapes[s].pods[0] for s in pool.shapes] + [p for c in pool.movers for p in scope.movers[c].pods]
        keys = {_shape_key(sess, p)[1:] for p in pods}
        assert keys == {_shape_key(sess, pool.pod)[1:]}, pool  # same requests, GPU needs and scheduling signature
        assert all(scope.shapes[s].nodes is pool.nodes for s in pool.shapes)  # one candidate list
        if any(s in required for s in pool.shapes):
            assert len(pool.shapes) == 1 and not pool.movers  # a required topology domain belongs to one group
    if family == "fragmentation":
        assert len(scope.pools) < len(scope.shapes) / 5  # hundreds of identical single-pod gangs


def test_pooled_model_reaches_the_packing_the_greedy_misses() -> None:
    """fragmentation-300: about 200 identical gangs per shape. With one variable per (shape, node), each shape's
    24 candidate nodes were the same best-fitting ones and the model could only return the greedy plan (993 GPUs);
    pooled, every fitting node is a candidate. (The model alone: the pattern plan, which reaches that packing too,
    is off; tests/test_pattern_plan.py.)"""
    st = build_state(Instance("fragmentation", 300, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 2, "seed": 0,
                                                         "pattern_hint": False}})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)

    def gpus(p) -> float:
        return sum(float(st.pod_req[pl.pod, 2]) for pl in p.placements if not pl.moved) / 1000

    assert plan.solver is not None and plan.solver.status in ("OPTIMAL", "FEASIBLE"), plan.solver
    assert gpus(plan) > gpus(greedy) + 50, (gpus(plan), gpus(greedy))


def test_groups_with_a_subgroup_domain_stay_with_the_greedy(tmp_path) -> None:
    """The model keeps topology domains per group only: a pending group whose sub-group requires one is left to
    the greedy plan (the CP-SAT plan could place its pods anywhere; the checker then made the engine fall back)."""
    from kai_opt.loaders import load_snapshot

    text = (Path(__file__).resolve().parents[1] / "models/examples/topology.yaml").read_text()
    text = text.replace("        topology: {topology: datacenter, preferredLevel: example.com/rack}",
                        "        topology: {topology: datacenter, requiredLevel: example.com/rack}")
    path = tmp_path / "subgroup-rack.yaml"
    path.write_text(text)
    st = build_state(load_snapshot(path))
    g = st.pg_index["team-a/rl-agents"]
    greedy, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    _, scope = model_scope(st, fs, CONFIG, greedy)
    assert subgroup_domains(st)[g] and subgroup_domains(st).sum() == 1  # (also what keeps running pods in place)
    assert g in scope.excluded and g not in {gs.group for gs in scope.groups}
    assert any("sub-group" in n for n in scope.notes)
    plan, _ = run_cycle(st, CONFIG, engine=Engine.cpsat)
    check_plan(st, plan, fs, CONFIG)
