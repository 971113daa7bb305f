"""Evict to make room, only after simulating that the beneficiary then fits (KAI's job solver, simplified).

Victim jobs are taken in victim order (queues most over their share first, then lower priority, then newer);
an elastic victim gives up its pods above the minimum one at a time, otherwise its whole gang goes at once. After
each addition the beneficiary is placed on the freed (releasing) resources; on success, victims whose resources
turned out not to be needed are kept running, victims that fit elsewhere are re-placed there (pipelined: KAI's
consolidating reclaim and preempt; consolidation requires it of every victim), and the action's validation
(reclaim rules) must accept what remains evicted; the action supplies these steps as one ScenarioFilter. The
session is left unchanged when no scenario works.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from kai_opt.fairshare.capacity import capacity_violation
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.quantities import le, less_all
from kai_opt.fairshare.share import NO_SHARE_DRF_PENALTY, UNLIMITED
from kai_opt.heuristics.gang import Attempt, GangPlacer
from kai_opt.heuristics.jobs import JobQueue, job_keys
from kai_opt.heuristics.session import DEV, IS_ACTIVE, Session
from kai_opt.heuristics.status_watch import StatusWatch, group_active_counts
from kai_opt.heuristics.tasks import active_counts, active_mask
from kai_opt.state import R_GPU, PodStatus
from kai_opt.state.segments import concat_ranges


@dataclass
class Outcome:
    ok: bool
    victims: list[int]
    why: str | None = None
    attempt: Attempt | None = None


def job_runtime(sess: Session, g: int) -> float:
    st = sess.state
    if not math.isnan(st.pg_last_start[g]):
        return st.now - float(st.pg_last_start[g])
    pods = st.group_pods(g)
    starts = st.pod_start[pods][active_mask(sess, pods)]
    starts = starts[~np.isnan(starts)]
    return st.now - float(starts.min()) if len(starts) else math.inf


def protected_by_min_runtime(sess: Session, g: int, kind: str) -> bool:
    st = sess.state
    q = int(st.pg_queue[g])
    per_queue = st.q_preempt_min_runtime if kind == "preempt" else st.q_reclaim_min_runtime
    default = sess.cfg.preempt_min_runtime_s if kind == "preempt" else sess.cfg.reclaim_min_runtime_s
    limit = float(per_queue[q]) if q >= 0 and not math.isnan(per_queue[q]) else default
    return limit > 0 and job_runtime(sess, g) < limit


def protected_mask(sess: Session, kind: str) -> np.ndarray:
    """protected_by_min_runtime for every group at once (bool[G], read-only: shared while the session's state
    stays the same)."""
    watch = sess.static(f"protection_{kind}", lambda: _Protection(sess, kind))
    return sess.memo(("protected_mask", kind), lambda: _read_only(watch.mask(sess)))


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class _Protection:
    """protected_by_min_runtime per group, kept up to date from the pods whose status changed (StatusWatch): a
    group's runtime reads its last start, else the first start of its active pods, so only the groups of changed
    pods are judged again (one per session and kind)."""

    def __init__(self, sess: Session, kind: str) -> None:
        st = sess.state
        per_queue = st.q_preempt_min_runtime if kind == "preempt" else st.q_reclaim_min_runtime
        default = sess.cfg.preempt_min_runtime_s if kind == "preempt" else sess.cfg.reclaim_min_runtime_s
        q = st.pg_queue
        limits = np.full(st.n_groups, float(default))
        if len(per_queue):
            own = per_queue[np.maximum(q, 0)]
            has = (q >= 0) & ~np.isnan(own)
            limits[has] = own[has]
        self.limits = limits
        self.check = limits > 0
        self.out = np.zeros(st.n_groups, dtype=bool)
        # groups whose runtime reads their pods' starts (no last start), and only while they are checked
        self.by_pods = self.check & np.isnan(st.pg_last_start)
        self.watch: StatusWatch | None = None
        if self.check.any():
            self.watch = StatusWatch(sess.status)
            self._judge(sess, np.flatnonzero(self.check))

    def mask(self, sess: Session) -> np.ndarray:
        """A copy of the mask in the session's current state."""
        if self.watch is not None:
            pods, _ = self.watch.changed(sess.status)
            if len(pods):
                groups = np.unique(sess.state.pod_pg[pods])
                groups = groups[groups >= 0]
                self._judge(sess, groups[self.by_pods[groups]])
        return self.out.copy()

    def _judge(self, sess: Session, groups: np.ndarray) -> None:
        """out[groups] as the session stands (groups: checked ones)."""
        if not len(groups):
            return
        st = sess.state
        counts = np.diff(st.pg_pod_start)[groups]
        slots, at = concat_ranges(st.pg_pod_start[groups], counts)
        pods = st.pg_pods[slots]
        starts = st.pod_start[pods]
        starts = np.where(IS_ACTIVE[sess.status[pods]] & ~np.isnan(starts), starts, np.inf)
        first = np.full(len(groups), np.inf)
        nonempty = counts > 0
        if nonempty.any():
            first[nonempty] = np.minimum.reduceat(starts, at[nonempty])
        since_first = np.where(np.isinf(first), np.inf, st.now - first)  # no start known: runs forever
        last = st.pg_last_start[groups]
        runtime = np.where(np.isnan(last), since_first, st.now - last)
        self.out[groups] = runtime < self.limits[groups]


def victim_rank(sess: Session) -> np.ndarray:
    """Per group, its place in the victim order among jobs of equal elasticity: lower priority first, then newer,
    then by key (then index). Static for a session, computed once."""
    return sess.static("victim_rank", lambda: _read_only(_victim_rank(sess)))


def _victim_rank(sess: Session) -> np.ndarray:
    st = sess.state
    rank = np.empty(st.n_groups, dtype=np.int64)
    if not st.n_groups:
        return rank
    created = np.nan_to_num(st.pg_creation, nan=0.0)
    # (priority, -created, key, index): lexsort is stable, so equal keys keep index order
    order = np.lexsort((np.array(st.pg_keys, dtype=str), -created, st.pg_priority))
    rank[order] = np.arange(st.n_groups)
    return rank


def victim_chunk_order(sess: Session, groups: list[int] | np.ndarray,
                       within: np.ndarray | None = None) -> Iterator[tuple[int, list[int]]]:
    """_chunk_order, made once per (session state, groups) and replayed: searches for different beneficiaries
    from the same state walk the same victims (the chunks are shared: callers must not change them).

    `within`: a superset of `groups` whose order is shared by many searches (reclaim: every queue's victims,
    where each search leaves out its own queue's). The order of a subset equals the superset's up to the first
    chunk of a group outside the subset (the tree walk picks the same queue at every level until it would walk
    into a left-out job), so that prefix is replayed from the superset's order and the subset's own order is made
    only when a search goes past it."""
    gs = np.asarray(groups, dtype=np.int64)
    if within is None:
        return iter(_memo_order(sess, gs))
    base = np.asarray(within, dtype=np.int64)
    member = np.zeros(sess.state.n_groups, dtype=bool)
    member[gs] = True
    in_base = np.zeros(sess.state.n_groups, dtype=bool)
    in_base[base] = True
    if not in_base[gs].all():
        return iter(_memo_order(sess, gs))
    return _prefix_then_own(sess, gs, base, member)


def _memo_order(sess: Session, gs: np.ndarray) -> _Replay:
    return sess.memo(("victim_chunk_order", gs.tobytes()), lambda: _Replay(_chunk_order(sess, gs)))


def _prefix_then_own(sess: Session, gs: np.ndarray, base: np.ndarray,
                     member: np.ndarray) -> Iterator[tuple[int, list[int]]]:
    taken = 0
    for g, chunk in _memo_order(sess, base):
        if not member[g]:
            break
        yield g, chunk
        taken += 1
    else:
        return  # the superset's order held no chunk of a left-out group: it is the subset's order
    yield from islice(_memo_order(sess, gs), taken, None)


class _Replay:
    """A lazily generated sequence that any number of iterators walk from the start (what one produced is
    kept for the next)."""

    def __init__(self, source: Iterator[tuple[int, list[int]]]) -> None:
        self.source: Iterator[tuple[int, list[int]]] | None = source
        self.items: list[tuple[int, list[int]]] = []
        first = next(source, None)  # the source reads the session's state now, before any caller changes it
        if first is None:
            self.source = None
        else:
            self.items.append(first)

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        i = 0
        items = self.items
        while True:
            if i < len(items):
                yield items[i]
                i += 1
                continue
            if self.source is None:
                return
            nxt = next(self.source, None)
            if nxt is None:
                self.source = None
                return
            items.append(nxt)


def victim_pods(sess: Session) -> np.ndarray:
    """bool[P]: the pods a victim search may take (read-only, shared while the session's state stays the same).
    KAI's victims are a job's active allocated pods, pods placed in this session included: a group's bound pods,
    and, for a group with no bound pod, its pods placed in this cycle (bound now or pipelined), which nothing runs
    yet (taking one back withdraws the placement: kai_opt.heuristics.cycle). A group with bound pods keeps the
    ones placed in this cycle (they count towards its minimum; see _chunk_order)."""
    return sess.memo("victim_pods", lambda: _read_only(_victim_pods(sess)))


