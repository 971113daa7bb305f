#!/usr/bin/env python
"""Scheduling throughput on a real apiserver: kube-scheduler vs `kai-opt run` (greedy and CP-SAT engines).

Every run gets a fresh test cluster (tests/e2e/testcluster.py: etcd + kube-apiserver, no kubelet; nodes are API
objects with 8 GPUs each, Ready), the scheduler under test as a subprocess, one warm-up pod it must bind before
the clock starts (so its caches are synced), then `--pods` pods created by `--create-workers` threads. A pod
watch (field selector spec.nodeName!=) timestamps every binding. Reported per run:

  e2e pods/s    pods / (last pod bound - first create started): the issue's measure
  bind pods/s   mean of the per-second binding counts from the first to the last binding (scheduler_perf's
                SchedulingThroughput statistic, sampled the same way)
  create pods/s how fast this client created the pods (an upper bound of e2e on this machine)
  cpu ms/pod    CPU time of the scheduler process and its reaped children per bound pod (robust when the
                machine is shared)
  cluster ms/pod  CPU time of kube-apiserver and etcd per bound pod over the run (stream: from the first create;
                backlog: from the scheduler's start): the pods' creation, the same in every run, plus what the
                scheduler's requests and watches cost the cluster; this client's own CPU is in the JSON
The 1-minute load average before and after each run is in the JSON (`extra`) and the log.

Workloads: `single` = `--pods` one-pod workloads (1 GPU each); kube-scheduler gets plain pods, kai-opt the same
pods with schedulerName kai-opt, each with its own PodGroup (minMember 1, created before the clock starts, named by
the `pod-group-name` annotation; `--kai-grouping grouper` instead leaves them bare for kai-opt's pod grouper).
`gang` (kai-opt only) = `--gangs` PodGroups of minMember `--gang-size`, pods of 1 GPU.
The reference is scheduler_perf's threshold for SchedulingBasic/5000Nodes_10000Pods (680 pods/s, measured on CI
machines with the apiserver in-process); this machine runs apiserver, etcd, scheduler and client on the same cores.

  scripts/bench_throughput.py                                    # 5,000 nodes, 10,000 pods, every scheduler
  scripts/bench_throughput.py --nodes 200 --pods 1000 --gangs 20 --only kube-scheduler --json out.json
  scripts/bench_throughput.py --only kube-scheduler --only kai-opt-greedy --only kai-opt-cpsat --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from kai_opt.k8s.client import object_path, request, stream_lines  # noqa: E402
from tests.e2e.testcluster import LocalCluster, Process, find_testbin  # noqa: E402

SCHEDULER_PERF_THRESHOLD = 680.0  # pods/s, SchedulingBasic/5000Nodes_10000Pods (performance-config.yaml)
NAMESPACE = "bench"
GPU = "nvidia.com/gpu"
KAI_SCHEDULER_NAME = "kai-opt"
RUNS = ("kube-scheduler", "kai-opt-greedy", "kai-opt-cpsat", "kai-opt-gang")


# -- objects ---------------------------------------------------------------------------------------------------------
def node(i: int, gpus: int) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}", "labels": {"kubernetes.io/hostname": f"node-{i:05d}",
                                                              "kubernetes.io/os": "linux"}},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "bench node"}]}}


def pod(name: str, scheduler: str | None, group: str | None = None, gpus: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if group:
        meta["annotations"] = {"pod-group-name": group}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {
        "requests": {"cpu": "100m", "memory": "500Mi", GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}],
        "terminationGracePeriodSeconds": 0}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"minMember": min_member, "queue": "default-queue"}}


# -- cluster helpers -------------------------------------------------------------------------------------------------
def api_client(cluster: LocalCluster, pool: int = 64) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = cluster.host
    cfg.api_key = {"authorization": f"Bearer {cluster.token()}"}
    cfg.ssl_ca_cert = str(cluster.ca_file)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(configuration=cfg)


def create_all(api: client.ApiClient, objs: list[dict[str, Any]], workers: int,
               path_of: Callable[[dict[str, Any]], str]) -> tuple[float, float]:
    """POST every object with `workers` threads; returns (start, end) monotonic times."""
    def post(obj: dict[str, Any]) -> None:
        for attempt in range(5):
            try:
                request(api, "POST", path_of(obj), body=obj)
                return
            except ApiException as exc:
                if exc.status == 409:
                    return
                if exc.status not in (429, 500, 503, 504) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as ex:
        for f in [ex.submit(post, o) for o in objs]:
            f.result()
    return start, time.monotonic()


def pod_path(o: dict[str, Any]) -> str:
    return object_path("v1", "pods", NAMESPACE)


class BindWatch:
    """Timestamps (monotonic) of pods in NAMESPACE becoming bound, from a field-selector watch."""

    def __init__(self, api: client.ApiClient, resource_version: str) -> None:
        self.api, self.rv = api, resource_version
        self.bound: dict[str, float] = {}
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="bind-watch")
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self._stop:
                path = object_path("v1", "pods", NAMESPACE)
                method, url, headers, data, post = self.api.param_serialize(
                    method="GET", resource_path=path, auth_settings=["BearerToken"],
                    query_params=[("watch", "true"), ("fieldSelector", "spec.nodeName!="),
                                  ("resourceVersion", self.rv), ("allowWatchBookmarks", "true"),
                                  ("timeoutSeconds", "3600")],
                    header_params={"Accept": "application/json"})
                resp = self.api.call_api(method, url, header_params=headers, body=data, post_params=post,
                                         _request_timeout=(5, 3700))
                if resp.status != 200:
                    raise RuntimeError(f"watch answered {resp.status}: {resp.response.read()[:200]!r}")
                self._resp = resp.response  # the urllib3 response
                buf = b""
                for chunk in self._resp.stream(65536):
                    now = time.monotonic()
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self._event(json.loads(line), now)
                    if self._stop:
                        return
        except BaseException as exc:  # reported by wait()
            if not self._stop:
                self.error = exc
                with self._cond:
                    self._cond.notify_all()

    def _event(self, ev: dict[str, Any], now: float) -> None:
        obj = ev.get("object") or {}
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.rv = meta["resourceVersion"]
        if ev.get("type") == "ERROR":
            raise RuntimeError(f"watch error: {obj.get('message')}")
        if ev.get("type") in ("ADDED", "MODIFIED") and (obj.get("spec") or {}).get("nodeName"):
            with self._cond:
                self.bound.setdefault(meta["name"], now)
                self._cond.notify_all()

    def wait(self, names: set[str], timeout: float, progress: Callable[[int], None] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        last = -1
        with self._cond:
            while True:
                done = len(names & self.bound.keys())
                if done != last and progress:
                    progress(done)
                    last = done
                if done >= len(names) or self.error:
                    return done >= len(names)
                if time.monotonic() > deadline:
                    return False
                self._cond.wait(1.0)

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(Exception):
            if self._resp is not None:
                self._resp.release_conn()


def current_rv(api: client.ApiClient) -> str:
    return str(request(api, "GET", object_path("v1", "pods", NAMESPACE), query={"limit": 1})["metadata"][
        "resourceVersion"])


# -- schedulers ------------------------------------------------------------------------------------------------------
@dataclass
class Scheduler:
    name: str
    scheduler_name: str | None  # the pods' schedulerName (None: default-scheduler)
    start: Callable[[LocalCluster, Path], Process]
    pod_groups: bool  # pods need PodGroups


def kube_scheduler(bin_dir: Path) -> Scheduler:
    def start(cluster: LocalCluster, work: Path) -> Process:
        cfg = work / "kube-scheduler.yaml"
        cfg.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(cluster.kubeconfig(path=work / "kubeconfig-scheduler")),
                                 "qps": 5000, "burst": 5000},  # as scheduler_perf
            "leaderElection": {"leaderElect": False}}))
        return Process("kube-scheduler", [str(bin_dir / "kube-scheduler"), f"--config={cfg}", "--secure-port=0",
                                          "--v=1"], work / "kube-scheduler.log")
    return Scheduler("kube-scheduler", None, start, pod_groups=False)


def kai_opt(engine: str, name: str, extra_config: dict[str, Any]) -> Scheduler:
    def start(cluster: LocalCluster, work: Path) -> Process:
        cfg = work / f"kai-opt-{engine}.yaml"
        settings = {"engine": engine, **extra_config}
        runtime = {"client_qps": 5000, "client_burst": 5000, **(extra_config.get("runtime") or {})}
        cfg.write_text(yaml.safe_dump({**settings, "runtime": runtime}))  # the same QPS as kube-scheduler
        kubeconfig = cluster.kubeconfig(path=work / "kubeconfig-kai-opt")
        argv = [sys.executable, "-m", "kai_opt.cli.main", "run", "--kubeconfig", str(kubeconfig),
                "--config", str(cfg), "--no-leader-elect", "--log-level", "info"]
        return Process(name, argv, work / f"{name}.log")
    return Scheduler(name, KAI_SCHEDULER_NAME, start, pod_groups=True)


def kai_opt_available() -> bool:
    return (ROOT / "kai_opt" / "cli" / "run.py").is_file()


# -- one run ---------------------------------------------------------------------------------------------------------
@dataclass
class Result:
    run: str
    workload: str
    mode: str
    nodes: int
    pods: int
    ok: bool
    e2e_pods_per_s: float = 0.0
    bind_pods_per_s: float = 0.0
    create_pods_per_s: float = 0.0
    seconds_to_all_bound: float = 0.0
    bound: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    round: int = 1  # with --rounds, which round of the interleaved runs


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process and of the children it has reaped (kai-opt's forked CP-SAT
    workers and second hints: the cpsat engine's work beside the cycle), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def others_cpu_s(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of what shares the machine with the scheduler: the apiserver, etcd and this client
    (creating pods, watching bindings). Their growth over a run is what the scheduler's requests and watches cost
    the cluster, and what pod creation had to share the cores with."""
    out = {"client": sum(os.times()[:2])}
    for proc in cluster.processes:
        key = "apiserver" if "apiserver" in proc.name else "etcd" if "etcd" in proc.name else None
        if key is not None:
            out[key] = out.get(key, 0.0) + process_cpu_s(proc.pid)
    return out


