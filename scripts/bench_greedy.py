#!/usr/bin/env python
"""Benchmark: the greedy engine's cycle (allocate, consolidate, reclaim, preempt, stale-gang) at scale.

Instance: models/generators `scale(nodes, 10 * nodes running pods, nodes pending pods (10%) in gangs, seed)`,
8 GPUs per node, a 4-level queue tree. The ClusterState is built once per size and cached (pickle, outside the
repository: --cache-dir, default /tmp); each size then runs in its own child process that loads the state and
runs `run_cycle` --cycles times (a cycle never changes the state, so every cycle is the same work). Printed per
size: p50 of each phase, of the greedy plan and of the whole cycle (fair share + plan + the checker + the young
garbage collection its leftovers start), the child's peak RSS (resource.getrusage ru_maxrss, the loaded state
included) and the peak PSS of the child with every process it forks (the CP-SAT worker and the second hint: shared
pages counted once), sampled on one more cycle after the timed ones (the sampler slows the cycle it watches).
Target (the issue): cycle <= 1 s and peak memory <= 2 GB at 10,000 nodes.

  scripts/bench_greedy.py                                  # 1k, 5k, 10k nodes; prints a table
  scripts/bench_greedy.py --sizes 1000 --cycles 1 --profile 25
  scripts/bench_greedy.py --sizes 10000 --actions allocate,reclaim
  scripts/bench_greedy.py --sizes 1000,5000,10000 --cycles 2 --victim-search cheapest   # victims chosen by cost
  scripts/bench_greedy.py --sizes 1000,5000,10000 --cycles 20 --engine cpsat --time-budget 1   # CP-SAT's bar
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import os
import pickle
import pstats
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET_S, TARGET_MB, TARGET_NODES = 1.0, 2048.0, 10_000  # the greedy engine's (issue 4)
CPSAT_DECIDED, CPSAT_P50_S, CPSAT_P95_S, CPSAT_MB = 0.95, 2.0, 3.0, 4096.0  # the CP-SAT engine's (issue 16): at
# every size the model decides (status not FALLBACK_GREEDY) in 19 of 20 cycles, at 10,000 nodes the whole cycle
# p50 <= 2 s and p95 <= 3 s, and the process tree's peak (PSS) within 4 GB; otherwise the statuses and notes say why
from kai_opt.actions import ACTION_ORDER as PHASES  # noqa: E402


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and all its descendants (shared pages split between sharers), MB."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup", encoding="ascii") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


class _TreeMemory:
    """Samples the PSS of this process and its children (the CP-SAT worker, the second hint) every 0.2 s."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, _tree_pss_mb(os.getpid()))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _tree_pss_mb(os.getpid()))


def state_path(cache_dir: str, n: int, seed: int) -> Path:
    """Where the scale instance's built state is cached (scripts/bench_pair.py reads it too)."""
    return Path(cache_dir) / f"kai-opt-greedy-{n}-{10 * n}-{n}-{seed}.pkl"


