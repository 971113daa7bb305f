"""CEL selectors over DRA devices: each expression is compiled once and evaluated once per device.

The device is exposed as Kubernetes exposes it: `device.driver`, `device.attributes[<domain>].<name>`,
`device.capacity[<domain>].<name>` (capacities as integers in base units). An expression that fails on a device
(a missing attribute, a type error) does not select it; one that does not compile selects nothing and is named in
the evaluator's `errors`.
"""

from __future__ import annotations

from typing import Any

import cel

from kai_opt.api.dra import Device


def device_context(driver: str, device: Device) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {}
    for k, v in device.attributes.items():
        domain, _, name = k.rpartition("/")
        attrs.setdefault(domain, {})[name] = v
    cap: dict[str, dict[str, Any]] = {}
    for k, q in device.capacity.items():
        domain, _, name = k.rpartition("/")
        cap.setdefault(domain, {})[name] = q
    return {"device": {"driver": driver, "attributes": attrs, "capacity": cap}}


def _frozen(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    return (type(v).__name__, v)


class SelectorCache:
    """(expression, device) -> bool, each pair evaluated at most once; devices alike in driver, attributes and
    capacity (the same model on many nodes) share one evaluation."""

    def __init__(self, contexts: list[dict[str, Any]]) -> None:
        self.contexts = contexts  # per device index: its CEL activation
        alike: dict[Any, int] = {}
        self._alike = [alike.setdefault(_frozen(c), len(alike)) for c in contexts]  # device -> content id
        self._programs: dict[str, Any] = {}
        self._results: dict[tuple[str, int], bool] = {}
        self.errors: dict[str, str] = {}  # expression -> why it does not compile
        self.evaluations = 0  # CEL programs run
        self.lookups = 0  # (expression, device) questions answered

    def compiled(self, expr: str) -> Any:
        """The expression's program (None when it does not compile, with why in `errors`)."""
        if expr not in self._programs:
            try:
                self._programs[expr] = cel.compile(expr)
            except (ValueError, RuntimeError) as exc:
                self.errors[expr] = str(exc).splitlines()[0]
                self._programs[expr] = None
        return self._programs[expr]

    def matches(self, expr: str, device: int) -> bool:
        self.lookups += 1
        key = (expr, self._alike[device])
        hit = self._results.get(key)
        if hit is None:
            prog = self.compiled(expr)
            hit = False
            if prog is not None:
                self.evaluations += 1
                try:
                    hit = prog.execute(self.contexts[device]) is True
                except Exception:
                    hit = False
            self._results[key] = hit
        return hit

    def all_match(self, exprs: tuple[str, ...], device: int) -> bool:
        return all(self.matches(e, device) for e in exprs)
