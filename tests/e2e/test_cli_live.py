"""Live-cluster mode of the CLI (issue 22 item 4) on a real apiserver: `show`, `solve` (a dry run), `fairshare`,
`explain` and `queue` with --kubeconfig read the cluster through the watch cache's list code and answer exactly as
they do on a `kai-opt dump` of the same cluster (and on that dump read from stdin)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_opt.k8s.client import object_path, request

from .schedharness import create, namespace, node, pod, podgroup, queue
from .testcluster import LocalCluster, ensure_namespace

pytestmark = pytest.mark.e2e

NS = "team-a"
TIMING = {"wall_s", "build_s", "solve_s", "phases", "seconds", "cpu_s"}


def kai_opt(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kai_opt", *args], capture_output=True, text=True, timeout=180,
                          check=False, input=stdin)


def untimed(data: Any) -> Any:
    """The answer without measured durations (they differ between any two runs)."""
    if isinstance(data, dict):
        return {k: untimed(v) for k, v in data.items() if k not in TIMING}
    if isinstance(data, list):
        return [untimed(v) for v in data]
    return data


def _diff(live: Any, dumped: Any) -> str:
    """The two answers' differing lines (a failure says what differs, not only that something does)."""
    import difflib

    lines = [json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (live, dumped)]
    return "\n".join(difflib.unified_diff(*lines, "live", "dump", lineterm="", n=2))


@pytest.fixture
def live(clean_cluster: LocalCluster, tmp_path: Path) -> tuple[Path, Path]:
    """Two GPU nodes, a queue tree, a placeable gang, a gang too big for the cluster, one pod bound already; the
    admin kubeconfig and a `kai-opt dump` of it."""
    with clean_cluster.api_client() as api:
        ensure_namespace(api, NS)
        create(api, [namespace(NS), node("gpu-0", 8), node("gpu-1", 8),
                     queue("org"), queue("research", 8, parent="org"), queue("prod", 4, parent="org"),
                     {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "train"},
                      "value": 50, "preemptionPolicy": "PreemptLowerPriority"},
                     podgroup("fits", 2, "research", ns=NS), podgroup("too-big", 3, "prod", ns=NS),
                     *(pod(f"fits-{i}", gpus=4, group="fits", queue_name="research", ns=NS) for i in range(2)),
                     *(pod(f"too-big-{i}", gpus=8, group="too-big", queue_name="prod", ns=NS) for i in range(3))])
        running = pod("running", gpus=2, queue_name="research", ns=NS)
        running["spec"]["nodeName"] = "gpu-1"
        request(api, "POST", object_path("v1", "pods", NS), body=running)
    kubeconfig = clean_cluster.kubeconfig()
    dumped = tmp_path / "dump.yaml"
    res = kai_opt("dump", "--kubeconfig", str(kubeconfig), "--file", str(dumped))
    assert res.returncode == 0, res.stderr
    return kubeconfig, dumped


QUESTIONS = [
    ("show", "-o", "json"),
    ("show", "-n", NS, "-o", "name"),
    ("fairshare", "-o", "json"),
    ("solve", "-e", "greedy", "-o", "json"),
    ("solve", "-e", "greedy", "-n", NS, "-o", "name"),
    ("explain", "pod/fits-0", "-n", NS, "-e", "greedy", "-o", "json"),
    ("explain", f"pg/{NS}/too-big", "-e", "greedy", "-o", "json"),
    ("explain", "queue/research", "-e", "greedy", "-o", "json"),
    ("queue", "-e", "greedy", "-o", "json"),
    ("queue", "research", "-e", "greedy", "-o", "json"),
]


