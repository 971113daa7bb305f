#!/usr/bin/env python
"""kube-scheduler and `kai-opt run` binding onto the same nodes at once: node-resource overcommits with and without
kai-opt's pre-bind re-check (runtime.prebind_recheck; KAI-Scheduler issue #1454's race).

Every run gets a fresh test cluster (tests/e2e/testcluster.py: etcd + kube-apiserver, no kubelet, so nothing
rejects an overcommitted pod: what is bound stays bound), `--nodes` nodes of `--gpus-per-node` GPUs, and two
backlogs of 1-GPU pods, each alone enough to fill every GPU (`--pods-each`, default nodes x GPUs): plain pods for
kube-scheduler, pods with schedulerName kai-opt (each with its PodGroup of minMember 1, created beforehand) for
kai-opt. Both schedulers are started (client QPS 5000 each, as scripts/bench_throughput.py) and, once both are
ready, the two backlogs are created interleaved (`--create-workers` threads), so both schedulers bind as the pods
arrive and race for the GPUs until no pod has been bound for `--settle` seconds.

Measured from the apiserver: every `--sample-s` seconds (and at the end) the pods are listed and, per node, the
requests of bound unfinished pods are compared with allocatable (nvidia.com/gpu, cpu, memory, pods). Reported per
run: overcommitted nodes and excess GPUs at the end and at the worst sample; each overcommit is attributed to
the scheduler whose bind (timestamped by a pod watch) first took the node past allocatable, with how long after
the other scheduler's last bind onto that node it landed (the race window that remains); pods bound by each
scheduler; kai-opt's dropped binds (kai_opt_binds_dropped_total, from its /metrics).

  scripts/bench_coexist.py                               # 500 nodes x 4 GPUs, 2,000 + 2,000 pods, both settings
  scripts/bench_coexist.py --nodes 50 --repeat 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import bench_throughput as bt  # noqa: E402
import yaml  # noqa: E402

from kai_opt.k8s.client import object_path, request  # noqa: E402
from kai_opt.units import parse_quantity  # noqa: E402
from tests.e2e.testcluster import LocalCluster, Process, find_testbin, free_port  # noqa: E402

NAMESPACE = bt.NAMESPACE
RESOURCES = ("nvidia.com/gpu", "cpu", "memory", "pods")


@dataclass
class Outcome:
    recheck: bool
    nodes: int
    gpus: int
    pods_each: int
    ok: bool = False
    seconds: float = 0.0
    bound_kube: int = 0
    bound_kai: int = 0
    overcommitted_nodes: int = 0  # at the end
    excess_gpus: int = 0  # at the end: sum over nodes of bound GPU requests above allocatable
    overcommitted_by: dict[str, int] = field(default_factory=dict)  # the scheduler whose bind crossed the line
    # per culprit: seconds between the other scheduler's last bind onto the node and the crossing bind (p50, max)
    crossing_gap_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    overcommitted_resources: dict[str, int] = field(default_factory=dict)
    worst_sample_nodes: int = 0
    samples: int = 0
    binds_dropped: dict[str, float] = field(default_factory=dict)
    kai_bind_failures: dict[str, float] = field(default_factory=dict)
    note: str = ""


def milli(q: Any) -> int:
    """A quantity in thousandths (every resource in the same unit, so sums compare exactly)."""
    return int(parse_quantity(str(q)) * 1000)


def node_alloc(n: dict[str, Any]) -> dict[str, int]:
    alloc = (n.get("status") or {}).get("allocatable") or {}
    return {r: milli(alloc[r]) for r in RESOURCES if r in alloc}


def pod_requests(p: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {"pods": 1000}  # one pod
    for c in (p.get("spec") or {}).get("containers") or []:
        for r, q in ((c.get("resources") or {}).get("requests") or {}).items():
            if r in RESOURCES:
                out[r] = out.get(r, 0) + milli(q)
    return out


def overcommits(nodes: dict[str, dict[str, int]], pods: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """node -> resource -> amount above allocatable (milli units), for every overcommitted node."""
    used: dict[str, dict[str, int]] = {}
    for p in pods:
        n = (p.get("spec") or {}).get("nodeName")
        if not n or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        u = used.setdefault(n, {})
        for r, v in pod_requests(p).items():
            u[r] = u.get(r, 0) + v
    out: dict[str, dict[str, int]] = {}
    for n, u in used.items():
        over = {r: v - nodes.get(n, {}).get(r, 0) for r, v in u.items()
                if r in nodes.get(n, {}) and v > nodes[n][r]}
        if over:
            out[n] = over
    return out


def whose(p: dict[str, Any]) -> str:
    return "kai-opt" if (p.get("spec") or {}).get("schedulerName") == bt.KAI_SCHEDULER_NAME else "kube-scheduler"


def culprit(node: str, pods: list[dict[str, Any]], alloc: dict[str, int],
            bound_at: dict[str, float]) -> tuple[str, float | None]:
    """The scheduler whose bind first took `node` past allocatable (binds in watch order), and how long after the
    other scheduler's last bind onto the node it landed (seconds; None: the other had bound nothing there)."""
    on = sorted((p for p in pods if (p.get("spec") or {}).get("nodeName") == node),
                key=lambda p: bound_at.get(p["metadata"]["name"], float("inf")))
    used: dict[str, int] = {}
    for i, p in enumerate(on):
        for r, v in pod_requests(p).items():
            used[r] = used.get(r, 0) + v
        if any(r in alloc and v > alloc[r] for r, v in used.items()):
            who = whose(p)
            t = bound_at.get(p["metadata"]["name"])
            before = [bound_at.get(q["metadata"]["name"]) for q in on[:i] if whose(q) != who]
            before = [x for x in before if x is not None]
            return who, (t - max(before)) if before and t is not None else None
    return "unknown", None


