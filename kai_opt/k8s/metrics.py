"""Prometheus metrics of the scheduler (own registry) and the HTTP endpoint that serves them together with the
`/healthz` (liveness) and `/readyz` (readiness) probes.

What KAI-Scheduler also exposes carries KAI's name, type, labels and unit (KAI's metrics namespace `kai`, so
`kai_<name>`; `queue_name` label; milliseconds, cores, GB as KAI has them), so KAI dashboards and alerts read
kai-opt unchanged; KAI_METRICS below lists them. Everything else is kai-opt's own, under the one prefix `kai_opt_`
(KAI_OPT_METRICS). Both lists are the registry the README table and the Grafana dashboard (kai_opt/k8s/dashboard.py)
are checked against.

/readyz is ok once the watch cache has synced, on the leader and on a standby replica alike (a standby can take
over at once; rollouts wait for every replica to be ready); which replica leads is `kai_opt_leader`.

The endpoint answers in OpenMetrics when the scrape's `Accept` header asks for `application/openmetrics-text`, in
Prometheus' text format otherwise (prometheus_client's choose_encoder).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from kai_opt.actions import ACTION_BY_NAME, ACTIONS


@dataclass(frozen=True)
class MetricSpec:
    """One exposed metric: its family name (a counter's samples end in `_total`), type, labels (in order), unit."""

    name: str
    type: str  # gauge | counter | histogram
    labels: tuple[str, ...]
    unit: str
    help: str


# KAI-Scheduler's metrics that kai-opt also computes, as KAI registers them (KAI commit 72de64f:
# pkg/scheduler/metrics/metrics.go and pkg/queuecontroller/metrics/metrics.go, namespace
# pkg/common/constants DefaultMetricsNamespace = "kai"). The unit is KAI's: milliseconds, CPU cores, memory in GB
# (10^9 bytes, KAI's resource_info.MemoryToGB) for fair share, bytes for allocation, GPU devices.
KAI_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("kai_e2e_scheduling_latency_milliseconds", "gauge", (), "milliseconds",
               "E2e scheduling latency in milliseconds (scheduling algorithm + binding), as a gauge"),
    MetricSpec("kai_open_session_latency_milliseconds", "gauge", (), "milliseconds",
               "Open session latency in milliseconds, including all plugins, as a gauge"),
    MetricSpec("kai_action_scheduling_latency_milliseconds", "gauge", ("action",), "milliseconds",
               "Action scheduling latency in milliseconds, as a gauge"),
    MetricSpec("kai_task_scheduling_latency_milliseconds", "histogram", (), "milliseconds",
               "Task scheduling latency in milliseconds"),
    MetricSpec("kai_task_bind_latency_milliseconds", "histogram", (), "milliseconds",
               "Task bind latency histogram in milliseconds"),
    MetricSpec("kai_pod_group_evicted_pods_total", "counter", ("podgroup", "namespace", "uid", "nodepool", "action"),
               "pods", "Total number of pods evicted per pod group"),
    MetricSpec("kai_queue_fair_share_cpu_cores", "gauge", ("queue_name",), "cores",
               "CPU Fair share of queue, as a gauge. Value is in Cores"),
    MetricSpec("kai_queue_fair_share_memory_gb", "gauge", ("queue_name",), "GB",
               "Memory Fair share of queue, as a gauge. Value is in GB"),
    MetricSpec("kai_queue_fair_share_gpu", "gauge", ("queue_name",), "devices",
               "GPU Fair share of queue, as a gauge. Values in GPU devices"),
    MetricSpec("kai_queue_cpu_usage", "gauge", ("queue_name",), "fraction",
               "CPU usage of queue, as a gauge. Units depend on UsageDB configuration"),
    MetricSpec("kai_queue_memory_usage", "gauge", ("queue_name",), "fraction",
               "Memory usage of queue, as a gauge. Units depend on UsageDB configuration"),
    MetricSpec("kai_queue_gpu_usage", "gauge", ("queue_name",), "fraction",
               "GPU usage of queue, as a gauge. Units depend on UsageDB configuration"),
    MetricSpec("kai_queue_allocated_gpus", "gauge", ("queue_name",), "devices", "Queue allocated GPUs"),
    MetricSpec("kai_queue_allocated_cpu_cores", "gauge", ("queue_name",), "cores", "Queue allocated CPUs"),
    MetricSpec("kai_queue_allocated_memory_bytes", "gauge", ("queue_name",), "bytes", "Queue allocated memory"),
)

