"""Running `kai-opt bench run`: every engine on every instance, `repeats` times, each (instance, engine) in a
forked child process so its peak memory is its own; then the bound, the checker and the metrics in the parent.

A repeat is one whole cycle from the parsed snapshot: build the ClusterState, then the engine (kai-opt's
`run_cycle`, or a baseline: fair share for the queue limits, then placing). Its phases are timed; `wall_s` is the
median cycle. Peak memory is the child's peak resident set (ru_maxrss, the solver's own child included), and its
growth over the process it was forked from.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kai_opt.bench import baselines, metrics
from kai_opt.bench.bound import Bound, lp_bound
from kai_opt.bench.instances import Instance
from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config, Engine
from kai_opt.fairshare import FairShare, compute_fair_share
from kai_opt.plan import Plan
from kai_opt.snapshot import Snapshot
from kai_opt.state import R_GPU, ClusterState, build_state

KAI_ENGINES = ("greedy", "cpsat")
DEFAULT_ENGINES = (*KAI_ENGINES, "leastallocated", "mostallocated", "fgd", "bestfit", "dotprod", "gpupacking")
ALL_ENGINES = (*DEFAULT_ENGINES, "random")

Progress = Callable[[str, int], None]  # (what is running now, steps done since the last call)


@dataclass
class EngineRun:
    engine: str
    plan: Plan | None = None
    phases: list[dict[str, float]] = field(default_factory=list)  # seconds per phase, per repeat ("cycle": all)
    peak_rss_mb: float | None = None
    rss_growth_mb: float | None = None
    error: str | None = None


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cycle(engine: str, snapshot: Snapshot, config: Config, seed: int) -> tuple[Plan, dict[str, float]]:
    t0 = time.perf_counter()
    state = build_state(snapshot, default_queue=config.default_queue)
    phases = {"state": time.perf_counter() - t0}
    if engine in KAI_ENGINES:
        from kai_opt.engine import run_cycle

        plan, _ = run_cycle(state, config, engine=Engine(engine))
        phases.update({k: v for k, v in plan.phases.items() if k != "total"})
        if engine == "cpsat":
            s = plan.solver
            phases.update({"cpsat_build": s.build_s, "cpsat_solve": s.solve_s, "cpsat_decode": s.decode_s})
    else:
        t = time.perf_counter()
        fs = compute_fair_share(state)
        phases["fair_share"] = time.perf_counter() - t
        t = time.perf_counter()
        plan = baselines.baseline_plan(state, fs, engine, seed)
        phases["place"] = time.perf_counter() - t
    phases["cycle"] = time.perf_counter() - t0
    return plan, phases


def _repeats(engine: str, snapshot: Snapshot, config: Config, repeats: int, seed: int) -> EngineRun:
    out = EngineRun(engine)
    try:
        for _ in range(repeats):
            out.plan, phases = _cycle(engine, snapshot, config, seed)
            out.phases.append(phases)
    except Exception as exc:  # an engine bug: reported on its row, the benchmark goes on
        out.plan = None
        out.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        out.error += " | " + traceback.format_exc(limit=-1).strip().splitlines()[-3].strip()[:200]
    return out


def _child(conn: Any, engine: str, snapshot: Snapshot, config: Config, repeats: int, seed: int) -> None:
    base = _rss_mb()
    run = _repeats(engine, snapshot, config, repeats, seed)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    run.peak_rss_mb = round(max(own, kids), 1)
    run.rss_growth_mb = round(max(own, kids) - base, 1)
    conn.send(run)
    conn.close()


def execute(engine: str, snapshot: Snapshot, config: Config, repeats: int = 1, seed: int = 0, *,
            isolate: bool = True) -> EngineRun:
    """Run `engine` `repeats` times on the snapshot, in a forked child when `isolate` (and fork exists)."""
    if not isolate or "fork" not in mp.get_all_start_methods():
        return _repeats(engine, snapshot, config, repeats, seed)
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, engine, snapshot, config, repeats, seed))
    proc.start()
    child.close()
    try:
        run = parent.recv()
    except EOFError:
        run = EngineRun(engine, error=f"the engine's process died (exit code {proc.exitcode})")
    proc.join()
    parent.close()
    return run


# -- one instance ----------------------------------------------------------------------------------------------------


def run_instance(inst: Instance, engines: Sequence[str], config: Config, repeats: int,
                 progress: Progress | None = None, *, isolate: bool = True) -> tuple[dict[str, Any],
                                                                                    list[dict[str, Any]]]:
    """(instance description, one result row per engine)."""
    def step(what: str, n: int = 0) -> None:
        if progress is not None:
            progress(f"{inst.name}: {what}", n)

    step("generating")
    t = time.perf_counter()
    snapshot = inst.snapshot()
    gen_s = time.perf_counter() - t
    state = build_state(snapshot, default_queue=config.default_queue)
    fs = compute_fair_share(state)
    step("LP bounds")
    bound = lp_bound(state, fs)
    place_only = lp_bound(state, fs, movable=False)
    empty = Plan(engine="none")
    before, _ = metrics.gpus_allocated(state, empty)
    total = float(state.node_alloc[:, R_GPU].sum()) / 1000
    frag = metrics.Fragmentation(state)
    info = {"instance": inst.name, "family": inst.family, "nodes": inst.nodes, "seed": inst.seed,
            "gpus_total": total, "gpus_before": round(before, 4), "pods": state.n_pods,
            **metrics.pending_before(state), "generate_s": round(gen_s, 3), "lp": bound.as_dict(),
            "lp_place_only": place_only.as_dict()}
    step("", 1)
    rows = []
    for engine in engines:
        step(engine)
        run = execute(engine, snapshot, config, repeats, inst.seed, isolate=isolate)
        rows.append(_row(inst, state, fs, config, (bound, place_only), before, total, frag, run))
        step("", 1)
    return info, rows


def _row(inst: Instance, state: ClusterState, fs: FairShare, config: Config, bounds: tuple[Bound, Bound],
         before: float, total: float, frag: metrics.Fragmentation, run: EngineRun) -> dict[str, Any]:
    bound, place_only = bounds
    row: dict[str, Any] = {"instance": inst.name, "family": inst.family, "nodes": inst.nodes, "seed": inst.seed,
                           "engine": run.engine, "gpus_total": total, "gpus_before": round(before, 4),
                           "lp_bound": round(bound.gpus, 4), "lp_bound_weighted": round(bound.weighted, 4),
                           "lp_bound_place_only": round(place_only.gpus, 4),
                           "lp_bound_place_only_weighted": round(place_only.weighted, 4)}
    if run.plan is None:
        return {**row, "error": run.error or "no plan"}
    plan = run.plan
    try:
        if run.engine in KAI_ENGINES:
            check_plan(state, plan, fs, config)
        else:
            baselines.check(state, plan, fs, config)
        checked, error = True, None
    except PlanViolation as exc:
        checked, error = False, f"checker: {exc}"[:500]
    alloc, alloc_w = metrics.gpus_allocated(state, plan)
    frag_gpus, frag_pct = frag.gpus(state, plan)
    cycles = [p["cycle"] for p in run.phases]
    fair_dev = metrics.fairness(state, fs, plan)
    headroom = bound.gpus - before
    done = metrics.counts(state, plan)
    placing_only = done["evictions"] == 0 and done["moves"] == 0  # the placement-only bound applies
    row.update({
        "gpus_allocated": round(alloc, 4), "gpus_allocated_weighted": round(alloc_w, 4),
        "ratio": metrics.ratio(alloc, bound.gpus), "ratio_weighted": metrics.ratio(alloc_w, bound.weighted),
        "ratio_place_only": metrics.ratio(alloc, place_only.gpus) if placing_only else None,
        "ratio_place_only_weighted": metrics.ratio(alloc_w, place_only.weighted) if placing_only else None,
        "gain_ratio": round((alloc - before) / headroom, 6) if headroom > 1e-9 else None,
        "unallocated_pct": round(100.0 * (1 - alloc / total), 4) if total else None,
        "fragmentation_gpus": round(frag_gpus, 4), "fragmentation_pct": round(frag_pct, 4),
        **done,
        "fairness_max_dev_gpus": round(fair_dev, 4),
        "fairness_max_dev_pct": round(100.0 * fair_dev / total, 4) if total else None,
        "wall_s": metrics.percentiles(cycles)["p50"], "wall_p95_s": metrics.percentiles(cycles)["p95"],
        "phases": metrics.phase_percentiles(run.phases), "repeats": len(run.phases),
        "peak_rss_mb": run.peak_rss_mb, "rss_growth_mb": run.rss_growth_mb,
        "solver_status": plan.solver.status, "checked": checked, "error": error,
    })
    return row
