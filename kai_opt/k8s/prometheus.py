"""Past usage from Prometheus as KAI-Scheduler queries it (plain HTTP, the standard library).

Per resource, one instant query of the decayed allocation metric summed over the window and one of the decayed
capacity metric; a queue's usage is the first over the second (label queue_name). Decay: each sample times
0.5 ^ ((now - its time) / halfLifePeriod). Sliding window: the last windowSize; tumbling and cron: from the last
reset (tumblingWindowStartTime + n windowSize, or the last occurrence of cronString before now; KAI runs a range
query there whose result its own check refuses; kai-opt sums the same samples with a subquery from the reset to
now instead).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kai_opt.fairshare.history import HistoricalUsage
from kai_opt.fairshare.usage_ledger import UsageWindow, window_start
from kai_opt.k8s.client import ClusterError

RESOURCES = ("gpu", "cpu", "memory")  # queue resource order


class PrometheusUsage:
    def __init__(self, url: str, params: Any) -> None:
        """`params`: the config's usage_params (kai_opt.config.UsageParams)."""
        self.url = url.rstrip("/")
        self.window = UsageWindow.of(params)
        extra = params.extra_params
        self.timeout = float(extra.usage_query_timeout)
        self.resolution = float(extra.query_resolution)
        self.allocation = (extra.gpu_allocation_metric, extra.cpu_allocation_metric, extra.memory_allocation_metric)
        self.capacity = (extra.gpu_capacity_metric, extra.cpu_capacity_metric, extra.memory_capacity_metric)

    def query_text(self, metric: str, now: float) -> str:
        """The PromQL KAI sends for one metric at `now`: decayed, summed over the window at the resolution."""
        decayed = metric
        if self.window.half_life_s:
            decayed = f"(({metric}) * (0.5^(({int(now)} - time()) / {self.window.half_life_s:f})))"
        span = max(0, round(now - window_start(self.window, now)))
        return f"sum_over_time(({decayed})[{span}s:{int(self.resolution)}s])"

    def fetch(self, now: float | None = None) -> HistoricalUsage:
        """Raises ClusterError when Prometheus cannot answer (KAI then keeps its last usage)."""
        t = time.time() if now is None else now
        used: dict[str, list[float]] = {}
        for r, (alloc, cap) in enumerate(zip(self.allocation, self.capacity, strict=True)):
            capacity_rows = self._query(self.query_text(cap, t), t)
            if not capacity_rows:
                raise ClusterError(f"Prometheus: no data for the {RESOURCES[r]} capacity metric {cap}")
            capacity = capacity_rows[0][1]
            for name, value in self._query(self.query_text(alloc, t), t):
                if name is None:
                    continue
                used.setdefault(name, [0.0, 0.0, 0.0])[r] = value / capacity if capacity > 0 else 0.0
        return HistoricalUsage({k: (v[0], v[1], v[2]) for k, v in used.items()})

    def _query(self, promql: str, t: float) -> list[tuple[str | None, float]]:
        query = urllib.parse.urlencode({"query": promql, "time": f"{t:.3f}"})
        req = urllib.request.Request(f"{self.url}/api/v1/query?{query}", headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ClusterError(f"Prometheus query failed ({self.url}): {exc}") from None
        if body.get("status") != "success":
            raise ClusterError(f"Prometheus query failed: {body.get('errorType')}: {body.get('error')}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise ClusterError(f"Prometheus: unexpected result type {data.get('resultType')!r}, want vector")
        out: list[tuple[str | None, float]] = []
        for sample in data.get("result") or []:
            value = float(sample["value"][1])
            if math.isfinite(value):
                out.append(((sample.get("metric") or {}).get("queue_name"), value))
        return out
