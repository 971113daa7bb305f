"""The CP-SAT engine's fragmentation tie-break (formulation/packing.py): between plans placing the same pods for the
same eviction cost, the FGD-scored plan stands in for the KAI-scored one only when it leaves less fragmented GPU
share; and a late second hint is computed in the worker when that is cheap."""

from __future__ import annotations

import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation import second_hint, solve
from kai_opt.formulation.packing import PlanFragmentation, less_fragmented
from kai_opt.heuristics.cycle import greedy_plan


def _stranding_objects():
    # a: 2 GPUs and 4 CPUs, b: 2 GPUs and 64 CPUs; one running 1-GPU pod (2 CPUs) on b, so the workload has a GPU
    # shape; pending: a CPU-only pod of 4 CPUs. KAI's bin-pack sends it to a (fewest free CPUs): a's 2 GPUs are left
    # without CPU for the GPU shape. FGD scoring sends it to b. Both plans place the same pod.
    objs = [node("a", gpus=2, cpu="4"), node("b", gpus=2, cpu="64"), queue("q", gpu=(4, 1, -1))]
    objs += [podgroup("r", "q"), pod("r-0", group="r", gpus=1, cpu="2", node_name="b")]
    objs += [podgroup("c", "q", created_min=1), pod("c-0", group="c", cpu="4")]
    return objs


def _stranding_cluster():
    return state(_stranding_objects())


def test_the_less_fragmented_fgd_plan_stands_in_for_an_equal_kai_plan() -> None:
    st = _stranding_cluster()
    config = parse_config({"engine": "cpsat"})
    fs = compute_fair_share(st)
    kai = greedy_plan(st, fs, config)
    fgd = second_hint.compute(st, fs, config, None)
    assert fgd is not None
    node_of = {x: st.node_names[next(p.node for p in plan.placements)] for x, plan in (("kai", kai), ("fgd", fgd))}
    assert node_of == {"kai": "a", "fgd": "b"}
    pf = PlanFragmentation(st, fs, config)
    # shapes: the 1-GPU pod and the CPU-only pod (p = 1/2 each; every free GPU is fragmentation for the latter):
    # KAI's plan strands a's 2 GPUs for the GPU shape too (2 + 1/2 GPUs), FGD's leaves 1 + 1/2. The balance (2
    # CPUs per GPU; half of |free CPU - 2 x free GPU| / 2 per node): KAI's a 0 CPUs for 2 GPUs (2 GPUs) and b 62
    # for 1 (30), FGD's a 4 for 2 (0) and b 58 for 1 (28). No share sizes: every device's fill cost is 0 (idle or
    # full). So 2.5 + 16 against 1.5 + 14 GPUs
    assert pf.of(kai) == 18500 and pf.of(fgd) == 15500
    assert less_fragmented(st, fs, config, fgd, kai) == (15.5, 18.5)
    assert less_fragmented(st, fs, config, kai, fgd) is None
    assert "fill cost 15.5 vs 18.5" in solve.second_hint_note(st, fs, kai, fgd, config)
    assert solve.second_hint_note(st, fs, kai, fgd) == ""  # without a config: the primary objective only
    assert solve.second_hint_note(st, fs, kai, kai, config) == ""  # equal fragmentation keeps the KAI-scored plan


def test_the_cpsat_engine_takes_the_less_fragmented_plan() -> None:
    st = _stranding_cluster()
    for deterministic in (True, False):
        config = parse_config({"engine": "cpsat", "solver": {"deterministic": deterministic, "time_budget_s": 2}})
        plan, _ = run_cycle(st, config, engine=Engine.cpsat)
        assert plan.solver.hint == "fgd", plan.solver
        assert [st.node_names[p.node] for p in plan.placements] == ["b"]
        greedy, _ = run_cycle(st, config, engine=Engine.greedy)  # the greedy engine stays KAI's bin-pack
        assert [st.node_names[p.node] for p in greedy.placements] == ["a"]


def test_a_late_cheap_second_hint_is_computed_in_the_worker(monkeypatch) -> None:
    st = _stranding_cluster()
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": 2}})
    monkeypatch.setattr(second_hint.SecondHint, "ready", lambda self: False)  # never ready for the worker
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert plan.solver.hint == "fgd" and "started from the greedy plan with FGD scoring" in (plan.solver.note or "")
    # not cheap (a budget too small for SLOWDOWN x the KAI-scored cycle): the worker does not compute it
    greedy = greedy_plan(st, compute_fair_share(st), config)
    greedy.phases = {"allocate": 1.0}
    assert solve._inline_is_cheap(config, greedy) is False
    greedy.phases = {"allocate": 0.01, "fair_share": 5.0}
    assert solve._inline_is_cheap(config, greedy) is True


@pytest.mark.usefixtures("fork_early")
def test_an_unbeatable_cycle_uses_its_free_budget_for_the_fgd_plan(monkeypatch) -> None:
    # the greedy plan places the one pending pod without evictions: no model runs, so the budget is free for the
    # FGD-scored plan even when it is neither ready nor cheap by the worker's rule (INLINE_SHARE of the budget)
    st = _stranding_cluster()
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": 2}})
    monkeypatch.setattr(second_hint.SecondHint, "ready", lambda self: False)
    monkeypatch.setattr(solve, "INLINE_SHARE", 0.0)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert plan.solver.status == "GREEDY_KEPT" and "the model was not run" in (plan.solver.note or "")
    assert plan.solver.hint == "fgd" and [st.node_names[p.node] for p in plan.placements] == ["b"]
    # too slow to compute here in the time left: the plan computed beside is waited for until the deadline
    monkeypatch.setattr(solve, "_inline_is_cheap", lambda *_a: False)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert plan.solver.hint == "fgd" and [st.node_names[p.node] for p in plan.placements] == ["b"]


