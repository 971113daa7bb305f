"""Comparisons of per-resource vectors where -1 means unlimited (KAI's ResourceQuantities rules)."""

from __future__ import annotations

import numpy as np

UNLIMITED = -1.0


def le(a: np.ndarray | list[float], b: np.ndarray | list[float]) -> bool:
    """a <= b in every resource, with -1 as +infinity on either side."""
    for x, y in zip(_floats(a), _floats(b), strict=True):
        if x == UNLIMITED:
            if y != UNLIMITED:
                return False
        elif y != UNLIMITED and x > y:
            return False
    return True


def less_all(a: np.ndarray | list[float], b: np.ndarray | list[float]) -> bool:
    """a < b in every resource (plain comparison, as KAI's `Less`)."""
    return all(x < y for x, y in zip(_floats(a), _floats(b), strict=True))


def _floats(a: np.ndarray | list[float]) -> list[float]:
    return a.tolist() if isinstance(a, np.ndarray) else a


def less_somewhere(a: np.ndarray | list[float], b: np.ndarray | list[float]) -> bool:
    """a is less than b in at least one resource (= not b <= a)."""
    return not le(b, a)
