"""The inner loop of `victim_search: cheapest` (cheapest_victims): per pending task, the tightest node with room, else
the node where evicting the fewest GPUs of eligible victim units makes room, and those victims' groups evicted whole.

Two forms that take the same decisions (tests/test_victim_scan.py): `scan_numpy`, array operations per task (a few
dozen per task that finds no room, each over the units of the nodes whose prices changed), and `_scan_loops`, plain
loops that numba compiles (the approved dependency for an inner loop aggregation cannot make fast enough) once a
long-lived process asks for them (`kai_opt.compiled.compile_when_used()`); `scan` is whichever is in use.

Inputs (units sorted by node, then cost; `by_group[group_ptr[v]:group_ptr[v + 1]]` are group v's units): `reqs`
int64[T, C] the tasks' requests (C = the state's resources, then whole GPU devices), `feasible` bool[N], `room`
int64[N, C] and `live` bool[U] the units that may go (both may be changed), `unit_node`, `unit_group`, `frees`
int64[U, C] what a unit frees, `cost` int64[U] what evicting its group costs.
Returns (status, victim groups in the order taken): status FOUND (victims needed and found), NONE_NEEDED (every
task fits on room already free or being released) or NO_ROOM (some task finds no such node: victims meaningless).

`node_prices` (the same two forms) is the scan's price of one request on every node, which a search over topology
domains reads to estimate each domain's cost (cheapest_victims.required_domains).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kai_opt.compiled import Kernel, inner
from kai_opt.state.resources import R_GPU

FOUND, NONE_NEEDED, NO_ROOM = 0, 1, 2
BIG = np.int64(1) << 40

ScanFn = Callable[..., tuple[int, np.ndarray]]


class _Prices:
    """Per node holding live units, the cheapest way to make room for one request there: the units taken in node
    order (cheapest first) up to the first with which room + what they free covers the request, and the GPUs that
    costs. Kept per request and made again only for the nodes whose room or units changed since."""

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


def scan_numpy(reqs: np.ndarray, feasible: np.ndarray, room: np.ndarray, live: np.ndarray,
               unit_node: np.ndarray, unit_group: np.ndarray, frees: np.ndarray, cost: np.ndarray,
               group_ptr: np.ndarray, by_group: np.ndarray) -> tuple[int, np.ndarray]:
    """The reference, over arrays: the live units taken out, their prices kept per request (_Prices)."""
    take = np.flatnonzero(live)
    group, node, took = unit_group[take], unit_node[take], frees[take]
    prices = _Prices(node, took, cost[take], len(room))
    chosen: list[int] = []
    for req in reqs:
        need = req > 0
        now = feasible & (room[:, need] >= req[need]).all(axis=1)
        if now.any():  # room free or being released: the tightest such node (evicting nothing)
            fits = np.flatnonzero(now)
            n = int(fits[np.argmin(room[fits, R_GPU])])
        else:
            found = prices.best(room, req)
            if found is None:
                return NO_ROOM, np.zeros(0, dtype=np.int64)
            seg, last = found
            n = int(node[last])
            for j in range(int(prices.start[seg]), last + 1):
                if not prices.live[j]:
                    continue
                v = int(group[j])
                mine = np.flatnonzero(group == v)  # every unit of the group goes: a victim job is evicted whole
                np.add.at(room, node[mine], took[mine])
                prices.live[mine] = False
                prices.changed(node[mine])
                chosen.append(v)
        room[n] -= req
        prices.changed(np.array([n]))
    return (FOUND, np.array(chosen, dtype=np.int64)) if chosen else (NONE_NEEDED, np.zeros(0, dtype=np.int64))


@inner
def _fits(room: np.ndarray, req: np.ndarray) -> bool:
    """Room (one node's row) holds the request in every resource it asks for."""
    for k in range(len(req)):  # noqa: SIM110 (numba compiles loops, not generator expressions)
        if req[k] > 0 and room[k] < req[k]:
            return False
    return True


@inner
def _price(room: np.ndarray, req: np.ndarray, units: np.ndarray, a: int, b: int, live: np.ndarray,
           frees: np.ndarray, cost: np.ndarray, cum: np.ndarray) -> tuple[int, int]:
    """One node's price for req (its room `room`; its units units[a:b], cheapest first): the live units taken until
    room plus what they free covers the request, as (GPUs of their groups, the last unit taken), else (BIG, -1).
    `cum`: scratch of the row's width."""
    spent = 0
    for k in range(len(cum)):
        cum[k] = 0
    for i in range(a, b):
        j = units[i]
        if not live[j]:
            continue
        spent += cost[j]
        ok = True
        for k in range(len(cum)):
            cum[k] += frees[j, k]
            if req[k] > 0 and room[k] + cum[k] < req[k]:
                ok = False
        if ok:
            return spent, j
    return int(BIG), -1


def _scan_loops(reqs: np.ndarray, feasible: np.ndarray, room: np.ndarray, live: np.ndarray,
                unit_node: np.ndarray, unit_group: np.ndarray, frees: np.ndarray, cost: np.ndarray,
                group_ptr: np.ndarray, by_group: np.ndarray) -> tuple[int, np.ndarray]:
    """`scan` as plain loops (what numba compiles). A node's price for a request is kept until its room or units
    change or another request asks (a gang's tasks mostly ask alike)."""
    n_nodes, width = room.shape
    chosen = np.empty(len(live), dtype=np.int64)
    taken = 0
    cum = np.zeros(width, dtype=np.int64)
    # the live units, node by node: segment s is node seg_node[s], its units lu[seg_ptr[s]:seg_ptr[s + 1]]
    lu = np.flatnonzero(live)
    seg_node = np.empty(len(lu), dtype=np.int64)
    seg_ptr = np.empty(len(lu) + 1, dtype=np.int64)
    seg_of = np.full(n_nodes, -1, dtype=np.int64)
    n_seg = 0
    for i in range(len(lu)):
        n = unit_node[lu[i]]
        if n_seg == 0 or seg_node[n_seg - 1] != n:
            seg_node[n_seg], seg_ptr[n_seg], seg_of[n] = n, i, n_seg
            n_seg += 1
    seg_ptr[n_seg] = len(lu)
    price = np.full(n_seg, BIG, dtype=np.int64)
    last = np.full(n_seg, -1, dtype=np.int64)
    priced = np.zeros(width, dtype=np.int64)  # the request the prices are for
    have_prices = False
    stale = np.zeros(n_seg, dtype=np.bool_)
    stale_list = np.empty(n_seg, dtype=np.int64)
    n_stale = 0
    every = np.arange(n_seg)
    for t in range(reqs.shape[0]):
        req = reqs[t]
        best, best_gpu = -1, BIG
        for n in range(n_nodes):
            if feasible[n] and _fits(room[n], req) and room[n, R_GPU] < best_gpu:
                best, best_gpu = n, room[n, R_GPU]
        if best < 0:
            same = have_prices
            for k in range(width):
                if priced[k] != req[k]:
                    same = False
            todo = stale_list[:n_stale] if same else every
            for sg in todo:
                price[sg], last[sg] = _price(room[seg_node[sg]], req, lu, seg_ptr[sg], seg_ptr[sg + 1], live, frees,
                                             cost, cum)
            for i in range(n_stale):
                stale[stale_list[i]] = False
            n_stale = 0
            priced[:] = req
            have_prices = True
            best_price, best_seg = BIG, -1
            for sg in range(n_seg):
                if price[sg] < best_price:
                    best_seg, best_price = sg, price[sg]
            if best_seg >= 0:
                best = seg_node[best_seg]
            if best < 0:
                return NO_ROOM, chosen[:0]
            for i in range(seg_ptr[best_seg], seg_ptr[best_seg + 1]):
                j = lu[i]
                if j > last[best_seg]:
                    break
                if not live[j]:
                    continue
                v = unit_group[j]
                for m in range(group_ptr[v], group_ptr[v + 1]):
                    u = by_group[m]
                    if live[u]:
                        at = unit_node[u]
                        for k in range(width):
                            room[at, k] += frees[u, k]
                        live[u] = False
                        sa = seg_of[at]
                        if sa >= 0 and not stale[sa]:
                            stale[sa] = True
                            stale_list[n_stale] = sa
                            n_stale += 1
                chosen[taken] = v
                taken += 1
        for k in range(width):
            room[best, k] -= req[k]
        sb = seg_of[best]
        if sb >= 0 and not stale[sb]:
            stale[sb] = True
            stale_list[n_stale] = sb
            n_stale += 1
    return (FOUND if taken else NONE_NEEDED), chosen[:taken].copy()


SCAN = Kernel("victim scan", _scan_loops, scan_numpy)


def node_prices_numpy(req: np.ndarray, feasible: np.ndarray, room: np.ndarray, live: np.ndarray,
                      unit_node: np.ndarray, frees: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Per node, what making room for one request there costs (the scan's price: 0 with room already, the GPUs of
    the groups of its live units taken cheapest first until the request fits), BIG where it cannot be made (an
    infeasible node, or too little even with every live unit gone). The reference, over arrays (_Prices)."""
    need = req > 0
    now = feasible & (room[:, need] >= req[need]).all(axis=1)
    price = np.where(now, 0, BIG).astype(np.int64)
    take = np.flatnonzero(live)
    prices = _Prices(unit_node[take], frees[take], cost[take], len(room))
    if len(prices.start):
        _, made = prices._make(room, req, np.arange(len(prices.start)))
        at = unit_node[take][prices.start]
        price[at] = np.where(now[at] | ~feasible[at], price[at], made)
    return price


def _node_prices_loops(req: np.ndarray, feasible: np.ndarray, room: np.ndarray, live: np.ndarray,
                       unit_node: np.ndarray, frees: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """node_prices as plain loops (what numba compiles): one pass over the units, node by node."""
    n_nodes, width = room.shape
    price = np.full(n_nodes, BIG, dtype=np.int64)
    for n in range(n_nodes):
        if feasible[n] and _fits(room[n], req):
            price[n] = 0
    cum = np.zeros(width, dtype=np.int64)
    every = np.arange(len(live))
    i, n_units = 0, len(live)
    while i < n_units:
        n = unit_node[i]
        j = i
        while j < n_units and unit_node[j] == n:
            j += 1
        if feasible[n] and price[n] != 0:
            price[n] = _price(room[n], req, every, i, j, live, frees, cost, cum)[0]
        i = j
    return price


NODE_PRICES = Kernel("victim node prices", _node_prices_loops, node_prices_numpy)


def node_prices(*args: Any) -> np.ndarray:
    """node_prices_numpy's result, by the compiled loops once a long-lived process asked for them."""
    out: np.ndarray = NODE_PRICES(*args)
    return out


def scan(*args: Any) -> tuple[int, np.ndarray]:
    """The scan (module docstring): the compiled loops once a long-lived process asked for them
    (kai_opt.compiled), else the numpy form."""
    out: tuple[int, np.ndarray] = SCAN(*args)
    return out
