"""Reclaim rules as predicates (KAI's MaintainFairShare and GuaranteeDeservedQuota strategies).

A reclaimer queue may take resources from other queues only while it stays within its fair share (and, for
non-preemptible work, within its deserved quota). Each victim chunk (an elastic pod, or a gang's core) is allowed
if, compared at the level where the two queue paths diverge, the victim side is above its allocatable share
(maintain fair share), or the reclaimer side stays within deserved while the victim side is above deserved
(guarantee deserved quota). After the victims are taken, every ancestor of the reclaimer must stay within
fair share, its allocated being scaled up by the saturation multiplier (>= 1) first; a lone top-level queue is
exempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.quantities import le
from kai_opt.fairshare.share import FairShare
from kai_opt.state.resources import QR


def can_reclaim(fs: FairShare, ledger: QueueLedger, queue: int, request: np.ndarray, *, preemptible: bool) -> bool:
    """Whether the reclaimer's queue may reclaim at all: allocated + request within fair share (and quota)."""
    if not le(ledger.allocated[queue] + request, fs.fair_share[queue]):
        return False
    return preemptible or le(ledger.allocated_np[queue] + request, fs.deserved[queue])


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


def fits_strategy(fs: FairShare, ledger: QueueLedger, request: np.ndarray, reclaimer_q: int, victim_q: int,
                  victim_remaining: np.ndarray) -> bool:
    allocatable = fs.allocatable_share
    if not le(victim_remaining, allocatable[victim_q]):  # maintain fair share
        return True
    within_deserved = le(ledger.allocated[reclaimer_q] + request, fs.deserved[reclaimer_q])
    return within_deserved and not le(victim_remaining, fs.deserved[victim_q])  # guarantee deserved quota


def reclaimable(
    fs: FairShare,
    ledger: QueueLedger,
    reclaimer: int,
    request: np.ndarray,
    victims: Sequence[tuple[int, np.ndarray]],  # (victim leaf queue, chunk resources), in eviction order
    *,
    preemptible: bool,
    saturation_multiplier: float = 1.0,
    n_top_queues: int | None = None,
) -> str | None:
    """None when the reclaim is allowed; otherwise the rule it breaks, as a short machine-readable reason."""
    remaining: dict[int, np.ndarray] = {}
    for victim_q, chunk in victims:
        rq, vq = leveled(ledger, reclaimer, victim_q)
        if vq not in remaining:
            remaining[vq] = ledger.allocated[vq].copy()
        if not fits_strategy(fs, ledger, request, rq, vq, remaining[vq]):
            return "VictimQueueBelowFairShare"
        _take(ledger, remaining, victim_q, chunk)
    return reclaimer_side(fs, ledger, reclaimer, request, remaining, preemptible=preemptible,
                          saturation_multiplier=saturation_multiplier, n_top_queues=n_top_queues)


def _take(ledger: QueueLedger, remaining: dict[int, np.ndarray], victim_q: int, chunk: np.ndarray) -> None:
    for q in ledger.ancestors[victim_q]:
        if q not in remaining:
            remaining[q] = ledger.allocated[q].copy()
        remaining[q] -= chunk


def reclaimer_side_after(fs: FairShare, ledger: QueueLedger, reclaimer: int, request: np.ndarray,
                         victims: Sequence[tuple[int, np.ndarray]], *, preemptible: bool,
                         saturation_multiplier: float = 1.0, n_top_queues: int | None = None) -> str | None:
    """reclaimer_side once these victims are gone: when it fails, `reclaimable` fails for them and for any
    subset of them (fewer victims leave more allocated on the reclaimer's side)."""
    remaining: dict[int, np.ndarray] = {}
    for victim_q, chunk in victims:
        _take(ledger, remaining, victim_q, chunk)
    return reclaimer_side(fs, ledger, reclaimer, request, remaining, preemptible=preemptible,
                          saturation_multiplier=saturation_multiplier, n_top_queues=n_top_queues)


def reclaimer_side(fs: FairShare, ledger: QueueLedger, reclaimer: int, request: np.ndarray,
                   remaining: dict[int, np.ndarray], *, preemptible: bool, saturation_multiplier: float = 1.0,
                   n_top_queues: int | None = None) -> str | None:
    """The reclaimer's side of `reclaimable`, given each queue's allocation once the victims are gone
    (`remaining`, queues not in it keep theirs). More victims only lower `remaining`, so when this fails with
    every victim taken so far, it fails for any subset of them too."""
    tops = n_top_queues if n_top_queues is not None else sum(1 for a in ledger.ancestors if len(a) == 1)
    for q in ledger.ancestors[reclaimer]:
        after = remaining.get(q, ledger.allocated[q]) + request
        is_top = len(ledger.ancestors[q]) == 1
        # saturation: the reclaimer side's allocated / fair share, times the multiplier (>= 1, more conservative
        # when larger), must stay within 1
        if (not is_top or tops > 1) and not le(after * saturation_multiplier, fs.fair_share[q]):
            return "ReclaimerOverFairShare"
        if not preemptible and not le(ledger.allocated_np[q] + request, fs.deserved[q]):
            return "NonPreemptibleOverQuota"
    return None


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
