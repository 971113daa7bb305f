"""Where one pod can go and which node is best (score), with GPU device choice.

Filter: kai_opt/heuristics/nodefilter.py (the Placer is a NodeFilter). Score, highest tier first as KAI does:
preferred node affinity, preferred topology domain (the group's order of preferred-level domains, set by the gang
placer: kai_opt/heuristics/topology_score.py), GPU sharing (a share joins an already shared device), availability
(fits now rather than after releases), resource type (CPU-only pods prefer CPU-only nodes), then bin-pack (fewest
free) or spread (most free) on the pod's main resource, or fgd (least growth of FGD's expected GPU fragmentation
against the session's pod shapes plus, for a GPU pod, of the node's CPU/GPU imbalance, scored int(100 * sigmoid(
-growth / 1 GPU)) as FGD does; a GPU share on one device first by the growth of its device's fill cost, and
without the sharing tier; among equal scores a CPU-only pod takes the node with the fewest free GPUs, a GPU pod the
node whose free CPU stays closest to its free GPUs times the workload's CPU per GPU), then node name.

Each score of a node depends on that node and the pod's shape alone, so a choice over every node a pod's signature
allows reads the verdicts and scores kept for its shape, judged again only on the nodes the session touched since
(`Placer.kept_keys`): a placement costs O(nodes changed) in scoring, plus one pass to read the best.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from kai_opt.config import Strategy
from kai_opt.heuristics.fragmentation import (
    FILL_UNIT,
    TYPICAL_COVERAGE,
    FragModel,
    pod_gpu_shape,
    popular_rows,
    share_fill_cost,
)
from kai_opt.heuristics.nodefilter import FIT_MEMO_MIN, NodeFilter
from kai_opt.heuristics.placer_judge import (
    BALANCE,
    BINPACK,
    FGD,
    JUDGE,
    NO_FGD,
    NO_NODE,
    NO_TOPOLOGY,
    REFRESH,
    SPREAD,
    TIER_AVAILABILITY,
    TIER_RESOURCE_TYPE,
)
from kai_opt.heuristics.session import DEV, Session
from kai_opt.state import R_CPU, R_GPU, ClusterState, PodStatus
from kai_opt.state.segments import concat_ranges

TIER_PREFERRED_AFFINITY = 100_000
TIER_GPU_SHARING = 1_000


# the last node names ranked, with the list they were read from (held: its identity is not reused)
_last_rank: list[tuple[list[str], np.ndarray]] = []


def node_name_rank(names: list[str]) -> np.ndarray:
    """Per node, its place in name order (read-only): the same array while the state's node-name list is the same
    (the in-cluster state build hands the same list every cycle while the nodes do not change)."""
    last = _last_rank[0] if _last_rank else None
    if last is not None and last[0] is names:
        return last[1]
    rank = np.argsort(np.argsort(np.array(names, dtype=object))).astype(np.int64) if names \
        else np.zeros(0, dtype=np.int64)
    rank.setflags(write=False)
    _last_rank[:] = [(names, rank)]
    return rank


@dataclass
class Choice:
    node: int
    pipelined: bool
    devices: tuple[int, ...]  # global device indexes


class Placer(NodeFilter):
    def __init__(self, sess: Session) -> None:
        super().__init__(sess)
        st = sess.state
        self._last: tuple[Any, ...] | None = None  # the last binpack choice, for _same_node_again
        self.name_rank = node_name_rank(st.node_names)
        self._fgd: FgdScorer | None = None
        # rank_key -> its candidates' keys (_Ranked); insertion order is use order (the oldest is dropped)
        self._ranked: dict[tuple[object, ...], _Ranked] = {}
        # the topology tier per node of the (sub)group being placed (None: no preferred level applies)
        self.topology_score: np.ndarray | None = None
        # bin-packing measures a node by what is not allocated (KAI's NonAllocatedResource: idle plus releasing)
        # instead of what is free now; on only inside consolidation's scenario simulation (heuristics/
        # consolidation.py, KAI's literal simulation): see docs/DESIGN-NOTES.md, "Consolidation is KAI's search"
        self._releasing_free = False

    @contextmanager
    def releasing_free(self) -> Iterator[None]:
        """Inside: bin-packing measures a node by its resources idle or being released (spread and fgd as
        outside)."""
        outer, self._releasing_free, self._last = self._releasing_free, True, None
        try:
            yield
        finally:
            self._releasing_free, self._last = outer, None

    @property
    def fgd(self) -> FgdScorer:
        """The FGD scorer of this session (built on first use: placement strategy fgd)."""
        if self._fgd is None:
            self._fgd = FgdScorer(self)
        return self._fgd

    def _devices_of(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global device indexes of `nodes`, position in `nodes` of each device's node)."""
        if len(nodes) == 1:  # (most calls: the node one placement changed)
            first, end = int(self.sess.dev_start[nodes[0]]), int(self.sess.dev_start[nodes[0] + 1])
            return np.arange(first, end), np.zeros(end - first, dtype=np.int64)
        starts = self.sess.dev_start[nodes]
        counts = self.sess.dev_start[nodes + 1] - starts
        owner = np.repeat(np.arange(len(nodes)), counts)
        dev, _ = concat_ranges(starts, counts)
        return dev, owner

    # -- scoring -------------------------------------------------------------------------------------------------
    def _gpu_pod(self, p: int) -> bool:
        st = self.sess.state
        return bool(st.pod_gpu_whole[p] or st.pod_gpu_frac[p] or st.pod_gpu_mem[p])

    def _strategy(self, p: int) -> Strategy:
        return self.sess.cfg.placement.gpu if self._gpu_pod(p) else self.sess.cfg.placement.cpu

    def _tier(self, p: int, candidates: np.ndarray, now_ok: np.ndarray) -> np.ndarray:
        """The tier score per candidate (higher better): preferred affinity, topology, sharing, availability,
        resource type."""
        st, sess = self.sess.state, self.sess
        tier = np.where(now_ok, TIER_AVAILABILITY, 0).astype(np.int64)
        gpu_pod = self._gpu_pod(p)
        if not gpu_pod:
            tier += np.where(self.has_gpu[candidates], 0, TIER_RESOURCE_TYPE)
        if (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]) and self._strategy(p) != Strategy.fgd:
            # (under fgd a share's device is chosen by its fill cost first: FgdScorer.score)
            per = self.per_device(p, candidates)
            dev, owner = self._devices_of(candidates)
            used = sess.dev_held[dev] + sess.dev_rel[dev]
            # a device whose pods are all being released is a whole GPU being released, not a shared one (KAI)
            hit = (sess.dev_held[dev] > 0) & (DEV - used >= per[owner])
            shared = np.bincount(owner[hit], minlength=len(candidates)) > 0
            tier += np.where(shared, TIER_GPU_SHARING, 0)
        pod = st.pods[p]
        if pod.node_affinity_preferred:
            total = sum(t.weight for t in pod.node_affinity_preferred) or 1
            pref = np.array([sum(t.weight for t in pod.node_affinity_preferred
                                 if t.term.matches(st.node_labels[n], st.node_names[n])) for n in candidates.tolist()])
            tier += (TIER_PREFERRED_AFFINITY * pref // total).astype(np.int64)
        if self.topology_score is not None:
            tier += self.topology_score[candidates]
        return tier

    def keys(self, p: int, candidates: np.ndarray, now_ok: np.ndarray) -> Keys:
        """The choice's order per candidate: (tier, k1, k2, k3), compared in that order, higher better, then the
        node name. k1 is the strategy's measure; under fgd k2 and k3 are its tie rule (else 0). Each key of a node
        depends on that node and the pod's shape alone (kept per shape: _ranked)."""
        sess = self.sess
        tier = self._tier(p, candidates, now_ok)
        gpu_pod = self._gpu_pod(p)
        strategy = self._strategy(p)
        zero = np.zeros(len(candidates))
        if strategy == Strategy.fgd and len(candidates):
            # least fragmentation growth first, scored as FGD does; among equals (docs/DESIGN-NOTES.md, FGD scoring)
            # a CPU-only pod takes the node with the fewest free GPUs (then bin-packs CPU) and a GPU pod the node
            # whose free CPU stays closest to what its free GPUs need at the workload's CPU per GPU (then the node
            # order), so CPU is left where GPUs are left
            k2, k3 = self.fgd.tie_keys(p, candidates, gpu_pod)
            return tier, self.fgd.score(p, candidates), k2, k3
        col, minus_rel = self._free_key(gpu_pod, strategy)
        free = sess.alloc[candidates, col] - sess.held[candidates, col]
        if minus_rel:
            free = free - sess.rel[candidates, col]
        free = free.astype(float)
        return tier, (-free if strategy == Strategy.binpack else free), zero, zero

    def _free_key(self, gpu_pod: bool, strategy: Strategy) -> tuple[int, bool]:
        """Bin-pack's and spread's measure: the free room of the pod's main resource (column), less what is being
        released (unless bin-packing inside consolidation's simulation, `releasing_free`)."""
        return (R_GPU if gpu_pod else R_CPU), not (self._releasing_free and strategy == Strategy.binpack)

    def scores(self, p: int, candidates: np.ndarray, now_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tier score, fine score) per candidate; higher is better on both (what explain shows: the fine score
        folds keys' k2 and k3 into k1's fraction, which orders the candidates the same)."""
        tier, k1, k2, k3 = self.keys(p, candidates, now_ok)
        if self._strategy(p) != Strategy.fgd or not len(candidates):
            return tier, k1
        return tier, k1 + 0.5 * tie_score(k2, k3, self._gpu_pod(p))

    def best(self, p: int, candidates: np.ndarray, now_ok: np.ndarray, ok: np.ndarray) -> int:
        """Index (into candidates) of the best node among those with ok; -1 when none."""
        idx = np.nonzero(ok)[0]
        if len(idx) == 0:
            return -1
        keys = self.keys(p, candidates[idx], now_ok[idx])
        return int(idx[lex_best(keys, None, self.name_rank[candidates[idx]])])

    # -- devices -----------------------------------------------------------------------------------------------
    def devices_for(self, p: int, n: int, pipelined: bool) -> tuple[int, ...]:
        st, sess = self.sess.state, self.sess
        a, b = int(sess.dev_start[n]), int(sess.dev_start[n + 1])
        whole = int(st.pod_gpu_whole[p])
        if whole:
            idle = (sess.dev_held[a:b] + sess.dev_rel[a:b]) == 0
            future = sess.dev_held[a:b] == 0
            order = np.concatenate([np.nonzero(idle)[0], np.nonzero(future & ~idle)[0]]) if pipelined \
                else np.nonzero(idle)[0]
            return tuple(int(a + d) for d in order[:whole])
        if not (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]):
            return ()
        per = int(self.per_device(p, np.array([n]))[0])
        used_now = sess.dev_held[a:b] + sess.dev_rel[a:b]
        used = sess.dev_held[a:b] if pipelined else used_now
        fits = np.nonzero(DEV - used >= per)[0]
        # the order's measure: how full a shared device is; one whose pods are all being released is a whole GPU
        # being released (KAI's fully released GPU group), as empty as an idle one
        used_now = np.where(sess.dev_held[a:b] > 0, used_now, 0)
        strategy = self._strategy(p)
        if strategy == Strategy.fgd and int(st.pod_gpu_ndev[p]) == 1 and len(fits):
            # the device FgdScorer.score reads: least fill cost growth, then least fragmentation growth, then the
            # fullest (those that hold it only once releases finish last)
            free = (DEV - (sess.dev_held[a:b] + sess.dev_rel[a:b])[fits]).astype(np.int64)
            now = free >= per
            score = fgd_score(self.fgd.device_growth(p, n, a + fits))
            key = np.where(now, share_key(self.fgd.target.fill_cost, np.where(now, free, per), np.full(len(fits), per),
                                          score), NO_DEVICE)
            order = fits[np.lexsort((fits, -used_now[fits], -key))]
        elif strategy != Strategy.spread:  # the fullest device that fits; already shared ones first
            order = fits[np.lexsort((fits, -used_now[fits]))]
        else:
            order = fits[np.lexsort((fits, used_now[fits]))]
        return tuple(int(a + d) for d in order[: int(st.pod_gpu_ndev[p])])

    # -- one pod -------------------------------------------------------------------------------------------------
    def choose(self, p: int, mask: np.ndarray | None = None, *, allow_pipeline: bool = True,
               exclude: int = -1) -> Choice | None:
        again = self._same_node_again(p, mask, allow_pipeline, exclude)
        if again is not None:
            return again
        choice = self._choose(p, mask, allow_pipeline=allow_pipeline, exclude=exclude)
        self._last = None
        if choice is not None and exclude < 0 and self._strategy(p) == Strategy.binpack:
            self._last = (self._shape(p), mask, allow_pipeline, choice.node, choice.pipelined, self.sess.caches.version,
                          self.topology_score)
        return choice

    def _prefilter(self, p: int, candidates: np.ndarray) -> np.ndarray:
        """Drop nodes that cannot hold p even once releases finish, by its scarcest resource (whole GPUs, a GPU
        share, else CPU): cheap, and it leaves few nodes for the full fit."""
        st, sess = self.sess.state, self.sess
        whole = int(st.pod_gpu_whole[p])
        if whole:
            return candidates[sess.whole_future[candidates] >= whole]
        if st.pod_gpu_frac[p]:
            return candidates[sess.max_future[candidates] >= int(st.pod_gpu_frac[p])]
        cpu = int(st.pod_req[p, R_CPU])
        if cpu > 0:
            return candidates[sess.alloc[candidates, R_CPU] - sess.held[candidates, R_CPU] >= cpu]
        return candidates

    def _shape(self, p: int) -> tuple[Any, ...] | None:
        """Pods with equal shapes are interchangeable for placement (None: this pod is not, it has pod
        (anti-)affinity, which depends on where other pods are)."""
        st = self.sess.state
        pod = st.pods[p]
        if pod.pod_affinity or pod.pod_anti_affinity:
            return None
        return (int(st.pod_sig[p]), st.pod_req[p].tobytes(), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]),
                int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p]), int(st.pod_pg[p]))

    def _same_node_again(self, p: int, mask: np.ndarray | None, allow_pipeline: bool,
                         exclude: int) -> Choice | None:
        """Bin-packing shortcut, exact: right after an equal pod was placed on node n (the only change since),
        n scores at least as well as before (less free, sharing tier only rises, others unchanged), so it is
        the choice again if it still fits the same way (bind vs pipeline)."""
        last = self._last
        if last is None or exclude >= 0 or self.sess.caches.version != last[5] + 1:
            return None
        shape, last_mask, last_pipe_ok, n, was_pipelined, _, last_topo = last
        if last_mask is not mask or last_pipe_ok != allow_pipeline or shape is None or shape != self._shape(p) \
                or last_topo is not self.topology_score:
            return None
        one = np.array([n], dtype=np.int64)
        if not len(self._prefilter(p, one)):  # (most misses: n is full now; the prefilter says so cheaply)
            return None
        now_ok, future_ok = self.fit(p, one)
        same_way = (not now_ok[0] and future_ok[0]) if was_pipelined else now_ok[0]
        if not same_way:
            return None
        pipelined = was_pipelined
        devices = self.devices_for(p, n, pipelined)
        if not pipelined and self._shares(p) and any(self.sess.dev_piped[d] > 0 for d in devices):
            pipelined = True
        self._last = (shape, mask, allow_pipeline, n, was_pipelined, self.sess.caches.version, last_topo)
        return Choice(n, pipelined, devices)

    def _choose(self, p: int, mask: np.ndarray | None = None, *, allow_pipeline: bool = True,
                exclude: int = -1) -> Choice | None:
        kept = self.kept_keys(p, allow_pipeline) if mask is None and exclude < 0 else None
        picked = kept.best(self.name_rank) if kept is not None else self._fresh_best(p, mask, allow_pipeline, exclude)
        if picked is None:
            return None
        n, now = picked
        pipelined = not now
        devices = self.devices_for(p, n, pipelined)
        if not pipelined and self._shares(p) and any(self.sess.dev_piped[d] > 0 for d in devices):
            pipelined = True  # joining a shared device whose reservation is still waiting: wait with it (KAI)
        return Choice(n, pipelined, devices)

    def _fresh_best(self, p: int, mask: np.ndarray | None, allow_pipeline: bool,
                    exclude: int) -> tuple[int, bool] | None:
        """The best node for p and whether it fits now, every candidate judged and scored now."""
        candidates = np.nonzero(self.static_mask(int(self.sess.state.pod_sig[p])) if mask is None
                                else self.static_mask(int(self.sess.state.pod_sig[p])) & mask)[0]
        if exclude >= 0:
            candidates = candidates[candidates != exclude]
        memo = self.fit_memo(p) if len(candidates) >= FIT_MEMO_MIN else None
        candidates = candidates[memo.future[candidates]] if memo is not None else self._prefilter(p, candidates)
        if len(candidates) == 0:
            return None
        now_ok, future_ok = self.filter(p, candidates)
        ok = future_ok if allow_pipeline else now_ok
        i = self.best(p, candidates, now_ok, ok)
        if i < 0:
            return None
        return int(candidates[i]), bool(now_ok[i])

    def rank_key(self, p: int, allow_pipeline: bool) -> tuple[object, ...] | None:
        """What a choice over every node p's signature allows depends on besides the nodes' own state: pods with
        equal keys rank the nodes alike (None: p's choice also depends on other pods or on its own preferences)."""
        st = self.sess.state
        pod = st.pods[p]
        if pod.pod_affinity or pod.pod_anti_affinity or pod.node_affinity_preferred:
            return None
        return (int(st.pod_sig[p]), st.pod_req[p].tobytes(), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]),
                int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p]), allow_pipeline, self._releasing_free)

    def kept_keys(self, p: int, allow_pipeline: bool) -> _Ranked | None:
        """The verdicts and keys over every node p's signature allows, kept for p's rank_key and brought up to
        date: only the nodes the session touched since are judged and scored again (every key depends on its node
        alone); its best is _fresh_best's choice. None when p has no rank key or too few candidates."""
        key = self.rank_key(p, allow_pipeline)
        if key is None:
            return None
        caches = self.sess.caches
        kept = self._ranked.pop(key, None)
        changed = None if kept is None or kept.topology is not self.topology_score \
            else caches.changed_since(kept.seen, self.n)
        if kept is None or changed is None:  # (new, another topology score, or many changes: made whole)
            nodes = np.flatnonzero(self.static_mask(int(self.sess.state.pod_sig[p])))
            if len(nodes) < RANK_MIN:
                return None
            kept = _Ranked(nodes, self.topology_score, len(caches.touched))
            self._judge(p, kept, None, allow_pipeline)
            while len(self._ranked) >= RANK_SHAPES:
                del self._ranked[next(iter(self._ranked))]
        elif len(changed):
            at = np.minimum(np.searchsorted(kept.nodes, changed), len(kept.nodes) - 1)
            self._judge(p, kept, at[kept.nodes[at] == changed], allow_pipeline)
            kept.seen = len(caches.touched)
        self._ranked[key] = kept
        return kept

    def _judge(self, p: int, kept: _Ranked, at: np.ndarray | None, allow_pipeline: bool) -> None:
        """Judge and score p on kept's nodes at positions `at` (None: every position, as masks)."""
        if at is not None and not len(at):
            return
        nodes = kept.nodes if at is None else kept.nodes[at]
        kept.judged(at)
        if JUDGE.wanted() and self._judge_compiled(p, kept, at, nodes, allow_pipeline):
            return
        now_ok, future_ok = self.filter(p, nodes)
        ok = future_ok if allow_pipeline else now_ok
        kept.now[slice(None) if at is None else at] = now_ok
        kept.keys[0][~ok if at is None else at[~ok]] = NO_NODE
        if ok.any():
            where = ok if at is None else at[ok]
            for have, fresh in zip(kept.keys, self.keys(p, nodes[ok], now_ok[ok]), strict=True):
                have[where] = fresh

    def _judge_compiled(self, p: int, kept: _Ranked, at: np.ndarray | None, nodes: np.ndarray,
                        allow_pipeline: bool) -> bool:
        """_judge by the compiled loops (placer_judge) for a pod without a GPU share; False: not judged here."""
        st, sess = self.sess.state, self.sess
        if self._shares(p):
            return False
        strategy = self._strategy(p)
        whole = int(st.pod_gpu_whole[p])
        ratio = 0.0
        if strategy == Strategy.fgd:
            fgd = self.fgd
            fgd._sync()
            model = fgd.model
            frag: tuple[np.ndarray, ...] = (fgd.cnt, fgd.below, fgd.free, fgd.cpu, fgd.frag, fgd.access,
                                            model.level_of, model.t_num, model.t_cpu, model.p)
            code, col, minus_rel, ratio = FGD, 0, False, fgd.cpu_per_milli
        else:
            frag = NO_FGD
            code = BINPACK if strategy == Strategy.binpack else SPREAD
            col, minus_rel = self._free_key(whole > 0, strategy)
        pos = np.arange(len(kept.nodes)) if at is None else at
        topo = NO_TOPOLOGY if self.topology_score is None else self.topology_score
        return bool(JUDGE(pos, nodes, allow_pipeline, self.requested_cols(p), st.pod_req[p], whole, sess.alloc,
                          sess.held, sess.rel, sess.whole_idle, sess.whole_future, self.has_gpu, topo, code, col,
                          minus_rel, *frag, ratio, kept.now, *kept.keys))

    def _shares(self, p: int) -> bool:
        st = self.sess.state
        return bool(st.pod_gpu_frac[p] or st.pod_gpu_mem[p])


