"""Consolidation inside the CP-SAT model: running preemptible pods moved to make room, under the config's rules."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as hst

from kai_opt.bench.instances import Instance
from kai_opt.checker import check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.state import build_state

SOLVER = {"deterministic": True, "time_budget_s": 2, "seed": 0}


def _run(extra: dict | None = None):
    config = parse_config({"engine": "cpsat", "solver": SOLVER, **(extra or {})})
    st = build_state(Instance("topology", 60, 0).snapshot())  # racks fragmented by small running jobs
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    return st, greedy, plan


def _gpus(st, plan) -> float:
    return sum(float(st.pod_req[pl.pod, 2]) for pl in plan.placements if not pl.moved) / 1000


def _moved_groups(st, plan) -> set[int]:
    return {int(st.pod_pg[pl.pod]) for pl in plan.placements if pl.moved}


def test_moves_free_racks_for_topology_gangs() -> None:
    st, greedy, plan = _run()
    assert plan.solver is not None and plan.solver.status in ("OPTIMAL", "FEASIBLE"), plan.solver
    assert not any(pl.moved for pl in greedy.placements)  # the greedy consolidation found nothing here
    moved = [pl for pl in plan.placements if pl.moved]
    assert moved
    assert _gpus(st, plan) >= _gpus(st, greedy) + 64  # at least one more 8-node rack gang
    evictions = {e.pod: e for e in plan.evictions}
    placed = {int(st.pod_pg[pl.pod]) for pl in plan.placements if not pl.moved}
    for pl in moved:
        e = evictions[pl.pod]
        assert e.reason == "consolidate" and e.beneficiary in placed
        assert st.pg_preemptible[e.beneficiary] and st.pg_preemptible[int(st.pod_pg[pl.pod])]
        assert pl.node != int(st.pod_node[pl.pod])


def test_no_moves_when_consolidation_is_off() -> None:
    for extra in ({"max_consolidation_preemptees": 0}, {"actions": {"consolidate": False}}):
        _, _, plan = _run(extra)
        assert not any(pl.moved for pl in plan.placements), extra
        assert not any(e.reason == "consolidate" for e in plan.evictions), extra


def test_moved_groups_stay_within_the_preemptee_cap() -> None:
    st, _, plan = _run({"max_consolidation_preemptees": 1})
    placed = {int(st.pod_pg[pl.pod]) for pl in plan.placements if not pl.moved}
    served = {e.beneficiary for e in plan.evictions if e.reason == "consolidate"}
    assert served <= placed
    assert len(_moved_groups(st, plan)) <= len([g for g in placed if st.pg_preemptible[g]])


def test_plan_without_moves_is_kept_when_the_search_with_moves_finds_nothing(monkeypatch) -> None:
    """Tier 1 runs first with moves held at 0; if the search with moves then returns nothing in its time, the
    solution without moves is the tier-1 result (it used to be dropped: fallback to the greedy plan)."""
    from ortools.sat.python import cp_model

    from kai_opt.formulation import runner
    from kai_opt.formulation.hint import add_greedy_hint
    from kai_opt.formulation.model import build_model
    from kai_opt.formulation.solve import model_scope

    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    st = build_state(Instance("topology", 60, 0).snapshot())
    greedy, fs = run_cycle(st, config, engine=Engine.greedy)
    sess, scope = model_scope(st, fs, config, greedy)
    built = build_model(sess, scope)
    add_greedy_hint(built, scope, greedy, sess)
    assert built.move
    real = cp_model.CpSolver.solve
    calls: list[int] = []

    def solve(self, model, *args, **kwargs):
        calls.append(1)
        return cp_model.UNKNOWN if len(calls) == 2 else real(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "solve", solve)
    result = runner.solve_lexicographic(built, config.solver, 2.0)
    assert len(calls) == 3  # without moves, with moves (nothing), tiers 2-3
    assert result.values and result.status == "FEASIBLE" and result.value_tier > 0
    assert all(result.values[v.index] == 0 for v in built.move)


def test_moves_settle_no_eviction_loop() -> None:
    """Applied cycle after cycle (simulate), the moved pods land and nothing moves again."""
    from kai_opt.simulate import simulate

    config = parse_config({"engine": "cpsat", "solver": SOLVER})
    result = simulate(Instance("topology", 60, 0).snapshot(), config, 4, stop_when_settled=False)  # all 4 cycles
    evictions = [c.summary["evictions"] for c in result.cycles]
    assert evictions[0] > 0 and evictions[1:] == [0, 0, 0], evictions
    assert result.stable


def test_a_moved_pod_is_never_re_placed_on_its_own_node() -> None:
    """On a node decided device by device (GPU shares), a mover whose pool may place only on the mover's own node
    cannot move: infeasible (such a place would stand for the pod re-placed on other devices of its node, no
    move decode can carry out). On these instances, without the rule, the solver finds such a solution for some
    of them."""
    from ortools.sat.python import cp_model

    from kai_opt.formulation.model import build_model, is_share
    from kai_opt.formulation.solve import model_scope

    checked = 0
    for family, size in (("fractions", 100), ("openb", 200)):
        config = parse_config({"engine": "cpsat", "solver": SOLVER})
        st = build_state(Instance(family, size, 0).snapshot())
        greedy, fs = run_cycle(st, config, engine=Engine.greedy)
        sess, scope = model_scope(st, fs, config, greedy)
        built = build_model(sess, scope)
        shares = [c for c, mv in enumerate(scope.movers) if is_share(st, mv.pods[0])]  # (on device-level nodes)
        for c in shares[:6]:
            mv = scope.movers[c]
            if (mv.pool, mv.node) not in built.place:
                continue
            model = built.model.clone()
            model.add(model.get_int_var_from_proto_index(built.move[c].index) >= 1)
            for (k, n), v in built.place.items():
                if k == mv.pool and n != mv.node:
                    model.add(model.get_int_var_from_proto_index(v.index) == 0)
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = 10.0
            solver.parameters.num_workers = 1
            assert solver.solve(model) == cp_model.INFEASIBLE, (family, st.pods[mv.pods[0]].key)
            checked += 1
    assert checked >= 2


@settings(max_examples=300, deadline=None)
@given(hst.lists(hst.integers(0, 4), max_size=7), hst.lists(hst.integers(0, 4), max_size=9))
def test_moved_pods_get_other_nodes_whenever_a_choice_exists(own: list[int], slots: list[int]) -> None:
    """decode.move_targets finds nodes other than their own for every moved pod exactly when some choice exists
    (checked by brute force), each slot used once."""
    from itertools import permutations

    from kai_opt.formulation.decode import move_targets

    exists = len(own) <= len(slots) and any(all(slots[j] != o for j, o in zip(perm, own, strict=False))
                                            for perm in permutations(range(len(slots)), len(own)))
    got = move_targets(own, slots)
    assert (got is not None) == exists, (own, slots, got)
    if got is not None:
        assert all(n != o for n, o in zip(got, own, strict=True))
        assert not Counter(got) - Counter(slots)
