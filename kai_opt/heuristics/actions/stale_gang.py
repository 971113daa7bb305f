"""Stale-gang eviction: a running gang that stayed below its minMember longer than `stale_gang_grace_s` is
evicted (KAI's stalegangeviction action); pods placed this cycle stay."""

from __future__ import annotations

import numpy as np

from kai_opt.heuristics.actions.base import Action
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.tasks import active_mask, is_satisfied
from kai_opt.heuristics.victims import active_group_mask


class StaleGang(Action):
    spec_name = "stale_gang"

    def run(self, ctx: ActionContext) -> None:
        sess, st = ctx.sess, ctx.sess.state
        reason = self.eviction_reason
        assert reason is not None, "stale-gang declares its eviction reason"
        since = st.pg_stale_since
        # below minMember for longer than the grace period (a group never below it has no time: NaN, never stale)
        stale = active_group_mask(sess) & ~np.isnan(since) & (st.now - since > sess.cfg.stale_gang_grace_s)
        for g in np.flatnonzero(stale).tolist():
            if is_satisfied(sess, g):
                continue
            pods = st.group_pods(g)[active_mask(sess, st.group_pods(g))].tolist()
            sess.evict_many([p for p in pods if p not in sess.placements], reason, -1)


ACTION = StaleGang()
