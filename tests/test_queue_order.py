"""QueueOrder.best (keys made once per candidate, pairwise rules only on ties) picks the same queue as scanning
with the rule-by-rule comparison of KAI's queue order, rules 1-6 written out here as the reference."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_opt.fairshare.order import QueueOrder
from kai_opt.fairshare.quantities import le, less_all
from kai_opt.fairshare.share import NO_SHARE_DRF_PENALTY, UNLIMITED

VALUES = st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0, -1.0])  # few values: many ties; -1 = unlimited


def _drf(total: list[float], allocatable: list[float], allocated: list[float]) -> float:
    """Dominant resource share, written out: an unlimited share counts as the total, a zero share is penalised."""
    best = 0.0
    for t, share, used in zip(total, allocatable, allocated, strict=True):
        if share == UNLIMITED:
            share = t
        best = max(best, used * NO_SHARE_DRF_PENALTY if share == 0 else used / share)
    return best


def _reference(o: QueueOrder, a: int, b: int, job_a: list[float], job_b: list[float]) -> int:
    alloc_a, alloc_b = o.ledger.allocated[a].tolist(), o.ledger.allocated[b].tolist()
    over_a, over_b = less_all(o.fair_share[a], alloc_a), less_all(o.fair_share[b], alloc_b)
    if over_a != over_b:
        return 1 if over_a else -1
    with_a = [x + y for x, y in zip(alloc_a, job_a, strict=True)]
    with_b = [x + y for x, y in zip(alloc_b, job_b, strict=True)]
    starved_a, starved_b = le(with_a, o.deserved[a]), le(with_b, o.deserved[b])
    if starved_a != starved_b:
        return -1 if starved_a else 1
    if o.priority[a] != o.priority[b]:
        return -1 if o.priority[a] > o.priority[b] else 1
    sa, sb = o.allocatable[a], o.allocatable[b]
    zero_a = any(s == 0 and w > 0 for s, w in zip(sa, with_a, strict=True))
    zero_b = any(s == 0 and w > 0 for s, w in zip(sb, with_b, strict=True))
    if zero_a != zero_b:
        return 1 if zero_a else -1
    for da, db in ((_drf(o.total, sa, with_a), _drf(o.total, sb, with_b)),
                   (_drf(o.total, sa, alloc_a), _drf(o.total, sb, alloc_b))):
        if da != db:
            return -1 if da < db else 1
    return o.tie(a, b)  # rules 7-8, pairwise in both versions


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.lists(VALUES, min_size=3, max_size=3), min_size=5 * n, max_size=5 * n),
    st.lists(st.integers(0, 2), min_size=n, max_size=n),
    st.lists(st.sampled_from([1.0, 2.0, float("nan")]), min_size=n, max_size=n))))
def test_best_equals_the_rule_by_rule_scan(data) -> None:
    n, rows, prio, created = data
    arr = np.abs(np.array(rows, dtype=float)).reshape(5, n, 3)  # allocated, fair share, deserved, share, job
    share = np.array(rows, dtype=float).reshape(5, n, 3)[3]  # may hold -1 (unlimited)
    fs = SimpleNamespace(allocatable_share=share, fair_share=arr[1], deserved=arr[2], total=np.full(3, 16.0))
    ledger = SimpleNamespace(allocated=arr[0])
    o = QueueOrder(fs, ledger, [f"q{i}" for i in range(n)], np.array(created), np.array(prio))
    jobs = {q: arr[4][q] for q in range(n)}
    expected = 0
    for q in range(1, n):
        if _reference(o, q, expected, jobs[q].tolist(), jobs[expected].tolist()) < 0:
            expected = q
    assert o.best(list(range(n)), jobs) == expected
    for a in range(n):
        for b in range(n):
            if a != b:
                assert o.compare(a, b, jobs[a], jobs[b]) == _reference(o, a, b, jobs[a].tolist(), jobs[b].tolist())


def _plan_parts(state) -> tuple:
    from kai_opt.config import Config, Engine
    from kai_opt.engine import run_cycle

    plan = run_cycle(state, Config(engine=Engine.greedy))[0]
    return ([(p.pod, p.node, tuple(p.devices), p.pipelined) for p in plan.placements],
            [(e.pod, e.reason, e.beneficiary) for e in plan.evictions],
            {g: [(r.code, r.message) for r in rs] for g, rs in plan.pending.items()})


def test_job_queue_key_cache_changes_no_plan(monkeypatch) -> None:
    """JobQueue keeps each queue's key while its allocation, head job and request stay the same: instances where
    placements and evictions change allocations between pops plan the same with every key made afresh
    (contention-200-s1 plans differently when keys are not dropped on allocation changes)."""
    from kai_opt.bench.instances import Instance
    from kai_opt.heuristics.jobs import JobQueue
    from kai_opt.state import build_state
    from models.generators import as_snapshot, scale

    states = [build_state(as_snapshot(scale(300, 3000, 300, 0))),
              build_state(Instance("contention", 200, 1).snapshot())]
    cached = [_plan_parts(s) for s in states]
    monkeypatch.setattr(JobQueue, "_key", lambda self, q: self.order.key(q, self.request(self._head(q))))
    assert all(c[0] for c in cached) and cached[0][1]  # placements, and evictions on the scale instance
    assert [_plan_parts(s) for s in states] == cached
