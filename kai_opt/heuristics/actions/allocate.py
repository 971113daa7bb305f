"""Allocate: place pending work on free (or releasing) resources, in job-queue order (KAI's allocate action)."""

from __future__ import annotations

from kai_opt.heuristics.actions.base import Action, queued_groups
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.jobs import JobQueue


class Allocate(Action):
    spec_name = "allocate"

    def run(self, ctx: ActionContext) -> None:
        jq = JobQueue(ctx.sess, ctx.pending_groups())
        for g, tasks in queued_groups(ctx, jq):
            attempt = ctx.gang.place(g, tasks, allow_pipeline=True)
            if not attempt.ok:
                ctx.note(g, attempt.reasons)
                continue
            ctx.finish(g, attempt, jq)


ACTION = Allocate()
