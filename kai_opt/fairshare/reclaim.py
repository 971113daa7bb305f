"""Reclaim rules as predicates (KAI's MaintainFairShare and GuaranteeDeservedQuota strategies).

A reclaimer queue may take resources from other queues only while it stays within its fair share (and, for
non-preemptible work, within its deserved quota). Each victim chunk (an elastic pod, or a gang's core) is allowed
if, compared at the level where the two queue paths diverge, the victim side is above its allocatable share
(maintain fair share), or the reclaimer side stays within deserved while the victim side is above deserved
(guarantee deserved quota). After the victims are taken, at every level of the reclaimer's path its queue,
when over its fair share, must stay strictly less saturated (allocated / fair share, times the saturation
multiplier >= 1) than each sibling queue victims are taken from, on the resources the reclaim involves (KAI's
reclaimingQueuesRemainWithinBoundaries): a queue may go over its fair share by reclaiming from a sibling that is
further over its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.quantities import le
from kai_opt.fairshare.share import UNLIMITED, FairShare
from kai_opt.state.resources import QR

EPS = 1e-9  # ratio comparisons of float shares


def can_reclaim(fs: FairShare, ledger: QueueLedger, queue: int, request: np.ndarray, *, preemptible: bool) -> bool:
    """Whether the reclaimer's queue may reclaim at all: allocated + request within fair share (and quota)."""
    if not le(ledger.allocated[queue] + request, fs.fair_share[queue]):
        return False
    return preemptible or le(ledger.allocated_np[queue] + request, fs.deserved[queue])


def below_fair_share(fs: FairShare, ledger: QueueLedger) -> np.ndarray:
    """Per queue: allocated below its fair share in some resource (an unlimited share counts as above any
    allocation): the queue has demand it is entitled to."""
    share, held = fs.fair_share, ledger.allocated
    return ((share == UNLIMITED) | (share - held > EPS * np.maximum(1.0, np.abs(share)))).any(axis=1)


def reclaim_headroom(fs: FairShare, ledger: QueueLedger, queue: int, request: np.ndarray, *, preemptible: bool,
                     names: list[str]) -> dict[str, Any]:
    """Why `can_reclaim` says no, as a Reason's details: the bound crossed ("fair_share", or "quota" for
    non-preemptible work) and, per resource (QR order), allocated, requested and both bounds."""
    over_share = not le(ledger.allocated[queue] + request, fs.fair_share[queue])
    resources = {}
    for r, res in enumerate(QR):
        resources[res] = {"allocated": float(ledger.allocated[queue, r]), "requested": float(request[r]),
                          "fair_share": float(fs.fair_share[queue, r]), "deserved": float(fs.deserved[queue, r]),
                          "allocated_non_preemptible": float(ledger.allocated_np[queue, r])}
    return {"queue": names[queue], "bound": "fair_share" if over_share else ("quota" if not preemptible else None),
            "resources": resources}


def leveled(ledger: QueueLedger, reclaimer: int, victim: int) -> tuple[int, int]:
    """The two queues at the first level where the paths from the top to each queue diverge."""
    a = ledger.ancestors[reclaimer][::-1]
    b = ledger.ancestors[victim][::-1]
    ra, vb = a[0], b[0]
    for x, y in zip(a, b, strict=False):
        ra, vb = x, y
        if x != y:
            break
    return ra, vb



def queue_paths(ancestors: list[list[int]]) -> np.ndarray:
    """int64[Q, depth]: each queue's path from its top-level queue down to itself, -1 after its end (the rows
    `leveled` walks, for many victims at once)."""
    out = np.full((len(ancestors), max((len(a) for a in ancestors), default=1)), -1, dtype=np.int64)
    for q, path in enumerate(ancestors):
        out[q, :len(path)] = path[::-1]
    return out


