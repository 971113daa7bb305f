"""The greedy plan as a (complete where possible) solution hint for the model."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ortools.sat.python import cp_model, cp_model_helper

from kai_opt.formulation.model import Built, share_size
from kai_opt.formulation.scope import Scope
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan


def add_greedy_hint(built: Built, scope: Scope, greedy: Plan, sess: Session) -> None:
    """Hint every variable the greedy plan decides; written to the proto in one bulk call at the end (one
    add_hint call per variable was most of the hint's time)."""
    st = sess.state
    hint: dict[int, int] = {}  # variable index -> value
    shape_of = {p: s for s, shape in enumerate(scope.shapes) for p in shape.pods}
    counts: Counter[tuple[int, int]] = Counter()  # (pool, node) -> pods
    per_shape: Counter[int] = Counter()  # shape -> pods placed on its candidate nodes
    devices: Counter[tuple[Any, ...]] = Counter()
    whole: set[int] = set()
    for pl in greedy.placements:
        if pl.moved or pl.pod not in shape_of:
            continue
        s = shape_of[pl.pod]
        counts[(built.pool_of[s], pl.node)] += 1
        if (built.pool_of[s], pl.node) in built.place:
            per_shape[s] += 1
        base = int(st.dev_start[pl.node])
        for d in pl.devices:
            if scope.shapes[s].kind == "share":
                devices[(share_size(st, pl.pod, pl.node), base + d)] += 1
            else:
                whole.add(base + d)
    placed_groups = {int(st.pod_pg[p.pod]) for p in greedy.placements if not p.moved}
    for key, var in built.place.items():
        _set(hint, var, counts.get(key, 0))
    for i, g in enumerate(scope.groups):
        _set(hint, built.gang[i], int(g.group in placed_groups))
    for dev_key, var in built.on_device.items():
        _set(hint, var, devices.get(dev_key, 0))
    for d, var in built.whole_dev.items():
        _set(hint, var, int(d in whole))
    evicted = {e.pod: e.reason for e in greedy.evictions}
    gone = []
    for vi, v in enumerate(scope.victims):
        reasons = {evicted.get(p) for p in v.pods}
        _set(hint, built.evict_pre[vi], int("preempt" in reasons))
        _set(hint, built.evict_rec[vi], int("reclaim" in reasons and "preempt" not in reasons))
        gone.append(int(bool(reasons & {"preempt", "reclaim"})))
    for var, units in built.evicted_sums:
        _set(hint, var, sum(gone[vi] * c for vi, c in units))
    for s, var in built.placed.items():
        _set(hint, var, per_shape[s])
    if built.pool_total:
        pool_sums: defaultdict[int, int] = defaultdict(int)
        for (k, _n), place in built.place.items():
            pool_sums[k] += hint.get(place.index, 0)
        for pi, var in built.pool_total.items():
            _set(hint, var, pool_sums[pi])
    for var in built.move + list(built.moved_group.values()):  # the greedy's own moves are replayed already
        _set(hint, var, 0)
    if built.serving is not None:
        _set(hint, built.serving, int(any(scope.groups[j].group in placed_groups for j in scope.move_for)))
    sums: dict[int, int] = {}
    for var, prev, terms in built.derived:
        sums[var.index] = (sums[prev.index] if prev is not None else 0) + sum(per_shape[s] * c for s, c in terms)
        _set(hint, var, sums[var.index])
    reclaimers = {e.beneficiary for e in greedy.evictions if e.reason == "reclaim"} | {
        scope.groups[v.greedy_for].group for v in scope.victims
        if v.greedy_for >= 0 and v.reason_for[v.greedy_for] == "reclaim"}
    for i, var in built.reclaims.items():  # (a withdrawn beneficiary reclaims nothing: scope.victims' greedy_for)
        gi = scope.groups[i].group
        _set(hint, var, int(gi in reclaimers and gi in placed_groups))
    _reclaim_rule_hint(built, scope, hint)
    doms: defaultdict[int, set[int]] = defaultdict(set)  # group -> nodes the greedy plan placed it on
    for pl in greedy.placements:
        doms[int(st.pod_pg[pl.pod])].add(pl.node)
    for (i, d), var in built.domain.items():
        gs = scope.groups[i]
        dom = st.topologies[gs.topology].domain[gs.required_level]
        _set(hint, var, int(any(int(dom[n]) == d for n in doms.get(gs.group, set()))))
    sol = built.model.proto.solution_hint
    sol.vars.extend(hint.keys())
    sol.values.extend(hint.values())


def _reclaim_rule_hint(built: Built, scope: Scope, hint: dict[int, int]) -> None:
    """The reclaimer-side rule's variables: a group takes under the sibling queues of the units the greedy evicted
    for it, the dated eviction sums and the within-fair-share literals as the hinted amounts make them."""
    rows = built.reclaim_rows
    took = {(v.greedy_for, rows.take_of[(vi, v.greedy_for)]) for vi, v in enumerate(scope.victims)
            if hint.get(built.evict_rec[vi].index) and (vi, v.greedy_for) in rows.take_of}
    for key, var in rows.takes.items():
        _set(hint, var, int(key in took))
    for var, expr in rows.defined:
        _set(hint, var, _value(hint, expr))
    for var, expr, cap in rows.within:
        _set(hint, var, int(_value(hint, expr) <= cap))


def hinted_values(model: cp_model.CpModel, *exprs: Any) -> list[int | None]:
    """Linear expressions' values under the model's hint as it stands; None for one with a variable not hinted."""
    sol = model.proto.solution_hint
    hint = dict(zip(sol.vars, sol.values, strict=True))
    out: list[int | None] = []
    for expr in exprs:
        try:
            out.append(_value(hint, expr))
        except KeyError:
            out.append(None)
    return out


def _value(hint: dict[int, int], expr: Any) -> int:
    """A linear expression's value under the hint (its variables hinted already)."""
    if isinstance(expr, int):
        return expr
    flat = cp_model_helper.FlatIntExpr(expr)
    return int(flat.offset) + sum(int(c) * hint[v.index] for v, c in zip(flat.vars, flat.coeffs, strict=True))


def _set(hint: dict[int, int], var: cp_model.IntVar, value: int) -> None:
    hint[var.index] = int(value)


def _in_domain(x: int, dom: list[int]) -> bool:
    return any(dom[k] <= x <= dom[k + 1] for k in range(0, len(dom), 2))


def hint_violations(model: cp_model.CpModel) -> list[str]:
    """The model's constraints (and variable domains) the solution hint breaks, by variable names: the hint of a
    correct model built from the greedy plan breaks none. Constraints with an unhinted variable are skipped; the
    unhinted variables are listed first."""
    p = model.proto
    hint = dict(zip(p.solution_hint.vars, p.solution_hint.values, strict=True))
    names = [v.name for v in p.variables]
    out = [f"no hint for {names[i]}" for i in range(len(names)) if i not in hint and names[i]]

    def lit(x: int) -> int | None:
        if x >= 0:
            return hint.get(x)
        v = hint.get(-x - 1)
        return None if v is None else 1 - v

    def name(x: int) -> str:
        return names[x] if x >= 0 else f"not {names[-x - 1]}"

    for i, v in enumerate(p.variables):
        if i in hint and not _in_domain(hint[i], list(v.domain)):
            out.append(f"{names[i]} = {hint[i]} outside {list(v.domain)}")
    for c in p.constraints:
        enf = [lit(x) for x in c.enforcement_literal]
        if None in enf or 0 in enf:
            continue
        if c.has_bool_or() or c.has_bool_and():
            lits = list(c.bool_or.literals if c.has_bool_or() else c.bool_and.literals)
            vals = [lit(x) for x in lits]
            if None not in vals and not (any(vals) if c.has_bool_or() else all(vals)):
                kind = "at least one of" if c.has_bool_or() else "all of"
                out.append(f"{kind} {[name(x) for x in lits]} broken by the hint")
        elif c.has_linear():
            lin = c.linear
            if any(x not in hint for x in lin.vars):
                continue
            total = sum(k * hint[x] for x, k in zip(lin.vars, lin.coeffs, strict=True))
            if not _in_domain(total, list(lin.domain)):
                terms = " + ".join(f"{k}*{names[x]}({hint[x]})" for x, k in zip(lin.vars, lin.coeffs, strict=True))
                out.append(f"{terms} = {total} outside {list(lin.domain)}")
        else:
            out.append(f"unchecked constraint kind: {c}")
    return out
