"""Fair share of every queue and resource over the queue tree (KAI proportion plugin semantics).

Cluster total = allocatable of Ready, schedulable nodes minus what other schedulers' pods hold there.
A queue's request = allocated (bound pods) + pending pods of its subtree. Top-level queues divide the total;
the children of a queue divide their parent's fair share, level by level (kai_opt.fairshare.division).
With past usage (time-based fair share, kai_opt.fairshare.history) each queue's normalised usage enters the
over-quota division of its sibling set, weighed by kValue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kai_opt.fairshare.division import QueueShare, divide
from kai_opt.fairshare.history import DEFAULT_K_VALUE, HistoricalUsage
from kai_opt.state import ClusterState, PodStatus
from kai_opt.state.resources import QR_COLUMN, QR_DIVISOR
from kai_opt.usage import queue_usage

UNLIMITED = -1.0
NO_SHARE_DRF_PENALTY = 1000.0  # DRF of a resource with no allocatable share: allocated x this

# Called after each traced sibling division: (parent queue or -1, resource, amount divided, the siblings' shares
# with their steps, amount left undivided). `kai-opt explain --queue` records the levels above one queue with it.
DivisionRecorder = Callable[[int, int, float, list[QueueShare], float], None]


@dataclass
class FairShare:
    total: np.ndarray  # float64[3] divisible cluster amount per queue resource (QR order)
    deserved: np.ndarray  # float64[Q, 3] (-1 = the whole amount)
    limit: np.ndarray  # float64[Q, 3] (-1 = unlimited)
    over_quota_weight: np.ndarray  # float64[Q, 3]
    fair_share: np.ndarray  # float64[Q, 3]
    allocated: np.ndarray  # float64[Q, 3] subtree, at the start of the cycle
    allocated_np: np.ndarray  # float64[Q, 3] non-preemptible part
    requested: np.ndarray  # float64[Q, 3] allocated + pending, subtree
    steps: list[list[list[str]]] | None = None  # [queue][resource] -> readable division steps
    history: HistoricalUsage | None = None  # past usage the division used (time-based fair share)
    k_value: float = DEFAULT_K_VALUE
    usage: np.ndarray | None = None  # float64[Q, 3]: `history` in state order

    @cached_property
    def allocatable_share(self) -> np.ndarray:
        """float64[Q, 3]: max(deserved, fair share) capped by the limit; deserved -1 gives the limit (maybe -1).
        Computed once (reclaim checks ask for it per victim chunk); read-only, as the shares it comes from are."""
        out = np.maximum(self.deserved, self.fair_share)
        capped = self.limit != UNLIMITED
        out[capped] = np.minimum(out[capped], self.limit[capped])
        unlimited_deserved = self.deserved == UNLIMITED
        out[unlimited_deserved] = self.limit[unlimited_deserved]
        out.flags.writeable = False
        return out

    def dominant_share(self, allocated: np.ndarray | None = None) -> np.ndarray:
        """float64[Q]: DRF share = max over resources of allocated / allocatable share."""
        alloc = self.allocated if allocated is None else allocated
        share = self.allocatable_share
        share = np.where(share == UNLIMITED, self.total[None, :], share)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(share == 0, alloc * NO_SHARE_DRF_PENALTY, alloc / np.where(share == 0, 1, share))
        return ratio.max(axis=1) if ratio.size else np.zeros(len(alloc))


def cluster_total(state: ClusterState) -> np.ndarray:
    """float64[3]: allocatable of Ready, schedulable nodes minus what other schedulers' pods hold on them."""
    ok = state.node_ok
    alloc = state.node_alloc[ok]
    total = np.array([alloc[:, c].sum() / d for c, d in zip(QR_COLUMN, QR_DIVISOR, strict=True)], dtype=np.float64)
    foreign = np.nonzero(~state.pod_ours & ((state.pod_status == PodStatus.BOUND)
                                          | (state.pod_status == PodStatus.RELEASING)))[0]
    foreign = foreign[ok[state.pod_node[foreign]]] if len(foreign) else foreign
    if len(foreign):
        total -= state.pod_queue_request(foreign, state.pod_node[foreign]).sum(axis=0)
    return np.maximum(total, 0.0)


