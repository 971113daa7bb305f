"""kai-opt's native scenario format: the examples load, and a scenario converts to the objects it describes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import kai_opt
from kai_opt.cli.main import main
from kai_opt.loaders import load_snapshot
from kai_opt.loaders.scenario import expand_pattern, scenario_json_schema
from kai_opt.snapshot import Snapshot
from kai_opt.state import PodStatus, build_state
from kai_opt.summary import summarize

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "models" / "examples").glob("*.yaml"))
SCHEMA_FILE = Path(kai_opt.__file__).parent / "schemas" / "scenario.schema.json"
NOW = "2025-06-01T12:00:00Z"
NOW_TS = datetime(2025, 6, 1, 12, tzinfo=UTC).timestamp()

SCENARIO: dict[str, Any] = {
    "apiVersion": "kai-opt/v1",
    "kind": "Scenario",
    "now": NOW,
    "topologies": [{"name": "dc", "levels": ["zone", "rack"]}],
    "nodePools": [
        {"name": "big", "count": 4,
         "template": {"gpus": 8, "gpuMemoryMiB": 81920, "gpuProduct": "H100", "cpu": 128, "memory": "1Ti",
                      "labels": {"pool": "big"}},
         "topology": {"zone": "z{index/2}", "rack": "{pool}-r{index%2}"}},
        {"name": "small", "count": 2,
         "template": {"gpus": 4, "gpuMemoryMiB": 24576, "cpu": "32", "memory": "128Gi", "pods": 50,
                      "taints": [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}},
        {"name": "cpu", "template": {"cpu": "16", "memory": "64Gi"}},
    ],
    "queues": [
        {"name": "root", "gpu": {"quota": 24, "limit": 40}, "memory": {"quota": 1000},
         "preemptMinRuntime": "5m",
         "children": [{"name": "a", "priority": 150, "gpu": {"quota": 16, "overQuotaWeight": 2}},
                      {"name": "b", "cpu": {"quota": 8000, "limit": -1}}]},
        {"name": "c", "parent": "root", "reclaimMinRuntime": 90},
    ],
    "priorityClasses": [{"name": "urgent", "value": 500}],
    "jobs": [
        {"name": "train", "namespace": "team-a", "queue": "a", "priorityClass": "train", "replicas": 4,
         "pod": {"gpus": 8, "cpu": 64, "memory": "512Gi"}, "running": {"nodes": ["big-1", "auto"]},
         "topology": {"topology": "dc", "requiredLevel": "zone"}},
        {"name": "elastic", "namespace": "team-a", "queue": "a", "replicas": 3, "minMember": 2,
         "pod": {"gpus": 1}},
        {"name": "nb", "namespace": "team-b", "queue": "b", "priorityClass": "build", "replicas": 3,
         "pod": {"gpuFraction": 0.25, "cpu": "500m", "memory": "4Gi"},
         "running": {"nodes": ["auto", "auto"], "startedSecondsAgo": 60}},
        {"name": "infer", "namespace": "team-b", "queue": "b", "priorityClass": "urgent",
         "preemptibility": "preemptible",
         "pod": {"gpuMemoryMiB": 12288, "gpuFractionNumDevices": 2, "nodeSelector": {},
                 "tolerations": [{"key": "dedicated", "operator": "Exists"}]},
         "running": {"nodes": ["small-0"]}},
        {"name": "gated", "queue": "c", "replicas": 2, "gated": True, "pod": {"cpu": 1},
         "running": {"nodes": ["cpu-0"]}},
        {"name": "lws", "queue": "c", "pod": {"cpu": 1},
         "subGroups": [{"name": "all", "minMember": 2},
                       {"name": "leader", "parent": "all", "minMember": 1},
                       {"name": "workers", "parent": "all", "minMember": 2, "replicas": 3,
                        "topology": {"preferredLevel": "rack"}}]},
        {"name": "daemon", "namespace": "kube-system", "queue": "c", "schedulerName": "default-scheduler",
         "pod": {"cpu": 2, "nodeSelector": {"pool": "big"}}, "running": {"nodes": ["auto"]}},
    ],
}


def load(tmp_path: Path, scenario: dict[str, Any] | None = None, **kwargs: Any) -> Snapshot:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario or SCENARIO, sort_keys=False))
    return load_snapshot(path, **kwargs)


def pods_of(snap: Snapshot, job: str) -> list[Any]:
    return sorted((p for p in snap.pods if p.podgroup == job), key=lambda p: p.name)


# -- examples ------------------------------------------------------------------------------------------------------


def test_there_are_three_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "fractions.yaml", "topology.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_shows(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["show", str(path)], ["show", "-o", "json", str(path)]):
        try:
            main(args)
        except SystemExit as exc:
            assert exc.code in (0, None)
        out, err = capsys.readouterr()
        assert err == ""
    data = json.loads(out)
    assert data["warnings"] == []
    assert data["nodes"] > 0 and data["pending_podgroups"]


def test_quickstart_content() -> None:
    snap = load_snapshot(ROOT / "models/examples/quickstart.yaml")
    assert 2 <= len(snap.nodes) <= 4 and all(n.gpus for n in snap.nodes)
    parents = {q.name: q.parent for q in snap.queues}
    assert any(p is None for p in parents.values()) and any(p is not None for p in parents.values())
    running_fraction = [p for p in snap.pods if p.gpu_fraction is not None and p.node_name]
    assert running_fraction
    state = build_state(snap)
    gangs = [pg for pg in summarize(state)["pending_podgroups"] if pg["min_member"] > 1]
    assert len(gangs) >= 2


def test_fractions_content() -> None:
    snap = load_snapshot(ROOT / "models/examples/fractions.yaml")
    assert any(p.gpu_fraction for p in snap.pods) and any(p.gpu_memory_mib for p in snap.pods)
    assert any(p.gpu_fraction_num_devices > 1 for p in snap.pods)
    state = build_state(snap)
    assert ((state.dev_used > 0) & (state.dev_used < 1000)).any()  # a device shared, not yet full
    assert state.warnings == []


def test_topology_content() -> None:
    snap = load_snapshot(ROOT / "models/examples/topology.yaml")
    topo = snap.topologies[0]
    racks = {n.labels[topo.levels[1]] for n in snap.nodes}
    assert len(racks) > 1
    required = [g for g in snap.podgroups if g.topology_constraint and g.topology_constraint.required_level]
    assert required and required[0].topology_constraint.required_level in topo.levels


# -- conversion ------------------------------------------------------------------------------------------------------


def test_nodes(tmp_path: Path) -> None:
    snap = load(tmp_path)
    nodes = {n.name: n for n in snap.nodes}
    assert list(nodes) == ["big-0", "big-1", "big-2", "big-3", "small-0", "small-1", "cpu-0"]
    big = nodes["big-3"]
    assert big.gpus == 8 and big.gpu_memory_mib == 81920 and big.gpu_product == "H100"
    assert big.allocatable["cpu"] == 128_000 and big.allocatable["memory"] == 2**40
    assert big.allocatable["pods"] == 110
    assert big.labels["kubernetes.io/hostname"] == "big-3" and big.labels["pool"] == "big"
    assert (big.labels["zone"], big.labels["rack"]) == ("z1", "big-r1")
    assert [(n.labels["zone"], n.labels["rack"]) for n in snap.nodes[:4]] == [
        ("z0", "big-r0"), ("z0", "big-r1"), ("z1", "big-r0"), ("z1", "big-r1")]
    small = nodes["small-1"]
    assert small.gpus == 4 and small.gpu_memory_mib == 24576 and small.allocatable["pods"] == 50
    assert [(t.key, t.value, t.effect) for t in small.taints] == [("dedicated", "infer", "NoSchedule")]
    assert nodes["cpu-0"].gpus == 0 and "nvidia.com/gpu.memory" not in nodes["cpu-0"].labels
    assert summarize(build_state(snap))["gpus"]["total"] == 4 * 8 + 2 * 4


def test_queue_tree(tmp_path: Path) -> None:
    snap = load(tmp_path)
    queues = {q.name: q for q in snap.queues}
    assert {n: q.parent for n, q in queues.items()} == {"root": None, "a": "root", "b": "root", "c": "root"}
    root, a, b, c = queues["root"], queues["a"], queues["b"], queues["c"]
    assert (root.gpu.quota, root.gpu.limit, root.gpu.over_quota_weight) == (24, 40, 1)
    assert root.memory.quota == 1000 * 1_000_000  # MB in the scenario, bytes inside
    assert root.preempt_min_runtime_s == 300 and c.reclaim_min_runtime_s == 90
    assert a.priority == 150 and b.priority == 100
    assert (a.gpu.quota, a.gpu.over_quota_weight, a.gpu.limit) == (16, 2, -1)
    assert (b.cpu.quota, b.cpu.limit) == (8000, -1) and b.gpu.quota == 0


def test_priority_classes_and_podgroups(tmp_path: Path) -> None:
    snap = load(tmp_path)
    assert [(pc.name, pc.value) for pc in snap.priority_classes] == [("urgent", 500)]
    groups = {g.key: g for g in snap.podgroups}
    assert groups["team-a/train"].min_member == 4 and groups["team-a/train"].priority_class_name == "train"
    assert groups["team-a/train"].topology_constraint.required_level == "zone"
    assert groups["team-a/train"].topology_constraint.topology == "dc"
    assert groups["team-a/elastic"].min_member == 2
    assert groups["team-b/infer"].preemptibility == "preemptible"
    lws = groups["default/lws"]
    assert lws.min_member == 3  # leaf sub-groups: leader 1 + workers 2
    assert [(s.name, s.parent, s.min_member) for s in lws.sub_groups] == [
        ("all", None, 2), ("leader", "all", 1), ("workers", "all", 2)]
    assert lws.sub_groups[2].topology_constraint.preferred_level == "rack"
    state = build_state(snap)
    prio = dict(zip(state.pg_keys, state.pg_priority.tolist(), strict=True))
    assert prio["team-a/train"] == 50 and prio["team-b/nb"] == 100 and prio["team-b/infer"] == 500
    created = [groups[k].meta.creation_timestamp for k in ("team-a/elastic", "default/lws")]
    assert created[0] < created[1] < NOW_TS  # file order is creation order


def test_pods_per_job(tmp_path: Path) -> None:
    snap = load(tmp_path)
    assert [p.name for p in pods_of(snap, "train")] == ["train-0", "train-1", "train-2", "train-3"]
    assert len(pods_of(snap, "elastic")) == 3 and len(pods_of(snap, "nb")) == 3
    train = pods_of(snap, "train")[0]
    assert train.namespace == "team-a" and train.queue == "a" and train.scheduler_name == "kai-opt"
    assert train.whole_gpus == 8 and train.requests["cpu"] == 64_000 and train.requests["memory"] == 512 * 2**30
    assert train.priority_class_name == "train"
    nb = pods_of(snap, "nb")[0]
    assert nb.gpu_fraction == 0.25 and nb.requests["cpu"] == 500 and nb.whole_gpus == 0
    infer = pods_of(snap, "infer")[0]
    assert infer.gpu_memory_mib == 12288 and infer.gpu_fraction_num_devices == 2
    assert [t.key for t in infer.tolerations] == ["dedicated"]
    lws = pods_of(snap, "lws")
    assert [(p.name, p.subgroup) for p in lws] == [
        ("lws-leader-0", "leader"), ("lws-workers-0", "workers"), ("lws-workers-1", "workers"),
        ("lws-workers-2", "workers")]
    assert len(snap.pods) == 4 + 3 + 3 + 1 + 2 + 4 + 1


def test_running_placement(tmp_path: Path) -> None:
    snap = load(tmp_path)
    assert snap.now == NOW_TS
    train = pods_of(snap, "train")
    assert [p.node_name for p in train] == ["big-1", "big-0", None, None]  # auto: first node with room
    assert [p.phase.value for p in train] == ["Running", "Running", "Pending", "Pending"]
    assert train[0].start_time == NOW_TS - 3600 and train[2].start_time is None
    assert train[0].gpu_devices == tuple(range(8))
    nb = pods_of(snap, "nb")
    # the 8-GPU pods fill big-0 and big-1; the quarter GPUs pack onto one device of big-2
    assert [p.node_name for p in nb[:2]] == ["big-2", "big-2"] and nb[0].gpu_devices == nb[1].gpu_devices == (0,)
    assert nb[0].start_time == NOW_TS - 60
    infer = pods_of(snap, "infer")[0]
    assert infer.node_name == "small-0" and infer.gpu_devices == (0, 1)
    daemon = pods_of(snap, "daemon")[0]
    assert daemon.node_name == "big-0" and daemon.scheduler_name == "default-scheduler"
    state = build_state(snap)
    node = {n: i for i, n in enumerate(state.node_names)}
    devs = state.dev_used[state.dev_start[node["big-2"]]:state.dev_start[node["big-2"] + 1]]
    assert devs.tolist() == [500, 0, 0, 0, 0, 0, 0, 0]
    small = state.dev_used[state.dev_start[node["small-0"]]:state.dev_start[node["small-0"] + 1]]
    assert small.tolist() == [500, 500, 0, 0]  # 12 GiB of a 24 GiB device on each of 2 devices
    assert state.warnings == []


def test_auto_placement_honours_taints_and_selectors(tmp_path: Path) -> None:
    scenario = {**SCENARIO, "jobs": [
        {"name": "a", "queue": "c", "pod": {"gpus": 4, "nodeSelector": {"pool": "big"}},
         "running": {"nodes": ["auto"]}},
        {"name": "b", "queue": "c", "pod": {"gpus": 4, "tolerations": [{"key": "dedicated", "value": "infer"}]},
         "replicas": 4, "running": {"nodes": ["auto"] * 4}},
        {"name": "c", "queue": "c", "pod": {"gpus": 4}, "running": {"nodes": ["auto"]}},
    ]}
    snap = load(tmp_path, scenario)
    assert pods_of(snap, "a")[0].node_name == "big-0"
    assert [p.node_name for p in pods_of(snap, "b")] == ["big-0", "big-1", "big-1", "big-2"]
    assert pods_of(snap, "c")[0].node_name == "big-2"  # small-* are tainted


def test_gated_pods(tmp_path: Path) -> None:
    snap = load(tmp_path)
    gated = pods_of(snap, "gated")
    assert gated[0].node_name == "cpu-0" and gated[0].scheduling_gates == ()
    assert gated[1].node_name is None and gated[1].scheduling_gates
    state = build_state(snap)
    status = {p.key: int(s) for p, s in zip(state.pods, state.pod_status, strict=True)}
    assert status["default/gated-1"] == PodStatus.GATED and status["default/gated-0"] == PodStatus.BOUND
    assert status["default/lws-leader-0"] == PodStatus.PENDING


def test_now_and_scheduler_name(tmp_path: Path) -> None:
    assert load(tmp_path, now=1000.0).now == 1000.0
    scenario = {k: v for k, v in SCENARIO.items() if k != "now"}
    scenario["schedulerName"] = "kai-scheduler"
    snap = load(tmp_path, scenario)
    assert snap.now is None and snap.scheduler_names == ("kai-scheduler",)
    assert pods_of(snap, "train")[0].scheduler_name == "kai-scheduler"
    assert load(tmp_path, scenario, scheduler_names=("x",)).scheduler_names == ("x",)


def test_minimal_scenario(tmp_path: Path) -> None:
    snap = load(tmp_path, {"apiVersion": "kai-opt/v1", "kind": "Scenario"})
    assert snap.counts() == {"nodes": 0, "pods": 0, "podgroups": 0, "queues": 0, "priorityclasses": 0,
                             "topologies": 0}


def test_expand_pattern() -> None:
    assert [expand_pattern("rack-{index/4}", i, "p") for i in (0, 3, 4, 9)] == ["rack-0", "rack-0", "rack-1",
                                                                                 "rack-2"]
    assert expand_pattern("{pool}-{index}-{index%3}", 7, "dgx") == "dgx-7-1"
    assert expand_pattern("fixed", 5, "p") == "fixed"


# -- schema ----------------------------------------------------------------------------------------------------------


def test_committed_schema_matches_models() -> None:
    """Regenerate with: kai-opt schema --generate > kai_opt/schemas/scenario.schema.json"""
    assert json.loads(SCHEMA_FILE.read_text()) == scenario_json_schema()


def test_schema_command_prints_the_committed_schema(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["schema"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    out, err = capsys.readouterr()
    assert err == "" and out == SCHEMA_FILE.read_text()


def test_schema_describes_the_format() -> None:
    schema = scenario_json_schema()
    assert set(schema["properties"]) == {"apiVersion", "kind", "now", "schedulerName", "topologies", "nodePools",
                                         "queues", "priorityClasses", "deviceClasses", "jobs"}
    assert schema["additionalProperties"] is False
    pod = schema["$defs"]["PodSpec"]["properties"]
    assert {"gpus", "gpuFraction", "gpuMemoryMiB", "gpuFractionNumDevices", "cpu", "memory"} <= set(pod)
    assert pod["gpuFraction"]["description"]
    assert "claims" in pod and "draDevices" in schema["$defs"]["NodePoolSpec"]["properties"]  # DRA (issue 21)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_match_the_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(yaml.safe_load(path.read_text()))
