"""segments.add_rows: the same sums as np.add.at into a zero 2-D target, bit for bit (float sums in input order;
integer sums exact, through np.add.at where float64 could not hold them)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from kai_opt.state.segments import add_rows


@settings(max_examples=300, deadline=None)
@given(hs.integers(1, 6), hs.integers(1, 3), hs.lists(hs.integers(0, 5), max_size=40),
       hs.randoms(use_true_random=False), hs.sampled_from(["int", "big", "float"]))
def test_the_same_sums_as_add_at(rows: int, cols: int, index: list[int], rnd, kind: str) -> None:
    idx = np.array([i % rows for i in index], dtype=np.int64)
    if kind == "float":  # fractions whose sums round, so the order of the additions shows
        values = np.array([[rnd.random() * 10 ** rnd.randint(-3, 16) for _ in range(cols)] for _ in idx]).reshape(
            len(idx), cols)
        dtype: type = np.float64
    else:
        top = 2**62 if kind == "big" else 2**40
        values = np.array([[rnd.randint(-top, top) for _ in range(cols)] for _ in idx], dtype=np.int64).reshape(
            len(idx), cols)
        dtype = np.int64
    expect, got = np.zeros((rows, cols), dtype=dtype), np.zeros((rows, cols), dtype=dtype)
    np.add.at(expect, idx, values)
    add_rows(got, idx, values)
    assert got.tobytes() == expect.tobytes()
