"""The interface every greedy action implements (KAI's framework.Action: a name and Execute on the session), and
the loop the evicting actions share (KAI's preempt, reclaim and consolidation run the same job-solver loop)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kai_opt.actions import ACTION_BY_NAME, ActionSpec
from kai_opt.config import VictimSearch
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.actions.signatures import FailedJobs, Signature, signature
from kai_opt.heuristics.cheapest_victims import solve_cheapest
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import tasks_to_allocate
from kai_opt.heuristics.victims import Outcome, ScenarioFilter, solve_with_victims
from kai_opt.plan import Reason


class Action(ABC):
    """One action of the cycle. Its declaration (name = config flag, KAI's name, eviction reason and rules) is
    its entry in kai_opt.actions.ACTIONS; `spec_name` picks it."""

    spec_name: ClassVar[str]

    @property
    def spec(self) -> ActionSpec:
        return ACTION_BY_NAME[self.spec_name]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def flag(self) -> str:
        """Its `actions.<flag>` switch in the config."""
        return self.spec.name

    @property
    def eviction_reason(self) -> str | None:
        return self.spec.eviction_reason

    @abstractmethod
    def run(self, ctx: ActionContext) -> None:
        """Take this action's decisions on ctx's session."""


def queued_groups(ctx: ActionContext, jq: JobQueue) -> Iterator[tuple[int, list[int]]]:
    """Pending groups in job-queue order with the tasks each still has to place (groups with none are skipped). A
    group pushed back onto jq while iterating comes again."""
    while True:
        g = jq.pop()
        if g is None:
            return
        tasks = tasks_to_allocate(ctx.sess, g)
        if tasks:
            yield g, tasks


@dataclass
class Search:
    """One victim search an action asks for: the candidate victim groups and the action's scenario rules."""

    candidates: np.ndarray
    rules: ScenarioFilter
    max_victim_jobs: int = -1
    within: np.ndarray | None = None


class VictimAction(Action):
    """An action that evicts to place pending work: per pending group in job-queue order, unless it is satisfied,
    the action lets it try (`admits`); an alike search that failed on this same session state is not repeated;
    otherwise the action names its candidates and rules (`search`) and the job solver (solve_with_victims) looks
    for victims. A group placed finishes; a failure records the action's reason (`failure_reason`)."""

    preemptible_only: ClassVar[bool] = False  # only preemptible pending groups take part
    pipeline_group: ClassVar[bool] = True  # on success, all of the group's placements wait (pipelined)
    # KAI's scheduling signatures (signatures.py): failed jobs are compared within the pending job's queue (else
    # the whole cluster), and before `admits` (a refusal counts as a failure) unless signatures_after_admits
    signatures_per_queue: ClassVar[bool] = True
    signatures_after_admits: ClassVar[bool] = False

    def run(self, ctx: ActionContext) -> None:
        sess, st = ctx.sess, ctx.sess.state
        reason = self.eviction_reason
        assert reason is not None, f"{self.name} evicts, so it declares an eviction reason"
        jq = JobQueue(sess, ctx.pending_groups(preemptible_only=self.preemptible_only))
        failed = FailedJobs()  # (a job without a signature is never skipped nor remembered)
        signatures, after = sess.cfg.use_scheduling_signatures, self.signatures_after_admits
        for g, tasks in queued_groups(ctx, jq):
            if ctx.satisfied_now(g):
                continue
            sig = signature(sess, g, int(st.pg_queue[g]) if self.signatures_per_queue else -1) if signatures \
                else None
            if not after and self._skipped(ctx, g, failed, sig):
                continue
            if not self.admits(ctx, g, tasks):
                if not after:
                    failed.failed(sess, g, sig, None)
                continue
            if after and self._skipped(ctx, g, failed, sig):
                continue
            key = ctx.search_key(self.name, g, tasks)
            if ctx.failed_before(g, key):
                continue
            search = self.search(ctx, g, tasks)
            if search is None:
                continue
            out = self.solve(ctx, g, tasks, search, reason)
            if out.ok:
                ctx.finish(g, out.attempt if self.pipeline_group else None, jq)
                continue
            why = self.failure_reason(ctx, g, search, out)
            if why is not None:
                ctx.add_reason(g, why)
            ctx.remember_failure(key, why)
            failed.failed(sess, g, sig, why)

    def _skipped(self, ctx: ActionContext, g: int, failed: FailedJobs, sig: Signature | None) -> bool:
        """Whether g is not tried (KAI's scheduling signatures); it then gets the failed job's reason."""
        hit = failed.skips(ctx.sess, g, sig)
        if hit is None:
            return False
        other, why = hit
        like = ctx.sess.state.pg_keys[other]
        ctx.add_reason(g, Reason(f"{self.spec_name.capitalize()}Skipped", f"{self.spec_name} not tried: {like}, "
                                 "with the same constraints and no larger requests, found nothing this cycle"
                                 + (f" ({why.message})" if why is not None else ""), {"like": like}))
        return True

    def admits(self, ctx: ActionContext, g: int, tasks: list[int]) -> bool:
        """Whether g may look for victims at all (before the memo); may record why not."""
        return True

    @abstractmethod
    def search(self, ctx: ActionContext, g: int, tasks: list[int]) -> Search | None:
        """The victim search for g's tasks, or None to leave g be (nothing remembered)."""

    def solve(self, ctx: ActionContext, g: int, tasks: list[int], search: Search, reason: str) -> Outcome:
        """The job solver for g's tasks (KAI's JobSolver): victims from the search's candidates under its rules.
        The session is unchanged unless it succeeds."""
        feasible = ctx.placer.static_mask(int(ctx.sess.state.pod_sig[tasks[0]]))
        if ctx.sess.cfg.victim_search_for(ctx.sess.state.n_nodes) == VictimSearch.cheapest:
            return solve_cheapest(ctx.sess, ctx.gang, g, tasks, np.asarray(search.candidates, dtype=np.int64),
                                  reason, search.rules, feasible=feasible, victim_ok=search.rules.victim_ok)
        return solve_with_victims(ctx.sess, ctx.gang, g, tasks, search.candidates, reason, search.rules,
                                  feasible=feasible, max_victim_jobs=search.max_victim_jobs, within=search.within)

    def failure_reason(self, ctx: ActionContext, g: int, search: Search, out: Outcome) -> Reason | None:
        """Why g stays pending after a failed search (recorded and remembered), or None."""
        return None


class MoveVictims(ScenarioFilter):
    """Victims that fit elsewhere are re-placed (pipelined) instead of only evicted: KAI's consolidating reclaim
    and preempt, and consolidation itself."""

    def __init__(self, ctx: ActionContext) -> None:
        self.ctx = ctx

    def replace_victims(self, sess: Session, chunks: list[list[int]]) -> list[int]:
        return self.ctx.move_victims(sess, chunks)
