"""Hostile inputs, one regression test per input class of issue 19: every one is refused with exactly one line on
stderr (`kai-opt: error: ...`, exit code 2) naming the file, object and field, never a traceback; the few that are
valid (UTF-8 with a BOM, an old apiVersion beside usable objects) load."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_validation_cli import k_node, k_pod, k_podgroup, k_queue, run, write_scenario, write_yaml

from kai_opt.limits import DEFAULTS


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run(capsys, *args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert err.startswith("kai-opt: error: ") and err.count("\n") == 1 and err.endswith("\n"), repr(err)
    return err


def refused(capsys: pytest.CaptureFixture[str], path: Path, *needles: str, command: str = "show") -> str:
    err = one_line_error(capsys, command, str(path))
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    return err


def cluster(**changes: Any) -> list[dict[str, Any]]:
    """A small valid cluster; `changes` replace objects by role (node, queue, podgroup, pod, extra)."""
    objs = {"node": k_node("n1"), "queue": k_queue("q"), "podgroup": k_podgroup("g"), "pod": k_pod("p", "g")}
    objs.update({k: v for k, v in changes.items() if k != "extra"})
    return [o for o in objs.values() if o is not None] + list(changes.get("extra", []))


def with_field(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of obj with the path set to value: dotted, or split by `|` when a key has dots; list indexes
    as numbers."""
    out = json.loads(json.dumps(obj))
    cur: Any = out
    parts = [int(p) if p.isdigit() else p for p in path.split("|" if "|" in path else ".")]
    for p in parts[:-1]:
        if isinstance(p, str) and p not in cur:
            cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value
    return out


# -- numbers out of range (kubectl objects) ------------------------------------------------------------------------
NODE, POD, QUEUE, PG = k_node("n1"), k_pod("p", "g"), k_queue("q"), k_podgroup("g")
BIG = 2**70
NUMBER_CASES = [
    ("node", with_field(NODE, "status.allocatable.cpu", "99999999999999999999999"), "status.allocatable.cpu"),
    ("node", with_field(NODE, "status.allocatable.memory", "1e99999"), "status.allocatable.memory"),
    ("node", with_field(NODE, "status|allocatable|nvidia.com/gpu", "1e15"), "nvidia.com/gpu"),
    ("node", with_field(NODE, "metadata.labels", {"nvidia.com/gpu.memory": "-5"}), "nvidia.com/gpu.memory"),
    ("pod", with_field(POD, "spec.containers.0.resources.requests.cpu", "1e30"), "requests.cpu"),
    ("pod", with_field(POD, "spec.priority", BIG), "spec.priority"),
    ("pod", with_field(POD, "spec.priority", float("inf")), "Pod default/p"),
    ("pod", with_field(POD, "metadata.annotations.gpu-memory", "99999999999999999"), "gpu-memory"),
    ("pod", with_field(POD, "metadata.annotations.gpu-fraction", "nan"), "gpu-fraction"),
    ("pod", with_field(POD, "metadata.annotations.gpu-fraction-num-devices", "100000"), "num-devices"),
    ("pod", with_field(POD, "metadata|annotations|kai-opt.io/gpu-devices", "0,99999999"), "gpu-devices"),
    ("pod", with_field(POD, "metadata.creationTimestamp", 1e300), "metadata.creationTimestamp"),
    ("pod", with_field(POD, "status.startTime", float("nan")), "status.startTime"),
    ("queue", with_field(QUEUE, "spec.resources.gpu.quota", float("nan")), "spec.resources.gpu.quota"),
    ("queue", with_field(QUEUE, "spec.resources.cpu.limit", float("inf")), "spec.resources.cpu.limit"),
    ("queue", with_field(QUEUE, "spec.resources.memory.quota", 1e30), "spec.resources.memory.quota"),
    ("queue", with_field(QUEUE, "spec.resources.gpu.overQuotaWeight", "-inf"), "overQuotaWeight"),
    ("queue", with_field(QUEUE, "spec.resources.gpu.quota", BIG), "spec.resources.gpu.quota"),
    ("queue", with_field(QUEUE, "spec.priority", BIG), "spec.priority"),
    ("queue", with_field(QUEUE, "spec.reclaimMinRuntime", "9" * 400 + "h"), "spec.reclaimMinRuntime"),
    ("queue", with_field(QUEUE, "spec.preemptMinRuntime", float("inf")), "spec.preemptMinRuntime"),
    ("podgroup", with_field(PG, "spec.minMember", BIG), "spec.minMember"),
]


