"""Scheduling shards on a real apiserver: two `kai-opt run` processes, one per shard (pool-a from its config,
pool-b from KAI's SchedulingShard object), schedule their own node pools only: a pod of one shard is never bound to
a node of the other even when only that node has room, a PodGroup naming the other shard's queue is not scheduled,
each shard leads its own Lease, killing one shard's scheduler leaves the other scheduling, and relabelling a
PodGroup moves it to the other shard."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import MERGE_PATCH, object_path, request

from .schedharness import (
    FAST_RUNTIME,
    NS,
    SchedulerProcess,
    bound,
    create,
    events,
    fresh,
    get_podgroup,
    namespace,
    node,
    pod,
    pods,
    queue,
    served,
    wait_for,
)
from .testcluster import LocalCluster

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

POOL = "kai.scheduler/node-pool"
SHARD_CRD = {  # KAI's schedulingshards.kai.scheduler (cluster-scoped), its schema left open
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "schedulingshards.kai.scheduler"},
    "spec": {"group": "kai.scheduler", "scope": "Cluster",
             "names": {"kind": "SchedulingShard", "plural": "schedulingshards", "singular": "schedulingshard",
                       "listKind": "SchedulingShardList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@contextlib.contextmanager
def scheduling_shards(api: ApiClient, *shards: dict[str, Any]) -> Iterator[None]:
    """KAI's SchedulingShard CRD installed with `shards` in it; removed (with them) afterwards."""
    request(api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=SHARD_CRD)
    try:
        wait_for("SchedulingShards served", lambda: served(api, "kai.scheduler/v1")
                 and _lists_shards(api), timeout=30)
        for s in shards:
            request(api, "POST", object_path("kai.scheduler/v1", "schedulingshards", None), body=s)
        yield
    finally:
        with contextlib.suppress(ApiException):
            request(api, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                    "schedulingshards.kai.scheduler")


def _lists_shards(api: ApiClient) -> bool:
    try:
        request(api, "GET", object_path("kai.scheduler/v1", "schedulingshards", None))
    except ApiException:
        return False
    return True


def in_pool(obj: dict[str, Any], pool: str) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})[POOL] = pool
    return obj


def job(name: str, pool: str, queue_name: str, gpus: int = 1) -> dict[str, Any]:
    """A bare pod of `pool` (its PodGroup, made by the grouper, inherits the label)."""
    return pod(name, gpus=gpus, queue_name=queue_name, labels={POOL: pool})


def holder(api: ApiClient, lease: str) -> str | None:
    try:
        return request(api, "GET", object_path("coordination.k8s.io/v1", "leases", "default", lease))[
            "spec"].get("holderIdentity") or None
    except ApiException:
        return None


def scheduled_by(api: ApiClient) -> dict[str, str]:
    """pod name -> the reportingInstance of its Scheduled event (who bound it)."""
    return {e["involvedObject"]["name"]: e["reportingInstance"] for e in events(api, reason="Scheduled")}


def shard_config(name: str, value: str | None = None) -> dict[str, Any]:
    shard: dict[str, Any] = {"name": name}
    if value is not None:
        shard["partition_value"] = value
    return {"engine": "greedy", "schedule_period_s": 0.2, "runtime": FAST_RUNTIME, "shard": shard}


