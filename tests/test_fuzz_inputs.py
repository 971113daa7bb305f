"""Fuzzing the input formats (issue 19): snapshots (kubectl YAML/JSON, KAI's ZIP), scenarios and configs. Valid
documents, mutated in their values (types, ranges), structure and encoding, go through the CLI in-process. Each
example either exits 2 with exactly one `kai-opt: error:` line on stderr, or exits 0 with a valid plan (or check
result); never a traceback, and each within a time and memory bound."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import resource
import time
import zipfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_inputs import patch_headers

from kai_opt.cli.main import main

EXAMPLE_WALL_S = 10.0  # one example; a small cluster takes well under a second
PEAK_RSS_MB = 2048  # the test process, after every example
SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NOW = "2026-01-01T00:00:00Z"

SNAPSHOT: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.memory": "81920",
                                                                              "zone": "a"}},
     "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
     "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}},
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
     "status": {"capacity": {"cpu": "32000m", "memory": "256Gi", "nvidia.com/gpu": 4, "pods": 110}}},
    {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "root"},
     "spec": {"resources": {"gpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}},
    {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"},
     "spec": {"parentQueue": "root", "priority": 100, "reclaimMinRuntime": "1m",
              "resources": {"gpu": {"quota": 4, "limit": 12}, "cpu": {"quota": 1000}, "memory": {"quota": 1000}}}},
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "hi"}, "value": 200},
    {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": "t"},
     "spec": {"levels": [{"nodeLabel": "zone"}]}},
    {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": {"name": "g", "namespace": "ns"},
     "spec": {"minMember": 2, "queue": "q", "priorityClassName": "hi",
              "topologyConstraint": {"topology": "t", "preferredTopologyLevel": "zone"}}},
    *[{"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": f"p{i}", "namespace": "ns", "creationTimestamp": NOW,
                    "annotations": {"pod-group-name": "g"}, "labels": {"kai.scheduler/queue": "q"}},
       "spec": {"schedulerName": "kai-opt", "priority": 200, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                                                           "limits": {"nvidia.com/gpu": "2"}}}]},
       "status": {"phase": "Pending"}} for i in range(2)],
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"name": "frac", "namespace": "ns", "annotations": {"gpu-fraction": "0.5"}},
     "spec": {"schedulerName": "kai-opt", "nodeName": "n2",
              "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
     "status": {"phase": "Running", "startTime": NOW}},
]

SCENARIO: dict[str, Any] = {
    "apiVersion": "kai-opt/v1", "kind": "Scenario", "now": NOW,
    "topologies": [{"name": "t", "levels": ["rack"]}],
    "nodePools": [{"name": "a", "count": 3, "topology": {"rack": "r-{index/2}"},
                   "template": {"gpus": 8, "cpu": 64, "memory": "512Gi", "gpuMemoryMiB": 40960}}],
    "queues": [{"name": "root", "gpu": {"quota": -1}, "children": [
        {"name": "q", "priority": 100, "gpu": {"quota": 8, "limit": 16, "overQuotaWeight": 2},
         "reclaimMinRuntime": "5m"}]}],
    "priorityClasses": [{"name": "hi", "value": 200}],
    "jobs": [{"name": "run", "queue": "q", "replicas": 2, "pod": {"gpus": 2, "cpu": "4", "memory": "16Gi"},
              "running": {"nodes": ["auto", "a-1"], "startedSecondsAgo": 600}},
             {"name": "train", "queue": "q", "priorityClass": "hi", "topology": {"preferredLevel": "rack"},
              "subGroups": [{"name": "w", "minMember": 2, "replicas": 3}],
              "pod": {"gpuFraction": 0.5, "cpu": "1"}}],
}

CONFIG: dict[str, Any] = {
    "engine": "greedy", "default_queue": "q", "max_victim_chunks": 100, "stale_gang_grace_s": 30.0,
    "solver": {"time_budget_s": 1.0, "workers": 1, "seed": 3},
    "actions": {"consolidate": False}, "placement": {"gpu": "spread"},
}

# -- mutations -----------------------------------------------------------------------------------------------------
HOSTILE_TEXT = ["", "nan", "NaN", "inf", "-inf", "1e400", "1e-400", "-1", "-0", "0.5", "500m", "1Gi", "64Ki",
                "9" * 30, "9" * 5000, "1e" + "9" * 20, "0x10", "1_000", " 8 ", "true", "null", "~", "{", "]",
                "a" * 300, "\u00e9\u4e2d\U0001f600", "\x00", "1h30m", "-5m", "99999999999h",
                "2026-13-45T99:99:99Z", "../../etc/passwd", "scheduling.run.ai/v1"]
HOSTILE_NUMBERS = [0, -1, -2, 1, 2**31, -(2**31) - 1, 2**53 + 1, 2**63, 2**64, 10**30, 10**300, 0.5, -0.5,
                   1e308, -1e308, 1e-308, math.nan, math.inf, -math.inf]


def deep(n: int) -> Any:
    value: Any = "x"
    for _ in range(n):
        value = [value]
    return value


leaves = st.one_of(st.sampled_from(HOSTILE_TEXT), st.sampled_from(HOSTILE_NUMBERS), st.integers(),
                   st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                   st.text(max_size=20))
values = st.one_of(leaves, st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=6),
                   st.sampled_from([deep(150), deep(30), {"a": deep(120)}]))


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a document, in a fixed order."""
    out = [prefix]
    if isinstance(node, dict):
        for k in node:
            out.extend(paths(node[k], (*prefix, k)))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out.extend(paths(item, (*prefix, i)))
    return out


