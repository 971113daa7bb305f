"""kai-opt's engines in the trace replay (`kai-opt bench trace --engines greedy,cpsat`): batch cycles on a snapshot
of the replay's state, consolidation moving running pods, and the CLI on a tiny openb-format CSV."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kai_opt.bench import batch, trace
from kai_opt.bench.openb import NodeList, PodList
from kai_opt.cli import bench_trace
from kai_opt.cli.main import main
from kai_opt.config import Config, Engine, parse_config

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
    solved = {"OPTIMAL", "FEASIBLE", "GREEDY_KEPT", "FALLBACK_GREEDY"}
    for r in data["results"]:  # one solver status per cycle of kai-opt's engines; none for a policy
        assert r["moves_per_pod"] == pytest.approx(r["moves"] / r["pods"], abs=1e-6)
        if r["engine"] == "fgd":
            assert r["cycles"] == 0 and r["solver_status"] == {}
            continue
        assert r["cycles"] == -(-r["pods"] // 6) == sum(r["solver_status"].values())
        assert set(r["solver_status"]) <= (solved if r["engine"] == "cpsat" else {"HEURISTIC"})
    for s, r in zip(data["summary"], data["results"], strict=True):  # one seed: the summary is the run
        assert s["cycles"] == r["cycles"] and s["solver_status"] == r["solver_status"]
        assert sum(s["solver_mix"].values()) == s["cycles"]
        assert s["moves_per_pod_mean"] == pytest.approx(r["moves_per_pod"], abs=1e-6)
        assert s["solver_mix"]["other"] == (0 if s["engine"] == "cpsat" else s["cycles"])


class MoveOne:
    """A CycleEngine that places each new pod on node 0 GPU 0..1 (whole GPUs alternate) and moves the first running
    pod to the other GPU on every cycle, reporting a status that alternates between two of kai-opt's."""

    def __init__(self) -> None:
        self.cycle = 0

    def place_cycle(self, cluster: trace.Cluster, running: trace.Pods, where: list[trace.Placement],
                    pods: trace.Pods) -> trace.CycleResult:
        self.cycle += 1
        moves = {0: (where[0][0], (1 - where[0][1][0],))} if len(where) == 1 else {}
        free = [g for g in range(2) if not where or g != where[0][1][0]]
        placements = [(0, (free[0],)) if not where and i == 0 else None for i in range(len(pods))]
        return trace.CycleResult(placements, moves, "OPTIMAL" if self.cycle % 2 else "GREEDY_KEPT")


def test_moves_per_pod_and_status_counts_of_a_cycle_engine_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pod placed, then moved once per later cycle: 2 moves over 6 arrived pods in 3 cycles of 2."""
    monkeypatch.setitem(trace._FACTORIES, "moveone", lambda c, w, r: MoveOne())
    nodes = NodeList("t", ("a",), np.array([8000]), np.array([4096]), np.array([2]), ("T4",))
    pod_list = PodList("t", tuple(f"p{i}" for i in range(6)), *(np.full(6, v) for v in (1000, 100, 1, 1000)),
                       ("",) * 6)
    run = trace.replay(nodes, pod_list, "moveone", seed=0, batch=2, inflate=0)
    assert (run.cycles, run.moves, len(run.placed), int(run.placed.sum())) == (3, 2, 6, 1)
    assert run.moves_per_pod == pytest.approx(2 / 6)
    assert run.solver_status == {"OPTIMAL": 2, "GREEDY_KEPT": 1}
    got = run.to_json()
    assert (got["moves_per_pod"], got["cycles"], got["solver_status"]) == (round(2 / 6, 6), 3, run.solver_status)
    (row,) = trace.summarize([run])
    assert row["cycles"] == 3 and row["moves_per_pod_mean"] == round(2 / 6, 6)
    assert row["solver_mix"] == {"cpsat_chosen": 2, "greedy_kept": 1, "fallback_greedy": 0, "other": 0}
    cells = dict(zip(bench_trace.HEADERS, bench_trace._cells(row), strict=True))
    assert (cells["moves/pod"], cells["CP-SAT/kept/fallback"]) == ("0.3333", "2/1/0")


def test_default_engine_list_is_the_baselines_and_the_configs_engine() -> None:
    default = Config().engine.value
    assert bench_trace.default_engines(Config()) == [*trace.BUILTIN_ENGINES, default]
    assert default not in trace.BUILTIN_ENGINES  # the baselines alone would leave kai-opt out
    names = bench_trace.default_engines(parse_config({"engine": "greedy"}))
    assert names[-1] == "greedy" and default not in names
    trace.check_engines(bench_trace.default_engines(Config()))  # wired into the replay
