"""A long cycle whose pending work asks for at most half the free room computes the FGD-scored greedy plan first:
when it places every pending pod a plan could place without evictions (unbeatable.py), it is the cycle's plan and
the KAI-scored plan is not computed at all.

Why: in such a cycle the KAI-scored plan could only tie the FGD-scored one on the primary objective (placed work,
evictions) and then decide the fragmentation tie-break (packing.py) against it, at the price of a second greedy
plan, the larger part of the default engine's in-cluster cycle when pods arrive into free room
(docs/DESIGN-NOTES.md, CP-SAT engine: "The FGD-scored plan first"). Below FGD_FIRST_WORK both plans are cheap and
an equal fragmentation keeps KAI's plan, as KAI's own tests expect. The FGD-scored cycle stops once allocate leaves
work a model might place (may_be_beaten): the cycle then goes the usual way, and this cost one allocate action
(ROOM_SHARE keeps that rare).
"""

from __future__ import annotations

import time

import numpy as np

from kai_opt.config import Config, Strategy
from kai_opt.fairshare import FairShare
from kai_opt.formulation.second_hint import compute, wanted
from kai_opt.formulation.unbeatable import may_be_beaten, placeable, unbeatable_note
from kai_opt.heuristics.cycle import Progress
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan, SolverInfo
from kai_opt.state import ClusterState

FGD_FIRST_WORK = 10_000  # pending groups x nodes (engine.placement_work) from which a cycle with room goes FGD first
ROOM_SHARE = 0.5  # of the free room (per resource) the pending work may ask for (fits_with_room); where it asks for
# more, a greedy plan often leaves some of it (docs/DESIGN-NOTES.md, CP-SAT engine: "The FGD-scored plan first")


class _MayBeBeaten(Exception):
    """Allocate left work a model might place: the FGD-scored plan would not be kept without the KAI-scored one."""


def fits_with_room(state: ClusterState) -> bool:
    """Whether the pending pods of ours in groups ask, per resource, for at most ROOM_SHARE of what the schedulable
    nodes have free once releases finish and pipelined pods land: enough room to spare that a greedy plan is
    likely to place them all (the FGD-scored plan computed first is then likely kept)."""
    demand = state.pod_req[placeable(state)].sum(axis=0)
    free = (state.node_alloc - state.node_used + state.node_releasing - state.node_pipelined)[state.node_ok]
    return bool((demand <= ROOM_SHARE * np.maximum(free, 0).sum(axis=0)).all())


def fgd_first(state: ClusterState, fs: FairShare, config: Config, actions: tuple[str, ...] | None,
              work: int, progress: Progress | None = None) -> Plan | None:
    """The cycle's plan when it is the FGD-scored greedy plan computed first and unbeatable, checked; None when the
    cycle is short (`work`, pending groups x nodes, below FGD_FIRST_WORK), GPU pods are not bin-packed (the
    default, which FGD scoring refines; spread is the operator's choice), its pending work asks for more than
    fits_with_room allows, the FGD-scored plan is not wanted (second_hint.wanted), fails the checker or may be
    beaten."""
    if work < FGD_FIRST_WORK or config.placement.gpu != Strategy.binpack or not wanted(config, actions) \
            or not fits_with_room(state):
        return None
    start = time.perf_counter()

    def stop_if_beatable(action: str, sess: Session) -> None:
        if action == "allocate" and may_be_beaten(state, fs, config, sess):
            raise _MayBeBeaten

    try:
        plan = compute(state, fs, config, actions, stop_if_beatable,
                       None if progress is None else lambda what: progress(f"{what} (FGD-scored, first)"))
    except _MayBeBeaten:
        return None
    note = unbeatable_note(state, fs, config, plan) if plan is not None else ""
    if plan is None or not note:
        return None
    plan.engine = "cpsat"
    plan.solver = SolverInfo(status="GREEDY_KEPT", hint="fgd", wall_s=time.perf_counter() - start,
                             note=f"the greedy plan with FGD scoring, computed first (the pending work asks for at "
                                  f"most {ROOM_SHARE:g} of the free room), kept: "
                                  f"{note.removeprefix('greedy plan kept: ')}; the KAI-scored plan, which could only "
                                  "tie it, was not computed")
    return plan
