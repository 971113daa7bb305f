"""The identity match of RowCache (kai_opt/state/id_match.py): the loops, run by Python and compiled by numba, give
the numpy form's slots; a state build takes the same arrays with either form."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from kai_opt import compiled
from kai_opt.state import build_state
from kai_opt.state import id_match as im
from kai_opt.state.build import reset_memos
from models.generators import as_snapshot, scale

# small values, so ids repeat within and between the lists; also addresses, as the build passes
values = hs.one_of(hs.integers(-40, 40), hs.integers(0, 2**40).map(lambda x: x * 16))


@settings(max_examples=300, deadline=None)
@given(hs.lists(values, max_size=60), hs.lists(values, max_size=60))
def test_loops_agree_with_the_numpy_form(known: list[int], ids: list[int]) -> None:
    a, b = np.array(known, dtype=np.int64), np.array(ids, dtype=np.int64)
    expect = im.slots_numpy(a, b)
    assert im._slots_loops(a, b).tolist() == expect.tolist()
    for i, s in enumerate(expect.tolist()):  # the first index of the id in `known`, else -1
        assert s == (known.index(ids[i]) if ids[i] in known else -1)


@settings(max_examples=100, deadline=None)
@given(hs.lists(values, max_size=60), hs.lists(values, max_size=60))
def test_compiled_loops_agree_with_the_numpy_form(known: list[int], ids: list[int]) -> None:
    a, b = np.array(known, dtype=np.int64), np.array(ids, dtype=np.int64)
    kernel = compiled.Kernel("test", im._slots_loops, im.slots_numpy)
    assert kernel.use_compiled(), "numba is a dependency"
    assert kernel.compiled[0](a, b).tolist() == im.slots_numpy(a, b).tolist()


def test_a_state_build_is_the_same_with_either_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds in a row (the second matches the first's objects, dropped and added ones among them)."""
    first = as_snapshot(scale(60, 600, 60, 0))
    objs = as_snapshot(scale(60, 600, 60, 1))
    second = type(first)(**{**first.__dict__, "pods": first.pods[7:] + objs.pods[:9]})

    def builds() -> list[dict[str, np.ndarray]]:
        reset_memos()
        out = []
        for snap in (first, second):
            st = build_state(snap)
            out.append({k: v for k, v in vars(st).items() if isinstance(v, np.ndarray)})
        return out

    monkeypatch.setattr(im, "SLOTS", compiled.Kernel("identity match", im._slots_loops, im.slots_numpy))
    monkeypatch.setattr(im, "LOOPS_FROM", 0)  # (a small instance)
    monkeypatch.setattr(compiled, "_when_used", [])
    by_numpy = builds()
    monkeypatch.setattr(compiled, "_when_used", [True])
    by_loops = builds()
    assert im.SLOTS.compiled, "the second builds ran the compiled loops"
    for a, b in zip(by_numpy, by_loops, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k


def test_short_lists_keep_the_numpy_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small cluster's process never loads numba for the match (its RSS); a long list runs the loops."""
    kernel = compiled.Kernel("identity match", im._slots_loops, im.slots_numpy)
    monkeypatch.setattr(im, "SLOTS", kernel)
    monkeypatch.setattr(compiled, "_when_used", [True])
    short = np.arange(im.LOOPS_FROM - 1, dtype=np.int64) * 16
    assert im.slots(short, short[::-1]).tolist() == list(range(len(short)))[::-1]
    assert not kernel.compiled
    long = np.arange(im.LOOPS_FROM, dtype=np.int64) * 16
    assert im.slots(long, long[::-1]).tolist() == list(range(len(long)))[::-1]
    assert kernel.compiled
