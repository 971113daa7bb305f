"""`kai-opt run` on a real apiserver: reclaim through the Eviction API (and a PodDisruptionBudget that refuses it),
GPU sharing by fraction, a topology-required gang, and malformed Queues/PodGroups reported on the object while
the rest is scheduled."""

from __future__ import annotations

import time

import pytest
from kubernetes.client import ApiClient

from kai_opt.k8s.client import object_path, request

from .schedharness import (
    NS,
    bound,
    create,
    devices,
    events,
    fast_config,
    fresh,
    get_podgroup,
    namespace,
    node,
    pod,
    podgroup,
    pods,
    queue,
    scheduler,
    wait_for,
)
from .testcluster import LocalCluster

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture


def _team_a_fills_the_node(api: ApiClient) -> None:
    """One 8-GPU node; queue qa runs 8 one-GPU jobs (over its quota of 4: qb is idle)."""
    objs = [namespace(), node("n1", 8), queue("qa", 4), queue("qb", 4)]
    for i in range(8):
        objs += [podgroup(f"a{i}", 1, "qa"), pod(f"a{i}", gpus=1, group=f"a{i}", labels={"team": "a"})]
    create(api, objs)


def test_reclaim_evicts_through_the_eviction_api_then_the_reclaimer_binds(fresh: LocalCluster) -> None:
    with fresh.api_client() as api, fresh.kwok():
        _team_a_fills_the_node(api)
        with scheduler(fresh, fast_config(podgroup_counts=True)):  # b's phase tells the reclaim is done
            wait_for("team a running", lambda: len(bound(api)) == 8
                     and all(p["status"].get("phase") == "Running" for p in pods(api).values()))
            create(api, [podgroup("b", 4, "qb"), *[pod(f"b{i}", gpus=1, group="b") for i in range(4)]])
            wait_for("team b bound", lambda: sum(1 for n in bound(api) if n.startswith("b")) == 4, timeout=30)
            wait_for("b's status", lambda: get_podgroup(api, "b").get("status", {}).get("phase") == "Running")
            final = bound(api)
        team_a = [n for n in final if n.startswith("a")]
        assert len(team_a) == 4, f"qa keeps its quota of 4: {sorted(final)}"
        evicted = events(api, reason="Evicted")
        assert len(evicted) == 4
        assert {e["involvedObject"]["name"] for e in evicted}.isdisjoint(team_a)
        assert all("(reclaim)" in e["message"] and f"podgroup {NS}/b" in e["message"] for e in evicted)
        used = sorted(devices(p) for n, p in pods(api).items() if n in final)
        assert used == [str(d) for d in range(8)], "each device of the node is held once"


def test_a_disruption_budget_refusal_keeps_the_victims_and_the_reclaimer_waits(fresh: LocalCluster) -> None:
    with fresh.api_client() as api, fresh.kwok():
        _team_a_fills_the_node(api)
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "a", "namespace": NS},
               "spec": {"minAvailable": 8, "selector": {"matchLabels": {"team": "a"}}}}
        create(api, [pdb])
        with scheduler(fresh):
            wait_for("team a running", lambda: len(bound(api)) == 8
                     and all(p["status"].get("phase") == "Running" for p in pods(api).values()))
            create(api, [podgroup("b", 4, "qb"), *[pod(f"b{i}", gpus=1, group="b") for i in range(4)]])
            wait_for("refused evictions reported", lambda: events(api, reason="EvictionBlocked"), timeout=15)
            nominated = wait_for("b nominated onto the node while it waits", lambda: {
                n: p["status"].get("nominatedNodeName") for n, p in pods(api).items() if n.startswith("b")} == {
                f"b{i}": "n1" for i in range(4)})
            time.sleep(1.0)
            now = pods(api)
            assert nominated and all(not p["metadata"].get("deletionTimestamp") for p in now.values())
            assert sorted(bound(api)) == [f"a{i}" for i in range(8)], "victims keep running, b waits"
            request(api, "DELETE", object_path("policy/v1", "poddisruptionbudgets", NS, "a"))
            wait_for("team b bound once the budget is gone",
                     lambda: sum(1 for n in bound(api) if n.startswith("b")) == 4, timeout=30)
        assert not events(api, reason="FailedBinding")


