"""The watch cache and the `kai-opt run` command on a real apiserver: a kind whose CRD is missing is skipped and
picked up once installed, kinds can be added while running, watches resume without relisting, a snapshot never
lists; `--once` schedules one cycle and exits; bad settings are one-line errors (exit 2)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import apply_objects, object_path, request

from .schedharness import NS, bound, create, fresh, namespace, node, pod, queue, wait_for
from .testcluster import LocalCluster

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

WIDGETS = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_cache_skips_a_missing_kind_then_picks_it_up_and_never_relists(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 2), pod("p0")])
        cache = ClusterCache(api, watch_timeout_s=1, absent_recheck_s=0.3)
        cache.add_kind("example.com/v1", "Widget", "widgets", True)
        cache.start()
        try:
            assert cache.wait_synced(20)
            # (DeviceTaintRule: a beta API the 1.36 apiserver does not serve by default)
            assert cache.absent_kinds() == ["devicetaintrules.resource.k8s.io/v1beta2", "widgets.example.com/v1"]
            assert [p["metadata"]["name"] for p in cache.list("Pod")] == ["p0"]
            apply_objects(api, [WIDGETS, {"apiVersion": "example.com/v1", "kind": "Widget",
                                          "metadata": {"name": "w", "namespace": NS}, "spec": {"size": 3}}])
            w = wait_for("the widget in the cache", lambda: cache.get("example.com/v1", "Widget", NS, "w"))
            assert w["spec"] == {"size": 3} and "managedFields" not in w["metadata"]
            cache.add_kind("apps/v1", "Deployment", "deployments", True)  # added while running
            assert wait_for("deployments synced", cache.synced)
            time.sleep(2.5)  # watches time out (1 s) and resume from their resourceVersion
            create(api, [pod("p1")])
            wait_for("a pod created after the watch resumed", lambda: cache.pod(NS, "p1"))
            for _ in range(3):
                snap = cache.snapshot(scheduler_names=("kai-opt",))
            assert sorted(p.name for p in snap.pods) == ["p0", "p1"]
            assert cache.status()["pods.v1"]["relists"] == 1, "neither resumed watches nor snapshots relist"
            request(api, "DELETE", object_path("v1", "pods", NS, "p0"), query={"gracePeriodSeconds": 0})
            wait_for("a deletion seen", lambda: cache.pod(NS, "p0") is None)
        finally:
            cache.stop()
            request(api, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")


def _kai_opt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_opt.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_run_once_schedules_one_cycle_and_exits(fresh: LocalCluster, tmp_path: Path) -> None:
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 4), queue("team"),
                     *[pod(f"p{i}", gpus=1, queue_name="team") for i in range(3)]])
        cfg = tmp_path / "config.yaml"
        cfg.write_text("runtime:\n  client_qps: 200\n", encoding="utf-8")
        out = _kai_opt("run", "--kubeconfig", str(fresh.kubeconfig()), "--config", str(cfg), "--no-leader-elect",
                       "--once")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "cycle 1:" in out.stderr and "bind 3" in out.stderr
        assert sorted(bound(api)) == ["p0", "p1", "p2"]


def test_run_errors_are_one_line(tmp_path: Path) -> None:
    out = _kai_opt("run", "--kubeconfig", str(tmp_path / "nope"), "--no-leader-elect")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "kubeconfig" in out.stderr and "no such file" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime:\n  leader_election:\n    renew_deadline_s: 30\n", encoding="utf-8")
    out = _kai_opt("run", "--config", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "runtime.leader_election" in out.stderr
