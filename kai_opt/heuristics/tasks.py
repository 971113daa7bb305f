"""Gangs, sub-groups and elastic jobs: which pending pods of a group to place now, and when a group counts as
satisfied.

A group is satisfied when at least minMember of its pods are active (bound, placed or pipelined) and every leaf
sub-group holding pods has at least its own minMember active (a parent sub-group is satisfied when its children
are). Below that, the pods needed to reach every minimum are placed together, all or nothing; above it (elastic),
one more pod per turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_opt.heuristics.session import IS_ACTIVE, Session
from kai_opt.state import PodStatus
from kai_opt.state.segments import concat_ranges


@dataclass
class GroupShape:
    pods: np.ndarray  # all pods of the group, task order
    leaves: list[tuple[int, np.ndarray]]  # (sub-group index, its pods in task order) for every leaf sub-group


def group_shape(sess: Session, g: int) -> GroupShape:
    """g's pods and leaf sub-groups: read from the snapshot alone, so made once per session (shared: not to be
    changed)."""
    shapes: dict[int, GroupShape] = sess.static("group_shapes", dict)
    hit = shapes.get(g)
    if hit is None:
        hit = shapes[g] = _group_shape(sess, g)
    return hit


def _group_shape(sess: Session, g: int) -> GroupShape:
    st = sess.state
    pods = st.group_pods(g)
    subs = st.pod_sg[pods]
    mine = np.nonzero(st.sg_pg == g)[0]
    has_child = set(int(x) for x in st.sg_parent[mine] if x >= 0)
    # every leaf sub-group counts, also one whose pods are all gone (it can then never be satisfied)
    leaves = [(int(s), pods[subs == s]) for s in mine.tolist() if int(s) not in has_child]
    return GroupShape(pods, leaves)


def active_mask(sess: Session, pods: np.ndarray) -> np.ndarray:
    return IS_ACTIVE[sess.status[pods]]


def pending_mask(sess: Session, pods: np.ndarray) -> np.ndarray:
    return sess.status[pods] == PodStatus.PENDING


def is_satisfied(sess: Session, g: int, shape: GroupShape | None = None) -> bool:
    shape = shape or group_shape(sess, g)
    st = sess.state
    if int(active_mask(sess, shape.pods).sum()) < int(st.pg_min_member[g]):
        return False
    return all(int(active_mask(sess, pods).sum()) >= int(st.sg_min_member[s]) for s, pods in shape.leaves)


def readiness_problems(sess: Session, groups: list[int]) -> dict[int, str]:
    """Why each of `groups` can never be satisfied with the pods it has (KAI skips such jobs), for those that
    cannot: fewer schedulable (active or pending) pods than its minMember, else the first leaf sub-group (every
    leaf counts, also one whose pods are all gone) with fewer than its own. One pass over all pods."""
    st = sess.state
    if not groups:
        return {}
    usable = IS_ACTIVE[sess.status] | (sess.status == PodStatus.PENDING)
    grouped = st.pod_pg >= 0
    have = np.bincount(st.pod_pg[usable & grouped], minlength=st.n_groups)
    asked = np.asarray(groups, dtype=np.int64)
    out = {int(g): f"podgroup has {int(have[g])} schedulable pods but minMember is {int(st.pg_min_member[g])}"
           for g in asked[have[asked] < st.pg_min_member[asked]].tolist()}
    n_sg = len(st.sg_pg)
    if n_sg:
        is_parent = np.zeros(n_sg, dtype=bool)
        is_parent[st.sg_parent[st.sg_parent >= 0]] = True
        in_sg = st.pod_sg >= 0
        sg_have = np.bincount(st.pod_sg[usable & in_sg], minlength=n_sg)
        wanted = np.zeros(st.n_groups, dtype=bool)
        wanted[asked] = True
        short = ~is_parent & (sg_have < st.sg_min_member) & wanted[np.maximum(st.sg_pg, 0)] & (st.sg_pg >= 0)
        for s in np.nonzero(short)[0].tolist():  # ascending: a group's first short leaf
            g = int(st.sg_pg[s])
            if g not in out:
                out[g] = (f"subgroup {st.sg_names[s]} has {int(sg_have[s])} schedulable pods but its minMember is "
                          f"{int(st.sg_min_member[s])}")
    return out


def tasks_to_allocate(sess: Session, g: int, shape: GroupShape | None = None, *,
                      also: set[int] | None = None) -> list[int]:
    """Pending pods to place in one go: enough to satisfy every minimum, or one more for an elastic group; none
    when the pending pods cannot reach the minimums (e.g. its running pods were evicted this cycle). `also`: pods
    to count as pending too (a victim job's pods evicted in a consolidation scenario, which KAI's simulation
    allocates again like pending ones)."""
    shape = shape or group_shape(sess, g)
    st = sess.state

    def allocatable(pods: np.ndarray) -> np.ndarray:
        mask = pending_mask(sess, pods)
        if also:
            mask |= np.fromiter((int(p) in also for p in pods.tolist()), dtype=bool, count=len(pods))
        return mask

    pending_all = shape.pods[allocatable(shape.pods)]
    if len(pending_all) == 0:
        return []
    chosen: list[int] = []
    taken: set[int] = set()
    for s, pods in shape.leaves:
        deficit = int(st.sg_min_member[s]) - int(active_mask(sess, pods).sum())
        if deficit > 0:
            ready = pods[allocatable(pods)]
            if len(ready) < deficit:
                return []
            for p in ready[:deficit].tolist():
                chosen.append(p)
                taken.add(p)
    deficit = int(st.pg_min_member[g]) - int(active_mask(sess, shape.pods).sum()) - len(chosen)
    if deficit > 0:
        for p in pending_all.tolist():
            if deficit <= 0:
                break
            if p not in taken:
                chosen.append(p)
                taken.add(p)
                deficit -= 1
        if deficit > 0:
            return []
    if not chosen:
        chosen = [int(pending_all[0])]
    if not shape.leaves:  # (most groups) taken from pending_all alone: already in task order
        return chosen
    order = {int(p): i for i, p in enumerate(shape.pods.tolist())}
    return sorted(chosen, key=order.__getitem__)


def elastic_state(sess: Session, g: int) -> int:
    """0: below minMember, 1: exactly at it, 2: above (KAI's elastic job order)."""
    active = int(active_mask(sess, sess.state.group_pods(g)).sum())
    return _elastic(active, int(sess.state.pg_min_member[g]))


def active_counts(sess: Session, groups: np.ndarray) -> np.ndarray:
    """int64[len(groups)]: pods of each group bound, pipelined or placed in this cycle, from one pass over their
    pods' statuses."""
    st = sess.state
    starts = st.pg_pod_start[groups]
    counts = st.pg_pod_start[groups + 1] - starts
    index, _ = concat_ranges(starts, counts)
    owner = np.repeat(np.arange(len(groups)), counts)
    active = np.bincount(owner, weights=IS_ACTIVE[sess.status[st.pg_pods[index]]], minlength=len(groups))
    return active.astype(np.int64)


def elastic_states(sess: Session, groups: np.ndarray) -> list[int]:
    """elastic_state of each of `groups` (active_counts)."""
    return [_elastic(a, m) for a, m in zip(active_counts(sess, groups).tolist(),
                                           sess.state.pg_min_member[groups].tolist(), strict=True)]


def _elastic(active: int, min_member: int) -> int:
    return 0 if active < min_member else (1 if active == min_member else 2)