def not_refused(fs: FairShare, ledger: QueueLedger, paths: np.ndarray, reclaimer: int, request: np.ndarray,
                victim_queues: np.ndarray, *, saturation_multiplier: float = 1.0) -> np.ndarray:
    """Per victim queue: whether the rules above do not already refuse one of its victims for the reclaimer as the
    ledger stands, judged at the level `leveled` finds: the victim's side above its allocatable share in some
    resource (maintain fair share; the deserved-quota branch of `fits_strategy` is not looked at), and the
    reclaimer's side, with the request, within its fair share or less saturated than the victim's side in each
    requested resource (`_less_saturated` on the requested resources). A necessary-condition filter before a search,
    never a substitute for `reclaimable`."""
    diff = paths[victim_queues] != paths[reclaimer]
    level = np.argmax(diff, axis=1)
    theirs, mine = paths[victim_queues, level], paths[reclaimer][level]
    ok = diff.any(axis=1) & (theirs >= 0) & (mine >= 0)
    theirs, mine = np.maximum(theirs, 0), np.maximum(mine, 0)
    share, held = fs.allocatable_share[theirs], ledger.allocated[theirs]
    ok &= ((share != UNLIMITED) & (held > share + EPS * np.maximum(1.0, np.abs(share)))).any(axis=1)
    after = ledger.allocated[mine] + request
    for r in np.flatnonzero(request > 0).tolist():
        fa, fv = fs.fair_share[mine, r], fs.fair_share[theirs, r]
        ratio = np.where(fa == UNLIMITED, 0.0, np.where(fa > 0, after[:, r] / np.where(fa > 0, fa, 1.0),
                                                        np.where(after[:, r] > 0, np.inf, 0.0)))
        sat = np.where(fv > 0, held[:, r] / np.where(fv > 0, fv, 1.0), 0.0)
        ok &= ~((ratio > 1 + EPS) & (fv > 0) & (ratio * saturation_multiplier >= sat - EPS))
    return ok

def fits_strategy(fs: FairShare, ledger: QueueLedger, request: np.ndarray, reclaimer_q: int, victim_q: int,
                  victim_remaining: np.ndarray) -> bool:
    allocatable = fs.allocatable_share
    if not le(victim_remaining, allocatable[victim_q]):  # maintain fair share
        return True
    within_deserved = le(ledger.allocated[reclaimer_q] + request, fs.deserved[reclaimer_q])
    return within_deserved and not le(victim_remaining, fs.deserved[victim_q])  # guarantee deserved quota


