"""The second hint: the greedy cycle with FGD scoring (`placement: {gpu: fgd, cpu: fgd}`), a starting plan for the
model and a candidate for the cycle's plan when it is as KAI-compatible as the KAI-scored plan and better.

With wall time it runs in a forked process of its own from the start of the cycle, at a lower CPU priority, beside
the KAI-scored greedy cycle (which uses one core) and the model build (one core): it takes nothing from the CP-SAT
budget. The CP-SAT worker starts from it if it is ready when the worker builds its scope; otherwise the engine
weighs it against the worker's plan at the end, until the budget's deadline. Deterministic mode computes it in
the process, before the model (reproducible).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from multiprocessing.connection import Connection

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config, Placement, Strategy
from kai_opt.fairshare import FairShare
from kai_opt.formulation.failures import exit_reason
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.plan import Plan
from kai_opt.state import ClusterState

NICE = 10  # the process yields to the CP-SAT workers (2 cores: about a tenth of a core while both search)
SLOWDOWN = 2.0  # FGD scoring makes a greedy cycle up to this much slower than KAI scoring (fractions-1000-s1:
# 4.5 s against 1.9 s, allocate 4.0 against 1.3 s), so its plan can arrive by the deadline only if the budget is at
# least (SLOWDOWN - 1) x the KAI-scored cycle (keep_going)


def fgd_config(config: Config) -> Config:
    return config.model_copy(update={"placement": Placement(gpu=Strategy.fgd, cpu=Strategy.fgd)})


def wanted(config: Config, actions: tuple[str, ...] | None) -> bool:
    """Whether this cycle computes a second hint: the option is on, the cycle places (allocate), and the first
    greedy plan is not FGD-scored already."""
    return (config.solver.fgd_hint and config.placement.gpu != Strategy.fgd
            and (actions is None or "allocate" in actions))


def compute(state: ClusterState, fs: FairShare, config: Config, actions: tuple[str, ...] | None) -> Plan | None:
    """The FGD-scored greedy plan, or None if it fails the checker (it is then never used; None means only that)."""
    alt_config = fgd_config(config)
    plan = greedy_plan(state, fs, alt_config, actions)
    try:
        check_plan(state, plan, fs, alt_config)
    except PlanViolation:
        return None
    return plan


def _child(conn: Connection, state: ClusterState, fs: FairShare, config: Config,
           actions: tuple[str, ...] | None) -> None:
    try:
        os.nice(NICE)
        t = time.perf_counter()
        plan = compute(state, fs, config, actions)
        if plan is None:
            conn.send(("violation", "the FGD-scored greedy plan failed the checker", time.perf_counter() - t))
        else:
            conn.send(("plan", plan, time.perf_counter() - t))
    except Exception:  # the hint is optional: report, never fail the cycle
        conn.send(("error", traceback.format_exc(limit=-3), 0.0))
    finally:
        conn.close()


class SecondHint:
    """The FGD-scored greedy plan being computed in a forked process. The CP-SAT worker (forked later) inherits
    the reading end and may `take` it; the engine's process then learns that from the worker's plan
    (`SolverInfo.hint`) and only `close`s."""

    def __init__(self, proc: mp.process.BaseProcess | None, conn: Connection | None) -> None:
        self._proc = proc
        self._conn = conn
        self._pid = os.getpid()  # the process that forked it (only that one may kill or join it)
        self.taken = proc is None  # (None: it could not start, see `failure`)
        self.seconds: float | None = None  # how long the computation took (once taken)
        self.failure: tuple[str, str] | None = None  # (kind, what happened) once it is known to have failed:
        # exception, violation (its plan failed the checker), crash (died without a message; seen by the process
        # that started it, which alone can read its exit status). A timeout is the caller's to judge.

    @classmethod
    def start(cls, state: ClusterState, fs: FairShare, config: Config,
              actions: tuple[str, ...] | None) -> SecondHint | None:
        """Fork the computation (wall-time mode only; None when not wanted or without fork)."""
        if (config.solver.deterministic or not wanted(config, actions)
                or "fork" not in mp.get_all_start_methods()):
            return None
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, state, fs, config, actions), daemon=True)
        try:
            proc.start()
        except OSError as exc:  # no fork (out of memory, process limit): the cycle goes on without the hint
            parent.close()
            child.close()
            failed = cls(None, None)
            failed.failure = ("exception", f"the FGD-scored second hint could not start: {exc}")
            return failed
        child.close()
        return cls(proc, parent)

    def keep_going(self, greedy_s: float, budget_s: float) -> bool:
        """After the KAI-scored cycle took `greedy_s`: whether the plan can still arrive by the deadline
        (`budget_s` later); if not, the process is stopped now (10,000 nodes: a 20 s greedy cycle, 1 s budget)."""
        if budget_s >= (SLOWDOWN - 1.0) * greedy_s or self.ready():
            return True
        self.close()
        return False

    def ready(self) -> bool:
        """The plan (or its failure) has arrived and nobody took it yet."""
        return not self.taken and self._conn is not None and self._conn.poll(0)

    def take(self, timeout: float = 0.0) -> Plan | None:
        """The plan, waiting up to `timeout` seconds; None when it is not there in time, failed (`failure`), or
        was taken."""
        if self.taken or self._conn is None:
            return None
        try:
            if not self._conn.poll(max(0.0, timeout)):
                return None
            kind, payload, seconds = self._conn.recv()
        except (EOFError, OSError):  # the process died, or another process took the plan
            self.taken = True
            self.failure = self._died()
            return None
        self.taken = True
        self.seconds = seconds
        if kind == "error":
            self.failure = ("exception", "the FGD-scored second hint failed: " + payload.strip()[-300:])
            return None
        if kind == "violation":
            self.failure = ("violation", payload)
            return None
        return payload

    def _died(self) -> tuple[str, str] | None:
        """Why the pipe ended without a message for us: a crash when the process did not exit cleanly, else
        another process took its message (None). Only the process that started it can tell."""
        if os.getpid() != self._pid or self._proc is None:
            return None
        self._proc.join(0.5)
        code = self._proc.exitcode
        if code == 0:
            return None
        return "crash", f"the FGD-scored second hint died without a plan ({exit_reason(code)})"

    def close(self) -> None:
        """Stop the computation if it still runs (only in the process that started it)."""
        if os.getpid() != self._pid or self._proc is None or self._conn is None:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(1.0)
        self._conn.close()
