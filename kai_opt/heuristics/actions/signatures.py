"""KAI's scheduling signatures (`useSchedulingSignatures`, on by default in KAI's scheduler binary): within one run
of a victim action, a pending job whose scheduling constraints match a job that already failed (the same queue
for reclaim and preempt, the whole cluster for consolidation) is tried only when it is easier to place than the
smallest such failure. Easier and smaller are KAI's job comparisons (actions/common/minimal_job_comparison.go),
restated here over the state's request rows.

The constraints signature is the multiset of the job's not-running pods' placement signatures (node selector,
node affinity, tolerations, DRA node pins: `pod_sig`) and priorities, with the job's topology constraint. Jobs
whose pods have pod (anti-)affinity, resource claims or sub-groups get no signature and are always tried (their
constraints are more than this key says)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kai_opt.heuristics.session import IS_ACTIVE, Session
from kai_opt.plan import Reason
from kai_opt.state import PodStatus

Signature = tuple[Any, ...]


def signature(sess: Session, g: int, scope: int) -> Signature | None:
    """g's constraints signature within `scope` (a queue, or -1 for the whole cluster); None: none (always tried)."""
    st = sess.state
    pods = st.group_pods(g)
    if (st.pod_sg[pods] >= 0).any():
        return None
    waiting = pods[~IS_ACTIVE[sess.status[pods]]]
    sigs = []
    for p in waiting.tolist():
        pod = st.pods[p]
        if pod.pod_affinity or pod.pod_anti_affinity or pod.resource_claims:
            return None
        sigs.append((int(st.pod_sig[p]), int(st.pod_priority[p])))
    return (scope, tuple(sorted(sigs)), int(st.pg_topology[g]), int(st.pg_required_level[g]),
            int(st.pg_preferred_level[g]))


def pending_requests(sess: Session, g: int) -> np.ndarray:
    """The requests of g's pending pods (rows: the state's resources, then GPU memory), ascending (lexicographic,
    a total order that extends "every resource <=", which KAI sorts by)."""
    st = sess.state
    pods = st.group_pods(g)
    pods = pods[sess.status[pods] == PodStatus.PENDING]
    rows = np.concatenate([st.pod_req[pods], st.pod_gpu_mem[pods][:, None]], axis=1)
    if len(rows) > 1:
        rows = rows[np.lexsort(rows.T[::-1])]
    return rows


def easier(job: np.ndarray, rep: np.ndarray) -> bool:
    """KAI's "easier to schedule" of a job (its sorted pending requests) against a failed one: fewer pending pods,
    or, walking both sorted lists, a request no larger than the failed job's in every resource and smaller in one
    before the job's list runs past the other's (a request that is larger or not comparable is stepped over)."""
    if not len(job) or not len(rep):
        return False
    if len(rep) > len(job):
        return True
    for i in range(len(job)):
        if i >= len(rep):
            return False
        a, b = job[i], rep[i]
        if (a <= b).all() and not (b <= a).all():
            return True
    return False


def smaller(job: np.ndarray, rep: np.ndarray) -> bool:
    """KAI's "smaller footprint": no more pending pods, and each sorted request no larger in every resource."""
    if not len(job) or not len(rep) or len(job) > len(rep):
        return False
    return bool((job <= rep[: len(job)]).all())


@dataclass
class FailedJobs:
    """The smallest failed job per constraints signature in one action's run, with why it failed."""

    reps: dict[Signature, tuple[int, np.ndarray, Reason | None]] = field(default_factory=dict)

    def skips(self, sess: Session, g: int, sig: Signature | None) -> tuple[int, Reason | None] | None:
        """(the failed job, its reason) when g is not easier to place than it, else None (g is tried)."""
        hit = self.reps.get(sig) if sig is not None else None
        if hit is None or easier(pending_requests(sess, g), hit[1]):
            return None
        return hit[0], hit[2]

    def failed(self, sess: Session, g: int, sig: Signature | None, reason: Reason | None) -> None:
        if sig is None:
            return
        mine = pending_requests(sess, g)
        hit = self.reps.get(sig)
        if hit is None or smaller(mine, hit[1]):
            self.reps[sig] = (g, mine, reason)
