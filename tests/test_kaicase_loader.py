"""KAI-Scheduler behaviour cases -> Kubernetes objects -> Snapshot -> ClusterState (kai_opt.loaders.kaicase)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from kai_opt.api.meta import parse_time
from kai_opt.errors import InputError
from kai_opt.loaders import load_snapshot
from kai_opt.loaders.kaicase import CASE_NOW, DRA_REASON, Case, load_case, load_cases
from kai_opt.state import R_CPU, R_GPU, R_MEM, R_PODS, PodStatus, build_state

SCENARIOS = Path(os.environ.get("KAI_SCENARIOS", "/work/shared/scenarios/kai"))
SHARED = Path("/work/shared/scenarios/kai")  # spot checks name files of this corpus

needs_corpus = pytest.mark.skipif(not SCENARIOS.is_dir(), reason=f"no scenarios at {SCENARIOS}")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"no scenarios at {SHARED}")


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases(SCENARIOS)


def case(rel: str) -> Case:
    return load_case(SHARED / rel)


def pod(c: Case, task: str):
    return next(p for p in c.snapshot.pods if p.key == c.task_pod[task])


def group(c: Case, job: str):
    return next(g for g in c.snapshot.podgroups if g.key == c.job_podgroup[job])


# -- the whole corpus ----------------------------------------------------------------------------------------------
@needs_corpus
def test_every_case_loads_or_is_unsupported_with_a_reason(cases: list[Case]) -> None:
    files = sorted(p for p in SCENARIOS.rglob("*") if p.suffix in (".yaml", ".yml"))
    assert [c.path for c in cases] == files
    for c in cases:
        assert c.name and c.mode in ("single-round", "integration") and c.actions
        assert all(isinstance(r, str) and r for r in c.unsupported)
        # a snapshot that failed to build is a loader bug for this corpus, not an unsupported feature
        assert not any(r.startswith("snapshot:") for r in c.unsupported), (c.path, c.unsupported)
        if c.supported:
            state = build_state(c.snapshot)
            assert not state.warnings, (c.path, state.warnings)
            assert not c.snapshot.warnings, (c.path, c.snapshot.warnings)
            spec = c.spec
            assert spec is not None
            assert len(c.snapshot.nodes) == len(spec.nodes)
            assert len(c.snapshot.queues) == len(spec.queues)
            assert len(c.snapshot.podgroups) == len(spec.jobs)
            assert len(c.snapshot.pods) == sum(len(j.tasks) for j in spec.jobs)
            assert set(c.task_pod) == {t.name for j in spec.jobs for t in j.tasks}


@needs_corpus
def test_modes_rounds_and_session(cases: list[Case]) -> None:
    for c in cases:
        assert c.now == CASE_NOW and c.snapshot.now == CASE_NOW
        assert c.session["staleness_grace_period_seconds"] >= 0
        if c.mode == "integration":
            assert c.rounds is not None and c.rounds.until_match >= 1 and c.rounds.after_match >= 0
            assert c.actions == ["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]
        else:
            assert c.rounds is None and len(c.actions) == 1


@needs_shared
def test_supported_and_unsupported_counts() -> None:
    cs = load_cases(SHARED)
    unsupported = [c for c in cs if c.unsupported]
    assert len(cs) == 174
    assert len(unsupported) == 7
    flaky = next(c for c in cs if c.path.name.startswith("005-flaky"))
    assert "queue with an empty name" in flaky.unsupported
    # MIG and the harness's DRA objects are represented now (issue 21): the 9 MIG cases and 4 of the 5 DRA
    # cases run; the fifth's reservedFor is a Go call the extractor could not evaluate
    mig = [c for c in cs if c.spec is not None and (any(n.mig for n in c.spec.nodes.values())
                                                      or any(t.mig for j in c.spec.jobs for t in j.tasks))]
    assert len(mig) == 9 and all(c.supported for c in mig)
    dra = [c for c in cs if c.spec is not None and c.spec.dra is not None]
    assert len(dra) == 5 and sum(c.supported for c in dra) == 4
    assert all("MIG" not in c.unsupported and DRA_REASON not in c.unsupported for c in cs)


# -- spot checks ---------------------------------------------------------------------------------------------------
@needs_shared
def test_nodes_queues_and_elastic_job() -> None:
    c = case("allocate/001-allocate-elastic-job-full-allocate.yaml")
    assert c.supported and c.mode == "single-round" and c.actions == ["allocate"]
    s = build_state(c.snapshot)
    assert s.node_names == ["node0"]
    assert s.node_alloc[0, R_CPU] == 20_000_000 and s.node_alloc[0, R_MEM] == 20_000_000_000
    assert s.node_alloc[0, R_GPU] == 2000 and s.node_alloc[0, R_PODS] == 110
    labels = s.node_labels[0]
    assert labels["kai.scheduler/type"] == "node0" and labels["nvidia.com/gpu.memory"] == "100"
    assert labels["nvidia.com/gpu.count"] == "2"
    q0, dflt = s.q_index["queue0"], s.q_index["default"]
    assert s.q_parent[q0] == dflt and s.q_parent[dflt] == -1
    assert s.q_deserved[q0].tolist() == [1, -1, -1] and s.q_limit[q0].tolist() == [-1, -1, -1]
    assert s.q_oqw[q0].tolist() == [0, 1, 1]
    assert s.q_deserved[dflt].tolist() == [-1, -1, -1] and s.q_oqw[dflt, 0] == 1  # -1 on a lone queue
    assert s.q_creation[dflt] - s.q_creation[q0] == 60
    g = s.pg_index[c.job_podgroup["pending_job0"]]
    assert s.pg_min_member[g] == 1 and s.pg_priority[g] == 50 and s.pg_preemptible[g]
    assert c.job_tasks == {"pending_job0": ["pending_job0-0", "pending_job0-1"]}
    assert all(s.pod_status[i] == PodStatus.PENDING for i in s.group_pods(g))
    assert s.pod_req[s.pod_index[c.task_pod["pending_job0-0"]]].tolist()[:4] == [1000, 1_000_000_000, 1000, 1]
    assert c.expected.counts is not None and c.expected.counts.binds == 2
    assert c.expected.tasks["pending_job0-1"].status == "Binding"
    assert c.expected.tasks["pending_job0-1"].node == "node0"


@needs_shared
def test_queue_units_cpu_and_memory() -> None:
    c = case("allocate/099-drf-order.yaml")
    s = build_state(c.snapshot)
    q0 = s.q_index["queue0"]
    assert s.q_deserved[q0].tolist() == [0, 1500, 1.5e9]  # cpu millicores, memory bytes (MB in the CRD)
    assert s.q_limit[q0].tolist() == [-1, -1, -1]
    assert s.node_alloc[0, R_CPU] == 3_000_000 and s.node_alloc[0, R_MEM] == 30_000_000_000
    assert s.node_alloc[0, R_GPU] == 0
    p = s.pod_index[c.task_pod["running_job_b_0-0"]]
    assert s.pod_req[p, R_CPU] == 800_000 and s.pod_req[p, R_MEM] == 9_000_000_000
    assert s.pod_status[p] == PodStatus.BOUND and s.node_used[0, R_CPU] == 1_800_000


@needs_shared
def test_integration_case_with_department_and_cpu_limit() -> None:
    c = case("integration/040-don-t-allow-job-over-queue-deserved-cpu.yaml")
    assert c.mode == "integration" and c.rounds is not None
    assert (c.rounds.until_match, c.rounds.after_match) == (1, 5)
    s = build_state(c.snapshot)
    q0, dep = s.q_index["queue0"], s.q_index["department-a"]
    assert s.q_parent[q0] == dep
    assert s.q_limit[q0].tolist() == [2, 2_500_000, -1] and s.q_oqw[q0, 0] == 2 and s.q_oqw[dep, 0] == 2
    assert s.node_alloc[0, R_CPU] == 5_000_000


@needs_shared
def test_nested_subgroups_and_topology() -> None:
    c = case("allocate/061-required-and-preferred-topology-constraints-combined-at-diff.yaml")
    s = build_state(c.snapshot)
    g = s.pg_index[c.job_podgroup["pending_job0"]]
    assert s.pg_min_member[g] == 4  # sum of the leaf pod sets
    topo = s.topologies[s.pg_topology[g]]
    assert topo.name == "cluster-topology" and topo.levels[s.pg_preferred_level[g]] == "k8s.io/zone"
    assert s.pg_required_level[g] == -1
    sgs = {s.sg_names[i]: i for i in np.nonzero(s.sg_pg == g)[0]}
    assert set(sgs) == {"replica1", "encoder1", "decoder1", "replica2", "encoder2", "decoder2"}
    r1 = sgs["replica1"]
    assert s.sg_parent[r1] == -1 and s.sg_min_member[r1] == 2  # a non-leaf needs all its children
    assert topo.levels[s.sg_required_level[r1]] == "k8s.io/rack"
    assert s.sg_parent[sgs["decoder1"]] == r1 and s.sg_min_member[sgs["decoder1"]] == 1
    assert s.pod_sg[s.pod_index[c.task_pod["pending_job0-0"]]] == sgs["encoder1"]
    assert [t.name for t in c.snapshot.topologies] == ["cluster-topology"]


@needs_shared
def test_flat_subgroups_and_implicit_default_pod_set() -> None:
    c = case("allocate/071-allocate-job-with-subgroups-allocate-resource-to-unsatisfied.yaml")
    pg = group(c, "job0")
    assert pg.min_member == 4 and [(x.name, x.min_member, x.parent) for x in pg.sub_groups] == [
        ("sub0", 2, None), ("sub1", 2, None)]
    assert pod(c, "job0-0").subgroup == "sub0"
    # a job whose subgroups only carry a topology constraint: its tasks form the implicit `default` pod set
    c = case("allocate/048-required-topology-level-schedule-all-tasks-on-the-same-rack.yaml")
    pg = group(c, "pending_job0")
    assert pg.min_member == 2 and [(x.name, x.min_member) for x in pg.sub_groups] == [("default", 2)]
    assert pg.topology_constraint is not None and pg.topology_constraint.required_level
    assert pod(c, "pending_job0-1").subgroup == "default"
    s = build_state(c.snapshot)
    g = s.pg_index[c.job_podgroup["pending_job0"]]
    assert not s.warnings and (s.pod_sg[s.group_pods(g)] >= 0).all()


@needs_shared
def test_stale_gang_with_failed_pod() -> None:
    c = case("stalegangeviction/005-stale-job-with-sub-groups-evict.yaml")
    assert c.session == {"staleness_grace_period_seconds": 60}
    pg = group(c, "job-1")
    assert pg.stale_since == CASE_NOW - 61
    assert pg.min_member == 3 and {x.name: x.min_member for x in pg.sub_groups} == {"sub-group-0": 2,
                                                                                    "sub-group-1": 1}
    failed = pod(c, "job-1-3")
    assert failed.finished and failed.node_name == "node-1"
    s = build_state(c.snapshot)
    g = s.pg_index[c.job_podgroup["job-1"]]
    assert s.pg_stale_since[g] == CASE_NOW - 61
    assert len(s.group_pods(g)) == 3  # the failed pod holds nothing and is not scheduled
    assert s.node_alloc[0, R_GPU] == 0
    assert c.expected.tasks["job-1-3"].status == "Failed" and c.expected.counts.evictions == 3


@needs_shared
def test_releasing_fractional_pods_share_one_device() -> None:
    c = case("integration/065-delete-2-fractional-jobs-from-same-gpu.yaml")
    assert c.deleting_jobs == {"releasing_job0", "releasing_job1"}
    s = build_state(c.snapshot)
    for task in ("releasing_job0-0", "releasing_job1-0"):
        p = s.pod_index[c.task_pod[task]]
        assert s.pod_status[p] == PodStatus.RELEASING and s.pod_gpu_frac[p] == 500
        assert s.pods[p].gpu_group == "1" and s.pods[p].meta.deletion_timestamp == CASE_NOW
    assert s.dev_used.tolist() == [1000, 0] and s.dev_releasing.tolist() == [1000, 0]


@needs_shared
def test_pipelined_pod_is_nominated() -> None:
    c = case("allocate/022-test-gpusharingorder-for-a-node-that-has-a-gpu-reservation-p.yaml")
    p = pod(c, "pipelined_shared_gpu_job0-0")
    assert p.node_name is None and p.nominated_node == "node1"
    assert p.gpu_fraction == 0.5 and p.gpu_group == "1" and p.requests.get("nvidia.com/gpu", 0) == 0
    pending = pod(c, "pending_shared_gpu_job1-0")
    assert pending.nominated_node is None and pending.gpu_group is None
    s = build_state(c.snapshot)
    assert s.pod_gpu_frac[s.pod_index[p.key]] == 500


@needs_shared
def test_gpu_memory_request_and_pending_node_ignored() -> None:
    c = case("allocate/041-pending-job-requests-gpu-memory-new-shared-gpu-device-select.yaml")
    p = pod(c, "pending_job-0-0")
    assert p.gpu_memory_mib == 50 and p.gpu_fraction is None and p.requests["memory"] == 750
    s = build_state(c.snapshot)
    assert s.node_alloc[0, R_MEM] == 2000
    assert s.node_releasing[0, R_MEM] == 500 and s.node_used[0, R_MEM] == 1500
    c = case("reclaim/022-reclaim-single-task-from-elastic-job.yaml")
    assert pod(c, "pending-job-0").node_name is None  # a node on a Pending task is not a placement


@needs_shared
def test_job_creation_order_by_priority() -> None:
    c = case("preempt/043-inference-should-preempt-train.yaml")
    train, inference = group(c, "running_job0"), group(c, "pending_job0")
    n = len(c.spec.jobs)
    # stable sort by priority (descending): the inference job (125) is first, so the oldest
    assert inference.meta.creation_timestamp == CASE_NOW - 60 * n
    assert train.meta.creation_timestamp == CASE_NOW - 60 * (n - 1)
    assert pod(c, "pending_job0-0").meta.creation_timestamp == inference.meta.creation_timestamp
    assert inference.preemptibility == "non-preemptible" and train.preemptibility == "preemptible"
    assert {pc.name: pc.value for pc in c.snapshot.priority_classes} == {"kai-case-prio-50": 50,
                                                                         "kai-case-prio-125": 125}


@needs_shared
def test_affinity_and_task_priority() -> None:
    c = case("allocate/102-pod-affinity-and-anti-affinity-scheduling-makes-job-stay-pen.yaml")
    spec_tasks = {t.name: t for j in c.spec.jobs for t in j.tasks}
    for name, t in spec_tasks.items():
        p = pod(c, name)
        if t.pod_affinity:
            assert p.labels["app"] == "database"
            if t.pod_affinity.affinity_topology_key:
                assert p.pod_affinity[0].topology_key == t.pod_affinity.affinity_topology_key
                assert p.pod_affinity[0].selector.match_labels == {"app": "database"}
            if t.pod_affinity.anti_affinity_topology_key:
                assert p.pod_anti_affinity[0].topology_key == t.pod_affinity.anti_affinity_topology_key
    c = case("allocate/049-required-topology-level-could-not-schedule-on-first-domain-d.yaml")
    with_affinity = [t for j in c.spec.jobs for t in j.tasks if t.node_affinity]
    for t in with_affinity:
        term = pod(c, t.name).node_affinity[0].match_expressions[0]
        assert (term.key, term.operator, list(term.values)) == ("kai.scheduler/type", "In", t.node_affinity)
    c = case("allocate/003-allocate-elastic-job-partial-allocate-with-priority.yaml")
    assert pod(c, "pending_job0-0").priority == 1 and pod(c, "pending_job0-1").priority == 2
    assert pod(c, "pending_job0-1").labels["kai.scheduler/task-priority"] == "2"


@needs_shared
def test_running_pod_times() -> None:
    c = case("allocate/004-allocate-elastic-job-full-allocate-partially-running.yaml")
    running = [t for j in c.spec.jobs for t in j.tasks if t.state == "Running"]
    assert running
    for t in running:
        p = pod(c, t.name)
        assert p.node_name == t.node and p.phase == "Running" and p.start_time == CASE_NOW - 3600
    job = next(j.name for j in c.spec.jobs if any(t.state == "Running" for t in j.tasks))
    assert group(c, job).last_start == CASE_NOW - 60


@needs_shared
def test_mig_case_is_supported_and_loads() -> None:
    c = case("allocate/047-mig-job-with-multiple-tasks-requesting-mig-device.yaml")
    assert c.unsupported == []  # MIG profiles are extended resources (issue 21)
    node = c.snapshot.nodes[0]
    assert node.allocatable["nvidia.com/mig-1g.10gb"] == 3 and node.gpus == 0
    assert node.labels["node-role.kubernetes.io/mig-enabled"] == "true"
    assert pod(c, "pending_job-0-0").requests["nvidia.com/mig-1g.10gb"] == 2


# -- schema and dispatch -------------------------------------------------------------------------------------------
def _minimal() -> dict:
    return {
        "name": "tiny", "source": {"file": "x_test.go", "index": 0, "test_func": "TestX"}, "mode": "single-round",
        "actions": ["allocate"], "nodes": {"n0": {"gpus": 1}},
        "queues": [{"name": "q", "parent": None, "gpu": {"deserved": 1, "limit": -1, "over_quota_weight": 1}}],
        "jobs": [{"name": "j", "queue": "q", "priority": 50, "per_task": {"gpus": 0.25},
                  "tasks": [{"name": "j-0", "state": "Running", "node": "n0", "gpu_groups": ["g"]},
                            {"name": "j-1", "state": "Pending"}]}],
        "expected": {"jobs": {"j": {"status": "Running", "gpus_required": 0.5}}},
    }


def test_minimal_case_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(_minimal()))
    c = load_case(f)
    assert c.supported and c.job_podgroup == {"j": "default/j"} and c.task_pod["j-1"] == "default/j-1"
    assert c.session == {"staleness_grace_period_seconds": 0.0}
    s = build_state(c.snapshot)
    p = s.pod_index["default/j-0"]
    assert s.pod_gpu_frac[p] == 250 and s.pods[p].gpu_group == "g" and s.dev_used.tolist() == [250]
    assert s.pg_min_member[0] == 2 and s.pg_preemptible[0]
    assert load_snapshot(f).counts() == c.snapshot.counts()  # `kai-opt show` goes through the dispatcher
    assert parse_time("2026-01-01T00:00:00Z", obj="", field="") == CASE_NOW


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["jobs"][0]["tasks"][0].update(nodee="n0"), "jobs.0.tasks.0.nodee"),
    (lambda d: d["jobs"][0]["tasks"][0].update(state="Runing"), "jobs.0.tasks.0.state"),
    (lambda d: d["nodes"]["n0"].update(gpu=2), "nodes.n0.gpu"),
    (lambda d: d.update(actions=["alocate"]), "actions.0"),
    (lambda d: d["expected"]["jobs"]["j"].update(stat="Running"), "expected.jobs.j.stat"),
])
def test_schema_typos_are_errors(tmp_path: Path, mutate, field: str) -> None:
    data = _minimal()
    mutate(data)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as err:
        load_case(f)
    assert err.value.field == field and err.value.source == str(f)


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda d: d["jobs"][0]["tasks"][1].update(resource_claims=["c"]), "DRA"),
    (lambda d: d["jobs"][0]["tasks"][0].update(legacy_mig=True), "MIG"),
    (lambda d: d["jobs"][0]["tasks"][0].update(state="Unknown"), "state Unknown"),
    (lambda d: d["jobs"][0]["tasks"][0].update(gpu_groups=["a", "b"]), "several GPU groups"),
    (lambda d: d["jobs"][0]["per_task"].update(gpus=1.5), "fractional GPU request above one device"),
    (lambda d: d["jobs"][0]["tasks"][1].update(subgroup="nope"), "is not a pod set"),
    (lambda d: d["queues"][0].update(parent="missing"), "snapshot:"),
])
def test_unrepresentable_cases_are_unsupported(tmp_path: Path, mutate, reason: str) -> None:
    data = _minimal()
    mutate(data)
    f = tmp_path / "odd.yaml"
    f.write_text(yaml.safe_dump(data))
    c = load_case(f)
    assert any(reason in r for r in c.unsupported), c.unsupported


def test_integration_defaults_and_single_file(tmp_path: Path) -> None:
    data = _minimal()
    data.update(mode="integration", actions=["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"])
    f = tmp_path / "integ.yaml"
    f.write_text(yaml.safe_dump(data))
    (c,) = load_cases(f)
    assert c.rounds is not None and (c.rounds.until_match, c.rounds.after_match) == (2, 5)
    data["rounds"] = {"until_match": 3, "after_match": 1, "sleep_between_rounds_seconds": 0.5}
    f.write_text(yaml.safe_dump(data))
    c = load_case(f)
    assert c.rounds is not None and (c.rounds.until_match, c.rounds.after_match) == (3, 1)
