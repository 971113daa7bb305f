"""Evict to make room, only after simulating that the beneficiary then fits (KAI's job solver, simplified).

Victim jobs are taken in victim order (queues most over their share first, then lower priority, then newer);
an elastic victim gives up its pods above the minimum one at a time, otherwise its whole gang goes at once. After
each addition the beneficiary is placed on the freed (releasing) resources; on success, victims whose resources
turned out not to be needed are kept running, victims that fit elsewhere are re-placed there (pipelined: KAI's
consolidating reclaim and preempt; consolidation requires it of every victim), and the action's validator
(reclaim rules) must accept what remains evicted. The session is left unchanged when no scenario works.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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


def victim_chunk_order(sess: Session, groups: list[int]) -> list[tuple[int, list[int]]]:
    """(group, pods) chunks in eviction order, as KAI's victim queue yields them: jobs of the queue furthest over
    its share first (re-judged after every chunk taken, as its allocation drops), lower queue priority first;
    inside a queue, jobs above their minimum first (they give up one pod, the last in task order, and go back in
    line), then lower priority, then newer. A job at its minimum gives up all its pods."""
    import heapq

    st, fs = sess.state, sess.fs
    remaining = {g: st.group_pods(g)[sess.status[st.group_pods(g)] == PodStatus.BOUND].tolist() for g in groups}
    # pods this cycle already placed (or pipelined) for a group count towards its gang but cannot be victims
    newly = {g: int(active_mask(sess, st.group_pods(g)).sum()) - len(remaining[g]) for g in groups}
    allocated = sess.ledger.allocated.copy()
    allocatable = fs.allocatable_share

    def level_key(q: int) -> tuple:
        over = bool(np.all(fs.fair_share[q] < allocated[q]))
        share = allocatable[q]
        share = np.where(share == -1, fs.total, share)
        with np.errstate(divide="ignore", invalid="ignore"):
            drf = float(np.max(np.where(share == 0, allocated[q] * 1000.0, allocated[q] / np.where(share == 0, 1,
                                                                                                   share))))
        return (not over, int(st.q_priority[q]), -drf)

    def queue_key(q: int) -> tuple:
        """Compared level by level from the top of the tree, as KAI's victim queue walks it."""
        return tuple(x for a in reversed(sess.ledger.ancestors[q]) for x in level_key(a))

    def key(g: int) -> tuple:
        m = int(st.pg_min_member[g])
        n = len(remaining[g]) + newly[g]
        elastic = 0 if n > m else (1 if n == m else 2)
        created = st.pg_creation[g]
        return (*queue_key(int(st.pg_queue[g])), elastic, int(st.pg_priority[g]),
                -(created if not math.isnan(created) else 0.0), st.pg_keys[g])

    version = 0  # bumps whenever some queue's allocation drops: keys are judged again lazily
    heap = [(key(g), version, g) for g in groups if remaining[g]]
    heapq.heapify(heap)
    out: list[tuple[int, list[int]]] = []
    while heap:
        k, ver, g = heapq.heappop(heap)
        q = int(st.pg_queue[g])
        if ver != version:
            fresh = key(g)
            if fresh != k:
                heapq.heappush(heap, (fresh, version, g))
                continue
        pods = remaining[g]
        if len(pods) + newly[g] > int(st.pg_min_member[g]):
            chunk = [pods.pop()]
        elif newly[g] == 0:
            chunk = list(pods)
            pods.clear()
        else:
            continue  # its gang now relies on pods placed this cycle: its core stays
        out.append((g, chunk))
        for a in sess.ledger.ancestors[q]:
            allocated[a] -= sess.queue_request(chunk, sess.node[np.array(chunk)]).sum(axis=0)
        version += 1
        if pods:
            heapq.heappush(heap, (key(g), version, g))
    return out


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
) -> Outcome:
    st = sess.state
    need_gpu = float(st.pod_req[tasks, R_GPU].sum())
    chunks: list[list[int]] = []
    jobs_used: set[int] = set()
    for v, c in victim_chunk_order(sess, candidates):
        if not any(feasible[int(sess.node[p])] for p in c):
            continue
        if v not in jobs_used:
            if max_victim_jobs >= 0 and len(jobs_used) >= max_victim_jobs:
                continue
            jobs_used.add(v)
        chunks.append(c)
    if not chunks:
        return Outcome(False, [], "no eligible victims")
    accumulated: list[list[int]] = []
    last_why = "not enough resources even with every eligible victim evicted"
    ledger_before = sess.ledger.copy()
    releasable = float((sess.alloc[feasible, R_GPU] - sess.held[feasible, R_GPU]).sum())
    for chunk in chunks:
        accumulated.append(chunk)
        releasable += float(sum(sess.pod_node_amount(p, int(sess.node[p]))[R_GPU] for p in chunk))
        if releasable + 1e-9 < need_gpu:
            continue  # cannot fit yet: skip the simulation
        cp = sess.checkpoint()
        for c in accumulated:
            for p in c:
                sess.evict(p, reason, g)
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
        sess.rollback(cp)
    return Outcome(False, [], last_why)


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
    back only as a whole, so no victim gang is left half-evicted."""
    kept: set[int] = set()
    for chunk in reversed(evicted):
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
            _restore(sess, p)
        if not still_ok():  # its queue room was what the beneficiary needed: evict it after all
            for p in chunk:
                sess.evict(p, reason, beneficiary)
            continue
        kept.update(chunk)
    return [p for c in evicted for p in c if p not in kept]


def _restore(sess: Session, p: int) -> None:
    """Undo the eviction of p in place (as if it had not been chosen)."""
    for i in range(len(sess.log) - 1, -1, -1):
        op = sess.log[i]
        if op.kind == "evict" and op.pod == p:
            n = op.node
            sess.held[n] += op.amount
            sess.rel[n] -= op.amount
            for d in op.devices:
                sess.dev_held[d] += op.dev_amount
                sess.dev_rel[d] -= op.dev_amount
            sess.ledger.add(int(sess.queue_of_pod[p]), op.queue_amount, non_preemptible=op.non_preemptible)
            sess.status[p] = op.prev_status
            del sess.evictions[p]
            del sess.log[i]
            sess._touch(n)
            return


def active_groups(sess: Session) -> list[int]:
    st = sess.state
    pods = np.nonzero(np.isin(sess.status, ACTIVE) & (st.pod_pg >= 0))[0]
    return sorted(set(st.pod_pg[pods].tolist()))