@pytest.mark.parametrize(("role", "obj", "field"), NUMBER_CASES, ids=[f"{r}-{f}" for r, _, f in NUMBER_CASES])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_numbers_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], role: str, obj: dict[str, Any],
                              field: str, fmt: str) -> None:
    objs = cluster(**{role: obj})
    if fmt == "yaml":
        path = write_yaml(tmp_path, objs)
    else:  # JSON as Python writes it: NaN and Infinity are literals json.loads accepts
        path = tmp_path / "cluster.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    kind = {"node": "Node n1", "pod": "Pod default/p", "queue": "Queue q", "podgroup": "PodGroup default/g"}[role]
    refused(capsys, path, str(path), kind, field)


def test_priority_class_beyond_int32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "x"}, "value": 2**31}
    refused(capsys, write_yaml(tmp_path, cluster(extra=[pc])), "PriorityClass x", "field value", "2,147,483,647")


@pytest.mark.parametrize(("text", "needle"), [("n: " + "9" * 5000 + "\n", "invalid YAML"),
                                              ('{"n": ' + "9" * 5000 + "}", "invalid JSON")])
def test_numbers_with_thousands_of_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                          needle: str) -> None:
    path = tmp_path / "digits.yaml"
    path.write_text(text)
    refused(capsys, path, str(path), needle)


# -- numbers out of range (scenario) --------------------------------------------------------------------------------
POOL = {"name": "n", "count": 2, "template": {"gpus": 8, "cpu": 64, "memory": "512Gi"}}
SCENARIO_CASES = [
    ({"queues": [{"name": "q", "gpu": {"quota": float("nan")}}]}, "Scenario queue q", "gpu.quota"),
    ({"queues": [{"name": "q", "cpu": {"limit": float("inf")}}]}, "Scenario queue q", "cpu.limit"),
    ({"queues": [{"name": "q", "memory": {"quota": 1e30}}]}, "Queue q", "spec.resources.memory.quota"),
    ({"queues": [{"name": "q", "priority": BIG}]}, "Scenario queue q", "priority"),
    ({"queues": [{"name": "q", "reclaimMinRuntime": float("inf")}]}, "Scenario queue q", "reclaimMinRuntime"),
    ({"priorityClasses": [{"name": "x", "value": -BIG}]}, "Scenario priorityClass x", "value"),
    ({"nodePools": [{**POOL, "template": {**POOL["template"], "cpu": "1e20"}}]}, "Scenario nodePool n",
     "template.cpu"),
    ({"nodePools": [{**POOL, "template": {**POOL["template"], "gpus": 5000}}]}, "Scenario nodePool n",
     "template.gpus"),
    ({"nodePools": [POOL], "queues": [{"name": "q"}],
      "jobs": [{"name": "j", "queue": "q", "pod": {"gpuFraction": float("nan")}}]}, "Scenario job default/j",
     "pod.gpuFraction"),
    ({"nodePools": [POOL], "queues": [{"name": "q"}],
      "jobs": [{"name": "j", "queue": "q", "running": {"nodes": ["auto"], "startedSecondsAgo": 10**15}}]},
     "Scenario job default/j", "running.startedSecondsAgo"),
    ({"nodePools": [POOL], "queues": [{"name": "q"}], "jobs": [{"name": "j", "queue": "q", "minMember": BIG}]},
     "Scenario job default/j", "minMember"),
]


@pytest.mark.parametrize(("body", "obj", "field"), SCENARIO_CASES, ids=[f for _, _, f in SCENARIO_CASES])
def test_scenario_numbers_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: dict[str, Any],
                                       obj: str, field: str) -> None:
    path = write_scenario(tmp_path, body)
    refused(capsys, path, f"{path}:", obj, field)


# -- numbers out of range (config) ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "field"), [
    ("solver:\n  time_budget_s: .nan\n", "solver.time_budget_s"),
    ("solver:\n  seed: 99999999999999\n", "solver.seed"),
    ("stale_gang_grace_s: .inf\n", "stale_gang_grace_s"),
    ("max_victim_chunks: 99999999999999999999\n", "max_victim_chunks"),
    ("reclaim_saturation_multiplier: 1e300\n", "reclaim_saturation_multiplier"),
])
def test_config_numbers_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                     field: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    err = one_line_error(capsys, "config", "--check", str(path))
    assert str(path) in err and "Config" in err and f"field {field}" in err


