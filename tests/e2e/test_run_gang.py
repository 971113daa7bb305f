"""`kai-opt run` on a real apiserver: gangs bind all-or-nothing, a gang that cannot fit binds nothing and its
PodGroup status and pod Events carry the plan's reason verbatim."""

from __future__ import annotations

import time

import pytest

from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.k8s.client import object_path, request
from kai_opt.k8s.dump import dump_cluster
from kai_opt.k8s.manifests import cluster_rules
from kai_opt.k8s.metrics import SchedulerMetrics
from kai_opt.loaders.documents import Document
from kai_opt.loaders.kubeobjects import objects_from_documents
from kai_opt.snapshot import Snapshot
from kai_opt.state import build_state

from .schedharness import (
    FAST_RUNTIME,
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


def test_two_gangs_on_room_for_one_bind_all_or_nothing(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        objs = [namespace(), node("n1", 4), node("n2", 4), queue("team")]
        for g in ("gang-a", "gang-b"):
            objs.append(podgroup(g, 8, "team"))
            objs += [pod(f"{g}-{i}", gpus=1, group=g) for i in range(8)]
        create(api, objs)
        metrics = SchedulerMetrics()
        with scheduler(fresh, metrics=metrics):
            wait_for("one gang bound", lambda: len(bound(api)) == 8)
            time.sleep(1.0)  # several more cycles: nothing of the other gang may bind
            placed = bound(api)
        assert len(placed) == 8
        gangs = {name.rsplit("-", 1)[0] for name in placed}
        assert len(gangs) == 1, f"pods of both gangs bound: {sorted(placed)}"
        winner = gangs.pop()
        loser = "gang-b" if winner == "gang-a" else "gang-a"
        assert sorted(placed.values()).count("n1") == 4 and sorted(placed.values()).count("n2") == 4
        by_node: dict[str, list[str]] = {}
        for name, p in pods(api).items():
            if name in placed:
                by_node.setdefault(placed[name], []).append(devices(p) or "")
        for node_name, devs in by_node.items():  # every GPU device of a node is given once
            assert sorted(devs) == ["0", "1", "2", "3"], (node_name, devs)
        status = get_podgroup(api, winner).get("status") or {}
        assert "phase" not in status and "running" not in status, "counts are off by default (KAI leaves them unset)"
        lost = get_podgroup(api, loser)["status"]
        assert "phase" not in lost and "pending" not in lost
        cond = lost["schedulingConditions"][-1]
        assert cond["type"] == "UnschedulableOnNodePool" and cond["status"] == "True"
        scheduled = {e["involvedObject"]["name"] for e in events(api, reason="Scheduled")}
        assert scheduled == set(placed)
        text = metrics.text()
        assert "kai_opt_pods_bound_total 8.0" in text
        assert 'kai_queue_allocated_gpus{queue_name="team"} 8.0' in text  # KAI's name, label and unit
        assert "kai_task_bind_latency_milliseconds_count 8.0" in text
        assert "kai_task_scheduling_latency_milliseconds_count 8.0" in text
        assert 'kai_action_scheduling_latency_milliseconds{action="allocate"}' in text
        assert "kai_e2e_scheduling_latency_milliseconds" in text and "kai_open_session_latency_milliseconds" in text
        assert 'kai_opt_cycle_phase_seconds_count{phase="solve"}' in text


def test_gang_that_cannot_fit_binds_nothing_and_reports_the_plans_reason(fresh: LocalCluster) -> None:
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 3), node("n2", 3), queue("team"), podgroup("big", 8, "team"),
                     *[pod(f"big-{i}", gpus=1, group="big") for i in range(8)]])
        # the reason the engine gives for this cluster, computed independently from a dump of it
        dumped = dump_cluster(api)
        snap = Snapshot.from_objects(objects_from_documents([Document(dumped, "dump", 1)]))
        state = build_state(snap)
        plan, _ = run_cycle(state, fast_config())  # the engine the harness's scheduler runs
        expected = plan.pending[state.pg_index[f"{NS}/big"]]
        assert "0/2 nodes are available" in expected[0].message
        with scheduler(fresh):
            conds = wait_for("the unschedulable condition", lambda: get_podgroup(api, "big").get(
                "status", {}).get("schedulingConditions"))
            wait_for("FailedScheduling events on every pod", lambda: len(
                {e["involvedObject"]["name"] for e in events(api, reason="FailedScheduling")}) == 8)
            time.sleep(0.6)
            assert bound(api) == {}
        cond = conds[-1]
        assert cond["reason"] == expected[0].code
        assert cond["message"] == "; ".join(r.message for r in expected)
        assert [(r["reason"], r["message"]) for r in cond["reasons"]] == [(r.code, r.message) for r in expected]
        assert cond["transitionID"] == "1" and cond["nodePool"] == "default"
        status = get_podgroup(api, "big")["status"]
        assert "phase" not in status and "pending" not in status, "counts are off by default"
        failed = events(api, reason="FailedScheduling")
        assert {e["message"] for e in failed} == {cond["message"]}
        assert all(e["type"] == "Warning" and e["source"]["component"] == "kai-opt" for e in failed)
        assert len(failed) == 8, "the same event is not repeated within event_repeat_s"
        pg_events = [e for e in events(api, reason="Unschedulable") if e["involvedObject"]["kind"] == "PodGroup"]
        assert len(pg_events) == 1 and pg_events[0]["message"] == cond["message"]