@pytest.mark.parametrize("question", QUESTIONS, ids=lambda q: "-".join(a for a in q if not a.startswith("-")))
def test_live_answers_equal_the_dumps(live: tuple[Path, Path], question: tuple[str, ...]) -> None:
    kubeconfig, dumped = live
    cmd, rest = question[0], list(question[1:])
    on_cluster = kai_opt(cmd, *rest, "--kubeconfig", str(kubeconfig))
    assert on_cluster.returncode == 0, on_cluster.stderr
    on_file = kai_opt(cmd, str(dumped), *rest)  # explain [SNAPSHOT] KIND/NAME: the snapshot comes first
    on_stdin = kai_opt(cmd, "-", *rest, stdin=dumped.read_text())
    assert on_file.returncode == 0 and on_stdin.returncode == 0, (on_file.stderr, on_stdin.stderr)
    if "json" in rest:
        live_answer = untimed(json.loads(on_cluster.stdout))
        for other in (on_file, on_stdin):
            answer = untimed(json.loads(other.stdout))
            assert live_answer == answer, _diff(live_answer, answer)
        assert live_answer  # something was answered
    else:
        assert on_cluster.stdout == on_file.stdout == on_stdin.stdout
        assert on_cluster.stdout.strip()


def test_live_answers_are_about_the_cluster(live: tuple[Path, Path]) -> None:
    kubeconfig, _ = live
    shown = json.loads(kai_opt("show", "--kubeconfig", str(kubeconfig), "-o", "json").stdout)
    assert shown["nodes"] == 2 and shown["gpus"]["total"] == 16 and shown["gpus"]["used"] == 2
    assert {pg["podgroup"] for pg in shown["pending_podgroups"]} == {f"{NS}/fits", f"{NS}/too-big"}
    plan = json.loads(kai_opt("solve", "--kubeconfig", str(kubeconfig), "-e", "greedy", "-o", "json").stdout)
    assert sorted(b["pod"] for b in plan["binds"]) == [f"{NS}/fits-0", f"{NS}/fits-1"]
    why = json.loads(kai_opt("explain", "--kubeconfig", str(kubeconfig), "-n", NS, "pg/too-big", "-e", "greedy",
                             "-o", "json").stdout)
    assert why["target"] == {"kind": "podgroup", "name": f"{NS}/too-big"} and why["pending"]["reasons"]
    # a dry run: nothing was bound
    with _admin(kubeconfig) as api:
        pods = request(api, "GET", object_path("v1", "pods", NS))["items"]
    assert {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")} == {"running"}


def _admin(kubeconfig: Path) -> Any:
    from kai_opt.k8s.client import make_api_client

    return make_api_client(kubeconfig=kubeconfig)


def test_unreachable_cluster_is_a_runtime_failure(tmp_path: Path) -> None:
    """Exit 1 (runtime), one line; a missing kubeconfig is bad input: exit 2."""
    from .testcluster import free_port

    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "nope"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    res = kai_opt("show", "--kubeconfig", str(kc))
    assert res.returncode == 1 and res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("kai-opt: error: list nodes: ")
    res = kai_opt("show", "--kubeconfig", str(tmp_path / "nope"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no such file" in res.stderr, res.stderr


def test_dump_json_and_namespace(live: tuple[Path, Path], tmp_path: Path) -> None:
    """`dump -o json` is the same snapshot as the YAML dump; `dump -n NS` keeps only that namespace's pods."""
    kubeconfig, dumped = live
    as_json = tmp_path / "dump.json"
    res = kai_opt("dump", "--kubeconfig", str(kubeconfig), "-o", "json", "-f", str(as_json))
    assert res.returncode == 0, res.stderr
    assert json.loads(as_json.read_text())["kind"] == "List"
    shown = [json.loads(kai_opt("show", str(p), "-o", "json").stdout) for p in (dumped, as_json)]
    assert shown[0] == shown[1]
    other = kai_opt("dump", "--kubeconfig", str(kubeconfig), "-n", "no-such-ns", "-o", "json")
    items = json.loads(other.stdout)["items"]
    assert not [i for i in items if i["kind"] in ("Pod", "PodGroup")]
    assert {"Node", "Queue"} <= {i["kind"] for i in items}
    refused = kai_opt("dump", "--kubeconfig", str(kubeconfig), "-o", str(tmp_path / "x.yaml"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--output" in refused.stderr
