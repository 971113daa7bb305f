"""Victims chosen by cost instead of KAI's victim search (config `victim_search: cheapest`).

KAI's search takes every eligible queue's victims in its victim order until the pending job fits, simulating up to
`max_victim_scenarios` scenarios; at 10,000 nodes that search is most of the cycle. Here each pod of the pending job
first goes where room is free or being released, else to the node where evicting the fewest GPUs of eligible victims
makes room (nodes shared between the pods); those victims are evicted, KAI's scenario simulation runs for the rules
that ask for it (victims whose jobs it would allocate first go back, and are left out of the next scenario), the gang
placer places the pods, victims whose room went unused go back, and the action's rules judge the victims that stay.
Every plan is one KAI's rules admit; the victims are not the ones KAI's victim order would take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kai_opt.fairshare.reclaim import queue_paths as reclaim_paths
from kai_opt.heuristics.gang import GangPlacer
from kai_opt.heuristics.session import Session, _read_only
from kai_opt.heuristics.status_watch import ActiveCounts
from kai_opt.heuristics.victims import (
    Outcome,
    ScenarioFilter,
    _keep_unneeded,
    _PendingOrder,
    _queue_capacity,
    _victims_ahead,
    victim_chunk_order,
)
from kai_opt.state import R_GPU, PodStatus

BIG = np.int64(1) << 40

VictimFilter = Callable[[np.ndarray], np.ndarray | None]  # victim groups -> which may go now (None: all)


@dataclass(frozen=True)
class VictimUnits:
    """The running pods of our groups at the cycle start, per (group, node): what they hold there and what evicting
    their group costs (all its GPUs); sorted by node, then cost."""

    group: np.ndarray  # int64[U]
    node: np.ndarray  # int64[U]
    frees: np.ndarray  # int64[U, R + 1]: what they hold there, then the whole GPU devices they hold there
    cost: np.ndarray  # int64[U]
    pods: np.ndarray  # int64[P']: the units' pods
    pod_unit: np.ndarray  # int64[P']: each of those pods' unit


def victim_units(sess: Session) -> VictimUnits:
    """Built once per session from the snapshot (a unit's pods are looked up live: evicted ones no longer count)."""
    return sess.static("victim_units", lambda: _victim_units(sess))


def _victim_units(sess: Session) -> VictimUnits:
    st = sess.state
    pods = np.flatnonzero((st.pod_pg >= 0) & (st.pod_node >= 0)
                          & ((st.pod_status == PodStatus.BOUND) | (st.pod_status == PodStatus.PIPELINED)))
    groups, nodes = st.pod_pg[pods].astype(np.int64), st.pod_node[pods].astype(np.int64)
    cost_of = np.bincount(groups, weights=st.pod_req[pods, R_GPU], minlength=st.n_groups).astype(np.int64)
    keys, pod_unit = np.unique(groups * len(st.node_names) + nodes, return_inverse=True)
    group, node = keys // len(st.node_names), keys % len(st.node_names)
    frees = np.zeros((len(keys), st.pod_req.shape[1] + 1), dtype=np.int64)
    np.add.at(frees[:, :-1], pod_unit, st.pod_req[pods])
    frees[:, -1] = np.bincount(pod_unit, weights=st.pod_gpu_whole[pods], minlength=len(keys)).astype(np.int64)
    cost = cost_of[group]
    order = np.lexsort((group, cost, node))
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return VictimUnits(group[order], node[order], frees[order], cost[order], pods, rank[pod_unit])


def _unit_counts(sess: Session, units: VictimUnits) -> ActiveCounts:
    """Active pods per victim unit (one per session): a unit with none left is no victim."""
    def make() -> ActiveCounts:
        index = np.full(len(sess.status), -1, dtype=np.int64)
        index[units.pods] = units.pod_unit
        return ActiveCounts(sess, index, len(units.group))

    return sess.static("victim_unit_counts", make)


def queue_paths(sess: Session) -> np.ndarray:
    """The session's queue path matrix (fairshare.reclaim.queue_paths), made once per session."""
    def make() -> np.ndarray:
        out = reclaim_paths(sess.ledger.ancestors)
        out.flags.writeable = False
        return out

    return sess.static("queue_paths", make)


class _Prices:
    """Per node holding victim units, the cheapest way to make room for one request there: the units taken in
    node order (cheapest first) up to the first with which room + what they free covers the request, and the GPUs
    that costs. Kept per request and made again only for the nodes whose room or units changed since."""

    def __init__(self, node: np.ndarray, frees: np.ndarray, cost: np.ndarray, n_nodes: int) -> None:
        self.node, self.frees, self.cost = node, frees, cost
        self.start = np.flatnonzero(np.r_[True, np.diff(node) != 0]) if len(node) else np.zeros(0, dtype=np.int64)
        self.end = np.r_[self.start[1:], len(node)].astype(np.int64)
        self.seg_of_node = np.full(n_nodes, -1, dtype=np.int64)
        self.seg_of_node[node[self.start]] = np.arange(len(self.start))
        self.live = np.ones(len(node), dtype=bool)
        # request bytes -> (last unit taken per segment or BIG, GPUs evicted per segment or BIG, stale segments)
        self.known: dict[bytes, tuple[np.ndarray, np.ndarray, set[int]]] = {}

    def best(self, room: np.ndarray, req: np.ndarray) -> tuple[int, int] | None:
        """(segment, its last unit) where making room for req evicts the fewest GPUs; None when nowhere."""
        if not len(self.start):
            return None
        key = req.tobytes()
        hit = self.known.get(key)
        if hit is None:
            segs = np.arange(len(self.start))
            last, price = self._make(room, req, segs)
            self.known[key] = (last, price, set())
        else:
            last, price, stale = hit
            if stale:
                segs = np.fromiter(stale, dtype=np.int64, count=len(stale))
                last[segs], price[segs] = self._make(room, req, segs)
                stale.clear()
        i = int(np.argmin(price))
        return None if price[i] >= BIG else (i, int(last[i]))

    def _make(self, room: np.ndarray, req: np.ndarray, segs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(segs) == len(self.start):  # every segment: the units as they are
            units, lens, local = np.arange(len(self.node)), self.end - self.start, self.start
        else:
            lens = self.end[segs] - self.start[segs]
            local = np.r_[0, np.cumsum(lens)[:-1]]
            units = np.repeat(self.start[segs] - local, lens) + np.arange(int(lens.sum()))
        if not len(units):
            return np.full(len(segs), BIG), np.full(len(segs), BIG)
        need = np.flatnonzero(req > 0)  # only the requested resources are compared
        live = self.live[units]
        cum = np.cumsum(self.frees[units][:, need] * live[:, None], axis=0)
        before = np.vstack([np.zeros((1, len(need)), dtype=np.int64), cum])[local]
        seg_of = np.repeat(np.arange(len(segs)), lens)
        after = room[self.node[units]][:, need] + cum - before[seg_of]
        enough = live & (after >= req[need]).all(axis=1)
        first = np.full(len(segs), BIG)
        has = lens > 0
        first[has] = np.minimum.reduceat(np.where(enough, np.arange(len(units)), BIG), local[has])
        spent = np.cumsum(np.where(live, self.cost[units], 0))
        found = first < BIG
        price = np.full(len(segs), BIG)
        price[found] = spent[first[found]] - np.r_[0, spent][local[found]]
        last = np.full(len(segs), BIG)
        last[found] = units[first[found]]
        return last, price

    def changed(self, nodes: np.ndarray) -> None:
        """The room or the units of these nodes changed: every request's prices there are stale."""
        segs = self.seg_of_node[nodes]
        segs = set(segs[segs >= 0].tolist())
        for _, _, stale in self.known.values():
            stale |= segs


def cheapest_victims(sess: Session, tasks: list[int], candidates: np.ndarray, feasible: np.ndarray,
                     victim_ok: VictimFilter | None = None) -> np.ndarray | None:
    """The victim groups (among `candidates`, and those `victim_ok` admits) that make room for every task, each on
    the node where that costs the fewest GPUs; empty when some task finds no such node; None when every task fits
    without evicting anything (the scenario then evicts nothing)."""
    st = sess.state
    units = victim_units(sess)
    alive = sess.memo("victim_units_alive", lambda: _unit_counts(sess, units).any_active(sess))
    wanted = np.zeros(st.n_groups, dtype=bool)
    allowed = victim_ok(candidates) if victim_ok is not None and len(candidates) else None
    wanted[candidates] = True if allowed is None else allowed
    take = np.flatnonzero(alive & wanted[units.group] & feasible[units.node])
    group, node = units.group[take], units.node[take]
    # what a unit frees: its resources, GPUs counted as whole devices (a whole-GPU task needs idle devices, which
    # milli-GPU sums spread over shared devices overstate)
    frees = units.frees[take]
    room = sess.memo("room_after_releases", lambda: _read_only(np.column_stack(
        [sess.alloc - sess.held, sess.whole_future]).astype(np.int64))).copy()  # once releases finish
    prices = _Prices(node, frees, units.cost[take], len(st.node_names))
    chosen: list[int] = []
    for t in tasks:
        req = np.append(st.pod_req[t], st.pod_gpu_whole[t]).astype(np.int64)
        if req[-1] > 0:
            req[R_GPU] = 0  # whole devices stand for the GPUs
        need = req > 0
        now = feasible & (room[:, need] >= req[need]).all(axis=1)
        if now.any():  # room free or being released: the tightest such node (evicting nothing)
            fits = np.flatnonzero(now)
            n = int(fits[np.argmin(room[fits, R_GPU])])
        else:
            found = prices.best(room, req)
            if found is None:
                return np.zeros(0, dtype=np.int64)
            seg, last = found
            n = int(node[last])
            for j in range(int(prices.start[seg]), last + 1):
                if not prices.live[j]:
                    continue
                v = int(group[j])
                mine = np.flatnonzero(group == v)  # every unit of the group goes: a victim job is evicted whole
                np.add.at(room, node[mine], frees[mine])
                prices.live[mine] = False
                prices.changed(node[mine])
                chosen.append(v)
        room[n] -= req
        prices.changed(np.array([n]))
    return np.array(chosen, dtype=np.int64) if chosen else None


def solve_cheapest(sess: Session, gang: GangPlacer, g: int, tasks: list[int], candidates: np.ndarray, reason: str,
                   rules: ScenarioFilter, *, feasible: np.ndarray,
                   victim_ok: VictimFilter | None = None) -> Outcome:
    """Scenarios over the cheapest victims instead of KAI's search: the cheapest victims (cheapest_victims) evicted,
    KAI's scenario simulation for rules that ask for it (victims whose jobs would be allocated first go back, and are
    left out of the next scenario), the tasks placed by the gang placer onto what is free or being released, then the
    action's rules on the victims that stay; at most `max_victim_scenarios` scenarios. The session is unchanged
    unless it returns ok."""
    ledger_before = sess.ledger.copy()
    order = sess.memo("pending_order", lambda: _PendingOrder(sess)) if rules.allocation_order else None
    pool = np.asarray(candidates, dtype=np.int64)
    limited = {a for a in sess.ledger.ancestors[int(sess.state.pg_queue[g])] if bool(np.any(sess.fs.limit[a] != -1))}
    why = "no victims the rules admit make room for every pod"
    for _ in range(max(1, sess.cfg.max_victim_scenarios)):
        few = cheapest_victims(sess, tasks, pool, feasible, victim_ok)
        if few is not None and not len(few):
            return Outcome(False, [], why)
        cp = sess.checkpoint()
        victims: list[int] = []
        back: set[int] = set()
        chunks: list[list[int]] = []
        if few is not None:
            chunks = [c for _, c in victim_chunk_order(sess, few)]
            sess.evict_many([p for c in chunks for p in c], reason, g)
            back = _victims_ahead(sess, g, chunks, order) if order is not None else set()
            victims = [p for i, c in enumerate(chunks) if i not in back for p in c]
        attempt = gang.place(g, tasks, allow_pipeline=True)
        if not attempt.ok:
            sess.rollback(cp)
            why = "the pods do not fit once the cheapest victims go"
            if not back:
                return Outcome(False, [], why)
            gone_back = {int(sess.state.pod_pg[chunks[i][0]]) for i in back}  # they come back first: not victims
            pool = pool[~np.isin(pool, list(gone_back))]
            continue
        scenario = [c for i, c in enumerate(chunks) if i not in back]
        if scenario:  # victims whose room the placement did not use go back (KAI's keep-unneeded step)
            kept = _keep_unneeded(sess, scenario, lambda: _queue_capacity(sess, g, tasks) is None, reason, g,
                                  limited)
            victims = kept if kept is not None else victims
        why_not = rules.precheck(sess, ledger_before, victims) if victims else None
        if why_not is None:
            moved = set(rules.replace_victims(sess, [victims])) if victims else set()
            victims = [p for p in victims if p not in moved]
            why_not = rules.validate(sess, ledger_before, victims)
        if why_not is not None:
            sess.rollback(cp)
            return Outcome(False, [], why_not)
        sess.convert_to_pipelined(attempt.placed)
        attempt.any_pipelined = True
        return Outcome(True, victims, None, attempt)
    return Outcome(False, [], why)
