"""The one worker helper (kai_opt.formulation.child): messages then a result, a raise, a death by signal or exit,
an overrun killed at the deadline, a result taken by another process, its garbage-collector rule, no fork."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import time
from typing import Any

import pytest

from kai_opt.formulation import child
from kai_opt.formulation.child import Child, run_in_child
from kai_opt.gcpause import forking, gc_paused

pytestmark = pytest.mark.skipif(not child.can_fork(), reason="fork")

SLACK = 5.0  # s a kill and join may take on 2 shared, loaded cores


def talks(send: child.Send, n: int) -> list[int]:
    for i in range(n):
        send(("step", i))
    return list(range(n))


def raises(_send: child.Send) -> None:
    raise ValueError("boom")


def killed(_send: child.Send) -> None:
    _send("about to die")
    os.kill(os.getpid(), signal.SIGKILL)


def exits(_send: child.Send) -> None:
    os._exit(3)


def hangs(send: child.Send) -> None:
    send("hanging")
    time.sleep(60)


def test_a_child_sends_its_messages_in_order_then_its_result() -> None:
    got: list[Any] = []
    ended = run_in_child(talks, (3,), deadline=time.perf_counter() + 30, on_message=got.append)
    assert ended.ok and ended.value == [0, 1, 2] and ended.failure is None
    assert got == [("step", 0), ("step", 1), ("step", 2)]
    assert not mp.active_children()


def test_a_child_that_raises_is_an_exception_with_its_traceback() -> None:
    ended = run_in_child(raises, deadline=time.perf_counter() + 30)
    assert ended.failure == "exception" and not ended.ok and ended.value is None
    assert ended.detail == "ValueError: boom"
    assert ended.trace is not None and "in raises" in ended.trace


def test_a_child_killed_by_a_signal_is_a_crash_named_by_its_exit_status() -> None:
    got: list[Any] = []
    ended = run_in_child(killed, deadline=time.perf_counter() + 30, on_message=got.append)
    assert got == ["about to die"]  # what it sent before it died still arrives
    assert ended.failure == "crash" and ended.exitcode == -signal.SIGKILL
    assert "killed by SIGKILL" in ended.detail


def test_a_hard_exit_is_a_crash_with_its_exit_code() -> None:
    ended = run_in_child(exits, deadline=time.perf_counter() + 30)
    assert ended.failure == "crash" and ended.exitcode == 3 and ended.detail == "exit code 3"


def test_a_child_past_its_deadline_is_killed_by_the_watchdog() -> None:
    got: list[Any] = []
    t = time.perf_counter()
    ended = run_in_child(hangs, deadline=t + 0.5, on_message=got.append)
    took = time.perf_counter() - t
    assert ended.failure == "timeout" and ended.value is None
    assert got == ["hanging"]
    assert 0.5 <= took < 0.5 + SLACK  # (it sleeps 60 s)
    assert not mp.active_children()  # killed and reaped


def test_without_a_deadline_the_child_is_not_killed_by_wall_time() -> None:
    def slow(_send: child.Send) -> str:
        time.sleep(0.6)
        return "done"

    assert run_in_child(slow, deadline=None).value == "done"


def test_a_result_that_does_not_pickle_is_an_exception_not_a_hang() -> None:
    ended = run_in_child(lambda _send: (lambda: None), deadline=time.perf_counter() + 30)
    assert ended.failure == "exception" and "pickle" in ended.detail.lower()


def test_a_child_that_cannot_start_is_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork(*_a: Any, **_k: Any) -> Any:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(Child, "start", no_fork)
    ended = run_in_child(talks, (1,), deadline=time.perf_counter() + 30)
    assert ended.failure == "exception" and ended.detail.startswith("could not start: ") and ended.trace is None


def test_started_then_taken_later() -> None:
    """The start/poll/take form (the second hint beside the cycle): nothing before it is done, then its result."""
    def waits(_send: child.Send) -> int:
        time.sleep(0.3)
        return 7

    c = Child.start(waits)
    try:
        assert c.take(0) is None and not c.poll(0)
        ended = c.take(30)
        assert ended is not None and ended.ok and ended.value == 7
        assert c.take(0) is ended and c.poll(0)  # taken once, kept
    finally:
        c.stop()
    assert not mp.active_children()


def test_a_result_taken_by_a_process_forked_later_is_no_crash_for_either() -> None:
    """A process forked after the child inherits the reading end and may take its result (the CP-SAT worker takes
    the second hint); the starter then sees the pipe end with exit code 0, and the taker cannot read exit statuses."""
    c = Child.start(talks, (2,))
    try:
        in_taker = run_in_child(lambda _send: c.take(30), deadline=time.perf_counter() + 30)
        assert in_taker.ok and in_taker.value.value == [0, 1]
        ended = c.take(30)
        assert ended is not None and ended.failure == "crash" and ended.exitcode == 0
    finally:
        c.stop()


def test_a_stopped_child_is_killed_and_reaped() -> None:
    c = Child.start(hangs)
    c.stop()
    assert not mp.active_children()


def _gc_seen(_send: child.Send) -> tuple[bool, int]:
    return gc.isenabled(), gc.get_freeze_count()


def test_one_gc_rule_around_the_fork() -> None:
    """Collector on: the child starts with the heap frozen, the parent unfreezes at once. Collector paused: the
    child inherits the pause and nothing is frozen (no garbage moved to the oldest generation)."""
    gc.unfreeze()  # (a snapshot another test loaded may be frozen: kai_opt.gcpause.gc_paused(freeze_above=...))
    assert gc.isenabled()
    with forking():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    enabled, frozen = run_in_child(_gc_seen, deadline=time.perf_counter() + 30).value
    assert enabled and frozen > 0
    with gc_paused():
        with forking():
            assert gc.get_freeze_count() == 0
        enabled, frozen = run_in_child(_gc_seen, deadline=time.perf_counter() + 30).value
    assert not enabled and frozen == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_without_fork_it_runs_here_with_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "can_fork", lambda: False)
    got: list[Any] = []
    ended = run_in_child(talks, (2,), deadline=time.perf_counter() + 30, on_message=got.append)
    assert ended.ok and ended.value == [0, 1] and got == [("step", 0), ("step", 1)]
    ended = run_in_child(raises, deadline=None)
    assert ended.failure == "exception" and ended.detail == "ValueError: boom" and ended.trace is not None


def adds(send: child.Send, a: int, b: int) -> int:
    send(("adding", a, b))
    return a + b


def raises_after(_send: child.Send, _more: int) -> None:
    raise ValueError("late boom")


def hangs_after(send: child.Send, _more: int) -> None:
    send("hanging")
    time.sleep(60)


def test_a_waiting_child_runs_with_what_it_is_given_later() -> None:
    waiting = child.Waiting(adds, (2,))
    time.sleep(0.1)  # forked and waiting: nothing has run
    got: list[Any] = []
    ended = waiting.run((40,), deadline=time.perf_counter() + 30, on_message=got.append)
    assert ended.ok and ended.value == 42 and got == [("adding", 2, 40)]
    assert not mp.active_children()
    again = waiting.run((1,), deadline=None)  # once only
    assert again.failure == "exception"


def test_a_cancelled_waiting_child_ends_without_running() -> None:
    waiting = child.Waiting(hangs_after, ())
    t = time.perf_counter()
    waiting.cancel()
    assert time.perf_counter() - t < SLACK and not mp.active_children()
    waiting.cancel()  # twice is harmless


def test_a_waiting_child_reports_a_raise_and_is_killed_at_the_deadline() -> None:
    ended = child.Waiting(raises_after, ()).run((1,), deadline=time.perf_counter() + 30)
    assert ended.failure == "exception" and "late boom" in ended.detail
    t = time.perf_counter()
    ended = child.Waiting(hangs_after, ()).run((1,), deadline=t + 0.5)
    assert ended.failure == "timeout" and time.perf_counter() - t < 0.5 + SLACK
    assert not mp.active_children()


def test_a_waiting_child_that_died_while_waiting_is_a_crash() -> None:
    waiting = child.Waiting(adds, (1,))
    assert waiting.child is not None
    os.kill(waiting.child._proc.pid, signal.SIGKILL)
    waiting.child._proc.join(SLACK)
    ended = waiting.run((1,), deadline=time.perf_counter() + 30)
    assert ended.failure == "crash"


def _spin_then_sleep(_send: Any, cpu_s: float) -> None:
    while time.process_time() < cpu_s:
        pass
    time.sleep(30.0)


def test_cpu_seconds_reads_what_the_child_has_spent() -> None:
    busy = Child.start(_spin_then_sleep, (0.3,))
    idle = Child.start(_spin_then_sleep, (0.0,))
    try:
        for _ in range(400):  # polled, not timed: the busy child reaches 0.3 s of CPU at whatever speed
            used = busy.cpu_seconds()
            assert used is not None
            if used >= 0.29:
                break
            time.sleep(0.05)
        assert busy.cpu_seconds() >= 0.29  # type: ignore[operator]
        idle_used = idle.cpu_seconds()
        assert idle_used is not None and idle_used < 0.29
    finally:
        busy.stop()
        idle.stop()
    assert busy.cpu_seconds() is None  # reaped: nothing to read
