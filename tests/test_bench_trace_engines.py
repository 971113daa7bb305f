"""kai-opt's engines in the trace replay (`kai-opt bench trace --engines greedy,cpsat`): batch cycles on a snapshot
of the replay's state, consolidation moving running pods, and the CLI on a tiny openb-format CSV."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kai_opt.bench import batch, trace
from kai_opt.bench.openb import NodeList
from kai_opt.cli.main import main
from kai_opt.config import Engine, parse_config

NODE_ROWS = ["sn,cpu_milli,memory_mib,gpu,model", "n0,32000,65536,4,T4", "n1,32000,65536,4,T4",
             "n2,16000,32768,2,P100", "n3,8000,16384,0,"]
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time," \
             "scheduled_time"


def two_nodes() -> trace.Cluster:
    nodes = NodeList("t", ("a", "b"), np.array([8000, 8000]), np.array([4096, 4096]), np.array([2, 2]),
                     ("T4", "T4"))
    return trace.Cluster.from_nodes(nodes)


def pods(*rows: tuple[int, int, int]) -> trace.Pods:
    """(CPU milli, GPUs, milli per GPU) per pod, 100 MiB each, any model."""
    cpu, num, milli = (np.asarray(x, dtype=np.int64) for x in zip(*rows, strict=True))
    return trace.Pods(cpu, np.full(len(rows), 100), num, milli, np.full(len(rows), -1))


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
@pytest.mark.parametrize("consolidation", [False, True])
def test_a_cycle_engine_moves_running_pods_only_with_consolidation(engine: Engine, consolidation: bool) -> None:
    """Spread placement leaves one free GPU per node; a 2-GPU arrival then fits only if a running pod moves."""
    cluster = two_nodes()
    shapes = pods((1000, 1, 1000), (1000, 1, 1000), (1000, 2, 1000))
    config = parse_config({"placement": {"gpu": "spread"}, "solver": {"deterministic": True, "time_budget_s": 0.3}})
    eng = batch.KaiOptCycleEngine(cluster.copy(), engine, config, consolidation)
    assert isinstance(eng, trace.CycleEngine)
    placed, where = np.zeros(3, dtype=bool), {}
    assert trace._apply_cycle(eng, engine.value, cluster, shapes, 0, 2, placed, where) == 0
    assert placed[:2].all() and {where[0][0], where[1][0]} == {0, 1}  # spread
    moved = trace._apply_cycle(eng, engine.value, cluster, shapes, 2, 3, placed, where)
    assert bool(placed[2]) is consolidation and moved == int(consolidation)
    assert (cluster.gpu_free >= 0).all() and cluster.used_gpu_milli == 1000 * (2 + 2 * consolidation)


def test_gpu_spec_becomes_a_node_affinity_the_engine_honours() -> None:
    nodes = NodeList("t", ("a", "b"), np.array([8000, 8000]), np.array([4096, 4096]), np.array([1, 1]),
                     ("T4", "P100"))
    cluster = trace.Cluster.from_nodes(nodes)
    shapes = pods((1000, 1, 1000))
    shapes = trace.Pods(shapes.cpu, shapes.mem, shapes.num_gpu, shapes.gpu_milli,
                        np.asarray([trace.spec_mask("P100", cluster.models)]))
    eng = batch.KaiOptCycleEngine(cluster.copy(), Engine.greedy, parse_config({}), False)
    placed, where = np.zeros(1, dtype=bool), {}
    trace._apply_cycle(eng, "greedy", cluster, shapes, 0, 1, placed, where)
    assert placed[0] and where[0][0] == 1  # the P100 node, though the T4 node comes first


def test_cli_replays_greedy_and_cpsat_with_and_without_consolidation(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("\n".join(NODE_ROWS) + "\n")
    rng = np.random.default_rng(0)
    rows = [POD_HEADER]
    for i in range(24):
        num, milli = [(1, 500), (1, 1000), (2, 1000), (0, 0)][i % 4]
        spec = "P100" if i == 5 else ""
        rows.append(f"p{i},{int(rng.integers(1, 6)) * 1000},1024,{num},{milli},{spec},LS,Running,0,0,0")
    pods_csv = tmp_path / "pods.csv"
    pods_csv.write_text("\n".join(rows) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text("solver:\n  deterministic: true\n  time_budget_s: 0.2\n")
    try:
        main(["bench", "trace", "--nodes", str(nodes), "--pods", str(pods_csv), "--seeds", "1", "--batch", "6",
              "--engines", "greedy,cpsat,fgd", "--config", str(config), "-o", "json"])
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    finally:
        batch.register()  # the default config again for other tests
    data = json.loads(capsys.readouterr().out)
    got = [(r["engine"], r.get("consolidation"), r["batch"]) for r in data["results"]]
    assert got == [("greedy", False, 6), ("greedy", True, 6), ("cpsat", False, 6), ("cpsat", True, 6),
                   ("fgd", None, 6)]
    for r in data["results"]:
        assert 0 < r["placed"] <= r["pods"] and 0 <= r["unallocated_pct_at_100"] <= 100
        assert r["moves"] == 0 or r.get("consolidation")
    assert [(s["engine"], s.get("consolidation")) for s in data["summary"]] == [(e, c) for e, c, _ in got]
