"""No optional stage can lose a cycle: faults injected in the CP-SAT worker, its solver sub-worker, the decoder and
the FGD second hint (raise, SIGKILL, hang past the budget) leave the verified greedy plan, FALLBACK_GREEDY, the
failure in SolverInfo.failures and the note, and a log line. The faults are patched into the functions a forked
process runs before it is forked (the fork inherits the patch)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from kai_opt.bench.instances import Instance
from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config, Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.formulation import runner, second_hint, solve
from kai_opt.formulation.decode import DecodeError
from kai_opt.plan import FAILURE_KINDS, FAILURE_STAGES, Plan
from kai_opt.state import ClusterState, build_state

# the second hint and the worker forked at the cycle start, as on clusters large enough for it
pytestmark = pytest.mark.usefixtures("fork_early")

BUDGET = 1.0
SLACK = 5.0  # s past the budget a failed cycle may take (fork, kill and join on 2 shared, loaded cores); the
# hanging faults sleep 60 s


def _config(**solver: Any) -> Config:
    # the second hint and the pattern plan off unless a test turns them on: the model's plan must beat the greedy
    # one (tests/test_pattern_plan.py has the pattern stage's own failure)
    return parse_config({"engine": "cpsat", "solver": {"deterministic": False, "time_budget_s": BUDGET, "seed": 0,
                                                       "fgd_hint": False, "pattern_hint": False, **solver}})


@pytest.fixture(scope="module")
def state() -> ClusterState:
    return build_state(Instance("fragmentation", 30, 0).snapshot())  # the CP-SAT plan beats the greedy one


def raises(*_a: Any, **_k: Any) -> Any:
    raise RuntimeError("injected fault")


def killed(*_a: Any, **_k: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(*_a: Any, **_k: Any) -> Any:
    time.sleep(60)


def exits(*_a: Any, **_k: Any) -> Any:
    os._exit(3)  # no message, no traceback: a hard exit


def out_of_memory(*_a: Any, **_k: Any) -> Any:
    raise MemoryError


def _placed(plan: Plan) -> list[tuple[int, int, tuple[int, ...], bool, bool]]:
    return sorted((p.pod, p.node, p.devices, p.pipelined, p.moved) for p in plan.placements)


def _greedy_kept(state: ClusterState, config: Config, stage: str, kind: str) -> Plan:
    """One cycle: the greedy plan, FALLBACK_GREEDY, the failure counted, named and logged; within the budget."""
    greedy, _ = run_cycle(state, config, engine=Engine.greedy)
    t = time.perf_counter()
    plan, fs = run_cycle(state, config)
    assert time.perf_counter() - t < BUDGET + SLACK + greedy.phases["total"]
    assert plan.solver.failures == [(stage, kind)], plan.solver
    assert stage in FAILURE_STAGES and kind in FAILURE_KINDS
    assert plan.solver.status == "FALLBACK_GREEDY" and plan.engine == "cpsat"
    assert plan.solver.note.startswith(f"{stage} {kind}: "), plan.solver.note
    assert _placed(plan) == _placed(greedy)
    assert sorted(plan.evictions, key=lambda e: e.pod) == sorted(greedy.evictions, key=lambda e: e.pod)
    check_plan(state, plan, fs, config)
    return plan


def test_the_fault_free_cycle_chooses_the_cpsat_plan(state: ClusterState) -> None:
    """The instance is one where a lost CP-SAT stage shows: the plan differs from the greedy one."""
    config = _config()
    plan, _ = run_cycle(state, config)
    greedy, _ = run_cycle(state, config, engine=Engine.greedy)
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE") and not plan.solver.failures
    assert _placed(plan) != _placed(greedy)


# -- the CP-SAT worker (scope, model, hint: patched here into the model build) --------------------------------------
@pytest.mark.parametrize(("fault", "kind", "said"), [(raises, "exception", "RuntimeError: injected fault"),
                                                     (out_of_memory, "exception", "MemoryError"),
                                                     (killed, "crash", "killed by SIGKILL"),
                                                     (exits, "crash", "exit code 3"),
                                                     (hangs, "timeout", "hard watchdog")])
def test_a_failing_cpsat_worker_leaves_the_greedy_plan(state: ClusterState, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture, fault: Callable[..., Any],
                                                       kind: str, said: str) -> None:
    monkeypatch.setattr(solve, "build_model", fault)
    with caplog.at_level(logging.WARNING, logger="kai_opt.solver"):
        plan = _greedy_kept(state, _config(), "cpsat", kind)
    assert said in plan.solver.note and "building the model" in plan.solver.note
    assert any(f"optional stage cpsat failed ({kind})" in r.getMessage() for r in caplog.records), caplog.text


def test_a_broken_pipe_from_the_cpsat_worker_is_a_crash(state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: Any, **_k: Any) -> Any:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(mp.connection.Connection, "recv", broken)  # the cycle's end of the worker's pipe
    plan = _greedy_kept(state, _config(), "cpsat", "crash")
    assert "BrokenPipeError" in plan.solver.note


def test_the_cycle_survives_a_cpsat_stage_that_raises_in_the_cycles_process(
        state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    """The net in run_cycle: an exception from the CP-SAT stage's own process (not its worker) is a failure too."""
    monkeypatch.setattr(solve, "cpsat_plan", raises)
    plan = _greedy_kept(state, _config(), "cpsat", "exception")
    assert "RuntimeError: injected fault" in plan.solver.note


