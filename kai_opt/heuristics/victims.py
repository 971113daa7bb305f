"""Evict to make room, only after simulating that the beneficiary then fits (KAI's job solver, simplified).

Victim jobs are taken in victim order (queues most over their share first, then lower priority, then newer);
an elastic victim gives up its pods above the minimum one at a time, otherwise its whole gang goes at once. After
each addition the beneficiary is placed on the freed (releasing) resources; on success, victims whose resources
turned out not to be needed are kept running, victims that fit elsewhere are re-placed there (pipelined: KAI's
consolidating reclaim and preempt; consolidation requires it of every victim), and the action's validator
(reclaim rules) must accept what remains evicted. The session is left unchanged when no scenario works.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from kai_opt.fairshare.capacity import capacity_violation
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.heuristics.gang import Attempt, GangPlacer
from kai_opt.heuristics.session import ACTIVE, DEV, Session
from kai_opt.heuristics.tasks import active_mask
from kai_opt.state import R_GPU, PodStatus

Validator = Callable[[Session, QueueLedger, list[int]], str | None]  # gets the victims that are not re-placed


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


def protection_counts(sess: Session, groups: list[int], kind: str) -> dict[str, int]:
    """Why running groups cannot be victims of `kind` (preempt | reclaim): how many are non-preemptible and how
    many are younger than their queue's min runtime (a Reason's details; only computed when an action fails)."""
    st = sess.state
    out = {"non_preemptible": 0, "min_runtime": 0}
    for v in groups:
        if not st.pg_preemptible[v]:
            out["non_preemptible"] += 1
        elif protected_by_min_runtime(sess, v, kind):
            out["min_runtime"] += 1
    return out


def victim_chunk_order(sess: Session, groups: list[int]) -> Iterator[tuple[int, list[int]]]:
    """(group, pods) chunks in eviction order, as KAI's victim queue yields them: jobs of the queue furthest over
    its share first (re-judged after every chunk taken, as its allocation drops), lower queue priority first,
    compared level by level from the top of the tree; inside a queue, jobs above their minimum first (they give
    up one pod, the last in task order, and go back in line), then lower priority, then newer. A job at its
    minimum gives up all its pods. Lazy: the caller stops taking chunks once the beneficiary fits."""
    st = sess.state
    status = sess.status[st.pg_pods]
    bound_c = np.concatenate([[0], np.cumsum(status == PodStatus.BOUND)])
    active_c = np.concatenate([[0], np.cumsum(np.isin(status, ACTIVE))])
    start = st.pg_pod_start
    remaining: dict[int, list[int]] = {}  # the group's bound pods in task order, made when first needed
    left = {g: int(bound_c[start[g + 1]] - bound_c[start[g]]) for g in groups}
    # pods this cycle already placed (or pipelined) for a group count towards its gang but cannot be victims
    newly = {g: int(active_c[start[g + 1]] - active_c[start[g]]) - left[g] for g in groups}

    def bound_pods(g: int) -> list[int]:
        pods = remaining.get(g)
        if pods is None:
            a, b = int(start[g]), int(start[g + 1])
            pods = remaining[g] = st.pg_pods[a:b][status[a:b] == PodStatus.BOUND].tolist()
        return pods

    tree = _VictimTree(sess)

    def job_key(g: int) -> tuple:
        m = int(st.pg_min_member[g])
        n = left[g] + newly[g]
        elastic = 0 if n > m else (1 if n == m else 2)
        created = st.pg_creation[g]
        return (elastic, int(st.pg_priority[g]), -(created if not math.isnan(created) else 0.0), st.pg_keys[g])

    for g in groups:
        if left[g]:
            tree.push_job(int(st.pg_queue[g]), job_key(g), g)
    tree.build()
    while True:
        g = tree.pop_job()
        if g is None:
            return
        q = int(st.pg_queue[g])
        pods = bound_pods(g)
        if len(pods) + newly[g] > int(st.pg_min_member[g]):
            chunk = [pods.pop()]
        elif newly[g] == 0:
            chunk = list(pods)
            pods.clear()
        else:
            tree.refresh(q)
            continue  # its gang now relies on pods placed this cycle: its core stays
        left[g] = len(pods)
        yield g, chunk
        tree.release(q, sess.queue_request(chunk, sess.node[np.array(chunk)]).sum(axis=0))
        if pods:
            tree.push_job(q, job_key(g), g)
        tree.refresh(q)


class _VictimTree:
    """The victim order's queue tree: per leaf queue a heap of its jobs, per parent a heap of its children keyed
    by (the child's level key, the best key below it), so the next victim is found by walking down from the top
    and a chunk taken re-keys only the queues on its path (lazy deletion by version)."""

    def __init__(self, sess: Session) -> None:
        fs = sess.fs
        self.sess, self.fs = sess, fs
        self.parent = sess.state.q_parent
        self.priority = sess.state.q_priority
        self.allocated = sess.ledger.allocated.copy()
        self.share = np.where(fs.allocatable_share == -1, fs.total, fs.allocatable_share)
        self.jobs: dict[int, list[tuple[tuple, int]]] = {}
        self.children: dict[int, list[tuple[tuple, int, int]]] = {}  # parent (-1: top) -> (key, version, queue)
        self.version: dict[int, int] = {}
        self.levels: dict[int, tuple] = {}

    def level_key(self, q: int) -> tuple:
        k = self.levels.get(q)
        if k is None:
            alloc, share = self.allocated[q], self.share[q]
            over = bool(np.all(self.fs.fair_share[q] < alloc))
            drf = max((a * 1000.0 if d == 0 else a / d) for a, d in zip(alloc.tolist(), share.tolist(), strict=True))
            k = self.levels[q] = (not over, int(self.priority[q]), -drf)
        return k

    def push_job(self, q: int, key: tuple, g: int) -> None:
        heapq.heappush(self.jobs.setdefault(q, []), (key, g))

    def build(self) -> None:
        for q in list(self.jobs):
            self.refresh(q)

    def _best(self, q: int) -> tuple | None:
        if q in self.jobs:
            h = self.jobs[q]
            return h[0][0] if h else None
        h = self.children.get(q, [])
        while h and h[0][1] != self.version.get(h[0][2]):
            heapq.heappop(h)
        return h[0][0] if h else None

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
        for a in self.sess.ledger.ancestors[q]:
            self.allocated[a] -= amount
            self.levels.pop(a, None)

    def pop_job(self) -> int | None:
        q = -1
        while q not in self.jobs:
            h = self.children.get(q, [])
            while h and h[0][1] != self.version.get(h[0][2]):
                heapq.heappop(h)
            if not h:
                return None
            q = h[0][2]
        h = self.jobs[q]
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

    def ok_without(self, pods: np.ndarray) -> bool:
        """Whether it could hold with all of `pods` (running) gone: the bound on what any victims can do."""
        if not self.sizes:
            return True
        sess, st = self.sess, self.sess.state
        held = sess.dev_held.copy()
        starts, ends = st.pod_dev_start[pods], st.pod_dev_start[pods + 1]
        counts = ends - starts
        if counts.sum():
            owner = np.repeat(np.arange(len(pods)), counts)
            dev = st.pod_dev[np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))]
            mem = np.maximum(st.node_gpu_mem_mib[sess.node[pods]], 1)
            per = np.where(st.pod_gpu_whole[pods] > 0, DEV,
                           np.where(st.pod_gpu_frac[pods] > 0, st.pod_gpu_frac[pods],
                                    np.minimum(DEV, -(-st.pod_gpu_mem[pods] * DEV // mem))))
            np.subtract.at(held, dev, per[owner])
        whole = np.bincount(sess.dev_node[held <= 0], minlength=sess.state.n_nodes)[self.feasible]
        return all(int((whole // s).sum()) >= self.need[s] for s in self.sizes)

    def update(self, before: dict[int, int]) -> None:
        """`before`: feasible node -> whole devices free before the change."""
        for n, b in before.items():
            a = int(self.sess.whole_future[n])
            for s in self.sizes:
                self.count[s] += a // s - b // s


def solve_with_victims(
    sess: Session,
    gang: GangPlacer,
    g: int,
    tasks: list[int],
    candidates: list[int],
    reason: str,
    validator: Validator | None,
    *,
    feasible: np.ndarray,
    max_victim_jobs: int = -1,
    replace_victims: Callable[[Session, list[list[int]]], list[int]] | None = None,
    worth_trying: Callable[[list[int]], bool] | None = None,
) -> Outcome:
    """Take victim chunks in order, evicting each; whenever the beneficiary could fit, try to place it on what
    is free or being released, then keep unneeded victims, move the movable ones and validate. The session is
    unchanged unless it returns ok. `worth_trying(chunk)` sees every chunk taken and says whether the victims
    so far could pass validation at all (a necessary condition that spares hopeless attempts)."""
    st = sess.state
    need_gpu = float(st.pod_req[tasks, R_GPU].sum())
    jobs_used: set[int] = set()
    accumulated: list[list[int]] = []
    last_why = "not enough resources even with every eligible victim evicted"
    ledger_before = sess.ledger.copy()
    releasable = float((sess.alloc[feasible, R_GPU] - sess.held[feasible, R_GPU]).sum())
    fits = _FitCount(sess, tasks, feasible)
    everyone = _bound_pods(sess, candidates)
    if not fits.ok_without(everyone[feasible[sess.node[everyone]]]):
        return Outcome(False, [], "not enough resources even with every eligible victim evicted")
    scenarios = 0
    cp0 = sess.checkpoint()
    for v, chunk in victim_chunk_order(sess, candidates):
        if not any(feasible[int(sess.node[p])] for p in chunk):
            continue
        if v not in jobs_used:
            if max_victim_jobs >= 0 and len(jobs_used) >= max_victim_jobs:
                continue
            jobs_used.add(v)
        accumulated.append(chunk)
        before: dict[int, int] = {}
        for p in chunk:
            n = int(sess.node[p])
            if feasible[n]:
                before.setdefault(n, int(sess.whole_future[n]))
            releasable += float(sess.pod_node_amount(p, n)[R_GPU])
            sess.evict(p, reason, g)
        fits.update(before)
        hopeful = worth_trying(chunk) if worth_trying is not None else True
        if releasable + 1e-9 < need_gpu or not fits.ok() or not hopeful:
            continue  # cannot fit yet: skip the simulation
        if scenarios >= sess.cfg.max_victim_scenarios:
            last_why = f"gave up after {scenarios} victim scenarios (max_victim_scenarios)"
            break
        scenarios += 1
        cp = sess.checkpoint()
        attempt = gang.place(g, tasks, allow_pipeline=True)
        if not attempt.ok:
            sess.rollback(cp)
            continue
        victims = _keep_unneeded(sess, accumulated, lambda: _queue_capacity(sess, g, tasks) is None, reason, g)
        if replace_victims is not None:  # consolidating: victims that fit elsewhere move instead of just going
            still = set(victims)
            moved = set(replace_victims(sess, [[p for p in c if p in still] for c in accumulated
                                               if any(p in still for p in c)]))
            victims = [p for p in victims if p not in moved]
        why = _queue_capacity(sess, g, tasks)
        if why is None and validator is not None:
            why = validator(sess, ledger_before, victims)
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


def _bound_pods(sess: Session, groups: list[int]) -> np.ndarray:
    st = sess.state
    if not groups:
        return np.zeros(0, dtype=np.int64)
    pods = np.concatenate([st.group_pods(g) for g in groups])
    return pods[sess.status[pods] == PodStatus.BOUND]


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
                   beneficiary: int) -> list[int]:
    """Un-evict victim chunks whose resources the placements did not use (latest added first): neither node room
    nor queue headroom (limits, quota) of the beneficiary. A chunk (an elastic pod, or a gang's whole core) goes
    back only as a whole, and only when its gang then keeps its minimum, so no victim gang is left half-evicted."""
    st = sess.state
    kept: set[int] = set()
    for chunk in reversed(evicted):
        g = int(st.pod_pg[chunk[0]])
        if 0 < int(active_mask(sess, st.group_pods(g)).sum()) + len(chunk) < int(st.pg_min_member[g]):
            continue  # its gang's core stays evicted: an elastic pod alone cannot run on
        extra = {}
        for p in chunk:
            n = int(sess.node[p])
            extra[n] = extra.get(n, 0) + sess.pod_node_amount(p, n)
        if any(np.any(sess.held[n] + a > sess.alloc[n]) for n, a in extra.items()):
            continue
        dev_extra: dict[int, int] = {}
        for p in chunk:
            devs = sess.pod_devices(p)
            per = sess.gpu_per_device(p, int(sess.node[p])) if devs else 0
            for d in devs:
                dev_extra[d] = dev_extra.get(d, 0) + per
        if any(sess.dev_held[d] + a > DEV for d, a in dev_extra.items()):
            continue
        for p in chunk:
            sess.unevict(p)
        if not still_ok():  # its queue room was what the beneficiary needed: evict it after all
            for p in chunk:
                sess.evict(p, reason, beneficiary)
            continue
        kept.update(chunk)
    return [p for c in evicted for p in c if p not in kept]


def active_groups(sess: Session) -> list[int]:
    st = sess.state
    pods = np.nonzero(np.isin(sess.status, ACTIVE) & (st.pod_pg >= 0))[0]
    return sorted(set(st.pod_pg[pods].tolist()))
