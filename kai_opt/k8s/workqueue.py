"""What the binder, evictor and status writer share: a token bucket (client QPS/burst), a keyed worker pool and
the classification of API errors into transient (retry) and permanent ones."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import urllib3
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; thread-safe."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst = float(rate), float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def try_acquire(self) -> bool:
        """Take a token if one is there now."""
        with self._lock:
            self._refill()
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a token; False when `stop` was set while waiting."""
        while True:
            with self._lock:
                self._refill()
                if self._tokens >= 1:
                    self._tokens -= 1
                    return True
                wait = (1 - self._tokens) / self.rate
            if stop is not None:
                if stop.wait(wait):
                    return False
            else:
                time.sleep(wait)


class WorkPool:
    """Up to `workers` threads running keyed jobs. A key is at most once in the pool: `submit` of a key that is
    queued or running is refused (`replace=False`, the binder's "never twice") or, with `replace=True`, replaces
    the queued job (latest wins: status writes), or runs after the running one."""

    def __init__(self, name: str, workers: int) -> None:
        self.name = name
        self.workers = workers
        self._queue: OrderedDict[str, Callable[[], None]] = OrderedDict()
        self._running: set[str] = set()
        self._later: dict[str, Callable[[], None]] = {}  # replacing a running key: runs after it
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    def submit(self, key: str, job: Callable[[], None], *, replace: bool = False) -> bool:
        with self._cond:
            if self._stopped:
                return False
            if key in self._running:
                if not replace:
                    return False
                self._later[key] = job
                return True
            if key in self._queue and not replace:
                return False
            self._queue[key] = job
            self._ensure_threads()
            self._cond.notify()
            return True

    def busy(self, key: str) -> bool:
        with self._cond:
            return key in self._queue or key in self._running

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._running) + len(self._later)

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._running or self._later:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 1.0)
            return True

    def stop(self, *, drop_queued: bool = True) -> int:
        """No new jobs; queued ones are dropped (or still run) and running ones finish. Returns how many queued
        jobs were dropped."""
        with self._cond:
            self._stopped = True
            dropped = 0
            if drop_queued:
                dropped = len(self._queue) + len(self._later)
                self._queue.clear()
                self._later.clear()
            self._cond.notify_all()
            return dropped

    def drain(self, timeout: float) -> int:
        """Stop taking jobs, let the queued ones run for up to `timeout` seconds, then drop what is left (a
        shutdown must end even when every job fails slowly, e.g. with the apiserver gone). Returns how many were
        dropped."""
        self.stop(drop_queued=False)
        if self.wait_idle(timeout):
            return 0
        return self.stop(drop_queued=True)

    def _ensure_threads(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        if len(self._threads) < self.workers and len(self._threads) < len(self._queue) + len(self._running):
            t = threading.Thread(target=self._loop, name=f"{self.name}-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if (self._stopped or not self._cond.wait(timeout=5.0)) and not self._queue:
                        # idle (or stopped): the thread ends; a new one starts with new work
                        self._threads = [t for t in self._threads if t is not threading.current_thread()]
                        self._cond.notify_all()
                        return
                key, job = self._queue.popitem(last=False)
                self._running.add(key)
            try:
                job()
            except Exception:  # a job's own errors are its business; never kill the worker
                log.exception("%s: job %s failed", self.name, key)
            finally:
                with self._cond:
                    self._running.discard(key)
                    later = self._later.pop(key, None)
                    if later is not None and not self._stopped:
                        self._queue[key] = later
                    self._cond.notify_all()


# -- API errors ------------------------------------------------------------------------------------------------------
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Failure:
    """A failed request: HTTP status (0 = no answer), whether a retry may help, and a one-line reason."""

    status: int
    transient: bool
    message: str


def classify(exc: BaseException) -> Failure:
    """Transient: throttling (429 without a PodDisruptionBudget), server errors, timeouts, connection errors."""
    if isinstance(exc, ApiException):
        from kai_opt.k8s.client import status_message

        msg = status_message(exc) or str(exc.reason or "")
        return Failure(int(exc.status or 0), int(exc.status or 0) in TRANSIENT_STATUS, msg)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return Failure(0, True, " ".join(str(exc).split()) or type(exc).__name__)
    return Failure(0, False, " ".join(str(exc).split()) or type(exc).__name__)


def backoff_delays(first: float, retries: int, cap: float = 30.0) -> list[float]:
    """Delays before each retry: first, 2x, 4x, ... capped."""
    return [min(cap, first * (2**i)) for i in range(retries)]
