"""`kai-opt bench run`: the quick benchmark end to end (structure and invariants: every engine within the LP
bound, ratios in [0, 1], baselines' plans accepted by the checker), the LP bound on hand-made instances whose
optimum is known, the baselines' gang and limit semantics, and the command's one-line user errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import node, pod, podgroup, queue, snapshot, state

from kai_opt.bench import baselines, bound, metrics, report, runner
from kai_opt.bench.instances import QUICK_SIZE, families
from kai_opt.cli.main import main
from kai_opt.config import Config, parse_config
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.plan import Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import ClusterState
from kai_opt.validation import plan_summary

EPS = 1e-6


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# -- end to end ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_end_to_end(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "bench", "run", "--quick", "-o", "json", "--plot", str(tmp_path / "plots"))
    assert code == 0, err
    doc = json.loads(out)
    fams = list(families())
    results = doc["results"]
    assert [(r["family"], r["engine"]) for r in results] == [(f, e) for f in fams for e in runner.DEFAULT_ENGINES]
    assert [i["instance"] for i in doc["instances"]] == [f"{f}-{QUICK_SIZE}-s0" for f in fams]
    assert doc["settings"]["quick"] and doc["settings"]["repeats"] == 1
    for r in results:
        where = f"{r['instance']}/{r['engine']}"
        assert {"instance", "family", "nodes", "engine", "gpus_allocated", "lp_bound", "wall_s"} <= set(r), where
        assert r["error"] is None and r["checked"] is True, (where, r["error"])
        assert r["nodes"] == QUICK_SIZE
        assert r["gpus_allocated"] <= r["lp_bound"] + EPS, where
        assert r["gpus_allocated_weighted"] <= r["lp_bound_weighted"] + EPS, where
        assert r["lp_bound_place_only"] <= r["lp_bound"] + EPS
        for key in ("ratio", "ratio_weighted", "ratio_place_only", "ratio_place_only_weighted"):
            assert r[key] is None or 0 <= r[key] <= 1 + EPS, (where, key, r[key])
        assert r["ratio"] is not None and r["ratio_weighted"] is not None
        assert 0 <= r["unallocated_pct"] <= 100 and 0 <= r["fragmentation_pct"] <= 100 + EPS
        assert r["wall_s"] > 0 and r["wall_p95_s"] >= r["wall_s"] and r["repeats"] == 1
        assert "cycle" in r["phases"] and "state" in r["phases"]
        assert r["peak_rss_mb"] is None or r["peak_rss_mb"] > 0
        if r["engine"] in baselines.BASELINES:
            assert r["evictions"] == 0 and r["moves"] == 0 and r["ratio_place_only"] is not None
            assert r["gpus_allocated"] <= r["lp_bound_place_only"] + EPS, where
        else:
            assert r["solver_status"]
    for i in doc["instances"]:
        assert i["lp"]["status"] == "optimal" and i["lp_place_only"]["status"] == "optimal"
    assert {s["engine"] for s in doc["summary"]} == set(runner.DEFAULT_ENGINES)
    assert (tmp_path / "plots" / "ratio_by_family.png").stat().st_size > 0
    assert (tmp_path / "plots" / "cycle_time_vs_size.png").stat().st_size > 0
    md = report.markdown(results, doc["notes"])
    assert md.startswith("**Ratio to the LP bound") and "| greedy |" in md and "| fgd |" in md


def test_user_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for args, text in [(("--families", "gangs,nope"), "unknown family 'nope'"),
                       (("--engines", "greedy,magic"), "unknown engine 'magic'"),
                       (("--sizes", "100,abc"), "not a node count"),
                       (("--sizes", "5"), "out of range"),
                       (("--sizes", "20000"), "out of range"),
                       (("--seeds", "0"), "seeds must be at least 1"),
                       (("--repeats", "0"), "repeats must be at least 1"),
                       (("--time-budget", "0"), "out of range")]:
        code, _, err = run_cli(capsys, "bench", "run", *args)
        assert code == 2 and err.count("\n") == 1 and text in err, (args, err)


# -- the LP bound on hand-made instances -----------------------------------------------------------------------------


def _solve(objs: list[RawObject], *, movable: bool = True) -> tuple[bound.Bound, ClusterState]:
    st = state(objs)
    return bound.lp_bound(st, compute_fair_share(st), movable=movable), st


def test_bound_is_capacity_and_weights_split_a_gang_fractionally() -> None:
    """8 GPUs, gangs of 4 (priority 100) and 8 (priority 50) GPUs: 8 GPUs; weighted 4 x 1 + half of the big gang
    (4 x 0.5) = 6, where the best integral plan only reaches 4."""
    b, _ = _solve([node("n1", gpus=8), queue("q"),
                   podgroup("hi", "q", min_member=2, priority_class="build"),
                   *[pod(f"hi-{i}", "hi", gpus=2, queue_name="q") for i in range(2)],
                   podgroup("lo", "q", min_member=2, priority_class="train"),
                   *[pod(f"lo-{i}", "lo", gpus=4, queue_name="q") for i in range(2)]])
    assert b.status == "optimal"
    assert b.gpus == pytest.approx(8.0) and b.weighted == pytest.approx(6.0)


def test_bound_counts_cpu_and_queue_limits() -> None:
    """8 one-GPU pods of 4 CPUs on a 16-CPU node: 4 fit. A GPU limit of 3 on their queue: 3."""
    pods = [podgroup("g", "q", min_member=1), *[pod(f"p{i}", "g", gpus=1, cpu="4", queue_name="q")
                                                for i in range(8)]]
    b, _ = _solve([node("n1", gpus=8, cpu="16"), queue("q"), *pods])
    assert b.gpus == pytest.approx(4.0)
    b, _ = _solve([node("n1", gpus=8, cpu="64"), queue("q", gpu=(0, 1, 3)), *pods])
    assert b.gpus == pytest.approx(3.0)


def test_bound_moves_preemptible_running_pods_only() -> None:
    """2 GPUs held by a preemptible (train) and a non-preemptible (inference) pod; a build pod of 1 GPU waits.
    GPUs stay 2; weighted: 1.25 (fixed) + max(0.5 kept, 1.0 placed) = 2.25, or 1.75 with running pods fixed."""
    objs = [node("n1", gpus=2), queue("q"),
            podgroup("tr", "q", priority_class="train"), pod("tr-0", "tr", gpus=1, node_name="n1", queue_name="q"),
            podgroup("inf", "q", priority_class="inference"),
            pod("inf-0", "inf", gpus=1, node_name="n1", queue_name="q"),
            podgroup("b", "q", priority_class="build"), pod("b-0", "b", gpus=1, queue_name="q")]
    b, _ = _solve(objs)
    assert b.gpus == pytest.approx(2.0) and b.weighted == pytest.approx(2.25)
    assert b.fixed_gpus == pytest.approx(1.0)
    b, _ = _solve(objs, movable=False)
    assert b.gpus == pytest.approx(2.0) and b.weighted == pytest.approx(1.75)


def test_bound_respects_device_shares() -> None:
    """Two devices half used by non-preemptible shares: a whole-GPU pod fits nowhere; of three half-GPU pods,
    two fit (one per device)."""
    running = [podgroup("r", "q", min_member=1, priority_class="build"),
               *[pod(f"r{i}", "r", gpus=0.5, node_name="n1", queue_name="q",
                     annotations={"kai-opt.io/gpu-devices": str(i)}) for i in range(2)]]
    whole = [podgroup("w", "q", priority_class="build"), pod("w-0", "w", gpus=1, queue_name="q")]
    b, _ = _solve([node("n1", gpus=2), queue("q"), *running, *whole])
    assert b.gpus == pytest.approx(1.0)
    halves = [podgroup("h", "q", min_member=1), *[pod(f"h{i}", "h", gpus=0.5, queue_name="q") for i in range(3)]]
    b, _ = _solve([node("n1", gpus=2), queue("q"), *running, *halves])
    assert b.gpus == pytest.approx(2.0)


def test_bound_drops_a_gang_with_a_pod_that_fits_nowhere_but_keeps_elastic_pods() -> None:
    gang = [podgroup("g", "q", min_member=2), pod("g-0", "g", gpus=1, queue_name="q"),
            pod("g-1", "g", gpus=1, cpu="500", queue_name="q")]
    b, _ = _solve([node("n1", gpus=8, cpu="64"), queue("q"), *gang])
    assert b.gpus == pytest.approx(0.0)
    elastic = [podgroup("e", "q", min_member=1), *[pod(f"e{i}", "e", gpus=4, queue_name="q") for i in range(3)]]
    b, _ = _solve([node("n1", gpus=8), queue("q"), *elastic])
    assert b.gpus == pytest.approx(8.0)


def test_bound_is_above_greedy_and_baselines_on_a_mixed_instance() -> None:
    objs: list[RawObject] = [node(f"n{i}", gpus=4, cpu="32") for i in range(3)] + [queue("a"), queue("b")]
    sizes = [3, 2, 2, 1, 4, 1]
    for j, k in enumerate(sizes):
        q = "ab"[j % 2]
        objs += [podgroup(f"g{j}", q, min_member=2, priority_class=["train", "build"][j % 2]),
                 *[pod(f"g{j}-{i}", f"g{j}", gpus=k, cpu="4", queue_name=q) for i in range(2)]]
    st = state(objs)
    fs = compute_fair_share(st)
    b = bound.lp_bound(st, fs)
    got: list[Any] = []
    for engine in ("greedy", "cpsat"):
        plan, _ = run_cycle(st, parse_config({"engine": engine, "solver": {"deterministic": True}}))
        got.append(plan_summary(st, plan)["gpus_allocated_after"])
    for name in baselines.BASELINES:
        p = baselines.baseline_plan(st, fs, name)
        baselines.check(st, p, fs, Config())
        got.append(plan_summary(st, p)["gpus_allocated_after"])
    assert max(got) <= b.gpus + EPS and b.gpus <= 12 + EPS


# -- baselines ------------------------------------------------------------------------------------------------------


def test_baselines_place_gangs_whole_or_not_at_all_within_queue_limits() -> None:
    objs = [node("n1", gpus=4), node("n2", gpus=4), queue("q", gpu=(0, 1, 6)),
            podgroup("big", "q", min_member=3, created_min=0), *[pod(f"big-{i}", "big", gpus=3, queue_name="q")
                                                                 for i in range(3)],
            podgroup("mid", "q", min_member=2, created_min=1), *[pod(f"mid-{i}", "mid", gpus=2, queue_name="q")
                                                                 for i in range(2)],
            podgroup("one", "q", min_member=1, created_min=2), *[pod(f"one-{i}", "one", gpus=2, queue_name="q")
                                                                 for i in range(2)]]
    st = state(objs)
    fs = compute_fair_share(st)
    for name in baselines.BASELINES:
        plan = baselines.baseline_plan(st, fs, name, seed=1)
        baselines.check(st, plan, fs, Config())
        groups = {st.pg_keys[int(st.pod_pg[p.pod])].split("/")[-1] for p in plan.placements}
        # big (9 GPUs) never fits 2x4; mid takes 4; the limit of 6 leaves room for one pod of `one`
        assert groups == {"mid", "one"}, name
        assert len(plan.placements) == 3 and sum(len(p.devices) for p in plan.placements) == 6


def test_baselines_honour_a_required_topology_domain() -> None:
    objs: list[RawObject] = [node(f"n{i}", gpus=4, labels={"rack": f"r{i // 2}"}) for i in range(4)]
    objs += [RawObject("Topology", {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
                                    "metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": "rack"}]}}),
             queue("q"), podgroup("run", "q", min_member=1, priority_class="build"),
             pod("run-0", "run", gpus=3, node_name="n0", queue_name="q",
                 annotations={"kai-opt.io/gpu-devices": "0,1,2"}),
             podgroup("g", "q", min_member=2, topologyConstraint={"topology": "t", "requiredTopologyLevel": "rack"}),
             *[pod(f"g-{i}", "g", gpus=4, queue_name="q") for i in range(2)]]
    st = state(objs)
    fs = compute_fair_share(st)
    for name in baselines.BASELINES:
        plan = baselines.baseline_plan(st, fs, name)
        baselines.check(st, plan, fs, Config())
        assert sorted(st.node_names[p.node] for p in plan.placements) == ["n2", "n3"], name


def test_engine_runs_are_isolated_and_timed() -> None:
    objs = [node("n1", gpus=8), queue("q"), podgroup("g", "q", min_member=2),
            *[pod(f"g-{i}", "g", gpus=2, queue_name="q") for i in range(2)]]
    snap = snapshot(objs)
    for engine in ("greedy", "fgd"):
        run = runner.execute(engine, snap, Config(), repeats=2)
        assert run.error is None and run.plan is not None and len(run.plan.placements) == 2
        assert len(run.phases) == 2 and all(p["cycle"] >= p["state"] > 0 for p in run.phases)
        assert run.peak_rss_mb is not None and run.peak_rss_mb > 0 and run.rss_growth_mb is not None
    assert np.isfinite(runner.execute("bestfit", snap, Config(), isolate=False).phases[0]["cycle"])


# -- metrics ---------------------------------------------------------------------------------------------------------


def test_fragmentation_counts_free_gpus_the_pending_shapes_cannot_use() -> None:
    """n1 keeps 1 GPU free, n2 4: the pending shape (2 GPUs) cannot use n1's, so 1 of 5 free GPUs (20%)."""
    objs = [node("n1", gpus=4), node("n2", gpus=4), queue("q"),
            podgroup("r", "q", priority_class="build"),
            pod("r-0", "r", gpus=3, node_name="n1", queue_name="q", annotations={"kai-opt.io/gpu-devices": "0,1,2"}),
            podgroup("w", "q", priority_class="build"), pod("w-0", "w", gpus=2, queue_name="q")]
    st = state(objs)
    gpus, pct = metrics.Fragmentation(st).gpus(st, Plan(engine="none"))
    assert gpus == pytest.approx(1.0) and pct == pytest.approx(20.0)


def test_fairness_is_the_largest_leaf_deviation_from_fair_share() -> None:
    objs = [node("n1", gpus=8), queue("q"), podgroup("g", "q", min_member=2),
            *[pod(f"g-{i}", "g", gpus=1, queue_name="q") for i in range(2)]]
    st = state(objs)
    fs = compute_fair_share(st)
    assert metrics.fairness(st, fs, Plan(engine="none")) == pytest.approx(2.0)  # fair share 2 (its request), holds 0
    plan = baselines.baseline_plan(st, fs, "bestfit")
    assert metrics.fairness(st, fs, plan) == pytest.approx(0.0)
    assert metrics.gpus_allocated(st, plan) == pytest.approx((2.0, 1.0))  # train: weight 0.5
