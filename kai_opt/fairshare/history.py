"""Time-based fair share (KAI-Scheduler v0.13): past usage of each queue as a fraction of what the cluster could
have given in the window, and the over-quota share weight it leads to.

Rules (KAI's docs/time-based-fairshare and its proportion plugin):
- a sample of usage `age` seconds old counts 0.5 ** (age / halfLifePeriod) of a fresh one (no half-life: 1);
- a queue's usage = sum of its decayed allocation samples in the window / sum of the decayed cluster capacity
  samples in the same window, per resource (10 GPUs for 10 hours, 24 GPU-hours used -> 0.24);
- in each over-quota round, among the unsatisfied queues of one priority, with W' = over-quota weight / the sum of
  the weights of the queues still requesting and U' that queue's usage, the share weight is
  max(0, W' + kValue * (W' - U')); the round's amount is split in proportion to these weights.
  Deserved quota and queue priority come first and are untouched; with no usage this is the plain weighting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_K_VALUE = 1.0  # KAI's proportion plugin argument kValue


def decay(age_s: float | np.ndarray, half_life_s: float | None) -> float | np.ndarray:
    """Weight of a sample `age_s` seconds old; no (or a zero) half-life means no decay."""
    if not half_life_s:
        return np.ones_like(age_s, dtype=np.float64) if isinstance(age_s, np.ndarray) else 1.0
    return np.power(0.5, np.asarray(age_s, dtype=np.float64) / half_life_s) if isinstance(age_s, np.ndarray) \
        else 0.5 ** (age_s / half_life_s)


def share_weight(normalized_weight: float, usage: float, k_value: float) -> float:
    """KAI's over-quota share weight of one queue in one round (floored at 0)."""
    return max(0.0, normalized_weight + k_value * (normalized_weight - usage))


@dataclass(frozen=True)
class HistoricalUsage:
    """Each queue's past usage normalised to the window's cluster capacity, per queue resource (gpu, cpu,
    memory), keyed by queue name (KAI's QueueResourceUsage). A parent queue's usage is its subtree's, as KAI's
    queue metrics are; a queue not named has used nothing."""

    queues: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)

    def matrix(self, names: Sequence[str]) -> np.ndarray:
        """float64[Q, 3] in the order of `names`."""
        out = np.zeros((len(names), 3))
        for q, name in enumerate(names):
            if name in self.queues:
                out[q] = self.queues[name]
        return out

    def any(self) -> bool:
        return any(v != 0 for vs in self.queues.values() for v in vs)


def normalize(usage: Mapping[str, np.ndarray], capacity: np.ndarray) -> HistoricalUsage:
    """Resource-seconds used per queue over the window's capacity in resource-seconds (both decayed alike). A
    resource with no capacity in the window gives no usage (nothing could have been used)."""
    cap = np.asarray(capacity, dtype=np.float64)
    out: dict[str, tuple[float, float, float]] = {}
    for name, used in usage.items():
        u = np.asarray(used, dtype=np.float64)
        ratio = np.divide(u, cap, out=np.zeros(3), where=cap > 0)
        out[name] = (float(ratio[0]), float(ratio[1]), float(ratio[2]))
    return HistoricalUsage(out)