def test_the_time_no_model_needs_bounds_the_inline_fgd_plan() -> None:
    st = _stranding_cluster()
    config = parse_config({"engine": "cpsat", "solver": {"time_budget_s": 1}})
    greedy = greedy_plan(st, compute_fair_share(st), config)
    greedy.phases = {"allocate": 0.2}  # SLOWDOWN x 0.2 s: above a quarter of the budget, within 0.5 s
    assert solve._inline_is_cheap(config, greedy) is False
    assert solve._inline_is_cheap(config, greedy, 0.5) is True
    assert solve._inline_is_cheap(config, greedy, 0.3) is False


def test_a_short_cycle_forks_nothing_and_computes_the_fgd_plan_inline(monkeypatch) -> None:
    # pending groups x nodes below engine.FORK_EARLY_WORK: neither the second hint nor the worker is forked at the
    # cycle start; the unbeatable plan still gets the FGD-scored tie-break, computed in the engine's process
    from kai_opt import engine

    st = _stranding_cluster()
    assert not engine.fork_early(st)
    started: list[str] = []
    monkeypatch.setattr(second_hint.SecondHint, "start", classmethod(lambda cls, *a: started.append("hint")))
    monkeypatch.setattr(solve, "prepare_worker", lambda *a: started.append("worker"))
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": 2}})
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert started == []
    assert plan.solver.status == "GREEDY_KEPT" and "the model was not run" in (plan.solver.note or "")
    assert plan.solver.hint == "fgd" and [st.node_names[p.node] for p in plan.placements] == ["b"]
    monkeypatch.setattr(engine, "FORK_EARLY_WORK", 0)  # long: what allocate leaves decides, and it leaves nothing
    # a model could place (the plan is unbeatable), so nothing is forked and the FGD-scored plan is computed here
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert started == []
    assert plan.solver.hint == "fgd" and [st.node_names[p.node] for p in plan.placements] == ["b"]
    monkeypatch.setattr(engine, "FORK_AT_START_WORK", 0)  # too long to compute it here: forked at the start; the
    # worker is not (the plan is unbeatable)
    run_cycle(st, config, engine=Engine.cpsat)
    assert started == ["hint"]


def test_a_long_cycle_forks_its_worker_once_allocate_leaves_work(monkeypatch) -> None:
    # a pending pod no node holds: after allocate the plan may be beatable, so the worker of a long cycle is forked
    # then, before the later actions, and runs the model with the greedy plan; the second hint is forked just before
    # it (not at the cycle start: a cycle shorter than engine.FORK_AT_START_WORK)
    from kai_opt import engine
    from kai_opt.heuristics import cycle

    st = state([*_stranding_objects(), podgroup("big", "q", created_min=2), pod("big-0", group="big", gpus=4)])
    events: list[str] = []
    real_prepare = solve.prepare_worker
    real_start = second_hint.SecondHint.start.__func__

    def spy(*a):
        events.append("worker")
        return real_prepare(*a)

    def spy_hint(cls, *a):
        events.append("hint")
        return real_start(cls, *a)

    monkeypatch.setattr(solve, "prepare_worker", spy)
    monkeypatch.setattr(second_hint.SecondHint, "start", classmethod(spy_hint))
    for action in cycle.REGISTRY:
        monkeypatch.setattr(action, "run", (lambda run, name: lambda ctx: (events.append(name), run(ctx))[1])(
            action.run, action.name))
    monkeypatch.setattr(engine, "FORK_EARLY_WORK", 0)
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": 2}})
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert events[:4] == ["allocate", "hint", "worker", "consolidate"]
    assert events.count("worker") == 1 and events.count("hint") == 1
    assert "the model was not run" not in (plan.solver.note or "") and plan.solver.status != "FALLBACK_GREEDY"


def test_a_short_cycle_that_runs_the_model_starts_the_fgd_plan_beside_it(monkeypatch) -> None:
    # a pending pod no node holds (not refused by its queue): the plan is not unbeatable, the model runs; nothing
    # was forked at the cycle start, so the second hint is started then, beside the model, and weighed at the end
    st = state([*_stranding_objects(), podgroup("big", "q", created_min=2), pod("big-0", group="big", gpus=4)])
    started: list[str] = []
    real_start = second_hint.SecondHint.start.__func__

    def spy(cls, *a):
        started.append("hint")
        return real_start(cls, *a)

    monkeypatch.setattr(second_hint.SecondHint, "start", classmethod(spy))
    monkeypatch.setattr(solve, "prepare_worker", lambda *a: started.append("worker"))
    config = parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": 2}})
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert started == ["hint"]
    assert "the model was not run" not in (plan.solver.note or "")
    assert [st.node_names[p.node] for p in plan.placements] == ["b"]  # the FGD-scored plan's choice
