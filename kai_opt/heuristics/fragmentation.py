"""FGD's GPU fragmentation (Weng et al., ATC '23), shared by the trace replay's FGD policy, the benchmark's
fragmentation metric and the greedy engine's `placement.gpu: fgd`.

A target workload M is a set of pod shapes (CPU milli, milli-GPU per device, device count) with popularity p_m.
Node n's fragmentation for shape m is the free GPU share on n that m cannot use: all of it when m needs no GPU,
is not allowed on n, or does not fit n (too few devices with enough free share, or too little free CPU), else the
share on devices with less free than m's per-device request. F_n = sum_m p_m F_n(m), in milli-GPUs.

Per node the math needs only, for each distinct per-device request level u of the workload, how many devices
have free >= u (`cnt`) and the total free on devices with free < u (`below`), plus the node's free GPU share and
free CPU; so candidate states after a placement are cheap to score, vectorised over nodes (and devices).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

MILLI = 1000  # milli-GPU per device
TYPICAL_COVERAGE = 0.95  # FGD's target workload: the most popular pod shapes covering 95% of the pods


@dataclass(frozen=True)
class Workload:
    """FGD's target workload M: pod shapes (CPU, per-GPU milli, GPU count, allowed models) and popularity p_m."""

    cpu: np.ndarray
    milli: np.ndarray
    num: np.ndarray
    allowed: np.ndarray
    weight: np.ndarray
    spec: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.cpu)


def spec_mask(spec: str, models: Sequence[str]) -> int:
    """Bitmask of the models a `gpu_spec` allows (-1 when it is empty); unknown models match no node."""
    names = [s for s in spec.split("|") if s]
    if not names:
        return -1
    return sum(1 << j for j, m in enumerate(models) if m in names)


def popular_shapes(shapes: Sequence[Hashable], coverage: float = TYPICAL_COVERAGE) -> list[tuple[int, Hashable]]:
    """(count, shape) of the most popular shapes covering `coverage` of `shapes` (ties: larger shape first)."""
    counts = Counter(shapes)
    if not counts:
        raise ValueError("a target workload needs at least one pod")
    ranked = sorted(((n, shape) for shape, n in counts.items()), reverse=True)
    need, got, chosen = coverage * len(shapes), 0, []
    for n, shape in ranked:
        if got >= need:
            break
        chosen.append((n, shape))
        got += n
    return chosen


def popular_rows(rows: np.ndarray, coverage: float = TYPICAL_COVERAGE) -> tuple[np.ndarray, np.ndarray]:
    """popular_shapes for shapes that are rows of small integers (int64[P, k]), in bulk: (counts, rows) of the
    chosen shapes in the same order (most popular first; ties: larger shape first). Each row is packed into one
    integer (mixed radix over the columns' ranges, first column most significant, so integer order is tuple
    order); rows whose ranges do not fit 62 bits go through popular_shapes."""
    if not len(rows):
        raise ValueError("a target workload needs at least one pod")
    # (column by column: a reduction over axis 0 of a tall (P, k) array is several times slower)
    low = np.array([rows[:, c].min() for c in range(rows.shape[1])], dtype=rows.dtype)
    span = np.array([rows[:, c].max() for c in range(rows.shape[1])], dtype=rows.dtype) - low + 1
    if float(np.prod(span.astype(np.float64))) >= 2.0 ** 62:
        chosen = popular_shapes([tuple(r) for r in rows.tolist()], coverage)
        return (np.array([n for n, _ in chosen], dtype=np.int64),
                np.array([shape for _, shape in chosen], dtype=np.int64).reshape(-1, rows.shape[1]))
    key = np.zeros(len(rows), dtype=np.int64)
    for c in range(rows.shape[1]):
        key = key * span[c] + (rows[:, c] - low[c])
    uniq, first, counts = np.unique(key, return_index=True, return_counts=True)
    order = np.lexsort((-uniq, -counts))  # count descending, then the larger shape
    counts = counts[order]
    # the shapes up to (and including) the one that reaches the coverage
    take = int(np.searchsorted(np.cumsum(counts), coverage * len(rows), side="left")) + 1
    take = min(take, len(counts))
    return counts[:take].astype(np.int64), rows[first[order[:take]]]


def typical_shapes(cpu: np.ndarray, milli: np.ndarray, num: np.ndarray, spec: Sequence[str], models: Sequence[str],
                   coverage: float = TYPICAL_COVERAGE) -> Workload:
    """FGD's target workload from per-pod (CPU milli, milli per GPU, GPU count, gpu_spec): the most popular shapes
    covering `coverage` of the pods (ties: larger shape first), weights renormalised."""
    chosen = popular_shapes(list(zip(cpu.tolist(), milli.tolist(), num.tolist(), spec, strict=True)), coverage)
    n_ = [n for n, _ in chosen]
    cpu_, milli_, num_, spec_ = zip(*(s for _, s in chosen), strict=True)
    w = np.asarray(n_, dtype=np.float64)
    return Workload(np.asarray(cpu_, dtype=np.int64), np.asarray(milli_, dtype=np.int64),
                    np.asarray(num_, dtype=np.int64), np.asarray([spec_mask(x, models) for x in spec_],
                                                                 dtype=np.int64), w / w.sum(), tuple(spec_))


