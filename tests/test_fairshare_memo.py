"""The divisions memo of divide_tree: an untraced division read from it is the one made afresh (bit for bit), for
trees divided again with some requests, amounts, names or past usage changed, and it is read (not bypassed)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kai_opt.fairshare.share as share
from kai_opt.fairshare.share import divide_tree
from tests.test_fairshare_properties import trees


def _divide(t: dict, *, fresh: bool, usage: np.ndarray | None = None) -> np.ndarray:
    """divide_tree of tree t; fresh: every division made afresh (a recorder turns the memo off)."""
    fair, _ = divide_tree(np.array([t["total"]]), t["parent"], t["deserved"], t["limit"], t["weight"],
                          t["priority"], t["creation"], t["names"], t["requested"], usage=usage,
                          recorder=(lambda *a: None) if fresh else None)
    return fair


def _changed(t: dict, draw: st.DrawFn) -> dict:
    """t with some leaves' requests (and their ancestors' sums), the total or the names changed."""
    out = dict(t)
    req = t["requested"].copy()
    parent = t["parent"]
    n = len(parent)
    for q in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        if q in parent:  # (not a leaf)
            continue
        delta = float(draw(st.integers(-int(req[q, 0]), 8)))
        cur = q
        while cur >= 0:
            req[cur, 0] += delta
            cur = int(parent[cur])
    out["requested"] = req
    if draw(st.booleans()):
        out["total"] = float(draw(st.integers(0, 60)))
    if draw(st.integers(0, 4)) == 0:
        out["names"] = list(reversed(t["names"]))
    return out


@settings(max_examples=200, deadline=None)
@given(trees(), st.data())
def test_memo_gives_the_fresh_division(t: dict, data: st.DataObject) -> None:
    usage = None
    if data.draw(st.booleans()):
        usage = np.array([[data.draw(st.sampled_from([0.0, 0.1, 0.5]))] for _ in range(len(t["parent"]))])
    for step in range(3):
        cur = t if step == 0 else _changed(t, data.draw)
        got = _divide(cur, fresh=False, usage=usage)
        want = _divide(cur, fresh=True, usage=usage)
        assert got.tobytes() == want.tobytes()


def test_memo_is_read_and_repeats_nothing(monkeypatch: object) -> None:
    """The second division of an unchanged tree makes no sibling division; a changed request makes only the
    divisions whose inputs changed (here: its sibling set and the ones above and below it)."""
    parent = np.array([-1, -1, 0, 0, 1, 1, 2, 2])
    n = len(parent)
    req = np.array([[30.0], [20.0], [10.0], [20.0], [5.0], [15.0], [4.0], [6.0]])
    t = {"total": 40.0, "parent": parent, "deserved": np.full((n, 1), 2.0), "limit": np.full((n, 1), -1.0),
         "weight": np.ones((n, 1)), "priority": np.full(n, 100), "creation": np.arange(n, dtype=float),
         "names": [f"q{i}" for i in range(n)], "requested": req}
    calls: list[int] = []
    real = share.divide

    def counting(*a: object, **k: object) -> float:
        calls.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(share, "divide", counting)  # type: ignore[attr-defined]
    first = _divide(t, fresh=False)
    assert len(calls) == 4  # the top level, queue 0's and queue 1's children, queue 2's
    calls.clear()
    again = _divide(t, fresh=False)
    assert calls == [] and again.tobytes() == first.tobytes()
    calls.clear()
    fair, _ = divide_tree(np.array([t["total"]]), t["parent"], t["deserved"], t["limit"], t["weight"], t["priority"],
                          t["creation"], t["names"], t["requested"], memo=False)
    assert len(calls) == 4 and fair.tobytes() == first.tobytes()  # memo off: every division made afresh
    calls.clear()
    t5 = dict(t, requested=req + np.array([[0.0], [1.0], [0.0], [0.0], [0.0], [1.0], [0.0], [0.0]]))
    changed = _divide(t5, fresh=False)
    assert len(calls) == 2  # the top level and queue 1's children: queue 0 keeps its share, so its sets hit
    assert changed.tobytes() == _divide(t5, fresh=True).tobytes()