def mutate(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        where = data.draw(st.sampled_from(paths(doc)), label="path")
        op = data.draw(st.sampled_from(["replace", "replace", "replace", "delete", "wrap", "duplicate", "share"]),
                       label="op")
        if not where:
            if op == "wrap":
                doc = [doc]
            elif op == "replace":
                doc = copy.deepcopy(data.draw(values, label="value"))
            continue
        parent = doc
        for part in where[:-1]:
            parent = parent[part]
        key = where[-1]
        if op == "replace":
            parent[key] = copy.deepcopy(data.draw(values, label="value"))  # drawn values are shared
        elif op == "delete":
            del parent[key]
        elif op == "wrap":
            parent[key] = [parent[key]]
        else:  # duplicate: a copy; share: the same object, which YAML writes as an anchor and aliases
            twin = parent[key] if op == "share" else copy.deepcopy(parent[key])
            if isinstance(parent, list):
                parent.append(twin)
            else:
                parent[f"{key}x"] = twin
    return doc


def serialise(doc: Any, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(doc).encode()
    if fmt == "yaml-multi" and isinstance(doc, list):
        return yaml.safe_dump_all(doc, sort_keys=False).encode()
    return yaml.safe_dump(doc, sort_keys=False).encode()


def damage(raw: bytes, data: st.DataObject) -> bytes:
    """An encoding or byte-level change, or none."""
    how = data.draw(st.sampled_from(["none", "none", "none", "bom", "utf-16", "utf-16-le", "utf-32", "latin-1",
                                     "truncate", "insert", "comments-only", "empty"]), label="bytes")
    text = raw.decode("utf-8")
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how in ("utf-16", "utf-16-le", "utf-32"):
        return text.encode(how)
    if how == "latin-1":
        return (text + "# caf\u00e9\n").encode("latin-1", errors="replace")
    if how == "truncate":
        return raw[: data.draw(st.integers(0, len(raw)), label="cut")]
    if how == "insert":
        at = data.draw(st.integers(0, len(raw)), label="at")
        return raw[:at] + data.draw(st.binary(min_size=1, max_size=8), label="junk") + raw[at:]
    if how == "comments-only":
        return b"# nothing here\n"
    if how == "empty":
        return b""
    return raw


# -- the property ----------------------------------------------------------------------------------------------------
def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
    return (0 if code is None else int(code) if isinstance(code, int) else 1), out.getvalue(), err.getvalue()


def check(args: list[str]) -> tuple[int, str]:
    start = time.monotonic()
    code, out, err = cli(*args)
    wall = time.monotonic() - start
    assert "Traceback" not in err and "Traceback" not in out, err
    assert code in (0, 2), (code, err[-2000:])
    if code == 2:
        assert err.startswith("kai-opt: error: ") and err.count("\n") == 1 and err.endswith("\n"), repr(err[:2000])
    assert wall < EXAMPLE_WALL_S, f"{wall:.1f}s for {args}"
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mb < PEAK_RSS_MB, f"peak RSS {peak_mb:.0f} MB"
    return code, out


def solve_ok(out: str) -> None:
    plan = json.loads(out)
    assert {"binds", "evictions", "pending", "summary"} <= set(plan)


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(["yaml-multi", "yaml-list", "json"]))
def test_fuzz_snapshot(tmp_path_factory: Any, data: st.DataObject, fmt: str) -> None:
    doc: Any = SNAPSHOT if fmt == "yaml-multi" else {"apiVersion": "v1", "kind": "List", "items": SNAPSHOT}
    path = tmp_path_factory.mktemp("snap") / ("cluster.json" if fmt == "json" else "cluster.yaml")
    path.write_bytes(damage(serialise(mutate(doc, data), fmt), data))
    code, out = check(["solve", "-e", "greedy", "-o", "json", str(path)])
    if code == 0:
        solve_ok(out)


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(["yaml", "json"]))
def test_fuzz_scenario(tmp_path_factory: Any, data: st.DataObject, fmt: str) -> None:
    path = tmp_path_factory.mktemp("scenario") / ("scenario.json" if fmt == "json" else "scenario.yaml")
    path.write_bytes(damage(serialise(mutate(SCENARIO, data), fmt), data))
    code, out = check(["solve", "-e", "greedy", "-o", "json", str(path)])
    if code == 0:
        solve_ok(out)