def pod_gpu_shape(state: object, pods: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(devices, milli per device) of each pod of a ClusterState; gpu-memory pods at the smallest GPU memory of
    the cluster (their largest share)."""
    st = state
    whole = st.pod_gpu_whole[pods].astype(np.int64)  # type: ignore[attr-defined]
    frac = st.pod_gpu_frac[pods].astype(np.int64)  # type: ignore[attr-defined]
    mem = st.pod_gpu_mem[pods]  # type: ignore[attr-defined]
    ndev = st.pod_gpu_ndev[pods].astype(np.int64)  # type: ignore[attr-defined]
    gmem = st.node_gpu_mem_mib[st.node_gpus > 0]  # type: ignore[attr-defined]
    smallest = int(gmem[gmem > 0].min()) if (gmem > 0).any() else 1
    mem_milli = np.minimum(MILLI, -(-mem * MILLI // smallest))
    num = np.where(whole > 0, whole, np.where((frac > 0) | (mem > 0), ndev, 0))
    milli = np.where(whole > 0, MILLI, np.where(frac > 0, frac, np.where(mem > 0, mem_milli, 0)))
    return num, milli


class FragModel:
    """The fragmentation math for shapes (CPU, milli per device, device count) with weights p (summing to 1).

    `access` matrices (nodes x shapes) say which shapes may use which nodes at all; shapes without a GPU
    request never use a node's GPUs.
    """

    def __init__(self, cpu: np.ndarray, milli: np.ndarray, num: np.ndarray, weight: np.ndarray) -> None:
        self.p = np.asarray(weight, dtype=np.float64)
        self.t_cpu = np.asarray(cpu, dtype=np.int64)
        self.t_num = np.asarray(num, dtype=np.int64)
        milli = np.asarray(milli, dtype=np.int64)
        self.gpu_shape = milli > 0
        levels, inv = np.unique(milli[self.gpu_shape], return_inverse=True)
        self.levels = levels if levels.size else np.asarray([MILLI], dtype=np.int64)
        self.level_of = np.zeros(len(milli), dtype=np.int64)
        self.level_of[self.gpu_shape] = inv

    def __len__(self) -> int:
        return len(self.p)

    def levels_of(self, gpu_free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From (N, G) free share per device (0 in padding): per node and level u, devices with free >= u and the
        total free on devices with free < u."""
        g = gpu_free[:, :, None]
        return (g >= self.levels).sum(axis=1), (g * (g < self.levels)).sum(axis=1)

    def device_levels(self, dev_free: np.ndarray, owner: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`levels_of` from a flat list of devices: free share (D,) and owner (D,) in 0..n-1."""
        if n == 1:  # (most calls: the node one placement changed)
            ge = dev_free[:, None] >= self.levels
            return (ge.sum(axis=0, dtype=np.int64)[None, :],
                    np.where(ge, 0, dev_free[:, None]).sum(axis=0, dtype=np.int64)[None, :])
        cnt = np.zeros((n, len(self.levels)), dtype=np.int64)
        below = np.zeros((n, len(self.levels)), dtype=np.int64)
        for j, u in enumerate(self.levels.tolist()):
            lo = dev_free < u
            cnt[:, j] = np.bincount(owner, weights=~lo, minlength=n)[:n]
            below[:, j] = np.bincount(owner, weights=np.where(lo, dev_free, 0), minlength=n)[:n]
        return cnt, below

    @staticmethod
    def step(cnt: np.ndarray, below: np.ndarray, levels: np.ndarray, a: np.ndarray,
             na: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Levels after one device's free share goes from a to na (per row)."""
        a, na = a[:, None], na[:, None]
        return cnt - (a >= levels) + (na >= levels), below - a * (a < levels) + na * (na < levels)

    def frag(self, cpu: np.ndarray, free: np.ndarray, cnt: np.ndarray, below: np.ndarray,
             access: np.ndarray) -> np.ndarray:
        """(C, M) fragmentation of each candidate state for each shape, in milli-GPUs."""
        # (take along the level axis and one in-place &: fewer temporaries; most calls score one node or a few)
        usable = access & (cnt.take(self.level_of, axis=1) >= self.t_num)
        usable &= cpu[:, None] >= self.t_cpu
        return np.where(usable, below.take(self.level_of, axis=1), free[:, None])

    def expected(self, frag: np.ndarray) -> np.ndarray:
        """(C,) F_n = sum_m p_m F_n(m)."""
        return frag @ self.p


FILL_UNIT = 10  # milli-GPU: the fill cost's knapsack works in steps of this size
FILL_ABUNDANT = 0.04  # a share size fills leftovers when it is at least this part of the workload's share weight


def share_fill_cost(milli: np.ndarray, num: np.ndarray, weight: np.ndarray,
                    abundant: float = FILL_ABUNDANT) -> np.ndarray:
    """(MILLI + 1,) per free share L of a device (milli): the part of L that the workload's abundant GPU share
    sizes (single-device shares weighing at least `abundant` of all shares) cannot fill, however many of them go
    there (an unbounded knapsack in FILL_UNIT steps); a whole free device costs 0 (it is no leftover). A share
    whose device's cost grows leaves room that later shares of the common sizes cannot use."""
    share = (num == 1) & (milli > 0) & (milli < MILLI)
    per_size: dict[int, float] = {}  # a size's weight over every shape asking for it (any CPU, any signature)
    for m, w in zip(milli[share].tolist(), weight[share].tolist(), strict=True):
        per_size[int(m)] = per_size.get(int(m), 0.0) + float(w)
    total = sum(per_size.values())
    units = MILLI // FILL_UNIT
    sizes = sorted({m // FILL_UNIT for m, w in per_size.items() if w >= abundant * total and m >= FILL_UNIT})
    best = np.zeros(units + 1, dtype=np.int64)  # most units the sizes fill of each capacity
    for cap in range(1, units + 1):
        for s in sizes:
            if s <= cap and best[cap - s] + s > best[cap]:
                best[cap] = best[cap - s] + s
    levels = np.arange(MILLI + 1)
    cost = levels - FILL_UNIT * best[levels // FILL_UNIT]
    cost[MILLI] = 0
    return cost.astype(np.int64)
