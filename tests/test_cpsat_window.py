"""The CP-SAT window: when the pending work exceeds what one model may decide under the budget, the pending groups
outside the model keep the greedy plan's decisions exactly (applied before the model, so it sees the room they
leave), and the window holds the work a better plan can come from."""

from __future__ import annotations

import numpy as np
import pytest

from kai_opt.config import Config
from kai_opt.engine import greedy_plan
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation import scope as scope_mod
from kai_opt.formulation.solve import _cpsat_plan, model_scope
from kai_opt.state import build_state


def _scale_state():
    from models.generators import as_snapshot, scale

    return build_state(as_snapshot(scale(300, 3000, 300, 0)))


def _cfg(max_pods: int) -> Config:
    return Config.model_validate({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 2.0,
                                                                "max_model_pods": max_pods, "fgd_hint": False}})


def test_groups_outside_the_window_keep_the_greedy_decisions() -> None:
    state = _scale_state()
    cfg = _cfg(60)
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, cfg)
    sess, scope = model_scope(state, fs, cfg, greedy)
    outside = set(scope.excluded)
    inside = {gs.group for gs in scope.groups}
    assert outside and inside and not outside & inside
    assert sum(len(s.pods) for s in scope.shapes) <= 60
    want = {pl.pod: (pl.node, tuple(pl.devices), pl.pipelined) for pl in greedy.placements
            if not pl.moved and int(state.pod_pg[pl.pod]) in outside}
    assert want  # the greedy placed some of the work outside the window
    got = {p: (pl.node, tuple(pl.devices), pl.pipelined) for p, pl in sess.placements.items()
           if int(state.pod_pg[p]) in outside}
    assert got == want
    evicted_for_outside = {e.pod for e in greedy.evictions if e.beneficiary in outside}
    assert set(sess.evictions) >= evicted_for_outside


def test_a_windowed_plan_passes_the_checker_and_keeps_the_rest_of_the_greedy_plan() -> None:
    state = _scale_state()
    cfg = _cfg(60)
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, cfg)
    plan = _cpsat_plan(state, fs, cfg, greedy=greedy)
    assert plan.solver is not None
    assert "checker" not in plan.solver.note and "decode failed" not in plan.solver.note
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT")
    placed = {int(state.pod_pg[pl.pod]) for pl in greedy.placements if not pl.moved}
    now = {int(state.pod_pg[pl.pod]) for pl in plan.placements if not pl.moved}
    assert placed <= now  # every group the greedy placed is still placed


def test_the_window_takes_what_the_greedy_left_pending_first() -> None:
    eligible = list(range(10))  # queue order
    pending = {g: np.arange(10) for g in eligible}
    placed = {g: 10 for g in range(6)}  # the greedy placed 0..5, left 6..9 pending
    chosen = scope_mod._window(eligible, pending, placed, set(), 40, 100)  # type: ignore[arg-type]
    assert chosen == [4, 5, 6, 7]  # two it left pending (half the window), then the last two it placed
    assert scope_mod._window(eligible, pending, placed, set(), 1000, 100) == eligible  # everything fits: everything
    assert 0 in scope_mod._window(eligible, pending, placed, {0}, 20, 100)  # the groups that must be in, are


def test_the_window_caps_groups_too() -> None:
    eligible = list(range(50))  # one-pod groups: the pod cap alone would take them all
    pending = {g: np.arange(1) for g in eligible}
    placed = {g: 1 for g in range(30)}
    chosen = scope_mod._window(eligible, pending, placed, set(), 1000, 12)  # type: ignore[arg-type]
    assert len(chosen) == 12 and chosen == sorted(chosen)
    assert set(range(30, 36)) <= set(chosen)  # half of it what the greedy left pending, highest-ranked first
    assert scope_mod._window(eligible, pending, placed, set(), 1000, 50) == eligible
    small = Config.model_validate({"solver": {"time_budget_s": 1.0}})
    large = Config.model_validate({"solver": {"time_budget_s": 10.0}})
    assert scope_mod.window_groups(small) < scope_mod.window_groups(large)


def test_the_window_scales_with_the_budget() -> None:
    small = Config.model_validate({"solver": {"time_budget_s": 1.0}})
    large = Config.model_validate({"solver": {"time_budget_s": 30.0}})
    assert scope_mod.window_pods(small) < scope_mod.window_pods(large) == large.solver.max_model_pods
    assert scope_mod.pair_budget(small) < scope_mod.pair_budget(large)
    assert scope_mod.move_budget(small) < scope_mod.move_budget(large)


def test_the_model_shrinks_with_the_fixed_work_of_a_large_greedy_plan() -> None:
    cfg = Config.model_validate({"solver": {"time_budget_s": 1.0}})
    small, large = 500, 7_000  # greedy decisions (the 10,000-node scale instance has about 6,700)
    assert scope_mod.window_pods(cfg, large) < scope_mod.window_pods(cfg, small) <= scope_mod.window_pods(cfg)
    assert scope_mod.pair_budget(cfg, large) < scope_mod.pair_budget(cfg, small)
    assert scope_mod.move_budget(cfg, large) < scope_mod.move_budget(cfg, small)
    assert scope_mod.model_seconds(cfg, 10**9) == 0.1  # never below a tenth of the budget


