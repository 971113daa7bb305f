"""Trace replay under the FGD paper's protocol, with the paper's placement policies vectorised over nodes.

Protocol, per seed (as in the ATC '23 FGD artifact, hkust-adsl/kubernetes-scheduler-simulator):

1. shuffle the pod list with the seed;
2. append copies drawn at random from the original list until the next copy would push the total GPU request
   above `inflate` x cluster GPU capacity (or drop random pods while the total is above it);
3. place the pods one at a time (or hand batches of `batch` pods to an external engine): a pod that does not fit
   is dropped, never retried, and placed pods never leave;
4. after each pod record the arrived GPU request (all pods so far, placed or not) and the allocated GPU share.

The metric is the unallocated GPU % (100 - allocated / capacity) at 100% arrived workload, discretised like the
paper's analysis scripts: the mean allocation over the events whose arrived % rounds to the integer 100.

A node fits a pod when its free CPU and memory cover the request, its GPU model is in the pod's `gpu_spec` and,
for a GPU-sharing pod, one GPU has enough free share, for a k-GPU pod, k GPUs are wholly free. Policies score
the fitting nodes (numpy over nodes); ties go to the first node in a random node order fixed per seed (the
simulator's kube-scheduler takes the smallest node name, and names start with a seeded permutation), except for the
kube-style `leastallocated` / `mostallocated`, which take the first fitting node in list order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from kai_opt.bench.openb import MILLI, NodeList, PodList
from kai_opt.errors import InputError
from kai_opt.heuristics.fragmentation import TYPICAL_COVERAGE, FragModel, Workload, spec_mask, typical_shapes

ENGINE_NAMES = ("greedy", "cpsat", "leastallocated", "mostallocated", "fgd", "bestfit", "dotprod", "gpupacking",
                "random")
BUILTIN_ENGINES = ("fgd", "bestfit", "dotprod", "gpupacking", "random", "leastallocated", "mostallocated")
# Published unallocated GPU % at 100% arrived workload, default openb trace, mean over 10 seeds (FGD paper, Fig. 9a).
PUBLISHED_AT_100: dict[str, float] = {"fgd": 4.77, "bestfit": 7.14, "gpupacking": 8.22, "dotprod": 9.38,
                                      "random": 13.70}
MAX_SPEC_CPU = 128_000  # the simulator's normalisers for BestFit and DotProd (milli-CPU, milli-GPU)
MAX_SPEC_GPU = 8_000
CURVE_RANGE = (75, 130)
# kai-opt's solver statuses (plan.solver.status) grouped by whose plan a cycle kept: the CP-SAT plan, the greedy plan
# because the CP-SAT plan was no better, or the greedy plan because CP-SAT failed or was worse
SOLVER_MIX: dict[str, tuple[str, ...]] = {"cpsat_chosen": ("OPTIMAL", "FEASIBLE"), "greedy_kept": ("GREEDY_KEPT",),
                                          "fallback_greedy": ("FALLBACK_GREEDY",)}

Placement = tuple[int, tuple[int, ...]]  # (node index, GPU indices on that node)


# -- arrays ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pods:
    """Pod requests as arrays; `allowed` is a bitmask over `Cluster.models` (-1: any model)."""

    cpu: np.ndarray
    mem: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    allowed: np.ndarray

    def __len__(self) -> int:
        return len(self.cpu)

    @property
    def request(self) -> np.ndarray:
        """Each pod's whole GPU request in milli-GPUs."""
        return self.num_gpu * self.gpu_milli

    def take(self, idx: np.ndarray | slice) -> Pods:
        return Pods(self.cpu[idx], self.mem[idx], self.num_gpu[idx], self.gpu_milli[idx], self.allowed[idx])

    @classmethod
    def from_list(cls, pods: PodList, models: Sequence[str]) -> Pods:
        return cls(pods.cpu_milli, pods.memory_mib, pods.num_gpu, pods.gpu_milli,
                   np.asarray([spec_mask(s, models) for s in pods.gpu_spec], dtype=np.int64))