def _state(args: argparse.Namespace, n: int) -> Any:
    from kai_opt.state import build_state
    from models.generators import as_snapshot, scale

    path = state_path(args.cache_dir, n, args.seed)
    if path.exists():
        with path.open("rb") as f:
            return pickle.load(f)
    state = build_state(as_snapshot(scale(n, 10 * n, n, args.seed)))
    with path.open("wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    return state


def child(args: argparse.Namespace) -> dict[str, Any]:
    from kai_opt.compiled import compile_when_used
    from kai_opt.config import Config
    from kai_opt.engine import run_cycle

    compile_when_used()  # cycles of a long-lived process, as `kai-opt run` runs them (its first cycle compiles)

    n = args.child
    state = _state(args, n)
    res: dict[str, Any] = {"nodes": n, "pods": state.n_pods, "groups": state.n_groups, "rss_state_mb": _peak_mb()}
    actions = PHASES if args.actions == "all" else tuple(a.strip() for a in args.actions.split(","))
    cfg = Config.model_validate({"engine": args.engine, "solver": {"time_budget_s": args.time_budget},
                                 "victim_search": args.victim_search})
    cycles: list[dict[str, float]] = []
    prof = cProfile.Profile() if args.profile else None
    for _ in range(args.cycles):
        if prof:
            prof.enable()
        t = time.perf_counter()
        c = time.process_time()
        plan, _fs = run_cycle(state, cfg, actions=actions)
        # the young collection the cycle's leftovers start at the next allocation (run_cycle pauses the collector):
        # the cycle's cost, counted in its time
        gc.collect(0)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        if prof:
            prof.disable()
        ph = {k: float(v) for k, v in plan.phases.items()}
        ph["wall"], ph["cpu"] = wall, cpu
        # the cycle's time outside the greedy phases (checker, CP-SAT stage), per cycle: a median of these, not a
        # difference of medians (medians do not add)
        ph["rest"] = ph["total"] - ph.get("fair_share", 0.0) - sum(ph.get(k, 0.0) for k in PHASES)
        cycles.append(ph)
        res["binds"] = sum(1 for p in plan.placements if not p.pipelined)
        res["pipelined"] = sum(1 for p in plan.placements if p.pipelined)
        res["evictions"] = len(plan.evictions)
        res["pending_groups"] = len(plan.pending)
        if plan.solver is not None:
            res.setdefault("status", []).append(plan.solver.status)
            res.setdefault("gap", []).append(plan.solver.gap)
            res.setdefault("notes", []).append(plan.solver.note or "")
            ph["solver_wall"] = float(plan.solver.wall_s or 0.0)
    res["p50"] = {k: statistics.median(c[k] for c in cycles) for k in cycles[0]}
    totals = sorted(c["total"] for c in cycles)
    res["p95_total"] = totals[min(len(totals) - 1, math.ceil(0.95 * len(totals)) - 1)]
    # memory on one more cycle, untimed: the sampler's page-table walks (smaps_rollup of a 1 GB process and its
    # forked workers, every 0.2 s) take CPU and the address-space lock from the cycle it watches (every cycle does
    # the same work, so this one's peak is theirs)
    tree = _TreeMemory()
    run_cycle(state, cfg, actions=actions)
    res["tree_pss_mb"] = tree.stop()
    res["peak_mb"] = _peak_mb()
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.profile)
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
        print(buf.getvalue(), file=sys.stderr)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,10000", help="comma-separated node counts")
    ap.add_argument("--cycles", type=int, default=3, help="cycles per size (p50 shown)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--actions", default="all", help="comma-separated actions, or all")
    ap.add_argument("--engine", default="greedy", choices=("greedy", "cpsat"),
                    help="cpsat: the greedy plan, then CP-SAT under --time-budget (statuses printed)")
    ap.add_argument("--time-budget", type=float, default=1.0, help="CP-SAT's solver.time_budget_s")
    ap.add_argument("--victim-search", default="auto", choices=("auto", "kai", "cheapest"),
                    help="the config's victim_search (auto: its default)")
    ap.add_argument("--cache-dir", default="/tmp", help="where the built states are cached (pickle)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per size before giving up")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N cProfile rows (stderr)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    print(f"greedy cycle, actions {args.actions}, p50 of {args.cycles} cycles (seconds); peak RSS of the process "
          "that loaded the state and ran the cycles")
    rest = "checker" if args.engine == "greedy" else "chk+cpsat"  # the cycle's time outside the greedy phases
    head = (f"{'nodes':>6} {'pods':>7} " + " ".join(f"{p[:8]:>8}" for p in PHASES)
            + f" {'fairshr':>8} {rest:>8} {'cycle':>8} {'cpu':>8} {'state MB':>9} {'peak MB':>8}  plan")
    print(head)
    ok, measured = True, False
    for n in (int(s) for s in args.sizes.split(",")):
        cmd = [sys.executable, __file__, "--child", str(n), "--cycles", str(args.cycles), "--seed", str(args.seed),
               "--actions", args.actions, "--cache-dir", args.cache_dir, "--profile", str(args.profile),
               "--engine", args.engine, "--time-budget", str(args.time_budget), "--victim-search", args.victim_search]
        try:
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{n:>6} timed out after {args.timeout:.0f} s")
            ok = False
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        p = r["p50"]
        checker = p["rest"]
        print(f"{n:>6} {r['pods']:>7} " + " ".join(f"{p.get(k, float('nan')):>8.3f}" for k in PHASES)
              + f" {p.get('fair_share', 0.0):>8.3f} {checker:>8.3f} {p['total']:>8.3f} {p['cpu']:>8.3f}"
              + f" {r['rss_state_mb']:>9.0f} {r['peak_mb']:>8.0f}  {r['binds']} binds, {r['pipelined']} pipelined,"
              + f" {r['evictions']} evictions, {r['pending_groups']} groups pending")
        if args.cycles > 1 or args.engine != "greedy":
            statuses = ", ".join(f"{k} x{v}" for k, v in sorted(Counter(r.get("status", [])).items()))
            print(f"{'':>6} cycle p50 {p['total']:.3f} s, p95 {r['p95_total']:.3f} s over {args.cycles} cycles; "
                  f"engine {args.engine}; solver status {statuses}; CP-SAT wall p50 {p.get('solver_wall', 0.0):.3f} s")
        print(f"{'':>6} peak memory of the process and its children (CP-SAT worker, second hint), PSS sampled "
              f"every 0.2 s over one more (untimed) cycle: {r['tree_pss_mb']:.0f} MB")
        if args.engine != "greedy":
            st_list = r.get("status", [])
            decided = sum(1 for x in st_list if x != "FALLBACK_GREEDY")
            chosen = sum(1 for x in st_list if x in ("OPTIMAL", "FEASIBLE"))
            gaps = [g for x, g in zip(st_list, r.get("gap", []), strict=True)
                    if x != "FALLBACK_GREEDY" and g is not None]
            gap = f"{statistics.median(gaps):.2%}" if gaps else "n/a"
            print(f"{'':>6} the model decided {decided} of {len(st_list)} cycles ({chosen} with its own plan, "
                  f"{decided - chosen} keeping the equal greedy plan); gap to its bound p50 {gap}")
            notes = r.get("notes", [])
            for note, k in Counter(notes).most_common(3):
                print(f"{'':>6} {k} x: {note[:300]}")
            # every fallback's note (the most common ones above are usually the decided cycles')
            for i, (x, note) in enumerate(zip(st_list, notes, strict=True)):
                if x == "FALLBACK_GREEDY":
                    print(f"{'':>6} cycle {i} FALLBACK_GREEDY: {note[:300]}")
            ok &= decided >= CPSAT_DECIDED * len(st_list) and r["tree_pss_mb"] <= CPSAT_MB
        if n >= TARGET_NODES:
            measured = True
            if args.engine == "greedy":
                ok &= p["total"] <= TARGET_S and r["peak_mb"] <= TARGET_MB
            else:
                ok &= p["total"] <= CPSAT_P50_S and r["p95_total"] <= CPSAT_P95_S
    if args.engine == "greedy":
        target = f"cycle <= {TARGET_S:.0f} s, peak <= {TARGET_MB:.0f} MB"
    else:
        target = (f"the model decides (not FALLBACK_GREEDY) in {CPSAT_DECIDED:.0%} of the cycles at every size "
                  f"within the {args.time_budget:g} s budget, cycle p50 <= {CPSAT_P50_S:g} s and p95 <= "
                  f"{CPSAT_P95_S:g} s, process tree peak <= {CPSAT_MB:.0f} MB")
    print(f"target at {TARGET_NODES} nodes: {target}: "
          f"{('met' if ok else 'NOT met') if measured else 'not measured (no size that large)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