# -- structure: nesting, document count, size -----------------------------------------------------------------------
@pytest.mark.parametrize(("name", "text", "needle"), [
    ("flow.yaml", "a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 100 levels"),
    ("block.yaml", "".join(" " * i + "a:\n" for i in range(300)) + " " * 300 + "b: 1\n", "nested deeper"),
    ("dashes.yaml", "- " * 5000 + "x\n", "nested deeper"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("lists.json", "[[[[[[[[" + json.dumps(k_node("n1")) + "]]]]]]]]", "lists nested"),
])
def test_nesting_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str,
                            needle: str) -> None:
    path = tmp_path / name
    path.write_text(text)  # the C YAML parser crashed the process on 100,000 levels before the bound
    refused(capsys, path, str(path), needle)


def test_deep_config_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("solver: " + "[" * 50_000 + "]" * 50_000 + "\n")
    err = one_line_error(capsys, "config", "--check", str(path))
    assert "nested deeper" in err


def laughs(key: str, leaf: str, width: int = 1000, levels: int = 3) -> str:
    """A "billion laughs": each level is a list of `width` aliases of the one below."""
    lines = [f"l0: &l0 [{', '.join([leaf] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\n{key}: *l{levels - 1}\n"


@pytest.mark.parametrize(("head", "key", "leaf", "command"), [
    ("kind: List\n", "items", "{kind: ConfigMap, metadata: {name: c}}", "show"),  # hung, 780 MB after 20 s
    ("apiVersion: kai-opt/v1\nkind: Scenario\n", "jobs", "{name: j, queue: q}", "show"),
    ("", "scheduler_names", "kai-opt", "config"),
])
def test_yaml_aliases_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str, key: str,
                                  leaf: str, command: str) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(head + laughs(key, leaf))
    args = ("config", "--check", str(path)) if command == "config" else (command, str(path))
    err = one_line_error(capsys, *args)
    assert str(path) in err and "YAML aliases expand the document" in err and "KAI_OPT_MAX_ALIAS_RATIO" in err


def test_a_few_yaml_aliases_are_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = "".join(f"""
- apiVersion: v1
  kind: Pod
  metadata: {{name: p{i}, annotations: {{pod-group-name: g}}}}
  spec:
    schedulerName: kai-opt
    containers:
    - name: c
      resources: {'&res {requests: {cpu: "1"}}' if i == 0 else '*res'}""" for i in range(3))
    path = tmp_path / "aliases.yaml"
    path.write_text(yaml.safe_dump_all(cluster(pod=None), sort_keys=False) + "---\nkind: List\nitems:" + pods + "\n")
    code, out, err = run(capsys, "show", "-o", "json", str(path))
    assert code == 0, err
    assert json.loads(out)["pods"]["pending"] == 3


def test_document_count_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_OPT_MAX_DOCUMENTS", "3")
    path = write_yaml(tmp_path, cluster())  # 4 documents
    refused(capsys, path, str(path), "more than 3 YAML documents", "KAI_OPT_MAX_DOCUMENTS")


def test_label_value_must_be_a_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = with_field(NODE, "metadata.labels", {"zone": {"nested": ["a"]}})
    refused(capsys, write_yaml(tmp_path, cluster(node=node)), "Node n1", "metadata.labels.zone", "expected a string")


@pytest.mark.parametrize("config", [False, True])
def test_size_is_bounded_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch, config: bool) -> None:
    path = write_yaml(tmp_path, cluster())
    monkeypatch.setenv("KAI_OPT_MAX_INPUT_BYTES", "100")
    args = ("config", "--check", str(path)) if config else ("show", str(path))
    err = one_line_error(capsys, *args)
    assert "above the limit of 100" in err and "KAI_OPT_MAX_INPUT_BYTES" in err