def fgd_score(growth: np.ndarray) -> np.ndarray:
    """FGD's score of a fragmentation growth (milli-GPU), as the paper's simulator: int(100 * sigmoid(-growth /
    1000)), so growths within a few tens of milli-GPUs tie and bin-packing decides between them (why not exact
    growths: docs/DESIGN-NOTES.md, "FGD scoring"). inf: 0."""
    return np.floor(100.0 / (1.0 + np.exp(np.clip(growth, -1e5, 1e5) / 1000.0)))


Keys = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # Placer.keys: (tier, k1, k2, k3) per candidate
RANK_MIN = 64  # candidates from which a pod shape's keys over them are kept across placements (Placer.kept_keys)
RANK_SHAPES = 64  # rank keys kept at most (5 arrays over the signature's nodes each)


class _Ranked:
    """One rank key's verdicts and keys over every node its signature allows (sorted node indexes), as of `seen`
    entries of the session's touched list, under one topology score.

    Its best is read without a pass over every node (the keys of a few nodes change between reads: those the
    session touched): `top` holds the TOP_KEEP best positions when last ranked, best first, and `changed` the
    positions judged since. Every position outside `top` ranked below all of `top` then, so while one position of
    `top` is unchanged, the best is the better of the first such and the changed positions."""

    __slots__ = ("changed", "changed_at", "keys", "nodes", "now", "rank", "seen", "top", "topology")

    def __init__(self, nodes: np.ndarray, topology: np.ndarray | None, seen: int) -> None:
        self.nodes, self.topology, self.seen = nodes, topology, seen
        self.now = np.zeros(len(nodes), dtype=bool)  # fits now (not only once releases finish)
        # the tier of a node that may not take the pod (now, or once releases finish if allowed) is NO_NODE
        self.keys: Keys = (np.full(len(nodes), NO_NODE, dtype=np.int64), np.zeros(len(nodes)),
                           np.zeros(len(nodes)), np.zeros(len(nodes)))
        self.top: np.ndarray | None = None  # (None: not ranked since the keys were made)
        self.changed = np.zeros(len(nodes), dtype=bool)
        self.changed_at: list[int] = []  # the positions set in `changed`, listed: a read scans no mask
        self.rank: tuple[np.ndarray, np.ndarray] | None = None  # (the name rank given to best, it at self.nodes)

    def judged(self, at: np.ndarray | None) -> None:
        """The keys at positions `at` (None: every position) are set afresh."""
        if at is None:
            self.top = None  # (ranked anew)
        elif self.top is not None:
            fresh = at[~self.changed[at]]
            self.changed[fresh] = True
            self.changed_at.extend(fresh.tolist())

    def best(self, name_rank: np.ndarray) -> tuple[int, bool] | None:
        """The best node by the kept keys, and whether it fits now; None: no node may take the pod."""
        if self.rank is None or self.rank[0] is not name_rank:
            self.rank = (name_rank, name_rank[self.nodes])
        i = self._best(self.rank[1])
        if self.keys[0][i] == NO_NODE:  # (the best tier is the highest)
            return None
        return int(self.nodes[i]), bool(self.now[i])

    def _best(self, rank: np.ndarray) -> int:
        """lex_best over every position, from `top` and the positions changed since (ranked again when every
        position of `top` changed, or more than CHANGED_MAX positions did)."""
        top = self.top
        if top is not None:
            kept = top[~self.changed[top]]
            changed = self.changed_at
            if len(kept) and len(changed) <= CHANGED_MAX:  # (lex_best's pick does not depend on the order)
                return lex_best(self.keys, np.array([int(kept[0]), *changed], dtype=np.int64), rank)
        self.top = lex_top(self.keys, rank, TOP_KEEP)
        self.changed[self.changed_at] = False
        self.changed_at.clear()
        return int(self.top[0])


