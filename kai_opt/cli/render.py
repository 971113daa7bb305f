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


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def human(resource: str, value: float) -> str:
    """A quantity in the units kubectl prints (the one helper for tables): memory in binary suffixes (`512Gi`,
    `1.5Gi`, `256Mi`), cpu in cores (`64`, `0.5` is `500m`), GPUs as a number; -1 (unlimited) stays -1."""
    if value == -1:
        return "-1"
    if resource == "memory":
        if value == 0:
            return "0"
        for suffix, size in _BINARY:
            if abs(value) >= size:
                n = value / size
                return f"{fmt_num(round(n, 1)) if abs(n - round(n)) > 1e-9 else round(n)}{suffix}"
        return fmt_num(value)
    if resource == "cpu":  # internal unit: millicores
        if abs(value - 1000 * round(value / 1000)) < 1e-6:
            return f"{round(value / 1000)}"
        return f"{fmt_num(value)}m"
    return fmt_num(value)


def print_yaml(data: Any) -> None:
    import yaml

    sys.stdout.write(yaml.safe_dump(json.loads(json.dumps(data, default=_default)), sort_keys=False))


def emit(data: Any, fmt: str, *, names: Callable[[], Iterable[str]] | None = None,
         table: Callable[[bool], None]) -> None:
    """Print in the output format `fmt` (kubectl's -o): json, yaml, name (one `kind/name` a line) or a table
    (`wide`: with more columns)."""
    if fmt == "json":
        print_json(data)
    elif fmt == "yaml":
        print_yaml(data)
    elif fmt == "name":
        if names is None:  # pragma: no cover - commands without names do not offer the format
            raise ValueError("no names")
        for n in names():
            sys.stdout.write(f"{n}\n")
    else:
        table(fmt == "wide")


def in_namespace(key: str | None, namespace: str | None) -> bool:
    """`ns/name` keys are kept when no namespace is asked for (all namespaces) or they are in it."""
    return namespace is None or (key or "").startswith(f"{namespace}/")
