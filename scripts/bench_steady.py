#!/usr/bin/env python
"""Benchmark: the steady-state in-cluster cycle (issue 16): a watch cache holding the scale instance (N nodes x 8
GPUs, 10 running pods per node), where every cycle a share of the pods changes (whole jobs finish, as many new
pending jobs arrive), and the cycle runs what `kai-opt run` runs on the leader: the pod grouper's pass over our pods,
cache snapshot, state build, the engine, the binder's assumptions; the status work is timed on its own.

No apiserver: the objects go into `ClusterCache` as watch events, binds are assumed the way the binder assumes them
and confirmed by a MODIFIED event the next cycle, as the watch would. Each phase's wall and CPU time per cycle is
reported as p50 / p95 over the measured cycles (the first, which parses every object, is reported apart).

  scripts/bench_steady.py                               # 10,000 nodes, 1% of pods changing, 10 cycles, greedy
  scripts/bench_steady.py --nodes 2000 --engine cpsat --cycles 5 --profile 20
  scripts/bench_steady.py --nodes 5000 --status --profile 30      # also StatusWriter.update, profiled alone

With --status a StatusWriter on the same cache computes each cycle's status (queue positions, then `update`, each
timed as its own phase); its writes are recorded instead of sent and show up in the cache before the next cycle,
as the watch would show them (Events are recorded and dropped). --profile then profiles `update` alone.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _objects(nodes: int, running: int, seed: int, queues: int) -> list[dict[str, Any]]:
    from models.generators import scale

    out = []
    for i, raw in enumerate(scale(nodes, running, 0, seed, n_queues=queues)):
        obj = copy.deepcopy(raw.obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{i}")
        meta.setdefault("resourceVersion", "1")
        out.append(obj)
    return out


class Churn:
    """Whole jobs finish (their pods and PodGroup are deleted); new pending jobs of the same shapes arrive."""

    def __init__(self, objs: list[dict[str, Any]], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.groups: dict[str, dict[str, Any]] = {}
        for o in objs:
            if o["kind"] == "Pod":
                key = f"{o['metadata']['namespace']}/{o['metadata']['annotations']['pod-group-name']}"
                self.by_group[key].append(o)
            elif o["kind"] == "PodGroup":
                self.groups[f"{o['metadata']['namespace']}/{o['metadata']['name']}"] = o
        self.serial = 0

    def step(self, n_pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(deleted, added) objects: running jobs of about n_pods / 2 pods finish, as many pods arrive pending."""
        keys = [k for k in self.by_group if all((p["spec"].get("nodeName")) for p in self.by_group[k])]
        order = self.rng.permutation(len(keys))
        deleted: list[dict[str, Any]] = []
        added: list[dict[str, Any]] = []
        gone = 0
        for i in order:
            if gone >= n_pods // 2:
                break
            k = keys[int(i)]
            pods = self.by_group.pop(k)
            gone += len(pods)
            deleted.extend(pods)
            if k in self.groups:
                deleted.append(self.groups.pop(k))
            template_group = copy.deepcopy(deleted[-1] if deleted[-1]["kind"] == "PodGroup" else None)
            self.serial += 1
            name = f"steady-{self.serial}"
            ns = pods[0]["metadata"]["namespace"]
            if template_group is not None:
                g = template_group
                g["metadata"].update(name=name, uid=f"g-{name}", resourceVersion="1")
                g.pop("status", None)
                added.append(g)
                self.groups[f"{ns}/{name}"] = g
            for j, p in enumerate(pods):
                q = copy.deepcopy(p)
                q["metadata"].update(name=f"{name}-{j}", uid=f"p-{name}-{j}", resourceVersion="1")
                q["metadata"]["annotations"] = {k2: v for k2, v in q["metadata"]["annotations"].items()
                                                if k2 != "kai-opt.io/gpu-devices"}
                q["metadata"]["annotations"]["pod-group-name"] = name
                q["spec"].pop("nodeName", None)
                q["status"] = {"phase": "Pending"}
                added.append(q)
                self.by_group[f"{ns}/{name}"].append(q)
        return deleted, added


