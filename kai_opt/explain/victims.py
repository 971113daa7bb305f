"""Why reclaim and preempt could not make room for a pending podgroup: the running groups each action could take
from, sorted by what protects them (non-preemptible, younger than the min runtime, not lower priority, their
queue at or below its own fair share) and the ones that remain eligible, in KAI's victim order.

Evaluated on the cluster as the plan leaves it, with the engines' predicates (heuristics/victims.py,
fairshare/reclaim.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kai_opt.fairshare.reclaim import can_reclaim, fits_strategy, leveled, reclaim_headroom
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.victims import protected_by_min_runtime, victim_chunk_order
from kai_opt.state import R_GPU, PodStatus

EXAMPLES = 5


@dataclass
class Unit:
    """Pods that go together as victims (an elastic pod above minMember, or a group's core) for one action."""

    group: int
    pods: list[int]
    action: str  # reclaim | preempt
    protected: str | None = None  # why the action may not take it now (None: eligible)


@dataclass
class VictimAnalysis:
    report: dict[str, Any]
    units: list[Unit]  # eligible units in victim order (capped)


def _min_runtime_limits(sess: Session, kind: str) -> np.ndarray:
    st = sess.state
    per_queue = st.q_preempt_min_runtime if kind == "preempt" else st.q_reclaim_min_runtime
    default = sess.cfg.preempt_min_runtime_s if kind == "preempt" else sess.cfg.reclaim_min_runtime_s
    return np.where(np.isnan(per_queue), default, per_queue)


def analyse_victims(sess: Session, g: int, request: np.ndarray, feasible: np.ndarray,
                    max_units: int = 32) -> VictimAnalysis:
    """`feasible`: nodes some pod of the group may use (victims elsewhere would not help)."""
    st = sess.state
    q = int(st.pg_queue[g])
    if q < 0:
        return VictimAnalysis({}, [])
    bound = (sess.status == PodStatus.BOUND) & (st.pod_pg >= 0)
    act = np.unique(st.pod_pg[bound]).astype(np.int64)  # only bound pods can be victims
    act = act[act != g]
    vq = st.pg_queue[act] if len(act) else np.zeros(0, dtype=np.int64)
    pre = st.pg_preemptible[act] if len(act) else np.zeros(0, dtype=bool)
    preemptible = bool(st.pg_preemptible[g])
    report: dict[str, Any] = {}
    units: list[Unit] = []
    per_group = _per_group(sess, feasible)

    # -- reclaim: other queues ----------------------------------------------------------------------------------
    allowed = can_reclaim(sess.fs, sess.ledger, q, request, preemptible=preemptible)
    other = act[vq != q]
    causes = _classify(sess, other, pre[vq != q], "reclaim")
    below = []
    verdict: dict[int, bool] = {}
    pair: dict[int, tuple[int, int]] = {}
    for v in causes.pop("candidates"):
        wq = int(st.pg_queue[v])
        if wq not in pair:
            pair[wq] = leveled(sess.ledger, q, wq)
        rq, lq = pair[wq]
        if lq not in verdict:  # judged where the two paths diverge: one verdict per diverging queue
            verdict[lq] = fits_strategy(sess.fs, sess.ledger, request, rq, lq, sess.ledger.allocated[lq])
        (causes["eligible"] if verdict[lq] else below).append(v)
    causes["victim_queue_at_or_below_fair_share"] = below
    rec = _summary(sess, causes, per_group)
    rec["allowed"] = allowed
    if not allowed:
        rec["why_not"] = reclaim_headroom(sess.fs, sess.ledger, q, request, preemptible=preemptible,
                                          names=st.q_names)
    elif not sess.cfg.actions.reclaim:
        rec["allowed"], rec["why_not"] = False, "the reclaim action is disabled in the config"
    report["reclaim"] = rec
    # eligible victims first; then those only a rule protects (a person could still evict them): min runtime, the
    # victim queue's share, the reclaimer's own fair share, a disabled action. Non-preemptible work never.
    why = None if rec["allowed"] else ("action_disabled" if allowed else "reclaimer_over_fair_share")
    usable = per_group[1]
    units += _units(sess, causes["eligible"], feasible, "reclaim", max_units, why, usable)
    units += _units(sess, causes["min_runtime"], feasible, "reclaim", max_units, "min_runtime", usable)
    units += _units(sess, below, feasible, "reclaim", max_units, "victim_queue_at_or_below_fair_share", usable)

    # -- preempt: the same queue, lower priority -----------------------------------------------------------------
    mine = act[vq == q]
    prio = int(st.pg_priority[g])
    lower = st.pg_priority[mine] < prio if len(mine) else np.zeros(0, dtype=bool)
    causes = _classify(sess, mine[lower], pre[vq == q][lower], "preempt")
    causes["eligible"] = causes.pop("candidates")
    causes["not_lower_priority"] = mine[~lower].tolist()
    pm = _summary(sess, causes, per_group)
    pm["allowed"] = sess.cfg.actions.preempt
    if not sess.cfg.actions.preempt:
        pm["why_not"] = "the preempt action is disabled in the config"
    report["preempt"] = pm
    units += _units(sess, causes["eligible"], feasible, "preempt", max_units,
                    None if pm["allowed"] else "action_disabled", usable)
    units += _units(sess, causes["min_runtime"], feasible, "preempt", max_units, "min_runtime", usable)
    units.sort(key=lambda u: u.protected is not None)  # stable: eligible first, each in victim order
    return VictimAnalysis(report, units[:max_units])


def _classify(sess: Session, groups: np.ndarray, preemptible: np.ndarray, kind: str) -> dict[str, list[int]]:
    st = sess.state
    limits = _min_runtime_limits(sess, kind)
    out: dict[str, list[int]] = {"non_preemptible": groups[~preemptible].tolist(), "min_runtime": [],
                                 "candidates": [], "eligible": []}
    for v in groups[preemptible].tolist():
        q = int(st.pg_queue[v])
        if q >= 0 and limits[q] > 0 and protected_by_min_runtime(sess, v, kind):
            out["min_runtime"].append(v)
        else:
            out["candidates"].append(v)
    return out


def _summary(sess: Session, causes: dict[str, list[int]], per_group: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    gpus_of, usable_of = per_group
    out: dict[str, Any] = {}
    for cause, groups in causes.items():
        if not groups and cause != "eligible":
            continue
        idx = np.array(groups, dtype=np.int64)
        entry: dict[str, Any] = {"groups": len(groups), "gpus": round(float(gpus_of[idx].sum()) / 1000.0, 3),
                                 "on_usable_nodes": int(usable_of[idx].sum()),
                                 "examples": [_example(sess, v, with_runtime=cause == "min_runtime")
                                              for v in groups[:EXAMPLES]]}
        out[cause] = entry
    return out


def _per_group(sess: Session, feasible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per podgroup: milli-GPUs its bound pods hold, and whether any of them sits on a usable node."""
    st = sess.state
    bound = np.flatnonzero((sess.status == PodStatus.BOUND) & (st.pod_pg >= 0))
    grp = st.pod_pg[bound]
    gpus = np.bincount(grp, weights=st.pod_req[bound, R_GPU], minlength=st.n_groups)
    usable = np.bincount(grp, weights=feasible[sess.node[bound]], minlength=st.n_groups) > 0
    return gpus, usable


def _example(sess: Session, v: int, with_runtime: bool = False) -> dict[str, Any]:
    from kai_opt.heuristics.victims import job_runtime

    st = sess.state
    e: dict[str, Any] = {"podgroup": st.pg_keys[v], "queue": st.q_names[int(st.pg_queue[v])],
                         "priority": int(st.pg_priority[v])}
    if with_runtime:
        rt = job_runtime(sess, v)
        e["runtime_s"] = None if math.isinf(rt) else round(rt, 1)
    return e


def _units(sess: Session, groups: list[int], feasible: np.ndarray, action: str, cap: int,
           protected: str | None, usable: np.ndarray) -> list[Unit]:
    """Victim units in KAI's victim order, only those holding resources on usable nodes. At most `cap` units
    are needed, so only the groups likeliest to come first (their queue furthest over its fair share, lower
    priority, newer) are ordered exactly; the rest cannot reach the front."""
    st, fs = sess.state, sess.fs
    out: list[Unit] = []
    groups = [v for v in groups if usable[v]]
    if not groups:
        return out
    if len(groups) > 2 * cap:
        g = np.array(groups, dtype=np.int64)
        q = st.pg_queue[g]
        with np.errstate(divide="ignore", invalid="ignore"):
            over = np.where(fs.fair_share[q, 0] > 0, sess.ledger.allocated[q, 0] / fs.fair_share[q, 0], np.inf)
        created = np.nan_to_num(st.pg_creation[g], nan=0.0)
        order = np.lexsort((-created, st.pg_priority[g], -over))
        groups = g[order[: 2 * cap]].tolist()
    for v, chunk in victim_chunk_order(sess, groups):
        if any(feasible[int(sess.node[p])] for p in chunk):
            out.append(Unit(v, list(chunk), action, protected))
            if len(out) >= cap:
                break
    return out