def leveled_many(paths: np.ndarray, reclaimers: np.ndarray, victims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`leveled` pair by pair (reclaimer and victim queues, aligned arrays), over the queue path matrix
    (`queue_paths`): (reclaimer sides, victim sides)."""
    mine, theirs = paths[reclaimers], paths[victims]
    both = (mine >= 0) & (theirs >= 0)
    diff = (mine != theirs) & both
    # the first divergence, else the last level both paths reach (where they agree)
    at = np.where(diff.any(axis=1), np.argmax(diff, axis=1), both.sum(axis=1) - 1)
    rows = np.arange(len(at))
    return mine[rows, at], theirs[rows, at]


def le_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`quantities.le` row by row (a, b: [k, R]): a <= b in every resource, -1 as +infinity on either side."""
    unl_a, unl_b = a == UNLIMITED, b == UNLIMITED
    return np.where(unl_a, unl_b, unl_b | (a <= b)).all(axis=1)


def fits_strategy_many(fs: FairShare, ledger: QueueLedger, requests: np.ndarray, reclaimer_qs: np.ndarray,
                       victim_qs: np.ndarray) -> np.ndarray:
    """`fits_strategy` row by row (requests [k, R], one reclaimer and victim side per row), each victim side's
    remaining amount its allocation now."""
    held = ledger.allocated[victim_qs]
    over = ~le_rows(held, fs.allocatable_share[victim_qs])
    within_deserved = le_rows(ledger.allocated[reclaimer_qs] + requests, fs.deserved[reclaimer_qs])
    return over | (within_deserved & ~le_rows(held, fs.deserved[victim_qs]))


def reclaimable(
    fs: FairShare,
    ledger: QueueLedger,
    reclaimer: int,
    request: np.ndarray,
    victims: Sequence[tuple[int, np.ndarray]],  # (victim leaf queue, chunk resources), in eviction order
    *,
    preemptible: bool,
    saturation_multiplier: float = 1.0,
) -> str | None:
    """None when the reclaim is allowed; otherwise the rule it breaks, as a short machine-readable reason."""
    taken = Taken()
    for victim_q, chunk in victims:
        rq, vq = leveled(ledger, reclaimer, victim_q)
        if vq not in taken.remaining:
            taken.remaining[vq] = ledger.allocated[vq].copy()
        if not fits_strategy(fs, ledger, request, rq, vq, taken.remaining[vq]):
            return "VictimQueueBelowFairShare"
        taken.take(ledger, victim_q, chunk)
    return reclaimer_side(fs, ledger, reclaimer, request, taken, preemptible=preemptible,
                          saturation_multiplier=saturation_multiplier)


class Taken:
    """What victims take from each queue on their paths: the allocation left (`remaining`), and which
    resources were taken from under it (`involved`, what the saturation comparison looks at)."""

    def __init__(self) -> None:
        self.remaining: dict[int, np.ndarray] = {}
        self.involved: dict[int, np.ndarray] = {}
        self.by_parent: dict[int, set[int]] = {}

    def take(self, ledger: QueueLedger, victim_q: int, chunk: np.ndarray) -> None:
        freed = chunk > 0
        for q in ledger.ancestors[victim_q]:
            left = self.remaining.get(q)  # (reclaimable sets the victim side's queue before its first chunk)
            if left is None:
                self.remaining[q] = ledger.allocated[q] - chunk
            else:
                left -= chunk
            inv = self.involved.get(q)
            if inv is None:
                self.involved[q] = freed.copy()
                self.by_parent.setdefault(_parent(ledger, q), set()).add(q)
            else:
                inv |= freed


class ReclaimerSide:
    """`reclaimer_side` kept up to date while victims are taken one chunk at a time (a search's worth_trying): a
    chunk changes only the comparisons of the queues above it and of the sibling it levels to, so only those are
    judged again; the answer is the one reclaimer_side gives for every chunk taken so far."""

    def __init__(self, fs: FairShare, ledger: QueueLedger, reclaimer: int, request: np.ndarray, *,
                 preemptible: bool, saturation_multiplier: float = 1.0) -> None:
        self.fs, self.ledger, self.request, self.mult = fs, ledger, request, saturation_multiplier
        self.path = ledger.ancestors[reclaimer]
        self.parent = {q: _parent(ledger, q) for q in self.path}
        self.asks = request > 0
        self.taken = Taken()
        self.failing: dict[int, set[int]] = {q: set() for q in self.path}  # queue -> siblings it fails against
        self.over_quota = {q: not preemptible and not le(ledger.allocated_np[q] + request, fs.deserved[q])
                           for q in self.path}  # (victims do not change it)

    def take(self, victim_q: int, chunk: np.ndarray) -> str | None:
        """Take one more chunk; reclaimer_side's answer with every chunk taken so far."""
        ledger, taken = self.ledger, self.taken
        taken.take(ledger, victim_q, chunk)
        above = ledger.ancestors[victim_q]
        at_level = {_parent(ledger, s): s for s in above}  # parent -> the chunk's queue under it
        for q in self.path:
            if q in above:  # its allocation dropped: every comparison of q again
                for s in taken.by_parent.get(self.parent[q], ()):
                    if s != q:
                        self._judge(q, s)
            else:  # the chunk's queue at q's level, if it is q's sibling
                s = at_level.get(self.parent[q], q)
                if s != q:
                    self._judge(q, s)
        return self.answer()

    def _judge(self, q: int, s: int) -> None:
        fs, taken = self.fs, self.taken
        after = taken.remaining.get(q, self.ledger.allocated[q]) + self.request
        if _less_saturated(after, fs.fair_share[q], taken.remaining[s], fs.fair_share[s],
                           self.asks | taken.involved[s], self.mult):
            self.failing[q].discard(s)
        else:
            self.failing[q].add(s)

    def answer(self) -> str | None:
        for q in self.path:  # reclaimer_side's order: per level, the comparisons, then the quota
            if self.failing[q]:
                return "ReclaimerOverFairShare"
            if self.over_quota[q]:
                return "NonPreemptibleOverQuota"
        return None


def _parent(ledger: QueueLedger, q: int) -> int:
    path = ledger.ancestors[q]
    return path[1] if len(path) > 1 else -1


def reclaimer_side_after(fs: FairShare, ledger: QueueLedger, reclaimer: int, request: np.ndarray,
                         victims: Sequence[tuple[int, np.ndarray]], *, preemptible: bool,
                         saturation_multiplier: float = 1.0) -> str | None:
    """reclaimer_side once these victims are gone (the victim side's strategies not checked)."""
    taken = Taken()
    for victim_q, chunk in victims:
        taken.take(ledger, victim_q, chunk)
    return reclaimer_side(fs, ledger, reclaimer, request, taken, preemptible=preemptible,
                          saturation_multiplier=saturation_multiplier)


def reclaimer_side(fs: FairShare, ledger: QueueLedger, reclaimer: int, request: np.ndarray, taken: Taken, *,
                   preemptible: bool, saturation_multiplier: float = 1.0) -> str | None:
    """The reclaimer's side of `reclaimable`, given what the victims took (`taken`; queues not in it keep their
    allocation): at each level of the reclaimer's path, its queue against each sibling victims were taken from;
    non-preemptible work also within deserved."""
    asks = request > 0
    for q in ledger.ancestors[reclaimer]:
        after = taken.remaining.get(q, ledger.allocated[q]) + request
        for s in taken.by_parent.get(_parent(ledger, q), ()):
            if s != q and not _less_saturated(after, fs.fair_share[q], taken.remaining[s], fs.fair_share[s],
                                              asks | taken.involved[s], saturation_multiplier):
                return "ReclaimerOverFairShare"
        if not preemptible and not le(ledger.allocated_np[q] + request, fs.deserved[q]):
            return "NonPreemptibleOverQuota"
    return None


def _saturation(allocated: float, fair: float) -> float:
    if fair == UNLIMITED:
        return 0.0
    if fair == 0:
        return math.inf if allocated > 0 else 0.0
    return allocated / fair


def _less_saturated(mine: np.ndarray, my_fair: np.ndarray, sibling: np.ndarray, sibling_fair: np.ndarray,
                    resources: np.ndarray, multiplier: float) -> bool:
    """Per involved resource: the reclaimer side is within its fair share, or the sibling has none, or the
    reclaimer side's saturation times the multiplier stays strictly below the sibling's."""
    for r in np.flatnonzero(resources).tolist():
        if my_fair[r] == UNLIMITED and sibling_fair[r] == UNLIMITED:
            continue
        ratio = _saturation(float(mine[r]), float(my_fair[r]))
        if ratio > 1 + EPS and sibling_fair[r] > 0 and \
                ratio * multiplier >= _saturation(float(sibling[r]), float(sibling_fair[r])) - EPS:
            return False
    return True


def victim_chunks(pod_requests: np.ndarray, min_member: int) -> list[np.ndarray]:
    """Split a victim job's evicted pods (task order) into chunks: each pod above the job's minimum alone,
    the core (the first min_member pods) as one chunk."""
    n = len(pod_requests)
    if min_member >= n:
        return [pod_requests.sum(axis=0)] if n else []
    chunks = [pod_requests[i] for i in range(min_member, n)]
    if min_member > 0:
        chunks.append(pod_requests[:min_member].sum(axis=0))
    return chunks
