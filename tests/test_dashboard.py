"""The Grafana dashboard: every query reads metrics the registry exposes, grouped by labels they carry; it covers
cycle latency by phase, binds and evictions by reason, queue fair share against allocation and the solver gap; the
chart ships it as a ConfigMap behind dashboard.enabled, the same in `kai-opt manifests`."""

from __future__ import annotations

import json
from pathlib import Path

from kai_opt.k8s.chart import CHART_DIR
from kai_opt.k8s.dashboard import CONFIGMAP, FILE, dashboard, dashboard_json, grouping_labels, queried_metrics, queries
from kai_opt.k8s.manifests import DASHBOARD_CHART_FILE, render_manifests
from kai_opt.k8s.metrics import METRICS, MetricSpec

REPO = Path(__file__).resolve().parents[1]
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def _family(sample: str) -> tuple[MetricSpec, bool]:
    """The registry's metric a sample name belongs to, and whether it is a histogram's bucket series."""
    if sample in METRICS and METRICS[sample].type != "histogram":
        return METRICS[sample], False
    for suffix in _HISTOGRAM_SERIES:
        base = sample.removesuffix(suffix)
        if base != sample and base in METRICS and METRICS[base].type == "histogram":
            return METRICS[base], suffix == "_bucket"
    raise AssertionError(f"the dashboard queries {sample}, which kai-opt does not expose")


def test_every_queried_metric_is_in_the_registry_with_the_labels_grouped_by() -> None:
    exprs = queries(dashboard())
    assert len(exprs) >= 15
    for expr in exprs:
        names = queried_metrics(expr)
        assert names, expr
        assert expr.count("(") == expr.count(")"), expr
        for name in names:
            spec, bucket = _family(name)
            assert grouping_labels(expr) <= set(spec.labels) | ({"le"} if bucket else set()), expr


def test_the_dashboard_covers_what_an_operator_looks_at() -> None:
    read = {_family(n)[0].name for e in queries(dashboard()) for n in queried_metrics(e)}
    assert {"kai_opt_cycle_phase_seconds", "kai_opt_pods_bound_total", "kai_opt_bind_failures_total",
            "kai_pod_group_evicted_pods_total", "kai_queue_fair_share_gpu", "kai_queue_allocated_gpus",
            "kai_opt_solver_gap"} <= read
    by_title = {p["title"]: p for p in dashboard()["panels"]}
    assert 'by (le, phase)' in by_title["Cycle latency by phase (p95)"]["targets"][0]["expr"]
    assert "by (action)" in by_title["Evictions by reason (action)"]["targets"][0]["expr"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    assert all(t["datasource"]["uid"] == "${datasource}" for p in dashboard()["panels"] for t in p.get("targets", []))


def test_the_chart_ships_the_dashboard_file() -> None:
    assert (REPO / CHART_DIR / DASHBOARD_CHART_FILE).read_text() == dashboard_json()
    assert json.loads(dashboard_json()) == dashboard()


def test_the_configmap_is_rendered_only_when_enabled_with_the_grafana_label() -> None:
    def configmaps(values: dict) -> list[dict]:
        return [o for o in render_manifests(values, "mon") if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == CONFIGMAP]

    assert configmaps({}) == []
    [cm] = configmaps({"dashboard": {"enabled": True}})
    assert cm["metadata"]["namespace"] == "mon"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"][FILE]) == dashboard()
    [cm] = configmaps({"dashboard": {"enabled": True, "labels": {"grafana_dashboard": "kai", "team": "ml"}}})
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "kai" and cm["metadata"]["labels"]["team"] == "ml"
