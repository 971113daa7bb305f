"""What the actions of one session share: the placers, the pending reasons, the failed-search memo, and the steps
every action's loop takes (which groups take part, finishing a placed group, re-placing victims)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.fairshare.capacity import capacity_violation
from kai_opt.heuristics.gang import Attempt, GangPlacer
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import active_mask, group_shape, is_satisfied, pending_mask, readiness_problems
from kai_opt.plan import Reason
from kai_opt.state import PodStatus


class ActionContext:
    """One session's state across its actions (KAI's session as the actions see it)."""

    def __init__(self, sess: Session) -> None:
        self.sess = sess
        self.placer = Placer(sess)
        self.gang = GangPlacer(sess, self.placer)
        self.reasons: dict[int, list[Reason]] = {}
        # failed victim searches by what decides them, valid while the session is in the same state (sess.state_id)
        self._failed: dict[tuple[Any, ...], tuple[int, Reason | None]] = {}

    # -- which groups take part ----------------------------------------------------------------------------------
    def pending_groups(self, *, preemptible_only: bool = False) -> list[int]:
        sess, st = self.sess, self.sess.state
        pods = np.nonzero((sess.status == PodStatus.PENDING) & (st.pod_pg >= 0))[0]
        groups = np.unique(st.pod_pg[pods]).tolist()
        problems = readiness_problems(sess, [g for g in groups if st.pg_problem[g] is None])
        out = []
        for g in groups:
            if st.pg_problem[g] is not None:
                self.reasons[g] = [Reason(st.pg_problem[g], st.pg_problem_message[g] or st.pg_problem[g])]
                continue
            if preemptible_only and not st.pg_preemptible[g]:
                continue
            if g in problems:
                self.reasons[g] = [Reason("NotEnoughPods", problems[g])]
                continue
            out.append(g)
        return out

    def satisfied_now(self, g: int) -> bool:
        return is_satisfied(self.sess, g, group_shape(self.sess, g)) and not pending_mask(
            self.sess, self.sess.state.group_pods(g)).any()

    # -- a group's outcome ---------------------------------------------------------------------------------------
    def finish(self, g: int, attempt: Attempt | None, jq: JobQueue) -> None:
        """g was placed: pipeline all its placements when any waits for releasing resources, forget its pending
        reasons, and queue it again while pods of it are still pending."""
        if attempt is not None and attempt.any_pipelined:
            self.sess.convert_to_pipelined(self.placed_pods(g))
        self.reasons.pop(g, None)
        if pending_mask(self.sess, self.sess.state.group_pods(g)).any():
            jq.push(g)

    def placed_pods(self, g: int) -> list[int]:
        return [int(p) for p in self.sess.state.group_pods(g) if int(p) in self.sess.placements]

    def note(self, g: int, reasons: list[Reason]) -> None:
        if reasons:
            self.reasons[g] = reasons

    def add_reason(self, g: int, r: Reason) -> None:
        existing = self.reasons.setdefault(g, [])
        if all(x.code != r.code for x in existing):
            existing.append(r)

    # -- failed victim searches, remembered ----------------------------------------------------------------------
    def search_key(self, kind: str, g: int, tasks: list[int]) -> tuple[Any, ...] | None:
        """What decides a victim search for g's tasks, when two groups with the same key must get the same
        outcome from an unchanged session: the action, the tasks' shapes, the group's topology, queue,
        priority and preemptibility. None when g's own running pods could be victims, or its pods have
        sub-groups or pod (anti-)affinity (then the search depends on more than this)."""
        st = self.sess.state
        pods = st.group_pods(g)
        if active_mask(self.sess, pods).any() or (st.pod_sg[pods] >= 0).any():
            return None
        shape = []
        for p in tasks:
            pod = st.pods[p]
            if pod.pod_affinity or pod.pod_anti_affinity:
                return None
            shape.append((int(st.pod_sig[p]), st.pod_req[p].tobytes(), int(st.pod_gpu_whole[p]),
                          int(st.pod_gpu_frac[p]), int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p])))
        return (kind, tuple(shape), int(st.pg_topology[g]), int(st.pg_required_level[g]),
                int(st.pg_preferred_level[g]), int(st.pg_queue[g]), int(st.pg_priority[g]),
                bool(st.pg_preemptible[g]), int(st.pg_min_member[g]))

    def failed_before(self, g: int, key: tuple[Any, ...] | None) -> bool:
        """True (and g gets the remembered reason) when an alike search failed on this same session state."""
        hit = self._failed.get(key) if key is not None else None
        if hit is None or hit[0] != self.sess.state_id:
            return False
        if hit[1] is not None:
            self.add_reason(g, hit[1])
        return True

    def remember_failure(self, key: tuple[Any, ...] | None, reason: Reason | None) -> None:
        if key is not None:
            self._failed[key] = (self.sess.state_id, reason)

    # -- victims that move instead of going ----------------------------------------------------------------------
    def move_victims(self, sess: Session, chunks: list[list[int]]) -> list[int]:
        """Re-place evicted pods (pipelined) where they fit: another node, or other devices of their node. Per
        victim group, in task order, as KAI re-allocates a victim job: the pods it needs to stay at its minimum
        first, all or nothing, then its elastic pods one by one. A placement of this cycle taken back is not
        re-placed (nothing of it runs: it stays pending). Returns the pods moved."""
        st = sess.state
        by_group: dict[int, list[int]] = {}
        for chunk in chunks:
            for p in chunk:
                if p not in sess.placements:
                    by_group.setdefault(int(st.pod_pg[p]), []).append(p)
        moved: list[int] = []
        for g, pods in by_group.items():
            order = {int(p): i for i, p in enumerate(st.group_pods(g).tolist())}
            pods.sort(key=order.__getitem__)
            need = max(0, int(st.pg_min_member[g]) - int(active_mask(sess, st.group_pods(g)).sum()))
            units = [pods[:need]] if need else []
            units += [[p] for p in pods[need:]]
            for unit in units:
                if not unit:
                    continue
                req = sess.queue_request(unit).sum(axis=0)
                if capacity_violation(sess.fs, sess.ledger, int(st.pg_queue[g]), req,
                                      preemptible=bool(st.pg_preemptible[g])) is not None:
                    break  # re-placing it would put its queue over a limit: it is only evicted
                if not self.gang.move_unit(unit):
                    break
                moved.extend(unit)
        return moved