def test_a_running_gang_that_loses_a_pod_is_marked_stale_then_evicted_whole(fresh: LocalCluster) -> None:
    config = parse_config({"engine": "greedy", "schedule_period_s": 0.2, "stale_gang_grace_s": 1.0,
                           "runtime": FAST_RUNTIME})
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 8), queue("team"), podgroup("g", 4, "team"),
                     *[pod(f"g-{i}", gpus=1, group="g") for i in range(4)]])
        metrics = SchedulerMetrics()
        with scheduler(fresh, config, metrics=metrics):
            wait_for("the gang bound", lambda: len(bound(api)) == 4)
            started = wait_for("its last-start timestamp", lambda: (get_podgroup(api, "g")["metadata"].get(
                "annotations") or {}).get("kai.scheduler/last-start-timestamp"))
            request(api, "DELETE", object_path("v1", "pods", NS, "g-0"), query={"gracePeriodSeconds": 0})
            wait_for("the stale timestamp", lambda: (get_podgroup(api, "g")["metadata"].get("annotations") or {})
                     .get("kai.scheduler/stale-podgroup-timestamp"))
            wait_for("the rest of the gang evicted", lambda: len(events(api, reason="Evicted")) == 3, timeout=20)
            assert all(p["metadata"].get("deletionTimestamp") for p in pods(api).values())
        assert started.endswith("Z")
        evicted = events(api, reason="Evicted")
        assert sorted(e["involvedObject"]["name"] for e in evicted) == ["g-1", "g-2", "g-3"]
        assert all("(stale-gang)" in e["message"] for e in evicted)
        uid = get_podgroup(api, "g")["metadata"]["uid"]
        assert (f'kai_pod_group_evicted_pods_total{{action="stalegangeviction",namespace="{NS}",nodepool="default",'
                f'podgroup="g",uid="{uid}"}} 3.0') in metrics.text()  # KAI's series: the group, its pool, the action


def test_the_scheduler_works_with_the_least_privilege_rbac_of_the_manifests(fresh: LocalCluster) -> None:
    """The scheduler as test identity `kai-opt`, granted only the manifests' ClusterRole and Lease Role."""
    rbac = "rbac.authorization.k8s.io/v1"
    subject = [{"kind": "User", "name": "kai-opt", "apiGroup": "rbac.authorization.k8s.io"}]
    grants = [
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "kai-opt-e2e-run"}, "rules": cluster_rules()},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "kai-opt-e2e-run"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kai-opt-e2e-run"},
         "subjects": subject},
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "kai-opt-e2e-lease", "namespace": "default"},
         "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["get", "create", "update"]}]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": "kai-opt-e2e-lease", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kai-opt-e2e-lease"},
         "subjects": subject},
    ]
    with fresh.api_client() as api:
        create(api, [namespace(), node("n1", 4), queue("team"), podgroup("g", 4, "team"),
                     *[pod(f"g-{i}", gpus=1, group="g") for i in range(4)], pod("lone", queue_name="team"), *grants])
        try:
            with scheduler(fresh, fast_config(podgroup_counts=True), user="kai-opt", leader_elect=True,
                           identity="rbac-test"):
                wait_for("everything bound", lambda: len(bound(api)) == 5)
                wait_for("podgroup status", lambda: get_podgroup(api, "g").get("status", {}).get("phase") == "Running")
                assert get_podgroup(api, "g")["status"]["running"] == 4
                wait_for("queue status", lambda: request(api, "GET", object_path(
                    "scheduling.run.ai/v2", "queues", None, "team")).get("status", {}).get("allocated"))
                wait_for("Scheduled events", lambda: len(events(api, reason="Scheduled")) == 5)
                lease = request(api, "GET", object_path("coordination.k8s.io/v1", "leases", "default", "kai-opt"))
                assert lease["spec"]["holderIdentity"] == "rbac-test"
            assert devices(pods(api)["g-0"]) is not None
        finally:
            for g in reversed(grants):
                plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
                          "Role": "roles", "RoleBinding": "rolebindings"}[g["kind"]]
                request(api, "DELETE", object_path(rbac, plural, g["metadata"].get("namespace"),
                                                   g["metadata"]["name"]))
