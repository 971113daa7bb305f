"""The queue metrics of each cycle (fair share, allocation, request, time-based usage per queue and resource).

Only the queues whose rows changed since the last cycle are set again: most queues keep their amounts from one
cycle to the next, and setting every labelled series of ~1,000 queues cost about 20 ms per cycle. A queue that is no
longer in the cycle's state (deleted, or rejected) has its series removed, so a dashboard stops showing its last
amounts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.fairshare import FairShare
from kai_opt.state import ClusterState
from kai_opt.state.resources import QR


class QueueMetrics:
    """Publishes a cycle's queue amounts to a metrics sink (SchedulerMetrics: `queue`, `queue_usage`,
    `remove_queue`), remembering what each queue last published."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self._last: dict[str, bytes] = {}  # queue -> its published rows

    def publish(self, state: ClusterState, fs: FairShare) -> None:
        parts = [fs.fair_share, fs.allocated, fs.requested] + ([fs.usage] if fs.usage is not None else [])
        rows = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts], axis=1)
        last, now = self._last, {}
        for q, name in enumerate(state.q_names):
            key = rows[q].tobytes()
            now[name] = key
            if last.get(name) == key:
                continue
            self.metrics.queue(name, {r: float(fs.fair_share[q, i]) for i, r in enumerate(QR)},
                               {r: float(fs.allocated[q, i]) for i, r in enumerate(QR)},
                               {r: float(fs.requested[q, i]) for i, r in enumerate(QR)})
            if fs.usage is not None:
                self.metrics.queue_usage(name, {r: float(fs.usage[q, i]) for i, r in enumerate(QR)})
        for name in last.keys() - now.keys():
            self.metrics.remove_queue(name)
        self._last = now