@pytest.mark.parametrize("family", ["contention", "gangs", "openb"])
def test_every_victim_unit_may_serve_the_group_the_greedy_evicted_it_for(family: str) -> None:
    """Each victim unit has its own beneficiaries: two units of one group evicted for the same group both name it
    (the units once shared one dict, and the second unit lost the beneficiary: an infeasible hint)."""
    from kai_opt.bench.instances import Instance

    config = Config.model_validate({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 1}})
    checked = 0
    for seed in range(3):
        st = build_state(Instance(family, 200, seed).snapshot())
        fs = compute_fair_share(st)
        greedy = greedy_plan(st, fs, config)
        _sess, scope = model_scope(st, fs, config, greedy)
        index = {gs.group: i for i, gs in enumerate(scope.groups)}
        evicted = {e.pod: e for e in greedy.evictions}
        assert len({id(v.reason_for) for v in scope.victims}) == len(scope.victims)
        for v in scope.victims:
            for p in v.pods:
                e = evicted[p]
                if e.reason in ("reclaim", "preempt") and e.beneficiary in index:
                    assert index[e.beneficiary] in v.beneficiaries
                    checked += 1
    assert checked > 0


def test_victim_units_of_one_group_do_not_share_their_beneficiaries() -> None:
    from kai_opt.bench.instances import Instance
    from kai_opt.state import PodStatus

    config = Config.model_validate({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 1}})
    st = build_state(Instance("fractions", 100, 0).snapshot())
    fs = compute_fair_share(st)
    sess, scope = model_scope(st, fs, config, greedy_plan(st, fs, config))
    running = set(np.flatnonzero(sess.status == PodStatus.BOUND).tolist())
    units = scope_mod._victims(sess, scope.groups, running)  # every running pod a candidate: many units per group
    by_group: dict[int, list] = {}
    for v in units:
        by_group.setdefault(v.group, []).append(v)
    several = [vs for vs in by_group.values() if len(vs) > 1]
    assert several
    for vs in several:
        assert len({id(v.reason_for) for v in vs}) == len(vs)


def test_decisions_outside_the_window_keep_the_evictions_their_pipelined_pods_run_on() -> None:
    # contention-200-s0 with a 100-pod window: a group outside the window has a pod pipelined on a node where the
    # greedy evicted for a group inside it. That group now keeps its greedy decisions too (scope.relied_on), so the
    # fixed decisions alone fit every node once releases finish; before, its evictions were the model's to drop
    # under the pipelined pod (at 10,000 nodes the model's plan then failed the checker: a node over its GPUs)
    from kai_opt.bench.instances import Instance

    state = build_state(Instance("contention", 200, 0).snapshot())
    cfg = _cfg(100)
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, cfg)
    sess, scope = model_scope(state, fs, cfg, greedy)
    outside = set(scope.excluded)
    relied = scope_mod.relied_on(sess, greedy, set())  # (nothing outside: nothing relied on)
    assert relied == set()
    pipelined_on = {pl.node for pl in greedy.placements
                    if pl.pipelined and not pl.moved and int(state.pod_pg[pl.pod]) in outside}
    under = [e for e in greedy.evictions if e.beneficiary >= 0 and int(state.pod_node[e.pod]) in pipelined_on]
    assert under and set(sess.evictions) >= {e.pod for e in under}  # (some replayed before: consolidating moves)
    assert not ((sess.held - sess.alloc) > 1e-6).any()  # the fixed decisions fit on their own
    plan = _cpsat_plan(state, fs, cfg, greedy=greedy)
    assert plan.solver is not None and "checker" not in (plan.solver.note or "")


def test_the_window_counts_the_pods_evicted_for_a_group() -> None:
    """A group's victims cost the model an eviction variable each and the reclaim rule's rows: the pods the greedy
    evicted for it count VICTIM_WEIGHT pending pods each."""
    from collections import Counter

    eligible = list(range(10))
    pending = {g: np.arange(10) for g in eligible}
    placed = {g: 10 for g in range(6)}
    w = scope_mod.VICTIM_WEIGHT
    assert w > 1
    evicted_for = Counter({5: 10})  # the greedy evicted 10 pods for group 5
    # 40 pods: 6 and 7 (20, half the window), then 5 would cost 10 + 10w: left out; 4 and 3 come instead
    chosen = scope_mod._window(eligible, pending, placed, set(), 40, 100, evicted_for)  # type: ignore[arg-type]
    assert chosen == [3, 4, 6, 7]
    assert scope_mod._window(eligible, pending, placed, set(), 40, 100) == [4, 5, 6, 7]  # type: ignore[arg-type]
    # everything fits only when its victims do too
    assert scope_mod._window(eligible, pending, placed, set(), 100, 100, evicted_for) != eligible  # type: ignore[arg-type]
    assert scope_mod._window(eligible, pending, placed, set(), 100 + 10 * w, 100,  # type: ignore[arg-type]
                             evicted_for) == eligible


def test_a_scope_counts_its_groups_victims_in_the_window() -> None:
    """On the scale instance with a window that binds, the pods the model's groups had evicted for them (weighted)
    and their pending pods stay within the window's pods."""
    state = _scale_state()
    cfg = _cfg(60)
    fs = compute_fair_share(state)
    greedy = greedy_plan(state, fs, cfg)
    _sess, scope = model_scope(state, fs, cfg, greedy)
    inside = {gs.group for gs in scope.groups}
    evicted = sum(1 for e in greedy.evictions if e.beneficiary in inside)
    pending = sum(len(s.pods) for s in scope.shapes)
    assert evicted and scope_mod.VICTIM_WEIGHT > 1  # (the rule is exercised)
    assert pending + scope_mod.VICTIM_WEIGHT * evicted <= 60