def _victim_pods(sess: Session) -> np.ndarray:
    st = sess.state
    return _victim_mask_of(sess, np.arange(st.n_pods, dtype=np.int64), st.pod_pg)


def _victim_mask_of(sess: Session, pods: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """victim_pods' rule for `pods`, every pod of some groups (`owner`: each one's group, -1 for none): read from
    those pods alone, so a victim order over a few groups costs their pods, not every pod and every placement of
    the cycle."""
    status = sess.status[pods]
    out = status == PodStatus.BOUND
    placed = np.flatnonzero((status == PodStatus.PIPELINED) & (owner >= 0))
    if len(placed) and sess.placements:
        with_bound = np.zeros(sess.state.n_groups, dtype=bool)
        with_bound[owner[out & (owner >= 0)]] = True
        placed = placed[~with_bound[owner[placed]]]
        if len(placed) > FEW_GROUPS:  # many: one pass over the cycle's placements
            hit = np.isin(pods[placed], np.fromiter(sess.placements, dtype=np.int64, count=len(sess.placements)))
        else:
            hit = np.array([int(pods[i]) in sess.placements for i in placed.tolist()], dtype=bool)
        out[placed[hit]] = True
    return out


def _chunk_order(sess: Session, groups: list[int] | np.ndarray) -> Iterator[tuple[int, list[int]]]:
    """(group, pods) chunks in eviction order, as KAI's victim queue yields them: jobs of the queue furthest over
    its share first (re-judged after every chunk taken, as its allocation drops), lower queue priority first,
    compared level by level from the top of the tree; inside a queue, jobs above their minimum first (they give
    up one pod, the last in task order, and go back in line), then lower priority, then newer. A job's victim pods
    (victim_pods: its bound pods, or, with none bound, its pods placed in this cycle) up to its minimum are its
    core, which goes whole, and only while the job has no other pods placed, pipelined or moved in this cycle (the
    model's rule: a group placed this cycle keeps its core; evicting it would stop running pods of the job the
    cycle grows). Lazy: the caller stops taking chunks once the beneficiary fits."""
    st = sess.state
    gs = np.asarray(groups, dtype=np.int64)
    # a few groups (a search over the cheapest victims): their counts only, not the session state's for all
    victim, left_all, newly = _chunk_counts(sess) if len(gs) > FEW_GROUPS else _chunk_counts_of(sess, gs)
    start = st.pg_pod_start
    remaining: dict[int, list[int]] = {}  # the group's victim pods in task order, made when first needed
    left: dict[int, int] = {}  # victim pods left per group this order took chunks from (else left_all's)
    rank = victim_rank(sess)
    min_member = st.pg_min_member

    def bound_pods(g: int) -> list[int]:
        pods = remaining.get(g)
        if pods is None:
            a, b = int(start[g]), int(start[g + 1])
            pods = remaining[g] = st.pg_pods[a:b][victim[a:b]].tolist()
        return pods

    def elastic(g: int) -> int:
        m = int(min_member[g])
        n = left.get(g, int(left_all[g])) + int(newly[g])
        return 0 if n > m else (1 if n == m else 2)

    def take(g: int) -> list[int] | None:
        """g's next chunk; None while its core stays (victim pods up to the minimum, while the group has pods
        placed or moved)."""
        pods = bound_pods(g)
        if len(pods) > int(min_member[g]):
            chunk = [pods.pop()]  # a victim pod above the minimum
        elif newly[g] == 0:
            chunk = list(pods)
            pods.clear()
        else:
            return None
        left[g] = len(pods)
        return chunk

    gs = gs[left_all[gs] > 0]
    if len(gs) == 1:  # one victim job (most searches over the cheapest victims): no queue order to walk
        one = int(gs[0])
        while (chunk := take(one)) is not None:
            yield one, chunk
            if not remaining[one]:
                return
        return
    # the first heap of every leaf queue, from one sort: (elasticity, rank) is the job key
    n_all = left_all[gs] + newly[gs]
    mm = min_member[gs]
    el = np.where(n_all > mm, 0, np.where(n_all == mm, 1, 2))
    rk = rank[gs]
    qs = st.pg_queue[gs]
    order = queue_job_order(qs, el, rk)
    tree = _VictimTree(sess, qs[order], el[order], rk[order], gs[order])
    tree.build()
    while True:
        g = tree.pop_job()
        if g is None:
            return
        q = int(st.pg_queue[g])
        chunk = take(g)
        if chunk is None:
            tree.refresh(q)
            continue
        yield g, chunk
        tree.release(q, sess.queue_request(chunk, sess.node[np.array(chunk)]).sum(axis=0))
        if remaining[g]:
            tree.push_job(q, (elastic(g), int(rank[g])), g)
        tree.refresh(q)


FEW_GROUPS = 64  # a victim order over at most this many groups counts theirs only (_chunk_counts_of)


def _chunk_counts_of(sess: Session, gs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_chunk_counts' arrays, right for the groups `gs` only (the slots of their pods, their counts)."""
    st = sess.state
    gs = np.unique(gs)
    start = st.pg_pod_start
    a, b = start[gs], start[gs + 1]
    lens = b - a
    slots = np.repeat(a - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
    pods = st.pg_pods[slots]
    owner = np.repeat(gs, lens)
    victim = np.zeros(len(st.pg_pods), dtype=bool)
    victim[slots] = _victim_mask_of(sess, pods, owner)
    # per group arrays, right at `gs` only (nothing reads the other groups' entries: no pass over every group)
    left = np.zeros(st.n_groups, dtype=np.int64)
    np.add.at(left, owner, victim[slots])
    newly = np.zeros(st.n_groups, dtype=np.int64)
    np.add.at(newly, owner, IS_ACTIVE[sess.status[pods]])
    newly[gs] -= left[gs]
    if sess.moves:
        moved = st.pod_pg[np.fromiter(sess.moves, dtype=np.int64, count=len(sess.moves))]
        mine = np.zeros(st.n_groups + 1, dtype=bool)  # (slot -1: a moved pod of no group)
        mine[gs] = True
        np.add.at(newly, moved[mine[moved]], 1)
    return victim, left, newly


def _chunk_counts(sess: Session) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per session state (read-only, shared by every victim order made from it): whether each slot of
    `pg_pods` is a victim pod, and per group its victim pods and its pods placed, pipelined or moved in this
    cycle that are no victims. The latter count towards a group's gang (the victim order) and keep its core;
    pods moved (re-placed) by consolidating victims keep their releasing status where they were."""
    def make() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        st = sess.state
        victim = victim_pods(sess)[st.pg_pods]
        bound_c = np.concatenate([[0], np.cumsum(victim)])
        active_c = np.concatenate([[0], np.cumsum(IS_ACTIVE[sess.status[st.pg_pods]])])
        start = st.pg_pod_start
        left = bound_c[start[1:]] - bound_c[start[:-1]]
        newly = active_c[start[1:]] - active_c[start[:-1]] - left
        if sess.moves:
            moved = st.pod_pg[np.fromiter(sess.moves, dtype=np.int64, count=len(sess.moves))]
            newly = newly + np.bincount(moved[moved >= 0], minlength=len(newly))
        return _read_only(victim), _read_only(left), _read_only(newly)

    return sess.memo("chunk_counts", make)


def queue_job_order(qs: np.ndarray, el: np.ndarray, rk: np.ndarray) -> np.ndarray:
    """np.lexsort((rk, el, qs)) for distinct non-negative ranks `rk`, elasticities `el` in 0..2 and queues `qs`
    >= 0: the jobs in rank order (a scatter over the ranks), then a stable sort by (queue, elasticity), a radix
    sort when that key fits 16 bits (the victim order is made once per session state and set of groups)."""
    n = len(rk)
    if n == 0 or int(qs.max()) * 3 + 2 > np.iinfo(np.int16).max:
        return np.lexsort((rk, el, qs))
    at = np.full(int(rk.max()) + 1, -1, dtype=np.int64)
    at[rk] = np.arange(n)
    by_rank = at[at >= 0]
    key = (qs[by_rank] * 3 + el[by_rank]).astype(np.int16)
    return by_rank[np.argsort(key, kind="stable")]


LEAF, PARENT = 0, 1  # _VictimTree._best's tag: what the key below a queue is the key of


class _VictimTree:
    """The victim order's queue tree: per leaf queue a heap of its jobs, per parent a heap of its children keyed
    by (the child's level key, the best key below it), so the next victim is found by walking down from the top
    and a chunk taken re-keys only the queues on its path (lazy deletion by version). A leaf's heap is made from
    its slice of the sorted jobs when first needed (a sorted list is a heap)."""

    def __init__(self, sess: Session, qs: np.ndarray, el: np.ndarray, rk: np.ndarray, gs: np.ndarray) -> None:
        fs = sess.fs
        self.sess, self.fs = sess, fs
        self.parent = sess.state.q_parent
        self.priority = sess.state.q_priority
        self.allocated = sess.ledger.allocated.copy()
        self.share = sess.static("victim_tree_share", lambda: np.where(fs.allocatable_share == UNLIMITED, fs.total,
                                                                        fs.allocatable_share))
        self.jobs: dict[int, list[tuple[tuple[Any, ...], int]]] = {}
        # parent (-1: top) -> (key, version, queue)
        self.children: dict[int, list[tuple[tuple[Any, ...], int, int]]] = {}
        self.version: dict[int, int] = {}
        self.levels: dict[int, tuple[Any, ...]] = {}
        # leaf queue -> (first, end) of its jobs in the sorted arrays, until its heap is made, and the key of its
        # first job (its best)
        self.el, self.rk, self.gs = el, rk, gs
        bounds = np.flatnonzero(np.r_[True, qs[1:] != qs[:-1], True]) if len(qs) else np.zeros(1, dtype=np.int64)
        firsts, ends = bounds[:-1], bounds[1:]
        leaves = qs[firsts].tolist()
        # over its fair share, and its dominant share, of the queues the tree holds (the leaves and their ancestors;
        # a victim order over a few jobs reads a few queues of the whole tree)
        ancestors = sess.ledger.ancestors
        self.queues = sorted({a for q in leaves for a in ancestors[q]})
        at = np.array(self.queues, dtype=np.int64)
        alloc, share = self.allocated[at], self.share[at]
        with np.errstate(divide="ignore", invalid="ignore"):
            drf = np.where(share == 0, alloc * NO_SHARE_DRF_PENALTY, alloc / share).max(axis=1) if len(at) \
                else np.zeros(0)
        self.over: dict[int, bool] = dict(zip(self.queues, np.all(fs.fair_share[at] < alloc, axis=1).tolist(),
                                              strict=True))
        self.drf: dict[int, float] = dict(zip(self.queues, drf.tolist(), strict=True))
        self.slices: dict[int, tuple[int, int]] = dict(zip(leaves, zip(firsts.tolist(), ends.tolist(), strict=True),
                                                           strict=True))
        self.first: dict[int, tuple[int, int]] = dict(zip(leaves, zip(el[firsts].tolist(), rk[firsts].tolist(),
                                                                      strict=True), strict=True))
        self.leaves = set(self.slices)

    def _jobs(self, q: int) -> list[tuple[tuple[Any, ...], int]]:
        h = self.jobs.get(q)
        if h is None:
            a, b = self.slices.pop(q, (0, 0))
            h = self.jobs[q] = [((e, r), g) for e, r, g in zip(self.el[a:b].tolist(), self.rk[a:b].tolist(),
                                                               self.gs[a:b].tolist(), strict=True)]
            self.leaves.add(q)
        return h

    def level_key(self, q: int) -> tuple[Any, ...]:
        k = self.levels.get(q)
        if k is None:
            k = self.levels[q] = (not self.over[q], int(self.priority[q]), -self.drf[q])
        return k

    def push_job(self, q: int, key: tuple[Any, ...], g: int) -> None:
        heapq.heappush(self._jobs(q), (key, g))

    def build(self) -> None:
        """Every queue with jobs below it keyed in its parent's heap, bottom-up (one entry per queue)."""
        ancestors = self.sess.ledger.ancestors
        over, priority, drf = self.over, self.priority, self.drf
        self.levels.update((q, (not over[q], int(priority[q]), -drf[q])) for q in self.queues)  # (level_key)
        for q in sorted(self.queues, key=lambda q: -len(ancestors[q])):  # children before their parents
            h = self.children.get(q)
            if h is not None:
                heapq.heapify(h)
            self.version[q] = 1
            best = self._best(q)
            if best is not None:
                self.children.setdefault(int(self.parent[q]), []).append(((self.level_key(q), best), 1, q))
        top = self.children.get(-1)
        if top is not None:
            heapq.heapify(top)

    def _best(self, q: int) -> tuple[Any, ...] | None:
        """The best key below q: (LEAF, its best job's key) or (PARENT, its best child's entry key), so siblings
        tied at their level key compare what is below them alike (jobs with jobs, queues with queues; a leaf
        before a parent queue)."""
        if q in self.leaves:
            if q in self.slices:
                return (LEAF, self.first[q])
            h = self.jobs[q]
            return (LEAF, h[0][0]) if h else None
        kids = self.children.get(q, [])
        while kids and kids[0][1] != self.version.get(kids[0][2]):
            heapq.heappop(kids)
        return (PARENT, kids[0][0]) if kids else None

    def refresh(self, q: int) -> None:
        """Re-key q and its ancestors in their parents' heaps (after q's jobs or allocation changed)."""
        while q >= 0:
            self.version[q] = self.version.get(q, 0) + 1
            best = self._best(q)
            if best is not None:
                heapq.heappush(self.children.setdefault(int(self.parent[q]), []),
                               ((self.level_key(q), best), self.version[q], q))
            q = int(self.parent[q])

    def release(self, q: int, amount: np.ndarray) -> None:
        """A chunk of leaf q's allocation is taken: q and its ancestors count less from now on."""
        fair = self.sess.static("fair_share_rows", lambda: self.fs.fair_share.tolist())
        for a in self.sess.ledger.ancestors[q]:
            self.allocated[a] -= amount
            alloc = self.allocated[a].tolist()
            self.over[a] = all(f < x for f, x in zip(fair[a], alloc, strict=True))
            self.drf[a] = max((x * NO_SHARE_DRF_PENALTY if d == 0 else x / d)
                              for x, d in zip(alloc, self.share[a].tolist(), strict=True))
            self.levels.pop(a, None)

    def pop_job(self) -> int | None:
        q = -1
        while q not in self.leaves:
            kids = self.children.get(q, [])
            while kids and kids[0][1] != self.version.get(kids[0][2]):
                heapq.heappop(kids)
            if not kids:
                return None
            q = kids[0][2]
        h = self._jobs(q)
        return heapq.heappop(h)[1] if h else None


class _FitCount:
    """A quick necessary condition for whole-GPU tasks: for each size s, nodes (of the feasible ones) can hold
    at least as many pods of >= s devices as there are such tasks, counting whole devices free once releases
    finish. Kept up to date per touched node, so a victim scenario that cannot work is skipped without a
    placement attempt (KAI's accumulated-idle-GPUs scenario filter plays the same role)."""

    def __init__(self, sess: Session, tasks: list[int], feasible: np.ndarray) -> None:
        st = sess.state
        sig = int(st.pod_sig[tasks[0]])  # `feasible` is this signature's node mask: count its tasks only
        whole = [int(st.pod_gpu_whole[p]) for p in tasks if st.pod_sig[p] == sig and st.pod_gpu_whole[p] > 0]
        self.sizes = sorted(set(whole))
        self.need = {s: sum(1 for w in whole if w >= s) for s in self.sizes}
        self.sess, self.feasible = sess, feasible
        free = sess.whole_future[feasible]
        self.count = {s: int((free // s).sum()) for s in self.sizes}

    def ok(self) -> bool:
        return all(self.count[s] >= self.need[s] for s in self.sizes)

    def ok_without(self, groups: np.ndarray, within: np.ndarray | None = None) -> bool:
        """Whether it could hold with every victim pod of `groups` gone: the bound on what any victims can do.
        `within`: see _whole_without."""
        if not self.sizes:
            return True
        gs = np.asarray(groups, dtype=np.int64)
        whole = self.sess.memo(("whole_without", gs.tobytes()), lambda: _whole_without(self.sess, gs, within))
        whole = whole[self.feasible]
        return all(int((whole // s).sum()) >= self.need[s] for s in self.sizes)

    def update(self, change: dict[int, tuple[int, int]]) -> None:
        """`change`: feasible node -> whole devices free (before, after) the change."""
        for b, a in change.values():
            for s in self.sizes:
                self.count[s] += a // s - b // s


class _DryRun:
    """Victim chunks taken without evicting them: what they free (GPUs, and whole devices on feasible nodes for
    a _FitCount), computed as Session.evict would change it."""

    def __init__(self, sess: Session, feasible: np.ndarray) -> None:
        self.sess, self.feasible = sess, feasible
        self.held: dict[int, int] = {}  # device -> milli-GPU held once the taken chunks are gone

    def _whole_future(self, n: int) -> int:
        sess = self.sess
        a, b = int(sess.dev_start[n]), int(sess.dev_start[n + 1])
        held, dev_held = self.held, sess.dev_held
        return sum(1 for d in range(a, b) if held.get(d, dev_held[d]) == 0)

    def take(self, chunk: list[int], fits: _FitCount) -> list[float]:
        """Count the chunk as evicted; returns the GPUs each pod frees (as Session.evict's op amounts)."""
        sess, held = self.sess, self.held
        freed: list[float] = []
        change: dict[int, tuple[int, int]] = {}
        for p in chunk:
            n = int(sess.node[p])
            if self.feasible[n] and n not in change:
                change[n] = (self._whole_future(n), 0)
            freed.append(float(sess.pod_node_amount(p, n)[R_GPU]))
            devices = sess.pod_devices(p)
            if devices:
                per_dev = sess.gpu_per_device(p, n)
                for d in devices:
                    held[d] = held.get(d, int(sess.dev_held[d])) - per_dev
        fits.update({n: (b, self._whole_future(n)) for n, (b, _) in change.items()})
        return freed


def _whole_without(sess: Session, groups: np.ndarray, within: np.ndarray | None = None) -> np.ndarray:
    """int64[N]: whole devices per node free once every victim pod of `groups` is gone (and releases finish).
    `within`: a superset of `groups` many searches share (victim_chunk_order's): its devices' holdings without
    its victims are made once per state, and `groups` then adds back those of the groups it leaves out (integer
    milli-GPUs: the same holdings)."""
    st = sess.state
    held = None
    if within is not None:
        base = np.asarray(within, dtype=np.int64)
        in_base = np.zeros(st.n_groups, dtype=bool)
        in_base[base] = True
        if in_base[groups].all():
            member = np.zeros(st.n_groups, dtype=bool)
            member[groups] = True
            held = sess.memo(("held_without", base.tobytes()), lambda: _read_only(_held_without(sess, base))) \
                + _per_device(sess, *_victim_holdings(sess, _victim_pods_of(sess, base[~member[base]])))
    if held is None:
        held = _held_without(sess, groups)
    return _read_only(np.bincount(sess.dev_node[held <= 0], minlength=st.n_nodes))


def _held_without(sess: Session, groups: np.ndarray) -> np.ndarray:
    """int64[D]: each device's milli-GPUs held once every victim pod of `groups` is gone."""
    return sess.dev_held - _per_device(sess, *_victim_holdings(sess, _victim_pods_of(sess, groups)))


def _per_device(sess: Session, dev: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """int64[D]: the amounts summed per device (whole milli-GPUs: exact as floats)."""
    return np.bincount(dev, weights=amount, minlength=len(sess.dev_held)).astype(np.int64)


def _victim_holdings(sess: Session, pods: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(device, milli-GPUs) each victim pod holds on each of its devices: the devices the session gave a pod
    placed in this cycle, a bound pod's own."""
    st = sess.state
    placed = sess.status[pods] != PodStatus.BOUND  # (the victims that are not bound were placed in this cycle)
    devs: list[int] = []
    amounts: list[int] = []
    for p in pods[placed].tolist():  # placed in this cycle: the devices the session gave it
        per_dev = sess.gpu_per_device(p, int(sess.node[p]))
        for d in sess.devices[p]:
            devs.append(d)
            amounts.append(per_dev)
    pods = pods[~placed]
    starts, ends = st.pod_dev_start[pods], st.pod_dev_start[pods + 1]
    counts = ends - starts
    dev = np.asarray(devs, dtype=np.int64)
    amount = np.asarray(amounts, dtype=np.int64)
    if counts.sum():
        owner = np.repeat(np.arange(len(pods)), counts)
        mem = np.maximum(st.node_gpu_mem_mib[sess.node[pods]], 1)
        per = np.where(st.pod_gpu_whole[pods] > 0, DEV,
                       np.where(st.pod_gpu_frac[pods] > 0, st.pod_gpu_frac[pods],
                                np.minimum(DEV, -(-st.pod_gpu_mem[pods] * DEV // mem))))
        dev = np.concatenate([dev, st.pod_dev[concat_ranges(starts, counts)[0]]])
        amount = np.concatenate([amount, per[owner].astype(np.int64)])
    return dev, amount


class ScenarioFilter:
    """An action's rules in the victim search (KAI's scenario filters and solution validator), one hook per stage
    of a scenario; the defaults let everything through. The search asks them in this order: worth_trying per
    victim chunk taken, then, once the beneficiary is placed and unneeded victims kept, precheck, replace_victims
    and validate."""

    # victim jobs that the allocation order pops before the beneficiary are allocated again first (KAI's scenario
    # simulation; see _victims_ahead)
    allocation_order = False

    def worth_trying(self, chunk: list[int]) -> bool:
        """Sees every chunk taken: whether the victims so far could pass validation at all (a necessary condition
        that spares hopeless attempts)."""
        return True

    def precheck(self, sess: Session, ledger: QueueLedger, victims: list[int]) -> str | None:
        """Sees the victims before any moves: a reason fails the scenario (it must be a necessary condition of
        validate for these victims and any subset of them)."""
        return None

    def replace_victims(self, sess: Session, chunks: list[list[int]]) -> list[int]:
        """Re-places victims that fit elsewhere instead of just evicting them; returns the pods moved."""
        return []

    def validate(self, sess: Session, ledger: QueueLedger, victims: list[int]) -> str | None:
        """Sees the victims that are not re-placed (ledger: the queues before the search): a reason rejects the
        scenario."""
        return None

    def victim_ok(self, groups: np.ndarray) -> np.ndarray | None:
        """Before a search over the cheapest victims (`victim_search`): which of these victim groups the rules would
        not refuse outright as the session stands (None: all)."""
        return None


def solve_with_victims(
    sess: Session,
    gang: GangPlacer,
    g: int,
    tasks: list[int],
    candidates: list[int] | np.ndarray,
    reason: str,
    rules: ScenarioFilter,
    *,
    feasible: np.ndarray,
    max_victim_jobs: int = -1,
    within: np.ndarray | None = None,
) -> Outcome:
    """Take victim chunks in order, evicting each; whenever the beneficiary could fit, try to place it on what
    is free or being released, then keep unneeded victims, move the movable ones and validate, each stage asking
    `rules` (ScenarioFilter). The session is unchanged unless it returns ok. `within`: see victim_chunk_order."""
    st = sess.state
    need_gpu = float(st.pod_req[tasks, R_GPU].sum())
    candidates = np.asarray(candidates, dtype=np.int64)
    jobs_used: set[int] = set()
    accumulated: list[list[int]] = []
    last_why = "not enough resources even with every eligible victim evicted"
    ledger_before = sess.ledger.copy()
    releasable = float((sess.alloc[feasible, R_GPU] - sess.held[feasible, R_GPU]).sum())
    fits = _FitCount(sess, tasks, feasible)
    if not fits.ok_without(candidates, within):
        return Outcome(False, [], "not enough resources even with every eligible victim evicted")
    scenarios = 0
    # the pending jobs' allocation order from the state the search starts in (KAI's scenario simulation)
    pending_order = sess.memo("pending_order", lambda: _PendingOrder(sess)) if rules.allocation_order else None
    # the queues whose allocation _queue_capacity reads (the beneficiary's ancestors with a limit)
    limited = {a for a in sess.ledger.ancestors[int(st.pg_queue[g])] if bool(np.any(sess.fs.limit[a] != -1))}
    cp0 = sess.checkpoint()
    # until the first scenario, chunks are only counted (no session change): most chunks of a long search, and
    # every chunk of one that gives up, are never simulated
    dry: _DryRun | None = _DryRun(sess, feasible)
    uncounted: list[list[int]] = []  # dry-run chunks taken while worth_trying did not hold yet
    for v, chunk in victim_chunk_order(sess, candidates, within):
        if not any(feasible[int(sess.node[p])] for p in chunk):
            continue
        if v not in jobs_used:
            if max_victim_jobs >= 0 and len(jobs_used) >= max_victim_jobs:
                continue
            jobs_used.add(v)
        if 0 <= sess.cfg.max_victim_chunks <= len(accumulated):
            last_why = f"gave up after {len(accumulated)} victim chunks (max_victim_chunks)"
            break
        accumulated.append(chunk)
        if dry is not None:  # no scenario yet: count what the chunk frees without evicting it
            # (only when worth_trying holds, the one time the counts are read: chunks taken before that are
            # counted then, in order, the same sums as one by one)
            hopeful = rules.worth_trying(chunk)
            if not hopeful:
                uncounted.append(chunk)
                continue
            for c in (*uncounted, chunk):
                for freed in dry.take(c, fits):
                    releasable += freed
            uncounted.clear()
        else:
            for freed in _evict_chunk(sess, chunk, reason, g, feasible, fits):
                releasable += freed
            hopeful = rules.worth_trying(chunk)
        if releasable + 1e-9 < need_gpu or not fits.ok() or not hopeful:
            continue  # cannot fit yet: skip the simulation
        if dry is not None:  # the first scenario: evict what the dry run counted, from here on chunk by chunk
            sess.evict_many([p for c in accumulated for p in c], reason, g)
            dry = None
        if scenarios >= sess.cfg.max_victim_scenarios:
            last_why = f"gave up after {scenarios} victim scenarios (max_victim_scenarios)"
            break
        scenarios += 1
        if not _each_task_fits_somewhere(sess, gang, tasks):
            continue  # the placement below fails in this scenario whatever the simulation gives back
        cp = sess.checkpoint()
        ahead = _victims_ahead(sess, g, accumulated, pending_order) if pending_order is not None else set()
        attempt = gang.place(g, tasks, allow_pipeline=True)
        if not attempt.ok:
            sess.rollback(cp)
            continue
        scenario = [c for i, c in enumerate(accumulated) if i not in ahead] if ahead else accumulated
        def give_up(maybe: list[int]) -> bool:
            nonlocal last_why
            why = rules.precheck(sess, ledger_before, maybe)
            if why is not None:
                last_why = why
            return why is not None

        victims = _keep_unneeded(sess, scenario, lambda: _queue_capacity(sess, g, tasks) is None, reason, g,
                                 limited, give_up) if scenario else []
        # None: even the victims that might stay evicted failed precheck; else precheck the ones that do
        if victims is None or give_up(victims):
            sess.rollback(cp)
            continue
        # consolidating: victims that fit elsewhere move instead of just going
        still = set(victims)
        moved = set(rules.replace_victims(sess, [[p for p in c if p in still] for c in scenario
                                                 if any(p in still for p in c)]))
        victims = [p for p in victims if p not in moved]
        why = _queue_capacity(sess, g, tasks)
        if why is None:
            why = rules.validate(sess, ledger_before, victims)
        if why is None:
            # what an eviction makes room for waits for it: KAI places a preemptor pipeline-only
            sess.convert_to_pipelined(attempt.placed)
            attempt.any_pipelined = True
            return Outcome(True, victims, None, attempt)
        last_why = why
        sess.rollback(cp)  # back to every accumulated victim evicted, nothing placed
    sess.rollback(cp0)
    if not accumulated:
        return Outcome(False, [], "no eligible victims")
    return Outcome(False, [], last_why)


class _PendingOrder:
    """The allocation order (JobQueue's, KAI's JobsOrderByQueues) of a session state's pending jobs, per queue
    subtree, each step with the subtree's queue-order key (what its parent compares): the part of a reclaim
    scenario's simulation that is the same in every scenario from that state. A subtree holding no victim keeps
    its allocation throughout a search (the scenarios evict and unevict victims only, the beneficiary is placed
    after the simulation), so its pops and keys are those of the state the search started from. Made once per
    state (Session.memo), sequences extended only as far as simulations read them."""

    def __init__(self, sess: Session) -> None:
        st = sess.state
        # not kept: an order is kept in the session's caches, and one holding the session would make a reference
        # cycle the garbage collector then walks with everything the session made (docs/DESIGN-NOTES.md)
        probe = JobQueue(sess, [])
        self.live = probe.order  # the session's queue order: the rules on its ledger (updated in place)
        self.order = copy.copy(self.live)  # the same rules on this state's ledger
        self.order.ledger = sess.ledger.copy()
        self.children = st.q_children
        self.tops = probe.tops
        jobs = sess.static("pending_jobs", lambda: _PendingJobs(st.n_queues))
        changed = jobs.update(sess, probe)
        self.request = dict(jobs.request)
        self.request_bytes = dict(jobs.request_bytes)
        # queue -> its own jobs in job order (job key, group): leaf queues' jobs (lists shared, never changed)
        self.own: dict[int, list[tuple[tuple[Any, ...], int]]] = dict(jobs.own)
        self.count = list(jobs.count)  # pending jobs in each queue's subtree
        self.items: dict[int, list[int]] = {}  # queue -> its subtree's jobs in pop order (so far)
        self.keys: dict[int, list[tuple[Any, ...]]] = {}  # queue -> its key with each of those jobs at its head
        self._starved: dict[tuple[int, int], bool] = {}
        # (queue, a pending job's request as bytes, the queue's allocation) -> the queue's key with that job at its
        # head (QueueOrder.key reads nothing else): shared by every state of the session, where most queues keep
        # their allocation from one state to the next
        self.live_keys: dict[tuple[int, bytes, tuple[float, ...]], tuple[Any, ...]] = sess.static("queue_keys", dict)
        self._allocs: dict[int, tuple[float, ...]] = {}  # queue -> its allocation in this state, as a key
        self._child_at: dict[int, dict[int, int]] = {}  # queue -> per child, how many of its jobs items[q] holds
        if jobs.last is not None:
            self._share(jobs.last, changed, sess.ledger.ancestors)
        jobs.last = self

    def _share(self, prev: _PendingOrder, changed: set[int], ancestors: list[list[int]]) -> None:
        """Take over `prev`'s sequences (the lists themselves: both extend them alike) for every subtree whose
        queues have the same own jobs and allocations here as in prev's state: a subtree's pop order and keys read
        nothing else (queues whose job lists changed: `changed`)."""
        moved = np.flatnonzero((prev.order.ledger.allocated != self.order.ledger.allocated).any(axis=1)).tolist()
        dirty: set[int] = set()
        for q in (*changed, *moved):
            dirty.update(ancestors[q])
        for q in prev.items.keys() - prev.keys.keys():  # (every queue with items gets its keys' list, shared)
            prev.keys[q] = []
        self.items, self.keys, self._child_at = prev.items.copy(), prev.keys.copy(), prev._child_at.copy()
        for q in dirty:
            self.items.pop(q, None)
            self.keys.pop(q, None)
            self._child_at.pop(q, None)

    def starved_until(self, q: int, g: int) -> bool:
        """Whether queue q (holding job g) is not over its fair share and within deserved with each job at its
        head (queue order rules 1-2: its key starts (False, False)) until g pops (remembered)."""
        hit = self._starved.get((q, g))
        if hit is None:
            hit = False
            for i in range(self.count[q]):
                k = self.key(q, i)
                if k[0] or k[1]:
                    break
                if self.item(q, i) == g:
                    hit = True
                    break
            self._starved[(q, g)] = hit
        return hit

    def item(self, q: int, i: int) -> int:
        items = self.items.get(q)
        if items is None or len(items) <= i:
            self._extend(q, i + 1)
            items = self.items[q]
        return items[i]

    def key(self, q: int, i: int) -> tuple[Any, ...]:
        keys = self.keys.setdefault(q, [])
        while len(keys) <= i:
            x = self.item(q, len(keys))
            alloc = self._allocs.get(q)
            if alloc is None:
                alloc = self._allocs[q] = tuple(self.order.ledger.allocated[q].tolist())
            mk = (q, self.request_bytes[x], alloc)
            k = self.live_keys.get(mk)
            if k is None:
                k = self.live_keys[mk] = self.order.key(q, self.request[x])
            keys.append(k)
        return keys[i]

    def _extend(self, q: int, n: int) -> None:
        """items[q] made n long (n <= count[q]): q's own jobs first, then its children's by queue order."""
        items = self.items.setdefault(q, [])
        own = self.own.get(q, [])
        at = self._child_at.setdefault(q, {})
        while len(items) < n:
            if len(items) < len(own):  # (q's own jobs come first)
                items.append(own[len(items)][1])
                continue
            best, best_key = -1, None
            for c in self.children[q]:
                i = at.get(c, 0)
                if i >= self.count[c]:
                    continue
                kc = self.key(c, i)
                if best_key is None or ((kc < best_key) if kc != best_key else self.order.tie(c, best) < 0):
                    best, best_key = c, kc
            i = at.get(best, 0)
            items.append(self.item(best, i))
            at[best] = i + 1


class _PendingJobs:
    """The session's pending jobs (a pending pod, no problem) with their requests and job keys, per queue in job
    order and counted per subtree: what every _PendingOrder starts from, kept up to date from the pods whose status
    changed since the last state read (StatusWatch) instead of made again per state. A queue's list is replaced,
    never changed, so a _PendingOrder may keep the lists of the state it was made in."""

    def __init__(self, n_queues: int) -> None:
        self.watch: StatusWatch | None = None  # None: nothing read yet
        self.last: _PendingOrder | None = None  # the latest pending order made (its sequences may be taken over)
        self.request: dict[int, np.ndarray] = {}
        self.request_bytes: dict[int, bytes] = {}  # (its keys: the pending jobs)
        self.own: dict[int, list[tuple[tuple[Any, ...], int]]] = {}
        self.count = [0] * n_queues

    def update(self, sess: Session, probe: Any) -> set[int]:
        """Brought to the session's current state (probe: a JobQueue of it, for requests and job keys); returns the
        queues whose job lists changed."""
        st = sess.state
        if self.watch is None:
            self.watch = StatusWatch(sess.status)
            pods = np.flatnonzero((sess.status == PodStatus.PENDING) & (st.pod_pg >= 0))
        else:
            pods, _ = self.watch.changed(sess.status)
            pods = pods[st.pod_pg[pods] >= 0]
            if not len(pods):
                return set()
        groups = np.unique(st.pod_pg[pods]).tolist()
        start, members, status = st.pg_pod_start, st.pg_pods, sess.status
        ancestors = sess.ledger.ancestors
        gone: dict[int, set[int]] = {}
        came: dict[int, list[tuple[tuple[Any, ...], int]]] = {}
        now_pending = [x for x in groups if st.pg_problem[x] is None
                       and bool((status[members[start[x]:start[x + 1]]] == PodStatus.PENDING).any())]
        for x in groups:
            if self.request.pop(x, None) is not None:  # was pending: out, back in below if it still is
                q = int(st.pg_queue[x])
                gone.setdefault(q, set()).add(x)
                del self.request_bytes[x]
                for a in ancestors[q]:
                    self.count[a] -= 1
        for x, v in zip(now_pending, _pending_values(sess, probe, now_pending), strict=True):
            q = int(st.pg_queue[x])
            self.request[x], self.request_bytes[x] = v[1], v[3]
            came.setdefault(q, []).append((v[2], x))
            for a in ancestors[q]:
                self.count[a] += 1
        changed = gone.keys() | came.keys()
        for q in changed:
            out = gone.get(q, set())
            jobs = [j for j in self.own.get(q, []) if j[1] not in out] + came.get(q, [])
            jobs.sort()
            if jobs:
                self.own[q] = jobs
            else:
                self.own.pop(q, None)
        return changed


def _pending_values(sess: Session, probe: Any,
                    pending: list[int]) -> list[tuple[bytes, np.ndarray, tuple[Any, ...], bytes]]:
    """Per pending job: (its pods' statuses, its request, its job key, its request's bytes). The request and the
    key read nothing but the statuses of the job's own pods, so they are kept for the whole session (Session.static)
    and made again only for a job whose pods changed (a search returns to states it left: those jobs' pods are as
    they were)."""
    st, status = sess.state, sess.status
    known: dict[int, tuple[bytes, np.ndarray, tuple[Any, ...], bytes]] = sess.static("pending_job_values", dict)
    start, members = st.pg_pod_start, st.pg_pods
    out = []
    for x in pending:
        now = status[members[start[x]:start[x + 1]]].tobytes()
        hit = known.get(x)
        if hit is None or hit[0] != now:
            request = _read_only(probe.request(x))
            hit = known[x] = (now, request, probe.job_key(x), request.tobytes())
        out.append(hit)
    return out


def _victims_ahead(sess: Session, g: int, accumulated: list[list[int]], po: _PendingOrder) -> set[int]:
    """KAI's scenario simulation (TryToVirtuallyAllocatePreemptorAndGetVictims): every pending job, the evicted
    victims' jobs and the preemptor are popped in allocation order; a victim job popped before the preemptor is
    allocated again first (on its own node: nothing else took its room yet), pending jobs that are neither are
    skipped. Puts those victims back; returns the indices of their chunks in `accumulated`.

    A skipped job changes no allocation, so only the victims' queues and their ancestors ("special" queues)
    change keys from one scenario to the next; a subtree without victims pops as in `po` (one index into its
    sequence). And a skipped job matters only while it heads a queue whose key decides between a victim's queue
    and the preemptor's: one on either path below the paths' common ancestor, or below such a queue; subtrees
    elsewhere are left out."""
    if g not in po.request:
        return set()
    sim = _Simulation(sess, g, accumulated, po)
    if not sim.chunks:
        return set()
    sim.lay_out()
    return sim.run()


class _Simulation:
    """One reclaim scenario's simulation (_victims_ahead): which queues take part, their heads and keys as
    victims return, and the pop loop."""

    def __init__(self, sess: Session, g: int, accumulated: list[list[int]], po: _PendingOrder) -> None:
        st = sess.state
        self.sess, self.g, self.accumulated, self.po = sess, g, accumulated, po
        chunks: dict[int, list[int]] = {}  # victim job -> the indices of its chunks in `accumulated`
        for n, chunk in enumerate(accumulated):
            chunks.setdefault(int(st.pod_pg[chunk[0]]), []).append(n)
        self.ancestors = ancestors = sess.ledger.ancestors  # queue -> itself, then its ancestors up to the top
        self.g_path = g_path = ancestors[int(st.pg_queue[g])]
        # Queue order rules 1-2 without popping: below a queue A of the preemptor's path whose child towards the
        # preemptor holds no victim and is within deserved with each job it pops up to the preemptor (po: its
        # allocation is the state's), a child over its fair share or over deserved in some resource already loses
        # every comparison at A until the preemptor pops (its allocation only rises as victims return, its jobs
        # only add to it): its victims are not simulated (they stay evicted) and its jobs are left out.
        self.holding: set[int] = set()  # the victims' queues and their ancestors
        holding = self.holding
        for v in chunks:
            holding.update(ancestors[int(st.pg_queue[v])])
        self.beaten: dict[int, int] = {}  # queue A (-1: the top level) -> its child towards the preemptor
        for i, c in enumerate(g_path):
            if c not in holding and po.starved_until(c, g):
                self.beaten[g_path[i + 1] if i + 1 < len(g_path) else -1] = c
        self.every = set(chunks)  # every victim job: its subtree's allocation is not the state's, even if not
        # simulated
        if self.beaten:
            for v in list(chunks):
                path = ancestors[int(st.pg_queue[v])]
                if any(self.lost(path[k + 1] if k + 1 < len(path) else -1, path[k]) for k in range(len(path))):
                    del chunks[v]
        self.chunks = chunks

    def lost(self, parent: int, c: int) -> bool:
        """Whether queue c (a child of parent) pops nothing before the preemptor (see __init__)."""
        towards = self.beaten.get(parent)
        if towards is None or c == towards:
            return False
        a = self.sess.ledger.allocated[c].tolist()
        return less_all(self.po.order.fair_share[c], a) or not le(a, self.po.order.deserved[c])

    def lay_out(self) -> None:
        """The queues that take part: the special ones (queues whose allocation or jobs differ from po's: victims
        evicted, victims queued), the roots below the common ancestors (towards a victim or the preemptor) and
        the subtrees under them, with the jobs left in each."""
        st, po, ancestors, g_path = self.sess.state, self.po, self.ancestors, self.g_path
        g_at = {a: i for i, a in enumerate(g_path)}
        self.special = special = self.holding
        roots: set[int] = set()
        self.queued: dict[int, list[int]] = {}  # queue -> its victim jobs
        for v in self.chunks:
            q = int(st.pg_queue[v])
            path = ancestors[q]
            i = next((k for k, a in enumerate(path) if a in g_at), len(path))  # path[i]: the common ancestor
            roots.add(path[max(i - 1, 0)])
            j = g_at[path[i]] if i < len(path) else len(g_path)
            roots.add(g_path[max(j - 1, 0)])
            self.queued.setdefault(q, []).append(v)
        self.in_r = in_r = {s: any(a in roots for a in ancestors[s]) for s in special}
        children, count = po.children, po.count
        # per special queue: its own pending jobs' next index (victims skipped), its victims' next index, the jobs
        # left in it (included subtrees only); per included victim-free queue: its next index in po
        self.own_at: dict[int, int] = {}
        self.victim_at: dict[int, int] = {}
        self.left_in: dict[int, int] = {}
        self.at: dict[int, int] = {}
        self.included: dict[int, list[int]] = {}  # special queue (-1: the top level) -> its children taking part

        def incl(parent: int, kids: list[int]) -> list[int]:
            under = parent >= 0 and in_r[parent]
            return [c for c in kids if (c in special or ((under or c in roots) and count[c] > 0))
                    and not (parent in self.beaten and self.lost(parent, c))]

        self.included[-1] = incl(-1, po.tops)
        for s in sorted(special, key=lambda s: -len(ancestors[s])):  # deepest first
            kids = self.included[s] = incl(s, children[s])
            n = len(self.queued.get(s, ())) + sum(self.left_in[c] if c in special else count[c] for c in kids)
            if in_r[s]:
                n += sum(1 for _, x in po.own.get(s, ()) if x not in self.every)
            self.left_in[s] = n
        self.request: dict[int, np.ndarray] = {}  # victim job -> what the scenario evicted of it (when first read)
        self.mine: dict[int, list[tuple[tuple[Any, ...], int]]] = {}  # queue -> its victim jobs in job order
        self.victim_keys: dict[int, tuple[Any, ...]] | None = None  # victim job -> its job key (_victim_keys)
        self.head_key: dict[int, tuple[int, tuple[Any, ...]]] = {}  # special queue -> (its head job, its key)
        self.alloc: dict[int, tuple[float, ...]] = {}  # special queue -> its allocation now
        self.best_of: dict[int, int] = {}  # special queue (-1: top level) -> its child that goes first
        # the special queues that may have jobs of their own (leaf queues with victims or taking part)
        self.owns = {s for s in special if s in self.queued or (in_r[s] and po.own.get(s))}

    def own_head(self, s: int) -> int | None:
        """The special queue's own next job (pending or victim), if any."""
        best: tuple[tuple[Any, ...], int] | None = None
        if self.in_r[s]:
            own = self.po.own.get(s)
            if own:
                k = self.own_at.get(s, 0)
                while k < len(own) and own[k][1] in self.every:
                    k += 1
                self.own_at[s] = k
                if k < len(own):
                    best = own[k]
        vs = self.mine.get(s)
        if vs is None and s in self.queued:
            keys = self._victim_keys()
            vs = self.mine[s] = sorted((keys[v], v) for v in self.queued[s])
        if vs:
            k = self.victim_at.get(s, 0)
            if k < len(vs) and (best is None or vs[k] < best):
                best = vs[k]
        return None if best is None else best[1]

    def _victim_keys(self) -> dict[int, tuple[Any, ...]]:
        """Every queued victim job's job key, made at once when the first is read (the victims' pods keep their
        statuses throughout the simulation: victims that pop return to the ledger only, until its end)."""
        if self.victim_keys is None:
            victims = [v for vs in self.queued.values() for v in vs]
            self.victim_keys = dict(zip(victims, job_keys(self.sess, victims), strict=True))
        return self.victim_keys

    def head(self, s: int) -> tuple[int, tuple[Any, ...]]:
        """The special queue's head job and its key with that job at its head (remembered until it pops)."""
        hit = self.head_key.get(s)
        if hit is None:
            po, order = self.po, self.po.live  # keys of special queues read their allocation now
            x = self.own_head(s) if s in self.owns else None
            if x is None:
                c = self.best(s)
                x = self.head(c)[0] if c in self.special else po.item(c, self.at.get(c, 0))
            if x in self.chunks:  # a victim: its request grows from scenario to scenario
                r = self.request.get(x)
                if r is None:
                    r = self.request[x] = self.sess.queue_request(
                        [p for k in self.chunks[x] for p in self.accumulated[k]]).sum(axis=0)
                hit = (x, order.key(s, r))
            else:  # a pending job: its key depends on the queue's allocation only, remembered per state
                mk = (s, po.request_bytes[x], self._alloc(s))
                k = po.live_keys.get(mk)
                if k is None:
                    k = po.live_keys[mk] = order.key(s, po.request[x])
                hit = (x, k)
            self.head_key[s] = hit
        return hit

    def best(self, s: int) -> int:
        """The child of special queue s (-1: the top level) that pops next (remembered until something pops)."""
        hit = self.best_of.get(s)
        if hit is None:
            po, special, head_key, at, keys_of = self.po, self.special, self.head_key, self.at, self.po.keys
            b, bk = -1, None
            for c in self.included[s]:
                if c in special:
                    if not self.left_in[c]:
                        continue
                    hk = head_key.get(c)
                    kc = (hk if hk is not None else self.head(c))[1]
                else:
                    i = at.get(c, 0)
                    if i >= po.count[c]:
                        continue
                    ks = keys_of.get(c)
                    kc = ks[i] if ks is not None and i < len(ks) else po.key(c, i)
                if bk is None or ((kc < bk) if kc != bk else po.live.tie(c, b) < 0):
                    b, bk = c, kc
            hit = self.best_of[s] = b
        return hit

    def run(self) -> set[int]:
        """Pop jobs until the preemptor: each victim job popped first is allocated again (its chunks returned)."""
        chunks, owns, special, at, po = self.chunks, self.owns, self.special, self.at, self.po
        ahead: set[int] = set()
        left = len(chunks)
        # victims popped first go back into the ledger only (all the pop order reads) until the end, where they
        # are unevicted at once: the same amounts added in the same order as job by job
        ledger = self.sess.ledger
        saved = ledger.allocated.copy(), ledger.allocated_np.copy()
        back_pods: list[int] = []
        while left:
            s = -1
            walked: list[int] = []
            x: int | None = None
            child: int | None = None  # the victim-free child x popped from (None: a queue's own job)
            while True:
                if s in owns:
                    x = self.own_head(s)
                    if x is not None:
                        if x in chunks:
                            self.victim_at[s] = self.victim_at.get(s, 0) + 1
                        else:
                            self.own_at[s] += 1
                        break
                nxt = self.best(s)
                if nxt < 0:
                    break
                if nxt not in special:
                    k = at.get(nxt, 0)
                    x = po.item(nxt, k)
                    at[nxt] = k + 1
                    child = nxt
                    break
                walked.append(nxt)
                s = nxt
            self.best_of.pop(-1, None)
            for s in walked:
                self.left_in[s] -= 1
                self.head_key.pop(s, None)
                self.best_of.pop(s, None)
            if x is None or x == self.g:
                break
            back = chunks.get(x)
            if back is None:  # a pending job that is neither victim nor preemptor: so may the next ones be
                self.pop_along(walked, child)
                continue
            pods = [p for k in back for p in self.accumulated[k]]
            self.sess.unevict_in_ledger(pods)
            back_pods.extend(pods)
            for s in walked:
                self.alloc.pop(s, None)
            ahead.update(back)
            left -= 1
        if back_pods:
            ledger.allocated[...] = saved[0]
            ledger.allocated_np[...] = saved[1]
            self.sess.unevict_many(back_pods)
        return ahead


    def pop_along(self, walked: list[int], child: int | None) -> None:
        """Pop, without walking the tree, the pending jobs that come next along the path the last pop took (the
        special queues `walked`, then the victim-free `child`, or with None the last walked queue's own jobs):
        skipped jobs change no allocation, so every key off the path stays as it is, and the walk would take the
        same path again while, at each level, the path's key with the next job at its head is below every other
        child's key there (an equal key ends the run: the walk's tie rule decides it). Stops before a victim, the
        preemptor, or a key that is not below."""
        if child is None and not walked:
            return
        po, at = self.po, self.at
        path = [*walked, child] if child is not None else walked
        levels = [-1, *walked]
        others: list[tuple[Any, ...] | None] = []  # per level, the smallest key among its other children
        for parent, mine in zip(levels, path, strict=False):
            low: tuple[Any, ...] | None = None
            for o in self.included[parent]:
                if o != mine:
                    k = self._key_now(o)
                    if k is not None and (low is None or k < low):
                        low = k
            others.append(low)
        leaf = walked[-1] if child is None else -1
        # the walked queues' allocations stay as they are while only pending jobs pop
        allocs = [self._alloc(w) for w in walked]
        live_keys, shapes, request, live = po.live_keys, po.request_bytes, po.request, po.live
        last: bytes | None = None  # the request of the last job whose keys passed (keys depend on it alone)
        while True:
            if child is not None:
                i = at.get(child, 0)
                if i >= po.count[child]:
                    return
                x = po.item(child, i)
                low = others[-1]
                if x == self.g or not (low is None or po.key(child, i) < low):
                    return
            else:
                x_own = self.own_head(leaf)
                if x_own is None or x_own in self.chunks or x_own == self.g:
                    return
                x = x_own
            shape = shapes[x]
            if shape != last:
                for j in range(len(walked) - 1, -1, -1):
                    low = others[j]
                    if low is None:
                        continue
                    mk = (walked[j], shape, allocs[j])
                    k = live_keys.get(mk)
                    if k is None:
                        k = live_keys[mk] = live.key(walked[j], request[x])
                    if not k < low:
                        return
                last = shape
            if child is not None:
                at[child] = i + 1
            else:
                self.own_at[leaf] += 1
            for w in walked:
                self.left_in[w] -= 1

    def _key_now(self, c: int) -> tuple[Any, ...] | None:
        """A child's key as `best` reads it (None: nothing left in it)."""
        if c in self.special:
            if not self.left_in[c]:
                return None
            hk = self.head_key.get(c)
            return (hk if hk is not None else self.head(c))[1]
        i = self.at.get(c, 0)
        if i >= self.po.count[c]:
            return None
        return self.po.key(c, i)

    def _alloc(self, s: int) -> tuple[float, ...]:
        """Special queue s's allocation now, as a key (remembered until a victim of its subtree pops)."""
        a = self.alloc.get(s)
        if a is None:
            a = self.alloc[s] = tuple(self.sess.ledger.allocated[s].tolist())
        return a


def _each_task_fits_somewhere(sess: Session, gang: GangPlacer, tasks: list[int]) -> bool:
    """Whether every task pod fits, on its own, some node its signature allows once releases finish, and (a group
    with a required topology level) some domain the group may use could hold all of them, with every victim of the
    scenario evicted. A necessary condition of the scenario's placement: the gang placer puts each pod on such a
    node that fits it, all inside one such domain, and the victims the simulation gives back only take room again,
    so when it fails the scenario fails whatever the simulation (the costly part of a reclaim scenario) would
    return. Each pod shape is judged once, from the placer's kept verdicts (NodeFilter.fit_memo)."""
    st, placer = sess.state, gang.placer
    seen: set[tuple[object, ...]] = set()
    for p in tasks:
        shape = (int(st.pod_sig[p]), st.pod_req[p].tobytes(), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]),
                 int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p]))
        if shape in seen:
            continue
        seen.add(shape)
        _now, future = placer.fit(p, np.flatnonzero(placer.static_mask(shape[0])))
        if not future.any():
            return False
    return gang.some_domain_may_hold(int(st.pod_pg[tasks[0]]), tasks)


def _evict_chunk(sess: Session, chunk: list[int], reason: str, g: int, feasible: np.ndarray,
                 fits: _FitCount) -> list[float]:
    """Evict a chunk (once scenarios are simulated) and update the fit count of the feasible nodes it frees;
    returns the GPUs each of its pods releases, in chunk order."""
    whole_future = sess.whole_future  # read before the chunk's evictions (one refresh per chunk)
    before: dict[int, int] = {}
    for p in chunk:
        n = int(sess.node[p])
        if feasible[n]:
            before.setdefault(n, int(whole_future[n]))
    sess.evict_many(chunk, reason, g)
    ev = sess.eviction_ops
    freed = [float(ev[p].amount[R_GPU]) for p in chunk]
    fits.update({n: (b, int(sess.whole_future[n])) for n, b in before.items()})
    return freed


def _victim_pods_of(sess: Session, groups: list[int] | np.ndarray) -> np.ndarray:
    st = sess.state
    if not len(groups):
        return np.zeros(0, dtype=np.int64)
    member = np.zeros(st.n_groups, dtype=bool)
    member[np.asarray(groups, dtype=np.int64)] = True
    pods = st.pg_pods[np.repeat(member, np.diff(st.pg_pod_start))]
    return pods[victim_pods(sess)[pods]]


def _queue_capacity(sess: Session, g: int, tasks: list[int]) -> str | None:
    """Re-check the group's queue limits and quota once victims that were not needed run again."""
    st = sess.state
    q = int(st.pg_queue[g])
    req = sess.queue_request(tasks, sess.node[np.array(tasks)]).sum(axis=0)
    without = sess.ledger.copy()
    without.add(q, -req, non_preemptible=not bool(st.pg_preemptible[g]))
    v = capacity_violation(sess.fs, without, q, req, preemptible=bool(st.pg_preemptible[g]))
    return None if v is None else v.reason


def _keep_unneeded(sess: Session, evicted: list[list[int]], still_ok: Callable[[], bool], reason: str,
                   beneficiary: int, limited: set[int] | None = None,
                   give_up: Callable[[list[int]], bool] | None = None) -> list[int] | None:
    """Un-evict victim chunks whose resources the placements did not use (latest added first): neither node room
    nor queue headroom (limits, quota) of the beneficiary. A chunk (an elastic pod, or a gang's whole core) goes
    back only as a whole, and only when its gang then keeps its minimum, so no victim gang is left half-evicted.
    `limited`: the queues still_ok depends on (None: any); a preemptible chunk of a queue below none of them
    cannot change its answer, which is then not asked again. `give_up(maybe)`, when given, first sees the victims
    that might stay evicted (every victim less the chunks that surely go back); when it says so, None is returned
    and the session is left for the caller to roll back."""
    st = sess.state
    chunk_group = st.pod_pg[np.fromiter((c[0] for c in evicted), dtype=np.int64, count=len(evicted))].tolist()
    groups = np.unique(chunk_group)
    active = dict(zip(groups.tolist(), active_counts(sess, groups).tolist(), strict=True))
    # most chunks' fate is known before the walk (_decided); the walk below judges the others, in the same order
    decided = _decided(sess, evicted, chunk_group, active, limited, still_ok) if limited is not None else {}
    if give_up is not None and decided and give_up(
            [p for i, c in enumerate(evicted) if not decided.get(i, False) for p in c]):
        return None
    kept: set[int] = set()
    ok_now: bool | None = None  # still_ok()'s answer while only chunks that cannot change it went back
    # what each undecided evicted pod gives back (its eviction op), and the room left on its nodes and devices, as
    # Python numbers updated as chunks go back (no session change per chunk: the chunks still_ok cannot see go
    # back together at the end). A decided chunk that goes back only uses nodes and devices where every evicted
    # pod fits back at once, so leaving it out of the room changes no answer of the walk
    ev = sess.eviction_ops
    ops = {p: ev[p] for i, c in enumerate(evicted) if i not in decided for p in c}
    nodes = sorted({op.node for op in ops.values()})
    room = dict(zip(nodes, (sess.alloc[nodes] - sess.held[nodes]).tolist(), strict=True))
    devs = sorted({d for op in ops.values() for d in op.devices})
    dev_room = dict(zip(devs, (DEV - sess.dev_held[devs]).tolist(), strict=True)) if devs else {}
    amount = {p: op.amount_list() for p, op in ops.items()}
    later: list[int] = []
    for i in range(len(evicted) - 1, -1, -1):
        chunk = evicted[i]
        back = decided.get(i)
        if back is not None:
            if back:
                kept.update(chunk)
                later.extend(chunk)
            continue
        g = chunk_group[i]
        if 0 < active[g] + len(chunk) < int(st.pg_min_member[g]):
            continue  # its gang's core stays evicted: an elastic pod alone cannot run on
        extra: dict[int, list[int]] = {}
        for p in chunk:
            n = ops[p].node
            a = amount[p]
            e = extra.get(n)
            extra[n] = list(a) if e is None else [x + y for x, y in zip(e, a, strict=True)]
        if any(x > r for n, a in extra.items() for x, r in zip(a, room[n], strict=True)):
            continue
        dev_extra: dict[int, int] = {}
        for p in chunk:
            op = ops[p]
            for d in op.devices:
                dev_extra[d] = dev_extra.get(d, 0) + op.dev_amount
        if any(a > dev_room[d] for d, a in dev_extra.items()):
            continue
        if limited is not None and _blind(sess, g, limited):
            if ok_now is None:
                ok_now = still_ok()
            if not ok_now:
                continue  # unevicting it would not change the answer: it stays evicted
            later.extend(chunk)
        else:
            for p in chunk:
                sess.unevict(p)
            if not still_ok():  # its queue room was what the beneficiary needed: evict it after all
                sess.evict_many(chunk, reason, beneficiary)
                ok_now = None
                continue
            ok_now = True
        kept.update(chunk)
        active[g] += int(IS_ACTIVE[[ops[p].prev_status for p in chunk]].sum())
        for n, a in extra.items():
            room[n] = [r - x for r, x in zip(room[n], a, strict=True)]
        for d, milli in dev_extra.items():
            dev_room[d] -= milli
    sess.unevict_many(later)
    return [p for c in evicted for p in c if p not in kept]


def _decided(sess: Session, evicted: list[list[int]], chunk_group: list[int], active: dict[int, int],
             limited: set[int], still_ok: Callable[[], bool]) -> dict[int, bool]:
    """Chunk index -> whether _keep_unneeded's walk puts it back, for the chunks whose answer is known before the
    walk: a chunk whose queue still_ok cannot see (preemptible, below no limited queue), while still_ok holds, on
    nodes and devices where every evicted pod fits back at once (so in any order, whatever else goes back) goes
    back if its gang's minimum lets it; a chunk its gang's minimum keeps evicted stays. Judged in the walk's
    order, per gang until its first chunk that is not known (its later chunks depend on that one). `active` is
    brought up to date for the chunks that go back."""
    st = sess.state
    ev = sess.eviction_ops
    ops = [ev[p] for c in evicted for p in c]
    n_pods = len(ops)
    node = np.fromiter((op.node for op in ops), dtype=np.int64, count=n_pods)
    amount = np.stack([op.amount for op in ops])
    nodes, at = np.unique(node, return_inverse=True)
    total = np.zeros((len(nodes), amount.shape[1]), dtype=amount.dtype)
    np.add.at(total, at, amount)
    pod_fits = np.all(total <= sess.alloc[nodes] - sess.held[nodes], axis=1)[at]
    n_dev = np.fromiter((len(op.devices) for op in ops), dtype=np.int64, count=n_pods)
    if n_dev.any():
        devs = np.fromiter((d for op in ops for d in op.devices), dtype=np.int64, count=int(n_dev.sum()))
        per = np.repeat(np.fromiter((op.dev_amount for op in ops), dtype=np.int64, count=n_pods), n_dev)
        dev_u, dev_at = np.unique(devs, return_inverse=True)
        dev_total = np.bincount(dev_at, weights=per).astype(np.int64)  # exact: milli-GPU sums far below 2**53
        dev_fits = (dev_total <= DEV - sess.dev_held[dev_u])[dev_at]
        pod_fits[np.repeat(np.arange(n_pods), n_dev)[~dev_fits]] = False
    sizes = [len(c) for c in evicted]
    starts = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)
    chunk_fits = np.logical_and.reduceat(pod_fits, starts).tolist()
    chunk_active = np.add.reduceat(
        IS_ACTIVE[np.fromiter((op.prev_status for op in ops), dtype=np.int64, count=n_pods)].astype(np.int64),
        starts).tolist()
    decided: dict[int, bool] = {}
    walked: dict[int, int] = {}  # group -> its active pods, while its chunks so far in the walk were all decided
    ok: bool | None = None
    for i in range(len(evicted) - 1, -1, -1):
        g = chunk_group[i]
        a = walked.get(g, active[g])
        if a < 0:
            continue  # an earlier chunk of its gang was not decided
        if 0 < a + sizes[i] < int(st.pg_min_member[g]):
            decided[i] = False  # stays evicted: its gang's core does
            continue
        if chunk_fits[i] and _blind(sess, g, limited):
            if ok is None:
                ok = still_ok()
            if ok:
                decided[i] = True
                walked[g] = a + chunk_active[i]
                continue
        active[g] = a  # what the walk will see at this chunk, its first undecided one
        walked[g] = -1
    return decided


def _blind(sess: Session, g: int, limited: set[int]) -> bool:
    """Whether still_ok cannot see group g's chunks going back: preemptible, in a queue below none of `limited`."""
    return bool(sess.state.pg_preemptible[g]) and not any(
        a in limited for a in sess.ledger.ancestors[int(sess.state.pg_queue[g])])


def active_groups(sess: Session) -> list[int]:
    return np.flatnonzero(active_group_mask(sess)).tolist()


def active_group_mask(sess: Session) -> np.ndarray:
    """bool[G]: groups with a pod bound, pipelined or placed in this cycle (read-only, shared while the
    session's state stays the same)."""
    return sess.memo("active_group_mask", lambda: _read_only(_active_group_mask(sess)))


def _active_group_mask(sess: Session) -> np.ndarray:
    return group_active_counts(sess).any_active(sess)