TOP_KEEP = 32  # positions _Ranked keeps in rank order (each read after a placement usually changes the first)
CHANGED_MAX = 1024  # changed positions from which _Ranked ranks every position again


def lex_best(keys: Keys, idx: np.ndarray | None, rank: np.ndarray) -> int:
    """Of positions `idx` (non-empty; None: all) into the key arrays, the one with the highest keys in order,
    then the lowest `rank` (the node-name rank, aligned with the keys)."""
    first = keys[0] if idx is None else keys[0][idx]
    hit = np.flatnonzero(first == first.max())
    idx = hit if idx is None else idx[hit]
    for key in keys[1:]:
        if len(idx) == 1:
            break
        k = key[idx]
        idx = idx[k == k.max()]
    return int(idx[np.argmin(rank[idx])]) if len(idx) > 1 else int(idx[0])


def lex_top(keys: Keys, rank: np.ndarray, k: int) -> np.ndarray:
    """The positions of the k best (every position when fewer), best first, in lex_best's order: the highest keys
    in order, then the lowest `rank` (distinct). Key by key, only the positions that may still be among the k
    best are read: those at the key's k-th highest value among them are tied, those above it are in, those below
    out."""
    cand = np.arange(len(rank))
    sure: list[np.ndarray] = []  # positions known to be in, key by key
    need = k
    for j, col in enumerate((*keys, -rank)):
        if len(cand) <= need:
            break
        v = col if j == 0 else col[cand]  # (the first key: every position)
        tied = v == v.max()
        if int(np.count_nonzero(tied)) < need:  # (else the k-th highest is the highest: nothing is in yet)
            kth = np.partition(v, len(v) - need)[len(v) - need]
            above = v > kth
            sure.append(cand[above])
            need -= len(sure[-1])
            tied = v == kth
        cand = cand[tied]
    chosen = np.concatenate([*sure, cand])
    # ascending by the keys in order, then by -rank: reversed, lex_best's order
    order = np.lexsort((-rank[chosen], *(key[chosen] for key in reversed(keys))))[::-1]
    return chosen[order]


