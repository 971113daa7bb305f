"""A greedy cycle leaves no reference cycle behind: everything its session made is freed by reference counting when
the plan is out. The session's caches hold objects made from it (pending orders, job queues, status watches); one
of them holding the session closes a cycle through everything the session made, which the garbage collector then
walks at its first collection after the cycle (0.17 s at 10,000 nodes: docs/DESIGN-NOTES.md)."""

from __future__ import annotations

import gc
from collections import Counter

import pytest

from kai_opt.actions import ACTION_BY_NAME
from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import FairShare, compute_fair_share
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.state import ClusterState, build_state
from models.generators import as_snapshot, scale


def _garbage_of_cycle(run: object) -> Counter[str]:
    """Types of the objects only the collector could free after `run()` (a reference cycle or held by one)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()  # type: ignore[operator]
        gc.collect()
        found = Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    return found


@pytest.fixture(scope="module")
def scale_1000() -> tuple[ClusterState, FairShare]:
    st = build_state(as_snapshot(scale(1000, 10_000, 1000, 0)))
    return st, compute_fair_share(st)


@pytest.mark.parametrize("search", ["kai", "cheapest"])
def test_a_greedy_cycle_with_victim_searches_leaves_no_reference_cycle(
        search: str, scale_1000: tuple[ClusterState, FairShare]) -> None:
    st, fs = scale_1000
    cfg = Config(engine=Engine.greedy, victim_search=search)
    plan = greedy_plan(st, fs, cfg)
    assert any(e.reason == ACTION_BY_NAME["reclaim"].eviction_reason for e in plan.evictions), \
        "the instance runs reclaim simulations"
    assert _garbage_of_cycle(lambda: greedy_plan(st, fs, cfg)) == Counter()


def test_a_cpsat_cycle_leaves_no_reference_cycle_in_the_calling_process(
        scale_1000: tuple[ClusterState, FairShare]) -> None:
    st, _fs = scale_1000
    cfg = Config.model_validate({"engine": "cpsat", "solver": {"time_budget_s": 1, "deterministic": True}})
    run_cycle(st, cfg)  # a first cycle imports what it uses first (numpy.ma's import leaves cycles of its own)
    assert _garbage_of_cycle(lambda: run_cycle(st, cfg)) == Counter()


def test_a_greedy_cycle_with_fgd_scoring_leaves_no_reference_cycle(
        scale_1000: tuple[ClusterState, FairShare]) -> None:
    """The FGD scorer (placement fgd: the second hint, the FGD-scored plan computed first, the trace replay) is owned
    by its placer and must not hold it back."""
    st, fs = scale_1000
    cfg = Config.model_validate({"engine": "greedy", "placement": {"gpu": "fgd", "cpu": "fgd"}})
    assert _garbage_of_cycle(lambda: greedy_plan(st, fs, cfg)) == Counter()
