"""run_cycle tells a progress callback what it is doing, phase by phase (the status line of `kai-opt solve`)."""

from __future__ import annotations

from pathlib import Path

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.loaders import load_snapshot
from kai_opt.state import build_state

EXAMPLE = Path(__file__).resolve().parents[1] / "models" / "examples" / "quickstart.yaml"


GREEDY = Config(engine=Engine.greedy)
GREEDY_PHASES = ["fair share", "greedy: allocate", "greedy: consolidate", "greedy: reclaim", "greedy: preempt",
                 "greedy: stale-gang", "checking the greedy plan"]


def test_run_cycle_reports_its_phases_in_order() -> None:
    state = build_state(load_snapshot(EXAMPLE, scheduler_names=None))
    seen: list[str] = []
    plan, _ = run_cycle(state, GREEDY, progress=seen.append)
    assert seen == GREEDY_PHASES
    assert plan.placements  # the same cycle as without a callback
    assert run_cycle(state, GREEDY)[0].placements == plan.placements
    seen.clear()
    run_cycle(state, Config(), progress=seen.append)  # the default engine: the greedy plan, then CP-SAT
    assert seen == [*GREEDY_PHASES, "CP-SAT (budget 1s)"]


def test_simulate_reports_cycle_and_phase() -> None:
    from kai_opt.simulate import simulate

    seen: list[str] = []
    simulate(load_snapshot(EXAMPLE, scheduler_names=None), GREEDY, 2, progress=seen.append)
    assert seen[0] == "cycle 1/2: fair share" and "cycle 2/2: greedy: allocate" in seen
    assert seen[-1] == "cycle 2/2: checking the greedy plan"
