"""User errors reach the CLI as one line on stderr, exit code 2, naming the object and the field; problems that
affect one workload only are warnings (exit 0, the workload pending with its reason)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import run_cli

# -- helpers ---------------------------------------------------------------------------------------------------------


run = run_cli


def assert_error(capsys: pytest.CaptureFixture[str], path: Path, *needles: str) -> str:
    """`kai-opt show path` fails with exit 2 and exactly one stderr line containing every needle."""
    code, out, err = run(capsys, "show", str(path))
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert err.startswith("kai-opt: error: ")
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    return err


def write_yaml(tmp_path: Path, objects: list[dict[str, Any]], name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return path


def write_scenario(tmp_path: Path, body: dict[str, Any], name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"apiVersion": "kai-opt/v1", "kind": "Scenario", **body}, sort_keys=False))
    return path


def k_node(name: str, cpu: Any = "64", gpus: int = 8) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}}}


def k_queue(name: str, parent: str | None = None, **resources: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": resources or {"gpu": {"quota": 8}}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def k_podgroup(name: str, queue: str = "q", sub_groups: list[dict[str, Any]] | None = None,
               namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": 1, "queue": queue}
    if sub_groups:
        spec["subGroups"] = sub_groups
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def k_pod(name: str, podgroup: str | None = None, namespace: str = "default", cpu: Any = "1", gpus: int = 0,
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    ann = dict(annotations or {})
    if podgroup:
        ann["pod-group-name"] = podgroup
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": ann},
            "spec": {"schedulerName": "kai-opt", "containers": [{"name": "c", "resources": resources}]}}


POOL = {"name": "n", "count": 2, "template": {"gpus": 8, "cpu": 64, "memory": "512Gi"}}


def scenario_job(**fields: Any) -> dict[str, Any]:
    return {"name": "j", "queue": "q", **fields}


# -- unparseable files -----------------------------------------------------------------------------------------------


def test_unparseable_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: v1\nkind: Node\nmetadata:\n  name: [n1\n  labels: {}\n")
    assert_error(capsys, path, f"{path}:", "invalid YAML")


def test_unparseable_yaml_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: kai-opt/v1\nkind: Scenario\njobs:\n  - name: j\n   queue: q\n")
    assert_error(capsys, path, f"{path}:", "invalid YAML")


def test_unparseable_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"apiVersion": "v1", "kind": "List",\n "items": [\n  {"kind": "Node",}\n ]}\n')
    assert_error(capsys, path, f"{path}:3", "invalid JSON")


# -- invalid quantities ----------------------------------------------------------------------------------------------


def test_invalid_quantity_on_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_node("n1"), k_node("n2", cpu="12x")])
    assert_error(capsys, path, str(path), "Node n2", "status.allocatable.cpu", "12x")


def test_invalid_quantity_on_node_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [k_node("n1", cpu="12x")]}))
    assert_error(capsys, path, str(path), "Node n1", "status.allocatable.cpu", "12x")


def test_invalid_quantity_on_pod_container(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_node("n1"), k_queue("q"), k_pod("p", cpu="12x")])
    assert_error(capsys, path, str(path), "Pod default/p", "spec.containers[0].resources.requests.cpu", "12x")


def test_invalid_quantity_scenario_node_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = {"name": "dgx", "template": {"gpus": 8, "cpu": "12x", "memory": "1Ti"}}
    path = write_scenario(tmp_path, {"nodePools": [pool]})
    assert_error(capsys, path, f"{path}:", "Scenario nodePool dgx", "field template.cpu", "12x")


def test_invalid_quantity_scenario_job_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_scenario(tmp_path, {"nodePools": [POOL], "jobs": [scenario_job(pod={"cpu": "12x"})]})
    assert_error(capsys, path, f"{path}:", "Scenario job default/j", "field pod.cpu", "12x")


# -- queue quota and limit -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("resource", "key"), [("gpu", "quota"), ("cpu", "limit"), ("memory", "quota")])
def test_negative_queue_value(tmp_path: Path, capsys: pytest.CaptureFixture[str], resource: str, key: str) -> None:
    path = write_yaml(tmp_path, [k_queue("ok", gpu={"quota": -1, "limit": -1}),
                                 k_queue("q", **{resource: {key: -2}})])
    assert_error(capsys, path, str(path), "Queue q", f"spec.resources.{resource}.{key}", "-2")


@pytest.mark.parametrize(("resource", "key"), [("gpu", "quota"), ("memory", "limit")])
def test_negative_queue_value_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str], resource: str,
                                       key: str) -> None:
    queues = [{"name": "ok", "gpu": {"quota": -1, "limit": -1}},
              {"name": "top", "children": [{"name": "q", resource: {key: -0.5}}]}]
    path = write_scenario(tmp_path, {"queues": queues})
    assert_error(capsys, path, f"{path}:", "Scenario queue q", f"field {resource}.{key}", "-0.5")


def test_minus_one_is_unlimited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_queue("q", gpu={"quota": -1, "limit": -1}, cpu={"quota": 0, "limit": -1})])
    code, _, err = run(capsys, "show", str(path))
    assert code == 0 and err == ""


# -- GPU fractions ---------------------------------------------------------------------------------------------------

BAD_FRACTIONS = ["0", "1", "1.5", "abc"]


@pytest.mark.parametrize("fraction", BAD_FRACTIONS)
def test_gpu_fraction_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], fraction: str) -> None:
    path = write_yaml(tmp_path, [k_node("n1"), k_queue("q"), k_pod("p", annotations={"gpu-fraction": fraction})])
    assert_error(capsys, path, str(path), "Pod default/p", "metadata.annotations.gpu-fraction", fraction)


@pytest.mark.parametrize("fraction", [0, 1, 1.5, "abc"])
def test_gpu_fraction_out_of_range_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            fraction: Any) -> None:
    path = write_scenario(tmp_path, {"jobs": [scenario_job(pod={"gpuFraction": fraction})]})
    assert_error(capsys, path, f"{path}:", "Scenario job default/j", "field pod.gpuFraction", str(fraction))


def test_gpu_fraction_with_whole_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = k_pod("p", gpus=1, annotations={"gpu-fraction": "0.5"})
    path = write_yaml(tmp_path, [k_node("n1"), k_queue("q"), pod])
    assert_error(capsys, path, str(path), "Pod default/p", "metadata.annotations.gpu-fraction", "whole-GPU")


def test_gpu_fraction_with_whole_gpus_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_scenario(tmp_path, {"jobs": [scenario_job(pod={"gpus": 1, "gpuFraction": 0.5})]})
    assert_error(capsys, path, f"{path}:", "Scenario job default/j", "field pod.gpuFraction", "gpus")


# -- the queue tree --------------------------------------------------------------------------------------------------


def test_queue_parent_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_queue("root"), k_queue("child", parent="nope")])
    assert_error(capsys, path, str(path), "Queue child", "spec.parentQueue", "nope")


def test_queue_parent_missing_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_scenario(tmp_path, {"queues": [{"name": "root"}, {"name": "child", "parent": "nope"}]})
    assert_error(capsys, path, f"{path}:", "Scenario queue child", "field parent", "nope")


@pytest.mark.parametrize("names", [["a", "b"], ["a", "b", "c"]])
def test_queue_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[str]) -> None:
    queues = [k_queue(n, parent=names[(i + 1) % len(names)]) for i, n in enumerate(names)]
    path = write_yaml(tmp_path, [k_queue("root"), *queues])
    assert_error(capsys, path, str(path), "Queue a", "spec.parentQueue", "cycle")


def test_queue_cycle_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queues = [{"name": "a", "parent": "c"}, {"name": "b", "parent": "a"}, {"name": "c", "parent": "b"}]
    path = write_scenario(tmp_path, {"queues": queues})
    assert_error(capsys, path, f"{path}:", "Scenario queue a", "field parent", "cycle")


def test_nested_queue_with_other_parent_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queues = [{"name": "a"}, {"name": "b", "children": [{"name": "c", "parent": "a"}]}]
    path = write_scenario(tmp_path, {"queues": queues})
    assert_error(capsys, path, f"{path}:", "Scenario queue c", "field parent")


# -- duplicate names -------------------------------------------------------------------------------------------------


def test_duplicate_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_node("n1"), k_node("n2"), k_node("n1")])
    assert_error(capsys, path, str(path), "Node n1", "metadata.name", "duplicate")


def test_duplicate_pods_same_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_node("n1"), k_queue("q"), k_pod("p", namespace="a"), k_pod("p", namespace="a")])
    assert_error(capsys, path, str(path), "Pod a/p", "metadata.name", "duplicate")


def test_same_pod_name_in_two_namespaces_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_node("n1"), k_queue("q"), k_pod("p", namespace="a"), k_pod("p", namespace="b")])
    code, _, err = run(capsys, "show", str(path))
    assert code == 0 and err == ""


def test_duplicate_queues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_yaml(tmp_path, [k_queue("q"), k_queue("q")])
    assert_error(capsys, path, str(path), "Queue q", "metadata.name", "duplicate")


def test_duplicate_objects_across_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_yaml(tmp_path, [k_node("n1")], "a.yaml")
    write_yaml(tmp_path, [k_node("n1")], "b.yaml")
    assert_error(capsys, tmp_path, "Node n1", "metadata.name", "duplicate")


def test_duplicate_node_pools_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_scenario(tmp_path, {"nodePools": [POOL, POOL]})
    assert_error(capsys, path, f"{path}:", "Scenario nodePool n", "field name", "duplicate")


def test_duplicate_jobs_same_namespace_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [scenario_job(namespace="a"), scenario_job(namespace="b"), scenario_job(namespace="a")]
    path = write_scenario(tmp_path, {"queues": [{"name": "q"}], "jobs": jobs})
    assert_error(capsys, path, f"{path}:", "Scenario job a/j", "field name", "duplicate")


def test_colliding_pod_names_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [scenario_job(name="a", subGroups=[{"name": "b"}]), scenario_job(name="a-b")]
    path = write_scenario(tmp_path, {"queues": [{"name": "q"}], "jobs": jobs})
    assert_error(capsys, path, f"{path}:", "Scenario job default/a-b", "field name", "a-b-0")


def test_duplicate_queues_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queues = [{"name": "root", "children": [{"name": "q"}]}, {"name": "q"}]
    path = write_scenario(tmp_path, {"queues": queues})
    assert_error(capsys, path, f"{path}:", "Scenario queue q", "field name", "duplicate")


# -- PodGroup sub-groups ---------------------------------------------------------------------------------------------


def test_subgroup_parent_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pg = k_podgroup("pg", sub_groups=[{"name": "a"}, {"name": "b", "parent": "nope"}])
    path = write_yaml(tmp_path, [k_queue("q"), pg])
    assert_error(capsys, path, str(path), "PodGroup default/pg", "spec.subGroups", "nope")


def test_subgroup_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pg = k_podgroup("pg", sub_groups=[{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}])
    path = write_yaml(tmp_path, [k_queue("q"), pg])
    assert_error(capsys, path, str(path), "PodGroup default/pg", "spec.subGroups", "cycle")


def test_subgroup_parent_missing_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = scenario_job(subGroups=[{"name": "a"}, {"name": "b", "parent": "nope"}])
    path = write_scenario(tmp_path, {"jobs": [job]})
    assert_error(capsys, path, f"{path}:", "Scenario job default/j", "field subGroups[1].parent", "nope")


def test_subgroup_cycle_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = scenario_job(subGroups=[{"name": "a", "parent": "c"}, {"name": "b", "parent": "a"},
                                  {"name": "c", "parent": "b"}])
    path = write_scenario(tmp_path, {"jobs": [job]})
    assert_error(capsys, path, f"{path}:", "Scenario job default/j", "field subGroups[0].parent", "cycle")


# -- other scenario mistakes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "needles"), [
    ({"nodepools": []}, ["Scenario", "field nodepools", "unknown field", "nodePools"]),
    ({"jobs": [{"name": "j"}]}, ["Scenario job default/j", "field queue", "required"]),
    ({"jobs": [scenario_job(priorityClass="trian")]}, ["Scenario job default/j", "field priorityClass", "trian"]),
    ({"jobs": [scenario_job(pod={"gpu": 1})]}, ["Scenario job default/j", "field pod.gpu", "gpus"]),
    ({"nodePools": [POOL], "jobs": [scenario_job(running={"nodes": ["x-0"]})]},
     ["Scenario job default/j", "field running.nodes[0]", "x-0"]),
    ({"nodePools": [POOL], "jobs": [scenario_job(replicas=2, running={"nodes": ["n-0", "auto", "auto"]})]},
     ["Scenario job default/j", "field running.nodes", "3 nodes for 2 replicas"]),
    ({"nodePools": [POOL], "jobs": [scenario_job(replicas=3, pod={"gpus": 8}, running={"nodes": ["auto"] * 3})]},
     ["Scenario job default/j", "field running.nodes[2]", "no node has room"]),
    ({"nodePools": [{**POOL, "topology": {"rack": "r-{index//2}"}}]},
     ["Scenario nodePool n", "field topology.rack", "placeholder"]),
    ({"queues": [{"name": "q", "reclaimMinRuntime": "5 minutes"}]},
     ["Scenario queue q", "field reclaimMinRuntime", "duration"]),
    ({"now": "yesterday"}, ["Scenario", "field now"]),
    ({"jobs": [scenario_job(name="Train_1")]}, ["Scenario job default/Train_1", "field name", "DNS"]),
])
def test_scenario_mistakes(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: dict[str, Any],
                           needles: list[str]) -> None:
    path = write_scenario(tmp_path, body)
    assert_error(capsys, path, f"{path}:", *needles)


def test_scenario_error_points_at_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("apiVersion: kai-opt/v1\nkind: Scenario\njobs:\n  - name: ok\n    queue: q\n"
                    "  - name: bad\n    queue: q\n    pod:\n      cpu: 12x\n")
    assert_error(capsys, path, f"{path}:9: Scenario job default/bad: field pod.cpu:")


# -- warnings, not errors --------------------------------------------------------------------------------------------


def _pending(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    code, out, err = run(capsys, "show", str(path))
    assert code == 0 and err == "", (code, err)
    assert "warning" in out
    code, out, err = run(capsys, "show", "-o", "json", str(path))
    assert code == 0 and err == "", (code, err)
    data = json.loads(out)
    return {pg["podgroup"]: pg for pg in data["pending_podgroups"]}, data


def test_unknown_queue_and_podgroup_are_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = [k_node("n1"), k_queue("q"),
               k_podgroup("ok"), k_pod("ok-0", podgroup="ok"),
               k_podgroup("lost", queue="nope"), k_pod("lost-0", podgroup="lost"),
               k_pod("orphan-0", podgroup="ghost")]
    pending, data = _pending(capsys, write_yaml(tmp_path, objects))
    assert pending["default/lost"]["problem"] == "QueueDoesNotExist"
    assert pending["default/ghost"]["problem"] == "PodGroupDoesNotExist"
    assert pending["default/ok"]["problem"] is None and pending["default/ok"]["queue"] == "q"
    assert any("QueueDoesNotExist" in w for w in data["warnings"])
    assert any("PodGroupDoesNotExist" in w for w in data["warnings"])
    assert data["pods"]["pending"] == 3


def test_unknown_queue_is_a_warning_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [scenario_job(name="ok", pod={"gpus": 1}), scenario_job(name="lost", queue="nope", pod={"gpus": 1}),
            scenario_job(name="busy", pod={"gpus": 1}, running={"nodes": ["auto"]})]
    path = write_scenario(tmp_path, {"nodePools": [POOL], "queues": [{"name": "q"}], "jobs": jobs})
    pending, data = _pending(capsys, path)
    assert pending["default/lost"]["problem"] == "QueueDoesNotExist"
    assert pending["default/ok"]["problem"] is None
    assert data["pods"] == {"running": 1, "releasing": 0, "pending": 2, "gated": 0}
