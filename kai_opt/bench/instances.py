"""Benchmark instances of `kai-opt bench run`: a family of models/generators at a cluster size and a seed.

Every instance is generated from its (family, nodes, seed) alone, so anyone reruns the same instance. Generation
is lazy (`Instance.snapshot()`), since 10,000-node instances take a while to build.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kai_opt.errors import InputError
from kai_opt.snapshot import RawObject, Snapshot

DEFAULT_SIZES = (100, 1000)
QUICK_SIZE = 100  # --quick: one instance of this many nodes per family, seed 0
MIN_NODES, MAX_NODES = 10, 10_000


def families() -> dict[str, tuple[Callable[[int, int], list[RawObject]], str]]:
    """name -> (generator, one-line description), in models.generators' order."""
    from models.generators import FAMILIES

    return {name: (fam.generate, fam.description) for name, fam in FAMILIES.items()}


@dataclass(frozen=True)
class Instance:
    family: str
    nodes: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family}-{self.nodes}-s{self.seed}"

    def objects(self) -> list[RawObject]:
        generate, _ = families()[self.family]
        return generate(self.nodes, self.seed)

    def snapshot(self) -> Snapshot:
        from models.generators import as_snapshot

        return as_snapshot(self.objects())


def parse_families(text: str | None) -> list[str]:
    """Comma-separated family names (None or empty: all), checked."""
    known = families()
    if not text:
        return list(known)
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if not names:
        raise InputError("no family given", field="--families")
    for n in names:
        if n not in known:
            raise InputError(f"unknown family {n!r} (known: {', '.join(known)})", field="--families")
    return names


def parse_sizes(text: str | None) -> list[int]:
    """Comma-separated node counts between MIN_NODES and MAX_NODES (None: DEFAULT_SIZES)."""
    if text is None:
        return list(DEFAULT_SIZES)
    sizes: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            n = int(part.replace("_", ""))
        except ValueError:
            raise InputError(f"not a node count: {part!r}", field="--sizes") from None
        if not MIN_NODES <= n <= MAX_NODES:
            raise InputError(f"{n} nodes is out of range ({MIN_NODES}..{MAX_NODES})", field="--sizes")
        if n not in sizes:
            sizes.append(n)
    if not sizes:
        raise InputError("no size given", field="--sizes")
    return sizes


def instances(families_: Sequence[str], sizes: Sequence[int], seeds: int) -> list[Instance]:
    """Every (family, size, seed) with seeds 0..seeds-1, smaller sizes first (fast results come first)."""
    if seeds < 1:
        raise InputError(f"seeds must be at least 1, got {seeds}", field="--seeds")
    return [Instance(f, n, s) for n in sorted(sizes) for f in families_ for s in range(seeds)]


def quick() -> list[Instance]:
    """--quick: one small instance per family."""
    return instances(list(families()), [QUICK_SIZE], 1)