@dataclass
class Cluster:
    """Mutable node state: free CPU / memory, free milli-share of every GPU (0 in padding slots), GPU model."""

    models: tuple[str, ...]
    model: np.ndarray  # (N,) index into models, -1 for nodes without GPUs
    gpu_count: np.ndarray  # (N,)
    cpu_cap: np.ndarray
    mem_cap: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    gpu_free: np.ndarray  # (N, G)

    @classmethod
    def from_nodes(cls, nodes: NodeList) -> Cluster:
        models = tuple(sorted({m for m in nodes.model if m}))
        if len(models) > 62:
            raise InputError(f"{len(models)} GPU models; at most 62 are supported", source=nodes.source)
        model = np.asarray([models.index(m) if m else -1 for m in nodes.model], dtype=np.int64)
        g = max(int(nodes.gpus.max()), 1)
        gpu_free = np.where(np.arange(g)[None, :] < nodes.gpus[:, None], MILLI, 0).astype(np.int64)
        return cls(models, model, nodes.gpus.copy(), nodes.cpu_milli.copy(), nodes.memory_mib.copy(),
                   nodes.cpu_milli.copy(), nodes.memory_mib.copy(), gpu_free)

    def copy(self) -> Cluster:
        return Cluster(self.models, self.model, self.gpu_count, self.cpu_cap, self.mem_cap, self.cpu_free.copy(),
                       self.mem_free.copy(), self.gpu_free.copy())

    def __len__(self) -> int:
        return len(self.cpu_cap)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI

    @property
    def used_gpu_milli(self) -> int:
        return self.total_gpu_milli - int(self.gpu_free.sum())

    def model_ok(self, allowed: int) -> np.ndarray:
        """(N,) whether each node's GPU model is allowed by the bitmask."""
        if allowed == -1:
            return np.ones(len(self), dtype=bool)
        return (self.model >= 0) & (((int(allowed) >> np.maximum(self.model, 0)) & 1) == 1)

    def fits(self, pods: Pods, i: int) -> np.ndarray:
        """(N,) whether pod i fits each node now."""
        ok = (self.cpu_free >= pods.cpu[i]) & (self.mem_free >= pods.mem[i])
        k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
        if k:
            ok &= self.model_ok(int(pods.allowed[i]))
            if d < MILLI:
                ok &= (self.gpu_free >= d).any(axis=1)
            else:
                ok &= (self.gpu_free == MILLI).sum(axis=1) >= k
        return ok

    def problem(self, pods: Pods, i: int, placement: Placement) -> str | None:
        """Why a placement of pod i is infeasible now, or None."""
        node, gpus = placement
        if not 0 <= node < len(self):
            return f"node index {node} out of range"
        k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
        if len(gpus) != k or len(set(gpus)) != k:
            return f"needs {k} distinct GPU indices, got {list(gpus)}"
        if any(not 0 <= g < self.gpu_count[node] for g in gpus):
            return f"GPU index out of range in {list(gpus)}"
        if not self.fits(pods, i)[node] or any(self.gpu_free[node, g] < d for g in gpus):
            return f"does not fit node {node}"
        return None

    def apply(self, pods: Pods, i: int, placement: Placement) -> None:
        node, gpus = placement
        self.cpu_free[node] -= pods.cpu[i]
        self.mem_free[node] -= pods.mem[i]
        for g in gpus:
            self.gpu_free[node, g] -= pods.gpu_milli[i]

    def release(self, pods: Pods, i: int, placement: Placement) -> None:
        """Undo `apply` (a pod leaves, or a tentative gang placement is rolled back)."""
        node, gpus = placement
        self.cpu_free[node] += pods.cpu[i]
        self.mem_free[node] += pods.mem[i]
        for g in gpus:
            self.gpu_free[node, g] += pods.gpu_milli[i]


def first_free_gpus(row: np.ndarray, k: int) -> tuple[int, ...]:
    """The k lowest-index wholly free GPUs."""
    return tuple(int(g) for g in np.flatnonzero(row == MILLI)[:k])


def tightest_gpu(row: np.ndarray, d: int) -> int:
    """The GPU with the least free share that still holds d (lowest index on ties)."""
    return int(np.where(row >= d, row, MILLI + 1).argmin())


