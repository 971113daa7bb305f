"""kai-opt's own usage record when there is no Prometheus: per-queue resource-seconds in time buckets.

Buckets hold raw (undecayed) resource-seconds, as Prometheus holds raw samples: the half-life and the window are
applied when usage is read, so a changed configuration applies to the whole record. A bucket's samples count as
taken at its middle (at most `now`). Sliding window: buckets whose middle is within `window_size` of now; tumbling:
buckets whose middle is at or after the last reset (tumblingWindowStartTime + n * windowSize); cron: the same
from the last occurrence of cronString strictly before now (KAI's rule). Pure: the ConfigMap that keeps it lives
in kai_opt/k8s/usage_store.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kai_opt.cron import CronExpr, parse
from kai_opt.fairshare.history import HistoricalUsage, decay, normalize
from kai_opt.fairshare.share import cluster_total
from kai_opt.state import ClusterState
from kai_opt.usage import queue_usage

LEDGER_VERSION = 1


@dataclass(frozen=True)
class UsageWindow:
    """Which past usage counts and how much (KAI's usageParams, in seconds)."""

    window_size_s: float = 7 * 86400.0
    half_life_s: float | None = None
    tumbling_start: float | None = None  # unix seconds; set = a tumbling window
    cron: CronExpr | None = None  # set = a cron window (window_size unused)

    @classmethod
    def of(cls, params: Any) -> UsageWindow:
        """From the config's usage_params (kai_opt.config.UsageParams, which validated cron_string)."""
        return cls(window_size_s=float(params.window_size), half_life_s=params.half_life_period or None,
                   tumbling_start=params.tumbling_window_start_time if params.window_type == "tumbling" else None,
                   cron=parse(params.cron_string) if params.window_type == "cron" else None)


def held(state: ClusterState) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """What each queue holds now (subtree sums, as KAI's queue metrics) and the cluster capacity it is measured
    against, in queue units: every node's capacity, as KAI's sum(kube_node_status_capacity)."""
    alloc = queue_usage(state).allocated
    capacity = state.node_capacity_total if state.node_capacity_total is not None else cluster_total(state)
    return {name: alloc[q].copy() for q, name in enumerate(state.q_names)}, capacity.copy()


def window_start(window: UsageWindow, now: float) -> float:
    """The earliest sample time that still counts at `now`."""
    if window.cron is not None:
        reset = window.cron.previous(now)
        return now if reset is None else reset  # no occurrence before now (a year field ahead): an empty window
    if window.tumbling_start is None:
        return now - window.window_size_s
    if now <= window.tumbling_start:
        return now  # a start in the future: an empty window, as KAI
    # the last boundary strictly before now, as KAI (at a boundary the window that just ended still counts)
    n = math.ceil((now - window.tumbling_start) / window.window_size_s) - 1
    return window.tumbling_start + n * window.window_size_s


@dataclass
class Bucket:
    start: float
    capacity: np.ndarray  # float64[3] resource-seconds the cluster offered
    queues: dict[str, np.ndarray] = field(default_factory=dict)  # queue -> float64[3] resource-seconds used


@dataclass
class UsageLedger:
    bucket_s: float = 3600.0
    buckets: list[Bucket] = field(default_factory=list)
    last: float | None = None  # time of the last record

    def record(self, now: float, allocated: Mapping[str, np.ndarray], capacity: np.ndarray, *,
               max_gap_s: float) -> float:
        """Add what was held since the last record (at most `max_gap_s`: a longer gap, such as no leader, is not
        known and counts neither usage nor capacity). Returns the seconds counted."""
        if self.last is None or now <= self.last:
            self.last = now if self.last is None else max(self.last, now)
            return 0.0
        dt = min(now - self.last, max_gap_s)
        self.last = now
        if dt <= 0:
            return 0.0
        self.add(now, allocated, capacity, dt)
        return dt

    def add(self, at: float, allocated: Mapping[str, np.ndarray], capacity: np.ndarray, seconds: float) -> None:
        """Add `seconds` of these amounts (per second) to the bucket holding time `at`."""
        start = math.floor(at / self.bucket_s) * self.bucket_s
        b = next((x for x in reversed(self.buckets) if x.start <= start < x.start + self.bucket_s), None)
        if b is None:
            b = Bucket(start, np.zeros(3))
            self.buckets.append(b)
            self.buckets.sort(key=lambda x: x.start)
        b.capacity = b.capacity + np.asarray(capacity, dtype=np.float64) * seconds
        for name, amount in allocated.items():
            a = np.asarray(amount, dtype=np.float64)
            if a.any():
                b.queues[name] = b.queues.get(name, np.zeros(3)) + a * seconds

    @classmethod
    def seeded(cls, used: Mapping[str, np.ndarray], capacity: np.ndarray, *, at: float,
               bucket_s: float) -> UsageLedger:
        """A ledger holding these resource-seconds as of time `at` (a usage file's)."""
        ledger = cls(bucket_s=bucket_s, last=at)
        b = Bucket(at - bucket_s / 2, np.asarray(capacity, dtype=np.float64).copy(),
                   {k: np.asarray(v, dtype=np.float64).copy() for k, v in used.items()})
        ledger.buckets.append(b)
        return ledger

    def prune(self, window: UsageWindow, now: float) -> None:
        """Drop buckets that no longer count."""
        first = window_start(window, now)
        self.buckets = [b for b in self.buckets if self._when(b, now) >= first]

    def usage(self, window: UsageWindow, now: float) -> HistoricalUsage:
        first = window_start(window, now)
        used: dict[str, np.ndarray] = {}
        cap = np.zeros(3)
        for b in self.buckets:
            when = self._when(b, now)
            if when < first or b.start > now:
                continue
            w = decay(now - when, window.half_life_s)
            cap += b.capacity * w
            for name, amount in b.queues.items():
                used[name] = used.get(name, np.zeros(3)) + amount * w
        return normalize(used, cap)

    def _when(self, b: Bucket, now: float) -> float:
        return min(b.start + self.bucket_s / 2, now)

    # -- persistence (JSON) ----------------------------------------------------------------------------------------
    def to_json(self) -> str:
        data = {"version": LEDGER_VERSION, "bucket_s": float(self.bucket_s),
                "last": None if self.last is None else float(self.last),
                "buckets": [{"start": float(b.start), "capacity": b.capacity.tolist(),
                             "queues": {k: v.tolist() for k, v in sorted(b.queues.items())}} for b in self.buckets]}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, *, bucket_s: float) -> UsageLedger:
        """The ledger in `text`; raises ValueError when it is not one. A ledger kept with another bucket size is
        read as it is (its buckets keep their size until they leave the window)."""
        data: Any = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != LEDGER_VERSION:
            raise ValueError("not a kai-opt usage ledger (version 1)")
        ledger = cls(bucket_s=float(data.get("bucket_s") or bucket_s),
                     last=None if data.get("last") is None else float(data["last"]))
        for b in data.get("buckets") or []:
            ledger.buckets.append(Bucket(float(b["start"]), _vec(b["capacity"]),
                                         {str(k): _vec(v) for k, v in (b.get("queues") or {}).items()}))
        ledger.buckets.sort(key=lambda b: b.start)
        if not ledger.buckets:
            ledger.bucket_s = bucket_s
        return ledger


def _vec(v: Any) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.shape != (3,) or not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"bad amounts {v!r} (want three non-negative numbers)")
    return a
