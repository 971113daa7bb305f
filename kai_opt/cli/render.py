"""Printing helpers shared by commands: JSON to stdout, rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        _console = Console(soft_wrap=False, width=160 if not sys.stdout.isatty() else None)
    return _console


@contextmanager
def status_line(first: str) -> Iterator[Callable[[str], None]]:
    """A transient status line on stderr while long work runs, when stderr is a terminal (nothing when piped);
    yields the function that replaces its text."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield lambda _text: None
        return
    with err.status(first, spinner="dots") as status:
        yield status.update


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=_default))
    sys.stdout.write("\n")


def _default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def fmt_num(x: float) -> str:
    """-1 stays -1 (unlimited); floats without trailing zeros."""
    if x == -1:
        return "-1"
    if abs(x - round(x)) < 1e-9:
        return f"{round(x):d}"
    return f"{x:.3f}".rstrip("0").rstrip(".")


def warn_skipped(warnings: Iterable[Any]) -> None:
    """Objects a loader skipped (an apiVersion kai-opt does not read), one stderr line each: a plan printed
    without them must not look as if they had been read."""
    for w in warnings:
        if getattr(w, "reason", None) == "UnsupportedAPIVersion":
            print(f"kai-opt: warning: {w}", file=sys.stderr)
