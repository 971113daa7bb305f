"""Queue positions (Kueue's visibility API as the anchor): the order in which the greedy cycle's allocate action
takes up the pending PodGroups of a cluster state, read from the allocate action's own JobQueue and loop
(`queued_groups`), never re-implemented.

The order is the one at the start of a cycle, before any placement of that cycle changes a queue's allocation
(as Kueue's positions are the order of its pending heap): the allocate action pops the same sequence as long as it
places nothing. A group the cycle does not take up at all (a malformed PodGroup, too few pods created, nothing left
to place) has no position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.actions.base import queued_groups
from kai_opt.heuristics.actions.context import ActionContext
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.session import Session
from kai_opt.state import ClusterState


@dataclass(frozen=True)
class Position:
    group: int  # podgroup index
    overall: int  # 1-based position among all positioned groups
    in_queue: int  # 1-based position among those of its leaf queue
    request: tuple[float, float, float]  # what it asks for in this cycle (queue resources, QR order)


def pending_order(state: ClusterState, fs: FairShare, config: Config) -> list[tuple[int, np.ndarray]]:
    """(group, request) of every pending group, in the allocate action's order at the start of a cycle; request
    is the queue resources of the tasks it would try to place (what the queue order weighs)."""
    sess = Session(state, fs, config)
    ctx = ActionContext(sess)
    jq = JobQueue(sess, ctx.pending_groups())
    return [(g, jq.request(g)) for g, _tasks in queued_groups(ctx, jq)]  # (its request: cached by the pop)


def number(state: ClusterState, order: list[tuple[int, np.ndarray]],
           among: set[int] | None = None) -> dict[int, Position]:
    """Positions of `order`'s groups (only those in `among`, when given, numbered among themselves)."""
    out: dict[int, Position] = {}
    per_queue: dict[int, int] = {}
    for g, req in order:
        if among is not None and g not in among:
            continue
        q = int(state.pg_queue[g])
        per_queue[q] = per_queue.get(q, 0) + 1
        r = [float(x) for x in req.tolist()]
        out[g] = Position(g, len(out) + 1, per_queue[q], (r[0], r[1], r[2]))
    return out


def queue_positions(state: ClusterState, fs: FairShare, config: Config,
                    among: set[int] | None = None) -> dict[int, Position]:
    """Group -> its position at the start of a cycle on `state` (see the module docstring)."""
    return number(state, pending_order(state, fs, config), among)
