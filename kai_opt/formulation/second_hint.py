"""The second hint: the greedy cycle with FGD scoring (`placement: {gpu: fgd, cpu: fgd}`), a starting plan for the
model and a candidate for the cycle's plan when it is as KAI-compatible as the KAI-scored plan and better.

With wall time it runs in a forked process of its own, at a lower CPU priority, beside the rest of the KAI-scored
greedy cycle (which uses one core) and the model build (one core): from the start of a very long cycle, from the
end of the allocate action in a long one whose plan may be beaten (engine.fork_early), beside the model in a short
one; it takes nothing from the CP-SAT budget. Otherwise a cycle whose plan nothing beats computes it inline
(kept_unbeatable). The CP-SAT worker starts from it if it is ready when the worker builds its scope; otherwise the
engine weighs it against the worker's plan at the end, until the budget's deadline. Deterministic mode computes it
in the CP-SAT worker, before the model (reproducible: whether it is ready in time is a wall-clock question).
The process beside is a kai_opt.formulation.child.Child (the start/poll/take form).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config, Placement, Strategy
from kai_opt.fairshare import FairShare
from kai_opt.formulation.child import Child, Send, can_fork
from kai_opt.heuristics.cycle import AfterAction, Progress, greedy_plan
from kai_opt.plan import Plan
from kai_opt.state import ClusterState

NICE = 10  # the process yields to the CP-SAT workers (2 cores: about a tenth of a core while both search)
SLOWDOWN = 2.0  # FGD scoring makes a greedy cycle up to this much slower than KAI scoring, so its plan can arrive
# by the deadline only if the budget is at least (SLOWDOWN - 1) x the KAI-scored cycle (keep_going)


def action_seconds(greedy: Plan) -> float:
    """The greedy cycle's action phases (fair share and the total left out): what SLOWDOWN scales."""
    return sum(v for k, v in greedy.phases.items() if k not in ("fair_share", "total"))


def fgd_config(config: Config) -> Config:
    return config.model_copy(update={"placement": Placement(gpu=Strategy.fgd, cpu=Strategy.fgd)})


def is_fgd_scored(plan: Plan) -> bool:
    """Whether `plan` is the FGD-scored greedy plan as computed: it carries hint fgd and is not the model's own plan
    (OPTIMAL or FEASIBLE, a model that started from it); kept (GREEDY_KEPT) or a fallback (FALLBACK_GREEDY)."""
    return plan.solver.hint == "fgd" and plan.solver.status not in ("OPTIMAL", "FEASIBLE")


def wanted(config: Config, actions: tuple[str, ...] | None) -> bool:
    """Whether this cycle computes a second hint: the option is on, the cycle places (allocate), and the first
    greedy plan is not FGD-scored already."""
    return (config.solver.fgd_hint and config.placement.gpu != Strategy.fgd
            and (actions is None or "allocate" in actions))


def compute(state: ClusterState, fs: FairShare, config: Config, actions: tuple[str, ...] | None,
            after: AfterAction | None = None, progress: Progress | None = None) -> Plan | None:
    """The FGD-scored greedy plan, or None if it fails the checker (it is then never used; None means only that).
    `after`, `progress`: as greedy_plan's."""
    alt_config = fgd_config(config)
    plan = greedy_plan(state, fs, alt_config, actions, progress, after)
    try:
        check_plan(state, plan, fs, alt_config)
    except PlanViolation:
        return None
    return plan


def _beside(_send: Send, state: ClusterState, fs: FairShare, config: Config,
            actions: tuple[str, ...] | None) -> tuple[Plan | None, float]:
    """The process beside: at a lower priority, the plan (None: it failed the checker) and how long it took."""
    os.nice(NICE)
    t = time.perf_counter()
    return compute(state, fs, config, actions), time.perf_counter() - t


