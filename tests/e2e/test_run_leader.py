"""Two `kai-opt run` replicas with leader election on a real apiserver: only the leader binds; killing it hands
over to the standby within a bounded time; a graceful shutdown (SIGTERM) releases the Lease."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

from kai_opt.k8s.client import object_path, request

from .schedharness import (
    FAST_RUNTIME,
    SchedulerProcess,
    bound,
    create,
    events,
    fresh,
    namespace,
    node,
    pod,
    queue,
    wait_for,
)
from .testcluster import LocalCluster, free_port

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

LEASE = object_path("coordination.k8s.io/v1", "leases", "default", "kai-opt")
LE = FAST_RUNTIME["leader_election"]


def _holder(api: ApiClient) -> str | None:
    try:
        return request(api, "GET", LEASE)["spec"].get("holderIdentity") or None
    except Exception:  # not created yet
        return None


def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not serving yet
        return 0, ""


def _scheduled_by(api: ApiClient) -> dict[str, str]:
    """pod name -> reportingInstance of its Scheduled event."""
    return {e["involvedObject"]["name"]: e["reportingInstance"] for e in events(api, reason="Scheduled")}


def test_only_the_leader_binds_and_the_standby_takes_over(fresh: LocalCluster, tmp_path: Path) -> None:
    config = {"schedule_period_s": 0.2, "runtime": FAST_RUNTIME}
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 8), node("n2", 8), queue("team")])
        a = SchedulerProcess(fresh, tmp_path, config, identity="replica-a", leader_elect=True)
        b = None
        try:
            wait_for("replica-a leads", lambda: _holder(api) == "replica-a", timeout=30)
            port_b = free_port()
            b = SchedulerProcess(fresh, tmp_path, config, identity="replica-b", leader_elect=True,
                                 extra=("--metrics-port", str(port_b)))
            wait_for("replica-b is standing by", lambda: "standby" in b.output(), timeout=30)
            # a synced standby is ready (rollouts wait for it); leadership shows in kai_opt_leader
            assert wait_for("the standby's /readyz", lambda: _http(port_b, "/readyz") == (200, "ok\n"))
            assert "kai_opt_leader 0.0" in _http(port_b, "/metrics")[1].splitlines()
            create(api, [pod(f"first-{i}", gpus=1, queue_name="team") for i in range(6)])
            wait_for("the first pods bound", lambda: len(bound(api)) == 6)
            wait_for("their Scheduled events", lambda: len(_scheduled_by(api)) == 6)
            assert set(_scheduled_by(api).values()) == {"replica-a"}
            assert "cycle " not in b.output(), "the standby ran a cycle"

            a.kill()
            killed = time.monotonic()
            create(api, [pod(f"second-{i}", gpus=1, queue_name="team") for i in range(6)])
            wait_for("replica-b leads", lambda: _holder(api) == "replica-b", timeout=15, interval=0.05)
            handover = time.monotonic() - killed
            wait_for("the second pods bound", lambda: len(bound(api)) == 12)
            wait_for("their Scheduled events", lambda: len(_scheduled_by(api)) == 12)
            by = _scheduled_by(api)
            assert {by[f"second-{i}"] for i in range(6)} == {"replica-b"}
            # the standby waits out the lease on its own clock: about lease_duration_s (+ a retry period)
            assert LE["lease_duration_s"] - 0.5 <= handover <= LE["lease_duration_s"] + 3.0, handover

            assert b.terminate() == 0, b.output()[-3000:]
            lease = request(api, "GET", LEASE)["spec"]
            assert not lease.get("holderIdentity") and lease["leaseDurationSeconds"] == 1, lease
            assert lease["leaseTransitions"] >= 1
        finally:
            a.kill()
            if b is not None:
                b.kill()
