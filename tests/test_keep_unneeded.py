"""keep-unneeded's shortcuts change no plan: the chunks decided before its walk (`_decided`) and the early give-up
on the victims that might stay evicted give the same binds, evictions and pending reasons as walking every chunk
and checking only the final victims."""

from __future__ import annotations

import pytest
from builders import snapshot
from hypothesis import HealthCheck, given, settings
from strategies import clusters

import kai_opt.heuristics.victims as victims
from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.plan import Plan
from kai_opt.state import build_state

GREEDY = Config(engine=Engine.greedy)


def _parts(plan: Plan) -> tuple:
    return ([(p.pod, p.node, tuple(p.devices), p.pipelined, p.moved) for p in plan.placements],
            [(e.pod, e.reason, e.beneficiary) for e in plan.evictions],
            {g: [(r.code, r.message) for r in rs] for g, rs in plan.pending.items()})


def _both(state, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, tuple, int]:
    calls = []
    real = victims._decided

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(len(out))
        return out

    with monkeypatch.context() as m:
        m.setattr(victims, "_decided", counting)
        fast = _parts(run_cycle(state, GREEDY)[0])
    with monkeypatch.context() as m:
        m.setattr(victims, "_decided", lambda *a, **k: {})  # every chunk walked, only the final victims checked
        plain = _parts(run_cycle(state, GREEDY)[0])
    return fast, plain, sum(calls)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(objs=clusters(max_nodes=8, max_jobs=12))
def test_decided_chunks_change_no_plan_on_random_clusters(objs: list, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, plain, _ = _both(build_state(snapshot(objs)), monkeypatch)
    assert fast == plain


def test_decided_chunks_change_no_plan_on_a_scale_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reclaim across many queues (models.generators.scale): the shortcut is taken, and the plan is the same.
    (Seed 1: on seed 0's instance only consolidation evicts, and consolidation's search no longer walks
    keep-unneeded since issue 21; seed 1's reclaims do.)"""
    from models.generators import as_snapshot, scale

    fast, plain, decided = _both(build_state(as_snapshot(scale(300, 3000, 300, 1))), monkeypatch)
    assert decided > 0  # chunks were decided before the walk
    assert fast[1]  # evictions happened
    assert fast == plain