# kai-opt's own metrics (no KAI counterpart): one prefix, kai_opt_.
KAI_OPT_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("kai_opt_cycle_phase_seconds", "histogram", ("phase",), "seconds",
               "Duration of one scheduling cycle's phase (group, snapshot, fair_share, solve, apply, total)"),
    MetricSpec("kai_opt_solver_status_total", "counter", ("status",), "solves",
               "Solves by outcome (OPTIMAL, FEASIBLE, FALLBACK_GREEDY, HEURISTIC, ...)"),
    MetricSpec("kai_opt_solver_gap", "gauge", (), "ratio", "Relative optimality gap of the last solve (NaN: unknown)"),
    MetricSpec("kai_opt_solver_failures_total", "counter", ("stage", "kind"), "failures",
               "Optional stages of a cycle that failed (the cycle went on with the greedy plan), by stage and kind"),
    MetricSpec("kai_opt_pods_bound_total", "counter", (), "pods", "Pods bound to a node"),
    MetricSpec("kai_opt_bind_failures_total", "counter", ("reason",), "binds", "Failed bindings, by reason"),
    MetricSpec("kai_opt_binds_dropped_total", "counter", ("reason",), "binds",
               "Binds dropped right before the request because the pod no longer fit its node, by resource"),
    MetricSpec("kai_opt_pods_rejected_by_kubelet_total", "counter", ("reason",), "pods",
               "Pods of ours the kubelet rejected at admission (phase Failed), by status.reason"),
    MetricSpec("kai_opt_queue_requested_gpus", "gauge", ("queue_name",), "devices", "GPUs requested by a queue"),
    MetricSpec("kai_opt_queue_requested_cpu_cores", "gauge", ("queue_name",), "cores", "CPU requested by a queue"),
    MetricSpec("kai_opt_queue_requested_memory_bytes", "gauge", ("queue_name",), "bytes",
               "Memory requested by a queue"),
    MetricSpec("kai_opt_leader", "gauge", (), "boolean", "1 while this replica is the leader"),
    MetricSpec("kai_opt_ready", "gauge", (), "boolean", "1 while the scheduler reports ready"),
)

METRICS: dict[str, MetricSpec] = {m.name: m for m in KAI_METRICS + KAI_OPT_METRICS}

PHASES = ("group", "snapshot", "fair_share", "solve", "apply", "total")
OPEN_SESSION_PHASES = ("group", "snapshot", "fair_share")  # KAI's open session: snapshot + plugins' set-up,
# its proportion plugin's fair share among them
_PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
KAI_MS_BUCKETS = tuple(5.0 * 2 ** i for i in range(10))  # KAI's prometheus.ExponentialBuckets(5, 2, 10): 5 .. 2560
# Queue resources (kai_opt.state.resources.QR) -> (KAI metric stem, factor from kai-opt's queue unit to KAI's)
_CORES, _GB = 1 / 1000.0, 1 / 1e9  # millicores -> cores; bytes -> GB (KAI's MemoryToGB = 10^9)
_FAIR_SHARE = {"gpu": ("kai_queue_fair_share_gpu", 1.0), "cpu": ("kai_queue_fair_share_cpu_cores", _CORES),
               "memory": ("kai_queue_fair_share_memory_gb", _GB)}
_ALLOCATED = {"gpu": ("kai_queue_allocated_gpus", 1.0), "cpu": ("kai_queue_allocated_cpu_cores", _CORES),
              "memory": ("kai_queue_allocated_memory_bytes", 1.0)}
_REQUESTED = {"gpu": ("kai_opt_queue_requested_gpus", 1.0), "cpu": ("kai_opt_queue_requested_cpu_cores", _CORES),
              "memory": ("kai_opt_queue_requested_memory_bytes", 1.0)}
_USAGE = {"gpu": ("kai_queue_gpu_usage", 1.0), "cpu": ("kai_queue_cpu_usage", 1.0),
          "memory": ("kai_queue_memory_usage", 1.0)}
# kai-opt's eviction reason -> KAI's action name (the `action` label of kai_pod_group_evicted_pods_total)
EVICTION_ACTION: dict[str, str] = {a.evictions.reason: a.kai_name for a in ACTIONS if a.evictions is not None}


def _make(spec: MetricSpec, registry: CollectorRegistry) -> Any:
    name = spec.name.removesuffix("_total") if spec.type == "counter" else spec.name
    if spec.type == "counter":
        return Counter(name, spec.help, spec.labels, registry=registry)
    if spec.type == "gauge":
        return Gauge(name, spec.help, spec.labels, registry=registry)
    buckets = _PHASE_BUCKETS if spec.unit == "seconds" else KAI_MS_BUCKETS
    return Histogram(name, spec.help, spec.labels, buckets=buckets, registry=registry)


