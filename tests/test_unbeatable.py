"""A greedy plan that evicts nothing and leaves pending only groups no plan can place (formulation/unbeatable.py):
the CP-SAT engine does not run its model for it, and a group refused only because of this cycle's other
placements keeps the model in play."""

from __future__ import annotations

from builders import node, pod, podgroup, queue, state

from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation.unbeatable import hopeless_groups, unbeatable_note
from kai_opt.heuristics.cycle import greedy_plan

CONFIG = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 2}})


def _plan(objs):
    st = state(objs)
    fs = compute_fair_share(st)
    return st, fs, greedy_plan(st, fs, CONFIG)


def _group(st, name: str) -> int:
    return st.pg_keys.index(f"default/{name}")


def test_groups_over_a_limit_at_the_cycle_start_do_not_make_the_plan_beatable() -> None:
    objs = [node("n", gpus=8), queue("capped", gpu=(0, 1, 2)), queue("free", gpu=(0, 1, -1))]
    objs += [podgroup("big", "capped", min_member=4), *(pod(f"big-{i}", group="big", gpus=1) for i in range(4))]
    objs += [podgroup("small", "free"), pod("small-0", group="small", gpus=1)]
    st, fs, plan = _plan(objs)
    assert [st.pg_keys[g] for g in plan.pending] == ["default/big"]
    assert hopeless_groups(st, fs, CONFIG, [_group(st, "big")]) == {_group(st, "big")}
    note = unbeatable_note(st, fs, CONFIG, plan)
    assert "no plan without evictions places the other 4" in note
    out, _ = run_cycle(st, CONFIG, engine=Engine.cpsat)
    assert out.solver.status == "GREEDY_KEPT" and "the model was not run" in (out.solver.note or "")


def test_non_preemptible_work_over_its_quota_and_gangs_short_of_pods_are_hopeless() -> None:
    objs = [node("n", gpus=8), queue("q", gpu=(1, 1, -1))]
    objs += [podgroup("inf", "q", priority_class="inference"), pod("inf-0", group="inf", gpus=2)]
    objs += [podgroup("short", "q", min_member=3), pod("short-0", group="short", gpus=1)]
    st, fs, plan = _plan(objs)
    groups = sorted(plan.pending)
    assert {st.pg_keys[g] for g in groups} == {"default/inf", "default/short"}
    assert hopeless_groups(st, fs, CONFIG, groups) == set(groups)
    assert unbeatable_note(st, fs, CONFIG, plan) != ""


def test_a_group_refused_for_room_this_cycle_took_keeps_the_model_in_play() -> None:
    # the limit (4) holds either group at the cycle start; the greedy places the first and refuses the second, but
    # a plan placing the second instead exists, so the plan is not unbeatable
    objs = [node("n", gpus=8), queue("capped", gpu=(0, 1, 4))]
    objs += [podgroup("a", "capped", min_member=3), *(pod(f"a-{i}", group="a", gpus=1) for i in range(3))]
    objs += [podgroup("b", "capped", min_member=2, created_min=1),
             *(pod(f"b-{i}", group="b", gpus=1) for i in range(2))]
    st, fs, plan = _plan(objs)
    assert [st.pg_keys[g] for g in plan.pending] == ["default/b"]
    assert hopeless_groups(st, fs, CONFIG, [_group(st, "b")]) == set()
    assert unbeatable_note(st, fs, CONFIG, plan) == ""


def test_a_plan_with_evictions_is_never_unbeatable() -> None:
    objs = [node("n", gpus=2), queue("q", gpu=(2, 1, -1))]
    objs += [podgroup("low", "q"), pod("low-0", group="low", gpus=2, node_name="n")]
    objs += [podgroup("high", "q", priority_class="build"), pod("high-0", group="high", gpus=2)]
    st, fs, plan = _plan(objs)
    assert plan.evictions
    assert unbeatable_note(st, fs, CONFIG, plan) == ""
