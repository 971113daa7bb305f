"""Bounds on what an input may ask for, checked once where a value is read (files and the watch cache).

Two kinds of bound:
- ceilings on sizes (objects, bytes, documents, nesting), sized for a 50,000-node / 1,000,000-pod cluster and
  overridable by environment variable (`KAI_OPT_MAX_NODES=100000`), read when checked;
- ranges of single numbers, fixed by what the cluster state holds (int32 counts and priorities, int64 amounts
  summed in float64, GPU devices allocated per node).

Every violation is an `InputError` naming the object and field, so the CLI prints one line and exits with 2.
"""

from __future__ import annotations

import math
import os
from typing import Any

from kai_opt.errors import InputError

# -- ceilings (environment: KAI_OPT_<NAME>) -----------------------------------------------------------------------
DEFAULTS: dict[str, int] = {
    "MAX_NODES": 50_000,
    "MAX_PODS": 1_000_000,
    "MAX_QUEUES": 10_000,
    "MAX_GPU_DEVICES": 1_000_000,  # GPU devices of all nodes (the state has a slot per device): 50,000 x 16 fit
    "MAX_PODGROUPS": 1_000_000,
    "MAX_INPUT_BYTES": 2 << 30,  # a file, or a ZIP member once decompressed: ~2 KB per pod at 1,000,000 pods
    "MAX_DOCUMENTS": 2_000_000,  # YAML documents in one file (one per object at most)
    "MAX_DEPTH": 100,  # nesting of mappings and lists; a Kubernetes object needs about 15
    "MAX_ZIP_RATIO": 200,  # decompressed / compressed size of a ZIP member; JSON snapshots compress ~10-30x
    "MAX_ALIAS_RATIO": 100,  # nodes of a YAML document with its aliases expanded / without (billion laughs)
}
_KIND_CEILING = {"Node": "MAX_NODES", "Pod": "MAX_PODS", "Queue": "MAX_QUEUES", "PodGroup": "MAX_PODGROUPS",
                 "GPU devices": "MAX_GPU_DEVICES"}


def ceiling(name: str) -> int:
    """The ceiling `name` (a key of DEFAULTS), from KAI_OPT_<name> when set to a positive whole number."""
    raw = os.environ.get(f"KAI_OPT_{name}")
    if raw is None or raw.strip() == "":
        return DEFAULTS[name]
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(f"must be a positive whole number, got {raw!r}", source=f"environment KAI_OPT_{name}")
    return value


def over_ceiling(counts: dict[str, int]) -> tuple[str, str] | None:
    """(kind, message) of the first kind whose count is above its ceiling, else None."""
    for kind, n in counts.items():
        name = _KIND_CEILING.get(kind)
        if name is None:
            continue
        limit = ceiling(name)
        if n > limit:
            what = kind if kind.endswith("s") else f"{kind} objects"
            return kind, f"{n:,} {what}, above the ceiling of {limit:,} (set KAI_OPT_{name} to raise it)"
    return None


def check_counts(counts: dict[str, int], *, source: str | None, line: int | None = None,
                 obj: str | None = None) -> None:
    """Refuse an input that would create more objects of a kind than its ceiling (called before allocating)."""
    over = over_ceiling(counts)
    if over is not None:
        raise InputError(f"holds {over[1]}", source=source, line=line, obj=obj)


# -- ranges of single numbers -------------------------------------------------------------------------------------
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # priorities, counts and indexes are int32 in the cluster state
MAX_AMOUNT = 2**53  # a resource amount in internal units (cpu millicores, memory bytes, ...): exact in float64
MAX_GPUS_PER_NODE = 1024  # GPU devices of one node (or asked by one pod); the state allocates one slot per device
MAX_GPU_MEMORY_MIB = 2**30  # memory of one GPU device (1 PiB)
MAX_DURATION_S = 100 * 365 * 86_400.0  # min runtimes, grace periods, ages: 100 years
MIN_EPOCH_S, MAX_EPOCH_S = -62_135_596_800.0, 253_402_300_799.0  # years 1 to 9999 (what datetime represents)
MAX_WEIGHT = 1e9  # over-quota weights (relative, divided among siblings)


def number(value: Any, *, obj: str | None, field: str | None, lo: float, hi: float, whole: bool = False,
           unlimited: float | None = None) -> Any:
    """`value` unchanged when it is a finite number in [lo, hi] (or exactly `unlimited`, e.g. -1), a whole one when
    `whole`; otherwise an InputError. bool is not a number here (YAML `yes` is not 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "a whole number" if whole else "a number"
        raise InputError(f"expected {kind}, got {_shown(value)}", obj=obj, field=field)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"must be a finite number, got {value}", obj=obj, field=field)
    if whole and not isinstance(value, int):
        raise InputError(f"expected a whole number, got {_shown(value)}", obj=obj, field=field)
    if unlimited is not None and value == unlimited:
        return value
    if not lo <= value <= hi:
        extra = f" or {unlimited:g} (unlimited)" if unlimited is not None else ""
        raise InputError(f"must be between {_bound(lo)} and {_bound(hi)}{extra}, got {_shown(value)}", obj=obj,
                         field=field)
    return value


def _bound(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def _shown(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # repr of a huge int is slow, or refused
        return f"a number of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
