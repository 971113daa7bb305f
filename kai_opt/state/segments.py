"""Index arithmetic over the state's CSR-style layouts (a group's pods, a node's devices, a pod's devices)."""

from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the indexes of the ranges [starts[i], starts[i] + counts[i]) one after another, the position where each
    range begins in them) - e.g. the devices of several nodes from `dev_start`, ready for `np.*.reduceat`."""
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum())), first


EXACT = float(2**53)  # float64 holds every integer below this exactly


def add_rows(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """np.add.at(target, index, values) for a 2-D `target` starting at zero (rows `index`, values one row each),
    as one weighted bincount per column: np.add.at over rows is about ten times slower. The same sums: bincount
    adds in input order as np.add.at does, and an integer target goes through float64 only while every column's
    absolute sum stays below 2**53 (else np.add.at)."""
    if not len(index):
        return
    integer = target.dtype.kind in "iu"
    if integer and float(np.abs(values).sum(axis=0, dtype=np.float64).max()) >= EXACT:
        np.add.at(target, index, values)
        return
    for r in range(target.shape[1]):
        col = np.bincount(index, weights=values[:, r], minlength=len(target))
        target[:, r] += col.astype(target.dtype) if integer else col
