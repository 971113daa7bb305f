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


def _queue_keys(sess: Session) -> dict[int, tuple]:
    """Victim order of queues: furthest over their share first (DRF), lower queue priority first."""
    st = sess.state
    drf = sess.fs.dominant_share(sess.ledger.allocated)
    keys = {}
    for q in range(st.n_queues):
        over = bool(np.all(sess.fs.fair_share[q] < sess.ledger.allocated[q]))
        keys[q] = (not over, int(st.q_priority[q]), -float(drf[q]))
    return keys


def victim_chunk_order(sess: Session, groups: list[int]) -> list[tuple[int, list[int]]]:
    """(group, pods) chunks in eviction order, as KAI's victim queue yields them: jobs of the queues furthest over
    their share first; inside a queue, jobs above their minimum first (they give up one pod, the last in task
    order, and go back in line), then lower priority, then newer. A job at its minimum gives up all its pods."""
    import heapq

    st = sess.state
    qkeys = _queue_keys(sess)
    remaining = {g: st.group_pods(g)[sess.status[st.group_pods(g)] == PodStatus.BOUND].tolist() for g in groups}
    # pods this cycle already placed (or pipelined) for a group count towards its gang but cannot be victims
    newly = {g: int(active_mask(sess, st.group_pods(g)).sum()) - len(remaining[g]) for g in groups}

    def key(g: int) -> tuple:
        m = int(st.pg_min_member[g])
        n = len(remaining[g]) + newly[g]
        elastic = 0 if n > m else (1 if n == m else 2)
        created = st.pg_creation[g]
        return (*qkeys[int(st.pg_queue[g])], elastic, int(st.pg_priority[g]),
                -(created if not math.isnan(created) else 0.0), st.pg_keys[g])

    heap = [(key(g), g) for g in groups if remaining[g]]
    heapq.heapify(heap)
    out: list[tuple[int, list[int]]] = []
    while heap:
        _, g = heapq.heappop(heap)
        pods = remaining[g]
        if len(pods) + newly[g] > int(st.pg_min_member[g]):
            out.append((g, [pods.pop()]))
            if pods:
                heapq.heappush(heap, (key(g), g))
        elif newly[g] == 0:
            out.append((g, list(pods)))
            pods.clear()
        # else: its gang now relies on pods placed this cycle: its core stays
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
    replace_victims: Callable[[Session, list[int]], list[int]] | None = None,
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
    accumulated: list[int] = []
    last_why = "not enough resources even with every eligible victim evicted"
    ledger_before = sess.ledger.copy()
    releasable = float((sess.alloc[feasible, R_GPU] - sess.held[feasible, R_GPU]).sum())
    for chunk in chunks:
        accumulated.extend(chunk)
        releasable += float(sum(sess.pod_node_amount(p, int(sess.node[p]))[R_GPU] for p in chunk))
        if releasable + 1e-9 < need_gpu:
            continue  # cannot fit yet: skip the simulation
        cp = sess.checkpoint()
        for p in accumulated:
            sess.evict(p, reason, g)
        attempt = gang.place(g, tasks, allow_pipeline=True)
        if not attempt.ok:
            sess.rollback(cp)
            continue
        victims = _keep_unneeded(sess, accumulated)
        if replace_victims is not None:  # consolidating: victims that fit elsewhere move instead of just going
            moved = set(replace_victims(sess, victims))
            victims = [p for p in victims if p not in moved]
        why = _queue_capacity(sess, g, tasks)
        if why is None and validator is not None:
            why = validator(sess, ledger_before, victims)
        if why is None:
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


def _keep_unneeded(sess: Session, evicted: list[int]) -> list[int]:
    """Un-evict victims whose resources the placements did not use (latest added first)."""
    keep_running: list[int] = []
    for p in reversed(evicted):
        n = int(sess.node[p])
        amount = sess.pod_node_amount(p, n)
        if np.any(sess.held[n] + amount > sess.alloc[n]):
            continue
        devs = sess.pod_devices(p)
        per = sess.gpu_per_device(p, n) if devs else 0
        if any(sess.dev_held[d] + per > DEV for d in devs):
            continue
        _restore(sess, p)
        keep_running.append(p)
    return [p for p in evicted if p not in set(keep_running)]


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
