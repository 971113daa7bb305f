"""Victims chosen by cost instead of KAI's victim search (config `victim_search: cheapest`).

KAI's search takes every eligible queue's victims in its victim order until the pending job fits, simulating up to
`max_victim_scenarios` scenarios; at 10,000 nodes that search is most of the cycle. Here each pod of the pending job
first goes where room is free or being released, else to the node where evicting the fewest GPUs of eligible victims
makes room (nodes shared between the pods); those victims are evicted, KAI's scenario simulation runs for the rules
that ask for it (victims whose jobs it would allocate first go back, and are left out of the next scenario), the gang
placer places the pods, victims whose room went unused go back, and the action's rules judge the victims that stay.
The scan's room is coarser than the placer's: when the pods fail on it with no victim given back, the next scenario
asks for whole devices for GPU shares, and then, for a group with a required topology level, looks in one domain at
a time (the cheapest of a few priced first). Every plan is one KAI's rules admit; the victims are not the ones KAI's
victim order would take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np

from kai_opt.fairshare.reclaim import queue_paths as reclaim_paths
from kai_opt.heuristics import victim_scan
from kai_opt.heuristics.gang import GangPlacer
from kai_opt.heuristics.session import Session
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
from kai_opt.state.segments import add_rows

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
    add_rows(frees[:, :-1], pod_unit, st.pod_req[pods])
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


def cheapest_victims(sess: Session, tasks: list[int], wanted: np.ndarray, feasible: np.ndarray, *,
                     whole_shares: bool = False) -> np.ndarray | None:
    """The victim groups (those `wanted`: wanted_groups) that make room for every task, each on the node where that
    costs the fewest GPUs; empty when some task finds no such node; None when every task fits without evicting
    anything (the scenario then evicts nothing). The scan itself: victim_scan.

    The scan counts a GPU share against its node's free milli-GPUs summed over the devices, which may be spread
    too thin for the share to fit on one. `whole_shares`: a share asks for whole free devices instead (as many as
    it spans), which always hold it."""
    return _scan(sess, tasks, _live_units(sess, victim_units(sess), wanted, feasible), feasible, whole_shares)


def _scan(sess: Session, tasks: list[int], live: np.ndarray, feasible: np.ndarray,
          whole_shares: bool) -> np.ndarray | None:
    """cheapest_victims over the live units given (the caller's: every one on a feasible node)."""
    units = victim_units(sess)
    index = _unit_index(sess, units)
    status, chosen = victim_scan.scan(_task_rows(sess, tasks, whole_shares), feasible, _room(sess).copy(), live,
                                      units.node, units.group, units.frees, units.cost, index.group_ptr,
                                      index.by_group)
    if status == victim_scan.NO_ROOM:
        return np.zeros(0, dtype=np.int64)
    return chosen if status == victim_scan.FOUND else None


def wanted_groups(sess: Session, candidates: np.ndarray, victim_ok: VictimFilter | None) -> np.ndarray:
    """bool[G]: the candidate victim groups the filter admits as the session stands (made once per search: every
    scenario of a search starts from the state it found)."""
    wanted = np.zeros(sess.state.n_groups, dtype=bool)
    allowed = victim_ok(candidates) if victim_ok is not None and len(candidates) else None
    wanted[candidates] = True if allowed is None else allowed
    return wanted


def _live_units(sess: Session, units: VictimUnits, wanted: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """Per victim unit: it still runs, its group is wanted, and its node is feasible."""
    alive = sess.memo("victim_units_alive", lambda: _unit_counts(sess, units).any_active(sess))
    return alive & wanted[units.group] & feasible[units.node]


def _room(sess: Session) -> np.ndarray:
    """Per node, its room once releases finish (shared: copy before changing it)."""
    return sess.static("room_after_releases", lambda: _Room(sess)).now(sess)


def _task_rows(sess: Session, tasks: list[int], whole_shares: bool) -> np.ndarray:
    """What each task needs, in the scan's columns: its resources, GPUs counted as whole devices for a whole-GPU
    task (it needs idle devices, which milli-GPU sums spread over shared devices overstate); with `whole_shares`,
    a GPU share too (cheapest_victims)."""
    st = sess.state
    reqs = np.column_stack([st.pod_req[tasks], st.pod_gpu_whole[tasks]]).astype(np.int64)
    reqs[reqs[:, -1] > 0, R_GPU] = 0
    if whole_shares:
        shares = (st.pod_gpu_frac[tasks] > 0) | (st.pod_gpu_mem[tasks] > 0)
        reqs[shares, R_GPU] = 0
        reqs[shares, -1] = np.maximum(st.pod_gpu_ndev[tasks][shares], 1)
    return reqs


def required_domains(sess: Session, gang: GangPlacer, g: int, tasks: list[int], wanted: np.ndarray,
                     feasible: np.ndarray, whole_shares: bool) -> Iterator[np.ndarray]:
    """For a group with a required topology level, where the scan over every node took victims the placer could
    not use in one domain: the feasible nodes of each domain at that level (only the one its active pods sit in,
    if any) that could hold the tasks with every eligible victim there gone, summed per resource the tasks ask for
    (a necessary condition), in the order of an estimate of what their victims cost (then the most room free), the
    cheapest of each few priced exactly first (_by_cost); each mask made when reached. Nothing for a group without
    a required level."""
    st = sess.state
    topo, level = int(st.pg_topology[g]), int(st.pg_required_level[g])
    if topo < 0 or level < 0:
        return iter(())
    dom = st.topologies[topo].domain[level]
    n_dom = len(st.topologies[topo].domain_names[level])
    within = gang.required_domain(g)
    nodes = np.flatnonzero(feasible & (dom >= 0) & (within if within is not None else True))
    if not len(nodes):
        return iter(())
    units = victim_units(sess)
    live = _live_units(sess, units, wanted, feasible)
    at = np.flatnonzero(live)
    at = at[dom[units.node[at]] >= 0]
    unit_dom, frees = dom[units.node[at]], units.frees[at]
    room = np.maximum(_room(sess)[nodes], 0)
    need = _task_rows(sess, tasks, whole_shares).sum(axis=0)
    ok = np.ones(n_dom, dtype=bool)
    for c in np.flatnonzero(need > 0).tolist():
        have = np.bincount(dom[nodes], weights=room[:, c], minlength=n_dom)
        have += np.bincount(unit_dom, weights=frees[:, c], minlength=n_dom)
        ok &= have >= need[c]
    main = -1 if need[-1] > 0 else R_GPU
    free = np.bincount(dom[nodes], weights=room[:, main], minlength=n_dom)
    estimate, first_fits = _domain_estimates(sess, units, live, tasks, whole_shares, feasible, nodes, dom[nodes],
                                             n_dom)
    order = np.flatnonzero(ok & first_fits)
    order = order[np.lexsort((order, -free[order], estimate[order]))]
    return _by_cost(sess, tasks, live, whole_shares, (feasible & (dom == d) for d in order.tolist()))


def _domain_estimates(sess: Session, units: VictimUnits, live: np.ndarray, tasks: list[int], whole_shares: bool,
                      feasible: np.ndarray, nodes: np.ndarray, dom: np.ndarray,
                      n_dom: int) -> tuple[np.ndarray, np.ndarray]:
    """Per domain, an estimate of what its victims cost: of its nodes (`nodes`, in domain `dom`), the prices of the
    first task's request (victim_scan.node_prices) summed over as many of the cheapest as there are tasks; and
    whether some node of it can take the first task at all (else the scan finds no room there: not tried)."""
    price = victim_scan.node_prices(_task_rows(sess, tasks[:1], whole_shares)[0], feasible, _room(sess), live,
                                    units.node, units.frees, units.cost)[nodes]
    o = np.lexsort((price, dom))
    d, p = dom[o], price[o]
    first = np.searchsorted(d, d, side="left")
    cheapest = np.arange(len(o)) - first < len(tasks)
    return (np.bincount(d[cheapest], weights=p[cheapest].astype(float), minlength=n_dom),
            np.bincount(dom, weights=price < victim_scan.BIG, minlength=n_dom) > 0)


DOMAIN_BATCH = 4  # domains whose victims the scan prices before the cheapest of them is tried


def _by_cost(sess: Session, tasks: list[int], live: np.ndarray, whole_shares: bool,
             masks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """`masks` taken DOMAIN_BATCH at a time, each batch in the order of what the scan's victims there cost (the
    GPUs of their groups; the batch's order among equals), less those where the scan finds no room; at most
    `max_victim_scenarios` batches (a search tries no more domains than it has scenarios). `live`: the live units
    on every node the masks may hold."""
    units = victim_units(sess)
    cost = sess.static("victim_group_cost", lambda: _group_cost(sess, units))
    for _ in range(max(1, sess.cfg.max_victim_scenarios)):
        batch = list(islice(masks, DOMAIN_BATCH))
        if not batch:
            return
        priced = []
        for i, m in enumerate(batch):
            few = _scan(sess, tasks, live & m[units.node], m, whole_shares)
            if few is None or len(few):
                priced.append((0 if few is None else int(cost[few].sum()), i))
        for _, i in sorted(priced):
            yield batch[i]


def _group_cost(sess: Session, units: VictimUnits) -> np.ndarray:
    out = np.zeros(sess.state.n_groups, dtype=np.int64)
    out[units.group] = units.cost
    out.flags.writeable = False
    return out


class _Room:
    """Per node, its room once releases finish (allocatable less held, then its whole free devices), kept up to
    date from the nodes the session touched since the last read (every change of a node's resources, an undo's
    too, logs it in `caches.touched`) instead of made again per session state (one per session)."""

    def __init__(self, sess: Session) -> None:
        self.seen = len(sess.caches.touched)
        self.rows = _room_rows(sess, slice(None))

    def now(self, sess: Session) -> np.ndarray:
        """The rows as the session stands (shared: callers copy before changing them)."""
        nodes = sess.caches.changed_since(self.seen, len(self.rows))
        if nodes is None:
            self.rows = _room_rows(sess, slice(None))  # (many changes: made whole)
        elif len(nodes):
            self.rows[nodes] = _room_rows(sess, nodes)
        self.seen = len(sess.caches.touched)
        return self.rows


def _room_rows(sess: Session, nodes: np.ndarray | slice) -> np.ndarray:
    return np.column_stack([sess.alloc[nodes] - sess.held[nodes], sess.whole_future[nodes]]).astype(np.int64)


@dataclass(frozen=True)
class _UnitIndex:
    group_ptr: np.ndarray  # group v's units: by_group[group_ptr[v]:group_ptr[v + 1]]
    by_group: np.ndarray


def _unit_index(sess: Session, units: VictimUnits) -> _UnitIndex:
    def make() -> _UnitIndex:
        st = sess.state
        by_group = np.argsort(units.group, kind="stable")
        return _UnitIndex(np.searchsorted(units.group[by_group], np.arange(st.n_groups + 1)).astype(np.int64),
                          by_group.astype(np.int64))

    return sess.static("victim_unit_index", make)


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
    pool = wanted_groups(sess, np.asarray(candidates, dtype=np.int64), victim_ok)
    limited = {a for a in sess.ledger.ancestors[int(sess.state.pg_queue[g])] if bool(np.any(sess.fs.limit[a] != -1))}
    why = "no victims the rules admit make room for every pod"
    # a scenario whose victims all come back leaves the session as this search found it, where placing is
    # deterministic: once that failed, it fails again
    failed_unchanged = False
    # once the pods failed on the scan's room with no victim given back, the next scenario asks more of the scan:
    # shares ask for whole devices (its sum over a node's devices may not hold them on one device), then a group
    # with a required topology level looks in one domain at a time (it took room anywhere)
    whole_shares = False
    shares = bool(((sess.state.pod_gpu_frac[tasks] > 0) | (sess.state.pod_gpu_mem[tasks] > 0)).any())
    domains: Iterator[np.ndarray] | None = None
    where = feasible
    for _ in range(max(1, sess.cfg.max_victim_scenarios)):
        few = cheapest_victims(sess, tasks, pool, where, whole_shares=whole_shares)
        if few is not None and not len(few):
            nxt = next(domains, None) if domains is not None else None
            if nxt is None:
                return Outcome(False, [], why)
            where = nxt
            continue
        cp = sess.checkpoint()
        victims: list[int] = []
        back: set[int] = set()
        chunks: list[list[int]] = []
        if few is not None:
            chunks = [c for _, c in victim_chunk_order(sess, few)]
            sess.evict_many([p for c in chunks for p in c], reason, g)
            back = _victims_ahead(sess, g, chunks, order) if order is not None else set()
            victims = [p for i, c in enumerate(chunks) if i not in back for p in c]
        unchanged = len(chunks) == len(back)
        attempt = None if unchanged and failed_unchanged else gang.place(g, tasks, allow_pipeline=True)
        if attempt is None or not attempt.ok:
            failed_unchanged |= unchanged
            sess.rollback(cp)
            why = "the pods do not fit once the cheapest victims go"
            if not back:
                if shares and not whole_shares:
                    whole_shares = True
                    continue
                if domains is None:
                    domains = required_domains(sess, gang, g, tasks, pool, feasible, whole_shares)
                nxt = next(domains, None)
                if nxt is None:
                    return Outcome(False, [], why)
                where = nxt
                continue
            gone_back = {int(sess.state.pod_pg[chunks[i][0]]) for i in back}  # they come back first: not victims
            pool[list(gone_back)] = False
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