def test_fractional_pods_share_one_gpu_device(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 2), queue("team"),
                     *[pod(f"half-{i}", fraction="0.5", queue_name="team") for i in range(2)],
                     pod("whole", gpus=1, queue_name="team")])
        with scheduler(fresh):
            wait_for("all bound", lambda: len(bound(api)) == 3)
            time.sleep(0.3)
        now = pods(api)
        halves = {devices(now[f"half-{i}"]) for i in range(2)}
        assert len(halves) == 1 and halves != {None}, f"both halves on one device: {halves}"
        assert devices(now["whole"]) not in halves
        assert {devices(now["whole"]), *halves} == {"0", "1"}


def test_topology_required_gang_lands_in_one_rack(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        topo = {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": "dc"},
                "spec": {"levels": [{"nodeLabel": "rack"}, {"nodeLabel": "kubernetes.io/hostname"}]}}
        racks = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}
        blocker = pod("blocker", gpus=3, scheduler="someone-else")
        blocker["spec"]["nodeName"] = "n1"  # another scheduler's pod holds 3 GPUs of rack r1 (5 free there)
        create(api, [namespace(), topo, *[node(n, 4, {"rack": r}) for n, r in racks.items()], queue("team"),
                     blocker, podgroup("ring", 6, "team", topology={"topology": "dc", "requiredTopologyLevel": "rack"}),
                     *[pod(f"ring-{i}", gpus=1, group="ring") for i in range(6)]])
        with scheduler(fresh):
            wait_for("the gang bound", lambda: len([n for n in bound(api) if n.startswith("ring")]) == 6)
        placed = {n: node_name for n, node_name in bound(api).items() if n.startswith("ring")}
        assert {racks[n] for n in placed.values()} == {"r2"}, placed


def test_malformed_queue_and_podgroup_are_reported_while_the_rest_is_scheduled(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        bad_pg = podgroup("loop", 2, "team", sub_groups=[{"name": "x", "minMember": 1, "parent": "y"},
                                                          {"name": "y", "minMember": 1, "parent": "x"}])
        create(api, [namespace(), node("n1", 8), queue("team"), queue("orphan", parent="ghost"),
                     bad_pg, *[pod(f"loop-{i}", gpus=1, group="loop") for i in range(2)],
                     podgroup("lost", 1, "orphan"), pod("lost-0", gpus=1, group="lost"),
                     podgroup("good", 4, "team"), *[pod(f"good-{i}", gpus=1, group="good") for i in range(4)]])
        with scheduler(fresh):
            wait_for("the good gang bound", lambda: len(bound(api)) == 4)
            q_cond = wait_for("the orphan queue's condition", lambda: [
                c for c in request(api, "GET", object_path("scheduling.run.ai/v2", "queues", None, "orphan"))
                .get("status", {}).get("conditions", []) if c["type"] == "Valid"])
            pg_cond = wait_for("the bad podgroup's condition", lambda: get_podgroup(api, "loop").get(
                "status", {}).get("schedulingConditions"))
            lost_cond = wait_for("the orphan queue's podgroup condition", lambda: get_podgroup(api, "lost").get(
                "status", {}).get("schedulingConditions"))
            queue_events = wait_for("an event on the orphan queue", lambda: [
                e for e in events(api, "default", reason="ParentQueueDoesNotExist")
                if e["involvedObject"]["name"] == "orphan"])
            pg_events = wait_for("an event on the bad podgroup", lambda: [
                e for e in events(api, reason="Invalid") if e["involvedObject"]["name"] == "loop"])
            time.sleep(0.5)
            assert sorted(bound(api)) == [f"good-{i}" for i in range(4)]
        assert q_cond[0]["status"] == "False" and "ghost" in q_cond[0]["message"]
        assert queue_events[0]["involvedObject"]["kind"] == "Queue" and queue_events[0]["type"] == "Warning"
        assert pg_cond[-1]["reason"] == "Invalid" and "cycle" in pg_cond[-1]["message"]
        assert pg_events[0]["involvedObject"]["kind"] == "PodGroup"
        assert lost_cond[-1]["reason"] == "QueueDoesNotExist"
        good = request(api, "GET", object_path("scheduling.run.ai/v2", "queues", None, "team"))["status"]
        assert good["allocated"]["nvidia.com/gpu"] == "4" and good["requested"]["nvidia.com/gpu"] == "4"