def test_two_shards_schedule_their_own_pools_and_survive_each_other(fresh: LocalCluster, tmp_path: Path) -> None:
    kai_shard = {"apiVersion": "kai.scheduler/v1", "kind": "SchedulingShard", "metadata": {"name": "pool-b"},
                 "spec": {"partitionLabelValue": "pool-b", "placementStrategy": {"gpu": "spread"}}}
    with fresh.api_client() as api, scheduling_shards(api, kai_shard):
        create(api, [namespace(),
                     in_pool(node("a1", 8), "pool-a"), in_pool(node("a2", 8), "pool-a"),
                     in_pool(node("b1", 4), "pool-b"),
                     in_pool(queue("qa"), "pool-a"), in_pool(queue("qb"), "pool-b"),
                     *[job(f"a-{i}", "pool-a", "qa") for i in range(4)],
                     *[job(f"b-{i}", "pool-b", "qb") for i in range(2)],
                     job("b-big", "pool-b", "qb", gpus=4),  # fits only a node of pool-a: stays pending
                     job("cross", "pool-a", "qb")])  # a PodGroup of pool-a naming pool-b's queue
        procs: list[SchedulerProcess] = []
        try:
            a = SchedulerProcess(fresh, tmp_path, shard_config("pool-a", "pool-a"), identity="shard-a",
                                 leader_elect=True)
            procs.append(a)
            # pool-b's partition value comes from its SchedulingShard only
            b = SchedulerProcess(fresh, tmp_path, shard_config("pool-b"), identity="shard-b", leader_elect=True)
            procs.append(b)
            want = {f"a-{i}" for i in range(4)} | {"b-0", "b-1"}
            placed = wait_for("each shard's pods bound", lambda: (lambda got: got if want <= set(got) else None)(
                bound(api)), timeout=60)
            assert all(placed[f"a-{i}"] in ("a1", "a2") for i in range(4)), placed
            assert placed["b-0"] == placed["b-1"] == "b1", placed
            assert holder(api, "kai-opt-pool-a") == "shard-a" and holder(api, "kai-opt-pool-b") == "shard-b"
            assert holder(api, "kai-opt") is None  # no shard uses the unsharded Lease
            assert "SchedulingShard pool-b read" in b.output()
            assert get_podgroup(api, pods(api)["b-0"]["metadata"]["annotations"]["pod-group-name"])[
                "metadata"]["labels"][POOL] == "pool-b"
            time.sleep(3)  # 15 cycles of each shard
            now = bound(api)
            assert "b-big" not in now, f"a pod of pool-b was bound to {now.get('b-big')}"
            assert "cross" not in now, f"a PodGroup naming another shard's queue was bound to {now.get('cross')}"
            who = wait_for("the Scheduled events", lambda: (lambda s: s if want <= set(s) else None)(
                scheduled_by(api)))
            assert {who[f"a-{i}"] for i in range(4)} == {"shard-a"}
            assert {who["b-0"], who["b-1"]} == {"shard-b"}

            a.kill()  # shard a's scheduler dies: shard b keeps scheduling its pool
            create(api, [job("b-late", "pool-b", "qb"), job("a-late", "pool-a", "qa")])
            assert wait_for("b-late bound by shard b", lambda: bound(api).get("b-late")) == "b1"
            time.sleep(2)
            assert "a-late" not in bound(api), "a pod of pool-a was bound while its shard was down"
            a2 = SchedulerProcess(fresh, tmp_path, shard_config("pool-a", "pool-a"), identity="shard-a2",
                                  leader_elect=True)
            procs.append(a2)
            assert wait_for("a-late bound by the restarted shard a", lambda: bound(api).get("a-late"),
                            timeout=60) in ("a1", "a2")
            assert "b-big" not in bound(api) and "cross" not in bound(api)
            assert wait_for("a-late's Scheduled event", lambda: scheduled_by(api).get("a-late")) == "shard-a2"

            # relabelling a PodGroup moves it to the other shard (KAI's docs): cross now has its queue's shard
            group = pods(api)["cross"]["metadata"]["annotations"]["pod-group-name"]
            request(api, "PATCH", object_path("scheduling.run.ai/v2alpha2", "podgroups", NS, group),
                    body={"metadata": {"labels": {POOL: "pool-b"}}}, content_type=MERGE_PATCH)
            assert wait_for("cross bound by shard b", lambda: bound(api).get("cross")) == "b1"
            assert wait_for("cross's Scheduled event", lambda: scheduled_by(api).get("cross")) == "shard-b"
            assert get_podgroup(api, group)["metadata"]["labels"][POOL] == "pool-b"  # no grouper took it back
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                if "Traceback" in p.output():
                    print(p.output()[-3000:])
