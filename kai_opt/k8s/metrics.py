"""Prometheus metrics of the scheduler (own registry, names prefixed `kai_opt_`) and the HTTP endpoint that serves
them together with the `/healthz` (liveness) and `/readyz` (readiness) probes.

Series: `kai_opt_cycle_phase_seconds{phase}` (histogram: snapshot, fair_share, solve, apply, total),
`kai_opt_solver_status_total{status}`, `kai_opt_solver_gap` (relative gap of the last solve; NaN when unknown),
`kai_opt_solver_failures_total{stage,kind}` (optional stages that failed while the cycle went on with the greedy
plan: kai_opt.plan.FAILURE_STAGES x FAILURE_KINDS),
`kai_opt_pods_bound_total`, `kai_opt_pods_evicted_total{reason}`, `kai_opt_bind_latency_seconds` (histogram),
`kai_opt_bind_failures_total{reason}`, `kai_opt_binds_dropped_total{reason}` (binds the pre-bind re-check dropped
because the pod no longer fit its node: reason = the resource, gpu-device or node-gone),
`kai_opt_pods_rejected_by_kubelet_total{reason}` (our pods the kubelet set Failed at admission: OutOfcpu, ...),
`kai_opt_queue_fair_share{queue,resource}`, `kai_opt_queue_allocated{...}`,
`kai_opt_queue_requested{...}`, `kai_opt_queue_usage{queue,resource}` (time-based fair share: past usage over
the window's capacity; only while usage is configured), `kai_opt_leader` (1 while this replica leads),
`kai_opt_ready`.

/readyz is ok once the watch cache has synced, on the leader and on a standby replica alike (a standby can take
over at once; rollouts wait for every replica to be ready); which replica leads is `kai_opt_leader`.
"""

from __future__ import annotations

import contextlib
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

