"""Consolidate: move preemptible running pods (each re-placed in the same plan) so pending work fits, only to
defragment: the GPUs must be idle or being released already (KAI's consolidation). The search is KAI's
(kai_opt/heuristics/consolidation.py): by-node scenarios simulated in allocation order."""

from __future__ import annotations

import numpy as np

from kai_opt.fairshare.reclaim import below_fair_share, can_reclaim
from kai_opt.heuristics.actions.base import Search, VictimAction
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.consolidation import consolidate
from kai_opt.heuristics.victims import Outcome, ScenarioFilter
from kai_opt.state import R_GPU, PodStatus


class Consolidate(VictimAction):
    spec_name = "consolidate"
    preemptible_only = True
    pipeline_group = False
    signatures_per_queue = False  # KAI keeps one set of failed jobs for the whole cluster here

    def run(self, ctx: ActionContext) -> None:
        if ctx.sess.cfg.max_consolidation_preemptees == 0:
            return  # consolidation off
        super().run(ctx)

    def admits(self, ctx: ActionContext, g: int, tasks: list[int]) -> bool:
        """KAI's IsEnoughGPUsAllocatableForJob: the cluster's GPUs idle or being released cover the tasks' GPUs.
        No fair-share test: the queue's capacity (limits, non-preemptible quota) is judged when the job is placed
        in a scenario, as KAI's AllocateJob does."""
        sess, st = ctx.sess, ctx.sess.state
        free = float((sess.alloc[st.node_ok, R_GPU] - sess.held[st.node_ok, R_GPU]).sum())
        return free + 1e-9 >= float(st.pod_req[tasks, R_GPU].sum())

    def search(self, ctx: ActionContext, g: int, tasks: list[int]) -> Search | None:
        """Preemptible groups with bound pods. (KAI also moves jobs pipelined earlier in the session; here such a
        pod re-placed would be a new placement, not a move of running work: not done.) For a job that would leave
        its queue over its fair share, no group of another queue below its fair share moves: that queue's unmet
        demand is entitled to the room, and a moved pod that fails to land where the simulation put it would
        reclaim the room back the next cycle (a consolidate / reclaim loop)."""
        sess, st = ctx.sess, ctx.sess.state
        cand = np.zeros(st.n_groups, dtype=bool)
        cand[st.pod_pg[(sess.status == PodStatus.BOUND) & (st.pod_pg >= 0)]] = True
        cand &= st.pg_preemptible.astype(bool) & (st.pg_queue >= 0)  # (a group of no known queue: see reclaim)
        cand[g] = False
        found = np.flatnonzero(cand)
        q = int(st.pg_queue[g])
        if len(found) and not can_reclaim(sess.fs, sess.ledger, q, sess.queue_request(tasks).sum(axis=0),
                                          preemptible=True):
            found = found[~below_fair_share(sess.fs, sess.ledger)[st.pg_queue[found]] | (st.pg_queue[found] == q)]
        return Search(found, ScenarioFilter(), max_victim_jobs=sess.cfg.max_consolidation_preemptees)

    def solve(self, ctx: ActionContext, g: int, tasks: list[int], search: Search, reason: str) -> Outcome:
        return consolidate(ctx, g, tasks, search.candidates, reason, max_victim_jobs=search.max_victim_jobs)


ACTION = Consolidate()