class SchedulerMetrics:
    """The scheduler's metrics. Thread-safe (prometheus-client series are); one instance per process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._m: dict[str, Any] = {name: _make(spec, self.registry) for name, spec in METRICS.items()}
        self._m["kai_opt_solver_gap"].set(math.nan)
        self._queue_series: dict[str, set[str]] = {}  # queue -> names of the metrics it has a series in
        self._lock = threading.Lock()
        self._ready = False
        self.healthy = True  # liveness: set False when the scheduler loop is wedged
        self._server: ThreadingHTTPServer | None = None

    # -- recording ---------------------------------------------------------------------------------------------------
    def cycle_phase(self, phase: str, seconds: float) -> None:
        """Record how long `phase` (PHASES) of one cycle took; `total` is also KAI's e2e scheduling latency."""
        seconds = max(seconds, 0.0)
        self._m["kai_opt_cycle_phase_seconds"].labels(phase=phase).observe(seconds)
        if phase == "total":
            self._m["kai_e2e_scheduling_latency_milliseconds"].set(seconds * 1000.0)

    def open_session(self, seconds: float) -> None:
        """KAI's open-session latency: kai-opt's OPEN_SESSION_PHASES of the cycle together."""
        self._m["kai_open_session_latency_milliseconds"].set(max(seconds, 0.0) * 1000.0)

    def action(self, name: str, seconds: float) -> None:
        """The latency of one of kai-opt's actions (kai_opt.actions), labelled with KAI's name for it."""
        self._m["kai_action_scheduling_latency_milliseconds"].labels(
            action=ACTION_BY_NAME[name].kai_name).set(max(seconds, 0.0) * 1000.0)

    def solver(self, status: str, gap: float | None) -> None:
        """Record a solve's outcome and relative gap (None: not known, e.g. the greedy plan was used)."""
        self._m["kai_opt_solver_status_total"].labels(status=status).inc()
        self._m["kai_opt_solver_gap"].set(math.nan if gap is None else gap)

    def solver_failure(self, stage: str, kind: str) -> None:
        """Count a stage of a cycle that failed (kai_opt.plan.FAILURE_STAGES, FAILURE_KINDS) in a cycle that went
        on without it (the greedy stage: with its plan made again without the nodes it overfilled)."""
        self._m["kai_opt_solver_failures_total"].labels(stage=stage, kind=kind).inc()

    def bound(self, n: int = 1) -> None:
        self._m["kai_opt_pods_bound_total"].inc(n)

    def evicted(self, reason: str, podgroup: str, namespace: str, uid: str, nodepool: str, n: int = 1) -> None:
        """Count `n` pods of a pod group evicted by the action whose eviction reason is `reason`."""
        self._m["kai_pod_group_evicted_pods_total"].labels(
            podgroup=podgroup, namespace=namespace, uid=uid, nodepool=nodepool,
            action=EVICTION_ACTION.get(reason, reason)).inc(n)

    def task_scheduling_latency(self, seconds: float) -> None:
        """From a pod's creation to the scheduler's bind attempt."""
        self._m["kai_task_scheduling_latency_milliseconds"].observe(max(seconds, 0.0) * 1000.0)

    def bind_latency(self, seconds: float) -> None:
        """One bind attempt's duration (the binding request, or KAI's BindRequest creation)."""
        self._m["kai_task_bind_latency_milliseconds"].observe(max(seconds, 0.0) * 1000.0)

    def bind_failure(self, reason: str) -> None:
        self._m["kai_opt_bind_failures_total"].labels(reason=reason).inc()

    def bind_dropped(self, reason: str) -> None:
        self._m["kai_opt_binds_dropped_total"].labels(reason=reason).inc()

    def kubelet_rejected(self, reason: str) -> None:
        self._m["kai_opt_pods_rejected_by_kubelet_total"].labels(reason=reason).inc()

    def queue(self, name: str, fair_share: Mapping[str, float], allocated: Mapping[str, float],
              requested: Mapping[str, float]) -> None:
        """Set a queue's fair share, allocation and request per queue resource (kai-opt's queue units: GPU devices,
        CPU millicores, memory bytes; exposed in each metric's unit); resources it no longer reports are dropped
        from its series."""
        with self._lock:
            for table, values in ((_FAIR_SHARE, fair_share), (_ALLOCATED, allocated), (_REQUESTED, requested)):
                self._set(name, table, values)

    def queue_usage(self, name: str, usage: Mapping[str, float]) -> None:
        """Set a queue's time-based fair share usage per resource (past usage over the window's capacity)."""
        with self._lock:
            self._set(name, _USAGE, usage, drop=False)

    def _set(self, queue: str, table: Mapping[str, tuple[str, float]], values: Mapping[str, float],
             drop: bool = True) -> None:
        series = self._queue_series.setdefault(queue, set())
        for res, (metric, factor) in table.items():
            if res in values:
                self._m[metric].labels(queue_name=queue).set(values[res] * factor)
                series.add(metric)
            elif drop and metric in series:
                series.discard(metric)
                _remove(self._m[metric], queue)

    def remove_queue(self, name: str) -> None:
        """Drop every series of a queue that no longer exists."""
        with self._lock:
            for metric in self._queue_series.pop(name, set()):
                _remove(self._m[metric], name)

    def leader(self, is_leader: bool) -> None:
        self._m["kai_opt_leader"].set(1 if is_leader else 0)

    # -- probes ------------------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = bool(value)
        self._m["kai_opt_ready"].set(1 if value else 0)

    def text(self) -> str:
        """The metrics in Prometheus' text exposition format."""
        return self.exposition(None)[0].decode("utf-8")

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics and their content type for a scrape's `Accept` header: OpenMetrics when it asks for
        application/openmetrics-text, Prometheus' text format otherwise."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

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


def _remove(gauge: Gauge, queue: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(queue)


def _handler(metrics: SchedulerMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/"):
                self._send(200, *metrics.exposition(self.headers.get("Accept")))
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
