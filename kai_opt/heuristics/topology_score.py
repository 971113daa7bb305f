"""Node scores of a preferred topology level (KAI's topology plugin node order), for the placer's topology tier.

A (sub)group with a preferred level orders its nodes by the preferred-level domain they sit in, inside the lowest
common domain of the nodes it is offered (down to the preferred level; the whole tree when they share no top
domain). The tree under that domain is sorted top-down, each domain's children by how full the group's pods would
make them (dominant ratio of the pods' summed request to the child's free-once-released resources, fullest first;
domain name on ties). The i-th of n preferred-level domains in that order scores floor(10 * (i + 1) / n): the last,
emptiest domain scores highest, so a group that fits no preferred domain fills the one that holds most of it
first. Scores are taken when the (sub)group's placement starts and held for all its pods, as KAI does.
"""

from __future__ import annotations

import math

import numpy as np

from kai_opt.heuristics.session import Session
from kai_opt.state import R_CPU, R_GPU, R_PODS

TIER_TOPOLOGY = 10_000  # per score step; between preferred node affinity and GPU sharing, as KAI's scores
SCORE_STEPS = 10
MISSING_RESOURCE_RATIO = 1000.0  # a requested resource the domain has none of (KAI's ratio for it)


def preferred_scores(sess: Session, topo: int, pref_lvl: int, pods: list[int],
                     offered: np.ndarray | None) -> np.ndarray | None:
    """int64[N] topology tier per node for `pods` offered the nodes in `offered` (None: all), or None when every
    offered node scores the same (their common domain is at or below the preferred level)."""
    st = sess.state
    t = st.topologies[topo]
    in_tree = t.domain[len(t.levels) - 1] >= 0  # a node missing any level's label is outside the topology
    valid = in_tree if offered is None else in_tree & offered
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return None
    lca, lca_id = -1, -1
    for lvl in range(pref_lvl + 1):
        ids = t.domain[lvl][idx]
        if np.any(ids != ids[0]):
            break
        lca, lca_id = lvl, int(ids[0])
    if lca == pref_lvl:
        return None
    nodes = in_tree if lca < 0 else t.domain[lca] == lca_id
    need = st.pod_req[pods].sum(axis=0).astype(float)
    free = (sess.alloc - sess.held).astype(float)
    order = _sorted_domains(sess, topo, lca + 1, pref_lvl, np.flatnonzero(nodes), need, free)
    out = np.zeros(st.n_nodes, dtype=np.int64)
    dom = t.domain[pref_lvl]
    for i, d in enumerate(order):
        out[(dom == d) & nodes] = math.floor(SCORE_STEPS * (i + 1) / len(order)) * TIER_TOPOLOGY
    return out


def _sorted_domains(sess: Session, topo: int, lvl: int, pref_lvl: int, nodes: np.ndarray, need: np.ndarray,
                    free: np.ndarray) -> list[int]:
    """Domain ids at pref_lvl under `nodes` (one domain at lvl - 1), the tree sorted top-down from lvl."""
    t = sess.state.topologies[topo]
    ids = t.domain[lvl][nodes]
    children = np.unique(ids)
    ratio = {int(d): _ratio(need, free[nodes[ids == d]].sum(axis=0)) for d in children.tolist()}
    rank = t.name_rank[lvl]
    ordered = sorted(ratio, key=lambda d: (-ratio[d], int(rank[d])))
    if lvl == pref_lvl:
        return ordered
    out: list[int] = []
    for d in ordered:
        out += _sorted_domains(sess, topo, lvl + 1, pref_lvl, nodes[ids == d], need, free)
    return out


def _ratio(need: np.ndarray, free: np.ndarray) -> float:
    """How full the pods would make a domain: the largest request / free ratio over GPUs, CPU (whole cores),
    memory and extended resources (pods not counted); 0 when the pods request nothing."""
    out = 0.0
    if need[R_GPU] > 0:
        out = need[R_GPU] / free[R_GPU] if free[R_GPU] > 0 else math.inf
    for r in range(len(need)):
        if r in (R_GPU, R_PODS) or need[r] <= 0:
            continue
        want, have = (math.ceil(need[r] / 1000), math.ceil(free[r] / 1000)) if r == R_CPU else (need[r], free[r])
        out = max(out, want / have if have > 0 else MISSING_RESOURCE_RATIO)
    return out