class RecordingPool:
    """A WorkPool stand-in: the latest job per key is kept, and run (off the clock) by `run()`."""

    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}

    def submit(self, key: str, job: Any, *, replace: bool = False) -> bool:
        if key in self.jobs and not replace:
            return False
        self.jobs[key] = job
        return True

    def run(self) -> int:
        jobs, self.jobs = self.jobs, {}
        for job in jobs.values():
            job()
        return len(jobs)


def _land(cache: Any, cache_mod: Any, writes: list[tuple[str, dict[str, Any]]]) -> int:
    """The recorded status and annotation patches as the watch shows them: MODIFIED objects in the cache."""
    from kai_opt.k8s.chart_values import merge as merge_patch
    kinds = {r.plural: r for r in cache_mod.SCHEDULING_KINDS}
    n = 0
    for path, body in writes:
        parts = path.strip("/").split("/")
        if parts[-1] == "status":
            parts = parts[:-1]
        plural, name = parts[-2], parts[-1]
        ns = parts[parts.index("namespaces") + 1] if "namespaces" in parts else None
        res = kinds.get(plural)
        obj = cache.get(res.api_version, res.kind, ns, name) if res is not None else None
        if obj is None:
            continue
        new = merge_patch(obj, body)  # (Helm's values rule is the JSON merge patch's: RFC 7386)
        new["metadata"] = {**new["metadata"],
                           "resourceVersion": str(int(obj["metadata"].get("resourceVersion") or 1) + 1)}
        cache._apply(res, "MODIFIED", new)
        n += 1
    return n


