"""What each queue holds and asks for (KAI units, subtree sums): allocated, non-preemptible part, requested."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from kai_opt.state import ClusterState, PodStatus
from kai_opt.state.segments import add_rows


@dataclass
class QueueUsage:
    allocated: np.ndarray  # float64[Q, 3]: bound pods in the queue's subtree (releasing pods count in neither
    # allocated nor requested, as in KAI-Scheduler: their resources are on their way back)
    allocated_np: np.ndarray  # float64[Q, 3]: of which non-preemptible
    pending: np.ndarray  # float64[Q, 3]: pods waiting to be placed (not gated, group schedulable)
    requested: np.ndarray  # float64[Q, 3]: allocated + pending


def subtree_sum(state: ClusterState, leaf_values: np.ndarray) -> np.ndarray:
    """Add each queue's values into all its ancestors (values given per queue, own contribution only)."""
    out = leaf_values.copy()
    depth = np.array([len(a) for a in state.q_ancestors], dtype=np.int64)
    for q in np.argsort(-depth, kind="stable").tolist():
        p = int(state.q_parent[q])
        if p >= 0:
            out[p] += out[q]
    return out


def pod_queue(state: ClusterState) -> np.ndarray:
    """int32[P]: leaf queue of each of our pods (-1: not ours or no known queue)."""
    out = np.full(state.n_pods, -1, dtype=np.int32)
    has = state.pod_pg >= 0
    out[has] = state.pg_queue[state.pod_pg[has]]
    return out


def queue_usage(state: ClusterState) -> QueueUsage:
    Q = state.n_queues
    pq = pod_queue(state)
    holding = state.pod_status == PodStatus.BOUND
    schedulable_group = np.fromiter(map(operator.is_, state.pg_problem, repeat(None)), dtype=bool,
                                    count=len(state.pg_problem))
    pg = state.pod_pg
    waiting = (state.pod_status == PodStatus.PENDING) & (pg >= 0)
    waiting[waiting] = schedulable_group[pg[waiting]]
    # each queue's own allocated, non-preemptible and pending sums side by side, summed up the tree at once
    own = np.zeros((Q, 9))
    idx = np.nonzero(holding & (pq >= 0))[0]
    if len(idx):
        req = state.pod_queue_request(idx, state.pod_node[idx])
        add_rows(own[:, 0:3], pq[idx], req)
        nonpre = ~state.pg_preemptible[pg[idx]]
        if nonpre.any():
            add_rows(own[:, 3:6], pq[idx[nonpre]], req[nonpre])
    idx = np.nonzero(waiting & (pq >= 0))[0]
    if len(idx):
        add_rows(own[:, 6:9], pq[idx], state.pod_queue_request(idx, state.pod_node[idx]))
    tree = subtree_sum(state, own)
    alloc, pend = tree[:, 0:3].copy(), tree[:, 6:9].copy()
    return QueueUsage(allocated=alloc, allocated_np=tree[:, 3:6].copy(), pending=pend, requested=alloc + pend)
