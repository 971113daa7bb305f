"""A victim whose GPUs a kept greedy placement is pipelined onto frees only the devices nobody else holds: the
model's whole-GPU row must not count them free twice (found on gangs:1000:1, where the decoder then refused the
model's plan and the cycle fell back to the greedy one)."""

from __future__ import annotations

from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.state import build_state
from models.generators import FAMILIES, as_snapshot


def test_a_victims_devices_under_a_kept_pipelined_pod_are_not_freed_twice() -> None:
    st = build_state(as_snapshot(FAMILIES["gangs"].generate(1000, 1)))
    config = parse_config({"solver": {"time_budget_s": 1, "deterministic": True}})
    plan, _ = run_cycle(st, config)
    assert ("decode", "exception") not in plan.solver.failures, plan.solver.note
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT"), plan.solver.note
