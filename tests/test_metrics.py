"""Scheduler metrics: the text exposition (names, labels, values) and the HTTP endpoint with its probes."""

from __future__ import annotations

import math
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from kai_opt.k8s.metrics import SchedulerMetrics


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_recorded_value_is_in_the_text_format() -> None:
    m = SchedulerMetrics()
    m.cycle_phase("solve", 0.2)
    m.cycle_phase("solve", 0.4)
    m.cycle_phase("total", 0.7)
    m.solver("feasible", 0.05)
    m.bound(3)
    m.bound()
    m.evicted("reclaim", "pg-1", "team-a", "uid-1", "default", 2)
    m.evicted("stale-gang", "pg-2", "team-a", "uid-2", "default")
    m.bind_latency(0.004)
    m.bind_failure("conflict")
    m.queue("team-a", {"gpu": 4.5, "cpu": 8000}, {"gpu": 3}, {"gpu": 6, "cpu": 2000})
    m.leader(True)
    text = m.text()
    assert all(line.startswith(("# ", "kai_opt_", "kai_")) for line in text.splitlines() if line)
    s = samples(text)
    assert s[("kai_opt_cycle_phase_seconds_count", (("phase", "solve"),))] == 2
    assert s[("kai_opt_cycle_phase_seconds_sum", (("phase", "solve"),))] == pytest.approx(0.6)
    assert s[("kai_opt_cycle_phase_seconds_bucket", (("le", "0.25"), ("phase", "solve")))] == 1
    assert s[("kai_opt_cycle_phase_seconds_count", (("phase", "total"),))] == 1
    assert s[("kai_opt_solver_status_total", (("status", "feasible"),))] == 1
    assert s[("kai_opt_solver_gap", ())] == pytest.approx(0.05)
    assert s[("kai_opt_pods_bound_total", ())] == 4
    pg1 = (("action", "reclaim"), ("namespace", "team-a"), ("nodepool", "default"), ("podgroup", "pg-1"),
           ("uid", "uid-1"))
    assert s[("kai_pod_group_evicted_pods_total", pg1)] == 2
    pg2 = (("action", "stalegangeviction"), *pg1[1:3], ("podgroup", "pg-2"), ("uid", "uid-2"))
    assert s[("kai_pod_group_evicted_pods_total", pg2)] == 1
    assert s[("kai_task_bind_latency_milliseconds_count", ())] == 1
    assert s[("kai_task_bind_latency_milliseconds_sum", ())] == pytest.approx(4.0)  # milliseconds
    assert s[("kai_task_bind_latency_milliseconds_bucket", (("le", "5.0"),))] == 1
    assert s[("kai_e2e_scheduling_latency_milliseconds", ())] == pytest.approx(700.0)
    assert s[("kai_opt_bind_failures_total", (("reason", "conflict"),))] == 1
    q = (("queue_name", "team-a"),)
    assert s[("kai_queue_fair_share_gpu", q)] == 4.5
    assert s[("kai_queue_fair_share_cpu_cores", q)] == 8  # 8000 millicores
    assert s[("kai_queue_allocated_gpus", q)] == 3
    assert ("kai_queue_allocated_cpu_cores", q) not in s
    assert s[("kai_opt_queue_requested_cpu_cores", q)] == 2
    assert s[("kai_opt_leader", ())] == 1


def test_solver_gap_unknown_is_nan_and_queues_drop_stale_series() -> None:
    m = SchedulerMetrics()
    m.solver("fallback", None)
    assert math.isnan(samples(m.text())[("kai_opt_solver_gap", ())])
    m.queue("q", {"gpu": 1, "cpu": 2}, {"gpu": 1, "cpu": 2}, {"gpu": 1, "cpu": 2})
    m.queue_usage("q", {"gpu": 0.5})
    m.queue("q", {"gpu": 2}, {"gpu": 2}, {"gpu": 2})
    s = samples(m.text())
    assert s[("kai_queue_fair_share_gpu", (("queue_name", "q"),))] == 2
    assert s[("kai_queue_gpu_usage", (("queue_name", "q"),))] == 0.5
    assert not any("cpu" in name and labels == (("queue_name", "q"),) for name, labels in s)
    m.remove_queue("q")
    assert not any(labels == (("queue_name", "q"),) for _, labels in samples(m.text()))