class SecondHint:
    """The FGD-scored greedy plan being computed in a forked process (kai_opt.formulation.child). The CP-SAT
    worker (forked later) inherits the reading end and may `take` it; the engine's process then learns that from
    the worker's plan (`SolverInfo.hint`) and only `close`s."""

    def __init__(self, child: Child | None) -> None:
        self._child = child
        self.started = time.perf_counter()
        self.taken = child is None  # (None: it could not start, see `failure`)
        self.seconds: float | None = None  # how long the computation took (once taken)
        self.failure: tuple[str, str] | None = None  # (kind, what happened) once it is known to have failed:
        # exception, violation (its plan failed the checker), crash (died without a message; seen by the process
        # that started it, which alone can read its exit status). A timeout is the caller's to judge.
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._greedy_done = False
        self._stopped = False  # by the watch: the KAI-scored cycle outran what keep_going allows
        self._expires_at: float | None = None  # when the watch stops the process (a time.perf_counter() value)

    @classmethod
    def start(cls, state: ClusterState, fs: FairShare, config: Config,
              actions: tuple[str, ...] | None) -> SecondHint | None:
        """Fork the computation (wall-time mode only; None when not wanted or without fork)."""
        if config.solver.deterministic or not wanted(config, actions) or not can_fork():
            return None
        try:
            return cls(Child.start(_beside, (state, fs, config, actions)))
        except OSError as exc:  # no fork (out of memory, process limit): the cycle goes on without the hint
            failed = cls(None)
            failed.failure = ("exception", f"the FGD-scored second hint could not start: {exc}")
            return failed

    @classmethod
    def start_watched(cls, state: ClusterState, fs: FairShare, config: Config, actions: tuple[str, ...] | None,
                      cycle_start: float) -> SecondHint | None:
        """`start`, then `watch` from `cycle_start`; nothing is forked once the watch's moment has passed (the
        KAI-scored cycle already ran too long for the plan to pass keep_going: it would be stopped at once)."""
        budget = config.solver.time_budget_s
        if time.perf_counter() >= cycle_start + budget / (SLOWDOWN - 1.0):
            return None
        second = cls.start(state, fs, config, actions)
        if second is not None:  # (a thread)
            second.watch(cycle_start, budget)
        return second

    def watch(self, cycle_start: float, budget_s: float) -> None:
        """Apply keep_going's rule while the KAI-scored cycle still runs: once that cycle has run longer than
        budget / (SLOWDOWN - 1) (from `cycle_start`, a time.perf_counter() value) its end cannot pass the rule, so
        a plan not ready by then is stopped at that moment instead of competing for the cores until the cycle ends
        (docs/DESIGN-NOTES.md, CP-SAT engine)."""
        if self._child is None:
            return
        self._expires_at = cycle_start + budget_s / (SLOWDOWN - 1.0)
        self._arm()

    def _arm(self) -> None:
        assert self._expires_at is not None
        self._timer = threading.Timer(max(0.0, self._expires_at - time.perf_counter()), self._expire)
        self._timer.daemon = True
        self._timer.start()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The watch's thread stopped meanwhile (a process forked inside inherits no thread), then armed again
        for the same moment."""
        timer, self._timer = self._timer, None
        if timer is None:
            yield
            return
        timer.cancel()
        timer.join()
        try:
            yield
        finally:
            with self._lock:
                rearm = not (self._greedy_done or self._stopped or self.taken)
            if rearm:
                self._arm()

    def _expire(self) -> None:
        with self._lock:
            if self._greedy_done or self.taken or self._child is None or self._child.poll(0):
                return
            self._child.stop()
            self._stopped = True

    def _unwatch(self) -> None:
        with self._lock:
            self._greedy_done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()  # no thread is left when the CP-SAT worker forks
            self._timer = None

    def keep_going(self, greedy_s: float, budget_s: float) -> bool:
        """After the KAI-scored cycle took `greedy_s`: whether the plan can still arrive by the deadline
        (`budget_s` later); if not, the process is stopped now (budget below (SLOWDOWN - 1) x greedy_s), or was
        stopped by `watch` already."""
        self._unwatch()
        if self._stopped:
            return False
        if budget_s >= (SLOWDOWN - 1.0) * greedy_s or self.ready():
            return True
        self.close()
        return False

    def expected_s(self, work_s: float) -> float | None:
        """When the plan is expected to arrive, in seconds from now, for a computation of `work_s` CPU seconds
        in all: the CPU time it still needs at the share of a core it got since it started (a process beside
        that the machine starves is expected late). None when its CPU time cannot be read."""
        if self._child is None or self.taken or self._stopped:
            return None
        used = self._child.cpu_seconds()
        elapsed = time.perf_counter() - self.started
        if used is None or elapsed <= 0.0:
            return None
        share = used / elapsed
        return max(0.0, work_s - used) / share if share > 0.0 else float("inf")

    def ready(self) -> bool:
        """The plan (or its failure) has arrived and nobody took it yet."""
        return not self.taken and not self._stopped and self._child is not None and self._child.poll(0)

    def take(self, timeout: float = 0.0) -> Plan | None:
        """The plan, waiting up to `timeout` seconds; None when it is not there in time, failed (`failure`), or
        was taken."""
        if self.taken or self._child is None or self._stopped:
            return None
        ended = self._child.take(max(0.0, timeout))
        if ended is None:
            return None
        self.taken = True
        if ended.failure == "crash":
            # the pipe ended without a message for us: a crash when the process did not exit cleanly, else another
            # process took its message (only the process that started it can tell)
            if ended.exitcode not in (None, 0) or (ended.exitcode is None and self._child.owned):
                self.failure = ("crash", f"the FGD-scored second hint died without a plan ({ended.detail})")
            return None
        if ended.failure is not None:  # it raised, or its message did not unpickle
            self.failure = ("exception", "the FGD-scored second hint failed: "
                            + (ended.trace or ended.detail).strip()[-300:])
            return None
        plan, self.seconds = ended.value
        if plan is None:
            self.failure = ("violation", "the FGD-scored greedy plan failed the checker")
        return plan

    def close(self) -> None:
        """Stop the computation if it still runs (only in the process that started it)."""
        self._unwatch()
        if self._child is not None:
            self._child.stop()
