"""`kai-opt run` as a process: SIGKILLed again and again while it applies a plan, then restarted. No pod is ever
bound twice (a pod's nodeName and its GPU devices never change once set, seen on a watch), no pod is lost, every
schedulable pod ends bound, and the GPU devices the restarted processes hand out never collide."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kai_opt.k8s.client import object_path, request, stream_lines

from .schedharness import (
    FAST_RUNTIME,
    NS,
    SchedulerProcess,
    create,
    devices,
    fresh,
    namespace,
    node,
    pod,
    podgroup,
    pods,
    queue,
    wait_for,
)
from .testcluster import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
__all__ = ["fresh"]  # the fixture

RESTARTS = 10


class PodWatch:
    """Every change of every pod in NS, checked as it arrives: once a pod has a nodeName, neither it nor the
    pod's GPU devices may change."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.first: dict[str, tuple[str, str | None]] = {}  # uid -> (node, devices) when first seen bound
        self.violations: list[str] = []
        self.events = 0
        self._stop = threading.Event()
        listing = request(api, "GET", object_path("v1", "pods", NS))
        self._rv = listing["metadata"]["resourceVersion"]
        for p in listing["items"]:
            self._see(p)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _see(self, p: dict[str, Any]) -> None:
        node_name = p["spec"].get("nodeName")
        if not node_name:
            return
        uid, now = p["metadata"]["uid"], (node_name, devices(p))
        before = self.first.setdefault(uid, now)
        if before != now:
            self.violations.append(f"{p['metadata']['name']}: {before} -> {now}")

    def _run(self) -> None:
        while not self._stop.is_set():
            query = {"watch": "true", "resourceVersion": self._rv, "timeoutSeconds": 2}
            for line in stream_lines(self.api, object_path("v1", "pods", NS), query=query, timeout=(5, 10)):
                event = json.loads(line)
                obj = event["object"]
                self._rv = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.events += 1
                    self._see(obj)

    def bound(self) -> int:
        """Pods seen bound so far (cheaper than listing them)."""
        return len(self.first)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def _workload() -> list[dict[str, Any]]:
    """200 pods: 25 gangs of 4 whole GPUs, 10 gangs of 4 CPU-only pods, and pods without a PodGroup (grouped by
    the pod grouper): 40 with one GPU, 20 with half a GPU (150 GPUs on 20 nodes x 8)."""
    objs: list[dict[str, Any]] = [namespace(), queue("team"), *[node(f"n{i:02d}", 8) for i in range(20)]]
    for g in range(25):
        objs.append(podgroup(f"g{g:02d}", 4, "team"))
        objs += [pod(f"g{g:02d}-{i}", gpus=1, group=f"g{g:02d}") for i in range(4)]
    objs += [pod(f"one-{i:02d}", gpus=1, queue_name="team") for i in range(40)]
    objs += [pod(f"half-{i:02d}", fraction="0.5", queue_name="team") for i in range(20)]
    for g in range(10):
        objs.append(podgroup(f"cpu{g}", 4, "team"))
        objs += [pod(f"cpu-{g}{i}", group=f"cpu{g}") for i in range(4)]
    return objs


def test_sigkill_mid_apply_never_binds_twice_nor_loses_pods(fresh: LocalCluster, tmp_path: Path) -> None:
    rng = random.Random(7)
    config = {"schedule_period_s": 0.2, "runtime": {**FAST_RUNTIME, "client_qps": 80, "client_burst": 10}}
    with fresh.api_client() as api:
        create(api, _workload())
        created = {n: p["metadata"]["uid"] for n, p in pods(api).items()}
        assert len(created) == 200
        watch = PodWatch(api)
        kills_mid_apply = 0
        try:
            for restart in range(RESTARTS):
                before = watch.bound()
                if before == 200:
                    break
                proc = SchedulerProcess(fresh, tmp_path, config, identity=f"r{restart}")
                target = min(before + rng.randint(1, 25), 200)
                wait_for(f"restart {restart} binding", lambda t=target, p=proc: watch.bound() >= t
                         or not p.running(), timeout=60, interval=0.01)
                proc.kill()
                assert proc.proc.returncode == -9, proc.output()[-3000:]
                if watch.bound() < 200:
                    kills_mid_apply += 1
            final = SchedulerProcess(fresh, tmp_path, config, identity="final")
            try:
                wait_for("every pod bound", lambda: watch.bound() == 200 and "cycle " in final.output(), timeout=60)
                time.sleep(0.5)
            finally:
                assert final.terminate() == 0, final.output()[-3000:]
        finally:
            watch.stop()
        assert kills_mid_apply >= RESTARTS // 2, f"only {kills_mid_apply} kills landed mid-apply"
        assert watch.violations == [], watch.violations[:10]
        now = pods(api)
        assert {n: p["metadata"]["uid"] for n, p in now.items()} == created, "no pod lost or replaced"
        assert all(p["spec"].get("nodeName") for p in now.values())
        _check_devices(now)


def _check_devices(now: dict[str, dict[str, Any]]) -> None:
    """Per node and device: whole-GPU pods alone, half-GPU pods at most two."""
    use: dict[tuple[str, str], list[str]] = {}
    for name, p in now.items():
        if name.startswith("cpu-"):
            assert devices(p) is None, name
            continue
        devs = devices(p)
        assert devs is not None and "," not in devs, (name, devs)
        use.setdefault((p["spec"]["nodeName"], devs), []).append(name)
    for (node_name, dev), holders in use.items():
        halves = [h for h in holders if h.startswith("half-")]
        whole = [h for h in holders if not h.startswith("half-")]
        assert (len(whole) == 1 and not halves) or (not whole and len(halves) <= 2), (node_name, dev, holders)
        assert 0 <= int(dev) < 8