def metric_values(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{name}\{{reason="([^"]*)"\}} ([0-9.e+]+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def start_kai_opt(cluster: LocalCluster, work: Path, recheck: bool, port: int) -> Process:
    cfg = work / "kai-opt.yaml"
    cfg.write_text(yaml.safe_dump({"engine": "greedy", "runtime": {
        "client_qps": 5000, "client_burst": 5000, "prebind_recheck": recheck}}))
    kubeconfig = cluster.kubeconfig(path=work / "kubeconfig-kai-opt")
    return Process("kai-opt", [sys.executable, "-m", "kai_opt.cli.main", "run", "--kubeconfig", str(kubeconfig),
                               "--config", str(cfg), "--no-leader-elect", "--log-level", "info",
                               "--metrics-port", str(port)], work / "kai-opt.log")


def wait_ready(port: int, kube: Process, kai: Process, timeout: float = 120.0) -> None:
    """Until kai-opt's /readyz is ok (cache synced) and kube-scheduler has started its informers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in (kube, kai):
            if not proc.running():
                raise RuntimeError(f"{proc.name} exited: {proc.log_tail(10)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                kai_ready = resp.status == 200
        except OSError:
            kai_ready = False
        kube_ready = "Attempting to acquire" in kube.log_tail(200) or "Starting Kubernetes Scheduler" in \
            kube.log_tail(200)
        if kai_ready and kube_ready:
            time.sleep(2.0)  # kube-scheduler's informers list in this time (a handful of objects)
            return
        time.sleep(0.5)
    raise RuntimeError("the schedulers did not get ready")


def run_one(args: argparse.Namespace, bin_dir: Path, recheck: bool) -> Outcome:
    out = Outcome(recheck, args.nodes, args.nodes * args.gpus_per_node, args.pods_each)
    with bt.fresh_cluster(bin_dir, keep=False) as cluster:
        work = cluster.workdir
        api = bt.api_client(cluster, pool=max(args.create_workers * 2, 16))
        request(api, "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NAMESPACE}})
        bt.setup_kai_objects(api)
        t = time.monotonic()
        bt.create_all(api, [bt.node(i, args.gpus_per_node) for i in range(args.nodes)], args.create_workers,
                      lambda o: "/api/v1/nodes")
        groups = [bt.podgroup(f"kai-{i:05d}", 1) for i in range(args.pods_each)]
        bt.create_all(api, groups, args.create_workers,
                      lambda o: object_path("scheduling.run.ai/v2alpha2", "podgroups", NAMESPACE))
        bt.log(f"recheck={recheck}: {args.nodes} nodes, {len(groups)} podgroups created in "
               f"{time.monotonic() - t:.0f}s")
        nodes = {n["metadata"]["name"]: node_alloc(n)
                 for n in request(api, "GET", "/api/v1/nodes")["items"]}
        watch = bt.BindWatch(api, bt.current_rv(api))
        port = free_port()
        kube = bt.kube_scheduler(bin_dir).start(cluster, work)
        kai = start_kai_opt(cluster, work, recheck, port)
        cluster.processes += [kube, kai]
        wait_ready(port, kube, kai)
        backlog = []
        for i in range(args.pods_each):  # interleaved: both backlogs arrive together, into both schedulers
            backlog.append(bt.pod(f"kube-{i:05d}", None))
            backlog.append(bt.pod(f"kai-{i:05d}", bt.KAI_SCHEDULER_NAME, group=f"kai-{i:05d}"))
        start = time.monotonic()
        threading.Thread(target=bt.create_all, args=(api, backlog, args.create_workers, bt.pod_path),
                         daemon=True).start()
        worst = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal worst
            while not stop.wait(args.sample_s):
                items = request(api, "GET", object_path("v1", "pods", NAMESPACE))["items"]
                worst = max(worst, len(overcommits(nodes, items)))
                out.samples += 1

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        last_n, last_change = -1, time.monotonic()
        while time.monotonic() - start < args.timeout:
            time.sleep(1.0)
            n = len(watch.bound)
            if n != last_n:
                last_n, last_change = n, time.monotonic()
            elif time.monotonic() - last_change >= args.settle:
                out.ok = True
                break
            for proc in (kube, kai):
                if not proc.running():
                    out.note = f"{proc.name} exited: {proc.log_tail(10)}"
                    break
            if out.note:
                break
        out.seconds = round(last_change - start, 1)
        stop.set()
        sampler.join(args.sample_s + 30)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            out.binds_dropped = metric_values(text, "kai_opt_binds_dropped_total")
            out.kai_bind_failures = metric_values(text, "kai_opt_bind_failures_total")
        except OSError as exc:
            out.note += f" metrics: {exc}"
        items = request(api, "GET", object_path("v1", "pods", NAMESPACE))["items"]
        watch.stop()
        over = overcommits(nodes, items)
        out.samples += 1
        out.worst_sample_nodes = max(worst, len(over))
        out.overcommitted_nodes = len(over)
        out.excess_gpus = sum(v.get("nvidia.com/gpu", 0) for v in over.values()) // 1000
        gaps: dict[str, list[float]] = {}
        for n, res in over.items():
            who, gap = culprit(n, items, nodes[n], watch.bound)
            out.overcommitted_by[who] = out.overcommitted_by.get(who, 0) + 1
            if gap is not None:
                gaps.setdefault(who, []).append(gap)
            for r in res:
                out.overcommitted_resources[r] = out.overcommitted_resources.get(r, 0) + 1
        for who, g in gaps.items():
            g.sort()
            out.crossing_gap_s[who] = (round(g[len(g) // 2], 3), round(g[-1], 3))
        for p in items:
            if (p.get("spec") or {}).get("nodeName"):
                if p["spec"].get("schedulerName") == bt.KAI_SCHEDULER_NAME:
                    out.bound_kai += 1
                else:
                    out.bound_kube += 1
        for proc in (kai, kube):
            proc.stop()
            cluster.processes.remove(proc)
        bt.log(f"recheck={recheck}: {json.dumps(asdict(out))}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--pods-each", type=int, default=0, help="pods per scheduler (default: nodes x GPUs)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per setting")
    ap.add_argument("--only", choices=("recheck", "no-recheck"), help="one setting only")
    ap.add_argument("--create-workers", type=int, default=16)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds without a new bind that end a run")
    ap.add_argument("--sample-s", type=float, default=3.0, help="seconds between overcommit samples")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, help="write the outcomes here")
    args = ap.parse_args()
    args.pods_each = args.pods_each or args.nodes * args.gpus_per_node
    bin_dir = find_testbin()
    if not (bin_dir / "kube-scheduler").is_file():
        print(f"no kube-scheduler in {bin_dir}: run scripts/build-testbin kube-scheduler", file=sys.stderr)
        return 2
    settings = [s for s in (True, False) if args.only is None or args.only == ("recheck" if s else "no-recheck")]
    outcomes = [run_one(args, bin_dir, s) for _ in range(args.repeat) for s in settings]
    print("| pre-bind re-check | nodes x GPUs | pods each | bound kube / kai-opt | overcommitted nodes (end; by "
          "whose bind) | crossing bind after the other's (p50 / max) | excess GPUs | worst sample | kai-opt binds "
          "dropped | settled after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        by = ", ".join(f"{k} {v}" for k, v in sorted(o.overcommitted_by.items())) or "-"
        dropped = ", ".join(f"{k} {v:.0f}" for k, v in sorted(o.binds_dropped.items())) or "0"
        gap = ", ".join(f"{k} {a * 1000:.0f} / {b * 1000:.0f} ms" for k, (a, b) in sorted(o.crossing_gap_s.items()))
        print(f"| {'on' if o.recheck else 'off'} | {o.nodes} x {args.gpus_per_node} | {o.pods_each} | "
              f"{o.bound_kube} / {o.bound_kai} | {o.overcommitted_nodes} ({by}) | {gap or '-'} | {o.excess_gpus} | "
              f"{o.worst_sample_nodes} of {o.samples} samples | {dropped} | {o.seconds:.0f} s"
              f"{'' if o.ok else ' (not settled: ' + o.note + ')'} |")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
