"""kai-opt's metrics that KAI-Scheduler also exposes carry KAI's name, type, labels and unit; the rest is kai_opt_.

KAI_SOURCE is every metric KAI-Scheduler registers, as its source has it at commit 72de64f (the archive in
/work/shared/peers/kai/kai-scheduler-72de64f.tar.gz): pkg/scheduler/metrics/metrics.go and
pkg/queuecontroller/metrics/metrics.go (queue controller: label queue_name plus optional configured labels, none by
default), every name under the metrics namespace pkg/common/constants.DefaultMetricsNamespace = "kai". The list is
embedded so this test runs anywhere; test_the_embedded_list_is_kais_source checks it against the archive when it
is on the machine. The unit is the one KAI's name and help state.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kai_opt.k8s import metrics as m
from kai_opt.k8s.metrics import KAI_METRICS, KAI_OPT_METRICS, METRICS, SchedulerMetrics

# name -> (type, labels in KAI's order, unit)
KAI_SOURCE: dict[str, tuple[str, tuple[str, ...], str]] = {
    # pkg/scheduler/metrics/metrics.go
    "kai_e2e_scheduling_latency_milliseconds": ("gauge", (), "milliseconds"),
    "kai_open_session_latency_milliseconds": ("gauge", (), "milliseconds"),
    "kai_close_session_latency_milliseconds": ("gauge", (), "milliseconds"),
    "kai_plugin_scheduling_latency_milliseconds": ("gauge", ("plugin", "OnSession"), "milliseconds"),
    "kai_action_scheduling_latency_milliseconds": ("gauge", ("action",), "milliseconds"),
    "kai_task_scheduling_latency_milliseconds": ("histogram", (), "milliseconds"),
    "kai_task_bind_latency_milliseconds": ("histogram", (), "milliseconds"),
    "kai_podgroups_scheduled_by_action": ("counter", ("action",), "podgroups"),
    "kai_podgroups_acted_on_by_action": ("counter", ("action",), "podgroups"),
    "kai_scenarios_simulation_by_action": ("counter", ("action",), "scenarios"),
    "kai_scenarios_filtered_by_action": ("counter", ("action",), "scenarios"),
    "kai_total_preemption_attempts": ("counter", (), "attempts"),
    "kai_queue_fair_share_cpu_cores": ("gauge", ("queue_name",), "cores"),
    "kai_queue_fair_share_memory_gb": ("gauge", ("queue_name",), "GB"),
    "kai_queue_fair_share_gpu": ("gauge", ("queue_name",), "devices"),
    "kai_queue_cpu_usage": ("gauge", ("queue_name",), "fraction"),
    "kai_queue_memory_usage": ("gauge", ("queue_name",), "fraction"),
    "kai_queue_gpu_usage": ("gauge", ("queue_name",), "fraction"),
    "kai_usage_query_latency_milliseconds": ("histogram", (), "milliseconds"),
    "kai_pod_group_evicted_pods_total": ("counter", ("podgroup", "namespace", "uid", "nodepool", "action"), "pods"),
    # pkg/queuecontroller/metrics/metrics.go
    "kai_queue_info": ("gauge", ("queue_name",), "boolean"),
    "kai_queue_deserved_gpus": ("gauge", ("queue_name",), "devices"),
    "kai_queue_quota_cpu_cores": ("gauge", ("queue_name",), "cores"),
    "kai_queue_quota_memory_bytes": ("gauge", ("queue_name",), "bytes"),
    "kai_queue_allocated_gpus": ("gauge", ("queue_name",), "devices"),
    "kai_queue_allocated_cpu_cores": ("gauge", ("queue_name",), "cores"),
    "kai_queue_allocated_memory_bytes": ("gauge", ("queue_name",), "bytes"),
}
# KAI metrics kai-opt does not compute (no plugins, no scenario simulation, quotas are the Queue's spec)
NOT_COMPUTED = {"kai_close_session_latency_milliseconds", "kai_plugin_scheduling_latency_milliseconds",
                "kai_podgroups_scheduled_by_action", "kai_podgroups_acted_on_by_action",
                "kai_scenarios_simulation_by_action", "kai_scenarios_filtered_by_action",
                "kai_total_preemption_attempts", "kai_usage_query_latency_milliseconds", "kai_queue_info",
                "kai_queue_deserved_gpus", "kai_queue_quota_cpu_cores", "kai_queue_quota_memory_bytes"}
KAI_ARCHIVE = Path("/work/shared/peers/kai/kai-scheduler-72de64f.tar.gz")


def _exposed() -> dict[str, tuple[str, set[frozenset[str]]]]:
    """Family name (counters with _total) -> (type, label sets of its samples) after recording every metric."""
    s = SchedulerMetrics()
    for phase in m.PHASES:
        s.cycle_phase(phase, 0.01)
    s.open_session(0.01)
    s.action("allocate", 0.01)
    s.solver("FEASIBLE", 0.1)
    s.solver_failure("cpsat", "crash")
    s.bound()
    s.evicted("reclaim", "g", "ns", "uid", "default")
    s.task_scheduling_latency(1.0)
    s.bind_latency(0.01)
    s.bind_failure("conflict")
    s.bind_dropped("cpu")
    s.kubelet_rejected("OutOfcpu")
    full = {"gpu": 1.0, "cpu": 1000.0, "memory": 1e9}
    s.queue("q", full, full, full)
    s.queue_usage("q", full)
    s.leader(True)
    s.ready = True
    out: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for fam in text_string_to_metric_families(s.text()):
        if fam.name.endswith("_created"):  # prometheus_client's creation time of a counter or histogram
            continue
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels = {frozenset(k for k in x.labels if k != "le") for x in fam.samples
                  if not x.name.endswith("_created")}
        out[name] = (fam.type, labels)
    return out


def test_every_kai_metric_kai_opt_computes_has_kais_name_type_labels_and_unit() -> None:
    assert {x.name for x in KAI_METRICS} == set(KAI_SOURCE) - NOT_COMPUTED
    exposed = _exposed()
    for spec in KAI_METRICS:
        kind, labels, unit = KAI_SOURCE[spec.name]
        assert (spec.type, spec.labels, spec.unit) == (kind, labels, unit), spec.name
        assert exposed[spec.name] == (kind, {frozenset(labels)}), spec.name


def test_kai_opts_own_metrics_are_all_under_kai_opt_() -> None:
    assert all(x.name.startswith("kai_opt_") for x in KAI_OPT_METRICS)
    assert set(_exposed()) == set(METRICS)
    for spec in KAI_OPT_METRICS:
        assert _exposed()[spec.name] == (spec.type, {frozenset(spec.labels)}), spec.name


def _value(text: str, name: str) -> float:
    return next(x.value for f in text_string_to_metric_families(text) for x in f.samples if x.name == name)


def test_values_are_in_kais_units() -> None:
    s = SchedulerMetrics()
    s.queue("q", {"gpu": 2.5, "cpu": 1500.0, "memory": 3e9}, {"gpu": 2.0, "cpu": 500.0, "memory": 2**30},
            {"gpu": 4.0, "cpu": 4000.0, "memory": 8e9})
    s.cycle_phase("total", 0.25)
    s.bind_latency(0.012)
    text = s.text()
    assert _value(text, "kai_queue_fair_share_gpu") == 2.5  # devices
    assert _value(text, "kai_queue_fair_share_cpu_cores") == 1.5  # millicores -> cores
    assert _value(text, "kai_queue_fair_share_memory_gb") == 3.0  # bytes -> GB (10^9)
    assert _value(text, "kai_queue_allocated_cpu_cores") == 0.5
    assert _value(text, "kai_queue_allocated_memory_bytes") == 2**30  # bytes
    assert _value(text, "kai_opt_queue_requested_cpu_cores") == 4.0
    assert _value(text, "kai_e2e_scheduling_latency_milliseconds") == pytest.approx(250.0)
    assert _value(text, "kai_task_bind_latency_milliseconds_sum") == pytest.approx(12.0)
    buckets = [float(x.labels["le"]) for f in text_string_to_metric_families(text) for x in f.samples
               if x.name == "kai_task_bind_latency_milliseconds_bucket"]
    assert buckets[:-1] == [5.0 * 2**i for i in range(10)]  # KAI's ExponentialBuckets(5, 2, 10)


def test_readme_metrics_table_names_every_metric() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9_]+)`", section, re.M))
    assert listed == set(METRICS)


def _kai_source(archive: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric KAI's scheduler and queue controller register, read from KAI's Go source."""
    root = "kai-scheduler/"
    with tarfile.open(archive) as tar:
        def read(path: str) -> str:
            f = tar.extractfile(root + path)
            assert f is not None, path
            return f.read().decode()

        namespace = re.search(r'DefaultMetricsNamespace\s*=\s*"(\w+)"', read("pkg/common/constants/constants.go"))
        queue = read("pkg/queuecontroller/metrics/metrics.go")
        sources = (read("pkg/scheduler/metrics/metrics.go"), queue)
    assert namespace is not None
    queue_label = re.search(r'queueNameLabel\s*=\s*"(\w+)"', queue)
    assert queue_label is not None and "append([]string{queueNameLabel}, additionalMetricLabelKeys...)" in queue
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for src in sources:
        for hit in re.finditer(r"promauto\.New(\w+)\(\s*prometheus\.\w+Opts\{(.*?)\n\s*\}\s*,?\s*(.*?)\)\s*\n",
                               src, re.S):
            kind, opts, rest = hit.groups()
            name = re.search(r'Name:\s*"(\w+)"', opts)
            assert name is not None
            if rest.strip().startswith("queueMetricsLabels"):
                labels: tuple[str, ...] = (queue_label.group(1),)
            else:
                labels = tuple(re.findall(r'"(\w+)"', rest))
            out[f"{namespace.group(1)}_{name.group(1)}"] = (kind.removesuffix("Vec").lower(), labels)
    return out


@pytest.mark.skipif(not KAI_ARCHIVE.exists(), reason="KAI's source archive is not on this machine")
def test_the_embedded_list_is_kais_source() -> None:
    assert _kai_source(KAI_ARCHIVE) == {name: (kind, labels) for name, (kind, labels, _) in KAI_SOURCE.items()}
