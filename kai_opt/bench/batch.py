"""kai-opt's engines (`greedy`, `cpsat`) in the trace replay, batch mode: each cycle the running pods and the next
K arrivals become a snapshot (one queue, every pod its own PodGroup of one, priority class `train`), the engine
runs one cycle on it, and its binds (and, with consolidation, its moves of running pods) go back to the replay.

Nodes carry their trace GPU model as a label and a pod's `gpu_spec` becomes a required node affinity on it, so the
trace's model rule holds. Running pods are preemptible, so consolidation may move them; reclaim, preempt and
stale-gang have nothing to act on (one queue, one priority, gangs of one) and are off. A pod the cycle leaves
pending is dropped, as in the replay protocol. Parsed objects are reused across cycles (`Snapshot` memo), so a
cycle costs the engine's time plus building the ClusterState.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kai_opt.actions import ACTION_ORDER
from kai_opt.bench.openb import MILLI
from kai_opt.bench.trace import Cluster, CycleResult, Placement, Pods, Workload, register_engine
from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.state import build_state

NAMESPACE = "trace"
QUEUE = "trace"
PRIORITY_CLASS = "train"  # preemptible: consolidation may move running pods
MODEL_LABEL = "kai-opt.io/trace-gpu-model"
EPOCH = 1_767_225_600.0  # arrival i is created at EPOCH + i seconds
GPU = "nvidia.com/gpu"


def _ts(epoch: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(int(epoch), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def trace_config(base: Config, engine: Engine, consolidation: bool) -> Config:
    """The cycle configuration: `base` (solver budget, placement strategy, ...) with the engine and only the
    actions that can act in a trace (allocate, and consolidate when asked)."""
    actions = base.actions.model_copy(update={name: name == "allocate" or (name == "consolidate" and consolidation)
                                              for name in ACTION_ORDER})
    return base.model_copy(update={"engine": engine, "actions": actions, "max_consolidation_preemptees":
                                   base.max_consolidation_preemptees if consolidation else 0})


class KaiOptCycleEngine:
    """A `CycleEngine` running kai-opt's `run_cycle` on a snapshot built from the replay's state."""

    def __init__(self, cluster: Cluster, engine: Engine, config: Config, consolidation: bool) -> None:
        self.engine = engine
        self.config = trace_config(config, engine, consolidation)
        self.names = [f"trace-node-{i:05d}" for i in range(len(cluster))]
        self.node_index = {n: i for i, n in enumerate(self.names)}
        self.models = cluster.models
        self.memo: dict[tuple[str, ...], Any] = {}
        self.static = [self._node(cluster, i) for i in range(len(cluster))] + self._queue_objects()
        self.arrived = 0  # arrivals seen so far: the next batch's first pod is arrival `arrived`
        self.ids: list[int] = []  # arrival number of each running pod, in the replay's running order
        self.cycles = 0
        self.hints: dict[str, int] = {}  # cycles per starting plan the engine kept (cpsat: kai or fgd)

    # -- objects -------------------------------------------------------------------------------------------------
    def _node(self, cluster: Cluster, i: int) -> RawObject:
        name = self.names[i]
        labels = {"kubernetes.io/hostname": name}
        if cluster.model[i] >= 0:
            labels[MODEL_LABEL] = f"m{int(cluster.model[i])}"
        res = {"cpu": f"{int(cluster.cpu_cap[i])}m", "memory": f"{int(cluster.mem_cap[i])}Mi",
               GPU: str(int(cluster.gpu_count[i])), "pods": "100000"}
        obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {},
               "status": {"capacity": dict(res), "allocatable": res,
                          "conditions": [{"type": "Ready", "status": "True"}]}}
        return RawObject("Node", obj, memo_key=("Node", name))

    @staticmethod
    def _queue_objects() -> list[RawObject]:
        unl = {"quota": -1, "overQuotaWeight": 1, "limit": -1}
        queue = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": QUEUE},
                 "spec": {"resources": {"gpu": dict(unl), "cpu": dict(unl), "memory": dict(unl)}}}
        pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": PRIORITY_CLASS},
              "value": 50}
        return [RawObject("Queue", queue, memo_key=("Queue", QUEUE)),
                RawObject("PriorityClass", pc, memo_key=("PriorityClass", PRIORITY_CLASS))]

    def _pod(self, pods: Pods, j: int, arrival: int, where: Placement | None) -> list[RawObject]:
        """The PodGroup and the pod of arrival `arrival` (shape j of `pods`), running at `where` if given."""
        name = f"p{arrival}"
        created = _ts(EPOCH + arrival)
        pg = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
              "metadata": {"name": name, "namespace": NAMESPACE, "creationTimestamp": created},
              "spec": {"minMember": 1, "queue": QUEUE, "priorityClassName": PRIORITY_CLASS}}
        k, d = int(pods.num_gpu[j]), int(pods.gpu_milli[j])
        ann = {"pod-group-name": name}
        req = {"cpu": f"{int(pods.cpu[j])}m", "memory": f"{int(pods.mem[j])}Mi"}
        limits: dict[str, str] = {}
        if k and d < MILLI:
            ann["gpu-fraction"] = f"{d / MILLI:g}"
        elif k:
            req[GPU] = limits[GPU] = str(k)
        spec: dict[str, Any] = {"schedulerName": "kai-opt", "priorityClassName": PRIORITY_CLASS,
                                "containers": [{"name": "main", "resources": {"requests": req, "limits": limits}}]}
        allowed = int(pods.allowed[j])
        if k and allowed != -1:
            values = [f"m{m}" for m in range(len(self.models)) if (allowed >> m) & 1] or ["none"]
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": MODEL_LABEL, "operator": "In",
                                                             "values": values}]}]}}}
        status: dict[str, Any] = {"phase": "Pending"}
        version = "pending"
        if where is not None:
            node, gpus = where
            spec["nodeName"] = self.names[node]
            if gpus:
                ann["kai-opt.io/gpu-devices"] = ",".join(str(g) for g in gpus)
            status = {"phase": "Running", "startTime": created}
            version = f"{node}:{','.join(map(str, gpus))}"
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NAMESPACE, "creationTimestamp": created,
                            "labels": {"kai.scheduler/queue": QUEUE}, "annotations": ann},
               "spec": spec, "status": status}
        return [RawObject("PodGroup", pg, memo_key=("PodGroup", name)),
                RawObject("Pod", pod, memo_key=("Pod", name, version))]

    # -- one cycle -----------------------------------------------------------------------------------------------
    def place_cycle(self, cluster: Cluster, running: Pods, where: Sequence[Placement], pods: Pods) -> CycleResult:
        first = self.arrived
        if len(self.ids) != len(running):
            raise ValueError(f"replay has {len(running)} running pods, the engine placed {len(self.ids)}")
        objs = list(self.static)
        for j, (arrival, pl) in enumerate(zip(self.ids, where, strict=True)):
            objs += self._pod(running, j, arrival, pl)
        for j in range(len(pods)):
            objs += self._pod(pods, j, first + j, None)
        self.arrived += len(pods)
        now = EPOCH + self.arrived + 86_400 + self.cycles
        self.cycles += 1
        snap = Snapshot.from_objects(objs, now=now, source="trace", memo=self.memo)
        state = build_state(snap, now=now, default_queue=QUEUE)
        plan, _ = run_cycle(state, self.config, engine=self.engine)
        if plan.solver.hint:
            self.hints[plan.solver.hint] = self.hints.get(plan.solver.hint, 0) + 1
        index_of = {f"{NAMESPACE}/p{a}": r for r, a in enumerate(self.ids)}
        placements: list[Placement | None] = [None] * len(pods)
        moves: dict[int, Placement] = {}
        for pl in plan.placements:
            arrival = int(state.pods[pl.pod].meta.name[1:])
            target = (self.node_index[state.node_names[pl.node]], tuple(int(d) for d in pl.devices))
            if pl.moved:
                moves[index_of[state.pods[pl.pod].key]] = target
            elif arrival >= first:
                placements[arrival - first] = target
        # the replay keeps running pods in arrival order: the new ones follow the old
        self.ids = sorted(self.ids + [first + j for j, p in enumerate(placements) if p is not None])
        return CycleResult(placements, moves, plan.solver.status)


def factory(engine: Engine, config: Config | None = None) -> Callable[..., KaiOptCycleEngine]:
    """A replay EngineFactory for `engine`; the replay's options: `consolidation` (default True)."""

    def make(cluster: Cluster, workload: Workload, rng: np.random.Generator, *,
             consolidation: bool = True) -> KaiOptCycleEngine:
        return KaiOptCycleEngine(cluster, engine, config or Config(), consolidation)

    return make


def register(config: Config | None = None) -> None:
    """Wire `greedy` and `cpsat` into the replay (with `config`: solver budget, placement strategy, ...)."""
    register_engine("greedy", factory(Engine.greedy, config))
    register_engine("cpsat", factory(Engine.cpsat, config))


register()