def test_two_instances_have_separate_registries() -> None:
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.bound(5)
    assert samples(b.text())[("kai_opt_pods_bound_total", ())] == 0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_endpoint_serves_metrics_and_probes() -> None:
    m = SchedulerMetrics()
    port = m.serve(0, host="127.0.0.1")
    try:
        m.bound(7)
        code, body = _get(port, "/metrics")
        assert code == 200 and samples(body)[("kai_opt_pods_bound_total", ())] == 7
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz")[0] == 503
        m.ready = True
        assert _get(port, "/readyz") == (200, "ok\n")
        assert samples(_get(port, "/metrics")[1])[("kai_opt_ready", ())] == 1
        m.healthy = False
        assert _get(port, "/healthz")[0] == 503
        assert _get(port, "/nope")[0] == 404
        with pytest.raises(RuntimeError):
            m.serve(0)
    finally:
        m.stop()


def test_solver_failures_are_counted_by_stage_and_kind() -> None:
    m = SchedulerMetrics()
    m.solver_failure("cpsat", "crash")
    m.solver_failure("cpsat", "crash")
    m.solver_failure("second_hint", "timeout")
    s = samples(m.text())
    assert s[("kai_opt_solver_failures_total", (("kind", "crash"), ("stage", "cpsat")))] == 2
    assert s[("kai_opt_solver_failures_total", (("kind", "timeout"), ("stage", "second_hint")))] == 1
    assert ("kai_opt_solver_failures_total", (("kind", "crash"), ("stage", "decode"))) not in s


def test_open_session_and_actions_are_kai_latency_gauges_in_milliseconds() -> None:
    m = SchedulerMetrics()
    m.open_session(0.0125)
    m.action("consolidate", 0.002)
    m.action("allocate", 0.25)
    m.task_scheduling_latency(3.0)
    s = samples(m.text())
    assert s[("kai_open_session_latency_milliseconds", ())] == pytest.approx(12.5)
    assert s[("kai_action_scheduling_latency_milliseconds", (("action", "consolidation"),))] == pytest.approx(2.0)
    assert s[("kai_action_scheduling_latency_milliseconds", (("action", "allocate"),))] == pytest.approx(250.0)
    assert s[("kai_task_scheduling_latency_milliseconds_sum", ())] == pytest.approx(3000.0)
    assert s[("kai_task_scheduling_latency_milliseconds_bucket", (("le", "2560.0"),))] == 0
    assert s[("kai_task_scheduling_latency_milliseconds_bucket", (("le", "+Inf"),))] == 1


def _get_with(port: int, accept: str | None) -> tuple[str, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_endpoint_answers_openmetrics_when_the_accept_header_asks_for_it() -> None:
    m = SchedulerMetrics()
    port = m.serve(0, host="127.0.0.1")
    try:
        m.bound(2)
        kind, body = _get_with(port, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
        assert kind.startswith("application/openmetrics-text")
        assert body.rstrip().endswith("# EOF")
        families = {f.name: f for f in openmetrics_families(body)}
        assert families["kai_opt_pods_bound"].samples[0].value == 2
        for accept in (None, "text/plain;version=0.0.4", "*/*"):
            kind, body = _get_with(port, accept)
            assert kind.startswith("text/plain") and "# EOF" not in body
            assert samples(body)[("kai_opt_pods_bound_total", ())] == 2
    finally:
        m.stop()


_RES = ("gpu", "cpu", "memory")
_values = st.dictionaries(st.sampled_from(_RES), st.floats(min_value=0, max_value=1e12, allow_nan=False), max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), _values, _values, _values), min_size=1, max_size=6),
       st.sampled_from(["a", "b", None]))
def test_queue_series_are_the_last_reported_values_in_kais_units(
        calls: list[tuple[str, dict[str, float], dict[str, float], dict[str, float]]], removed: str | None) -> None:
    m = SchedulerMetrics()
    last: dict[str, tuple[dict[str, float], ...]] = {}
    for name, fair, alloc, req in calls:
        m.queue(name, fair, alloc, req)
        last[name] = (fair, alloc, req)
    if removed is not None:
        m.remove_queue(removed)
        last.pop(removed, None)
    want = {}
    factor = {"gpu": 1.0, "cpu": 1 / 1000, "memory": 1.0}
    names = {"gpu": ("kai_queue_fair_share_gpu", "kai_queue_allocated_gpus", "kai_opt_queue_requested_gpus"),
             "cpu": ("kai_queue_fair_share_cpu_cores", "kai_queue_allocated_cpu_cores",
                     "kai_opt_queue_requested_cpu_cores"),
             "memory": ("kai_queue_fair_share_memory_gb", "kai_queue_allocated_memory_bytes",
                        "kai_opt_queue_requested_memory_bytes")}
    for queue, tables in last.items():
        for i, values in enumerate(tables):
            for res, v in values.items():
                f = 1e-9 if (res, i) == ("memory", 0) else factor[res]  # fair share memory in GB
                want[(names[res][i], (("queue_name", queue),))] = v * f
    got = {k: v for k, v in samples(m.text()).items() if k[1][:1] and k[1][0][0] == "queue_name"}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
