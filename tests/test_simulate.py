"""`simulate` stops once the cluster has settled (a cycle changed nothing and no later cycle of the run could), says
so, and refuses a cycle count above its cap in one line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import node, pod, podgroup, queue, run_cli, snapshot

from kai_opt.config import Config, Engine
from kai_opt.simulate import MAX_CYCLES, simulate

GREEDY = Config(engine=Engine.greedy)
API_VERSION = {"Queue": "scheduling.run.ai/v2", "PodGroup": "scheduling.run.ai/v2alpha2"}


run = run_cli


def small_cluster(tmp_path: Path) -> Path:
    """One 8-GPU node, a running pod, a pending one that fits, a pending one that never can (16 GPUs)."""
    objs = [node("n1", gpus=8), queue("q", gpu=(8, 1, -1)),
            podgroup("run", "q"), pod("run-0", "run", gpus=2, node_name="n1"),
            podgroup("fits", "q"), pod("fits-0", "fits", gpus=2),
            podgroup("never", "q"), pod("never-0", "never", gpus=16)]
    docs = [{"apiVersion": API_VERSION.get(o.kind, "v1"), "kind": o.kind, **o.obj} for o in objs]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def test_cycles_above_the_cap_are_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", str(small_cluster(tmp_path)), "--cycles", "1000000")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kai-opt: error: ")
    assert f"less than or equal to {MAX_CYCLES}" in err and "(see kai-opt simulate --help)" in err


def test_many_cycles_on_a_settled_cluster_stop_early(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "greedy.yaml"
    cfg.write_text("engine: greedy\n")
    path = small_cluster(tmp_path)
    start = time.monotonic()
    code, out, err = run(capsys, "simulate", str(path), "--cycles", str(MAX_CYCLES), "-c", str(cfg))
    assert code == 0, err
    assert time.monotonic() - start < 60  # 10,000 cycles would take minutes
    assert "settled after 2 cycles" in out  # cycle 1 binds fits-0, cycle 2 changes nothing
    code, out, err = run(capsys, "simulate", str(path), "--cycles", str(MAX_CYCLES), "-c", str(cfg), "-o", "json")
    data = json.loads(out)
    assert data["settled_after"] == 2 and len(data["cycles"]) == 2 and data["stable"]
    pending = [g["podgroup"] for g in data["end"]["pending_podgroups"]]
    assert pending == ["default/never"]  # it stays pending: nothing a later cycle could do for it


def test_a_run_that_ends_unsettled_says_nothing_about_settling(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "greedy.yaml"
    cfg.write_text("engine: greedy\n")
    code, out, _ = run(capsys, "simulate", str(small_cluster(tmp_path)), "--cycles", "1", "-c", str(cfg), "-o", "json")
    data = json.loads(out)
    assert code == 0 and data["settled_after"] is None and len(data["cycles"]) == 1 and not data["stable"]


def _protected_victim() -> list[Any]:
    """A pending build pod (priority 100) can preempt a running train pod (50) of its queue, but only once the
    victim has run for the queue's preemptMinRuntime (120 s; it started 60 s before now)."""
    return [node("n1", gpus=8), queue("q", gpu=(8, 1, -1), preemptMinRuntime="120s"),
            podgroup("victim", "q", priority_class="train"),
            pod("victim-0", "victim", gpus=8, node_name="n1", started_min_ago=1),
            podgroup("urgent", "q", priority_class="build"), pod("urgent-0", "urgent", gpus=8)]


def test_min_runtime_ending_within_the_run_keeps_it_going() -> None:
    result = simulate(snapshot(_protected_victim()), GREEDY, 20, period_s=10.0)
    evicted_in = [c.cycle for c in result.cycles if c.summary["evictions"]]
    assert evicted_in, [c.summary for c in result.cycles]
    assert evicted_in[0] > 1  # protected at first: the quiet first cycles did not end the run
    # then urgent-0 runs (non-preemptible: never a victim, so its min runtime does not matter) and the run settles
    assert result.settled_after is not None and evicted_in[0] < result.settled_after < 20


def test_min_runtime_ending_after_the_run_does_not() -> None:
    result = simulate(snapshot(_protected_victim()), GREEDY, 3, period_s=10.0)  # the run ends at now + 20 s
    assert result.settled_after == 1 and len(result.cycles) == 1


def test_stop_when_settled_off_runs_every_cycle() -> None:
    result = simulate(snapshot(_protected_victim()), GREEDY, 3, period_s=10.0, stop_when_settled=False)
    assert result.settled_after is None and len(result.cycles) == 3
