"""A long cycle whose pending work asks for at most half the free room computes the FGD-scored plan first and
keeps it when it is unbeatable, without computing the KAI-scored plan (formulation/fgd_first.py); otherwise the
cycle goes as before."""

from __future__ import annotations

import pytest
from builders import node, pod, podgroup, queue, state
from test_cpsat_packing import _stranding_objects

from kai_opt import engine
from kai_opt.config import Engine, Strategy, parse_config
from kai_opt.engine import run_cycle
from kai_opt.formulation import fgd_first, second_hint
from kai_opt.heuristics import cycle


@pytest.fixture
def scored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(action, the GPU placement strategy of its session) for every action run, in order."""
    runs: list[tuple[str, str]] = []
    for action in cycle.REGISTRY:
        monkeypatch.setattr(action, "run", (lambda run, name: lambda ctx: (
            runs.append((name, ctx.sess.cfg.placement.gpu.value)), run(ctx))[1])(action.run, action.name))
    return runs


def _config(deterministic: bool = False):
    return parse_config({"engine": "cpsat", "solver": {"deterministic": deterministic, "time_budget_s": 2}})


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_long_cycle_that_fits_keeps_the_fgd_plan_computed_first(monkeypatch, scored, deterministic) -> None:
    st = state(_stranding_objects())
    monkeypatch.setattr(fgd_first, "FGD_FIRST_WORK", 0)
    said: list[str] = []
    plan, _ = run_cycle(st, _config(deterministic), engine=Engine.cpsat, progress=said.append)
    assert "greedy: allocate (FGD-scored, first)" in said  # a status line says what runs
    assert plan.solver.status == "GREEDY_KEPT" and plan.solver.hint == "fgd" and plan.engine == "cpsat"
    assert "computed first" in (plan.solver.note or "") and "KAI-scored plan" in (plan.solver.note or "")
    assert [st.node_names[p.node] for p in plan.placements] == ["b"]
    assert {s for _, s in scored} == {Strategy.fgd.value}  # no KAI-scored action ran
    assert "total" in plan.phases and "fair_share" in plan.phases


def test_a_short_cycle_computes_the_kai_scored_plan_first(scored) -> None:
    st = state(_stranding_objects())
    assert engine.placement_work(st) < fgd_first.FGD_FIRST_WORK
    plan, _ = run_cycle(st, _config(), engine=Engine.cpsat)
    assert scored[0] == ("allocate", Strategy.binpack.value)
    assert plan.solver.hint == "fgd" and "computed first" not in (plan.solver.note or "")  # the tie-break, as before


def test_pending_work_without_room_to_spare_is_not_tried_fgd_first(monkeypatch, scored) -> None:
    # a pending 2-GPU pod: 2 + 1 GPUs are free, more than half of it asked
    st = state([*_stranding_objects(), podgroup("big", "q", created_min=2), pod("big-0", group="big", gpus=2)])
    assert not fgd_first.fits_with_room(st)
    monkeypatch.setattr(fgd_first, "FGD_FIRST_WORK", 0)
    run_cycle(st, _config(), engine=Engine.cpsat)
    assert scored[0] == ("allocate", Strategy.binpack.value)


def test_the_fgd_plan_first_stops_after_allocate_when_a_model_might_place_more(monkeypatch, scored) -> None:
    # 3 GPUs asked, 2 + 1 + 4 x 2 free: room to spare, but no node holds the pod, and its queue would take it:
    # allocate leaves work a model might place, so the FGD-scored cycle stops there and the cycle goes the usual way
    objs = [*_stranding_objects(), *(node(f"x{i}", gpus=2) for i in range(4))]
    st = state([*objs, podgroup("big", "q", created_min=2), pod("big-0", group="big", gpus=3)])
    assert fgd_first.fits_with_room(st)
    monkeypatch.setattr(fgd_first, "FGD_FIRST_WORK", 0)
    plan, _ = run_cycle(st, _config(), engine=Engine.cpsat)
    assert scored[:2] == [("allocate", Strategy.fgd.value), ("allocate", Strategy.binpack.value)]
    assert "computed first" not in (plan.solver.note or "")
    assert "the model was not run" not in (plan.solver.note or "")


def test_a_failing_fgd_first_leaves_the_usual_cycle_with_a_note(monkeypatch) -> None:
    st = state(_stranding_objects())

    def boom(*_a):
        raise RuntimeError("boom")

    monkeypatch.setattr(fgd_first, "fgd_first", boom)
    plan, _ = run_cycle(st, _config(), engine=Engine.cpsat)
    assert ("second_hint", "exception") in plan.solver.failures
    assert "boom" in (plan.solver.note or "")
    assert [st.node_names[p.node] for p in plan.placements] == ["b"]  # the usual tie-break still ran


def test_the_greedy_engine_never_goes_fgd_first(monkeypatch, scored) -> None:
    st = state(_stranding_objects())
    monkeypatch.setattr(fgd_first, "FGD_FIRST_WORK", 0)
    plan, _ = run_cycle(st, _config(), engine=Engine.greedy)
    assert {s for _, s in scored} == {Strategy.binpack.value}
    assert [st.node_names[p.node] for p in plan.placements] == ["a"]


def test_free_room_counts_releases_on_schedulable_nodes_only() -> None:
    q = queue("q", gpu=(8, 1, -1))
    pending = [podgroup("p", "q", created_min=1), pod("p-0", group="p", gpus=2)]
    # an 8-GPU node whose 8-GPU pod is leaving: room once the release finishes
    leaving = [node("n"), podgroup("r", "q"), pod("r-0", group="r", gpus=8, node_name="n", deleting=True)]
    assert fgd_first.fits_with_room(state([q, *leaving, *pending]))
    staying = [node("n"), podgroup("r", "q"), pod("r-0", group="r", gpus=8, node_name="n")]
    assert not fgd_first.fits_with_room(state([q, *staying, *pending]))
    assert not fgd_first.fits_with_room(state([q, node("c", unschedulable=True), *pending]))
    assert fgd_first.fits_with_room(state([q, node("c"), *pending]))
    # 5 of 8 GPUs asked: more than half
    assert not fgd_first.fits_with_room(state([q, node("c"), podgroup("p", "q"), pod("p-0", group="p", gpus=5)]))
    # the wanted rule holds: an FGD-scored cycle already is not computed again
    fgd = parse_config({"engine": "cpsat", "placement": {"gpu": "fgd", "cpu": "fgd"}})
    assert not second_hint.wanted(fgd, None)
    st = state([q, node("c"), *pending])
    assert fgd_first.fgd_first(st, None, fgd, None, 10**9) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("first", [False, True])
def test_explain_ranks_an_fgd_scored_plan_as_its_placer_did(monkeypatch, first) -> None:
    # the plan is the FGD-scored greedy plan (by the tie-break, or computed first): explain's ranking is FGD's, so
    # the chosen node is the best-ranked one, not a bin-pack loser
    from kai_opt.explain import explain

    if first:
        monkeypatch.setattr(fgd_first, "FGD_FIRST_WORK", 0)
    st = state(_stranding_objects())
    out = explain(st, _config(), pod="default/c-0", engine=Engine.cpsat)
    assert out["solver"]["hint"] == "fgd" and ("computed first" in out["solver"]["note"]) == first
    chosen = out["placed"]["pods"][0]["chosen"]
    assert chosen["node"] == "b" and chosen["rank"] == 1 and chosen["strategy"] == "fgd"
    entry = out["placed"]["pods"][0]
    assert entry["decided_by"].startswith("won on fgd against a: score")  # FGD's score decided, not free CPU
    assert chosen["fgd_score"] > entry["alternatives"][0]["fgd_score"]


def test_a_spread_placement_is_not_replaced_fgd_first(monkeypatch, scored) -> None:
    # spread is the operator's choice: the cycle computes its own (spread-scored) plan first, as before
    st = state(_stranding_objects())
    monkeypatch.setattr(fgd_first, "FGD_FIRST_WORK", 0)
    config = parse_config({"engine": "cpsat", "placement": {"gpu": "spread"},
                           "solver": {"deterministic": False, "time_budget_s": 2}})
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    assert scored[0] == ("allocate", Strategy.spread.value)
    assert "computed first" not in (plan.solver.note or "")


def test_a_fallback_to_the_fgd_scored_plan_is_explained_with_fgd_scoring() -> None:
    # the model started from the FGD-scored plan and failed: the plan is that greedy plan, FALLBACK_GREEDY, hint fgd
    from kai_opt.explain import explain
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.plan import SolverInfo

    st = state(_stranding_objects())
    plan = second_hint.compute(st, compute_fair_share(st), _config(), None)
    assert plan is not None
    plan.engine = "cpsat"
    for status, fgd in (("FALLBACK_GREEDY", True), ("GREEDY_KEPT", True), ("FEASIBLE", False), ("OPTIMAL", False)):
        plan.solver = SolverInfo(status=status, hint="fgd")
        assert second_hint.is_fgd_scored(plan) is fgd
    plan.solver = SolverInfo(status="FALLBACK_GREEDY", hint="fgd")
    chosen = explain(st, _config(), pod="default/c-0", plan=plan)["placed"]["pods"][0]["chosen"]
    assert chosen["node"] == "b" and chosen["rank"] == 1 and chosen["strategy"] == "fgd"
    plan.solver = SolverInfo(status="FALLBACK_GREEDY", hint="kai")  # the KAI-scored plan keeps bin-pack's ranking
    assert explain(st, _config(), pod="default/c-0", plan=plan)["placed"]["pods"][0]["chosen"]["strategy"] == "binpack"
