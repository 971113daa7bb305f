"""The reclaim rows' late work (formulation/reclaim_rows.late_work) per (queue, turn) equals the plain rule: the
amounts of the late entries under the queue whose turn is after the asked one, added one by one in entry order, then
scaled and rounded (the bulk form must give the same integers, not merely close ones)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from kai_opt.formulation.reclaim_rows import late_work

# a small queue tree: 0 and 1 on top, 2-3 under 0, 4 under 1, 5-6 under 2 (queue -> itself, then its ancestors)
ANCESTORS = [[0], [1], [2, 0], [3, 0], [4, 1], [5, 2, 0], [6, 2, 0]]


def _reference(entries: list[tuple[int, int, np.ndarray]], wanted: set[tuple[int, int]],
               scale: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    out = {k: np.zeros(3) for k in wanted}
    by_queue: dict[int, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for (q, turn), acc in out.items():
        by_queue[q].append((turn, acc))
    for t, leaf, amount in entries:
        for q in ANCESTORS[leaf]:
            for turn, acc in by_queue.get(q, ()):
                if t > turn:
                    acc += amount
    return {k: np.round(v * scale).astype(np.int64) for k, v in out.items()}


amount = hs.lists(hs.floats(min_value=-64, max_value=64, allow_nan=False, width=64), min_size=3, max_size=3)
entry = hs.tuples(hs.integers(0, 12), hs.integers(0, len(ANCESTORS) - 1), amount)


@settings(max_examples=300, deadline=None)
@given(hs.lists(entry, max_size=60),
       hs.sets(hs.tuples(hs.integers(0, len(ANCESTORS) - 1), hs.integers(-1, 12)), max_size=20),
       hs.sampled_from([1.0, 1000.0, 1024.0 / 3]))
def test_late_work_adds_each_later_entry_under_the_queue(raw: list[tuple[int, int, list[float]]],
                                                         wanted: set[tuple[int, int]], scale: float) -> None:
    entries = [(t, leaf, np.array(a)) for t, leaf, a in raw]
    scales = np.array([scale, 1000.0, scale])
    got = late_work(SimpleNamespace(q_ancestors=ANCESTORS), SimpleNamespace(late_work=entries),  # type: ignore[arg-type]
                    wanted, scales)
    want = _reference(entries, wanted, scales)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].tolist() == v.tolist(), k


def test_late_work_adds_in_entry_order() -> None:
    """Floats added in another order give other integers here (1 + 1e16 loses the 1; -1e16 + 1e16 does not)."""
    entries = [(5, 5, np.array([1.0, 0.0, 0.0])), (6, 6, np.array([1e16, 0.0, 0.0])),
               (7, 3, np.array([-1e16, 0.0, 0.0]))]
    wanted = {(0, 1), (2, 5)}
    scales = np.ones(3)
    got = late_work(SimpleNamespace(q_ancestors=ANCESTORS), SimpleNamespace(late_work=entries),  # type: ignore[arg-type]
                    wanted, scales)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in
                                                       _reference(entries, wanted, scales).items()}
    assert got[(0, 1)].tolist() == [0, 0, 0]
