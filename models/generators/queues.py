"""A 4-level queue tree (departments > teams > projects > leaf queues) with GPU quotas, limits and weights."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kai_opt.snapshot import RawObject
from models.generators.objects import NOW, queue


@dataclass
class QueueTree:
    objects: list[RawObject]
    names: list[str]
    parent: np.ndarray  # int64[Q], -1 = top level
    quota: np.ndarray  # float64[Q] GPU quota
    limit: np.ndarray  # float64[Q] GPU limit, -1 = none
    leaves: np.ndarray  # int64[L] queue index of each leaf
    namespace: list[str]  # per leaf: namespace of its workloads (its project's name)
    used: np.ndarray = field(init=False)  # float64[Q] GPUs of generated running work (with ancestors)

    def __post_init__(self) -> None:
        self.used = np.zeros(len(self.names))

    @property
    def leaf_quota(self) -> np.ndarray:
        return self.quota[self.leaves]

    def weights(self) -> np.ndarray:
        """Probability of each leaf: proportional to its quota, plus a floor so zero-quota leaves get work too."""
        w = self.leaf_quota + max(1.0, float(self.leaf_quota.mean()) * 0.1)
        return w / w.sum()

    def chain(self, q: int) -> list[int]:
        out = []
        while q >= 0:
            out.append(q)
            q = int(self.parent[q])
        return out

    def fits(self, leaf: int, gpus: float) -> bool:
        """Running `gpus` more in leaf (a position in `leaves`) keeps it and its ancestors within their limits."""
        return all(self.limit[q] < 0 or self.used[q] + gpus <= self.limit[q]
                   for q in self.chain(int(self.leaves[leaf])))

    def charge(self, leaf: int, gpus: float) -> None:
        for q in self.chain(int(self.leaves[leaf])):
            self.used[q] += gpus

    def pick(self, rng: np.random.Generator, gpus: float, *, p: np.ndarray | None = None, tries: int = 8) -> int:
        """A leaf (position in `leaves`) drawn by `p` (default: quota weights) whose limits allow `gpus` more."""
        probs = self.weights() if p is None else p
        for leaf in rng.choice(len(self.leaves), size=tries, p=probs).tolist():
            if self.fits(leaf, gpus):
                return int(leaf)
        ok = [i for i in range(len(self.leaves)) if self.fits(i, gpus)]
        return int(ok[int(rng.integers(len(ok)))]) if ok else int(rng.choice(len(self.leaves), p=probs))


def shape_for(n_queues: int) -> tuple[int, int, int, int]:
    """(departments, teams per department, projects per team, leaves per project) for about n_queues queues."""
    if n_queues <= 106:
        return 2, 4, 4, 2  # 2 + 8 + 32 + 64 = 106
    f = max(2, round((n_queues / 2) ** (1 / 3)))
    return 2, f, f, f


def queue_tree(rng: np.random.Generator, total_gpus: int, *, shape: tuple[int, int, int, int] = (2, 4, 4, 2),
               quota_fraction: float = 0.9, limit_prob: float = 0.25) -> QueueTree:
    """Quota: `quota_fraction` of the GPUs split down the tree by random (Dirichlet) shares, whole GPUs at every
    level; over-quota weights 1-4; a random subset of teams and leaves gets a limit of 1.5-3x its quota."""
    d, t, p, nl = shape
    objs: list[RawObject] = []
    names: list[str] = []
    parents: list[int] = []
    quotas: list[float] = []
    limits: list[float] = []
    leaves: list[int] = []
    namespaces: list[str] = []

    def split(amount: int, k: int) -> list[int]:
        share = rng.dirichlet(np.full(k, 4.0)) * amount
        base = np.floor(share).astype(np.int64)
        rest = amount - int(base.sum())
        if rest:
            base[np.argsort(base - share)[:rest]] += 1
        return base.tolist()

    def add(name: str, parent: int, quota: int, level: int) -> int:
        limit = -1.0
        if level in (1, 3) and rng.random() < limit_prob:
            limit = float(max(2, round(quota * rng.uniform(1.5, 3.0))))
        weight = float(rng.integers(1, 5))
        prio = 200 if level == 0 and not names else None  # the first department wins over-quota rounds first
        objs.append(queue(name, names[parent] if parent >= 0 else None, gpu=(float(quota), weight, limit),
                          priority=prio, created=NOW - 30 * 86400 + len(objs)))
        names.append(name)
        parents.append(parent)
        quotas.append(float(quota))
        limits.append(limit)
        return len(names) - 1

    for di, dq in enumerate(split(round(total_gpus * quota_fraction), d)):
        dn = f"d{di}"
        dqi = add(dn, -1, dq, 0)
        for ti, tq in enumerate(split(dq, t)):
            tn = f"{dn}-t{ti}"
            tqi = add(tn, dqi, tq, 1)
            for pi, pq in enumerate(split(tq, p)):
                pn = f"{tn}-p{pi}"
                pqi = add(pn, tqi, pq, 2)
                for li, lq in enumerate(split(pq, nl)):
                    leaves.append(add(f"{pn}-q{li}", pqi, lq, 3))
                    namespaces.append(pn)
    return QueueTree(objs, names, np.array(parents, dtype=np.int64), np.array(quotas), np.array(limits),
                     np.array(leaves, dtype=np.int64), namespaces)