def test_directory_size_is_bounded_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for i, obj in enumerate(cluster()):
        write_yaml(tmp_path, [obj], name=f"{i}.yaml")
    sizes = [f.stat().st_size for f in tmp_path.iterdir()]
    monkeypatch.setenv("KAI_OPT_MAX_INPUT_BYTES", str(sum(sizes) - 1))  # every file is within the limit
    refused(capsys, tmp_path, str(tmp_path), "directory holds", f"above the limit of {sum(sizes) - 1:,}")


def test_a_bad_ceiling_setting_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_OPT_MAX_NODES", "lots")
    refused(capsys, write_yaml(tmp_path, cluster()), "KAI_OPT_MAX_NODES", "positive whole number")


# -- encodings --------------------------------------------------------------------------------------------------------
TEXT = yaml.safe_dump_all(cluster(), sort_keys=False)
ENCODINGS = [
    ("utf-16", TEXT.encode("utf-16"), "UTF-16"),
    ("utf-16-le", TEXT.encode("utf-16-le"), "UTF-8 only"),
    ("utf-16-be", TEXT.encode("utf-16-be"), "UTF-8 only"),
    ("utf-32", TEXT.encode("utf-32"), "UTF-32"),
    ("latin-1", TEXT.replace("n1", "n\u00e9").encode("latin-1"), "not valid UTF-8 at byte"),
]


@pytest.mark.parametrize(("name", "data", "needle"), ENCODINGS, ids=[e[0] for e in ENCODINGS])
@pytest.mark.parametrize("config", [False, True])
def test_only_utf8_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes,
                           needle: str, config: bool) -> None:
    path = tmp_path / "input.yaml"
    path.write_bytes(data if not config else ("solver:\n  seed: 1\nactions: {}\n# caf\u00e9\n".encode(name)))
    args = ("config", "--check", str(path)) if config else ("show", str(path))
    err = one_line_error(capsys, *args)
    assert str(path) in err and ("UTF-8" in err or "UTF-16" in err or "UTF-32" in err), err
    if not config:
        assert needle in err


@pytest.mark.parametrize("config", [False, True])
def test_utf8_with_bom_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: bool) -> None:
    path = tmp_path / "input.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + (b"solver:\n  seed: 1\n" if config else TEXT.encode()))
    code, out, err = run(capsys, *(("config", "--check", str(path)) if config else ("show", str(path))))
    assert code == 0 and "Traceback" not in err, (out, err)


def test_utf8_with_bom_json_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cluster.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"kind": "List", "items": cluster()}).encode())
    code, _, err = run(capsys, "show", str(path))
    assert code == 0, err


# -- ZIP members ------------------------------------------------------------------------------------------------------
def snapshot_json(nodes: int = 1) -> bytes:
    raw = {"nodes": [k_node(f"n{i}") for i in range(nodes)], "queues": [QUEUE], "podGroups": [PG], "pods": [POD]}
    return json.dumps({"rawObjects": raw, "schedulerParams": {"SchedulerName": "kai-opt"}}).encode()


