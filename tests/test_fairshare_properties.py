"""Property tests of the fair-share division over random queue trees and demands (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_opt.fairshare.share import divide_tree

EPS = 1e-6


@st.composite
def trees(draw: st.DrawFn, max_queues: int = 14) -> dict:
    n = draw(st.integers(1, max_queues))
    parent = [-1]
    for q in range(1, n):
        parent.append(draw(st.integers(-1, q - 1)))
    parent_arr = np.array(parent)
    is_leaf = np.ones(n, dtype=bool)
    is_leaf[parent_arr[parent_arr >= 0]] = False
    leaf_request = [float(draw(st.integers(0, 40))) if is_leaf[q] else 0.0 for q in range(n)]
    request = np.array(leaf_request)
    depth = [0] * n
    for q in range(n):
        d, cur = 0, parent[q]
        while cur >= 0:
            d, cur = d + 1, parent[cur]
        depth[q] = d
    for q in sorted(range(n), key=lambda x: -depth[x]):
        if parent[q] >= 0:
            request[parent[q]] += request[q]
    deserved = [draw(st.sampled_from([-1.0, 0.0, 1.0, 2.0, 4.0, 8.0])) for _ in range(n)]
    limit = [draw(st.sampled_from([-1.0, -1.0, 2.0, 5.0, 10.0])) for _ in range(n)]
    weight = [draw(st.sampled_from([0.0, 1.0, 1.0, 2.0, 3.0])) for _ in range(n)]
    priority = [draw(st.sampled_from([50, 100, 100, 200])) for _ in range(n)]
    total = float(draw(st.integers(0, 60)))
    return {
        "total": total,
        "parent": parent_arr,
        "deserved": np.array(deserved)[:, None],
        "limit": np.array(limit)[:, None],
        "weight": np.array(weight)[:, None],
        "priority": np.array(priority),
        "creation": np.arange(n, dtype=float),
        "names": [f"q{i}" for i in range(n)],
        "requested": request[:, None],
    }


def run(t: dict, total: float | None = None) -> np.ndarray:
    fair, _ = divide_tree(np.array([t["total"] if total is None else total]), t["parent"], t["deserved"],
                          t["limit"], t["weight"], t["priority"], t["creation"], t["names"], t["requested"])
    return fair[:, 0]


def siblings(t: dict) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for q, p in enumerate(t["parent"].tolist()):
        out.setdefault(p, []).append(q)
    return out


def deserved_part(t: dict, q: int) -> float:
    req, lim, des = t["requested"][q, 0], t["limit"][q, 0], t["deserved"][q, 0]
    requestable = req if lim < 0 else min(lim, req)
    return requestable if des < 0 else min(des, requestable)


@settings(max_examples=300, deadline=None)
@given(trees())
def test_children_never_get_more_than_their_parent(t: dict) -> None:
    """Siblings share out at most their parent's share; deserved quota is a guarantee (KAI), so when the quotas
    they ask for already exceed it they get exactly those quotas and nothing over quota."""
    fair = run(t)
    for p, kids in siblings(t).items():
        budget = t["total"] if p < 0 else fair[p]
        guaranteed = sum(min(budget, deserved_part(t, q)) if t["deserved"][q, 0] < 0 else deserved_part(t, q)
                         for q in kids)
        assert fair[kids].sum() <= max(budget, guaranteed) + EPS
        if guaranteed >= budget:
            for q in kids:
                d = deserved_part(t, q)
                assert fair[q] <= (min(budget, d) if t["deserved"][q, 0] < 0 else d) + EPS


@settings(max_examples=300, deadline=None)
@given(trees())
def test_no_queue_above_its_requestable_unless_deserved_says_so(t: dict) -> None:
    fair = run(t)
    for q in range(len(fair)):
        req = t["requested"][q, 0]
        lim = t["limit"][q, 0]
        requestable = req if lim < 0 else min(lim, req)
        des = t["deserved"][q, 0]
        deserved_part = requestable if des < 0 else min(des, requestable)
        assert fair[q] <= max(requestable, deserved_part) + EPS
        assert fair[q] >= -EPS


@settings(max_examples=300, deadline=None)
@given(trees())
def test_deserved_is_honoured_when_requested_and_capacity_allows(t: dict) -> None:
    fair = run(t)
    for p, kids in siblings(t).items():
        budget = t["total"] if p < 0 else fair[p]
        wanted = []
        for q in kids:
            req, lim, des = t["requested"][q, 0], t["limit"][q, 0], t["deserved"][q, 0]
            requestable = req if lim < 0 else min(lim, req)
            wanted.append(requestable if des < 0 else min(des, requestable))
        if any(t["deserved"][q, 0] < 0 for q in kids):
            continue  # -1 deserves "everything": capacity never allows all of them
        if sum(wanted) <= budget + EPS:
            for q, w in zip(kids, wanted, strict=True):
                assert fair[q] >= w - EPS


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0]), min_size=2, max_size=8), st.integers(0, 200))
def test_over_quota_follows_weights_within_one_unit(weights: list[float], total: int) -> None:
    n = len(weights)
    t = {"total": float(total), "parent": np.full(n, -1), "deserved": np.zeros((n, 1)),
         "limit": np.full((n, 1), -1.0), "weight": np.array(weights)[:, None], "priority": np.full(n, 100),
         "creation": np.arange(n, dtype=float), "names": [f"q{i}" for i in range(n)],
         "requested": np.full((n, 1), 10_000.0)}  # everyone unsatisfied
    fair = run(t)
    ideal = total * np.array(weights) / sum(weights)
    assert np.all(np.abs(fair - ideal) <= 1 + EPS)
    assert abs(fair.sum() - total) <= EPS


@settings(max_examples=300, deadline=None)
@given(trees(), st.integers(1, 20))
def test_more_capacity_never_lowers_a_share_by_more_than_one_unit(t: dict, extra: int) -> None:
    before = run(t)
    after = run(t, t["total"] + extra)
    assert np.all(after >= before - 1 - EPS), (before, after)


@st.composite
def reclaim_walks(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A three-level queue tree (2 departments x 2 teams x 2 projects) with random allocations and fair shares
    (some 0 or unlimited), a reclaiming leaf, and a sequence of victim chunks from other leaves."""
    from types import SimpleNamespace

    parents = [-1, -1, 0, 0, 1, 1] + [2 + i // 2 for i in range(8)]  # 0-1 depts, 2-5 teams, 6-13 projects
    n = len(parents)
    ancestors = []
    for q in range(n):
        path = [q]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        ancestors.append(path)
    amounts = st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0])
    allocated = np.array([[draw(amounts) for _ in range(3)] for _ in range(n)])
    fair = np.array([[draw(st.sampled_from([-1.0, 0.0, 1.0, 2.0, 4.0, 5.0])) for _ in range(3)] for _ in range(n)])
    ledger = SimpleNamespace(ancestors=ancestors, allocated=allocated, allocated_np=allocated / 2)
    fs = SimpleNamespace(fair_share=fair, deserved=np.full((n, 3), 3.0))
    leaves = list(range(6, n))
    reclaimer = draw(st.sampled_from(leaves))
    chunks = draw(st.lists(st.tuples(st.sampled_from([q for q in leaves if q != reclaimer]),
                                     st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=3, max_size=3)),
                           max_size=8))
    request = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=3, max_size=3)))
    return fs, ledger, reclaimer, request, [(q, np.array(c)) for q, c in chunks], draw(st.booleans()), \
        draw(st.sampled_from([1.0, 1.2, 2.0]))


@settings(max_examples=300, deadline=None)
@given(reclaim_walks())
def test_the_incremental_reclaimer_side_agrees_with_the_rule_after_every_chunk(walk) -> None:  # type: ignore[no-untyped-def]
    """ReclaimerSide (a search's worth_trying) judges only the comparisons a chunk changes: after every chunk
    its answer is reclaimer_side's on all the chunks so far (KAI's boundary rule, fairshare/reclaim.py)."""
    from kai_opt.fairshare.reclaim import ReclaimerSide, reclaimer_side_after

    fs, ledger, reclaimer, request, chunks, preemptible, mult = walk
    side = ReclaimerSide(fs, ledger, reclaimer, request, preemptible=preemptible, saturation_multiplier=mult)
    for k in range(len(chunks)):
        got = side.take(*chunks[k])
        assert got == reclaimer_side_after(fs, ledger, reclaimer, request, chunks[:k + 1], preemptible=preemptible,
                                           saturation_multiplier=mult)