def test_a_failing_cpsat_stage_in_deterministic_mode_leaves_the_greedy_plan(state: ClusterState,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic mode runs the same CP-SAT worker without a wall-clock limit: an exception there is a failed
    stage too."""
    monkeypatch.setattr(solve, "build_model", raises)
    plan = _greedy_kept(state, _config(deterministic=True), "cpsat", "exception")
    assert "injected fault" in plan.solver.note


def test_deterministic_mode_runs_the_worker_without_a_wall_clock_kill(state: ClusterState,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Any) -> None:
    """The production path (a forked worker), but a model build slower than the budget and its hard grace is not
    killed: the plan is the model's."""
    config = _config(deterministic=True)
    real, pid_file = solve.build_model, tmp_path / "worker.pid"

    def slow(*a: Any, **k: Any) -> Any:
        pid_file.write_text(str(os.getpid()))
        time.sleep(BUDGET + solve.HARD_GRACE + 0.5)
        return real(*a, **k)

    monkeypatch.setattr(solve, "build_model", slow)
    plan, fs = run_cycle(state, config)
    assert int(pid_file.read_text()) != os.getpid()  # in the worker
    assert not plan.solver.failures and plan.solver.status in ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT"), plan.solver
    assert plan.solver.build_s > BUDGET + solve.HARD_GRACE and plan.solver.objective is not None
    check_plan(state, plan, fs, config)


def test_a_failing_second_hint_in_deterministic_mode_is_named_as_such(state: ClusterState,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic mode computes the FGD-scored plan inside the CP-SAT worker: its exception is the second hint's
    (the stage's phase says so), and the greedy plan stays."""
    monkeypatch.setattr(solve, "compute", raises)
    plan = _greedy_kept(state, _config(deterministic=True, fgd_hint=True), "second_hint", "exception")
    assert "FGD scoring" in plan.solver.note and "injected fault" in plan.solver.note


# -- the solver sub-worker -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fault", "kind", "said"), [(raises, "exception", "RuntimeError: injected fault"),
                                                     (killed, "crash", "killed by SIGKILL"),
                                                     (hangs, "timeout", "the watchdog stopped the solver")])
def test_a_failing_solver_worker_leaves_the_greedy_plan(state: ClusterState, monkeypatch: pytest.MonkeyPatch,
                                                        fault: Callable[..., Any], kind: str, said: str) -> None:
    monkeypatch.setattr(runner, "solve_lexicographic", fault)
    plan = _greedy_kept(state, _config(), "cpsat", kind)
    assert said in plan.solver.note


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux (prctl, /proc)")
def test_the_solver_worker_dies_with_a_killed_cpsat_worker(state: ClusterState, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Any) -> None:
    """The CP-SAT worker killed while its solver sub-worker solves: a crash of the stage, and no orphan solver."""
    pid_file = tmp_path / "solver.pid"

    def kills_its_parent(*_a: Any, **_k: Any) -> Any:  # in the solver worker
        pid_file.write_text(str(os.getpid()))
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)

    monkeypatch.setattr(runner, "solve_lexicographic", kills_its_parent)
    try:
        plan = _greedy_kept(state, _config(), "cpsat", "crash")
        assert "while solving" in plan.solver.note
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), "the solver worker outlived the CP-SAT worker"
    finally:
        if pid_file.exists() and _running(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_solver_worker_dying_after_tier_1_keeps_its_solution(state: ClusterState,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiers 2-3 only polish: the tier-1 solution sent before the crash goes on; the crash is still counted."""
    real = runner.solve_lexicographic

    def dies_after_tier_1(built: Any, cfg: Any, seconds: float, report: Any = None, slowdown: float = 1.0) -> Any:
        return real(built, cfg, seconds, report=lambda r: (report(r), os.kill(os.getpid(), signal.SIGKILL)),
                    slowdown=slowdown)

    monkeypatch.setattr(runner, "solve_lexicographic", dies_after_tier_1)
    config = _config()
    plan, fs = run_cycle(state, config)
    assert plan.solver.failures == [("cpsat", "crash")], plan.solver
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT"), plan.solver
    assert "the solver worker died (killed by SIGKILL" in plan.solver.note
    check_plan(state, plan, fs, config)


# -- the decoder -----------------------------------------------------------------------------------------------------
def _decode_error(*_a: Any, **_k: Any) -> Any:
    raise DecodeError("injected decode fault")


@pytest.mark.parametrize(("fault", "kind", "said"), [(raises, "exception", "RuntimeError: injected fault"),
                                                     (_decode_error, "exception", "injected decode fault"),
                                                     (killed, "crash", "killed by SIGKILL"),
                                                     (hangs, "timeout", "while decoding")])
def test_a_failing_decoder_leaves_the_greedy_plan(state: ClusterState, monkeypatch: pytest.MonkeyPatch,
                                                  fault: Callable[..., Any], kind: str, said: str) -> None:
    monkeypatch.setattr(solve, "decode", fault)
    plan = _greedy_kept(state, _config(), "decode", kind)
    assert said in plan.solver.note


def test_a_cpsat_plan_failing_the_checker_leaves_the_greedy_plan(state: ClusterState,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def rejects(*_a: Any, **_k: Any) -> None:
        raise PlanViolation(["injected violation"])

    monkeypatch.setattr(solve, "check_plan", rejects)  # the worker's check of the CP-SAT plan (not the greedy's)
    plan = _greedy_kept(state, _config(), "cpsat", "violation")
    assert "injected violation" in plan.solver.note


# -- the FGD second hint ---------------------------------------------------------------------------------------------
def test_weighing_the_second_hint_at_the_end_may_fail_too(state: ClusterState,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """In the cycle's process, after the worker: the worker's plan stays, the second hint's failure is counted."""
    monkeypatch.setattr(second_hint.SecondHint, "ready", lambda self: False)  # the worker leaves it to the end
    monkeypatch.setattr(solve, "_inline_is_cheap", lambda *_a: False)  # (and does not compute it itself)
    monkeypatch.setattr(solve, "second_hint_note", raises)
    config = _config(fgd_hint=True)
    plan, fs = run_cycle(state, config)
    assert plan.solver.failures == [("second_hint", "exception")], plan.solver
    assert plan.solver.status in ("OPTIMAL", "FEASIBLE") and "injected fault" in plan.solver.note
    check_plan(state, plan, fs, config)


def _rejects_fgd(*_a: Any, **_k: Any) -> None:
    raise PlanViolation(["injected violation"])


SECOND_HINT_FAULTS = [("compute", raises, "exception", "RuntimeError: injected fault"),
                      ("compute", killed, "crash", "killed by SIGKILL"),
                      ("check_plan", _rejects_fgd, "violation", "failed the checker")]


@pytest.mark.parametrize(("where", "fault", "kind", "said", "taken_by"), [
    *[(*f, "worker") for f in SECOND_HINT_FAULTS], *[(*f, "end") for f in SECOND_HINT_FAULTS],
    ("compute", hangs, "timeout", "not ready by the deadline", "end"),  # a hint that never comes: judged at the end
])
def test_a_failing_second_hint_is_counted_and_the_cycle_goes_on(state: ClusterState,
                                                                monkeypatch: pytest.MonkeyPatch, where: str,
                                                                fault: Callable[..., Any], kind: str, said: str,
                                                                taken_by: str) -> None:
    """Taken by the worker as its starting plan (it waits for it here) or by the cycle's process at the end."""
    monkeypatch.setattr(second_hint, where, fault)  # the process beside is forked after this
    monkeypatch.setattr(second_hint.SecondHint, "ready", (lambda self: self._child.poll(10)) if taken_by == "worker"
                        else (lambda self: False))
    if taken_by == "end":  # the worker does not compute a late hint itself either
        monkeypatch.setattr(solve, "_inline_is_cheap", lambda *_a: False)
    config = _config(fgd_hint=True)
    t = time.perf_counter()
    plan, fs = run_cycle(state, config)
    assert time.perf_counter() - t < BUDGET + SLACK + plan.phases["fair_share"] + plan.phases.get("allocate", 0)
    assert plan.solver.failures == [("second_hint", kind)], plan.solver
    assert plan.solver.hint == "kai" and plan.solver.status in ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT")
    assert f"second_hint {kind}: " in plan.solver.note and said in plan.solver.note, plan.solver.note
    check_plan(state, plan, fs, config)



# -- the CP-SAT worker forked once allocate ran (solve.prepare_worker) -----------------------------------------------
def test_a_failing_greedy_cycle_ends_the_waiting_worker(state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    from kai_opt.heuristics import cycle

    prepared: list[Any] = []
    real_prepare = solve.prepare_worker
    monkeypatch.setattr(solve, "prepare_worker", lambda *a: prepared.append(real_prepare(*a)) or prepared[-1])
    consolidate = next(a for a in cycle.REGISTRY if a.name == "consolidate")
    monkeypatch.setattr(consolidate, "run", raises)  # the action after allocate
    with pytest.raises(RuntimeError, match="injected fault"):
        run_cycle(state, _config())
    assert prepared and prepared[0] is not None  # the worker was forked (allocate left work)
    assert not mp.active_children()  # and is gone with the cycle


def test_a_worker_that_dies_while_waiting_is_a_crash_of_the_cpsat_stage(state: ClusterState,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from kai_opt import engine

    prepared: list[Any] = []
    real_prepare, real_greedy = solve.prepare_worker, engine.greedy_plan

    def prepare(*a: Any, **k: Any) -> Any:
        prepared.append(real_prepare(*a, **k))
        return prepared[-1]

    def greedy_then_kill(*a: Any, **k: Any) -> Any:
        plan = real_greedy(*a, **k)
        if prepared:  # the cpsat cycle, its worker forked once allocate ran (the greedy engine's run prepares
            # nothing)
            proc = prepared[0].child._proc
            os.kill(proc.pid, signal.SIGKILL)  # e.g. the out-of-memory killer while the greedy cycle ran
            proc.join(SLACK)
        return plan

    monkeypatch.setattr(solve, "prepare_worker", prepare)
    monkeypatch.setattr(engine, "greedy_plan", greedy_then_kill)
    plan = _greedy_kept(state, _config(), "cpsat", "crash")
    assert "killed by SIGKILL" in plan.solver.note
    assert not mp.active_children()


def test_the_workers_budget_counts_from_the_stages_start_in_the_cycles_process(
        state: ClusterState, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's watchdog counts the budget from when it started the stage; handing the greedy plan over to the
    worker comes out of it. A worker told the stage started most of a budget ago does not start a solve it has
    no time to decode and check; told nothing, the same worker solves."""
    config = _config()
    fs = compute_fair_share(state)
    greedy, _ = run_cycle(state, config, engine=Engine.greedy)
    fresh = solve._cpsat_plan(state, fs, config, greedy=greedy)
    assert fresh.solver.status in ("OPTIMAL", "FEASIBLE"), fresh.solver.note
    monkeypatch.setattr(solve, "run_with_watchdog", raises)
    late = solve._cpsat_plan(state, fs, config, greedy=greedy, started=time.perf_counter() - 0.95 * BUDGET)
    assert late.solver.status == "FALLBACK_GREEDY" and not late.solver.failures
    assert "with the greedy plan's handover" in late.solver.note, late.solver.note