def write_zip(path: Path, data: bytes, *, name: str = "snapshot.json",
              method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        zf.writestr(name, data)
    return path


def patch_headers(path: Path, *, file_size: int | None = None, flags: int | None = None,
                  method: int | None = None) -> None:
    """Rewrite fields of every local and central header of a ZIP (a header that lies)."""
    b = bytearray(path.read_bytes())
    for sig, off_flags, off_method, off_size in ((b"PK\x03\x04", 6, 8, 22), (b"PK\x01\x02", 8, 10, 24)):
        i = b.find(sig)
        while i >= 0:
            if flags is not None:
                struct.pack_into("<H", b, i + off_flags, flags)
            if method is not None:
                struct.pack_into("<H", b, i + off_method, method)
            if file_size is not None:
                struct.pack_into("<I", b, i + off_size, file_size)
            i = b.find(sig, i + 4)
    path.write_bytes(bytes(b))


def test_zip_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", str(write_zip(tmp_path / "s.zip", snapshot_json())))
    assert code == 0, err


def test_zip_bomb_is_refused_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("snapshot.json", b" " * (32 << 20))  # 32 MiB of spaces in about 32 KB
    refused(capsys, path, "bomb.zip!snapshot.json", "would expand", "KAI_OPT_MAX_ZIP_RATIO", command="solve")


def test_zip_member_declared_size_over_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_zip(tmp_path / "s.zip", snapshot_json())
    monkeypatch.setenv("KAI_OPT_MAX_INPUT_BYTES", "200")
    refused(capsys, path, "s.zip!snapshot.json", "member declares", "above the limit of 200")


def test_zip_member_larger_than_its_header_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_zip(tmp_path / "s.zip", snapshot_json(nodes=20))
    patch_headers(path, file_size=100)  # zipfile stops at the declared size; the CRC then fails
    refused(capsys, path, "s.zip!snapshot.json", "does not match its header")


@pytest.mark.parametrize(("method", "needle"), [(zipfile.ZIP_BZIP2, "compression method 12"),
                                                (zipfile.ZIP_LZMA, "compression method 14")])
def test_zip_member_method_other_than_stored_or_deflate(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        method: int, needle: str) -> None:
    path = write_zip(tmp_path / "s.zip", snapshot_json(), method=method)
    refused(capsys, path, "s.zip!snapshot.json", needle, "stored or deflate")


def test_zip_member_deflate64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_zip(tmp_path / "s.zip", snapshot_json())
    patch_headers(path, method=9)  # Deflate64: zipfile raises NotImplementedError when asked to read it
    refused(capsys, path, "s.zip!snapshot.json", "compression method 9")


def test_zip_member_encrypted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_zip(tmp_path / "s.zip", snapshot_json())
    patch_headers(path, flags=0x1)
    refused(capsys, path, "s.zip!snapshot.json", "encrypted")


@pytest.mark.parametrize("name", ["../../escaped/snapshot.json", "/abs/olute/snapshot.json"])
def test_zip_member_names_are_never_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    path = write_zip(tmp_path / "s.zip", snapshot_json(), name=name)
    code, _, err = run(capsys, "show", str(path))
    assert code == 0, err
    assert not (tmp_path / "escaped").exists() and not Path("/abs").exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "s.zip"]


def test_zip_raw_objects_over_the_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_OPT_MAX_NODES", "2")
    path = write_zip(tmp_path / "s.zip", snapshot_json(nodes=3))
    refused(capsys, path, "s.zip!snapshot.json", "3 Node objects, above the ceiling of 2", "KAI_OPT_MAX_NODES")


# -- ceilings on objects --------------------------------------------------------------------------------------------
def test_defaults_are_sized_for_50000_nodes_and_a_million_pods() -> None:
    assert DEFAULTS["MAX_NODES"] == 50_000 and DEFAULTS["MAX_PODS"] == 1_000_000


@pytest.mark.parametrize(("body", "needle"), [
    ({"nodePools": [{**POOL, "count": 10_000_000}]}, "10,000,000 Node objects, above the ceiling of 50,000"),
    ({"nodePools": [POOL] * 1, "queues": [{"name": "q"}],
      "jobs": [{"name": "j", "queue": "q", "replicas": 10_000_000}]}, "10,000,000 Pod objects"),
    ({"nodePools": [{**POOL, "name": f"p{i}", "count": 30_000} for i in range(2)]}, "60,000 Node objects"),
])
def test_scenario_over_the_ceiling_is_refused_before_allocating(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                body: dict[str, Any], needle: str) -> None:
    path = write_scenario(tmp_path, body)
    refused(capsys, path, f"{path}:", "Scenario", needle, command="solve")


def test_gpu_device_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_OPT_MAX_GPU_DEVICES", "12")
    path = write_yaml(tmp_path, cluster(extra=[k_node("n2")]))  # 2 nodes x 8 GPUs
    refused(capsys, path, str(path), "16 GPU devices, above the ceiling of 12", "KAI_OPT_MAX_GPU_DEVICES")
    path = write_scenario(tmp_path, {"nodePools": [POOL]})
    refused(capsys, path, f"{path}:", "Scenario", "asks for 16 GPU devices, above the ceiling of 12")


def test_scenario_queue_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_OPT_MAX_QUEUES", "2")
    path = write_scenario(tmp_path, {"queues": [{"name": "a", "children": [{"name": "b"}, {"name": "c"}]}]})
    refused(capsys, path, "3 Queue objects, above the ceiling of 2")


def test_kubectl_snapshot_over_the_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAI_OPT_MAX_PODS", "1")
    path = write_yaml(tmp_path, cluster(extra=[k_pod("p2", "g")]))
    refused(capsys, path, str(path), "2 Pod objects, above the ceiling of 1", "KAI_OPT_MAX_PODS")


