"""Queue order for allocation (KAI's queue-order function); the first rule that tells two queues apart wins:

1. not over fair share before over (over = fair share < allocated in every resource);
2. within deserved with its next job before over deserved;
3. higher queue priority;
4. a queue using a resource it has no allocatable share of goes after one that does not;
5. smaller dominant (DRF) share counting its next job;
6. smaller dominant share without it;
7. smaller allocatable share (less in some resource and <= in all);
8. older, then name.
Siblings are compared at each level of the tree: the best top-level queue, then its best child, and so on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.quantities import le, less_all, less_somewhere
from kai_opt.fairshare.share import NO_SHARE_DRF_PENALTY, UNLIMITED, FairShare


def _drf(share: list[float], used: list[float]) -> float:
    """Dominant share of `used` over `share` (per resource: an unlimited share resolved to the total, and a zero
    share penalised), QueueOrder._drf_share."""
    best = 0.0
    for s, u in zip(share, used, strict=True):
        v = u * NO_SHARE_DRF_PENALTY if s == 0 else u / s
        if v > best:
            best = v
    return best


class QueueOrder:
    """Compares sibling queues given the resources of the job each would run next."""

    def __init__(self, fs: FairShare, ledger: QueueLedger, names: list[str], creation: np.ndarray,
                 priority: np.ndarray) -> None:
        self.fs = fs
        self.ledger = ledger
        self.names = names
        self.creation = [c if not math.isnan(c) else math.inf for c in creation.tolist()]
        self.priority = priority.tolist()
        self.allocatable = fs.allocatable_share.tolist()
        self.fair_share = fs.fair_share.tolist()
        self.deserved = fs.deserved.tolist()
        self.total = fs.total.tolist()
        # per queue, the share each resource's DRF divides by (an unlimited share counts as the total)
        self._drf_share = [[t if s == UNLIMITED else s for t, s in zip(self.total, share, strict=True)]
                           for share in self.allocatable]
        # per queue, the resources it has no allocatable share of (all that rule 4 reads)
        self._no_share = [[r for r, s in enumerate(share) if s == 0] for share in self.allocatable]

    def key(self, q: int, job: np.ndarray) -> tuple[Any, ...]:
        """Rules 1-6 for queue q with its next job, as a key: the smaller key goes first."""
        alloc = self.ledger.allocated[q].tolist()
        over = less_all(self.fair_share[q], alloc)
        with_job = [x + y for x, y in zip(alloc, job.tolist(), strict=True)]
        starved = le(with_job, self.deserved[q])
        zero = False  # rule 4 reads only the resources q has no allocatable share of
        for r in self._no_share[q]:
            if with_job[r] > 0:
                zero = True
                break
        d = self._drf_share[q]
        return (over, not starved, -self.priority[q], zero, _drf(d, with_job), _drf(d, alloc))

    def tie(self, a: int, b: int) -> int:
        """Rules 7-8 (queues whose keys are equal): -1 when a goes first, 1 when b does."""
        sa, sb = self.allocatable[a], self.allocatable[b]
        if less_somewhere(sa, sb) and le(sa, sb):
            return -1
        if less_somewhere(sb, sa) and le(sb, sa):
            return 1
        ca, cb = self.creation[a], self.creation[b]
        if ca != cb:
            return -1 if ca < cb else 1
        return -1 if self.names[a] <= self.names[b] else 1

    def compare(self, a: int, b: int, job_a: np.ndarray, job_b: np.ndarray) -> int:
        """-1 when queue a goes first, 1 when b does (never 0)."""
        ka, kb = self.key(a, job_a), self.key(b, job_b)
        if ka != kb:
            return -1 if ka < kb else 1
        return self.tie(a, b)

    def best(self, candidates: list[int], job: dict[int, np.ndarray]) -> int:
        """The queue that goes first among siblings (job[q]: resources of the job q would run next); each
        candidate's key is made once."""
        return self.best_by_key(candidates, {q: self.key(q, job[q]) for q in candidates})

    def best_by_key(self, candidates: list[int], keys: dict[int, tuple[Any, ...]]) -> int:
        """best, given each candidate's key (as made by `key`)."""
        best = candidates[0]
        best_key = keys[best]
        for q in candidates[1:]:
            k = keys[q]
            if (k < best_key) if k != best_key else self.tie(q, best) < 0:
                best, best_key = q, k
        return best