def candidates(cluster: Cluster, pods: Pods, i: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices of the nodes pod i fits now (and that `mask` allows)."""
    ok = cluster.fits(pods, i)
    return np.flatnonzero(ok if mask is None else ok & mask)


def pick(cand: np.ndarray, scores: np.ndarray, rank: np.ndarray) -> tuple[int, int]:
    """(position in cand, node) of the highest score; ties go to the node of lowest rank."""
    best = np.flatnonzero(scores == scores.max())
    j = int(best[0] if best.size == 1 else best[np.argmin(rank[cand[best]])])
    return j, int(cand[j])


# -- policies --------------------------------------------------------------------------------------------------------


class Policy:
    """A one-pod-at-a-time placement rule: score the fitting nodes, pick the best, choose GPUs on it.

    Ties go to the first node in a random order fixed for the run, as in the simulator (its kube-scheduler picks
    the smallest node name among equal scores, and node names start with a seeded random permutation); with
    `random_ties = False` they go to the first node in list order.
    """

    random_ties = True

    def __init__(self, cluster: Cluster, rng: np.random.Generator) -> None:
        self.rng = rng
        self.rank = rng.permutation(len(cluster)) if self.random_ties else np.arange(len(cluster))

    def scores(self, cluster: Cluster, pods: Pods, i: int, cand: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def gpus(self, cluster: Cluster, pods: Pods, i: int, node: int) -> tuple[int, ...]:
        """Best-fit GPU choice: the tightest GPU for a sharing pod, the first whole free GPUs otherwise."""
        k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
        if k == 0:
            return ()
        row = cluster.gpu_free[node]
        return (tightest_gpu(row, d),) if d < MILLI else first_free_gpus(row, k)

    def place(self, cluster: Cluster, pods: Pods, i: int, mask: np.ndarray | None = None) -> Placement | None:
        """The policy's placement of pod i, or None; `mask` (N,) restricts the nodes further (selectors, ...)."""
        cand = candidates(cluster, pods, i, mask)
        if cand.size == 0:
            return None
        _, node = pick(cand, self.scores(cluster, pods, i, cand), self.rank)
        return node, self.gpus(cluster, pods, i, node)

    def applied(self, cluster: Cluster, node: int) -> None:
        """Called after a placement on `node` was applied (for policies that cache node state)."""


class RandomPolicy(Policy):
    """Random: a uniformly random fitting node, and a random GPU that holds a sharing pod."""

    def scores(self, cluster: Cluster, pods: Pods, i: int, cand: np.ndarray) -> np.ndarray:
        s = np.zeros(cand.size, dtype=np.int64)
        s[self.rng.integers(cand.size)] = 1
        return s

    def gpus(self, cluster: Cluster, pods: Pods, i: int, node: int) -> tuple[int, ...]:
        k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
        if k == 0 or d == MILLI:
            return super().gpus(cluster, pods, i, node)
        ok = np.flatnonzero(cluster.gpu_free[node] >= d)
        return (int(ok[self.rng.integers(ok.size)]),)


class BestFitPolicy(Policy):
    """BestFit: the node with the least CPU and GPU left after placement, each normalised by the largest spec."""

    def scores(self, cluster: Cluster, pods: Pods, i: int, cand: np.ndarray) -> np.ndarray:
        left = (cluster.cpu_free[cand] - pods.cpu[i]) / MAX_SPEC_CPU * 0.5
        left = left + (cluster.gpu_free[cand].sum(axis=1) - pods.request[i]) / MAX_SPEC_GPU * 0.5
        return ((1.0 - left) * 100).astype(np.int64)


class DotProdPolicy(Policy):
    """DotProd (Tetris): the node whose free (CPU, GPU) vector has the smallest dot product with the request."""

    def scores(self, cluster: Cluster, pods: Pods, i: int, cand: np.ndarray) -> np.ndarray:
        dot = (cluster.cpu_free[cand] / MAX_SPEC_CPU) * (pods.cpu[i] / MAX_SPEC_CPU)
        dot = dot + (cluster.gpu_free[cand].sum(axis=1) / MAX_SPEC_GPU) * (pods.request[i] / MAX_SPEC_GPU)
        return (100 * (1 - dot / 2)).astype(np.int64)


class GpuPackingPolicy(Policy):
    """GpuPacking: prefer partially used GPUs, then free GPUs on used nodes, then idle nodes (fewest GPUs first)."""

    def scores(self, cluster: Cluster, pods: Pods, i: int, cand: np.ndarray) -> np.ndarray:
        k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
        if k == 0:
            return np.zeros(cand.size, dtype=np.int64)
        free = cluster.gpu_free[cand]
        whole = (free == MILLI).sum(axis=1)
        idle = whole == cluster.gpu_count[cand]
        s = np.where(idle, np.maximum(33 - whole, whole), max(50 - k, 33))
        if d < MILLI:
            tight = np.where(free >= d, free, MILLI + 1).min(axis=1)
            shared = np.maximum(100 - (tight * 100 // MILLI) // 10, 50)
            s = np.where(~idle & (tight < MILLI), shared, s)
        return s.astype(np.int64)


class _KubePolicy(Policy):
    """kube-scheduler resource scoring over CPU, memory and GPU share (GPU-less nodes average CPU and memory)."""

    random_ties = False
    most = False

    def scores(self, cluster: Cluster, pods: Pods, i: int, cand: np.ndarray) -> np.ndarray:
        gcap = cluster.gpu_count[cand] * MILLI
        parts = []
        for cap, free, req in ((cluster.cpu_cap[cand], cluster.cpu_free[cand], pods.cpu[i]),
                               (cluster.mem_cap[cand], cluster.mem_free[cand], pods.mem[i]),
                               (gcap, cluster.gpu_free[cand].sum(axis=1), pods.request[i])):
            used = cap - free + req
            capx = np.maximum(cap, 1)
            parts.append(used * 100 // capx if self.most else (cap - used) * 100 // capx)
        has_gpu = (gcap > 0).astype(np.int64)
        return (parts[0] + parts[1] + parts[2] * has_gpu) // (2 + has_gpu)


class LeastAllocatedPolicy(_KubePolicy):
    """kube LeastAllocated: the node with the most free CPU, memory and GPU share (mean of 0-100 scores)."""


class MostAllocatedPolicy(_KubePolicy):
    """kube MostAllocated: the node with the least free CPU, memory and GPU share (mean of 0-100 scores)."""

    most = True


# -- FGD -------------------------------------------------------------------------------------------------------------


def typical_workload(pods: PodList, models: Sequence[str], coverage: float = TYPICAL_COVERAGE) -> Workload:
    """The most popular shapes covering `coverage` of the pods (ties: larger shape first), weights renormalised.

    Memory is not part of a shape, as in the paper's simulator.
    """
    return typical_shapes(pods.cpu_milli, pods.gpu_milli, pods.num_gpu, pods.gpu_spec, models, coverage)


class FgdPolicy(Policy):
    """Fragmentation Gradient Descent: the node (and GPU) whose expected fragmentation grows least.

    Node n's fragmentation for shape m is the free GPU share on n that m cannot use: all of it when m needs no
    GPU, is not allowed on n's model, or does not fit (too few GPUs with enough share, or too little CPU), else
    the share on GPUs with less free than m's per-GPU request. F_n = sum_m p_m F_n(m). Every candidate is scored
    int(100 * sigmoid((F_before - F_after) / 1000)) as in the simulator, so near-equal candidates tie (the node
    of lowest rank, then the lowest GPU index). Memory is not part of the fragmentation, as in the simulator.
    Per-node statistics (GPUs with at least / total share below each request level) are cached and updated only
    on the node that changed, so a candidate costs O(|M|).
    """

    def __init__(self, cluster: Cluster, rng: np.random.Generator, workload: Workload) -> None:
        super().__init__(cluster, rng)
        w = workload
        self.model = fm = FragModel(w.cpu, w.milli, w.num, w.weight)
        self.p, self.levels = fm.p, fm.levels
        ok = np.stack([cluster.model_ok(int(a)) for a in w.allowed], axis=1) if len(w) else np.zeros((len(cluster), 0))
        self.access = ok & fm.gpu_shape[None, :]
        n_gpu = cluster.gpu_free.shape[1]
        self._earlier = np.tri(n_gpu, k=-1, dtype=bool)[1:, :-1]  # [g, g']: g' < g, for g >= 1
        self.cnt, self.below = fm.levels_of(cluster.gpu_free)
        self.free = cluster.gpu_free.sum(axis=1)
        self.frag = self._frag(cluster.cpu_free, self.free, self.cnt, self.below, self.access)

    def node_fragmentation(self) -> np.ndarray:
        """(N,) F_n = sum_m p_m F_n(m) of the current state, in milli-GPUs."""
        return self.model.expected(self.frag)

    def _levels(self, gpu_free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.model.levels_of(gpu_free)

    def _frag(self, cpu: np.ndarray, free: np.ndarray, cnt: np.ndarray, below: np.ndarray,
              access: np.ndarray) -> np.ndarray:
        """(C, M) fragmentation of each candidate state for each shape, in milli-GPUs."""
        return self.model.frag(cpu, free, cnt, below, access)

    def _scores(self, nodes: np.ndarray, after: np.ndarray) -> np.ndarray:
        delta = (self.frag[nodes] - after) @ self.p
        return (1.0 / (1.0 + np.exp(-delta / 1000.0)) * 100).astype(np.int64)

    def place(self, cluster: Cluster, pods: Pods, i: int, mask: np.ndarray | None = None) -> Placement | None:
        cand = candidates(cluster, pods, i, mask)
        if cand.size == 0:
            return None
        k, d, x = int(pods.num_gpu[i]), int(pods.gpu_milli[i]), int(pods.cpu[i])
        if k == 1 and d < MILLI:
            return self._place_shared(cluster, cand, d, x)
        cnt = self.cnt[cand] - k if k else self.cnt[cand]
        after = self._frag(cluster.cpu_free[cand] - x, self.free[cand] - k * d, cnt, self.below[cand],
                           self.access[cand])
        _, node = pick(cand, self._scores(cand, after), self.rank)
        return node, first_free_gpus(cluster.gpu_free[node], k) if k else ()

    def _place_shared(self, cluster: Cluster, cand: np.ndarray, d: int, x: int) -> Placement:
        free = cluster.gpu_free[cand]
        ok = free >= d
        ok[:, 1:] &= ~(free[:, 1:, None] == free[:, None, :-1]).any(axis=2, where=self._earlier)  # equal GPUs: first
        r, g = np.nonzero(ok)  # candidates (node, GPU), grouped by node, GPUs ascending
        nodes = cand[r]
        a = free[r, g][:, None]
        na = a - d
        cnt, below = FragModel.step(self.cnt[nodes], self.below[nodes], self.levels, a[:, 0], na[:, 0])
        after = self._frag(cluster.cpu_free[nodes] - x, self.free[nodes] - d, cnt, below, self.access[nodes])
        score = self._scores(nodes, after)
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        node_best = np.maximum.reduceat(score, starts)
        j, node = pick(cand[r[starts]], node_best, self.rank)
        seg = score[starts[j]:]
        return node, (int(g[starts[j] + int(np.argmax(seg == node_best[j]))]),)

    def applied(self, cluster: Cluster, node: int) -> None:
        sl = slice(node, node + 1)
        cnt, below = self._levels(cluster.gpu_free[sl])
        self.cnt[sl], self.below[sl] = cnt, below
        self.free[node] = cluster.gpu_free[node].sum()
        self.frag[sl] = self._frag(cluster.cpu_free[sl], self.free[sl], cnt, below, self.access[sl])


# -- engines ---------------------------------------------------------------------------------------------------------


@runtime_checkable
class BatchEngine(Protocol):
    """An external engine: given a copy of the node arrays and the next batch of pods (in arrival order), return
    one placement per pod (None: leave it unplaced). Placements are applied in order and must all fit."""

    def place_batch(self, cluster: Cluster, pods: Pods) -> Sequence[Placement | None]: ...


@dataclass
class CycleResult:
    """One cycle of a `CycleEngine`: a placement (or None) per new pod, new places for running pods (keys:
    positions in the `running` pods it was given), and the engine's solver status of the cycle if it has one."""

    placements: Sequence[Placement | None]
    moves: Mapping[int, Placement] = field(default_factory=dict)
    status: str | None = None


@runtime_checkable
class CycleEngine(Protocol):
    """An external engine that sees the running pods (shapes, where they are) and may move them, as a scheduler
    with consolidation does. Moves land first (every moved pod leaves, then each takes its new place), then the
    new pods' placements in order; all must fit."""

    def place_cycle(self, cluster: Cluster, running: Pods, where: Sequence[Placement], pods: Pods) -> CycleResult:
        ...


EngineFactory = Callable[..., "Policy | BatchEngine | CycleEngine"]  # (cluster, workload, rng, **options)

_FACTORIES: dict[str, EngineFactory] = {
    "fgd": lambda c, w, r: FgdPolicy(c, r, w),
    "bestfit": lambda c, w, r: BestFitPolicy(c, r),
    "dotprod": lambda c, w, r: DotProdPolicy(c, r),
    "gpupacking": lambda c, w, r: GpuPackingPolicy(c, r),
    "random": lambda c, w, r: RandomPolicy(c, r),
    "leastallocated": lambda c, w, r: LeastAllocatedPolicy(c, r),
    "mostallocated": lambda c, w, r: MostAllocatedPolicy(c, r),
}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make `name` (e.g. greedy, cpsat) available to the replay; the factory returns a Policy, a BatchEngine or a
    CycleEngine. Options given to `replay` are passed to the factory as keyword arguments."""
    _FACTORIES[name] = factory


def available_engines() -> tuple[str, ...]:
    return tuple(n for n in ENGINE_NAMES if n in _FACTORIES) + tuple(n for n in _FACTORIES if n not in ENGINE_NAMES)


def check_engines(names: Sequence[str]) -> None:
    for n in names:
        if n not in _FACTORIES:
            known = ", ".join(available_engines())
            why = "is not wired into the trace replay yet" if n in ENGINE_NAMES else "is unknown"
            raise InputError(f"engine {n!r} {why} (available: {known})", field="--engines")


# -- replay ----------------------------------------------------------------------------------------------------------


def pod_sequence(pods: PodList, capacity_milli: int, seed: int, inflate: float) -> np.ndarray:
    """Indices into `pods`: shuffled, then inflated (or trimmed) to `inflate` x capacity of GPU request."""
    rng = np.random.default_rng(seed)
    n = len(pods)
    order = rng.permutation(n)
    if inflate <= 0:
        return order
    req = pods.total_milli
    target = inflate * capacity_milli
    total = int(req.sum())
    if total > target:
        drop = rng.permutation(n)
        left = total - np.cumsum(req[order[drop]])
        cut = int(np.argmax(left <= target)) + 1
        keep = np.ones(n, dtype=bool)
        keep[drop[:cut]] = False
        return order[keep]
    extra: list[np.ndarray] = []
    while True:
        draw = rng.integers(n, size=4096)
        cum = total + np.cumsum(req[draw])
        over = np.flatnonzero(cum > target)
        if over.size:
            extra.append(draw[:over[0]])
            break
        extra.append(draw)
        total = int(cum[-1])
    return np.concatenate([order, *extra])


def events_at(arrived: np.ndarray, capacity_milli: int, pct: int) -> np.ndarray:
    """The arrivals (indexes into the cumulative arrived request) a result at `pct` arrived is the mean over:
    those whose arrived % rounds to pct, else to pct +- 1 (the paper's scripts); for coarse traces, else the last
    one at or below pct. Empty if pct was not reached."""
    exact = arrived * 100.0 / capacity_milli
    rounded = np.round(exact)
    sel = np.flatnonzero(rounded == pct)
    if not len(sel):
        sel = np.flatnonzero(np.abs(rounded - pct) <= 1)
    if len(sel):
        return sel
    below = np.flatnonzero(exact <= pct)
    return below[-1:] if below.size and exact[-1] >= pct else np.zeros(0, dtype=np.int64)


@dataclass
class Run:
    """One replay: per arrived pod, the cumulative arrived GPU request and the allocated GPU share (milli)."""

    engine: str
    seed: int
    batch: int
    capacity_milli: int
    arrived: np.ndarray
    used: np.ndarray
    placed: np.ndarray
    seconds: float
    moves: int = 0  # running pods a CycleEngine moved
    options: dict[str, object] = field(default_factory=dict)  # engine options (e.g. consolidation)
    cycles: int = 0  # calls of an external engine (BatchEngine or CycleEngine); 0 for a Policy
    solver_status: dict[str, int] = field(default_factory=dict)  # cycles per status a CycleEngine reported

    @property
    def moves_per_pod(self) -> float:
        """Running pods moved per arrived pod, over the whole run: what the unallocated share cost in moves."""
        return self.moves / len(self.placed) if len(self.placed) else 0.0

    def alloc_pct_at(self, pct: int) -> float:
        """Allocated GPU % at `pct` arrived: the mean over `events_at` (NaN if pct was not reached)."""
        sel = events_at(self.arrived, self.capacity_milli, pct)
        alloc = np.round(self.used[sel] * 100.0 / self.capacity_milli, 2)
        return float(alloc.mean()) if len(sel) else float("nan")

    def unallocated_at(self, pct: int = 100) -> float:
        return 100.0 - self.alloc_pct_at(pct)

    def curve(self, lo: int = CURVE_RANGE[0], hi: int = CURVE_RANGE[1]) -> list[list[float]]:
        """[[arrived %, unallocated %], ...] for the integer arrived percentages lo..hi that were reached."""
        out = []
        for p in range(lo, hi + 1):
            u = self.unallocated_at(p)
            if u == u:  # not NaN
                out.append([float(p), round(u, 4)])
        return out

    def to_json(self) -> dict[str, object]:
        at100 = self.unallocated_at(100)
        return {"engine": self.engine, **self.options, "seed": self.seed, "batch": self.batch,
                "unallocated_pct_at_100": round(at100, 4) if at100 == at100 else None, "curve": self.curve(),
                "pods": len(self.placed), "placed": int(self.placed.sum()), "moves": self.moves,
                "moves_per_pod": round(self.moves_per_pod, 6), "cycles": self.cycles,
                "solver_status": dict(self.solver_status), "seconds": round(self.seconds, 3)}


def replay(nodes: NodeList, pods: PodList, engine: str, seed: int, *, inflate: float = 1.3, batch: int = 1,
           workload: Workload | None = None, progress: Callable[[int], None] | None = None,
           options: Mapping[str, object] | None = None) -> Run:
    """Replay the trace once with one engine and seed (see the module docstring for the protocol). `options`
    are passed to the engine's factory (e.g. `consolidation=True` for kai-opt's engines) and kept in the Run."""
    check_engines([engine])
    if batch < 1:
        raise InputError(f"batch must be at least 1, got {batch}", field="--batch")
    t0 = time.perf_counter()
    cluster = Cluster.from_nodes(nodes)
    seq = pod_sequence(pods, cluster.total_gpu_milli, seed, inflate)
    shapes = Pods.from_list(pods, cluster.models).take(seq)
    wl = workload if workload is not None else typical_workload(pods, cluster.models)
    opts = dict(options or {})
    eng = _FACTORIES[engine](cluster, wl, np.random.default_rng([seed, 7919]), **opts)
    placed = np.zeros(len(shapes), dtype=bool)
    where: dict[int, Placement] = {}  # placed pods' places, kept for CycleEngines
    moves = done = cycles = 0
    statuses: dict[str, int] = {}
    for start in range(0, len(shapes), batch):
        stop = min(start + batch, len(shapes))
        moves += play_batch(eng, engine, cluster, shapes, start, stop, placed, where, statuses)
        cycles += not isinstance(eng, Policy)
        if progress is not None and (stop - done >= 256 or stop == len(shapes) or not isinstance(eng, Policy)):
            progress(stop - done)
            done = stop
    req = shapes.request
    return Run(engine, seed, batch, cluster.total_gpu_milli, np.cumsum(req), np.cumsum(req * placed), placed,
               time.perf_counter() - t0, moves, opts, cycles, statuses)


def play_batch(eng: Policy | CycleEngine | BatchEngine, engine: str, cluster: Cluster, shapes: Pods, start: int,
               stop: int, placed: np.ndarray, where: dict[int, Placement], statuses: dict[str, int]) -> int:
    """Arrivals start..stop placed on `cluster` (a policy one pod at a time, an engine as one cycle); `placed`,
    `where` and `statuses` updated. Returns the running pods moved."""
    if isinstance(eng, Policy):
        for i in range(start, stop):
            pl = eng.place(cluster, shapes, i)
            if pl is not None:
                cluster.apply(shapes, i, pl)
                eng.applied(cluster, pl[0])
                placed[i] = True
        return 0
    if isinstance(eng, CycleEngine):
        return _apply_cycle(eng, engine, cluster, shapes, start, stop, placed, where, statuses)
    _apply_batch(eng, engine, cluster, shapes, start, stop, placed)
    return 0


def _apply_batch(eng: BatchEngine, name: str, cluster: Cluster, shapes: Pods, start: int, stop: int,
                 placed: np.ndarray) -> None:
    result = list(eng.place_batch(cluster.copy(), shapes.take(slice(start, stop))))
    if len(result) != stop - start:
        raise ValueError(f"engine {name} returned {len(result)} placements for {stop - start} pods")
    for i, pl in enumerate(result, start=start):
        if pl is None:
            continue
        pl = (int(pl[0]), tuple(int(g) for g in pl[1]))
        why = cluster.problem(shapes, i, pl)
        if why:
            raise ValueError(f"engine {name} placed pod {i} infeasibly: {why}")
        cluster.apply(shapes, i, pl)
        placed[i] = True


def _apply_cycle(eng: CycleEngine, name: str, cluster: Cluster, shapes: Pods, start: int, stop: int,
                 placed: np.ndarray, where: dict[int, Placement], statuses: dict[str, int] | None = None) -> int:
    """One CycleEngine cycle: checked moves first, then the new pods; returns the number of pods moved and counts
    the cycle's solver status in `statuses`."""
    running = np.asarray(sorted(where), dtype=np.int64)
    result = eng.place_cycle(cluster.copy(), shapes.take(running), [where[int(i)] for i in running],
                             shapes.take(slice(start, stop)))
    if statuses is not None and result.status is not None:
        statuses[result.status] = statuses.get(result.status, 0) + 1
    if len(result.placements) != stop - start:
        raise ValueError(f"engine {name} returned {len(result.placements)} placements for {stop - start} pods")
    moves = {}
    for k, pl in result.moves.items():
        if not 0 <= int(k) < len(running):
            raise ValueError(f"engine {name} moved running pod {k} of {len(running)}")
        i = int(running[int(k)])
        new = (int(pl[0]), tuple(int(g) for g in pl[1]))
        if new != where[i]:
            moves[i] = new
    for i in moves:
        cluster.release(shapes, i, where[i])
    for i, pl in moves.items():
        why = cluster.problem(shapes, i, pl)
        if why:
            raise ValueError(f"engine {name} moved pod {i} infeasibly: {why}")
        cluster.apply(shapes, i, pl)
        where[i] = pl
    for i, pl in enumerate(result.placements, start=start):
        if pl is None:
            continue
        pl = (int(pl[0]), tuple(int(g) for g in pl[1]))
        why = cluster.problem(shapes, i, pl)
        if why:
            raise ValueError(f"engine {name} placed pod {i} infeasibly: {why}")
        cluster.apply(shapes, i, pl)
        placed[i] = True
        where[i] = pl
    return len(moves)


# -- summaries -------------------------------------------------------------------------------------------------------


def solver_mix(statuses: Mapping[str, int]) -> dict[str, int]:
    """Cycles per SOLVER_MIX group; `other` counts the rest (e.g. HEURISTIC: the greedy engine has no solver)."""
    mix = {group: sum(statuses.get(s, 0) for s in names) for group, names in SOLVER_MIX.items()}
    mix["other"] = sum(statuses.values()) - sum(mix.values())
    return mix


def summarize(runs: Sequence[Run]) -> list[dict[str, object]]:
    """Per engine and options (first-seen order): mean and sample sd over seeds at 100%, the published number,
    the mean moves and moves per arrived pod, the cycles and solver statuses summed over seeds, the mean curve."""
    out = []
    for name, opts in dict.fromkeys((r.engine, tuple(r.options.items())) for r in runs):
        rs = [r for r in runs if r.engine == name and tuple(r.options.items()) == opts]
        at100 = np.asarray([r.unallocated_at(100) for r in rs])
        at100 = at100[~np.isnan(at100)]  # runs that never reached 100% arrived do not count
        curves = [dict((int(p), u) for p, u in r.curve()) for r in rs]
        common = sorted(set.intersection(*(set(c) for c in curves)))
        pub = PUBLISHED_AT_100.get(name)
        mean = round(float(at100.mean()), 4) if at100.size else None
        statuses: dict[str, int] = {}
        for r in rs:
            for s, n in r.solver_status.items():
                statuses[s] = statuses.get(s, 0) + n
        out.append({
            "engine": name, **dict(opts), "seeds": [r.seed for r in rs], "batch": rs[0].batch,
            "unallocated_pct_at_100_mean": mean,
            "unallocated_pct_at_100_sd": round(float(at100.std(ddof=1)), 4) if at100.size > 1 else None,
            "published_at_100": pub,
            "delta_vs_published": round(mean - pub, 4) if pub is not None and mean is not None else None,
            "moves_mean": round(float(np.mean([r.moves for r in rs])), 2),
            "moves_per_pod_mean": round(float(np.mean([r.moves_per_pod for r in rs])), 6),
            "cycles": sum(r.cycles for r in rs), "solver_status": statuses, "solver_mix": solver_mix(statuses),
            "seconds_per_run": round(float(np.mean([r.seconds for r in rs])), 3),
            "curve_mean": [[float(p), round(float(np.mean([c[p] for c in curves])), 4)] for p in common],
        })
    return out
