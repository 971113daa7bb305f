"""`kai-opt run` with the CP-SAT engine on a real apiserver: the solve runs in a worker forked from the running
scheduler (watch, binder and status threads alive), under the wall-clock watchdog, and its plan is applied."""

from __future__ import annotations

import re

import pytest

from kai_opt.config import parse_config
from kai_opt.k8s.metrics import SchedulerMetrics

from .schedharness import (
    FAST_RUNTIME,
    bound,
    create,
    devices,
    fresh,
    namespace,
    node,
    pod,
    podgroup,
    pods,
    queue,
    scheduler,
    wait_for,
)
from .testcluster import LocalCluster

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

SOLVED = ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT")  # the worker came back with a verified plan


def _statuses(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^kai_opt_solver_status_total\{status="([A-Z_]+)"\} (\S+)$', text, re.M)}


def test_cpsat_engine_binds_a_gang_and_shares_a_device_from_a_forked_solve(fresh: LocalCluster) -> None:
    config = parse_config({"engine": "cpsat", "schedule_period_s": 0.2, "runtime": FAST_RUNTIME,
                           "solver": {"time_budget_s": 5.0, "deterministic": False}})
    with fresh.api_client() as api:
        objs = [namespace(), node("n1", 4), node("n2", 4), queue("team"), podgroup("gang", 6, "team")]
        objs += [pod(f"gang-{i}", gpus=1, group="gang") for i in range(6)]
        objs += [pod(f"half-{i}", fraction="0.5", queue_name="team") for i in range(2)]
        create(api, objs)
        metrics = SchedulerMetrics()
        with scheduler(fresh, config, metrics=metrics):
            wait_for("every pod bound", lambda: len(bound(api)) == 8, timeout=60)
            wait_for("a solve's status", lambda: any(_statuses(metrics.text()).get(s) for s in SOLVED), timeout=30)
        placed = bound(api)
        all_pods = pods(api)
        halves = [(placed[f"half-{i}"], devices(all_pods[f"half-{i}"])) for i in range(2)]
        assert halves[0] == halves[1], f"the two half-GPU pods do not share one device: {halves}"
        node_of_halves = halves[0][0]
        whole = [devices(all_pods[f"gang-{i}"]) for i in range(6) if placed[f"gang-{i}"] == node_of_halves]
        assert halves[0][1] not in whole, (halves, whole)  # the shared device is nobody's whole GPU
        statuses = _statuses(metrics.text())
        assert any(statuses.get(s) for s in SOLVED), statuses
