"""Inner loops numba compiles in long-lived processes (numba: the approved dependency for an inner loop that array
operations cannot make fast enough).

A `Kernel` has two forms that give the same results: its numpy form (the reference, and what every process uses
by default) and plain loops numba compiles. A long-lived process (`kai-opt run`, `kai-opt simulate`, the
multi-cycle benchmarks) asks for the compiled forms once (`compile_when_used`); each kernel then compiles, or loads
from numba's cache, at its first call. Importing numba and loading the code take about half a second, more than a
one-shot solve saves, so a one-shot process keeps the numpy forms. The compiled form is an accelerator: if loading
or running it raises (numba compiles a signature at its first call, before the loops change their arrays), the
process logs why and that kernel keeps its numpy form; the cycle goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kai_opt.compiled")

_when_used: list[bool] = []  # set by compile_when_used()
_inner: list[Callable[..., Any]] = []  # set by inner()


def inner(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a plain function that kernels' loops call: compiled with them (numba compiles calls to compiled code
    only; the loops' module then calls the compiled one, in either form, with the same results)."""
    _inner.append(fn)
    return fn


def compile_when_used() -> None:
    """For a long-lived process: every kernel runs its compiled loops from its first call on."""
    _when_used[:] = [True]


class Kernel:
    """One inner loop in its two forms (module docstring); calling it runs the form in use."""

    def __init__(self, name: str, loops: Callable[..., Any], numpy_form: Callable[..., Any]) -> None:
        self.name, self.loops, self.numpy_form = name, loops, numpy_form
        self.compiled: list[Callable[..., Any]] = []  # set by use_compiled()
        self.failed = False  # the compiled form raised once: this process keeps the numpy form

    def use_compiled(self) -> bool:
        """Compile the loops (or load them from numba's cache) and use them from now on; False without numba."""
        if self.compiled:
            return True
        try:
            import numba
        except ImportError:
            return False
        names = self.loops.__globals__
        for helper in _inner:
            if names.get(helper.__name__) is helper:
                names[helper.__name__] = _jit(numba, helper)
        self.compiled.append(_jit(numba, self.loops))
        return True

    def wanted(self) -> bool:
        """Whether a call runs (or first compiles) the compiled loops: a caller whose numpy form is its own path
        prepares the loops' arguments only then."""
        return bool(self.compiled) or (bool(_when_used) and not self.failed)

    def __call__(self, *args: Any) -> Any:
        if _when_used and not self.compiled and not self.failed:
            try:
                self.use_compiled()
            except Exception:
                self._give_up("loading")
        if self.compiled:
            try:
                return self.compiled[0](*args)
            except Exception:
                self._give_up("running")
        return self.numpy_form(*args)

    def _give_up(self, what: str) -> None:
        log.warning("the compiled %s failed %s; this process keeps the numpy form", self.name, what, exc_info=True)
        self.compiled.clear()
        self.failed = True


def _jit(numba: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    try:
        out: Callable[..., Any] = numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable cache location: compile in memory
        out = numba.njit(nogil=True)(fn)
    return out
