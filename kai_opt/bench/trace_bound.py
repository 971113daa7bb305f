"""Lower bounds on the unallocated GPU % of a trace replay (issue 17): how far any engine could go on a seed.

At each arrival a replay's result at 100% arrived is the mean over (`trace.events_at`), the GPU requests that
arrived so far are packed onto the cluster's GPU devices by a linear program that ignores CPU, memory, GPU
models, node boundaries and the arrival order (a relaxation, so no engine, moves included, allocates more):

- `any_engine`: the most GPU share the arrived pods can hold. Whole-GPU pods take whole devices; GPU shares are
  packed into devices by an arc-flow model (Valerio de Carvalho's; its LP equals the cutting-stock LP bound),
  where a share may also stay out. 100 minus that share of capacity is a lower bound on the unallocated %.
- `every_share_placed`: the GPU share wasted on devices when every arrived share is placed (the fewest devices
  that hold all of them, rounded up from the same LP, times a device, less the shares): what an engine that places
  every share leaves unallocated at least.

A GPU share of a pod asking for several devices counts as that many one-device shares (a relaxation too). Each
bound of a seed is the mean over the same arrivals as the replay's result, so it compares with it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, reduce

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix, vstack

from kai_opt.bench import trace
from kai_opt.bench.openb import MILLI, NodeList, PodList


@dataclass(frozen=True)
class TraceBound:
    """Lower bounds (percent of the cluster's GPUs) on the unallocated GPU share at one arrival."""

    any_engine: float
    every_share_placed: float
    arrived_pct: float

    def to_json(self) -> dict[str, float]:
        return {"any_engine": round(self.any_engine, 4), "every_share_placed": round(self.every_share_placed, 4),
                "arrived_pct": round(self.arrived_pct, 4)}


def seed_bound(nodes: NodeList, pods: PodList, seed: int, inflate: float, pct: int = 100) -> TraceBound | None:
    """The bounds of one seed's replay at `pct` arrived: the mean over the arrivals its result averages (None when
    the sequence never reaches pct)."""
    capacity = nodes.total_gpu_milli
    seq = trace.pod_sequence(pods, capacity, seed, inflate)
    num, milli = pods.num_gpu[seq], pods.gpu_milli[seq]
    events = trace.events_at(np.cumsum(num * milli), capacity, pct)
    if not len(events):
        return None
    devices = int(nodes.gpus.sum())
    each = [bound_at(num[: i + 1], milli[: i + 1], devices) for i in events.tolist()]
    return TraceBound(*(float(np.mean([getattr(b, f) for b in each]))
                        for f in ("any_engine", "every_share_placed", "arrived_pct")))


def bound_at(num_gpu: np.ndarray, gpu_milli: np.ndarray, devices: int) -> TraceBound:
    """The bounds for arrived pods with these requests (`num_gpu` devices of `gpu_milli` each) on `devices` GPUs."""
    cap = devices * MILLI
    share = (num_gpu > 0) & (gpu_milli < MILLI)
    whole = int(num_gpu[(num_gpu > 0) & (gpu_milli >= MILLI)].sum())
    sizes, counts = np.unique(np.repeat(gpu_milli[share], num_gpu[share]), return_counts=True)
    arrived = int((num_gpu * gpu_milli).sum())
    if not len(sizes):
        alloc = min(whole, devices) * MILLI
        return TraceBound(100.0 - alloc * 100.0 / cap, 0.0, arrived * 100.0 / cap)
    flow = _arc_flow(tuple(sizes.tolist()))
    placed = flow.max_allocated(counts, devices, whole)
    least = flow.fewest_devices(counts)
    waste = math.ceil(least - 1e-6) * MILLI - int((sizes * counts).sum())
    return TraceBound(100.0 - placed * 100.0 / cap, max(0.0, waste * 100.0 / cap), arrived * 100.0 / cap)


@lru_cache(maxsize=8)
def _arc_flow(sizes: tuple[int, ...]) -> _ArcFlow:
    """The arc-flow network of these share sizes (the arrivals of a seed mostly share one)."""
    return _ArcFlow(np.asarray(sizes, dtype=np.int64))


class _ArcFlow:
    """Devices as paths from 0 to one device's capacity (in units of the sizes' common divisor): an item arc per
    share size from each reachable fill level, and a loss arc from each level to the end. Variables: the item
    arcs, the loss arcs, then (max_allocated) the whole devices."""

    def __init__(self, sizes: np.ndarray) -> None:
        unit = reduce(math.gcd, [int(s) for s in sizes], MILLI)
        self.sizes = sizes
        self.top = MILLI // unit
        steps = (sizes // unit).tolist()
        reach = np.zeros(self.top + 1, dtype=bool)
        reach[0] = True
        for s in sorted(steps):  # fill levels some multiset of sizes reaches
            for a in range(self.top - s, -1, -1):
                if reach[a]:
                    k = a + s
                    while k <= self.top and not reach[k]:
                        reach[k] = True
                        k += s
        levels = np.flatnonzero(reach)
        tail, head, kind = [], [], []
        for j, s in enumerate(steps):
            at = levels[levels + s <= self.top]
            tail.append(at)
            head.append(at + s)
            kind.append(np.full(len(at), j))
        loss = levels[levels < self.top]
        self.tail = np.concatenate([*tail, loss])
        self.head = np.concatenate([*head, np.full(len(loss), self.top)])
        self.kind = np.concatenate([*kind, np.full(len(loss), -1)])  # size index, -1: loss
        self.levels = levels
        n = len(self.tail)
        self.eq = {extra: self._conservation(extra) for extra in (0, 1)}
        self.per = {extra: self._per_size(extra).tocsr() for extra in (0, 1)}
        self.gain = np.zeros(n + 1)
        items = self.kind >= 0
        self.gain[:n][items] = self.sizes[self.kind[items]]
        self.gain[n] = MILLI

    def _conservation(self, extra: int) -> csr_matrix | None:
        """Flow in = flow out at every inner level (rows), over the arcs and `extra` more columns (None: no inner
        level)."""
        n = len(self.tail)
        inner = {int(v): i for i, v in enumerate(self.levels[(self.levels > 0) & (self.levels < self.top)])}
        rows, cols, vals = [], [], []
        for a, (t, h) in enumerate(zip(self.tail.tolist(), self.head.tolist(), strict=True)):
            if t in inner:
                rows.append(inner[t])
                cols.append(a)
                vals.append(-1.0)
            if h in inner:
                rows.append(inner[h])
                cols.append(a)
                vals.append(1.0)
        return coo_matrix((vals, (rows, cols)), shape=(len(inner), n + extra)).tocsr() if inner else None

    def _per_size(self, extra: int) -> coo_matrix:
        """Row j: the flow on size j's item arcs."""
        items = np.flatnonzero(self.kind >= 0)
        return coo_matrix((np.ones(len(items)), (self.kind[items], items)),
                          shape=(len(self.sizes), len(self.tail) + extra))

    def _out_of_zero(self, extra: int) -> np.ndarray:
        row = np.zeros(len(self.tail) + extra)
        row[: len(self.tail)] = self.tail == 0
        return row

    def max_allocated(self, counts: np.ndarray, devices: int, whole: int) -> float:
        """The most milli-GPU the shares (each size at most its count) and `whole` whole GPUs take on `devices`."""
        n = len(self.tail)
        cap_row = self._out_of_zero(1)
        cap_row[n] = 1.0  # share devices + whole devices <= devices
        a_ub = vstack([self.per[1], csr_matrix(cap_row[None, :])]).tocsr()
        b_ub = np.concatenate([counts.astype(float), [float(devices)]])
        return -self._solve(-self.gain, a_ub, b_ub, 1, [(0, None)] * n + [(0, whole)])

    def fewest_devices(self, counts: np.ndarray) -> float:
        """The fewest devices (LP) that hold every share (each size's count)."""
        n = len(self.tail)
        return self._solve(self._out_of_zero(0), -self.per[0], -counts.astype(float), 0, [(0, None)] * n)

    def _solve(self, c: np.ndarray, a_ub: csr_matrix, b_ub: np.ndarray, extra: int,
               bounds: list[tuple[float, float | None]]) -> float:
        eq = self.eq[extra]
        res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=eq, b_eq=None if eq is None else np.zeros(eq.shape[0]),
                      bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"trace bound LP failed: {res.message}")
        return float(res.fun)
