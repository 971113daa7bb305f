"""Whether a greedy plan is one no plan of the cycle can beat on the primary objective, so the model is not run.

The CP-SAT model keeps every group the greedy plan places and may evict only pods the greedy plan evicts. A greedy
plan that evicts nothing therefore leaves the model no eviction at all: every queue's allocation in any plan the
model can return is at least its allocation at the cycle start. A pending group whose smallest placement the queue
capacity rules refuse already at the cycle start (a limit of its queue or an ancestor, or the non-preemptible quota)
is then refused in every such plan, as is a group that can never reach its minimum. Such groups do not make a plan
beatable: the model would prove, every cycle, that it cannot place them.
"""

from __future__ import annotations

import numpy as np

from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.fairshare.capacity import capacity_violation
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import tasks_to_allocate
from kai_opt.plan import Plan
from kai_opt.state import ClusterState, PodStatus


def hopeless_groups(state: ClusterState, fs: FairShare, config: Config, groups: list[int]) -> set[int]:
    """Of `groups` (pending, none of their pods placed by the plan, and a plan without evictions), those no such
    plan places: a readiness problem, no pods that can reach the minimums, or a capacity refusal of their first
    placement at the cycle start. Groups with a gpu-memory pod are never judged (their queue amount depends on the
    node they land on)."""
    if not groups:
        return set()
    sess = Session(state, fs, config)  # the cycle start
    out: set[int] = set()
    for g in groups:
        if state.pg_problem[g] is not None:
            out.add(g)
            continue
        tasks = tasks_to_allocate(sess, g)
        if not tasks:
            out.add(g)
            continue
        pods = np.asarray(tasks, dtype=np.int64)
        if state.pod_gpu_mem[pods].any():
            continue
        request = sess.queue_request(tasks).sum(axis=0)
        if capacity_violation(fs, sess.ledger, int(state.pg_queue[g]), request,
                              preemptible=bool(state.pg_preemptible[g])) is not None:
            out.add(g)
    return out


def unbeatable_note(state: ClusterState, fs: FairShare, config: Config, plan: Plan) -> str:
    """Why no plan of the cycle can beat `plan` on the primary objective ('' when one might): it evicts nothing
    (tier 2 at its minimum) and places every pending pod of ours that a plan could place (tier 1 at its maximum):
    the pods it leaves belong to hopeless groups only. The model could only tie, and a tie keeps the greedy plan (or
    the less fragmented FGD-scored one: solve.kept_unbeatable), so it is not worth running."""
    if plan.evictions:
        return ""
    can = placeable(state)
    placed = np.zeros(state.n_pods, dtype=bool)
    placed[[pl.pod for pl in plan.placements if not pl.moved]] = True
    left = can & ~placed
    total = int(can.sum())
    if not left.any():
        return (f"greedy plan kept: it places all {total} pending pods without evictions, so no plan scores higher "
                "on placed work or evictions (the model was not run)")
    if _leaves_work(state, fs, config, can, left):
        return ""
    left_groups = np.unique(state.pod_pg[left])
    return (f"greedy plan kept: it places {total - int(left.sum())} of {total} pending pods without evictions, and "
            f"no plan without evictions places the other {int(left.sum())} (their {len(left_groups)} groups are "
            "refused by queue capacity at the cycle start, or cannot reach their minimum), so no plan the model may "
            "return (it evicts only what the greedy plan evicts) scores higher on placed work or evictions (the "
            "model was not run)")


def may_be_beaten(state: ClusterState, fs: FairShare, config: Config, sess: Session) -> bool:
    """After the allocate action: whether the cycle's plan may turn out beatable (the model then runs). False
    when allocate left only hopeless groups of ours pending: the plan is then unbeatable unless a later action
    evicts (and only an eviction makes it beatable)."""
    can = placeable(state)
    return _leaves_work(state, fs, config, can, can & (sess.status == PodStatus.PENDING))


def placeable(state: ClusterState) -> np.ndarray:
    """bool[P]: the pending pods of ours in a group (what a plan may place)."""
    return (state.pod_status == PodStatus.PENDING) & state.pod_ours & (state.pod_pg >= 0)


def _leaves_work(state: ClusterState, fs: FairShare, config: Config, placeable: np.ndarray,
                 left: np.ndarray) -> bool:
    """Whether a plan without evictions that placed `placeable` but `left` (bool[P] each) might be beaten by
    another such plan: it left a pod of a group it grew, or of a group that is not hopeless."""
    if not left.any():
        return False
    left_groups = np.unique(state.pod_pg[left])
    touched = np.zeros(state.n_groups, dtype=bool)
    touched[state.pod_pg[placeable & ~left]] = True
    if touched[left_groups].any():  # a group the plan grew: the model might grow it differently
        return True
    return len(hopeless_groups(state, fs, config, left_groups.tolist())) < len(left_groups)
