"""The Helm chart with a real helm (no cluster): `helm lint` is clean, and `helm template` renders exactly what
`kai-opt manifests` prints for the same values (object by object, after YAML parsing): the test that fails when
the chart and kai-opt's renderer diverge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helmtool import CHART, helm, helm_template, write_values

pytestmark = pytest.mark.e2e

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "with-namespace": {"createNamespace": True, "replicas": 1},
    "existing-kai-no-sharing": {
        "existingKai": True, "gpuSharing": {"enabled": False}, "podDisruptionBudget": {"enabled": False},
        "image": {"repository": "registry.local:5000/kai-opt", "tag": ""}},
    "everything-changed": {
        "replicas": 3, "engine": "greedy", "schedulerNames": ["kai-opt", "gpu-sched"],
        "image": {"repository": "registry.local/ml/kai-opt", "tag": "1.2.3", "pullPolicy": "Always"},
        "config": {"schedule_period_s": 0.5, "runtime": {"client_qps": 50, "gpu_sharing": {
            "reservation_timeout_s": 60}}},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": None},  # null deletes, as in helm
        "priorityClassName": "system-cluster-critical", "nodeSelector": {"node-role": "control"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "gpuSharing": {"reservationNamespace": "gpu-resv", "reservationServiceAccount": "resv",
                       "createReservationNamespace": False,
                       "reservationImage": "registry.local/ml/kai-opt:resv"},
        "webhook": {"port": 10443, "certManager": {"enabled": True}},
        "metrics": {"port": 9090, "service": {"enabled": False},
                    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}},
        "podDisruptionBudget": {"maxUnavailable": 2},
        "dashboard": {"enabled": True, "labels": {"grafana_dashboard": "kai", "team": "ml"}},
        "defaultQueue": {"name": "fallback"}, "priorityClasses": {"create": False}},
    "dashboard": {"dashboard": {"enabled": True}},
    "no-defaults": {"defaultQueue": {"create": False}, "metrics": {"service": {"enabled": False}}},
    "usage-ledger": {"config": {"usage_db": {"client_type": "ledger"}}},
    "existing-kai-sharing": {"existingKai": True},
    "existing-kai-own-binder": {"existingKai": True, "config": {"runtime": {"binder": "kai-opt"}}},
    "usage-ledger-named": {"config": {"usage_db": {"client_type": "ledger", "ledger": {
        "config_map_name": "team-usage", "config_map_namespace": "accounting"}}}},
    "shards": {"shards": [
        {"name": "pool-a", "partitionValue": "pool-a", "replicas": 1,
         "config": {"engine": "greedy", "placement": {"gpu": "spread"}, "solver": {"time_budget_s": 2.5}}},
        {"name": "default"}]},
    "shards-ledger-kai": {"existingKai": True,
        "podDisruptionBudget": {"enabled": False},
        "config": {"actions": {"consolidate": True, "reclaim": False}, "placement": {"gpu": "fgd", "cpu": "fgd"},
                   "usage_db": {"client_type": "ledger", "ledger": {"config_map_name": "usage-pool-b"}},
                   "shard": {"partition_label": "example.com/pool"}},
        "shards": [{"name": "pool-b", "partitionValue": "b", "config": {
                        "actions": {"consolidate": False}, "placement": {"cpu": None}}},  # false and null win
                   {"name": "pool-c", "partitionValue": "c"}]},
    "autoscaler": {"config": {"autoscaler": {"enabled": True}}},
    "autoscaler-named": {"config": {"autoscaler": {"enabled": True, "namespace": "placeholders",
                                                   "create_namespace": False, "priority_value": -7,
                                                   "priority_class_name": "scale-me"}}},
    "autoscaler-no-class": {"config": {"autoscaler": {"enabled": True, "create_priority_class": False}}},
}


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"]


def _normal(obj: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap's config.yaml compared as YAML too (Go's and Python's YAML writers differ in layout only)."""
    if obj["kind"] == "ConfigMap":
        return {**obj, "data": {k: yaml.safe_load(v) for k, v in obj["data"].items()}}
    return obj


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_template_equals_kai_opt_manifests(name: str, tmp_path: Path) -> None:
    values = {"createNamespace": False, **VALUE_SETS[name]}
    f = write_values(tmp_path / "values.yaml", values)
    # helm renders crds/ only with --include-crds; kai-opt leaves the CRDs out with existingKai
    chart = helm_template(f, "sched-ns", crds=not values.get("existingKai"))
    out = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "-n", "sched-ns", "-f", str(f)],
                         capture_output=True, text=True, check=True).stdout
    ours = [d for d in yaml.safe_load_all(out) if d]
    assert len({_key(o) for o in ours}) == len(ours) > 5
    by_key = {_key(o): _normal(o) for o in chart}
    assert sorted(by_key) == sorted(_key(o) for o in ours)
    for obj in ours:
        assert by_key[_key(obj)] == _normal(obj), _key(obj)


@pytest.mark.parametrize("name", ["defaults", "everything-changed", "existing-kai-no-sharing", "shards",
                                  "autoscaler"])
def test_helm_lint_is_clean(name: str, tmp_path: Path) -> None:
    f = write_values(tmp_path / "values.yaml", VALUE_SETS[name])
    proc = helm("lint", "--strict", str(CHART), "-f", str(f), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]



@pytest.mark.parametrize("values", [{"replicas": 0}, {"replica": 2}, {"metrics": {"port": 70000}},
                                    {"gpuSharing": {"enable": False}}, {"config": "engine: greedy"},
                                    {"shards": [{"name": "Pool_A"}]}, {"shards": [{"name": "a", "zone": "x"}]},
                                    {"shards": [{"name": "a", "config": {"usage_db": {}}}]},
                                    {"shards": [{"name": "a", "config": {"runtime": {"binder": "kai"}}}]}])
def test_helm_and_kai_opt_refuse_the_same_bad_values(values: dict[str, Any], tmp_path: Path) -> None:
    f = write_values(tmp_path / "values.yaml", values)
    proc = helm("template", "kai-opt", str(CHART), "-f", str(f), check=False)
    assert proc.returncode != 0 and "schema" in proc.stderr, proc.stderr
    cli = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "-f", str(f)],
                         capture_output=True, text=True, check=False)
    assert cli.returncode == 2 and cli.stdout == "" and cli.stderr.count("\n") == 1, cli.stderr
