"""Where one pod can go and which node is best (score), with GPU device choice.

Filter: kai_opt/heuristics/nodefilter.py (the Placer is a NodeFilter). Score, highest tier first as KAI does:
preferred node affinity, preferred topology domain (the group's order of preferred-level domains, set by the gang
placer: kai_opt/heuristics/topology_score.py), GPU sharing (a share joins an already shared device), availability
(fits now rather than after releases), resource type (CPU-only pods prefer CPU-only nodes), then bin-pack (fewest
free) or spread (most free) on the pod's main resource, or fgd (least growth of FGD's expected GPU fragmentation
against the session's pod shapes, scored int(100 * sigmoid(-growth / 1 GPU)) as FGD does; among equal scores a
CPU-only pod takes the node with the fewest free GPUs, a GPU pod the node whose free CPU stays closest to its free
GPUs times the workload's CPU per GPU), then node name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from kai_opt.config import Strategy
from kai_opt.heuristics.fragmentation import TYPICAL_COVERAGE, FragModel, pod_gpu_shape, popular_rows
from kai_opt.heuristics.nodefilter import FIT_MEMO_MIN, NodeFilter
from kai_opt.heuristics.session import DEV, Session
from kai_opt.state import R_CPU, R_GPU, ClusterState, PodStatus
from kai_opt.state.segments import concat_ranges

TIER_PREFERRED_AFFINITY = 100_000
TIER_GPU_SHARING = 1_000
TIER_AVAILABILITY = 100
TIER_RESOURCE_TYPE = 10


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
        starts = self.sess.dev_start[nodes]
        counts = self.sess.dev_start[nodes + 1] - starts
        owner = np.repeat(np.arange(len(nodes)), counts)
        dev, _ = concat_ranges(starts, counts)
        return dev, owner

    # -- scoring -------------------------------------------------------------------------------------------------
    def _strategy(self, p: int) -> Strategy:
        st = self.sess.state
        gpu = st.pod_gpu_whole[p] or st.pod_gpu_frac[p] or st.pod_gpu_mem[p]
        return self.sess.cfg.placement.gpu if gpu else self.sess.cfg.placement.cpu

    def scores(self, p: int, candidates: np.ndarray, now_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tier score, fine score) per candidate; higher is better on both."""
        st, sess = self.sess.state, self.sess
        tier = np.where(now_ok, TIER_AVAILABILITY, 0).astype(np.int64)
        gpu_pod = bool(st.pod_gpu_whole[p] or st.pod_gpu_frac[p] or st.pod_gpu_mem[p])
        if not gpu_pod:
            tier += np.where(self.has_gpu[candidates], 0, TIER_RESOURCE_TYPE)
        if st.pod_gpu_frac[p] or st.pod_gpu_mem[p]:
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
        col = R_GPU if gpu_pod else R_CPU
        strategy = self._strategy(p)
        free = sess.alloc[candidates, col] - sess.held[candidates, col]
        if not (self._releasing_free and strategy == Strategy.binpack):
            free = free - sess.rel[candidates, col]
        free = free.astype(float)
        if strategy == Strategy.fgd and len(candidates):
            # least fragmentation growth first, scored as FGD does; among equals (docs/DESIGN-NOTES.md, FGD scoring)
            # a CPU-only pod takes the node with the fewest free GPUs (then bin-packs CPU) and a GPU pod the node
            # whose free CPU stays closest to what its free GPUs need at the workload's CPU per GPU (then the node
            # order), so CPU is left where GPUs are left
            fine = fgd_score(self.fgd.growth(p, candidates)) + 0.5 * self.fgd.tie_score(p, candidates, gpu_pod)
        else:
            fine = -free if strategy == Strategy.binpack else free
        return tier, fine

    def best(self, p: int, candidates: np.ndarray, now_ok: np.ndarray, ok: np.ndarray) -> int:
        """Index (into candidates) of the best node among those with ok; -1 when none."""
        idx = np.nonzero(ok)[0]
        if len(idx) == 0:
            return -1
        tier, fine = self.scores(p, candidates[idx], now_ok[idx])
        top = tier == tier.max()
        idx, fine = idx[top], fine[top]
        top = fine == fine.max()
        idx = idx[top]
        if len(idx) > 1:
            return int(idx[np.argmin(self.name_rank[candidates[idx]])])  # (names are unique)
        return int(idx[0])

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
            # the device whose share grows the node's fragmentation least; the fullest among equals
            score = fgd_score(self.fgd.device_growth(p, n, a + fits))
            order = fits[np.lexsort((fits, -used_now[fits], -score))]
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
        now_ok, future_ok = self.fit(p, np.array([n], dtype=np.int64))
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
        n = int(candidates[i])
        pipelined = not bool(now_ok[i])
        devices = self.devices_for(p, n, pipelined)
        if not pipelined and self._shares(p) and any(self.sess.dev_piped[d] > 0 for d in devices):
            pipelined = True  # joining a shared device whose reservation is still waiting: wait with it (KAI)
        return Choice(n, pipelined, devices)

    def _shares(self, p: int) -> bool:
        st = self.sess.state
        return bool(st.pod_gpu_frac[p] or st.pod_gpu_mem[p])