def divide_tree(
    total: np.ndarray,  # float64[3]
    parent: np.ndarray,  # int[Q], -1 = top level
    deserved: np.ndarray,  # float64[Q, 3]
    limit: np.ndarray,
    weight: np.ndarray,
    priority: np.ndarray,  # int[Q]
    creation: np.ndarray,  # float64[Q]
    names: list[str],
    requested: np.ndarray,  # float64[Q, 3], subtree sums
    *,
    usage: np.ndarray | None = None,  # float64[Q, 3] normalised past usage (None: time-based fair share off)
    k_value: float = DEFAULT_K_VALUE,
    trace: bool = False,
    recorder: DivisionRecorder | None = None,
    watch: set[int] | None = None,
    memo: bool = True,
) -> tuple[np.ndarray, list[list[list[str]]] | None]:
    """Fair share of every queue: top-level queues divide `total`, children divide their parent's share.
    With a `recorder`, the sibling sets holding a queue of `watch` (all when None) are traced and reported.
    `memo` False: every division made afresh, none read from or left in the divisions memo (what a benchmark of
    the division itself times)."""
    Q = len(names)
    fair = np.zeros((Q, total.shape[0]))
    steps: list[list[list[str]]] | None = [[[] for _ in range(total.shape[0])] for _ in range(Q)] if trace else None
    children: list[list[int]] = [[] for _ in range(Q)]
    top: list[int] = []
    for q in range(Q):
        (children[int(parent[q])] if parent[q] >= 0 else top).append(q)
    k_eff = 0.0 if usage is None else k_value
    # an untraced division is read from the divisions memo when one with the same inputs was made by this call or
    # the last (an in-cluster cycle divides the same way again in most sibling sets: only some queues' requests
    # and the amounts above them change)
    known, made = (None, None) if trace or recorder is not None or not memo else _DIVISIONS.begin(names)
    kids = {-1: np.asarray(top, dtype=np.int64)}
    for r in range(total.shape[0]):
        # per queue, everything the division of its sibling set reads of it (names aside: the memo is per names)
        rows = np.column_stack([np.arange(Q, dtype=np.float64), deserved[:, r], limit[:, r], weight[:, r],
                                priority.astype(np.float64), creation, requested[:, r],
                                np.zeros(Q) if usage is None else usage[:, r]]) if known is not None else None
        pending: list[tuple[float, list[int], int]] = [(float(total[r]), top, -1)]
        while pending:
            amount, siblings, parent_q = pending.pop()
            if not siblings:
                continue
            key = None
            if known is not None and made is not None and rows is not None:
                at = kids.get(parent_q)
                if at is None:
                    at = kids[parent_q] = np.asarray(siblings, dtype=np.int64)
                key = (amount, k_eff, rows[at].tobytes())
                got = made.get(key)
                if got is None:
                    got = known.get(key)
                if got is not None:
                    made[key] = got
                    fair[at, r] = got
                    pending.extend(zip(got.tolist(), map(children.__getitem__, siblings), siblings, strict=True))
                    continue
            shares = [QueueShare(index=q, name=names[q], deserved=float(deserved[q, r]), limit=float(limit[q, r]),
                                 weight=float(weight[q, r]), priority=int(priority[q]),
                                 creation=float(creation[q]), request=float(requested[q, r]),
                                 usage=0.0 if usage is None else float(usage[q, r])) for q in siblings]
            record = recorder is not None and (watch is None or not watch.isdisjoint(siblings))
            left = divide(amount, shares, trace=trace or record, k_value=0.0 if usage is None else k_value)
            if record and recorder is not None:
                recorder(parent_q, r, amount, shares, left)
            for s in shares:
                fair[s.index, r] = s.fair_share
                if steps is not None:
                    steps[s.index][r] = s.steps
                pending.append((s.fair_share, children[s.index], s.index))
            if key is not None and made is not None:
                made[key] = np.array([s.fair_share for s in shares])
    return fair, steps


class _Divisions:
    """The untraced sibling divisions of the last divide_tree call and of the current one, by their inputs: the
    amount, kValue and each sibling's index, deserved, limit, weight, priority, creation, request and past usage
    (a division reads nothing else but the queue names, which key the memo as a whole). Two generations: what
    the last call divided is found again, anything older is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: tuple[str, ...] = ()
        self._last: dict[tuple[float, float, bytes], np.ndarray] = {}
        self._now: dict[tuple[float, float, bytes], np.ndarray] = {}

    def begin(self, names: list[str]) -> tuple[dict[tuple[float, float, bytes], np.ndarray],
                                               dict[tuple[float, float, bytes], np.ndarray]]:
        """(what the last call made, where this call puts what it makes), both for these names; a call with
        other names starts afresh (a concurrent call keeps the dicts it was given: every entry is right for its
        names)."""
        key = tuple(names)
        with self._lock:
            if key != self._names:
                self._names, self._now = key, {}
            self._last, self._now = self._now, {}
            return self._last, self._now


_DIVISIONS = _Divisions()


def compute_fair_share(state: ClusterState, *, trace: bool = False, total: np.ndarray | None = None,
                       recorder: DivisionRecorder | None = None, watch: set[int] | None = None,
                       history: HistoricalUsage | None = None, k_value: float = DEFAULT_K_VALUE) -> FairShare:
    """`history`: past usage per queue (time-based fair share; None = off, the plain division)."""
    usage = queue_usage(state)
    total = cluster_total(state) if total is None else total
    past = history.matrix(state.q_names) if history is not None else None
    fair, steps = divide_tree(total, state.q_parent, state.q_deserved, state.q_limit, state.q_oqw, state.q_priority,
                              state.q_creation, state.q_names, usage.requested, trace=trace, recorder=recorder,
                              watch=watch, usage=past, k_value=k_value)
    return FairShare(total=total, deserved=state.q_deserved.copy(), limit=state.q_limit.copy(),
                     over_quota_weight=state.q_oqw.copy(), fair_share=fair, allocated=usage.allocated,
                     allocated_np=usage.allocated_np, requested=usage.requested, steps=steps, history=history,
                     k_value=k_value, usage=past)
