"""Consolidate: move preemptible running pods (each re-placed in the same plan) so pending work fits, only to
defragment: the GPUs must be idle already, and the work within its queue's fair share (KAI's consolidation)."""

from __future__ import annotations

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.reclaim import can_reclaim
from kai_opt.heuristics.actions.base import MoveVictims, Search, VictimAction
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.victims import active_group_mask
from kai_opt.state import R_GPU


class AllMoved(MoveVictims):
    """Consolidation: every evicted pod must be re-placed in the same plan."""

    def validate(self, sess: Session, ledger: QueueLedger, victims: list[int]) -> str | None:
        return "a consolidated pod could not be re-placed" if victims else None


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
        sess, st = ctx.sess, ctx.sess.state
        idle_gpus = float((sess.alloc[st.node_ok, R_GPU] - sess.held[st.node_ok, R_GPU]
                           - sess.rel[st.node_ok, R_GPU]).sum())
        if idle_gpus + 1e-9 < float(st.pod_req[tasks, R_GPU].sum()):
            return False  # consolidation only defragments: the cluster must have the GPUs idle
        # moving running pods for work above its queue's fair share would only be undone by the next reclaim:
        # churn, not defragmentation
        return can_reclaim(sess.fs, sess.ledger, int(st.pg_queue[g]), sess.queue_request(tasks).sum(axis=0),
                           preemptible=True)

    def search(self, ctx: ActionContext, g: int, tasks: list[int]) -> Search | None:
        sess, st = ctx.sess, ctx.sess.state
        cand = active_group_mask(sess) & st.pg_preemptible.astype(bool)
        cand[g] = False
        return Search(np.flatnonzero(cand), AllMoved(ctx), max_victim_jobs=sess.cfg.max_consolidation_preemptees)


ACTION = Consolidate()
