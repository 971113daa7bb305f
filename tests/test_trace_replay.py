"""Trace replay (FGD protocol): CSV readers, feasibility, each policy's choice on hand-checked clusters, the
arrived/unallocated accounting, the external-engine hook and `kai-opt bench trace` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from builders import run_cli

from kai_opt.bench import openb, trace
from kai_opt.bench.openb import MILLI, NodeList, PodList, read_nodes, read_pods
from kai_opt.bench.trace import Cluster, Pods, Run, Workload
from kai_opt.config import Config
from kai_opt.errors import InputError

POD_HEADER = ",".join(openb.POD_COLUMNS)
NODE_HEADER = ",".join(openb.NODE_COLUMNS)

# -- helpers ---------------------------------------------------------------------------------------------------------


def node_list(*rows: tuple[int, int, int, str]) -> NodeList:
    """Nodes from (cpu milli, memory MiB, GPUs, model)."""
    cpu, mem, gpus, model = zip(*rows, strict=True)
    return NodeList("test", tuple(f"n{i}" for i in range(len(rows))), np.asarray(cpu, dtype=np.int64),
                    np.asarray(mem, dtype=np.int64), np.asarray(gpus, dtype=np.int64), tuple(model))


def pod_list(*rows: tuple[int, int, int, int, str]) -> PodList:
    """Pods from (cpu milli, memory MiB, GPUs, milli per GPU, gpu_spec)."""
    cpu, mem, num, milli, spec = zip(*rows, strict=True)
    a = [np.asarray(x, dtype=np.int64) for x in (cpu, mem, num, milli)]
    return PodList("test", tuple(f"p{i}" for i in range(len(rows))), *a, tuple(spec))


def pods_for(cluster: Cluster, *rows: tuple[int, int, int, int, str]) -> Pods:
    return Pods.from_list(pod_list(*rows), cluster.models)


def workload(*shapes: tuple[int, int, int, float]) -> Workload:
    """A target workload from (cpu, milli per GPU, GPUs, weight)."""
    cpu, milli, num, w = zip(*shapes, strict=True)
    weight = np.asarray(w, dtype=np.float64)
    return Workload(np.asarray(cpu, dtype=np.int64), np.asarray(milli, dtype=np.int64),
                    np.asarray(num, dtype=np.int64), np.full(len(cpu), -1, dtype=np.int64), weight / weight.sum(),
                    ("",) * len(cpu))


def policy(name: str, cluster: Cluster, wl: Workload | None = None, seed: int = 0) -> trace.Policy:
    wl = wl or workload((1000, 1000, 1, 1.0))
    eng = trace._FACTORIES[name](cluster, wl, np.random.default_rng(seed))
    assert isinstance(eng, trace.Policy)
    return eng


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def pod_row(name: str, cpu: int, mem: int, num: int, milli: int, spec: str = "") -> str:
    return f"{name},{cpu},{mem},{num},{milli},{spec},LS,Running,0,,0"




# -- readers ---------------------------------------------------------------------------------------------------------


def test_readers_parse_default_and_multigpu_layouts(tmp_path: Path) -> None:
    nodes = read_nodes(write_csv(tmp_path / "n.csv", NODE_HEADER,
                                 ["a,32000,131072,4,V100M16", "b,8000,32768,0,"]))
    assert nodes.names == ("a", "b") and nodes.gpus.tolist() == [4, 0] and nodes.model == ("V100M16", "")
    assert nodes.total_gpu_milli == 4 * MILLI
    pods = read_pods(write_csv(tmp_path / "p.csv", POD_HEADER,
                               [pod_row("x", 4000, 100, 1, 500, "T4| V100M16"), pod_row("y", 1000, 10, 0, 0)]))
    assert pods.gpu_spec == ("T4|V100M16", "") and pods.total_milli.tolist() == [500, 0]
    short = read_pods(write_csv(tmp_path / "m.csv", ",".join(openb.POD_COLUMNS_SHORT), ["z,2000,20,8,1000"]))
    assert short.num_gpu.tolist() == [8] and short.gpu_spec == ("",)


@pytest.mark.parametrize(("header", "rows", "needles"), [
    (POD_HEADER, [pod_row("x", 1000, 1, 1, 500), "y,abc,1,1,500,,LS,Running,0,,0"], [":3", "cpu_milli", "'abc'"]),
    (POD_HEADER, ["x,1000,1,1,500"], [":2", "expected 11 columns, got 5"]),
    (POD_HEADER, [pod_row("x", 1000, 1, 2, 500)], [":2", "gpu_milli", "whole GPUs"]),
    (POD_HEADER, [pod_row("x", 1000, 1, 0, 300)], [":2", "gpu_milli", "both must be 0"]),
    (POD_HEADER, [pod_row("x", 1000, 1, 1, 1500)], [":2", "gpu_milli", "out of range"]),
    ("name,cpu", ["x,1"], [":1", "unexpected header"]),
])
def test_pod_reader_errors_name_file_line_and_column(tmp_path: Path, header: str, rows: list[str],
                                                     needles: list[str]) -> None:
    path = write_csv(tmp_path / "bad.csv", header, rows)
    with pytest.raises(InputError) as exc:
        read_pods(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(path))
    for n in needles:
        assert n in msg, (n, msg)


def test_node_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"n.csv:2: field model: a node with GPUs needs a GPU model"):
        read_nodes(write_csv(tmp_path / "n.csv", NODE_HEADER, ["a,1000,10,2,"]))
    with pytest.raises(InputError, match="cannot read"):
        read_nodes(tmp_path / "missing.csv")


# -- feasibility -----------------------------------------------------------------------------------------------------


def test_gpu_spec_is_enforced() -> None:
    c = Cluster.from_nodes(node_list((8000, 1000, 2, "T4"), (8000, 1000, 2, "V100M16")))
    pods = pods_for(c, (1000, 10, 1, 500, "V100M16"), (1000, 10, 1, 500, "A10"), (1000, 10, 1, 500, ""),
                    (1000, 10, 0, 0, "A10"))
    assert c.fits(pods, 0).tolist() == [False, True]
    assert c.fits(pods, 1).tolist() == [False, False]  # no A10 node
    assert c.fits(pods, 2).tolist() == [True, True]
    assert c.fits(pods, 3).tolist() == [True, True]  # a CPU-only pod ignores gpu_spec


def test_multi_gpu_pods_need_whole_free_gpus_and_sharing_pods_one_gpu() -> None:
    c = Cluster.from_nodes(node_list((8000, 1000, 2, "T4"), (8000, 1000, 2, "T4")))
    c.gpu_free[0] = [1000, 900]  # 1.9 GPUs free, but only one whole
    c.gpu_free[1] = [400, 400]  # 0.8 free, no GPU holds 500
    pods = pods_for(c, (1000, 10, 2, 1000, ""), (1000, 10, 1, 500, ""), (1000, 10, 1, 400, ""))
    assert c.fits(pods, 0).tolist() == [False, False]
    assert c.fits(pods, 1).tolist() == [True, False]
    assert c.fits(pods, 2).tolist() == [True, True]


def test_cpu_and_memory_are_enforced() -> None:
    c = Cluster.from_nodes(node_list((4000, 100, 1, "T4"), (8000, 50, 1, "T4"), (8000, 100, 1, "T4")))
    pods = pods_for(c, (6000, 80, 1, 1000, ""))
    assert c.fits(pods, 0).tolist() == [False, False, True]


# -- policies --------------------------------------------------------------------------------------------------------


def test_bestfit_takes_the_tightest_node_and_gpu() -> None:
    c = Cluster.from_nodes(node_list((64000, 1000, 4, "T4"), (64000, 1000, 4, "T4"), (64000, 1000, 4, "T4")))
    c.gpu_free[0] = [1000, 1000, 1000, 1000]
    c.gpu_free[1] = [1000, 600, 0, 0]
    c.gpu_free[2] = [1000, 1000, 300, 0]
    pods = pods_for(c, (1000, 10, 1, 500, ""))
    assert policy("bestfit", c).place(c, pods, 0) == (1, (1,))  # 1.1 GPUs left after; GPU with 600 is tightest


def test_gpupacking_prefers_partially_used_gpus_then_used_nodes() -> None:
    c = Cluster.from_nodes(node_list((64000, 1000, 8, "G2"), (64000, 1000, 8, "G2"), (64000, 1000, 8, "G2")))
    c.gpu_free[1, 3] = 0  # node 1 used, but all its free GPUs are whole
    c.gpu_free[2, 5] = 700  # node 2 has a partially used GPU
    pods = pods_for(c, (1000, 10, 1, 500, ""), (1000, 10, 1, 1000, ""), (1000, 10, 1, 800, ""))
    p = policy("gpupacking", c)
    assert p.place(c, pods, 0) == (2, (5,))  # the shared GPU
    assert p.place(c, pods, 1)[0] in (1, 2)  # a whole GPU on a used node, never the idle node 0
    assert p.place(c, pods, 2)[0] in (1, 2)  # 800 does not fit the shared GPU: a whole GPU on a used node


def test_fgd_picks_the_node_that_fragments_least_where_bestfit_would_not() -> None:
    c = Cluster.from_nodes(node_list((8000, 1000, 1, "T4"), (8000, 1000, 1, "T4")))
    c.gpu_free[:, 0] = [1000, 600]
    wl = workload((1000, 500, 1, 1.0))  # the workload is made of 0.5-GPU pods
    pods = pods_for(c, (1000, 10, 1, 500, ""))
    # node 0 keeps 500 (still hosts a 0.5 pod: no fragment); node 1 would keep 100 that nobody can use
    assert policy("fgd", c, wl).place(c, pods, 0) == (0, (0,))
    assert policy("bestfit", c).place(c, pods, 0) == (1, (0,))


def test_fgd_chooses_the_gpu_inside_the_node_by_fragmentation() -> None:
    c = Cluster.from_nodes(node_list((8000, 1000, 2, "T4")))
    c.gpu_free[0] = [1000, 700]
    wl = workload((1000, 700, 1, 1.0))
    pods = pods_for(c, (1000, 10, 1, 300, ""))
    # GPU 0 -> [700, 700]: both still host a 0.7 pod; GPU 1 -> [1000, 400]: 400 becomes a fragment
    assert policy("fgd", c, wl).place(c, pods, 0) == (0, (0,))
    assert policy("bestfit", c).place(c, pods, 0) == (0, (1,))


def test_fgd_counts_cpu_starved_gpus_as_fragments() -> None:
    c = Cluster.from_nodes(node_list((16000, 1000, 2, "T4"), (16000, 1000, 2, "T4")))
    c.gpu_free[0] = [0, 0]  # node 0: no GPU left, eating its CPU fragments nothing
    wl = workload((8000, 1000, 1, 1.0))
    pods = pods_for(c, (12000, 10, 0, 0, ""))  # a CPU-only pod
    assert policy("fgd", c, wl).place(c, pods, 0) == (0, ())


def test_fgd_multi_gpu_pod_takes_whole_gpus_by_index() -> None:
    c = Cluster.from_nodes(node_list((64000, 1000, 4, "T4")))
    c.gpu_free[0] = [300, 1000, 1000, 1000]
    pods = pods_for(c, (1000, 10, 2, 1000, ""))
    assert policy("fgd", c).place(c, pods, 0) == (0, (1, 2))


def test_kube_scorers_least_and_most_allocated_with_first_fit_ties() -> None:
    c = Cluster.from_nodes(node_list((8000, 1000, 2, "T4"), (8000, 1000, 2, "T4"), (8000, 1000, 2, "T4")))
    c.cpu_free[1] = 2000
    c.gpu_free[1] = [1000, 0]
    pods = pods_for(c, (1000, 10, 1, 1000, ""))
    assert policy("leastallocated", c).place(c, pods, 0) == (0, (0,))  # nodes 0 and 2 tie: first
    assert policy("mostallocated", c).place(c, pods, 0) == (1, (0,))


def test_random_places_only_on_fitting_nodes() -> None:
    c = Cluster.from_nodes(node_list((8000, 1000, 2, "T4"), (8000, 1000, 2, "A10"), (500, 1000, 2, "T4")))
    pods = pods_for(c, (1000, 10, 1, 500, "T4"))
    p = policy("random", c, seed=3)
    assert {p.place(c, pods, 0)[0] for _ in range(30)} == {0}


def test_ties_follow_a_fixed_random_node_order() -> None:
    c = Cluster.from_nodes(node_list(*[(8000, 1000, 1, "T4")] * 6))
    pods = pods_for(c, (1000, 10, 1, 1000, ""))
    p = policy("bestfit", c, seed=5)
    first = p.place(c, pods, 0)
    assert first is not None and first[0] == int(np.argmin(p.rank))
    assert p.place(c, pods, 0) == first  # same state, same choice


# -- protocol --------------------------------------------------------------------------------------------------------


def test_sequence_shuffles_then_inflates_with_copies() -> None:
    pods = pod_list(*[(1000, 10, 1, 500, "")] * 10, *[(1000, 10, 0, 0, "")] * 2)  # 5 GPUs requested
    seq = trace.pod_sequence(pods, 10 * MILLI, seed=1, inflate=1.3)  # target 13 GPUs
    assert sorted(seq[:12].tolist()) == list(range(12))  # the originals first, each once
    total = int(pods.total_milli[seq].sum())
    assert 13 * MILLI - 500 < total <= 13 * MILLI
    assert not np.array_equal(seq, trace.pod_sequence(pods, 10 * MILLI, seed=2, inflate=1.3))
    assert np.array_equal(seq, trace.pod_sequence(pods, 10 * MILLI, seed=1, inflate=1.3))


def test_sequence_trims_random_pods_when_above_target() -> None:
    pods = pod_list(*[(1000, 10, 1, 1000, "")] * 20)
    seq = trace.pod_sequence(pods, 10 * MILLI, seed=0, inflate=1.3)
    assert len(seq) == 13 and len(set(seq.tolist())) == 13


def test_unallocated_at_100_averages_the_events_rounding_to_100() -> None:
    run = Run("x", 0, 1, 10_000, arrived=np.asarray([9_940, 9_990, 10_040, 10_100]),
              used=np.asarray([9_000, 9_100, 9_100, 9_200]), placed=np.ones(4, dtype=bool), seconds=0.0)
    assert run.unallocated_at(100) == pytest.approx(9.0)  # events at 99.9% and 100.4% arrived, 91% allocated
    assert run.unallocated_at(99) == pytest.approx(10.0)
    assert run.unallocated_at(102) == pytest.approx(8.0)  # no event at 102: the neighbours within 1 point
    assert [p for p, _ in run.curve(98, 103)] == [98.0, 99.0, 100.0, 101.0, 102.0]
    coarse = Run("x", 0, 1, 1_000, arrived=np.asarray([500, 1_300]), used=np.asarray([500, 900]),
                 placed=np.ones(2, dtype=bool), seconds=0.0)
    assert coarse.unallocated_at(100) == pytest.approx(50.0)  # no event near 100%: the last one before it
    assert coarse.unallocated_at(131) == pytest.approx(10.0)  # 130% is within one point
    assert np.isnan(coarse.unallocated_at(132))  # never reached
    summary = trace.summarize([run, coarse])
    assert summary[0]["unallocated_pct_at_100_mean"] == pytest.approx(29.5)
    assert summary[0]["unallocated_pct_at_100_sd"] == pytest.approx(np.std([9.0, 50.0], ddof=1), abs=1e-4)


def test_replay_accounts_arrived_and_allocated_share() -> None:
    nodes = node_list((8000, 1000, 1, "T4"))  # one GPU
    pods = pod_list((1000, 10, 1, 600, ""), (1000, 10, 1, 600, ""), (1000, 10, 1, 400, ""))
    run = trace.replay(nodes, pods, "bestfit", seed=0, inflate=0)  # no inflation: the 3 pods, shuffled
    assert run.arrived.tolist()[-1] == 1600 and len(run.placed) == 3
    req = np.diff(np.r_[0, run.arrived])
    assert run.used.tolist() == np.cumsum(req * run.placed).tolist()
    assert run.used[-1] == 1000 and int(run.placed.sum()) == 2  # 600+400 fit, in any order; one 600 never
    assert run.to_json()["engine"] == "bestfit"


class FirstFit:
    """A toy batch engine: each pod on the first node that fits, on the first GPUs that hold it."""

    def place_batch(self, cluster: Cluster, pods: Pods) -> list[trace.Placement | None]:
        out: list[trace.Placement | None] = []
        for i in range(len(pods)):
            fit = np.flatnonzero(cluster.fits(pods, i))
            if fit.size == 0:
                out.append(None)
                continue
            node, k, d = int(fit[0]), int(pods.num_gpu[i]), int(pods.gpu_milli[i])
            gpus = tuple(int(g) for g in np.flatnonzero(cluster.gpu_free[node] >= d)[:k]) if k else ()
            cluster.apply(pods, i, (node, gpus))
            out.append((node, gpus))
        return out


class Greedy:
    """A broken batch engine: everything on node 0, GPU 0."""

    def place_batch(self, cluster: Cluster, pods: Pods) -> list[trace.Placement | None]:
        return [(0, (0,) * int(pods.num_gpu[i])) for i in range(len(pods))]


def test_batch_engine_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(trace._FACTORIES, "firstfit", lambda c, w, r: FirstFit())
    nodes = node_list((8000, 1000, 2, "T4"), (8000, 1000, 2, "T4"))
    pods = pod_list(*[(1000, 10, 1, 700, "")] * 6)
    run = trace.replay(nodes, pods, "firstfit", seed=0, batch=4, inflate=0)
    assert run.batch == 4 and int(run.placed.sum()) == 4 and run.used[-1] == 2800
    monkeypatch.setitem(trace._FACTORIES, "greedy", lambda c, w, r: Greedy())
    with pytest.raises(ValueError, match="placed pod 1 infeasibly"):
        trace.replay(nodes, pods, "greedy", seed=0, batch=3, inflate=0)


def test_unwired_engines_are_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    trace.check_engines(["greedy", "cpsat"])  # wired by kai_opt.bench.batch
    monkeypatch.delitem(trace._FACTORIES, "cpsat")
    with pytest.raises(InputError, match="'cpsat' is not wired"):
        trace.check_engines(["cpsat"])
    with pytest.raises(InputError, match="'nope' is unknown"):
        trace.check_engines(["nope"])


# -- CLI -------------------------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = write_csv(tmp_path / "nodes.csv", NODE_HEADER,
                      ["n0,32000,65536,4,T4", "n1,32000,65536,4,T4", "n2,16000,32768,2,P100", "n3,8000,16384,0,"])
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        kind = i % 4
        num, milli = [(1, 500), (1, 1000), (2, 1000), (0, 0)][kind]
        spec = "P100" if i == 5 else ""
        rows.append(pod_row(f"p{i}", int(rng.integers(1, 6)) * 1000, 1024, num, milli + (i % 3) * 100 * (kind == 0),
                            spec))
    return nodes, write_csv(tmp_path / "pods.csv", POD_HEADER, rows)


def test_cli_json_end_to_end(capsys: pytest.CaptureFixture[str], tiny_trace: tuple[Path, Path],
                             tmp_path: Path) -> None:
    nodes, pods = tiny_trace
    png = tmp_path / "curve.png"
    code, out, err = run_cli(capsys, "bench", "trace", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "2",
                             "-o", "json", "--plot", str(png))
    assert code == 0, err
    data = json.loads(out)
    results = data["results"]
    default = Config().engine.value  # kai-opt's default engine runs beside the baselines, consolidation off and on
    rows = [(e, None) for e in trace.BUILTIN_ENGINES] + [(default, False), (default, True)]
    assert len(results) == 2 * len(rows)
    assert {(r["engine"], r.get("consolidation")) for r in results} == set(rows)
    assert {r["seed"] for r in results} == {42, 43} and {r["batch"] for r in results} == {50}
    for r in results:
        assert {"engine", "seed", "batch", "unallocated_pct_at_100", "curve"} <= set(r)
        assert 0 <= r["unallocated_pct_at_100"] <= 100
        assert r["curve"] and all(75 <= p <= 130 and 0 <= u <= 100 for p, u in r["curve"])
    assert [(s["engine"], s.get("consolidation")) for s in data["summary"]] == rows
    assert all(s["published_at_100"] is None for s in data["summary"])  # not the default trace
    bound = data["bound"]  # the seeds' lower bounds: below every run on the same arrivals
    assert set(bound["seeds"]) == {"42", "43"}
    for r in results:
        assert r["unallocated_pct_at_100"] >= bound["seeds"][str(r["seed"])]["any_engine"] - 0.006, r["engine"]
    assert png.stat().st_size > 0


def test_cli_table_and_markdown(capsys: pytest.CaptureFixture[str], tiny_trace: tuple[Path, Path]) -> None:
    nodes, pods = tiny_trace
    code, out, _ = run_cli(capsys, "bench", "trace", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1",
                           "--engines", "fgd,bestfit", "-o", "markdown")
    assert code == 0
    assert out.startswith("| engine |") and "| fgd |" in out and "| bestfit |" in out
    assert "- lower bound at 100% arrived" in out
    code, out, _ = run_cli(capsys, "bench", "trace", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1",
                           "--engines", "random")
    assert code == 0 and "random" in out and "published" in out


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], tiny_trace: tuple[Path, Path],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    nodes, pods = tiny_trace
    code, _, err = run_cli(capsys, "bench", "trace", "--nodes", str(nodes), "--pods", str(pods), "--engines", "nope")
    assert code == 2 and err.count("\n") == 1 and "'nope' is unknown" in err
    monkeypatch.delitem(trace._FACTORIES, "cpsat")
    code, _, err = run_cli(capsys, "bench", "trace", "--nodes", str(nodes), "--pods", str(pods), "--engines", "cpsat")
    assert code == 2 and err.count("\n") == 1 and "cpsat" in err
    monkeypatch.setattr(openb, "default_trace_dir", lambda repo_root=None: None)
    code, _, err = run_cli(capsys, "bench", "trace", "--nodes", str(nodes))
    assert code == 2 and "--pods is required" in err and err.count("\n") == 1