def served(api: client.ApiClient) -> dict[str, int]:
    """The apiserver's counts so far (its /metrics) of writes per verb and resource (`POST pods/binding`) and of
    watch events sent per resource (`watch pods`): over a run, what the scheduler asked of it beside the client's pod
    creation (the same in every run)."""
    try:
        lines = [raw.decode() for raw in stream_lines(api, "/metrics", timeout=30)]
    except Exception:  # a count the apiserver does not give is left out; the run goes on
        return {}
    out: dict[str, int] = {}
    for line in lines:
        if line.startswith(("apiserver_request_total{", "apiserver_watch_events_total{")):
            labels, _, value = line.rpartition(" ")
            kv = dict(part.split("=", 1) for part in labels[labels.index("{") + 1:-1].split(",") if "=" in part)
            kv = {k: v.strip('"') for k, v in kv.items()}
            if line.startswith("apiserver_watch"):
                key = f"watch {kv.get('kind') or kv.get('resource') or '?'}"
            elif kv.get("verb") in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
                sub = f"/{kv['subresource']}" if kv.get("subresource") else ""
                key = f"{kv['verb']} {kv.get('resource', '?')}{sub}"
            else:
                continue
            out[key] = out.get(key, 0) + int(float(value))
    return out


def per_second_mean(times: list[float]) -> float:
    """scheduler_perf's SchedulingThroughput average: bindings per whole second from the first to the last."""
    if len(times) < 2:
        return 0.0
    t0, t1 = min(times), max(times)
    seconds = max(int(t1 - t0) + 1, 1)
    counts = [0] * seconds
    for t in times:
        counts[min(int(t - t0), seconds - 1)] += 1
    # the last second is partial: weigh it by the part that elapsed (as a throughput sample it is a rate)
    partial = (t1 - t0) - (seconds - 1)
    rates = counts[:-1] + ([counts[-1] / partial] if partial > 0.05 else [])
    return sum(rates) / len(rates) if rates else float(len(times))