def kai_snapshot() -> dict[str, Any]:
    """SNAPSHOT as KAI's snapshot.json holds it: lists per kind under rawObjects, no TypeMeta."""
    keys = {"Node": "nodes", "Pod": "pods", "Queue": "queues", "PodGroup": "podGroups",
            "PriorityClass": "priorityClasses", "Topology": "topologies"}
    raw: dict[str, list[Any]] = {k: [] for k in keys.values()}
    for obj in SNAPSHOT:
        raw[keys[obj["kind"]]].append({k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
    return {"rawObjects": raw, "schedulerParams": {"SchedulerName": "kai-opt"}}


@SETTINGS
@given(data=st.data(), method=st.sampled_from([zipfile.ZIP_DEFLATED, zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED,
                                               zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]),
       name=st.sampled_from(["snapshot.json", "snapshot.json", "dump/snapshot.json", "../../snapshot.json",
                             "/abs/snapshot.json", "other.json"]),
       header=st.sampled_from(["none", "none", "none", "encrypted", "deflate64", "smaller", "larger"]))
def test_fuzz_kai_zip(tmp_path_factory: Any, data: st.DataObject, method: int, name: str, header: str) -> None:
    path = tmp_path_factory.mktemp("zip") / "snapshot.zip"
    raw = damage(serialise(mutate(kai_snapshot(), data), "json"), data)
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        zf.writestr(name, raw)
    if header == "encrypted":
        patch_headers(path, flags=0x1)
    elif header == "deflate64":
        patch_headers(path, method=9)
    elif header in ("smaller", "larger"):
        patch_headers(path, file_size=len(raw) // 2 if header == "smaller" else len(raw) * 1000 + 10**7)
    code, out = check(["solve", "-e", "greedy", "-o", "json", str(path)])
    if code == 0:
        solve_ok(out)


SCENARIO_FILE_NAME = "base-scenario.yaml"


@SETTINGS
@given(data=st.data(), solve=st.booleans())
def test_fuzz_config(tmp_path_factory: Any, data: st.DataObject, solve: bool) -> None:
    folder = tmp_path_factory.mktemp("config")
    path = folder / "config.yaml"
    path.write_bytes(damage(serialise(mutate(CONFIG, data), "yaml"), data))
    if not solve:
        code, out = check(["config", "--check", str(path)])
        assert code == 2 or "valid" in out
        return
    scenario = folder / SCENARIO_FILE_NAME
    scenario.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    code, out = check(["solve", "-e", "greedy", "-c", str(path), "-o", "json", str(scenario)])
    if code == 0:
        solve_ok(out)


def test_the_base_documents_are_valid(tmp_path: Path) -> None:
    """The fuzzers start from valid inputs (else every mutation would be judged against an error)."""
    for name, raw in (("a.yaml", serialise(SNAPSHOT, "yaml-multi")), ("b.json", serialise(
            {"kind": "List", "items": SNAPSHOT}, "json")), ("s.yaml", serialise(SCENARIO, "yaml"))):
        (tmp_path / name).write_bytes(raw)
        code, out = check(["solve", "-e", "greedy", "-o", "json", str(tmp_path / name)])
        assert code == 0
        solve_ok(out)
    with zipfile.ZipFile(tmp_path / "k.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("snapshot.json", serialise(kai_snapshot(), "json"))
    code, out = check(["solve", "-e", "greedy", "-o", "json", str(tmp_path / "k.zip")])
    assert code == 0
    solve_ok(out)
    (tmp_path / "c.yaml").write_bytes(serialise(CONFIG, "yaml"))
    assert check(["config", "--check", str(tmp_path / "c.yaml")])[0] == 0
