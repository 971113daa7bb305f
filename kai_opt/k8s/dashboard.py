"""The Grafana dashboard of kai-opt's metrics (kai_opt/k8s/metrics.py), shipped with the Helm chart as
files/kai-opt-dashboard.json and, with `dashboard.enabled`, as a ConfigMap labelled `grafana_dashboard: "1"` (the
label Grafana's dashboard sidecar picks up); `kai-opt manifests` renders the same ConfigMap from the same dict.

Panels: cycle latency by phase (and KAI's e2e, open-session and per-action gauges), binds and bind failures/drops
by reason, bind latency, evictions by action, queue fair share against allocation (GPU, CPU, memory), solver
outcome, gap and failed stages. Every query names only metrics of the registry (a test checks it).
"""

from __future__ import annotations

import json
import re
from typing import Any

UID = "kai-opt"
TITLE = "kai-opt scheduler"
FILE = "kai-opt-dashboard.json"  # in the chart's files/ and as the ConfigMap's key
CONFIGMAP = "kai-opt-dashboard"
_DS = {"type": "prometheus", "uid": "${datasource}"}
_RATE = "[$__rate_interval]"


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": _DS, "expr": expr, "legendFormat": legend, "refId": ref}


def _panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int,
           w: int = 12, h: int = 8) -> dict[str, Any]:
    return {"id": pid, "type": "timeseries", "title": title, "datasource": _DS,
            "gridPos": {"h": h, "w": w, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)]}


def _row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {"id": pid, "type": "row", "title": title, "collapsed": False, "panels": [],
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}}


def _quantile(q: float, metric: str, by: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({metric}_bucket{_RATE})))"


def dashboard() -> dict[str, Any]:
    """The dashboard (Grafana's JSON model)."""
    fair = [("gpu", "kai_queue_fair_share_gpu", "kai_queue_allocated_gpus", "short"),
            ("CPU", "kai_queue_fair_share_cpu_cores", "kai_queue_allocated_cpu_cores", "short"),
            ("memory", "kai_queue_fair_share_memory_gb * 1e9", "kai_queue_allocated_memory_bytes", "bytes")]
    panels: list[dict[str, Any]] = [
        _row(1, "Cycle", 0),
        _panel(2, "Cycle latency by phase (p95)", "s",
               [(_quantile(0.95, "kai_opt_cycle_phase_seconds", "phase"), "{{phase}}")], 0, 1),
        _panel(3, "Last cycle (KAI's gauges)", "ms",
               [("max(kai_e2e_scheduling_latency_milliseconds)", "e2e"),
                ("max(kai_open_session_latency_milliseconds)", "open session"),
                ("max by (action) (kai_action_scheduling_latency_milliseconds)", "{{action}}")], 12, 1),
        _row(4, "Binds and evictions", 9),
        _panel(5, "Binds by outcome", "ops",
               [(f"sum(rate(kai_opt_pods_bound_total{_RATE}))", "bound"),
                (f"sum by (reason) (rate(kai_opt_bind_failures_total{_RATE}))", "failed: {{reason}}"),
                (f"sum by (reason) (rate(kai_opt_binds_dropped_total{_RATE}))", "dropped: {{reason}}"),
                (f"sum by (reason) (rate(kai_opt_pods_rejected_by_kubelet_total{_RATE}))",
                 "rejected by kubelet: {{reason}}")], 0, 10),
        _panel(6, "Evictions by reason (action)", "ops",
               [(f"sum by (action) (rate(kai_pod_group_evicted_pods_total{_RATE}))", "{{action}}")], 12, 10),
        _panel(7, "Bind and scheduling latency", "ms",
               [(_quantile(0.5, "kai_task_bind_latency_milliseconds"), "bind p50"),
                (_quantile(0.95, "kai_task_bind_latency_milliseconds"), "bind p95"),
                (_quantile(0.95, "kai_task_scheduling_latency_milliseconds"), "creation to bind p95")], 0, 18),
        _row(8, "Queues", 26),
        *[_panel(9 + i, f"Queue fair share vs allocated: {name}", unit,
                 [(f"max by (queue_name) ({share})", "{{queue_name}} fair share"),
                  (f"max by (queue_name) ({alloc})", "{{queue_name}} allocated")], 12 * (i % 2), 27 + 8 * (i // 2))
          for i, (name, share, alloc, unit) in enumerate(fair)],
        _row(12, "Solver", 43),
        _panel(13, "Solver gap (last solve)", "percentunit", [("max(kai_opt_solver_gap)", "gap")], 0, 44),
        _panel(14, "Solves by outcome and failed stages", "ops",
               [(f"sum by (status) (rate(kai_opt_solver_status_total{_RATE}))", "{{status}}"),
                (f"sum by (stage, kind) (rate(kai_opt_solver_failures_total{_RATE}))", "failed: {{stage}} {{kind}}")],
               12, 44),
        _panel(15, "Leader and ready replicas", "short",
               [("sum(kai_opt_leader)", "leaders"), ("sum(kai_opt_ready)", "ready")], 0, 52),
    ]
    return {
        "uid": UID, "title": TITLE, "tags": ["kai-opt", "kai-scheduler", "scheduler"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
        "timezone": "", "graphTooltip": 1,
        "templating": {"list": [{"name": "datasource", "label": "Data source", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []}, "links": [], "panels": panels,
    }


def dashboard_json() -> str:
    """The dashboard as the chart ships it (sorted keys, indented: stable across runs)."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


_METRIC = re.compile(r"\b(kai_[a-z0-9_]+)")
_BY = re.compile(r"\bby \(([^)]*)\)")


def queries(dash: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def queried_metrics(expr: str) -> set[str]:
    """The sample names an expression reads (histogram series with their _bucket suffix)."""
    return set(_METRIC.findall(expr))


def grouping_labels(expr: str) -> set[str]:
    """The labels an expression groups by (`by (...)`)."""
    return {label.strip() for group in _BY.findall(expr) for label in group.split(",") if label.strip()}
