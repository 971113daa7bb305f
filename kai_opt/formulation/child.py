"""The one protocol for running a function in a forked process: the fork (with the one garbage-collector rule,
kai_opt.gcpause.forking), a pipe carrying its progress messages and then its result or traceback, a hard wall-clock
watchdog, kill and join, and how it ended in the words of kai_opt.plan.FAILURE_KINDS (exception, crash, timeout).

Why fork: model building and CP-SAT's presolve cannot be interrupted from inside, so the only hard budget is a
process the caller kills. The CP-SAT worker (formulation.solve), its solver sub-worker (formulation.runner) and the
second hint beside the cycle (formulation.second_hint) all run through here.

The function runs as `fn(send, *args)`: `send(message)` hands a progress message to the caller's `on_message`;
what it returns is the result (both must pickle). Where fork does not exist it runs in this process, exceptions
classified the same way, without a watchdog.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from kai_opt.formulation.failures import exit_reason, last_line
from kai_opt.gcpause import forking

Send = Callable[[Any], None]
Fn = Callable[..., Any]  # fn(send, *args)

MESSAGE, RETURN, RAISE = "message", "return", "raise"  # what the child sends: progress, then one of the others
EXIT_WAIT_S = 1.0  # a child whose pipe ended: how long to wait for its exit status (which names the signal or code)
KILL_WAIT_S = 1.0  # a child killed by the watchdog: how long to wait for it to be reaped
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass
class ChildResult:
    """How a child ended. `failure` None: `fn` returned `value`. Otherwise a kai_opt.plan.FAILURE_KINDS word:
    exception (it raised, `trace` is its traceback and `detail` the exception line; or it could not start, or sent
    a message that does not unpickle, `trace` None and `detail` says which), crash (its pipe ended without a result:
    a signal, the out-of-memory killer, a hard exit, a broken pipe; `detail` the exit status, `exitcode` it when the
    process that started it read it), timeout (the watchdog killed it at the deadline)."""

    value: Any = None
    failure: str | None = None
    detail: str = ""
    trace: str | None = None
    exitcode: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


class Child:
    """`fn(send, *args)` running in a forked process, its result taken later (`take`), possibly by a process forked
    from this one after it (it inherits the reading end). Only the process that started it (`owned`) reads its exit
    status, kills and joins it."""

    def __init__(self, proc: mp.process.BaseProcess, conn: Connection) -> None:
        self._proc = proc
        self._conn = conn
        self._pid = os.getpid()
        self.result: ChildResult | None = None  # once taken

    @classmethod
    def start(cls, fn: Fn, args: Sequence[Any] = (), *, daemon: bool = True, die_with_parent: bool = False) -> Child:
        """Fork `fn`. Raises OSError when the fork fails (out of memory, process limit). `daemon`: False for a
        child that forks children itself. `die_with_parent` (Linux): it is killed when this process dies, instead
        of running on as an orphan (an uninterruptible presolve can take many budgets)."""
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_main, args=(child, fn, tuple(args), os.getpid() if die_with_parent else None),
                           daemon=daemon)
        try:
            with forking():
                proc.start()
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return cls(proc, parent)

    @property
    def owned(self) -> bool:
        return os.getpid() == self._pid

    def cpu_seconds(self) -> float | None:
        """The CPU time it has used so far (user and system), read from /proc; None where that cannot be read
        (not Linux, or it ended)."""
        try:
            with open(f"/proc/{self._proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        try:  # utime and stime, the 14th and 15th fields (the 12th and 13th after the command name)
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (IndexError, ValueError, OSError):
            return None

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether its next message (or the end of its pipe) is there, waiting up to `timeout` seconds."""
        return self.result is not None or self._conn.poll(max(0.0, timeout))

    def take(self, timeout: float | None = 0.0, on_message: Send | None = None) -> ChildResult | None:
        """Its result, handing its progress messages to `on_message` meanwhile; waits up to `timeout` seconds
        (None: without limit). None when the result has not come by then."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while self.result is None:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            if not self._conn.poll(left):
                return None
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError) as exc:  # it ended without a result: a signal, out of memory, a broken pipe
                self.result = self._ended(exc)
                break
            except Exception as exc:  # a message that does not unpickle
                self.result = ChildResult(failure="exception",
                                          detail=f"sent an unreadable message: {type(exc).__name__}: {exc}")
                break
            if kind == MESSAGE:
                if on_message is not None:
                    on_message(payload)
            elif kind == RETURN:
                self.result = ChildResult(value=payload)
            else:
                self.result = ChildResult(failure="exception", detail=last_line(payload), trace=payload)
        return self.result

    def _ended(self, exc: BaseException) -> ChildResult:
        """A crash; its exit status read (before a kill of ours could change it) only by the process that started
        it: elsewhere `exitcode` stays None."""
        said = "" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}; "
        if not self.owned:
            return ChildResult(failure="crash", detail=f"{said}its exit status is its starter's to read")
        self._proc.join(EXIT_WAIT_S)
        code = self._proc.exitcode
        return ChildResult(failure="crash", detail=said + exit_reason(code), exitcode=code)

    def stop(self) -> None:
        """Kill it if it still runs, reap it and close the pipe (only in the process that started it)."""
        if not self.owned:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(KILL_WAIT_S)
        self._conn.close()


def run_in_child(fn: Fn, args: Sequence[Any] = (), *, deadline: float | None, on_message: Send | None = None,
                 daemon: bool = True, die_with_parent: bool = False) -> ChildResult:
    """`fn(send, *args)` in a forked process, killed by the hard watchdog at `deadline` (a time.perf_counter()
    value; None: no wall-clock limit, e.g. deterministic mode). Never raises for the child: whatever happens
    there is in the result. Without fork it runs here (no watchdog)."""
    if not can_fork():
        return _here(fn, args, on_message)
    try:
        child = Child.start(fn, args, daemon=daemon, die_with_parent=die_with_parent)
    except OSError as exc:
        return ChildResult(failure="exception", detail=f"could not start: {exc}")
    try:
        result = child.take(None if deadline is None else deadline - time.perf_counter(), on_message)
    finally:
        child.stop()
    return result if result is not None else ChildResult(failure="timeout")


class Waiting:
    """`fn(send, *args, *more)` forked now, started later when `run` hands it `more`: the fork and the pages the
    caller writes meanwhile are paid before the work's deadline, not inside it (the CP-SAT worker is forked at the
    start of the cycle and given the greedy plan when the greedy cycle ends). A process that is never run is
    `cancel`led: its input pipe closes, it returns None and is reaped."""

    def __init__(self, fn: Fn, args: Sequence[Any] = (), *, daemon: bool = True) -> None:
        ctx = mp.get_context("fork")
        self._inbox, self._outbox = ctx.Pipe(duplex=False)
        try:
            self.child: Child | None = Child.start(_wait_then, (self._inbox, self._outbox, fn, tuple(args)),
                                                   daemon=daemon, die_with_parent=True)
        except BaseException:
            self._outbox.close()
            raise
        finally:
            self._inbox.close()

    def run(self, more: Sequence[Any], *, deadline: float | None, on_message: Send | None = None) -> ChildResult:
        """Start the work with `more` and take its result as run_in_child does (hard watchdog at `deadline`)."""
        child, self.child = self.child, None
        if child is None:
            return ChildResult(failure="exception", detail="could not start: already run or cancelled")
        try:
            try:
                self._outbox.send(tuple(more))
            except (OSError, ValueError) as exc:  # it died while waiting
                return child.take(0.0) or ChildResult(failure="crash", detail=f"{type(exc).__name__}: {exc}")
            result = child.take(None if deadline is None else deadline - time.perf_counter(), on_message)
        finally:
            self._outbox.close()
            child.stop()
        return result if result is not None else ChildResult(failure="timeout")

    def cancel(self) -> None:
        """The work is not wanted: the process ends without doing it."""
        child, self.child = self.child, None
        self._outbox.close()
        if child is not None:
            child.stop()


def _wait_then(send: Send, inbox: Connection, outbox: Connection, fn: Fn, args: tuple[Any, ...]) -> Any:
    """The waiting child: its copy of the writing end closed (so the caller's close or death ends the wait),
    then `fn` with what arrives; None when nothing does."""
    outbox.close()
    try:
        more = inbox.recv()
    except (EOFError, OSError):
        return None
    finally:
        inbox.close()
    return fn(send, *args, *more)


def _here(fn: Fn, args: Sequence[Any], on_message: Send | None) -> ChildResult:
    try:
        return ChildResult(value=fn(on_message if on_message is not None else _ignore, *args))
    except Exception:
        trace = traceback.format_exc(limit=-3)
        return ChildResult(failure="exception", detail=last_line(trace), trace=trace)


def _ignore(_message: Any) -> None:
    pass


def _main(conn: Connection, fn: Fn, args: tuple[Any, ...], parent_pid: int | None) -> None:
    """The child: its messages, then its result or its traceback; if it dies instead, the parent reads the end
    of the pipe."""
    if parent_pid is not None:
        _die_with(parent_pid)
    try:
        conn.send((RETURN, fn(lambda message: conn.send((MESSAGE, message)), *args)))
    except Exception:  # reported to the parent, never a hang there
        conn.send((RAISE, traceback.format_exc(limit=-3)))
    finally:
        conn.close()


def _die_with(parent_pid: int) -> None:
    """Linux: this process is killed when the one that forked it dies. Elsewhere, or if that fails, it is left
    as it was."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # it died before the request took effect
        os._exit(1)
