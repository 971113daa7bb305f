"""The greedy plan as a (complete where possible) solution hint for the model."""

from __future__ import annotations

from collections import Counter, defaultdict

from kai_opt.formulation.model import Built
from kai_opt.formulation.scope import Scope
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan


def add_greedy_hint(built: Built, scope: Scope, greedy: Plan, sess: Session) -> None:
    m = built.model
    st = sess.state
    shape_of = {p: s for s, shape in enumerate(scope.shapes) for p in shape.pods}
    counts: Counter[tuple[int, int]] = Counter()
    devices: Counter[tuple[int, int]] = Counter()
    whole: set[int] = set()
    for pl in greedy.placements:
        if pl.moved or pl.pod not in shape_of:
            continue
        s = shape_of[pl.pod]
        counts[(s, pl.node)] += 1
        base = int(st.dev_start[pl.node])
        for d in pl.devices:
            if scope.shapes[s].kind == "share":
                devices[(s, base + d)] += 1
            else:
                whole.add(base + d)
    placed_groups = {int(st.pod_pg[p.pod]) for p in greedy.placements if not p.moved}
    for key, var in built.place.items():
        m.add_hint(var, counts.get(key, 0))
    for i, g in enumerate(scope.groups):
        m.add_hint(built.gang[i], int(g.group in placed_groups))
    for key, var in built.on_device.items():
        m.add_hint(var, devices.get(key, 0))
    for d, var in built.whole_dev.items():
        m.add_hint(var, int(d in whole))
    evicted = {e.pod: e.reason for e in greedy.evictions}
    for vi, v in enumerate(scope.victims):
        reasons = {evicted.get(p) for p in v.pods}
        m.add_hint(built.evict_pre[vi], int("preempt" in reasons))
        m.add_hint(built.evict_rec[vi], int("reclaim" in reasons and "preempt" not in reasons))
    doms = defaultdict(set)
    for pl in greedy.placements:
        g = int(st.pod_pg[pl.pod])
        doms[g].add(pl.node)
    for (i, d), var in built.domain.items():
        g = scope.groups[i]
        dom = st.topologies[g.topology].domain[g.required_level]
        m.add_hint(var, int(any(int(dom[n]) == d for n in doms.get(g.group, ()))))
