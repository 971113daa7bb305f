"""The pattern plan: a model over node classes and the patterns of pending shapes that fit them, decoded onto
nodes, as the CP-SAT model's starting plan (kai_opt/formulation/pattern_plan.py)."""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from kai_opt.bench.instances import Instance
from kai_opt.checker import check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.formulation import pattern_plan, second_hint, solve
from kai_opt.formulation.solve import plan_score
from kai_opt.heuristics.session import Session
from kai_opt.state import build_state
from models.generators import FAMILIES

SOLVER = {"deterministic": True, "time_budget_s": 2, "seed": 0}


def _placed_groups(st, plan) -> set[int]:
    return {int(st.pod_pg[p.pod]) for p in plan.placements if not p.moved}


def test_the_pattern_plan_escapes_the_traps_the_greedy_falls_into() -> None:
    """fragmentation-300: the greedy leaves 3-GPU pods without their 3-free nodes and 8-GPU pods without CPU; the
    nodes fall into a handful of classes, and the decoded plan places more, every greedy group included, each
    node's pods a pattern of its class."""
    st = build_state(Instance("fragmentation", 300, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    pm = pattern_plan.pattern_plan(st, fs, config, greedy, 1.0)
    alt = pm.plan
    assert alt is not None, pm.why
    check_plan(st, alt, fs, config)
    assert pm.classes <= 10 and 0 < pm.patterns <= 100 and pm.chosen
    assert _placed_groups(st, greedy) <= _placed_groups(st, alt)
    assert set(pm.chosen) <= _placed_groups(st, alt)
    assert plan_score(st, fs, alt)[0] > plan_score(st, fs, greedy)[0]
    assert not alt.evictions and alt.evictions == greedy.evictions


def test_queue_limits_bound_what_the_model_places() -> None:
    """A limit on the queue of the pending work: the model places no more than the limit lets it (the checker
    would refuse the plan otherwise)."""
    st = build_state(Instance("fragmentation", 100, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    sess = Session(st, fs, config)
    groups, kept = pattern_plan.eligible_groups(sess, greedy)
    leaves = {int(st.pg_queue[g]) for g in groups if g not in kept}
    q = next(iter(leaves))
    mine = [p for g in kept if int(st.pg_queue[g]) == q for p in groups[g].tolist()]
    placed = float(sess.queue_request(mine).sum(axis=0)[0]) if mine else 0.0
    fs.limit[q, 0] = float(sess.ledger.allocated[q, 0]) + placed  # GPUs: what the greedy gave q, nothing more
    fs.limit[q, 1:] = -1.0
    assert all(fs.limit[a, 0] == -1.0 for a in st.q_ancestors[q][1:])  # (q's own limit decides)
    pm = pattern_plan.pattern_plan(st, fs, config, greedy, 1.0)
    assert pm.plan is not None, pm.why
    check_plan(st, pm.plan, fs, config)
    added = {g for g in pm.chosen if int(st.pg_queue[g]) == q and st.pod_req[groups[g], 2].sum() > 0}
    assert not added, added


def test_the_engine_starts_from_it_and_the_option_turns_it_off() -> None:
    st = build_state(Instance("fragmentation", 300, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    assert plan.solver is not None and plan.solver.hint == "pattern", plan.solver
    assert "the pattern model's plan" in (plan.solver.note or "")
    assert plan_score(st, fs, plan)[0] > plan_score(st, fs, greedy)[0]
    off = parse_config({"engine": "cpsat", "solver": {**SOLVER, "pattern_hint": False}})
    plan_off, _ = run_cycle(st, off, engine=Engine.cpsat)
    assert plan_off.solver.hint != "pattern" and "pattern model" not in (plan_off.solver.note or "")


def test_work_placed_onto_released_room_or_for_evictions_stays_with_the_starting_plan() -> None:
    """The model decides only groups whose placement needs no room being released: a group the starting plan
    pipelines, or evicts for, keeps its decisions (applied before the classes are formed)."""
    st = build_state(Instance("contention", 100, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    fixed = {e.beneficiary for e in greedy.evictions} | {int(st.pod_pg[p.pod]) for p in greedy.placements
                                                          if p.pipelined and not p.moved}
    assert fixed  # (the instance's greedy plan reclaims)
    groups, kept = pattern_plan.eligible_groups(Session(st, fs, config), greedy)
    assert groups and not fixed & set(groups)
    assert kept <= set(groups) and kept == {g for g in groups if g in _placed_groups(st, greedy)}
    pm = pattern_plan.pattern_plan(st, fs, config, greedy, 1.0)
    assert pm.plan is None and "pending shapes" in pm.why  # (this instance's shapes are many)


def test_a_failing_pattern_stage_leaves_the_starting_plan(monkeypatch) -> None:
    st = build_state(Instance("fragmentation", 100, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})

    def boom(*_a, **_k):
        raise RuntimeError("boom")

    monkeypatch.setattr(solve, "pattern_plan", boom)
    plan, fs = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    assert ("pattern_hint", "exception") in plan.solver.failures
    assert plan.solver.hint != "pattern" and "boom" in plan.solver.note


def _fits(counts: np.ndarray, req: np.ndarray, whole: np.ndarray, cap: np.ndarray, idle: int) -> bool:
    return bool((counts @ req <= cap).all()) and int(counts @ whole) <= idle


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(0, 6), hs.integers(0, 3), hs.integers(1, 4)), min_size=1, max_size=3),
       hs.integers(0, 12), hs.integers(0, 4))
def test_the_patterns_are_the_maximal_fitting_multisets(shapes, cpu, idle) -> None:
    """Every enumerated pattern fits and no shape can be added to it; every fitting multiset lies below one."""
    req = np.array([[c, 0] for c, _, _ in shapes], dtype=np.int64)
    whole = np.array([w for _, w, _ in shapes], dtype=np.int64)
    demand = np.array([d for _, _, d in shapes], dtype=np.int64)
    cap = np.array([cpu, 0], dtype=np.int64)
    n = len(shapes)
    pats = pattern_plan._maximal_patterns(list(range(n)), req, whole, demand, cap, idle, 10_000)
    assert pats is not None
    seen = set()
    for p in pats:
        assert _fits(p, req, whole, cap, idle) and (p <= demand).all()
        for s in range(n):
            more = p.copy()
            more[s] += 1
            assert more[s] > demand[s] or not _fits(more, req, whole, cap, idle)
        seen.add(tuple(p.tolist()))
    assert len(seen) == len(pats)
    for counts in itertools.product(*(range(int(d) + 1) for d in demand)):
        c = np.array(counts, dtype=np.int64)
        if c.any() and _fits(c, req, whole, cap, idle):
            assert any((c <= p).all() for p in pats), c


def test_too_many_patterns_give_up() -> None:
    req = np.array([[1, 0]] * 6, dtype=np.int64)
    whole = np.zeros(6, dtype=np.int64)
    demand = np.full(6, 10, dtype=np.int64)
    assert pattern_plan._maximal_patterns(list(range(6)), req, whole, demand, np.array([10, 0]), 0, 50) is None


def test_without_the_consolidation_when_the_model_finds_room() -> None:
    """fragmentation-100-s1: the greedy consolidates (moves running pods) to place some groups; the pattern model
    finds them room without the moves, so its plan evicts nothing and places everything."""
    st = build_state(Instance("fragmentation", 100, 1).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    assert any(e.reason == "consolidate" for e in greedy.evictions)
    pm = pattern_plan.pattern_plan(st, fs, config, greedy, 1.0)
    assert pm.plan is not None and pm.moves_dropped, pm.why
    check_plan(st, pm.plan, fs, config)
    assert not pm.plan.evictions and not any(pl.moved for pl in pm.plan.placements)
    assert _placed_groups(st, greedy) <= _placed_groups(st, pm.plan)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_pattern_plan_passes_the_checker(family: str) -> None:
    """Whatever the starting plan (moves, evictions, pipelined pods, limits), a pattern plan that comes back is
    one the checker accepts and one that keeps the starting plan's groups."""
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    for nodes, seed in ((30, 0), (30, 1), (30, 2), (100, 0), (100, 2)):
        st = build_state(Instance(family, nodes, seed).snapshot())
        greedy, fs = run_cycle(st, config, engine=Engine.greedy)
        for start in (greedy, second_hint.compute(st, fs, config, None)):
            if start is None:
                continue
            pm = pattern_plan.pattern_plan(st, fs, config, start, 1.0)
            if pm.plan is not None:
                check_plan(st, pm.plan, fs, config)
                assert _placed_groups(st, start) <= _placed_groups(st, pm.plan), (family, nodes, seed)



def test_too_many_node_classes_give_up_before_the_replay(monkeypatch) -> None:
    """Nodes too unlike for classes to pay: the stage gives up on the cycle start's room, before it replays the
    starting plan's other decisions."""
    st = build_state(Instance("fragmentation", 100, 0).snapshot())
    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    monkeypatch.setattr(pattern_plan, "MAX_CLASSES", 2)
    replays = []
    monkeypatch.setattr(pattern_plan, "apply_fixed", lambda *a: replays.append(a))
    pm = pattern_plan.pattern_plan(st, fs, config, greedy, 1.0)
    assert pm.plan is None and "node classes (more than 2)" in pm.why and not replays


@settings(max_examples=150, deadline=None)
@given(rows=hs.integers(1, 60), cols=hs.integers(1, 4), top=hs.integers(0, 3), cap=hs.integers(1, 12),
       seed=hs.integers(0, 2**32 - 1))
def test_class_members_gate_is_exact(rows: int, cols: int, top: int, cap: int, seed: int) -> None:
    """The class count gate (hashed rows first, then the exact grouping) refuses exactly when the distinct (node
    class, fit) rows are more than MAX_CLASSES, and otherwise groups every node with room by its row."""
    rng = np.random.default_rng(seed)
    fit = rng.integers(0, top + 1, size=(rows, cols))
    node_class = rng.integers(0, 2, size=rows)
    free = np.zeros((rows, 2), dtype=np.int64)
    with mock.patch.object(pattern_plan, "MAX_CLASSES", cap):
        got = pattern_plan._class_members(type("St", (), {"node_class": node_class})(), free, fit)
    nodes = np.flatnonzero(fit.any(axis=1))
    distinct = {(int(node_class[n]), *fit[n].tolist()) for n in nodes.tolist()}
    if not len(nodes):
        assert got == "no node has room for any of the pending shapes"
    elif len(distinct) > cap:
        assert isinstance(got, str) and f"(more than {cap})" in got
    else:
        assert not isinstance(got, str)
        assert sorted(sorted(m.tolist()) for m in got) == sorted(
            sorted(n for n in nodes.tolist() if (int(node_class[n]), *fit[n].tolist()) == key) for key in distinct)
