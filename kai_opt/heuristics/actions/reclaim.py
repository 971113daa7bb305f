"""Reclaim: take resources back from other queues' preemptible work for a queue below its fair share, within
KAI's reclaim rules (KAI's reclaim action)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.reclaim import (
    ReclaimerSide,
    can_reclaim,
    not_refused,
    reclaim_headroom,
    reclaimable,
    reclaimer_side_after,
)
from kai_opt.fairshare.reclaim import victim_chunks as chunk_resources
from kai_opt.heuristics.actions.base import MoveVictims, Search, VictimAction
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.cheapest_victims import queue_paths
from kai_opt.heuristics.session import IS_ACTIVE, Session
from kai_opt.heuristics.victims import Outcome, active_group_mask, protected_mask
from kai_opt.plan import Reason


class ReclaimRules(MoveVictims):
    """KAI's reclaim rules for queue q reclaiming req: the reclaimer's side judged on every victim taken so far
    (worth_trying, as KAI judges its accumulated scenario) and on the victims that may stay evicted before moves
    (precheck), the whole rule on what stays evicted (validate)."""

    allocation_order = True

    def __init__(self, ctx: ActionContext, q: int, req: np.ndarray, preemptible: bool) -> None:
        super().__init__(ctx)
        sess = ctx.sess
        self.q, self.req, self.preemptible = q, req, preemptible
        self.mult = sess.cfg.reclaim_saturation_multiplier
        # every victim taken so far, judged incrementally (the ledger as the search started)
        self._side = ReclaimerSide(sess.fs, sess.ledger.copy(), q, req, preemptible=preemptible,
                                   saturation_multiplier=self.mult)

    def worth_trying(self, chunk: list[int]) -> bool:
        """Whether, with every victim taken so far gone, the reclaimer's side of the reclaim rules holds (not
        monotone: a victim from a new sibling queue adds a comparison, one from under the reclaimer's ancestor
        lowers its saturation, so it is judged again per chunk, on the comparisons the chunk changes)."""
        sess, st = self.ctx.sess, self.ctx.sess.state
        drop = sess.queue_request(chunk, sess.node[np.array(chunk)]).sum(axis=0)
        return self._side.take(int(st.pg_queue[int(st.pod_pg[chunk[0]])]), drop) is None

    def victim_ok(self, groups: np.ndarray) -> np.ndarray:
        """The victim groups the reclaim rules do not already refuse for q as the ledger stands (`not_refused`; the
        preselection of `victim_search: cheapest`, whose search still judges every victim it takes)."""
        sess = self.ctx.sess
        per_queue = sess.memo(("not_refused", self.q, self.req.tobytes()), lambda: not_refused(
            sess.fs, sess.ledger, queue_paths(sess), self.q, self.req,
            np.arange(sess.state.n_queues, dtype=np.int64),  # the rule looks at queues: judge each once per state
            saturation_multiplier=self.mult))
        return per_queue[sess.state.pg_queue[groups]]

    def precheck(self, sess: Session, ledger: QueueLedger, victims: list[int]) -> str | None:
        return reclaimer_side_after(sess.fs, ledger, self.q, self.req, self._chunks(victims),
                                    preemptible=self.preemptible, saturation_multiplier=self.mult)

    def validate(self, sess: Session, ledger: QueueLedger, victims: list[int]) -> str | None:
        return reclaimable(sess.fs, ledger, self.q, self.req, self._chunks(victims), preemptible=self.preemptible,
                           saturation_multiplier=self.mult)

    def _chunks(self, victims: list[int]) -> list[tuple[int, np.ndarray]]:
        """Victim pods grouped per job into KAI's chunks (elastic pods one by one, the core together)."""
        sess, st = self.ctx.sess, self.ctx.sess.state
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


@dataclass
class ReclaimSearch(Search):
    """A reclaim search, with the other queues' groups the rules protect (named when it fails)."""

    other: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # other queues' active groups
    protected: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # by min runtime


class Reclaim(VictimAction):
    spec_name = "reclaim"
    signatures_after_admits = True  # KAI compares only jobs its reclaim admits (CanReclaimResources)

    def admits(self, ctx: ActionContext, g: int, tasks: list[int]) -> bool:
        sess, st = ctx.sess, ctx.sess.state
        q, req, preemptible = int(st.pg_queue[g]), sess.queue_request(tasks).sum(axis=0), bool(st.pg_preemptible[g])
        if can_reclaim(sess.fs, sess.ledger, q, req, preemptible=preemptible):
            return True
        ctx.add_reason(g, Reason("ReclaimNotAllowed", f"queue {st.q_names[q]!r} would exceed its fair share (or, "
                                 "for non-preemptible work, its quota) by reclaiming",
                                 reclaim_headroom(sess.fs, sess.ledger, q, req, preemptible=preemptible,
                                                  names=st.q_names)))
        return False

    def search(self, ctx: ActionContext, g: int, tasks: list[int]) -> Search | None:
        sess, st = ctx.sess, ctx.sess.state
        q = int(st.pg_queue[g])
        # every queue's candidates (one victim order shared by all reclaim searches from this state), less q's
        # a group whose queue is unknown (QueueDoesNotExist: not in KAI's session) uses capacity but is no victim
        every_queue = sess.memo("reclaim_candidates", lambda: np.flatnonzero(
            active_group_mask(sess) & st.pg_preemptible.astype(bool) & ~protected_mask(sess, "reclaim")
            & (st.pg_queue >= 0)))
        candidates = every_queue[st.pg_queue[every_queue] != q]
        other = active_group_mask(sess) & (st.pg_queue != q)
        protected = protected_mask(sess, "reclaim")
        rules = ReclaimRules(ctx, q, sess.queue_request(tasks).sum(axis=0), bool(st.pg_preemptible[g]))
        return ReclaimSearch(candidates, rules, within=every_queue, other=other, protected=protected)

    def failure_reason(self, ctx: ActionContext, g: int, search: Search, out: Outcome) -> Reason | None:
        if not len(search.candidates):
            return None
        assert isinstance(search, ReclaimSearch)
        other, protected = search.other, search.protected
        preemptible_v = ctx.sess.state.pg_preemptible.astype(bool)
        return Reason("ReclaimNotPossible", f"reclaim found no allowed victims: {out.why}", {
            "why": out.why, "candidates": len(search.candidates),
            "protected": {"non_preemptible": int((other & ~preemptible_v).sum()),
                          "min_runtime": int((other & preemptible_v & protected).sum())}})


ACTION = Reclaim()