@contextlib.contextmanager
def fresh_cluster(bin_dir: Path, keep: bool) -> Iterator[LocalCluster]:
    cluster = LocalCluster(bin_dir)
    cluster.start(timeout=180)
    try:
        cluster.install_crds()
        yield cluster
    finally:
        if keep:
            os.environ["KAI_OPT_KEEP_TESTCLUSTER"] = "1"
        cluster.stop()


def setup_kai_objects(api: client.ApiClient) -> None:
    from kai_opt.k8s.client import apply_objects
    from kai_opt.k8s.manifests import build_manifests

    objs = [o for o in build_manifests() if o["kind"] in ("PriorityClass", "Queue")]
    apply_objects(api, objs)


def run_one(sched: Scheduler, workload: str, args: argparse.Namespace, bin_dir: Path) -> Result:
    n_pods = args.pods if workload == "single" else args.gangs * args.gang_size
    res = Result(sched.name, workload, args.mode, args.nodes, n_pods, ok=False)
    with fresh_cluster(bin_dir, args.keep) as cluster:
        work = cluster.workdir
        api = api_client(cluster, pool=max(args.create_workers * 2, 16))
        request(api, "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NAMESPACE}})
        setup_kai_objects(api)
        t = time.monotonic()
        create_all(api, [node(i, args.gpus_per_node) for i in range(args.nodes)], args.create_workers,
                   lambda o: "/api/v1/nodes")
        log(f"{sched.name}/{workload}: {args.nodes} nodes created in {time.monotonic() - t:.1f}s")

        grouped = sched.pod_groups and args.kai_grouping == "precreated"
        if workload == "single":
            names = [f"p-{i:06d}" for i in range(n_pods)]
            pods = [pod(n, sched.scheduler_name, f"pg-{n}" if grouped else None) for n in names]
            groups = [podgroup(f"pg-{n}", 1) for n in names] if grouped else []
        else:
            names = [f"g-{g:04d}-{i:02d}" for g in range(args.gangs) for i in range(args.gang_size)]
            pods = [pod(n, sched.scheduler_name, f"pg-{n[:6]}") for n in names]
            groups = [podgroup(f"pg-g-{g:04d}", args.gang_size) for g in range(args.gangs)]
        warm = pod("warmup", sched.scheduler_name, "pg-warmup" if grouped or workload == "gang" else None)
        if groups:
            groups.append(podgroup("pg-warmup", 1))
            t = time.monotonic()
            create_all(api, groups, args.create_workers,
                       lambda o: object_path("scheduling.run.ai/v2alpha2", "podgroups", NAMESPACE))
            log(f"{sched.name}/{workload}: {len(groups)} PodGroups created in {time.monotonic() - t:.1f}s "
                "(before the clock starts)")

        if args.mode == "backlog":  # every pod exists before the scheduler starts; the clock starts with it
            c0, c1 = create_all(api, pods, args.create_workers, pod_path)
            log(f"{sched.name}/{workload}: {n_pods} pods created in {c1 - c0:.1f}s (before the clock starts)")
        others0, served0 = others_cpu_s(cluster), served(api)
        watch = BindWatch(api, current_rv(api))
        load_before = os.getloadavg()[0]
        proc = sched.start(cluster, work)
        t0 = time.monotonic()
        try:
            if args.mode == "stream":  # a warm-up pod proves the scheduler synced, then the pods are created
                request(api, "POST", pod_path(warm), body=warm)
                if not watch.wait({"warmup"}, args.warmup_timeout):
                    res.note = (f"warm-up pod not bound in {args.warmup_timeout:g}s: {proc.log_tail(3)!r}"
                                if proc.running() else f"{sched.name} exited: {proc.log_tail(5)}")
                    return res
                log(f"{sched.name}/{workload}: warm-up pod bound {time.monotonic() - t0:.1f}s after start")
                others0, served0 = others_cpu_s(cluster), served(api)
                c0, c1 = create_all(api, pods, args.create_workers, pod_path)
                log(f"{sched.name}/{workload}: {n_pods} pods created in {c1 - c0:.1f}s")
                t0 = c0
            last_report = [time.monotonic()]

            def progress(done: int) -> None:
                if time.monotonic() - last_report[0] > 10:
                    last_report[0] = time.monotonic()
                    log(f"{sched.name}/{workload}: {done}/{n_pods} bound")

            ok = watch.wait(set(names), args.timeout, progress)
            times = [watch.bound[n] for n in names if n in watch.bound]
            res.bound = len(times)
            res.create_pods_per_s = n_pods / max(c1 - c0, 1e-9)
            res.extra = {"scheduler_cpu_s": round(process_cpu_s(proc.pid), 2),
                         "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2)}
            res.extra.update({f"{k}_cpu_s": round(v - others0[k], 2) for k, v in others_cpu_s(cluster).items()})
            res.extra["served"] = {k: v - served0.get(k, 0) for k, v in served(api).items()
                                   if v - served0.get(k, 0) > 0}
            log(f"{sched.name}/{workload}: apiserver writes and watch events over the run: {res.extra['served']}")
            if times:
                res.seconds_to_all_bound = max(times) - t0
                res.e2e_pods_per_s = len(times) / max(max(times) - t0, 1e-9)
                res.bind_pods_per_s = per_second_mean(times)
                res.extra.update({"first_bind_after_s": round(min(times) - t0, 2),
                                  "bind_window_s": round(max(times) - min(times), 2)})
            res.ok = ok
            if not ok:
                res.note = f"watch failed: {watch.error}" if watch.error else (
                    f"only {len(times)}/{n_pods} bound within {args.timeout:g}s"
                    + ("" if proc.running() else f"; {sched.name} exited: {proc.log_tail(5)}"))
            if args.keep:
                res.extra["workdir"] = str(work)
        finally:
            watch.stop()
            proc.stop()
            if args.keep:
                kept = Path(tempfile.gettempdir()) / f"bench-{sched.name}-{workload}-{args.mode}.log"
                shutil.copy(proc.log, kept)
                res.extra["log"] = str(kept)
            api.close()
    return res


# -- main ------------------------------------------------------------------------------------------------------------
def plan_runs(args: argparse.Namespace, bin_dir: Path) -> list[tuple[Scheduler, str]]:
    wanted = args.only or list(RUNS)
    runs: list[tuple[Scheduler, str]] = []
    kai_extra = json.loads(args.kai_config) if args.kai_config else {}
    for name in wanted:
        if name == "kube-scheduler":
            runs.append((kube_scheduler(bin_dir), "single"))
        elif name == "kai-opt-greedy":
            runs.append((kai_opt("greedy", name, kai_extra), "single"))
        elif name == "kai-opt-cpsat":
            runs.append((kai_opt("cpsat", name, kai_extra), "single"))
        elif name == "kai-opt-gang":
            runs.append((kai_opt(args.gang_engine, name, kai_extra), "gang"))
    return runs


def table(results: list[Result], args: argparse.Namespace) -> str:
    bases = {r.round: r for r in results if r.run == "kube-scheduler" and r.ok}  # per round (one mode per call)
    head = ["round", "run", "workload", "mode", "nodes", "pods", "e2e pods/s", "bind pods/s", "create pods/s",
            "all bound (s)", "cpu ms/pod", "cluster ms/pod", "e2e vs kube-sched", "bind vs kube-sched",
            "vs 680 threshold (bind)", "note"]
    rows = []
    for r in results:
        base = bases.get(r.round)
        ratio_e2e = f"{r.e2e_pods_per_s / base.e2e_pods_per_s:.2f}" if base and r.ok else "-"
        ratio_bind = f"{r.bind_pods_per_s / base.bind_pods_per_s:.2f}" if base and r.ok else "-"
        cpu = f"{1000 * r.extra['scheduler_cpu_s'] / r.bound:.1f}" if r.bound and "scheduler_cpu_s" in r.extra else "-"
        cluster_cpu = f"{1000 * (r.extra['apiserver_cpu_s'] + r.extra.get('etcd_cpu_s', 0.0)) / r.bound:.1f}" \
            if r.bound and "apiserver_cpu_s" in r.extra else "-"
        rows.append([str(r.round), r.run, r.workload, r.mode, str(r.nodes), str(r.pods), f"{r.e2e_pods_per_s:.0f}",
                     f"{r.bind_pods_per_s:.0f}", f"{r.create_pods_per_s:.0f}",
                     f"{r.seconds_to_all_bound:.1f}", cpu, cluster_cpu, ratio_e2e, ratio_bind,
                     f"{r.bind_pods_per_s / SCHEDULER_PERF_THRESHOLD:.2f}", r.note or ("ok" if r.ok else "FAILED")])
    text = columns(head, rows)
    return text + "\n\n" + summary(results, bases) if len(bases) > 1 else text


def columns(head: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, each column as wide as its widest cell."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def summary(results: list[Result], bases: dict[int, Result]) -> str:
    """Per scheduler over the rounds: the median of its e2e rate and of its ratio to kube-scheduler in the same
    round (the machine drifts between rounds; a ratio within one round does not), the ratios' range, and the
    medians of its own and the cluster's CPU per pod."""
    head = ["run", "rounds", "median e2e pods/s", "median e2e vs kube-sched", "range vs kube-sched",
            "median cpu ms/pod", "median cluster ms/pod"]
    rows = []
    for name in dict.fromkeys(r.run for r in results):
        mine = [r for r in results if r.run == name and r.ok and r.bound]
        if not mine:
            continue
        ratios = [r.e2e_pods_per_s / bases[r.round].e2e_pods_per_s for r in mine if r.round in bases]
        cpu = [1000 * r.extra["scheduler_cpu_s"] / r.bound for r in mine if "scheduler_cpu_s" in r.extra]
        cluster = [1000 * (r.extra["apiserver_cpu_s"] + r.extra.get("etcd_cpu_s", 0.0)) / r.bound
                   for r in mine if "apiserver_cpu_s" in r.extra]
        rows.append([name, str(len(mine)), f"{statistics.median(r.e2e_pods_per_s for r in mine):.0f}",
                     f"{statistics.median(ratios):.2f}" if ratios else "-",
                     f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-",
                     f"{statistics.median(cpu):.1f}" if cpu else "-",
                     f"{statistics.median(cluster):.1f}" if cluster else "-"])
    return columns(head, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000, help="one-pod workloads (single)")
    ap.add_argument("--gangs", type=int, default=100)
    ap.add_argument("--gang-size", type=int, default=16)
    ap.add_argument("--gang-engine", default="greedy", choices=["greedy", "cpsat"])
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--only", action="append", choices=RUNS, help="run only these (repeatable)")
    ap.add_argument("--kai-grouping", choices=["precreated", "grouper"], default="precreated",
                    help="single-pod kai-opt workloads: PodGroups created by the bench before the clock starts, "
                         "or bare pods grouped by kai-opt's pod grouper (timed)")
    ap.add_argument("--kai-config", help="extra kai-opt config as JSON (merged into {engine: ...})")
    ap.add_argument("--mode", choices=["stream", "backlog"], default="stream",
                    help="stream: pods created while the (warmed-up) scheduler runs, clock from the first create; "
                         "backlog: pods created first, clock from the scheduler's start (includes its start-up)")
    ap.add_argument("--create-workers", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for all pods to be bound")
    ap.add_argument("--warmup-timeout", type=float, default=300.0)
    ap.add_argument("--json", help="write the results as JSON to this file ('-': stdout, no table)")
    ap.add_argument("--keep", action="store_true", help="keep each cluster's work directory and logs")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every scheduler this many times, interleaved (round 1 of each, then round 2, ...); "
                         "the table then also gives each one's medians, its ratio to kube-scheduler per round")
    args = ap.parse_args(argv)

    need_kube = not args.only or "kube-scheduler" in args.only
    proc = subprocess.run([str(ROOT / "scripts" / "build-testbin"), "kube-apiserver", "etcd", "kwok",
                           *(["kube-scheduler"] if need_kube else [])], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    os.environ.setdefault("KAI_OPT_TESTBIN", str(bin_dir))
    find_testbin()

    results: list[Result] = []
    for rnd, (sched, workload) in ((k, run) for k in range(1, max(args.rounds, 1) + 1)
                                   for run in plan_runs(args, bin_dir)):
        if sched.name.startswith("kai-opt") and not kai_opt_available():
            results.append(Result(sched.name, workload, args.mode, args.nodes, 0, ok=False, round=rnd,
                                  note="kai_opt/cli/run.py does not exist yet: `kai-opt run` not available"))
            continue
        log(f"== round {rnd}: {sched.name} / {workload}: {args.nodes} nodes")
        results.append(run_one(sched, workload, args, bin_dir))
        results[-1].round = rnd
        r = results[-1]
        log(f"== {sched.name} / {workload}: ok={r.ok} e2e {r.e2e_pods_per_s:.0f} pods/s, "
            f"bind {r.bind_pods_per_s:.0f} pods/s, load average {r.extra.get('load_1m_before', '-')} -> "
            f"{r.extra.get('load_1m_after', '-')} on {os.cpu_count()} CPUs {r.note}")

    out = {"threshold_pods_per_s": SCHEDULER_PERF_THRESHOLD, "cpus": os.cpu_count(),
           "args": {k: v for k, v in vars(args).items() if k != "json"}, "results": [asdict(r) for r in results]}
    if args.json == "-":
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(table(results, args))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
