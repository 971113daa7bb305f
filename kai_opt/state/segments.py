"""Index arithmetic over the state's CSR-style layouts (a group's pods, a node's devices, a pod's devices)."""

from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the indexes of the ranges [starts[i], starts[i] + counts[i]) one after another, the position where each
    range begins in them) - e.g. the devices of several nodes from `dev_start`, ready for `np.*.reduceat`."""
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum())), first
