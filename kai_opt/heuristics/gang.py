"""Place one group's pods all-or-nothing: queue capacity first, then each pod on its best node, inside a
topology domain when the group (or a sub-group) requires one. Domains are tried bin-pack style (least free GPUs
that could hold the pods first); a preferred level is tried first and dropped when no domain fits, and its domain
order scores the nodes the pods are then spread over (kai_opt/heuristics/topology_score.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from kai_opt.fairshare.capacity import capacity_violation
from kai_opt.heuristics.nodefilter import format_fit_error
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import IS_ACTIVE, Session
from kai_opt.heuristics.topology_score import preferred_scores
from kai_opt.plan import Reason
from kai_opt.state import R_GPU

LISTED_DOMAINS = 16  # a required-topology failure lists every domain's count up to this many domains


@dataclass
class Attempt:
    ok: bool
    reasons: list[Reason] = field(default_factory=list)
    placed: list[int] = field(default_factory=list)
    any_pipelined: bool = False


def _domains(sess: Session, topo: int, level: int, mask: np.ndarray | None) -> list[tuple[str, np.ndarray, int]]:
    """(name, node mask, any node) of each domain at `level` that has nodes inside `mask`."""
    t = sess.state.topologies[topo]
    dom = t.domain[level]
    out = []
    for d, name in enumerate(t.domain_names[level]):
        m = dom == d
        if mask is not None:
            m &= mask
        idx = np.flatnonzero(m)
        if len(idx):
            out.append((name, m, int(idx[0])))
    return out


def _order_domains(sess: Session, topo: int, level: int, domains: list[tuple[str, np.ndarray, int]],
                   need_gpu: float, spread: bool, *, fitting_only: bool = False) -> list[tuple[str, np.ndarray]]:
    """Bin-pack from the top of the tree down: a domain's key is the free GPUs of its ancestor at each level
    (top first) and its own, fewest first (most first when spreading); domains that cannot hold the pods' GPUs
    (even once releases finish) last, or dropped with `fitting_only`."""
    t = sess.state.topologies[topo]
    future = (sess.alloc[:, R_GPU] - sess.held[:, R_GPU]).astype(float)
    free_at = []
    for lvl in range(level + 1):
        dom = t.domain[lvl]
        sums = np.zeros(len(t.domain_names[lvl]))
        ok = dom >= 0
        np.add.at(sums, dom[ok], future[ok])
        free_at.append(sums)
    scored = []
    for name, m, node in domains:
        own = float(future[m].sum())
        path = [free_at[lvl][t.domain[lvl][node]] for lvl in range(level)] + [own]
        key = tuple(-x if spread else x for x in path)
        short = own + 1e-9 < need_gpu
        if not (short and fitting_only):
            scored.append((short, key, name, m))
    scored.sort(key=lambda x: (x[0], x[1], x[2]))
    return [(name, m) for _, _, name, m in scored]


def _ordered_domains(sess: Session, topo: int, level: int, within: np.ndarray | None, need_gpu: float,
                     spread: bool, *, fitting_only: bool = False) -> list[tuple[str, int]]:
    """(name, domain id) in `_order_domains(_domains(...))` order, computed with per-domain sums instead of a
    node mask per domain: callers build a domain's mask (`_domain_mask`) only when they reach it."""
    t = sess.state.topologies[topo]
    dom = t.domain[level]
    n_dom = len(t.domain_names[level])
    future = (sess.alloc[:, R_GPU] - sess.held[:, R_GPU]).astype(float)
    sel = dom >= 0
    if within is not None:
        sel = sel & within
    idx = np.flatnonzero(sel)
    own = np.bincount(dom[idx], weights=future[idx], minlength=n_dom)
    first = np.full(n_dom, -1, dtype=np.int64)
    first[dom[idx][::-1]] = idx[::-1]
    present = np.flatnonzero(first >= 0)
    own_p = own[present]
    short = own_p + 1e-9 < need_gpu
    if fitting_only:
        present, own_p, short = present[~short], own_p[~short], short[~short]
    sign = -1.0 if spread else 1.0
    keys = [t.name_rank[level][present], sign * own_p]  # np.lexsort: the last key is the primary one
    for lvl in range(level - 1, -1, -1):
        d_l = t.domain[lvl]
        ok = d_l >= 0
        free = np.bincount(d_l[ok], weights=future[ok], minlength=len(t.domain_names[lvl]))
        keys.append(sign * free[d_l[first[present]]])
    keys.append(short)
    order = present[np.lexsort(keys)]
    names = t.domain_names[level]
    return [(names[d], d) for d in order.tolist()]


