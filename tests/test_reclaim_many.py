"""The reclaim rule's array forms (leveled_many, le_rows, fits_strategy_many) against the scalar functions they
replace in the model's scope and reclaim rows (hypothesis: random queue trees, allocations, shares)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_opt.fairshare.quantities import le
from kai_opt.fairshare.reclaim import (
    fits_strategy,
    fits_strategy_many,
    le_rows,
    leveled,
    leveled_many,
    queue_paths,
)

AMOUNTS = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 8.0])  # -1: unlimited


@st.composite
def forests(draw: st.DrawFn) -> list[list[int]]:
    """Each queue's ancestors, itself first (QueueLedger.ancestors): a random forest of up to 16 queues."""
    n = draw(st.integers(1, 16))
    parent = [-1] + [draw(st.integers(-1, q - 1)) for q in range(1, n)]
    out = []
    for q in range(n):
        path, cur = [q], parent[q]
        while cur >= 0:
            path.append(cur)
            cur = parent[cur]
        out.append(path)
    return out


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    ancestors = draw(forests())
    n = len(ancestors)
    k = draw(st.integers(1, 12))
    row = st.lists(AMOUNTS, min_size=3, max_size=3)
    return {
        "ancestors": ancestors,
        "reclaimers": np.array(draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)), dtype=np.int64),
        "victims": np.array(draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)), dtype=np.int64),
        "allocated": np.abs(np.array(draw(st.lists(row, min_size=n, max_size=n)))),
        "allocatable": np.array(draw(st.lists(row, min_size=n, max_size=n))),
        "deserved": np.array(draw(st.lists(row, min_size=n, max_size=n))),
        "requests": np.abs(np.array(draw(st.lists(row, min_size=k, max_size=k)))),
    }


@settings(max_examples=300, deadline=None)
@given(cases())
def test_leveled_many_is_leveled_pair_by_pair(case: dict[str, Any]) -> None:
    ledger = SimpleNamespace(ancestors=case["ancestors"])
    mine, theirs = leveled_many(queue_paths(case["ancestors"]), case["reclaimers"], case["victims"])
    expected = [leveled(ledger, int(r), int(v))  # type: ignore[arg-type]
                for r, v in zip(case["reclaimers"], case["victims"], strict=True)]
    assert list(zip(mine.tolist(), theirs.tolist(), strict=True)) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(AMOUNTS, min_size=3, max_size=3), st.lists(AMOUNTS, min_size=3, max_size=3)),
                min_size=1, max_size=10))
def test_le_rows_is_le_row_by_row(pairs: list[tuple[list[float], list[float]]]) -> None:
    a, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    assert le_rows(a, b).tolist() == [le(x, y) for x, y in pairs]


@settings(max_examples=300, deadline=None)
@given(cases())
def test_fits_strategy_many_is_fits_strategy_row_by_row(case: dict[str, Any]) -> None:
    fs = SimpleNamespace(allocatable_share=case["allocatable"], deserved=case["deserved"])
    ledger = SimpleNamespace(allocated=case["allocated"])
    got = fits_strategy_many(fs, ledger, case["requests"], case["reclaimers"], case["victims"])  # type: ignore[arg-type]
    expected = [fits_strategy(fs, ledger, req, int(r), int(v), case["allocated"][v])  # type: ignore[arg-type]
                for req, r, v in zip(case["requests"], case["reclaimers"], case["victims"], strict=True)]
    assert got.tolist() == expected
