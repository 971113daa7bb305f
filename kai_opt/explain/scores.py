"""The greedy placer's node ranking for one pod, term by term: which nodes it could use and why the best one won.

Tiers (highest first, as heuristics/placer.py adds them): preferred node affinity, GPU sharing (a share joins a
device already shared), availability (fits now rather than after releases), resource type (CPU-only pods prefer
CPU-only nodes); then bin-pack (fewest free) or spread (most free) on the pod's main resource; then node name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_opt.config import Strategy
from kai_opt.heuristics.placer import (
    TIER_AVAILABILITY,
    TIER_GPU_SHARING,
    TIER_PREFERRED_AFFINITY,
    TIER_RESOURCE_TYPE,
    Placer,
)
from kai_opt.heuristics.session import DEV
from kai_opt.state import R_CPU, R_GPU


@dataclass
class Ranking:
    """Feasible nodes of one pod in the placer's order, with each score term."""

    nodes: np.ndarray  # node indexes, best first
    now: np.ndarray  # bool: fits now (not only once releases finish)
    tier: np.ndarray  # int: the summed tier score
    fine: np.ndarray  # float: bin-pack / spread score
    free: np.ndarray  # float: free amount of the main resource now (GPUs or CPU cores)
    future: np.ndarray  # float: ... once the releases in flight finish
    strategy: str
    main: str  # "gpu" | "cpu"
    considered: int  # nodes inside the mask that pass the static filter

    def index(self, n: int) -> int:
        hit = np.flatnonzero(self.nodes == n)
        return int(hit[0]) if len(hit) else -1


def rank_nodes(placer: Placer, p: int, mask: np.ndarray | None = None) -> Ranking:
    sess, st = placer.sess, placer.sess.state
    static = placer.static_mask(int(st.pod_sig[p]))
    cand = np.flatnonzero(static if mask is None else static & mask)
    now_ok, future_ok = placer.filter(p, cand) if len(cand) else (np.zeros(0, bool), np.zeros(0, bool))
    ok = future_ok
    nodes, now = cand[ok], now_ok[ok]
    gpu_pod = bool(st.pod_gpu_whole[p] or st.pod_gpu_frac[p] or st.pod_gpu_mem[p])
    strategy = (sess.cfg.placement.gpu if gpu_pod else sess.cfg.placement.cpu).value
    if len(nodes):
        tier, fine = placer.scores(p, nodes, now)
    else:
        tier, fine = np.zeros(0, dtype=np.int64), np.zeros(0)
    col = R_GPU if gpu_pod else R_CPU
    future = (sess.alloc[nodes, col] - sess.held[nodes, col]) / 1000.0
    free = future - sess.rel[nodes, col] / 1000.0
    order = np.lexsort((placer.name_rank[nodes], -fine, -tier)) if len(nodes) else np.zeros(0, dtype=np.int64)
    return Ranking(nodes[order], now[order], tier[order], fine[order], free[order], future[order], strategy,
                   "gpu" if gpu_pod else "cpu", len(cand))


def terms(placer: Placer, p: int, rk: Ranking, i: int) -> dict[str, int]:
    """The tier score of rk.nodes[i] split into its terms (any remainder is reported as `other`)."""
    sess, st = placer.sess, placer.sess.state
    n = int(rk.nodes[i])
    out = {"availability": TIER_AVAILABILITY if rk.now[i] else 0,
           "resource_type": TIER_RESOURCE_TYPE if rk.main == "cpu" and not placer.has_gpu[n] else 0,
           "gpu_sharing": 0, "preferred_affinity": 0}
    if (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]) and rk.strategy != Strategy.fgd.value:  # (no such tier under fgd)
        per = int(placer.per_device(p, np.array([n]))[0])
        a, b = int(sess.dev_start[n]), int(sess.dev_start[n + 1])
        used = sess.dev_held[a:b] + sess.dev_rel[a:b]
        out["gpu_sharing"] = TIER_GPU_SHARING if bool(np.any((used > 0) & (DEV - used >= per))) else 0
    pod = st.pods[p]
    if pod.node_affinity_preferred:
        total = sum(t.weight for t in pod.node_affinity_preferred) or 1
        pref = sum(t.weight for t in pod.node_affinity_preferred if t.term.matches(st.node_labels[n],
                                                                                   st.node_names[n]))
        out["preferred_affinity"] = TIER_PREFERRED_AFFINITY * pref // total
    rest = int(rk.tier[i]) - sum(out.values())
    if rest:
        out["other"] = rest
    return out


def node_entry(placer: Placer, p: int, rk: Ranking, i: int) -> dict[str, object]:
    st = placer.sess.state
    unit = "GPUs" if rk.main == "gpu" else "CPU cores"
    free = f"{_r(rk.free[i])} {unit} free now"
    fgd = rk.strategy == Strategy.fgd.value  # FGD scoring ranks by its score, not by the free amount
    out: dict[str, object] = {
        "node": st.node_names[int(rk.nodes[i])], "rank": i + 1, "fits": "now" if rk.now[i] else "after releases",
        "tier": int(rk.tier[i]), "terms": terms(placer, p, rk, i), "strategy": rk.strategy,
        f"free_{rk.main}": _r(rk.free[i]),
        "packing": f"fgd: score {_r(rk.fine[i])} ({FGD_SCORE}); {free}" if fgd
        else f"{rk.strategy}: {free} ({_WINS[rk.strategy]})"}
    if fgd:
        out["fgd_score"] = _r(rk.fine[i])
    return out


# how Placer.scores folds FGD's keys into one number, as explain reports it
FGD_SCORE = ("FGD's score of the growth of the node's expected GPU fragmentation and CPU/GPU imbalance: 50 for no "
             "growth, lower the more it grows, higher wins (a GPU share: least growth of its device's fill cost "
             "first); its fraction is the tie rule")


_WINS = {Strategy.binpack.value: "fewest free wins", Strategy.spread.value: "most free wins"}


def device_choice(placer: Placer, p: int, n: int, devices: tuple[int, ...], strategy: str) -> dict[str, object]:
    """How the devices on node n looked to pod p and which it got (node-local indexes)."""
    sess, st = placer.sess, placer.sess.state
    a, b = int(sess.dev_start[n]), int(sess.dev_start[n + 1])
    used = (sess.dev_held[a:b] + sess.dev_rel[a:b]) / DEV
    if st.pod_gpu_whole[p]:
        rule = "whole devices: idle ones first (then ones being released, when pipelined), lowest index first"
    elif st.pod_gpu_frac[p] or st.pod_gpu_mem[p]:
        rule = f"GPU share, {strategy}: " + {
            Strategy.binpack.value: "the fullest device with room first (already shared ones first)",
            Strategy.fgd.value: "least growth of the device's fill cost, then of fragmentation, then the fullest",
        }.get(strategy, "the emptiest device first")
    else:
        rule = "no GPU"
    return {"devices": [d - a for d in devices], "rule": rule,
            "used_before": {int(d): _r(u) for d, u in enumerate(used.tolist()) if u > 0}}


def _r(x: float) -> float:
    return round(float(x), 3)