def tie_score(k2: np.ndarray, k3: np.ndarray, gpu_pod: bool) -> np.ndarray:
    """FGD's tie keys (FgdScorer.tie_keys) as one score in [0, 1] over the candidates, ordering them as the keys
    do: a GPU pod's k2 is minus its CPU/GPU imbalance; a CPU-only pod's k2 minus its free GPUs (whole milli-GPUs)
    and k3 minus its CPU left (below one milli-GPU's step)."""
    if gpu_pod:
        off = -k2
        span = float(off.max() - off.min())
        return (off.max() - off) / span if span > 0 else np.zeros(len(off))
    gpu, cpu = -k2, -k3
    return 1.0 - (gpu + 0.001 * cpu / (np.abs(cpu).max() + 1.0)) / (gpu.max() + 1.0)


NO_DEVICE = -1e12  # FgdScorer.score of a node none of whose devices holds the share now


def share_key(fill_cost: np.ndarray, a: np.ndarray, d: np.ndarray, score: np.ndarray) -> np.ndarray:
    """A GPU share d going onto a device with free share a: least growth of the device's fill cost (in FILL_UNIT
    steps), then the highest FGD score, then the least share left, as one number (higher better; exact in
    float64: every part is a small integer)."""
    step = np.floor_divide(fill_cost[a - d] - fill_cost[a], FILL_UNIT)
    return -step * 1e7 + score * 1e4 - (a - d)


