"""Stale-gang eviction: a running gang that stayed below its minMember longer than `stale_gang_grace_s` is
evicted (KAI's stalegangeviction action); pods placed this cycle stay."""

from __future__ import annotations

import math

from kai_opt.heuristics.actions.base import Action
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.tasks import active_mask, is_satisfied
from kai_opt.heuristics.victims import active_groups


class StaleGang(Action):
    spec_name = "stale_gang"

    def run(self, ctx: ActionContext) -> None:
        sess, st = ctx.sess, ctx.sess.state
        reason = self.eviction_reason
        assert reason is not None, "stale-gang declares its eviction reason"
        grace = sess.cfg.stale_gang_grace_s
        for g in active_groups(sess):
            since = st.pg_stale_since[g]
            if math.isnan(since) or st.now - float(since) <= grace:
                continue
            if is_satisfied(sess, g):
                continue
            pods = st.group_pods(g)[active_mask(sess, st.group_pods(g))].tolist()
            sess.evict_many([p for p in pods if p not in sess.placements], reason, -1)


ACTION = StaleGang()