PHASES = ("snapshot", "fair_share", "solve", "apply", "total")
_PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BIND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SchedulerMetrics:
    """The scheduler's metrics. Thread-safe (prometheus-client series are); one instance per process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self._phase = Histogram("kai_opt_cycle_phase_seconds", "Duration of one scheduling cycle's phase",
                                ["phase"], buckets=_PHASE_BUCKETS, registry=r)
        self._solver_status = Counter("kai_opt_solver_status", "Solves by outcome (optimal, feasible, "
                                      "fallback, ...)", ["status"], registry=r)
        self._solver_failures = Counter("kai_opt_solver_failures", "Optional stages of a cycle that failed (the "
                                        "cycle went on with the greedy plan), by stage and kind", ["stage", "kind"],
                                        registry=r)
        self._solver_gap = Gauge("kai_opt_solver_gap", "Relative optimality gap of the last solve (NaN: unknown)",
                                 registry=r)
        self._bound = Counter("kai_opt_pods_bound", "Pods bound to a node", registry=r)
        self._evicted = Counter("kai_opt_pods_evicted", "Pods evicted, by reason", ["reason"], registry=r)
        self._bind_latency = Histogram("kai_opt_bind_latency_seconds", "Time of one binding request",
                                       buckets=_BIND_BUCKETS, registry=r)
        self._bind_failures = Counter("kai_opt_bind_failures", "Failed bindings, by reason", ["reason"],
                                      registry=r)
        self._binds_dropped = Counter("kai_opt_binds_dropped", "Binds dropped right before the request because "
                                      "the pod no longer fit its node, by resource", ["reason"], registry=r)
        self._kubelet_rejected = Counter("kai_opt_pods_rejected_by_kubelet", "Pods of ours the kubelet rejected "
                                         "at admission (phase Failed), by status.reason", ["reason"], registry=r)
        labels = ["queue", "resource"]
        self._fair_share = Gauge("kai_opt_queue_fair_share", "Fair share of a queue", labels, registry=r)
        self._allocated = Gauge("kai_opt_queue_allocated", "Resources allocated to a queue", labels, registry=r)
        self._requested = Gauge("kai_opt_queue_requested", "Resources requested by a queue", labels, registry=r)
        self._usage = Gauge("kai_opt_queue_usage", "Past usage of a queue over the window's cluster capacity "
                            "(time-based fair share)", labels, registry=r)
        self._leader = Gauge("kai_opt_leader", "1 while this replica is the leader", registry=r)
        self._ready_gauge = Gauge("kai_opt_ready", "1 while the scheduler reports ready", registry=r)
        self._solver_gap.set(math.nan)
        self._queue_series: dict[str, set[str]] = {}
        self._usage_series: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._ready = False
        self.healthy = True  # liveness: set False when the scheduler loop is wedged
        self._server: ThreadingHTTPServer | None = None

    # -- recording ---------------------------------------------------------------------------------------------------
    def cycle_phase(self, phase: str, seconds: float) -> None:
        """Record how long `phase` (snapshot, fair_share, solve, apply, total) of one cycle took."""
        self._phase.labels(phase=phase).observe(max(seconds, 0.0))

    def solver(self, status: str, gap: float | None) -> None:
        """Record a solve's outcome and relative gap (None: not known, e.g. the greedy plan was used)."""
        self._solver_status.labels(status=status).inc()
        self._solver_gap.set(math.nan if gap is None else gap)

    def solver_failure(self, stage: str, kind: str) -> None:
        """Count an optional stage (cpsat, decode, second_hint) that failed (exception, crash, timeout, violation)
        in a cycle that went on without it."""
        self._solver_failures.labels(stage=stage, kind=kind).inc()

    def bound(self, n: int = 1) -> None:
        self._bound.inc(n)

    def evicted(self, reason: str, n: int = 1) -> None:
        self._evicted.labels(reason=reason).inc(n)

    def bind_latency(self, seconds: float) -> None:
        self._bind_latency.observe(max(seconds, 0.0))

    def bind_failure(self, reason: str) -> None:
        self._bind_failures.labels(reason=reason).inc()

    def bind_dropped(self, reason: str) -> None:
        self._binds_dropped.labels(reason=reason).inc()

    def kubelet_rejected(self, reason: str) -> None:
        self._kubelet_rejected.labels(reason=reason).inc()

    def queue(self, name: str, fair_share: dict[str, float], allocated: dict[str, float],
              requested: dict[str, float]) -> None:
        """Set a queue's fair share, allocation and request per resource; resources it no longer reports are
        dropped from its series."""
        with self._lock:
            resources = set(fair_share) | set(allocated) | set(requested)
            for gone in self._queue_series.get(name, set()) - resources:
                for gauge in (self._fair_share, self._allocated, self._requested):
                    _remove(gauge, name, gone)
            self._queue_series[name] = resources
            for gauge, values in ((self._fair_share, fair_share), (self._allocated, allocated),
                                  (self._requested, requested)):
                for res in resources:
                    if res in values:
                        gauge.labels(queue=name, resource=res).set(values[res])
                    else:
                        _remove(gauge, name, res)

    def queue_usage(self, name: str, usage: dict[str, float]) -> None:
        """Set a queue's time-based fair share usage per resource."""
        with self._lock:
            for res, value in usage.items():
                self._usage.labels(queue=name, resource=res).set(value)
            self._usage_series.setdefault(name, set()).update(usage)

    def remove_queue(self, name: str) -> None:
        """Drop every series of a queue that no longer exists."""
        with self._lock:
            for res in self._queue_series.pop(name, set()):
                for gauge in (self._fair_share, self._allocated, self._requested):
                    _remove(gauge, name, res)
            for res in self._usage_series.pop(name, set()):
                _remove(self._usage, name, res)

    def leader(self, is_leader: bool) -> None:
        self._leader.set(1 if is_leader else 0)

    # -- probes ------------------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = bool(value)
        self._ready_gauge.set(1 if value else 0)

    def text(self) -> str:
        """The metrics in Prometheus' text exposition format."""
        return generate_latest(self.registry).decode("utf-8")

    # -- serving -----------------------------------------------------------------------------------------------------
    def serve(self, port: int, host: str = "") -> int:
        """Serve /metrics, /healthz and /readyz on `port` (0: any free port) in a daemon thread; returns the
        port. /readyz answers 503 until `ready` is set."""
        if self._server is not None:
            raise RuntimeError("metrics endpoint already serving")
        server = ThreadingHTTPServer((host, port), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="kai-opt-metrics", daemon=True).start()
        self._server = server
        return int(server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _remove(gauge: Gauge, queue: str, resource: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(queue, resource)


def _handler(metrics: SchedulerMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/"):
                self._send(200, metrics.text().encode(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                ok = metrics.healthy
                self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
            elif path == "/readyz":
                ok = metrics.ready
                self._send(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
            return

    return Handler