def _res(cache_mod: Any, kind: str) -> Any:
    return next(r for r in cache_mod.SCHEDULING_KINDS if r.kind == kind)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pods-per-node", type=int, default=10)
    ap.add_argument("--queues", type=int, default=1_000)
    ap.add_argument("--change", type=float, default=0.01, help="share of the pods changing per cycle")
    ap.add_argument("--cycles", type=int, default=10, help="measured cycles (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="cycles before the measured ones (with --status use 2: the first cycle's status writes "
                         "land in the second, which computes every PodGroup again once)")
    ap.add_argument("--engine", default="greedy")
    ap.add_argument("--time-budget", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--notes", action="store_true", help="print each cycle's solver note")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the measured cycles (with --status: StatusWriter.update alone), top N rows")
    ap.add_argument("--status", action="store_true",
                    help="also time the cycle's status work (queue positions, StatusWriter.update) on the cache")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args()

    from kai_opt.compiled import compile_when_used
    from kai_opt.config import Config
    from kai_opt.engine import run_cycle
    from kai_opt.gcpause import gc_paused
    from kai_opt.k8s import cache as cache_mod
    from kai_opt.k8s import grouper
    from kai_opt.state import build_state

    compile_when_used()  # as `kai-opt run` does
    t = time.perf_counter()
    objs = _objects(args.nodes, args.nodes * args.pods_per_node, args.seed, args.queues)
    gen_s = time.perf_counter() - t
    n_pods = sum(o["kind"] == "Pod" for o in objs)
    cache = cache_mod.ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS)  # type: ignore[arg-type]
    kinds = {r.kind: r for r in cache_mod.SCHEDULING_KINDS}
    for o in objs:
        res = kinds.get(o["kind"])
        if res is not None:
            cache._apply(res, "ADDED", o)
    config = Config.model_validate({"engine": args.engine, "solver": {"time_budget_s": args.time_budget}})
    names = tuple(config.scheduler_names)
    churn = Churn(objs, args.seed)
    del objs
    gc.collect()
    gc.freeze()

    pod_res = _res(cache_mod, "Pod")
    group_memo = grouper.GroupMemo() if hasattr(grouper, "GroupMemo") else None  # (older trees: no memo)
    try:  # what the runner uses since stop 35: the grouping kept up to date from the cache's changes
        from kai_opt.k8s.live_grouping import LiveGrouping
        live: Any = LiveGrouping(config.default_queue)
    except ImportError:  # (older trees: a pass over every pod)
        live = None
    pg_res = _res(cache_mod, "PodGroup")
    to_confirm: list[tuple[str, str, str, tuple[int, ...]]] = []
    rows: list[dict[str, float]] = []
    prof = cProfile.Profile() if args.profile else None
    writer = pool = None
    writes: list[tuple[str, dict[str, Any]]] = []
    if args.status:
        from kai_opt.heuristics.positions import queue_positions
        from kai_opt.k8s import events as events_mod
        from kai_opt.k8s import status as status_mod
        from kai_opt.k8s.workqueue import TokenBucket

        def record(api: Any, method: str, path: str, **kw: Any) -> None:
            writes.append((path, kw["body"]))

        status_mod.request = record  # type: ignore[assignment]  # the writes are recorded, not sent
        events_mod.request = lambda *a, **k: None  # type: ignore[assignment]
        pool = RecordingPool()
        rt = config.runtime
        recorder = events_mod.EventRecorder(None, pool, qps=rt.event_qps,  # type: ignore[arg-type]
                                            burst=rt.event_burst, repeat_s=rt.event_repeat_s)
        writer = status_mod.StatusWriter(None, cache, pool, TokenBucket(1e9, 10**9),  # type: ignore[arg-type]
                                         recorder)
    for cycle in range(args.cycles + args.warmup):
        # the watch: last cycle's binds confirmed, then this cycle's churn
        for ns, name, node, devices in to_confirm:
            pod = cache.pod(ns, name)
            if pod is not None:
                rv = str(int(pod["metadata"]["resourceVersion"]) + 1)
                meta = {**pod["metadata"], "resourceVersion": rv}
                if devices:  # the binder writes the pod's GPU devices before it binds (kaibind)
                    meta["annotations"] = {**(meta.get("annotations") or {}),
                                           "kai-opt.io/gpu-devices": ",".join(map(str, devices))}
                new = {**pod, "spec": {**pod["spec"], "nodeName": node}, "metadata": meta,
                       "status": {"phase": "Running"}}
                cache._apply(pod_res, "MODIFIED", new)
        to_confirm = []
        _land(cache, cache_mod, writes)  # last cycle's status writes, as the watch shows them
        writes.clear()
        if cycle:
            deleted, added = churn.step(int(n_pods * args.change))
            for o in deleted:
                cache._apply(pod_res if o["kind"] == "Pod" else pg_res, "DELETED", o)
            for o in added:
                cache._apply(pod_res if o["kind"] == "Pod" else pg_res, "ADDED", o)
        if prof and cycle >= args.warmup and writer is None:
            prof.enable()
        row: dict[str, float] = {}
        with gc_paused():
            c0, t0 = time.process_time(), time.perf_counter()
            if live is not None:
                grouping = live.update(cache, names)
            else:
                pods = [p for p in cache.list("Pod", "v1") if (p.get("spec") or {}).get("schedulerName") in names]
                grouping = (grouper.group_pods(pods, cache.get, config.default_queue, group_memo) if group_memo
                            else grouper.group_pods(pods, cache.get, config.default_queue))
            c1, t1 = time.process_time(), time.perf_counter()
            snap = cache.snapshot(scheduler_names=names, pod_groups=dict(grouping.assignments))
            c2, t2 = time.process_time(), time.perf_counter()
            state = build_state(snap, now=snap.now, default_queue=config.default_queue)
            c3, t3 = time.process_time(), time.perf_counter()
            plan, _fs = run_cycle(state, config)
            c4, t4 = time.process_time(), time.perf_counter()
            for b in plan.binds:  # what the binder does when it accepts a bind
                pod_m = state.pods[b.pod]
                node_name = state.node_names[b.node]
                cache.assume_bound(pod_m.meta.uid or "", pod_m.namespace, pod_m.name, node_name, tuple(b.devices))
                to_confirm.append((pod_m.namespace, pod_m.name, node_name, tuple(b.devices)))
            c5, t5 = time.process_time(), time.perf_counter()
        if prof and cycle >= args.warmup and writer is None:
            prof.disable()
        if writer is not None and pool is not None:  # the status worker, after the cycle (as in `kai-opt run`)
            with gc_paused():
                c6, t6 = time.process_time(), time.perf_counter()
                positions = queue_positions(state, _fs, config, among=set(plan.pending)) \
                    if config.runtime.queue_position else None
                c7, t7 = time.process_time(), time.perf_counter()
                if prof and cycle >= args.warmup:
                    prof.enable()
                counts = writer.update(snap, state, plan, _fs, positions)
                if prof and cycle >= args.warmup:
                    prof.disable()
                c8, t8 = time.process_time(), time.perf_counter()
            pool.run()
            row.update(positions=t7 - t6, update=t8 - t7, cpu_positions=c7 - c6, cpu_update=c8 - c7,
                       n_writes=len(writes), n_counted=float(sum(counts.values())))
        row.update(group=t1 - t0, snapshot=t2 - t1, state=t3 - t2, engine=t4 - t3, binds=t5 - t4, total=t5 - t0,
                   cpu_group=c1 - c0, cpu_snapshot=c2 - c1, cpu_state=c3 - c2, cpu_engine=c4 - c3,
                   cpu_binds=c5 - c4, cpu_total=c5 - c0, n_binds=len(plan.binds), pending=len(plan.pending),
                   solver=0.0)
        row["status"] = plan.solver.status  # type: ignore[assignment]
        rows.append(row)
        if args.output == "table":
            print(f"cycle {cycle}: total {row['total']:.3f} s (group {row['group']:.3f}, "
                  f"snapshot {row['snapshot']:.3f}, state {row['state']:.3f}, engine {row['engine']:.3f}, "
                  f"binds {row['binds']:.3f}); "
                  f"{row['n_binds']} binds, {row['pending']} groups pending, {plan.solver.status}"
                  + (f" ({plan.solver.note[:160]})" if args.notes else "")
                  + (f"; status: positions {row['positions']:.3f}, update {row['update']:.3f} s "
                     f"(cpu {row['cpu_update']:.3f}), {int(row['n_writes'])} writes" if writer else ""),
                  flush=True)
    measured = rows[args.warmup:]
    phases: tuple[str, ...] = ("group", "snapshot", "state", "engine", "binds", "total")
    if writer is not None:
        phases += ("positions", "update")
    summary = {p: {"p50": float(np.percentile([r[p] for r in measured], 50)),
                   "p95": float(np.percentile([r[p] for r in measured], 95)),
                   "cpu_p50": float(np.percentile([r["cpu_" + p] for r in measured], 50))} for p in phases}
    out: dict[str, Any] = {"nodes": args.nodes, "pods": n_pods, "change": args.change, "engine": args.engine,
           "cycles": len(measured), "generate_s": gen_s, "first_cycle_s": rows[0]["total"], "phases": summary,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "load": os.getloadavg()[0], "statuses": sorted({str(r["status"]) for r in measured})}
    if args.output == "json":
        print(json.dumps(out))
    else:
        print(f"{args.nodes} nodes, {n_pods} pods, {args.change:.1%} changing per cycle, engine {args.engine}, "
              f"load {out['load']:.1f}; first cycle {rows[0]['total']:.2f} s")
        print(f"{'phase':<10}{'p50 s':>8}{'p95 s':>8}{'cpu p50':>9}")
        for p in phases:
            s = summary[p]
            print(f"{p:<10}{s['p50']:>8.3f}{s['p95']:>8.3f}{s['cpu_p50']:>9.3f}")
        print(f"peak RSS {out['peak_rss_mb']:.0f} MB; solver {', '.join(out['statuses'])}")
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.profile)
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
        print(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
