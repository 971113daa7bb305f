"""Pausing Python's cyclic garbage collector while a snapshot is parsed.

Parsing a 10,000-node snapshot allocates millions of containers (JSON dicts and lists, models) that all stay alive
until the parse ends. With the collector on, every 700 allocations start a collection, and the older generations
are walked again and again over objects that are never garbage (measured: docs/DESIGN-NOTES.md). Snapshots hold
no reference cycles, so nothing is lost by pausing the collector while they are built; objects freed by reference
counting are freed at once as always.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# A paused block that leaves more new container objects alive than this (a snapshot of thousands of pods) freezes
# them: see gc_paused.
FREEZE_MIN_OBJECTS = 200_000
# The collector's thresholds in the long-running scheduler's process (tune_for_service); CPython's are (700, 10, 10).
SERVICE_THRESHOLDS = (20_000, 20, 20)


@contextmanager
def gc_paused(*, freeze_above: int | None = None) -> Iterator[None]:
    """Run the block with the cyclic GC disabled; nested pauses are free (the outermost one re-enables it).

    `freeze_above`: when the block leaves more than this many new objects tracked by the collector, they are moved
    to its permanent generation (`gc.freeze()`) before it is re-enabled. Otherwise the first collections after the
    block would walk all of them (two or three passes over a big snapshot, seconds at 100,000 pods) to find no
    garbage. Frozen objects are still freed by reference counting when dropped; only garbage in reference cycles
    alive at that moment would stay (`gc.unfreeze()` hands everything back to the collector).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if freeze_above is not None and gc.get_count()[0] > freeze_above:
                gc.freeze()
            gc.enable()


def tune_for_service() -> None:
    """Collector thresholds for a process that holds the cluster for its whole life (`kai-opt run`): its watch,
    binder and status threads allocate while the cycles are not paused, and with CPython's thresholds a young
    collection starts every 700 allocations, each first one after a cycle walks what the cycle left alive, and the
    whole heap (every cached object and model) is walked again each time it grew by a quarter, holding the GIL the
    while. Larger thresholds leave the same garbage for the same collector, collected less often (measured:
    docs/DESIGN-NOTES.md, In-cluster runtime)."""
    gc.set_threshold(*SERVICE_THRESHOLDS)


@contextmanager
def forking() -> Iterator[None]:
    """Around a fork (kai_opt.formulation.child): the one garbage-collector rule for forked processes.

    The child must leave the heap it inherits alone: a collection there touches every object it walks and so copies
    the page (copy-on-write), up to the whole heap. With the collector on, the heap is frozen for the fork (the child
    starts with all of it in the permanent generation; this process unfreezes at once). With it paused (gc_paused,
    as run_cycle does) the child inherits the pause, and nothing is frozen: freezing inside a pause would move the
    block's uncollected garbage to the oldest generation on unfreeze, where it waits for a rare full collection
    (measured: docs/DESIGN-NOTES.md, "Scale").
    """
    freeze = gc.isenabled()
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
