"""`kai-opt run` with the CP-SAT engine on a real apiserver: the solve runs in a worker forked from the running
scheduler (watch, binder and status threads alive), under the wall-clock watchdog, and its plan is applied; a
worker killed mid-cycle leaves the greedy plan, applied in that cycle; only a greedy plan that fails the checker
stops a cycle (nothing applied)."""

from __future__ import annotations

import logging
import os
import re
import signal
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kai_opt.checker import PlanViolation
from kai_opt.config import parse_config
from kai_opt.formulation import solve
from kai_opt.k8s import runner as runner_mod
from kai_opt.k8s.metrics import SchedulerMetrics
from kai_opt.plan import Plan
from kai_opt.state import ClusterState

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


def _failures(text: str) -> dict[tuple[str, str], float]:
    """(stage, kind) -> kai_opt_solver_failures_total."""
    return {(s.labels["stage"], s.labels["kind"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "kai_opt_solver_failures_total"}


def _recorded_plans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[ClusterState, Plan]]:
    """The state and plan of each of the scheduler's cycles, as the runner got them (to be applied)."""
    plans: list[tuple[ClusterState, Plan]] = []
    real = runner_mod.run_cycle

    def recording(state: ClusterState, *a: Any, **k: Any) -> Any:
        plan, fs = real(state, *a, **k)
        plans.append((state, plan))
        return plan, fs

    monkeypatch.setattr(runner_mod, "run_cycle", recording)
    return plans


def _gang_objects() -> list[dict[str, Any]]:
    objs = [namespace(), node("n1", 4), node("n2", 4), queue("team"), podgroup("gang", 6, "team")]
    return objs + [pod(f"gang-{i}", gpus=1, group="gang") for i in range(6)] + [pod("solo", gpus=1,
                                                                                  queue_name="team")]


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


def _killed(*_a: Any, **_k: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def _raises(*_a: Any, **_k: Any) -> Any:
    raise RuntimeError("injected fault")


@pytest.mark.parametrize(("fault", "kind", "said"), [(_killed, "crash", "killed by SIGKILL"),
                                                     (_raises, "exception", "RuntimeError: injected fault")])
def test_a_cpsat_worker_killed_mid_cycle_leaves_the_greedy_plan_applied_in_that_cycle(
        fresh: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fault: Any,
        kind: str, said: str) -> None:
    """SIGKILL of the CP-SAT worker while it solves (patched in before the scheduler forks it; or an exception
    there): the cycle binds the verified greedy plan, and the failure is counted (kai_opt_solver_failures_total)
    and logged."""
    monkeypatch.setattr(solve, "run_with_watchdog", fault)  # runs in the CP-SAT worker, in its solving phase
    plans = _recorded_plans(monkeypatch)
    config = parse_config({"engine": "cpsat", "schedule_period_s": 0.2, "runtime": FAST_RUNTIME,
                           "solver": {"time_budget_s": 2.0, "deterministic": False, "fgd_hint": False}})
    metrics = SchedulerMetrics()
    # a pod no node can hold stays pending, so the greedy plan never places everything and every cycle runs the
    # model (a plan that places every pending pod without evictions is kept without it)
    too_big = pod("too-big", gpus=8, queue_name="team")
    with fresh.api_client() as api, caplog.at_level(logging.WARNING, logger="kai_opt.solver"):
        create(api, [*_gang_objects(), too_big])
        with scheduler(fresh, config, metrics=metrics):
            wait_for("every pod that fits bound", lambda: len(bound(api)) == 7, timeout=60)
            wait_for("the failure counted", lambda: _failures(metrics.text()).get(("cpsat", kind)), timeout=30)
        placed = bound(api)
    binding = [(st, p) for st, p in plans if p.binds]
    assert binding, "no cycle bound anything"
    st, first = binding[0]  # the cycle that placed the pods: its worker was killed, its greedy plan applied
    assert first.solver.failures == [("cpsat", kind)], first.solver
    assert first.solver.status == "FALLBACK_GREEDY" and said in first.solver.note
    assert {st.pods[b.pod].name: st.node_names[b.node] for b in first.binds} == placed  # all 7, as planned
    assert _statuses(metrics.text()).get("FALLBACK_GREEDY", 0) >= 1
    assert any(f"optional stage cpsat failed ({kind})" in r.getMessage() for r in caplog.records), caplog.text


def test_a_greedy_plan_failing_the_checker_stops_the_cycle_and_nothing_is_applied(
        fresh: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The one failure that stops a cycle: the greedy plan itself is invalid. Nothing is bound, the cycle is
    reported as failed, and the loop goes on (the next cycle, with the checker back, binds)."""
    from kai_opt import engine

    def rejects(*_a: Any, **_k: Any) -> None:
        raise PlanViolation(["injected violation of the greedy plan"])

    monkeypatch.setattr(engine, "check_plan", rejects)
    config = parse_config({"engine": "cpsat", "schedule_period_s": 0.2, "runtime": FAST_RUNTIME,
                           "solver": {"time_budget_s": 2.0, "deterministic": False}})
    with fresh.api_client() as api, caplog.at_level(logging.ERROR, logger="kai_opt.run"):
        create(api, _gang_objects())
        with scheduler(fresh, config) as sched:
            wait_for("three failed cycles", lambda: sched.cycles >= 3, timeout=60)
            assert bound(api) == {}
            failed = [r.getMessage() for r in caplog.records if ": failed: " in r.getMessage()]
            assert failed and "injected violation of the greedy plan" in failed[0], caplog.text
            monkeypatch.undo()
            wait_for("every pod bound once the checker passes", lambda: len(bound(api)) == 7, timeout=60)