def fgd_score(growth: np.ndarray) -> np.ndarray:
    """FGD's score of a fragmentation growth (milli-GPU), as the paper's simulator: int(100 * sigmoid(-growth /
    1000)), so growths within a few tens of milli-GPUs tie and bin-packing decides between them (why not exact
    growths: docs/DESIGN-NOTES.md, "FGD scoring"). inf: 0."""
    return np.floor(100.0 / (1.0 + np.exp(np.clip(growth, -1e5, 1e5) / 1000.0)))


GROWTH_SHAPES = 4096  # pod shapes whose growths FgdScorer remembers (N floats each); others are computed each time


def growth_key(st: ClusterState, p: int) -> tuple[int, ...]:
    """What FgdScorer.growth reads of pod p: its CPU, whole GPUs, GPU share (fraction or memory) and devices."""
    return (int(st.pod_req[p, R_CPU]), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]), int(st.pod_gpu_mem[p]),
            int(st.pod_gpu_ndev[p]))


class FgdScorer:
    """FGD (Weng et al., ATC '23) over a session: the target workload is the shapes (CPU, per-device GPU share,
    device count, scheduling signature) of our pods in the cycle, running and pending, the most popular covering
    95% of them; a shape may use a node its signature allows. Per node the fragmentation statistics are cached
    and refreshed only for the nodes the session changed since the last call; a candidate then costs O(shapes)
    (O(devices x shapes) for a GPU share), vectorised over candidates. Free means free now (not counting
    resources still being released)."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self.sess = sess = placer.sess
        st = sess.state
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
        n = st.n_nodes
        access = np.zeros((n, len(weight)), dtype=bool)
        for m, (g, s) in enumerate(zip(self.model.gpu_shape.tolist(), shapes[:, 3].tolist(), strict=True)):
            if g:
                access[:, m] = placer.static_mask(int(s)) & placer.has_gpu
        self.access = access
        self.cnt = np.zeros((n, len(self.model.levels)), dtype=np.int64)
        self.below = np.zeros_like(self.cnt)
        self.free = np.zeros(n, dtype=np.int64)
        self.cpu = np.zeros(n, dtype=np.int64)
        self.frag = np.zeros(n)
        # pod shape (growth_key) -> each node's growth for that shape (nan: not known); a node's entries are
        # dropped whenever its statistics are refreshed, so a gang's identical pods, and pods of one shape across
        # gangs, pay for the nodes that changed only
        self._growth: dict[tuple[int, ...], np.ndarray] = {}
        self._refresh(np.arange(n))
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
        dev, owner = self.placer._devices_of(nodes)
        a = self._dev_free(dev)
        cnt, below = self.model.device_levels(a, owner, len(nodes))
        free = np.bincount(owner, weights=a, minlength=len(nodes)).astype(np.int64)[:len(nodes)]
        cpu = self._cpu_free(nodes)
        self.cnt[nodes], self.below[nodes], self.free[nodes], self.cpu[nodes] = cnt, below, free, cpu
        self.frag[nodes] = self.model.expected(self.model.frag(cpu, free, cnt, below, self.access[nodes]))
        for known in self._growth.values():
            known[nodes] = np.nan

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

    def tie_score(self, p: int, nodes: np.ndarray, gpu_pod: bool) -> np.ndarray:
        """(C,) in [0, 1], higher better, for candidates of equal FGD score. A CPU-only pod: fewest free GPUs,
        then least free CPU. A GPU pod: the smallest |free CPU - ratio x free GPU| after placement, ratio the
        target workload's CPU per milli-GPU, i.e. a node keeps CPU in proportion to the GPUs it keeps."""
        self._sync()
        st = self.sess.state
        cpu = (self.cpu[nodes] - int(st.pod_req[p, R_CPU])).astype(float)
        if not gpu_pod:
            gpu = self.free[nodes].astype(float)
            return 1.0 - (gpu + 0.001 * cpu / (np.abs(cpu).max() + 1.0)) / (gpu.max() + 1.0)
        gpu = (self.free[nodes] - int(st.pod_req[p, R_GPU])).astype(float)
        off = np.abs(cpu - self.cpu_per_milli * gpu)
        span = float(off.max() - off.min())
        return (off.max() - off) / span if span > 0 else np.zeros(len(nodes))

    def growth(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """(C,) growth of each node's expected fragmentation (milli-GPU) when pod p goes there (a GPU share: onto
        the node's best device; inf where no device holds it now). Remembered per pod shape and node until the
        node changes (each node's value depends on that node and the shape alone)."""
        self._sync()
        key = growth_key(self.sess.state, p)
        known = self._growth.get(key)
        if known is None:
            if len(self._growth) >= GROWTH_SHAPES:
                return self._growth_of(p, nodes)
            known = self._growth[key] = np.full(self.sess.state.n_nodes, np.nan)
        got = known[nodes]
        miss = np.isnan(got)
        if miss.any():
            fresh = self._growth_of(p, nodes[miss])
            known[nodes[miss]] = fresh
            got[miss] = fresh
        return got

    def _growth_of(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """growth, computed."""
        st, model = self.sess.state, self.model
        x = int(st.pod_req[p, R_CPU])
        cpu = self.cpu[nodes] - x
        whole = int(st.pod_gpu_whole[p])
        if not (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]):
            cnt = self.cnt[nodes] - whole
            after = model.frag(cpu, self.free[nodes] - whole * DEV, cnt, self.below[nodes], self.access[nodes])
            return model.expected(after) - self.frag[nodes]
        per = self.placer.per_device(p, nodes)
        ndev = int(st.pod_gpu_ndev[p])
        if ndev != 1:  # several shares: each on the tightest device that holds it (approximation)
            return self._multi_share_growth(nodes, cpu, per, ndev)
        dev, owner = self.placer._devices_of(nodes)
        a = self._dev_free(dev)
        ok = a >= per[owner]
        owner, a = owner[ok], a[ok]
        out = np.full(len(nodes), np.inf)
        if len(owner):
            # devices of one node with the same free share grow it the same: one row each
            _, first = np.unique(owner * (DEV + 1) + a, return_index=True)
            owner, a = owner[first], a[first]
            np.minimum.at(out, owner, self._share_growth(nodes[owner], cpu[owner], a, per[owner]))
        return out

    def _share_growth(self, nodes: np.ndarray, cpu: np.ndarray, a: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Growth per (node, device of free share a) when a share d goes onto that device."""
        model = self.model
        cnt, below = model.step(self.cnt[nodes], self.below[nodes], model.levels, a, a - d)
        after = model.frag(cpu, self.free[nodes] - d, cnt, below, self.access[nodes])
        return model.expected(after) - self.frag[nodes]

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
        return model.expected(after) - self.frag[nodes]

    def device_growth(self, p: int, n: int, devices: np.ndarray) -> np.ndarray:
        """Growth of node n's expected fragmentation when pod p's share goes onto each of `devices` (global)."""
        self._sync()
        st = self.sess.state
        nodes = np.full(len(devices), n, dtype=np.int64)
        d = np.full(len(devices), int(self.placer.per_device(p, np.array([n]))[0]), dtype=np.int64)
        cpu = self.cpu[nodes] - int(st.pod_req[p, R_CPU])
        return self._share_growth(nodes, cpu, self._dev_free(devices), d)

