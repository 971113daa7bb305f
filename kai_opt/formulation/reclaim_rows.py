"""The reclaim rule's reclaimer side as CP-SAT rows (KAI's reclaimingQueuesRemainWithinBoundaries).

A reclaiming group j takes victim units; each is compared where the two queue paths diverge: j's side q against
the victim's side s, a sibling of q. `takes[j, s]` says j took some unit under s (a reclaim eviction needs one of
its reclaimers to take it). Then, per resource the reclaim involves (j requests it, or a unit under s frees it),
q once j is placed must stay within its fair share, or its saturation times the multiplier must stay strictly
below s's. The amounts are those the greedy's check sees at j's turn: A_q is q's allocation at that turn plus the
work of the groups ranked up to j, less the evictions under q; A_s is s's allocation at that turn plus the work
ranked up to j, less the evictions under s the greedy plan dates up to j's turn (the turn of the group it evicted
them for). Saturations are compared cross-multiplied by the two fair shares, constants of the cycle:
mult * F_s * A_q < F_q * A_s. A sibling with no fair share (0, or unlimited) never refuses, nor does an
unlimited fair share on j's side, as in KAI.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.fairshare.reclaim import EPS as RATIO_EPS
from kai_opt.fairshare.reclaim import leveled_many
from kai_opt.fairshare.share import UNLIMITED, FairShare
from kai_opt.formulation.exprs import Expr, lsum, wsum
from kai_opt.formulation.scope import Scope
from kai_opt.state import QR, ClusterState

EPS = 1e-6
LIMIT = 2**60  # |coefficient| x bound of a comparison row's terms: kept inside CP-SAT's int64 arithmetic


@dataclass
class QueueTerms:
    """What the model's queue rows share with the reclaim rows (integer amounts, model.QSCALE)."""

    scale: np.ndarray
    alloc: np.ndarray  # queue x resource: the model session's allocation
    qreqs: dict[int, np.ndarray]  # shape -> queue request of one of its pods
    totals: dict[int, Expr]  # shape -> its pods placed
    evicted: list[Expr]  # per victim unit: evicted (0/1)
    unit_amounts: list[np.ndarray]  # per victim unit: what it frees
    evicted_amount: Callable[[int, int], Expr]  # (queue, resource) -> freed under the queue by every eviction
    evicted_most: Callable[[int, int], int]  # its upper bound


@dataclass
class ReclaimRows:
    """The rows' variables, for the hint and the decoder."""

    uses: dict[int, cp_model.IntVar] = field(default_factory=dict)  # scope group -> it reclaims
    takes: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)  # (group, sibling queue)
    take_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (victim unit, group) -> its sibling queue
    # ranked-work running sums: (sum var, previous sum var | None, [(shape, coef)])
    derived: list[tuple[cp_model.IntVar, cp_model.IntVar | None, list[tuple[int, int]]]] = field(
        default_factory=list)
    defined: list[tuple[cp_model.IntVar, Expr]] = field(default_factory=list)  # var == expr, in definition order
    within: list[tuple[cp_model.IntVar, Expr, int]] = field(default_factory=list)  # literal -> expr <= cap


