"""Where each object of a list sat in an earlier list, by identity: the alignment `RowCache` makes every state
build between the cache's objects and the rows it kept (100,000 pods at 10,000 nodes).

Two forms that give the same slots (tests/test_id_match.py): `slots_numpy`, a sort of the earlier ids and a binary
search of each id (tens of milliseconds at that size: the searches jump through memory), and `_slots_loops`, one
hash table over the earlier ids, compiled in long-lived processes (kai_opt.compiled).
"""

from __future__ import annotations

import numpy as np

from kai_opt.compiled import Kernel


def slots_numpy(known: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64[len(ids)]: for each of `ids`, its index in `known` (the first, if there twice), -1 where absent."""
    out = np.full(len(ids), -1, dtype=np.int64)
    if not len(known) or not len(ids):
        return out
    order = np.argsort(known, kind="stable")
    ordered = known[order]
    at = np.minimum(np.searchsorted(ordered, ids), len(ordered) - 1)
    hit = ordered[at] == ids
    out[hit] = order[at[hit]]
    return out


def _slots_loops(known: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """slots_numpy by open addressing: the table holds each id of `known` once, at its first index."""
    size = 2
    while size < 2 * len(known) + 2:
        size *= 2
    mask = size - 1
    keys = np.zeros(size, dtype=np.int64)
    index = np.full(size, -1, dtype=np.int64)
    for j in range(len(known)):
        k = known[j]
        h = ((k >> 4) ^ (k >> 21)) & mask  # (ids are addresses: 16-byte aligned)
        while index[h] >= 0 and keys[h] != k:
            h = (h + 1) & mask
        if index[h] < 0:
            keys[h] = k
            index[h] = j
    out = np.full(len(ids), -1, dtype=np.int64)
    for i in range(len(ids)):
        k = ids[i]
        h = ((k >> 4) ^ (k >> 21)) & mask
        while index[h] >= 0:
            if keys[h] == k:
                out[i] = index[h]
                break
            h = (h + 1) & mask
    return out


SLOTS = Kernel("identity match", _slots_loops, slots_numpy)
# lists from which the compiled form is worth loading numba for (its RSS, ~115 MB): 2,000 nodes' pods; below, the
# numpy form takes a few milliseconds
LOOPS_FROM = 20_000


def slots(known: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """slots_numpy, by the form in use (kai_opt.compiled) for long lists."""
    if len(ids) < LOOPS_FROM:
        return slots_numpy(known, ids)
    out: np.ndarray = SLOTS(known, ids)
    return out