GROWTH_SHAPES = 4096  # pod shapes whose growths FgdScorer remembers (N floats each); others are computed each time


def growth_key(st: ClusterState, p: int) -> tuple[int, ...]:
    """What FgdScorer.growth reads of pod p: its CPU, whole GPUs, GPU share (fraction or memory) and devices."""
    return (int(st.pod_req[p, R_CPU]), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]), int(st.pod_gpu_mem[p]),
            int(st.pod_gpu_ndev[p]))


class FgdTarget:
    """FGD's target workload of one cycle's state: the shapes (CPU, per-device GPU share, device count, scheduling
    signature) of our pods, running and pending, the most popular covering 95% of them (`model`), the nodes each
    shape may use (`access`: its signature allows them, and they have GPUs), and the workload's CPU per milli-GPU.
    The same for every session of the state; `start`: every node's statistics (FgdScorer's) before any change."""

    __slots__ = ("access", "cpu_per_milli", "fill_cost", "model", "start")

    def __init__(self, placer: NodeFilter) -> None:
        st = placer.sess.state
        pods = np.nonzero(st.pod_ours & np.isin(st.pod_status, (PodStatus.PENDING, PodStatus.BOUND,
                                                                PodStatus.PIPELINED)))[0]
        num, milli = pod_gpu_shape(st, pods)
        cpu = st.pod_req[pods, R_CPU].astype(np.int64)
        sig = st.pod_sig[pods].astype(np.int64)
        if len(pods):
            counts, shapes = popular_rows(np.stack([cpu, milli.astype(np.int64), num.astype(np.int64), sig],
                                                   axis=1), TYPICAL_COVERAGE)
            weight = counts.astype(np.float64)
            weight /= weight.sum()
        else:
            shapes, weight = np.zeros((0, 4), dtype=np.int64), np.zeros(0)
        self.model = FragModel(shapes[:, 0], shapes[:, 1], shapes[:, 2], weight)
        gpu_w = weight * (shapes[:, 1] * shapes[:, 2])
        # CPU per milli-GPU the target workload's GPU shapes ask for (the tie rule's balance)
        self.cpu_per_milli = float((weight * shapes[:, 0])[gpu_w > 0].sum() / gpu_w.sum()) if gpu_w.sum() else 0.0
        # per free share of a device, what the workload's common share sizes cannot fill (a GPU share's first key)
        self.fill_cost = share_fill_cost(shapes[:, 1], shapes[:, 2], weight)
        access = np.zeros((st.n_nodes, len(weight)), dtype=bool)
        for m, (g, s) in enumerate(zip(self.model.gpu_shape.tolist(), shapes[:, 3].tolist(), strict=True)):
            if g:
                access[:, m] = placer.static_mask(int(s)) & placer.has_gpu
        access.setflags(write=False)
        self.access = access
        self.start: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def imbalance(self, cpu: np.ndarray, free: np.ndarray) -> np.ndarray:
        """Per node, |free CPU - ratio x free GPU share| / ratio (milli-GPU), ratio the workload's CPU per milli-GPU
        (0 without GPU shapes): GPUs the node's CPU cannot feed, or CPU its GPUs do not need."""
        r = self.cpu_per_milli
        if r <= 0:
            return np.zeros(len(cpu))
        return np.abs(cpu - r * free) / r

    def measure(self, cpu: np.ndarray, free: np.ndarray, cnt: np.ndarray, below: np.ndarray,
                dev_free: np.ndarray, has_gpu: np.ndarray) -> float:
        """What FGD scoring lowers, summed over a cluster state (milli-GPU): every node's expected fragmentation,
        BALANCE x the imbalance of the nodes with GPUs, and every device's share fill cost. FgdScorer scores a
        placement by the growth of the same terms; the CP-SAT engine's tie-break between plans (packing.py)
        compares their totals."""
        model = self.model
        total = float(model.expected(model.frag(cpu, free, cnt, below, self.access)).sum())
        total += BALANCE * float(self.imbalance(cpu[has_gpu], free[has_gpu]).sum())
        return total + float(self.fill_cost[np.clip(dev_free, 0, DEV).astype(np.int64)].sum())


