"""Property tests of the greedy engine on random clusters: the checker never fires, every eviction has a placed
beneficiary (stale-gang excepted), and repeated cycles settle without eviction loops."""

from __future__ import annotations

from builders import assert_evictions_served, snapshot
from hypothesis import HealthCheck, given, settings
from strategies import clusters

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.simulate import simulate
from kai_opt.state import build_state

GREEDY = Config(engine=Engine.greedy)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(clusters())
def test_checker_never_fires_and_evictions_have_beneficiaries(objs: list) -> None:
    state = build_state(snapshot(objs))
    plan, _ = run_cycle(state, GREEDY)  # the checker runs inside and raises on any violation
    assert_evictions_served(state, plan)


@SETTINGS
@given(clusters())
def test_cycles_settle_without_eviction_loops(objs: list) -> None:
    snap = snapshot(objs)
    # evicted pods come back pending: a loop would evict again and again; the cycles must come to rest. An
    # elastic job may legitimately grow by one pod per two cycles through evictions (pipelined, then bound), so
    # the horizon leaves room for a few of those before the last two cycles must be quiet.
    result = simulate(snap, GREEDY, cycles=10, period_s=1.0)
    tail = result.cycles[-2:]
    assert all(c.summary["evictions"] == 0 for c in tail), [c.summary for c in result.cycles]
    assert result.stable, [c.summary for c in result.cycles]
