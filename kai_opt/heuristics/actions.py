"""The five actions of a cycle, in KAI's order: allocate, consolidate, reclaim, preempt, stale-gang eviction."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kai_opt.fairshare.capacity import capacity_violation, non_preemptible_over_quota
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.reclaim import (
    can_reclaim,
    reclaim_headroom,
    reclaimable,
    reclaimer_side,
    reclaimer_side_after,
)
from kai_opt.fairshare.reclaim import victim_chunks as chunk_resources
from kai_opt.heuristics.gang import Attempt, GangPlacer
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import IS_ACTIVE, Session
from kai_opt.heuristics.tasks import (
    active_mask,
    group_shape,
    is_satisfied,
    pending_mask,
    readiness_problems,
    tasks_to_allocate,
)
from kai_opt.heuristics.victims import (
    active_group_mask,
    active_groups,
    protected_mask,
    solve_with_victims,
)
from kai_opt.plan import Reason
from kai_opt.state import R_GPU, PodStatus


class Actions:
    def __init__(self, sess: Session) -> None:
        self.sess = sess
        self.placer = Placer(sess)
        self.gang = GangPlacer(sess, self.placer)
        self.reasons: dict[int, list[Reason]] = {}
        # failed victim searches by what decides them, valid while the session is in the same state (sess.state_id)
        self._failed: dict[tuple, tuple[int, Reason | None]] = {}
        self._tops: int | None = None

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

    def _note(self, g: int, reasons: list[Reason]) -> None:
        if reasons:
            self.reasons[g] = reasons

    # -- allocate -----------------------------------------------------------------------------------------------
    def allocate(self) -> None:
        sess = self.sess
        jq = JobQueue(sess, self.pending_groups())
        while True:
            g = jq.pop()
            if g is None:
                break
            tasks = tasks_to_allocate(sess, g)
            if not tasks:
                continue
            attempt = self.gang.place(g, tasks, allow_pipeline=True)
            if not attempt.ok:
                self._note(g, attempt.reasons)
                continue
            if attempt.any_pipelined:
                sess.convert_to_pipelined(self._placed_pods(g))
            self.reasons.pop(g, None)
            if pending_mask(sess, sess.state.group_pods(g)).any():
                jq.push(g)

    def _placed_pods(self, g: int) -> list[int]:
        return [int(p) for p in self.sess.state.group_pods(g) if int(p) in self.sess.placements]

    # -- consolidate ------------------------------------------------------------------------------------------
    def consolidate(self) -> None:
        sess, st = self.sess, self.sess.state
        limit = sess.cfg.max_consolidation_preemptees
        if limit == 0:
            return
        jq = JobQueue(sess, self.pending_groups(preemptible_only=True))
        while True:
            g = jq.pop()
            if g is None:
                break
            tasks = tasks_to_allocate(sess, g)
            if not tasks or self._satisfied_now(g):
                continue
            idle_gpus = float((sess.alloc[st.node_ok, R_GPU] - sess.held[st.node_ok, R_GPU]
                               - sess.rel[st.node_ok, R_GPU]).sum())
            if idle_gpus + 1e-9 < float(st.pod_req[tasks, R_GPU].sum()):
                continue  # consolidation only defragments: the cluster must have the GPUs idle
            q = int(st.pg_queue[g])
            if not can_reclaim(sess.fs, sess.ledger, q, sess.queue_request(tasks).sum(axis=0), preemptible=True):
                # moving running pods for work above its queue's fair share would only be undone by the next
                # reclaim: churn, not defragmentation
                continue
            key = self._search_key("consolidate", g, tasks)
            if self._failed_before(g, key):
                continue
            cand = active_group_mask(sess) & st.pg_preemptible.astype(bool)
            cand[g] = False
            candidates = np.flatnonzero(cand)
            feasible = self.placer.static_mask(int(st.pod_sig[tasks[0]]))
            out = solve_with_victims(sess, self.gang, g, tasks, candidates, "consolidate", self._all_moved,
                                     feasible=feasible, max_victim_jobs=limit, replace_victims=self._move_victims)
            if out.ok:
                self.reasons.pop(g, None)
                if pending_mask(sess, st.group_pods(g)).any():
                    jq.push(g)
            else:
                self._remember_failure(key, None)

    def _move_victims(self, sess: Session, chunks: list[list[int]]) -> list[int]:
        """Re-place evicted pods (pipelined) where they fit: another node, or other devices of their node. Per
        victim group, in task order, as KAI re-allocates a victim job: the pods it needs to stay at its minimum
        first, all or nothing, then its elastic pods one by one. Returns the pods moved."""
        st = sess.state
        by_group: dict[int, list[int]] = {}
        for chunk in chunks:
            for p in chunk:
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

    @staticmethod
    def _all_moved(_sess: Session, _ledger: QueueLedger, not_moved: list[int]) -> str | None:
        """Consolidation: every evicted pod must be re-placed in the same plan."""
        return "a consolidated pod could not be re-placed" if not_moved else None

    # -- reclaim ----------------------------------------------------------------------------------------------
    def reclaim(self) -> None:
        sess, st = self.sess, self.sess.state
        jq = JobQueue(sess, self.pending_groups())
        while True:
            g = jq.pop()
            if g is None:
                break
            tasks = tasks_to_allocate(sess, g)
            if not tasks or self._satisfied_now(g):
                continue
            q = int(st.pg_queue[g])
            req = sess.queue_request(tasks).sum(axis=0)
            preemptible = bool(st.pg_preemptible[g])
            if not can_reclaim(sess.fs, sess.ledger, q, req, preemptible=preemptible):
                self._add_reason(g, Reason("ReclaimNotAllowed", f"queue {st.q_names[q]!r} would exceed its fair "
                                           "share (or, for non-preemptible work, its quota) by reclaiming",
                                           reclaim_headroom(sess.fs, sess.ledger, q, req, preemptible=preemptible,
                                                            names=st.q_names)))
                continue
            key = self._search_key("reclaim", g, tasks)
            if self._failed_before(g, key):
                continue
            other = active_group_mask(sess) & (st.pg_queue != q)
            preemptible_v = st.pg_preemptible.astype(bool)
            protected = protected_mask(sess, "reclaim")
            # every queue's candidates (one victim order shared by all reclaim searches from this state), less q's
            every_queue = sess.memo("reclaim_candidates", lambda: np.flatnonzero(
                active_group_mask(sess) & st.pg_preemptible.astype(bool) & ~protected_mask(sess, "reclaim")))
            candidates = every_queue[st.pg_queue[every_queue] != q]
            feasible = self.placer.static_mask(int(st.pod_sig[tasks[0]]))

            def validate(s: Session, ledger: QueueLedger, victims: list[int], g: int = g, q: int = q,
                         req: np.ndarray = req, preemptible: bool = preemptible) -> str | None:
                return reclaimable(s.fs, ledger, q, req, self._victim_chunks(victims), preemptible=preemptible,
                                   saturation_multiplier=s.cfg.reclaim_saturation_multiplier,
                                   n_top_queues=self._n_top_queues())

            def reclaimer_ok(s: Session, ledger: QueueLedger, victims: list[int], q: int = q,
                             req: np.ndarray = req, preemptible: bool = preemptible) -> str | None:
                return reclaimer_side_after(s.fs, ledger, q, req, self._victim_chunks(victims),
                                            preemptible=preemptible,
                                            saturation_multiplier=s.cfg.reclaim_saturation_multiplier,
                                            n_top_queues=self._n_top_queues())

            out = solve_with_victims(sess, self.gang, g, tasks, candidates, "reclaim", validate, feasible=feasible,
                                     within=every_queue, replace_victims=self._move_victims,
                                     worth_trying=self._reclaimer_side_tracker(q, req, preemptible),
                                     precheck=reclaimer_ok)
            if out.ok:
                self._finish(g, out.attempt, jq)
                continue
            reason = None
            if len(candidates):
                reason = Reason("ReclaimNotPossible", f"reclaim found no allowed victims: {out.why}", {
                    "why": out.why, "candidates": len(candidates),
                    "protected": {"non_preemptible": int((other & ~preemptible_v).sum()),
                                  "min_runtime": int((other & preemptible_v & protected).sum())}})
                self._add_reason(g, reason)
            self._remember_failure(key, reason)

    def _reclaimer_side_tracker(self, q: int, req: np.ndarray, preemptible: bool) -> Callable[[list[int]], bool]:
        """For solve_with_victims: whether, with every victim taken so far gone, the reclaimer's side of the
        reclaim rules holds (if not, no subset of these victims can pass validation)."""
        sess, st = self.sess, self.sess.state
        ledger = sess.ledger.copy()
        remaining: dict[int, np.ndarray] = {}
        mine = set(ledger.ancestors[q])
        mult = sess.cfg.reclaim_saturation_multiplier
        tops = self._n_top_queues()

        def track(chunk: list[int]) -> bool:
            drop = sess.queue_request(chunk, sess.node[np.array(chunk)]).sum(axis=0)
            for a in ledger.ancestors[int(st.pg_queue[int(st.pod_pg[chunk[0]])])]:
                if a in mine:
                    remaining[a] = remaining.get(a, ledger.allocated[a]) - drop
            return reclaimer_side(sess.fs, ledger, q, req, remaining, preemptible=preemptible,
                                  saturation_multiplier=mult, n_top_queues=tops) is None

        return track

    def _n_top_queues(self) -> int:
        """Top-level queues (what reclaimer_side counts when not told; counted once)."""
        if self._tops is None:
            self._tops = sum(1 for a in self.sess.ledger.ancestors if len(a) == 1)
        return self._tops

    def _victim_chunks(self, victims: list[int]) -> list[tuple[int, np.ndarray]]:
        """Victim pods grouped per job into KAI's chunks (elastic pods one by one, the core together)."""
        sess, st = self.sess, self.sess.state
        by_group: dict[int, list[int]] = {}
        for p in victims:
            by_group.setdefault(int(st.pod_pg[p]), []).append(p)
        out: list[tuple[int, np.ndarray]] = []
        for g, pods in by_group.items():
            q = int(st.pg_queue[g])
            all_active = st.group_pods(g)
            still = int(IS_ACTIVE[sess.status[all_active]].sum())
            core = max(0, int(st.pg_min_member[g]) - still)  # pods of the core among the evicted ones
            order = sorted(pods, key=lambda p: list(all_active).index(p))
            reqs = sess.queue_request(order, sess.node[np.array(order)])
            for chunk in chunk_resources(reqs, min(core, len(order))):
                out.append((q, chunk))
        return out

    # -- preempt ------------------------------------------------------------------------------------------------
    def preempt(self) -> None:
        sess, st = self.sess, self.sess.state
        jq = JobQueue(sess, self.pending_groups())
        while True:
            g = jq.pop()
            if g is None:
                break
            tasks = tasks_to_allocate(sess, g)
            if not tasks or self._satisfied_now(g):
                continue
            q = int(st.pg_queue[g])
            req = sess.queue_request(tasks).sum(axis=0)
            if not st.pg_preemptible[g] and non_preemptible_over_quota(sess.fs, sess.ledger, q, req) is not None:
                continue
            prio = int(st.pg_priority[g])
            key = self._search_key("preempt", g, tasks)
            if self._failed_before(g, key):
                continue
            cand = (active_group_mask(sess) & (st.pg_queue == q) & st.pg_preemptible.astype(bool)
                    & (st.pg_priority < prio))
            cand[g] = False
            if cand.any():
                cand &= ~protected_mask(sess, "preempt")
            candidates = np.flatnonzero(cand)
            if not len(candidates):
                continue
            feasible = self.placer.static_mask(int(st.pod_sig[tasks[0]]))
            out = solve_with_victims(sess, self.gang, g, tasks, candidates, "preempt", None, feasible=feasible,
                                     replace_victims=self._move_victims)
            if out.ok:
                self._finish(g, out.attempt, jq)
            else:
                self._remember_failure(key, None)

    # -- stale gangs --------------------------------------------------------------------------------------------
    def stale_gangs(self) -> None:
        sess, st = self.sess, self.sess.state
        grace = sess.cfg.stale_gang_grace_s
        for g in active_groups(sess):
            since = st.pg_stale_since[g]
            if math.isnan(since) or st.now - float(since) <= grace:
                continue
            if is_satisfied(sess, g):
                continue
            pods = st.group_pods(g)[active_mask(sess, st.group_pods(g))].tolist()
            sess.evict_many([p for p in pods if p not in sess.placements], "stale-gang", -1)

    # -- helpers ------------------------------------------------------------------------------------------------
    # -- failed victim searches, remembered ----------------------------------------------------------------------
    def _search_key(self, kind: str, g: int, tasks: list[int]) -> tuple | None:
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

    def _failed_before(self, g: int, key: tuple | None) -> bool:
        """True (and g gets the remembered reason) when an alike search failed on this same session state."""
        hit = self._failed.get(key) if key is not None else None
        if hit is None or hit[0] != self.sess.state_id:
            return False
        if hit[1] is not None:
            self._add_reason(g, hit[1])
        return True

    def _remember_failure(self, key: tuple | None, reason: Reason | None) -> None:
        if key is not None:
            self._failed[key] = (self.sess.state_id, reason)

    def _satisfied_now(self, g: int) -> bool:
        return is_satisfied(self.sess, g, group_shape(self.sess, g)) and not pending_mask(
            self.sess, self.sess.state.group_pods(g)).any()

    def _finish(self, g: int, attempt: Attempt | None, jq: JobQueue) -> None:
        if attempt is not None and attempt.any_pipelined:
            self.sess.convert_to_pipelined(self._placed_pods(g))
        self.reasons.pop(g, None)
        if pending_mask(self.sess, self.sess.state.group_pods(g)).any():
            jq.push(g)

    def _add_reason(self, g: int, r: Reason) -> None:
        existing = self.reasons.setdefault(g, [])
        if all(x.code != r.code for x in existing):
            existing.append(r)