# the last state's FGD target, with a weak reference to the state it was made from (not kept alive for it: a
# reference that still resolves to the state is that state)
_last_target: list[tuple[weakref.ref[ClusterState], FgdTarget]] = []


def cached_fgd_target(state: ClusterState) -> FgdTarget | None:
    """The FGD target of `state` if one was made already (fgd_target)."""
    return _last_target[0][1] if _last_target and _last_target[0][0]() is state else None


def fgd_target(placer: NodeFilter) -> FgdTarget:
    """The FGD target of the placer's state, made once per state (the KAI-scored and FGD-scored plans of a cycle,
    and the fragmentation tie-break between them, share it)."""
    state = placer.sess.state
    target = cached_fgd_target(state)
    if target is None:
        target = FgdTarget(placer)
        _last_target[:] = [(weakref.ref(state), target)]
    return target


class FgdScorer:
    """FGD (Weng et al., ATC '23) over a session: the target workload is the shapes (CPU, per-device GPU share,
    device count, scheduling signature) of our pods in the cycle, running and pending, the most popular covering
    95% of them; a shape may use a node its signature allows. Per node the fragmentation statistics are cached
    and refreshed only for the nodes the session changed since the last call; a candidate then costs O(shapes)
    (O(devices x shapes) for a GPU share), vectorised over candidates. Free means free now (not counting
    resources still being released)."""

    def __init__(self, placer: Placer) -> None:
        # owned by its placer (Placer.fgd): a strong reference back would make the two, and the session they hold,
        # a reference cycle, freed only by the garbage collector walking all the session made
        self.placer = weakref.proxy(placer)
        self.sess = sess = placer.sess
        target = fgd_target(placer)
        self.model, self.access, self.cpu_per_milli = target.model, target.access, target.cpu_per_milli
        self.target = target
        n = sess.state.n_nodes
        self.cnt = np.zeros((n, len(self.model.levels)), dtype=np.int64)
        self.below = np.zeros_like(self.cnt)
        self.free = np.zeros(n, dtype=np.int64)
        self.cpu = np.zeros(n, dtype=np.int64)
        # per node and target shape, its fragmentation (milli-GPU, model.frag): a growth is the weighted sum of
        # the per-shape differences (`_frag_growth`), never a difference of two weighted sums
        self.frag = np.zeros((n, len(self.model.p)), dtype=np.int64)
        # pod shape (growth_key) -> its row of `_known`: each node's growth for that shape (nan: not known); a
        # node's column is dropped whenever its statistics are refreshed, so a gang's identical pods, and pods of
        # one shape across gangs, pay for the nodes that changed only
        self._growth: dict[tuple[int, ...], int] = {}
        self._known = np.full((0, n), np.nan)
        if sess.caches.touched or target.start is None:
            self._refresh(np.arange(n))
            if not sess.caches.touched:  # every session of the state starts from these statistics
                target.start = (self.cnt.copy(), self.below.copy(), self.free.copy(), self.cpu.copy(),
                                self.frag.copy())
        else:
            cnt, below, free, cpu, frag = target.start
            self.cnt, self.below, self.free, self.cpu, self.frag = (cnt.copy(), below.copy(), free.copy(), cpu.copy(),
                                                                    frag.copy())
        self._seen = len(sess.caches.touched)  # how much of sess.touched the cache reflects

    def _dev_free(self, dev: np.ndarray) -> np.ndarray:
        sess = self.sess
        return (DEV - sess.dev_held[dev] - sess.dev_rel[dev]).astype(np.int64)

    def _cpu_free(self, nodes: np.ndarray) -> np.ndarray:
        sess = self.sess
        return (sess.alloc[nodes, R_CPU] - sess.held[nodes, R_CPU] - sess.rel[nodes, R_CPU]).astype(np.int64)

    def _refresh(self, nodes: np.ndarray) -> None:
        if len(nodes) == 0:
            return
        if REFRESH.wanted():
            sess, model = self.sess, self.model
            if REFRESH(nodes, sess.dev_start, sess.dev_held, sess.dev_rel, sess.alloc, sess.held, sess.rel,
                       model.levels, model.level_of, model.t_num, model.t_cpu, self.access, self.cnt, self.below,
                       self.free, self.cpu, self.frag, self._known):
                return
        dev, owner = self.placer._devices_of(nodes)
        a = self._dev_free(dev)
        cnt, below = self.model.device_levels(a, owner, len(nodes))
        free = np.bincount(owner, weights=a, minlength=len(nodes)).astype(np.int64)[:len(nodes)]
        cpu = self._cpu_free(nodes)
        self.cnt[nodes], self.below[nodes], self.free[nodes], self.cpu[nodes] = cnt, below, free, cpu
        self.frag[nodes] = self.model.frag(cpu, free, cnt, below, self.access[nodes])
        self._known[:, nodes] = np.nan

    def _sync(self) -> None:
        """Bring the cache up to date: every change of node resources logs its node in sess.caches.touched."""
        touched = self.sess.caches.touched
        if len(touched) == self._seen:
            return
        if len(touched) < self._seen:  # the log was reset: recompute all
            self._refresh(np.arange(self.sess.state.n_nodes))
        else:
            self._refresh(self.sess.caches.touched_since(self._seen))
        self._seen = len(touched)

    def tie_keys(self, p: int, nodes: np.ndarray, gpu_pod: bool) -> tuple[np.ndarray, np.ndarray]:
        """(k2, k3) per candidate of equal FGD score, higher better, each from that node alone. A CPU-only pod:
        fewest free GPUs, then least free CPU. A GPU pod: the smallest |free CPU - ratio x free GPU| after
        placement, ratio the target workload's CPU per milli-GPU, i.e. a node keeps CPU in proportion to the GPUs
        it keeps (k3 0)."""
        self._sync()
        st = self.sess.state
        cpu = (self.cpu[nodes] - int(st.pod_req[p, R_CPU])).astype(float)
        if not gpu_pod:
            return -self.free[nodes].astype(float), -cpu
        gpu = (self.free[nodes] - int(st.pod_req[p, R_GPU])).astype(float)
        return -np.abs(cpu - self.cpu_per_milli * gpu), np.zeros(len(nodes))

    def score(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """(C,) the first FGD key of pod p on each node, higher better (`_score_of`). Remembered per pod shape and
        node until the node changes (each node's value depends on that node and the shape alone)."""
        self._sync()
        key = growth_key(self.sess.state, p)
        row = self._growth.get(key)
        if row is None:
            if len(self._growth) >= GROWTH_SHAPES:
                return self._score_of(p, nodes)
            row = self._growth[key] = len(self._growth)
            if row == len(self._known):  # room for twice as many shapes
                more = np.full((max(8, row), self._known.shape[1]), np.nan)
                self._known = np.concatenate([self._known, more])
        known = self._known[row]
        got = known[nodes]
        miss = np.isnan(got)
        if miss.any():
            fresh = self._score_of(p, nodes[miss])
            known[nodes[miss]] = fresh
            got[miss] = fresh
        return got

    def _score_of(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """score, computed: FGD's score of the growth of the node's expected fragmentation plus BALANCE x the growth
        of its CPU/GPU imbalance (`_balance_growth`). A share on one device is scored on the device it would take
        (`devices_for`): least growth of the device's fill cost (in FILL_UNIT steps), then that score, then least
        share left on it, packed into one number."""
        st = self.sess.state
        if not (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]) or int(st.pod_gpu_ndev[p]) != 1:
            return fgd_score(self._growth_of(p, nodes))
        per = self.placer.per_device(p, nodes)
        cpu = self.cpu[nodes] - int(st.pod_req[p, R_CPU])
        dev, owner = self.placer._devices_of(nodes)
        a = self._dev_free(dev)
        ok = a >= per[owner]
        owner, a = owner[ok], a[ok]
        out = np.full(len(nodes), NO_DEVICE)
        if len(owner):
            # devices of one node with the same free share score the same: one row each
            _, first = np.unique(owner * (DEV + 1) + a, return_index=True)
            owner, a = owner[first], a[first]
            d = per[owner]
            growth = self._share_growth(nodes[owner], cpu[owner], a, d)
            growth += self._balance_growth(nodes, cpu, self.free[nodes] - per)[owner]
            np.maximum.at(out, owner, share_key(self.target.fill_cost, a, d, fgd_score(growth)))
        return out

    def _frag_growth(self, nodes: np.ndarray, after: np.ndarray) -> np.ndarray:
        """How much each node's expected fragmentation grows from its kept per-shape fragmentation to `after`
        (rows aligned with `nodes`): the differences first, then their weighted sum (as FGD's simulator), so a
        placement that changes no shape's fragmentation grows it by exactly 0. Two weighted sums each made in a
        batch of another size may differ in the last bits (BLAS sums in blocks), and fgd_score's step between 50
        and 49 is at 0."""
        return self.model.expected(after - self.frag[nodes])

    def _balance_growth(self, nodes: np.ndarray, cpu_after: np.ndarray, free_after: np.ndarray) -> np.ndarray:
        """BALANCE x how much a node's CPU/GPU imbalance (FgdTarget.imbalance) grows, after against before: a GPU
        pod that leaves a node with GPUs its CPU cannot feed, or CPU its free GPUs do not need, strands what is
        left."""
        imbalance = self.target.imbalance
        return BALANCE * (imbalance(cpu_after, free_after) - imbalance(self.cpu[nodes], self.free[nodes]))

    def _growth_of(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """The growth of each node's expected fragmentation (milli-GPU) when pod p, no one-device share
        (`_score_of` scores those), goes there, plus the balance term for a GPU pod (shares on several devices:
        each onto the node's tightest fitting device)."""
        st, model = self.sess.state, self.model
        x = int(st.pod_req[p, R_CPU])
        cpu = self.cpu[nodes] - x
        whole = int(st.pod_gpu_whole[p])
        if not (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]):
            cnt = self.cnt[nodes] - whole
            after = model.frag(cpu, self.free[nodes] - whole * DEV, cnt, self.below[nodes], self.access[nodes])
            growth = self._frag_growth(nodes, after)
            return growth + self._balance_growth(nodes, cpu, self.free[nodes] - whole * DEV) if whole else growth
        per = self.placer.per_device(p, nodes)
        ndev = int(st.pod_gpu_ndev[p])
        # several shares: each on the tightest device that holds it (approximation)
        return self._multi_share_growth(nodes, cpu, per, ndev) + self._balance_growth(nodes, cpu,
                                                                                      self.free[nodes] - per * ndev)

    def _share_growth(self, nodes: np.ndarray, cpu: np.ndarray, a: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Growth per (node, device of free share a) when a share d goes onto that device."""
        model = self.model
        cnt, below = model.step(self.cnt[nodes], self.below[nodes], model.levels, a, a - d)
        after = model.frag(cpu, self.free[nodes] - d, cnt, below, self.access[nodes])
        return self._frag_growth(nodes, after)

    def _multi_share_growth(self, nodes: np.ndarray, cpu: np.ndarray, per: np.ndarray, ndev: int) -> np.ndarray:
        model = self.model
        cnt, below, free = self.cnt[nodes].copy(), self.below[nodes].copy(), self.free[nodes].copy()
        dev, owner = self.placer._devices_of(nodes)
        a = self._dev_free(dev)
        key = np.where(a >= per[owner], a, DEV + 1)
        order = np.lexsort((key, owner))  # per node, tightest fitting device first
        first = np.searchsorted(owner[order], np.arange(len(nodes)))
        counts = np.bincount(owner, minlength=len(nodes))
        for j in range(ndev):
            has = counts > j
            pos = order[np.minimum(first + j, max(len(order) - 1, 0))] if len(order) else np.zeros(0, np.int64)
            take = has & (key[pos] <= DEV) if len(order) else has
            ai = np.where(take, a[pos], 0) if len(order) else np.zeros(len(nodes), np.int64)
            di = np.where(take, per, 0)
            c2, b2 = model.step(cnt, below, model.levels, ai, ai - di)
            cnt, below, free = c2, b2, free - di
        after = model.frag(cpu, free, cnt, below, self.access[nodes])
        return self._frag_growth(nodes, after)

    def device_growth(self, p: int, n: int, devices: np.ndarray) -> np.ndarray:
        """Growth of node n's expected fragmentation when pod p's share goes onto each of `devices` (global)."""
        self._sync()
        st = self.sess.state
        nodes = np.full(len(devices), n, dtype=np.int64)
        d = np.full(len(devices), int(self.placer.per_device(p, np.array([n]))[0]), dtype=np.int64)
        cpu = self.cpu[nodes] - int(st.pod_req[p, R_CPU])
        return self._share_growth(nodes, cpu, self._dev_free(devices), d)

