"""Kubernetes resource quantities and kai-opt's internal units.

Internal units (int64 everywhere in the engine):
  cpu     millicores
  memory  bytes
  gpu     milli-GPUs (1000 = one whole device), so fractions are exact integers
  pods    count
  other   the quantity's integer value (extended resources)
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from kai_opt.limits import MAX_AMOUNT, MAX_GPUS_PER_NODE

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI = 1000  # milli-GPUs per device

_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DEC = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
        "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
        "P": Decimal("1e15"), "E": Decimal("1e18")}
_QTY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


@lru_cache(maxsize=4096)
def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "16Gi", "1e3", 2) into an exact Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"invalid quantity {value!r}")
        return Decimal(repr(value))
    text = str(value).strip()
    m = _QTY.match(text)
    if not m:
        raise QuantityError(f"invalid quantity {value!r}")
    number, exponent, suffix = m.groups()
    digits = exponent[1:].lstrip("+-").lstrip("0") if exponent else ""
    if len(digits) > 3 or int(digits or 0) > _MAX_EXPONENT:  # checked before int() of the whole text
        raise QuantityError(f"quantity {_short(text)} is out of range (exponent beyond {_MAX_EXPONENT})")
    try:
        base = Decimal(number)
        if exponent:
            return base * (Decimal(10) ** (-int(digits or 0) if exponent[1] == "-" else int(digits or 0)))
        if suffix in _BIN:
            return base * _BIN[suffix]
        return base * _DEC[suffix or ""]
    except InvalidOperation as exc:  # pragma: no cover - regex already guards
        raise QuantityError(f"invalid quantity {value!r}") from exc


_MAX_EXPONENT = 40  # 1e40 is far beyond any amount the state holds; Decimal's own limits are never reached


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _ceil(d: Decimal) -> int:
    return int(d.to_integral_value(rounding="ROUND_CEILING"))


def to_internal(resource: str, value: str | int | float) -> int:
    """Quantity of `resource` in kai-opt's internal integer unit (see module docstring)."""
    if type(value) is str:  # snapshots repeat the same few quantities: convert each once
        return _text_to_internal(resource, value)
    return _to_internal(resource, value)


@lru_cache(maxsize=1 << 16)
def _text_to_internal(resource: str, value: str) -> int:
    return _to_internal(resource, value)


def _to_internal(resource: str, value: str | int | float) -> int:
    if not isinstance(value, str | int | float):  # a mapping or list where a quantity belongs
        raise QuantityError(f"expected a quantity such as 8, 500m or 64Gi, got a {type(value).__name__}")
    q = parse_quantity(value)
    if q < 0:
        raise QuantityError(f"negative quantity {value!r}")
    if resource == "cpu":
        amount = _ceil(q * 1000)
    elif resource == GPU_RESOURCE:
        amount = _ceil(q * GPU_MILLI)
        if amount > MAX_GPUS_PER_NODE * GPU_MILLI:  # the state allocates one slot per device
            raise QuantityError(f"quantity {_short(str(value))} is above {MAX_GPUS_PER_NODE} GPU devices")
        return amount
    else:
        amount = _ceil(q)
    if amount > MAX_AMOUNT:  # amounts are int64 and added up in float64: keep them exact
        raise QuantityError(f"quantity {_short(str(value))} is too large (at most 2^53 internal units)")
    return amount


def gpu_milli_from_fraction(fraction: float) -> int:
    """A GPU fraction (0 < f < 1) as milli-GPUs, rounded to the nearest milli and at least 1."""
    return max(1, min(GPU_MILLI, round(fraction * GPU_MILLI)))


def format_quantity(resource: str, value: int | float) -> str:
    """Human form of an internal value: cpu cores, memory GiB, GPUs (fractional)."""
    if resource == "cpu":
        return f"{value / 1000:g}"
    if resource == "memory":
        return f"{value / 2**30:.1f}Gi"
    if resource in ("gpu", GPU_RESOURCE):
        return f"{value / GPU_MILLI:g}"
    return f"{value:g}"
