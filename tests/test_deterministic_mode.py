"""Deterministic mode (`solver.deterministic`) must not read the wall clock: the same input gives the same plan on
a loaded machine. The clock is made to run 3 times fast, as a machine 3 times slower (load 6 on 2 cores) sees it."""

from __future__ import annotations

import time

import pytest

from kai_opt.bench.instances import Instance
from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.state import build_state

CONFIG = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 2, "seed": 0}})


def _plan_digest(family: str) -> tuple:
    st = build_state(Instance(family, 60, 0).snapshot())
    plan, _ = run_cycle(st, CONFIG)
    return (plan.solver.status, tuple((p.pod, p.node, p.devices, p.pipelined, p.moved) for p in plan.placements),
            tuple((e.pod, e.reason) for e in plan.evictions))


def _slow_clock(real=time.perf_counter, origin: float = 0.0):
    start = real()
    return lambda: start + 3 * (real() - start) + origin


@pytest.mark.parametrize("family", ["topology", "contention"])
def test_a_slow_clock_changes_no_deterministic_plan(monkeypatch, family: str) -> None:
    quiet = _plan_digest(family)
    monkeypatch.setattr(time, "perf_counter", _slow_clock())
    slow = _plan_digest(family)
    monkeypatch.undo()
    assert slow == quiet
