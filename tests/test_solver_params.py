"""The solver's parameters follow the slot it gets: presolve only when the slot leaves room for it on this
machine's current speed (a loaded machine presolves as much slower as it built the model)."""

from __future__ import annotations

from ortools.sat.python import cp_model

from kai_opt.config import parse_config
from kai_opt.formulation.runner import PRESOLVE_MIN_S, _params


def _presolve(seconds: float, slowdown: float, deterministic: bool = False) -> bool:
    solver = cp_model.CpSolver()
    cfg = parse_config({"solver": {"deterministic": deterministic}}).solver
    _params(solver, cfg, seconds, 1000, slowdown)
    return bool(solver.parameters.cp_model_presolve)


def test_presolve_needs_a_slot_scaled_by_the_slowdown() -> None:
    slot = PRESOLVE_MIN_S * 1.5
    assert _presolve(slot, 1.0)
    assert not _presolve(slot, 2.0)  # the same slot on a machine running the build 2x slower than its CPU time
    assert not _presolve(PRESOLVE_MIN_S * 0.9, 1.0)
    assert _presolve(slot * 3, 4.0) == (slot * 3 >= PRESOLVE_MIN_S * 4.0)


def test_deterministic_mode_always_presolves_below_the_size_cap() -> None:
    assert _presolve(0.05, 4.0, deterministic=True)
