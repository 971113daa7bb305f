"""Preempt: evict lower-priority preemptible work of the pending group's own queue (KAI's preempt action)."""

from __future__ import annotations

import numpy as np

from kai_opt.fairshare.capacity import non_preemptible_over_quota
from kai_opt.heuristics.actions.base import MoveVictims, Search, VictimAction
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.victims import active_group_mask, protected_mask


class Preempt(VictimAction):
    spec_name = "preempt"

    def admits(self, ctx: ActionContext, g: int, tasks: list[int]) -> bool:
        # non-preemptible work may not go over its queue's quota, whatever it evicts
        sess, st = ctx.sess, ctx.sess.state
        req = sess.queue_request(tasks).sum(axis=0)
        return bool(st.pg_preemptible[g]) or non_preemptible_over_quota(sess.fs, sess.ledger, int(st.pg_queue[g]),
                                                                        req) is None

    def search(self, ctx: ActionContext, g: int, tasks: list[int]) -> Search | None:
        sess, st = ctx.sess, ctx.sess.state
        cand = (active_group_mask(sess) & (st.pg_queue == int(st.pg_queue[g])) & st.pg_preemptible.astype(bool)
                & (st.pg_priority < int(st.pg_priority[g])))
        cand[g] = False
        if cand.any():
            cand &= ~protected_mask(sess, "preempt")
        candidates = np.flatnonzero(cand)
        if not len(candidates):
            return None
        return Search(candidates, MoveVictims(ctx))


ACTION = Preempt()