def _may_hold(sess: Session, topo: int, level: int, within: np.ndarray | None, tasks: list[int]) -> np.ndarray:
    """Per domain at `level`: whether its nodes (inside `within`) could hold `tasks` by what they have free once
    releases finish, summed: every resource the pods ask for, and for whole-GPU pods, for each size s, the nodes'
    free whole devices in groups of s against the pods of at least s. A necessary condition (a placement takes
    at least that much), so a domain without it is not tried."""
    st = sess.state
    t = st.topologies[topo]
    dom = t.domain[level]
    n_dom = len(t.domain_names[level])
    sel = dom >= 0 if within is None else (dom >= 0) & within
    idx = np.flatnonzero(sel)
    d = dom[idx]
    req = st.pod_req[np.asarray(tasks, dtype=np.int64)]
    need = req.sum(axis=0)
    ok = np.ones(n_dom, dtype=bool)
    free = sess.alloc[idx] - sess.held[idx]
    for r in np.flatnonzero(need > 0).tolist():
        room = np.bincount(d, weights=np.maximum(free[:, r], 0.0), minlength=n_dom)
        ok &= room + 1e-9 >= float(need[r])
    whole = st.pod_gpu_whole[np.asarray(tasks, dtype=np.int64)]
    devices = sess.whole_future[idx]
    for size in np.unique(whole[whole > 0]).tolist():
        ok &= np.bincount(d, weights=devices // size, minlength=n_dom) >= int((whole >= size).sum())
    return ok


def _holding(sess: Session, topo: int, level: int, within: np.ndarray | None, tasks: list[int],
             domains: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (name, id) of `domains`, in order, that _may_hold the tasks (a domain without it is not tried)."""
    if not domains:
        return domains
    holds = _may_hold(sess, topo, level, within, tasks)
    return [(name, d) for name, d in domains if holds[d]]


def _domain_mask(sess: Session, topo: int, level: int, d: int, within: np.ndarray | None) -> np.ndarray:
    m = sess.state.topologies[topo].domain[level] == d
    return m & within if within is not None else m


class GangPlacer:
    def __init__(self, sess: Session, placer: Placer) -> None:
        self.sess = sess
        self.placer = placer
        self._quiet_depth = 0  # > 0: attempts whose failure reasons nobody reads (domain trials)

    @contextmanager
    def _quiet(self, on: bool = True) -> Iterator[None]:
        self._quiet_depth += int(on)
        try:
            yield
        finally:
            self._quiet_depth -= int(on)

    @contextmanager
    def _scored(self, scores: np.ndarray | None) -> Iterator[None]:
        """The placer's topology tier is `scores` inside (the (sub)group's own), the enclosing one after."""
        outer = self.placer.topology_score
        self.placer.topology_score = scores
        try:
            yield
        finally:
            self.placer.topology_score = outer

    def place(self, g: int, tasks: list[int], *, allow_pipeline: bool = True,
              check_capacity: bool = True) -> Attempt:
        """Place `tasks` of group g (all or nothing). On failure the session is unchanged."""
        sess, st = self.sess, self.sess.state
        if check_capacity:
            q = int(st.pg_queue[g])
            req = sess.queue_request(tasks).sum(axis=0)
            v = capacity_violation(sess.fs, sess.ledger, q, req, preemptible=bool(st.pg_preemptible[g]))
            if v is not None:
                return Attempt(False, [Reason(v.reason, v.message(st.q_names), {
                    "queue": st.q_names[v.queue], "resource": v.resource, "bound": v.bound,
                    "current": v.current, "requested": v.requested, "job_queue": st.q_names[q],
                    "over_by": v.current + v.requested - v.bound})])
        topo, pref_lvl = int(st.pg_topology[g]), int(st.pg_preferred_level[g])
        # the group's preferred-level scores, over every node (KAI offers a job all nodes), for all its pods
        scores = preferred_scores(sess, topo, pref_lvl, tasks, None) if topo >= 0 and pref_lvl >= 0 else None
        with self._scored(scores):
            return self._place_topology(g, tasks, allow_pipeline)

    def _place_topology(self, g: int, tasks: list[int], allow_pipeline: bool) -> Attempt:
        """place() once the queue allows it: in each required domain in turn, else anywhere."""
        sess, st = self.sess, self.sess.state
        topo, req_lvl, pref_lvl = int(st.pg_topology[g]), int(st.pg_required_level[g]), int(st.pg_preferred_level[g])
        cp = sess.checkpoint()
        if topo >= 0 and req_lvl >= 0:
            need = float(st.pod_req[tasks, R_GPU].sum())
            per_domain = []
            fit: dict[str, int] = {}  # domain -> pods it could hold (details)
            within = self._active_domain(st.group_pods(g), topo, req_lvl)
            domains = _ordered_domains(sess, topo, req_lvl, within, need, self._spread(tasks))
            many = len(domains) > LISTED_DOMAINS  # large trees: skip (and count) domains short of GPUs
            ordered = _ordered_domains(sess, topo, req_lvl, within, need, self._spread(tasks), fitting_only=True) \
                if many else domains
            short = len(ordered)
            if many:  # and those that cannot hold the pods by their free resources summed (no attempt there works)
                ordered = _holding(sess, topo, req_lvl, within, tasks, ordered)
                short -= len(ordered)
            for name, d in ordered:
                m = _domain_mask(sess, topo, req_lvl, d, within)
                with self._quiet():
                    a = self._place_in(g, tasks, m, allow_pipeline, pref_lvl, topo)
                if a.ok:
                    sess.commit(cp)
                    return a
                per_domain.append(f"<{name}>: node-group {name} can allocate only {len(a.placed)} of "
                                  f"{len(tasks)} required pods.")
                fit[name] = len(a.placed)
                sess.rollback(cp)
            if len(ordered) + short < len(domains):
                per_domain.append(f"{len(domains) - len(ordered) - short} other domains have fewer than "
                                  f"{need / 1000:g} GPUs free.")
            if short:
                per_domain.append(f"{short} other domains lack the free whole GPUs, CPU, memory or pod slots "
                                  f"for its {len(tasks)} pods.")
            level = st.topologies[topo].levels[req_lvl]
            msg = "\n".join(["Unable to schedule podgroup.", *per_domain,
                             f"topology {st.topologies[topo].name}, requirement {level} couldn't be satisfied "
                             f"for job </{st.pg_keys[g].split('/', 1)[1]}>."])
            return Attempt(False, [Reason("TopologyUnsatisfied", msg, {"topology": st.topologies[topo].name,
                                                                        "level": level, "required": len(tasks),
                                                                        "domains": fit})])
        a = self._place_in(g, tasks, None, allow_pipeline, pref_lvl, topo)
        if a.ok:
            sess.commit(cp)
        else:
            sess.rollback(cp)
        return a

    def _active_domain(self, pods: np.ndarray, topo: int, level: int) -> np.ndarray | None:
        """Nodes of the domain that already-active (or moved) pods of the (sub)group sit in: the rest must join
        them."""
        sess = self.sess
        nodes = [int(sess.node[p]) for p in pods[IS_ACTIVE[sess.status[pods]]].tolist()]
        nodes += [sess.moves[p].node for p in pods.tolist() if p in sess.moves]  # re-placed by consolidation
        if not nodes:
            return None
        dom = sess.state.topologies[topo].domain[level]
        doms = set(int(dom[n]) for n in nodes)
        if len(doms) != 1 or -1 in doms:
            return np.zeros(sess.state.n_nodes, dtype=bool)  # already spread (or outside): no domain fits
        return dom == doms.pop()

    def required_domain(self, g: int) -> np.ndarray | None:
        """The nodes of the required-level domain g's active (or moved) pods sit in (all of g's pods must join
        them); None when none is fixed yet (or g has no required level)."""
        st = self.sess.state
        topo, lvl = int(st.pg_topology[g]), int(st.pg_required_level[g])
        if topo < 0 or lvl < 0:
            return None
        return self._active_domain(st.group_pods(g), topo, lvl)

    def some_domain_may_hold(self, g: int, tasks: list[int]) -> bool:
        """For a group with a required topology level: whether some domain it may still use (the one its active
        pods sit in, else any) _may_hold the tasks. A necessary condition of place() (True without a required
        level): place() puts all the tasks inside one such domain."""
        st = self.sess.state
        topo, lvl = int(st.pg_topology[g]), int(st.pg_required_level[g])
        if topo < 0 or lvl < 0:
            return True
        return bool(_may_hold(self.sess, topo, lvl, self.required_domain(g), tasks).any())

    def domain_for_move(self, p: int) -> np.ndarray | None:
        """Where a consolidated pod may be re-placed: inside the required domains its group's (and sub-group's)
        other active pods sit in."""
        st = self.sess.state
        g = int(st.pod_pg[p])
        mask: np.ndarray | None = None
        pods = st.group_pods(g)
        others = pods[pods != p]
        if st.pg_topology[g] >= 0 and st.pg_required_level[g] >= 0:
            mask = self._active_domain(others, int(st.pg_topology[g]), int(st.pg_required_level[g]))
        s = int(st.pod_sg[p])
        while s >= 0:
            if st.sg_topology[s] >= 0 and st.sg_required_level[s] >= 0:
                members = others[st.pod_sg[others] == s]
                m = self._active_domain(members, int(st.sg_topology[s]), int(st.sg_required_level[s]))
                if m is not None:
                    mask = m if mask is None else mask & m
            s = int(st.sg_parent[s])
        return mask

    def move_unit(self, unit: list[int], *, home: bool = False, within: np.ndarray | None = None) -> bool:
        """Re-place evicted pods of one group (a consolidation move, pipelined), all or nothing, each off its
        whole-GPU node (`home`: its own node allowed too), on `within` nodes (None: any), inside the required
        domains: those its group's active (or already moved) pods sit in, else each domain in bin-pack order. On
        failure the session is unchanged."""
        sess, st = self.sess, self.sess.state
        g = int(st.pod_pg[unit[0]])
        topo, lvl = int(st.pg_topology[g]), int(st.pg_required_level[g])
        outer: list[int | None] = [None]
        if topo >= 0 and lvl >= 0 and self.domain_for_move(unit[0]) is None:
            need = float(st.pod_req[unit, R_GPU].sum())
            outer = [d for _, d in _ordered_domains(sess, topo, lvl, None, need, self._spread(unit),
                                                    fitting_only=True)]
        for d in outer:
            domain = None if d is None else _domain_mask(sess, topo, lvl, d, within)
            if domain is None:
                domain = within
            cp = sess.checkpoint()
            for p in unit:
                mask = self.domain_for_move(p)
                if domain is not None:
                    mask = domain if mask is None else mask & domain
                away = int(sess.node[p]) if st.pod_gpu_whole[p] and not home else -1
                choice = self.placer.choose(p, mask, allow_pipeline=True, exclude=away)
                if choice is None:
                    break
                sess.place(p, choice.node, choice.devices, pipelined=True, moved=True)
            else:
                sess.commit(cp)
                return True
            sess.rollback(cp)
        return False

    def _spread(self, tasks: list[int]) -> bool:
        return self.sess.cfg.placement.gpu.value == "spread"

    def _place_in(self, g: int, tasks: list[int], mask: np.ndarray | None, allow_pipeline: bool, pref_lvl: int,
                  topo: int) -> Attempt:
        """Inside one domain (mask), with preferred-level domains tried first, then sub-group constraints."""
        sess = self.sess
        if topo >= 0 and pref_lvl >= 0:
            cp = sess.checkpoint()
            need = float(sess.state.pod_req[tasks, R_GPU].sum())
            levels = list(range(pref_lvl, -1, -1))  # the preferred level, then wider levels
            for lvl in levels:
                for _name, d in _holding(sess, topo, lvl, mask, tasks, _ordered_domains(
                        sess, topo, lvl, mask, need, self._spread(tasks), fitting_only=True)):
                    m = _domain_mask(sess, topo, lvl, d, mask)
                    with self._quiet():
                        a = self._place_subgroups(g, tasks, m, allow_pipeline)
                    if a.ok:
                        return a
                    sess.rollback(cp)
        return self._place_subgroups(g, tasks, mask, allow_pipeline)

    def _place_subgroups(self, g: int, tasks: list[int], mask: np.ndarray | None, allow_pipeline: bool) -> Attempt:
        sess, st = self.sess, self.sess.state
        constrained: dict[int, list[int]] = {}
        free: list[int] = []
        for p in tasks:
            s = int(st.pod_sg[p])
            while s >= 0 and st.sg_required_level[s] < 0 and st.sg_preferred_level[s] < 0:
                s = int(st.sg_parent[s])
            (constrained.setdefault(s, []) if s >= 0 else free).append(p)
        placed: list[int] = []
        any_pipe = False
        for s, pods in constrained.items():
            topo = int(st.sg_topology[s])
            if topo < 0:
                free.extend(pods)
                continue
            req_lvl, pref_lvl = int(st.sg_required_level[s]), int(st.sg_preferred_level[s])
            done = False
            need = float(st.pod_req[pods, R_GPU].sum())
            cp = sess.checkpoint()
            tries: list[tuple[int, int, np.ndarray | None]] = []  # (level, domain, within); level -1: within
            if req_lvl >= 0:
                fixed = self._active_domain(st.group_pods(g)[st.pod_sg[st.group_pods(g)] == s], topo, req_lvl) \
                    if s >= 0 else None
                within = mask if fixed is None else (fixed if mask is None else mask & fixed)
                tries = [(req_lvl, d, within) for _, d in _ordered_domains(sess, topo, req_lvl, within, need,
                                                                          self._spread(pods))]
            else:
                for lvl in range(pref_lvl, -1, -1):
                    tries += [(lvl, d, mask) for _, d in _holding(sess, topo, lvl, mask, pods, _ordered_domains(
                        sess, topo, lvl, mask, need, self._spread(pods), fitting_only=True))]
                tries.append((-1, -1, mask if mask is not None else np.ones(st.n_nodes, dtype=bool)))
            last = Attempt(False)
            # a preferred level scores the nodes the sub-group is offered (mask); else the group's scores hold
            scores = preferred_scores(sess, topo, pref_lvl, pods, mask) if pref_lvl >= 0 \
                else self.placer.topology_score
            for i, (lvl, d, within) in enumerate(tries):
                m = within if lvl < 0 else _domain_mask(sess, topo, lvl, d, within)
                with self._quiet(i < len(tries) - 1), self._scored(scores):  # only the last try's reasons count
                    a = self._place_pods(pods, m, allow_pipeline)
                if a.ok:
                    placed += a.placed
                    any_pipe |= a.any_pipelined
                    done = True
                    break
                last = a
                sess.rollback(cp)
            if not done:
                return Attempt(False, last.reasons, placed + last.placed)
        a = self._place_pods(free, mask, allow_pipeline)
        return Attempt(a.ok, a.reasons, placed + a.placed, any_pipe or a.any_pipelined)

    def _place_pods(self, pods: list[int], mask: np.ndarray | None, allow_pipeline: bool) -> Attempt:
        placed: list[int] = []
        any_pipe = False
        for p in pods:
            choice = self.placer.choose(p, mask, allow_pipeline=allow_pipeline)
            if choice is None:
                if self._quiet_depth:
                    return Attempt(False, [], placed, any_pipe)
                d = self.placer.diagnose(p, mask)
                return Attempt(False, [fit_reason(self.sess, p, placed, d.total, d.reasons)], placed, any_pipe)
            self.sess.place(p, choice.node, choice.devices, pipelined=choice.pipelined)
            placed.append(p)
            any_pipe |= choice.pipelined
        return Attempt(True, [], placed, any_pipe)


def fit_reason(sess: Session, p: int, placed: list[int], total: int, why: Counter[str]) -> Reason:
    st = sess.state
    g = int(st.pod_pg[p])
    m = int(st.pg_min_member[g]) if g >= 0 else 1
    text = format_fit_error(total, why)
    if m > 1:
        msg = (f"Resources were found for {len(placed)} pods while {m} are required for gang scheduling. "
               f"Additional pods cannot be scheduled due to: {text}")
    else:
        msg = f"Resources were not found for pod {st.pods[p].key} due to: {text}"
    details = {"nodes": total, "reasons": dict(why), "placed": len(placed), "required": m, "pod": st.pods[p].key}
    s = int(st.pod_sg[p])
    if s >= 0:  # the sub-group whose pods ran out of room (`placed` counts the pods placed in this call)
        details["subgroup"] = st.sg_names[s]
        details["subgroup_min_member"] = int(st.sg_min_member[s])
    return Reason("Unschedulable", msg, details)
