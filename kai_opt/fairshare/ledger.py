"""A mutable record of what each queue holds during one cycle: engines add and remove pods as they decide."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_opt.fairshare.share import FairShare
from kai_opt.state import ClusterState


@dataclass
class QueueLedger:
    allocated: np.ndarray  # float64[Q, 3], subtree sums (KAI units)
    allocated_np: np.ndarray  # float64[Q, 3], non-preemptible part
    ancestors: list[list[int]]  # queue -> itself and its ancestors

    @classmethod
    def start(cls, state: ClusterState, fs: FairShare) -> QueueLedger:
        return cls(fs.allocated.copy(), fs.allocated_np.copy(), state.q_ancestors)

    def copy(self) -> QueueLedger:
        return QueueLedger(self.allocated.copy(), self.allocated_np.copy(), self.ancestors)

    def add(self, queue: int, amount: np.ndarray, *, non_preemptible: bool) -> None:
        """Add (or, with a negative amount, remove) usage of a leaf queue and all its ancestors."""
        if queue < 0:
            return
        for q in self.ancestors[queue]:
            self.allocated[q] += amount
            if non_preemptible:
                self.allocated_np[q] += amount
