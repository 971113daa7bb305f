"""Seeded generators of benchmark instances: Kubernetes objects (`RawObject`s) for kai-opt snapshots.

Every family is a function `(n_nodes, seed) -> list[RawObject]` (same seed, same objects); `FAMILIES` names
them with a one-line description. `scale(...)` builds the large instance (10,000 nodes, 100,000 running pods)
fast. `as_snapshot(objs)` validates them; `write_json(objs, path)` writes a kubectl `List` (`kai-opt show`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from kai_opt.snapshot import RawObject
from models.generators.families import contention, fractions, fragmentation, gangs, topology
from models.generators.objects import NOW, as_snapshot, write_json
from models.generators.openb import openb
from models.generators.scale import scale


class Family(NamedTuple):
    generate: Callable[[int, int], list[RawObject]]
    description: str

    def __call__(self, n_nodes: int, seed: int) -> list[RawObject]:
        return self.generate(n_nodes, seed)


FAMILIES: dict[str, Family] = {
    "gangs": Family(gangs, "gangs of 1-32 GPUs (1-8 per pod), 70-85% running, 30-50% more pending"),
    "fragmentation": Family(fragmentation, "adversarial GPU gaps and CPU-heavy pods where greedy orders strand GPUs"),
    "fractions": Family(fractions, "gpu-fraction 0.1-0.9 and gpu-memory pods sharing devices next to whole GPUs"),
    "topology": Family(topology, "racks of 8 nodes, blocks of 4 racks; rack/block-required and preferred gangs"),
    "contention": Family(contention, "over-quota preemptible queues hold the cluster; under-quota queues wait"),
    "openb": Family(openb, "Alibaba openb trace mix: node models, CPU-only, sharing, 1-GPU, few multi-GPU pods"),
}

__all__ = ["FAMILIES", "NOW", "Family", "as_snapshot", "contention", "fractions", "fragmentation", "gangs",
           "openb", "scale", "topology", "write_json"]