# -- no objects -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "text"), [("empty.yaml", ""), ("comments.yaml", "# nothing\n# here\n"),
                                            ("dashes.yaml", "---\n---\n"), ("list.yaml", "kind: List\nitems: []\n"),
                                            ("empty.json", "[]")])
def test_no_objects_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    refused(capsys, path, str(path), "holds no objects")


def test_dev_null_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, Path("/dev/null"), "/dev/null", "holds no objects", command="solve")


# -- apiVersions kai-opt does not read --------------------------------------------------------------------------------
def test_old_queue_version_is_skipped_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = {**k_queue("legacy"), "apiVersion": "scheduling.run.ai/v1"}
    code, out, err = run(capsys, "show", "-o", "json", str(write_yaml(tmp_path, cluster(extra=[old]))))
    assert code == 0, err
    data = json.loads(out)
    assert [q["name"] for q in data["queues"]] == ["q"]
    assert any("Queue legacy" in w and "scheduling.run.ai/v1" in w and "skipped" in w for w in data["warnings"])


def test_solve_names_the_skipped_object_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = {**k_podgroup("old"), "apiVersion": "scheduling.run.ai/v1alpha1"}
    code, out, err = run(capsys, "solve", "-e", "greedy", "-o", "json", str(write_yaml(tmp_path, cluster(extra=[old]))))
    assert code == 0 and json.loads(out)["binds"]
    assert err.startswith("kai-opt: warning: PodGroup default/old: UnsupportedAPIVersion") and err.count("\n") == 1


def test_only_unreadable_versions_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = {**k_podgroup("g"), "apiVersion": "scheduling.run.ai/v1alpha1"}
    refused(capsys, write_yaml(tmp_path, [old]), "PodGroup default/g", "scheduling.run.ai/v1alpha1",
            "nothing else is usable")


# -- inconsistent snapshots ---------------------------------------------------------------------------------------
def test_node_over_capacity_before_the_plan_is_no_violation(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A node without status (no allocatable) that already runs a pod: the plan cannot be blamed for it (found by
    the fuzzer: the checker stopped the cycle with a traceback)."""
    bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}}
    running = with_field(k_pod("r", "g"), "spec.nodeName", "n2")
    running["status"] = {"phase": "Running"}
    code, out, err = run(capsys, "solve", "-e", "greedy", "-o", "json",
                         str(write_yaml(tmp_path, cluster(extra=[bare, running]))))
    assert code == 0, err
    assert json.loads(out)["binds"]


@pytest.mark.parametrize(("role", "path", "value", "obj", "field"), [
    ("pod", "metadata.namespace", -1, "Pod -1/p", "namespace"),
    ("queue", "spec.parentQueue", 5, "Queue q", "parent"),
    ("queue", "spec.displayName", {"a": 1}, "Queue q", "display_name"),
    ("podgroup", "spec.subGroups", [{"name": "a", "parent": 7}], "PodGroup default/g", "parent"),
])
def test_wrong_types_the_parsers_did_not_foresee(tmp_path: Path, capsys: pytest.CaptureFixture[str], role: str,
                                                 path: str, value: Any, obj: str, field: str) -> None:
    base = {"pod": POD, "queue": QUEUE, "podgroup": PG}[role]
    refused(capsys, write_yaml(tmp_path, cluster(**{role: with_field(base, path, value)})), obj, f"field {field}")


CASE = Path("/work/shared/scenarios/kai/integration/"
            "087-reclaim-fractional-train-by-fractional-gpu-job-reclaim-all-f.yaml")


@pytest.mark.skipif(not CASE.is_file(), reason=f"no behaviour case at {CASE}")
@pytest.mark.parametrize(("old", "new", "needle"), [("gpus: 2", "gpus: 99999999999", "above 1024 GPU devices"),
                                                    ("deserved: 1", "deserved: .nan", "must be a finite number")])
def test_behaviour_case_that_does_not_load_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str,
                                                       new: str, needle: str) -> None:
    """Conformance reports such a case as skipped; read as a snapshot it was an empty cluster (exit 0)."""
    path = tmp_path / "case.yaml"
    path.write_text(CASE.read_text().replace(old, new, 1))
    refused(capsys, path, str(path), needle, command="solve")