def late_work(st: ClusterState, scope: Scope, wanted: set[tuple[int, int]],
              scale: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """(queue, turn) -> what the excluded groups' fixed decisions of later turns added to the queue's allocation
    (scaled like the model's queue rows): the session holds it, the greedy's check at that turn did not."""
    anc = st.q_ancestors
    out = {k: np.zeros(3) for k in wanted}
    by_queue: dict[int, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for (q, turn), acc in out.items():
        by_queue[q].append((turn, acc))
    for t, leaf, amount in scope.late_work:
        for q in anc[leaf]:
            for turn, acc in by_queue.get(q, ()):
                if t > turn:
                    acc += amount
    return {k: np.round(v * scale).astype(np.int64) for k, v in out.items()}


class RankedWork:
    """Work placed under a queue by the scope groups ranked up to a turn: one running sum per (queue, resource),
    a variable only where a row reads it (the terms since the last one wait for the next)."""

    def __init__(self, m: cp_model.CpModel, st: ClusterState, scope: Scope, terms: QueueTerms,
                 rows: ReclaimRows) -> None:
        self.m, self.st, self.scope, self.terms, self.rows = m, st, scope, terms, rows
        self.per_group = [[(s, terms.qreqs[s].tolist(), len(scope.shapes[s].pods)) for s in g.shapes]
                          for g in scope.groups]
        self.under: dict[int, list[int]] = defaultdict(list)  # queue -> the scope groups under it, in rank order
        for i, g in enumerate(scope.groups):
            for q in st.q_ancestors[g.queue]:
                self.under[q].append(i)
        # (queue, r) -> (last sum variable, terms not in it yet, the most the sum can reach, groups of
        # under[queue] taken in)
        self.state: dict[tuple[int, int], tuple[cp_model.IntVar | None, list[tuple[int, int]], int, int]] = {}

    def advance(self, q: int, r: int, j: int) -> int:
        """Take in the groups ranked up to j; the most the sum can reach."""
        prev, pending, most, done = self.state.get((q, r), (None, [], 0, 0))
        under = self.under.get(q, [])
        while done < len(under) and under[done] <= j:
            for sh, qr, k in self.per_group[under[done]]:
                if int(qr[r]):
                    pending.append((sh, int(qr[r])))
                    most += int(qr[r]) * k
            done += 1
        self.state[(q, r)] = (prev, pending, most, done)
        return most

    def value(self, q: int, r: int, label: str) -> Expr:
        prev, pending, most, done = self.state[(q, r)]
        if pending:
            acc = self.m.new_int_var(0, most, f"ranked_work[{self.st.q_names[q]},{r},{label}]")
            self.m.add(acc == (prev if prev is not None else 0) + wsum([self.terms.totals[s] for s, _c in pending],
                                                                         [c for _s, c in pending]))
            self.rows.derived.append((acc, prev, pending))
            prev = acc
            self.state[(q, r)] = (prev, [], most, done)
        return prev if prev is not None else 0


class DatedEvictions:
    """What the evictions under a queue free up to a turn, each eviction dated by the turn of the group the greedy
    plan made it for (units it dates nowhere never count): one running sum per (queue, resource)."""

    def __init__(self, m: cp_model.CpModel, st: ClusterState, scope: Scope, terms: QueueTerms,
                 rows: ReclaimRows) -> None:
        self.m, self.st, self.terms, self.rows = m, st, terms, rows
        self.by_queue: dict[int, list[tuple[int, int]]] = defaultdict(list)  # queue -> [(turn, unit)] by turn
        for vi, v in enumerate(scope.victims):
            if v.greedy_for >= 0:
                for q in st.q_ancestors[int(st.pg_queue[v.group])]:
                    self.by_queue[q].append((scope.turn[v.greedy_for], vi))
        for units in self.by_queue.values():
            units.sort()
        self.state: dict[tuple[int, int], tuple[Expr, int, int]] = {}  # (queue, r) -> (sum, units in it, most)

    def upto(self, q: int, r: int, turn: int) -> tuple[Expr, int]:
        """(freed under q on resource r by the evictions dated up to `turn`, its upper bound); turns asked
        per (queue, resource) do not decrease."""
        total, used, most = self.state.get((q, r), (0, 0, 0))
        units = self.by_queue.get(q, [])
        new: list[tuple[int, int]] = []
        while used < len(units) and units[used][0] <= turn:
            vi = units[used][1]
            c = int(self.terms.unit_amounts[vi][r])
            if c:
                new.append((vi, c))
            used += 1
        if new:
            most += sum(c for _vi, c in new)
            x = self.m.new_int_var(0, most, f"evicted_by[{self.st.q_names[q]},{r},{turn}]")
            expr = total + wsum([self.terms.evicted[vi] for vi, _c in new], [c for _vi, c in new])
            self.m.add(x == expr)
            self.rows.defined.append((x, expr))
            total = x
        self.state[(q, r)] = (total, used, most)
        return total, most


def comparison(mult: float, f_sibling: float, f_mine: float, scale: float, bound_mine: int,
               bound_sibling: int) -> tuple[int, int, int] | None:
    """Integers (n, d, rhs) of the row n * A_q - d * A_s <= rhs: A_q's saturation times mult strictly below A_s's
    by more than the greedy's tolerance on ratios (mult * A_q / F_q < A_s / F_s - RATIO_EPS; the amounts are
    scaled by `scale`, the fair shares not). n / d = mult * F_s / F_q exactly when its terms fit, else rounded
    down to the largest denominator that does (the row then errs, by less than 1 / d, on the side of allowing);
    None when not even n alone fits (the row is left out: it allows)."""
    c = _ratio(mult, f_sibling, f_mine)
    if c.numerator * bound_mine + c.denominator * bound_sibling < LIMIT:
        n, d = c.numerator, c.denominator
    else:
        d = LIMIT // (math.ceil(c) * bound_mine + bound_sibling + 1)
        if d < 1:
            return None
        n = math.floor(c * d)
        g = math.gcd(n, d) or 1
        n, d = n // g, d // g
    tol = _tolerance(f_sibling, scale)  # n A_q - d A_s < -d * tol, integers (tol >= 0: floor by //)
    return n, d, -((d * tol.numerator) // tol.denominator) - 1


@functools.lru_cache(maxsize=4096)
def _ratio(mult: float, f_sibling: float, f_mine: float) -> Fraction:
    """mult * F_s / F_q exactly (the floats' own values)."""
    return Fraction(mult) * Fraction(f_sibling) / Fraction(f_mine)


@functools.lru_cache(maxsize=4096)
def _tolerance(f_sibling: float, scale: float) -> Fraction:
    """The greedy's tolerance on ratios, on the sibling's side of a scaled comparison row (times the row's d)."""
    return Fraction(RATIO_EPS) * Fraction(f_sibling) * Fraction(scale)


def _reclaim_pairs(st: ClusterState, paths: np.ndarray,
                   scope: Scope) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(victim unit, reclaimer, reclaimer side, sibling side) of every reclaim eviction a victim unit allows whose
    queue paths diverge (`leveled`), in victim order, then its beneficiaries' order."""
    units: list[int] = []
    reclaimers: list[int] = []
    for vi, v in enumerate(scope.victims):
        rf = v.reason_for
        js = [j for j in v.beneficiaries if rf[j] == "reclaim"]
        reclaimers.extend(js)
        units.extend([vi] * len(js))
    vis, bens = np.array(units, dtype=np.int64), np.array(reclaimers, dtype=np.int64)
    if not len(vis):
        return vis, bens, bens.copy(), bens.copy()
    queues = np.array([g.queue for g in scope.groups], dtype=np.int64)
    victim_q = st.pg_queue[np.array([v.group for v in scope.victims], dtype=np.int64)].astype(np.int64)
    qs, ss = leveled_many(paths, queues[bens], victim_q[vis])
    keep = qs != ss
    return vis[keep], bens[keep], qs[keep].astype(np.int64), ss[keep].astype(np.int64)


def reclaim_rows(m: cp_model.CpModel, st: ClusterState, fs: FairShare, paths: np.ndarray, scope: Scope,
                 terms: QueueTerms, gang: list[cp_model.IntVar], evict_rec: list[cp_model.IntVar],
                 mult: float) -> ReclaimRows:
    """Reclaim evictions only for a placed reclaimer that takes them, and its queue side within KAI's boundary
    rule against each sibling it takes from (the module docstring). `paths`: the queue path matrix
    (fairshare.reclaim.queue_paths)."""
    groups, victims = scope.groups, scope.victims
    rows = ReclaimRows()
    rec_groups = sorted({j for v in victims for j in v.beneficiaries if v.reason_for[j] == "reclaim"})
    for j in rec_groups:
        u = m.new_bool_var(f"reclaims[{st.pg_keys[groups[j].group]}]")
        m.add(u <= gang[j])
        rows.uses[j] = u
    # every (victim unit, reclaimer) pair a reclaim eviction allows whose queue paths diverge, with both sides
    vis, js, qs, ss = _reclaim_pairs(st, paths, scope)
    keys = js * max(1, st.n_queues) + ss
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")  # (group, sibling queue) keys in the order the pairs meet them
    kid = np.empty(len(uniq), dtype=np.int64)
    kid[by_first] = np.arange(len(uniq))
    pair_key = kid[inverse.reshape(-1)]  # each pair's key, numbered by first appearance
    at = first[by_first]
    key_j, key_s, key_q, key_unit = js[at].tolist(), ss[at].tolist(), qs[at].tolist(), vis[at].tolist()
    starts = np.searchsorted(vis, np.arange(len(victims) + 1)).tolist()
    pair_keys = pair_key.tolist()
    take_vars: list[cp_model.IntVar] = []
    for vi in range(len(victims)):  # a key's variable where its first pair is met, then the unit's row
        while len(take_vars) < len(key_j) and key_unit[len(take_vars)] == vi:
            k = len(take_vars)
            t = m.new_bool_var(f"takes[{st.pg_keys[groups[key_j[k]].group]},{st.q_names[key_s[k]]}]")
            m.add(t <= rows.uses[key_j[k]])
            take_vars.append(t)
        m.add(evict_rec[vi] <= lsum([take_vars[k] for k in pair_keys[starts[vi]:starts[vi + 1]]]))
    key_pairs = list(zip(key_j, key_s, strict=True))
    rows.takes = dict(zip(key_pairs, take_vars, strict=True))
    sides = dict(zip(key_pairs, key_q, strict=True))  # (group, sibling queue) -> the group's queue side q
    rows.take_of = dict(zip(zip(vis.tolist(), js.tolist(), strict=True), ss.tolist(), strict=True))
    frees = np.array(terms.unit_amounts, dtype=float).reshape(len(victims), len(QR)) > 0
    freed_by_key = np.zeros((len(key_pairs), frees.shape[1]), dtype=bool)
    np.logical_or.at(freed_by_key, pair_key, frees[vis])
    freed = dict(zip(key_pairs, freed_by_key, strict=True))  # (group, sibling queue) -> resources its units free
    wanted = {(x, scope.turn[j]) for (j, s), q in sides.items() for x in (q, s)}
    late = late_work(st, scope, wanted, terms.scale)
    work, dated = RankedWork(m, st, scope, terms, rows), DatedEvictions(m, st, scope, terms, rows)
    within: dict[tuple[int, int, int], cp_model.IntVar] = {}
    # the loop reads these per row: as Python numbers (the same values), not numpy scalars
    share, alloc, scale = fs.fair_share.tolist(), terms.alloc.tolist(), terms.scale.tolist()
    late_rows = {k: v.tolist() for k, v in late.items()}
    asks_of: dict[int, np.ndarray] = {}  # group -> the resources its pods request
    for (j, s) in sorted(sides, key=lambda k: (k[0], k[1])):  # rank order: the running sums only grow
        q, turn, label = sides[(j, s)], scope.turn[j], st.pg_keys[groups[j].group]
        asks = asks_of.get(j)
        if asks is None:
            asks = asks_of[j] = np.zeros(3, dtype=bool)
            for sh in groups[j].shapes:
                asks |= terms.qreqs[sh] > 0
        for r in np.flatnonzero(asks | freed[(j, s)]).tolist():
            f_mine, f_sib = share[q][r], share[s][r]
            if f_mine == UNLIMITED or f_sib <= 0:  # never refuses (a sibling's unlimited share is -1)
                continue
            cap = math.floor(f_mine * scale[r] * (1 + RATIO_EPS) + EPS)  # the greedy's ratio <= 1 + EPS
            at_q = int(alloc[q][r]) - int(late_rows[(q, turn)][r])
            most_q = work.advance(q, r, j)
            if at_q + most_q <= cap:  # q never ends over its fair share: nothing to compare
                continue
            mine = at_q + work.value(q, r, label) - terms.evicted_amount(q, r)
            if (j, q, r) not in within:
                w = m.new_bool_var(f"within[{st.q_names[q]},{r},{label}]")
                if isinstance(mine, int):  # over its fair share already, whatever the model decides
                    m.add(w == 0)
                else:
                    m.add(mine <= cap).only_enforce_if(w)
                within[(j, q, r)] = w
                rows.within.append((w, mine, cap))
            w, t = within[(j, q, r)], rows.takes[(j, s)]
            if f_mine == 0:  # any allocation is infinitely saturated
                m.add_implication(t, w)
                continue
            at_s = int(alloc[s][r]) - int(late_rows[(s, turn)][r])
            most_s = work.advance(s, r, j)
            gone, gone_most = dated.upto(s, r, turn)
            sibling = at_s + work.value(s, r, label) - gone
            row = comparison(mult, f_sib, f_mine, float(scale[r]),
                             abs(at_q) + most_q + terms.evicted_most(q, r), abs(at_s) + most_s + gone_most)
            if row is not None:
                n, d, rhs = row
                m.add(n * mine - d * sibling <= rhs).only_enforce_if([t, ~w])
    return rows
