"""Where a command reads its snapshot (kubectl conventions, issue 22): a file or directory, `-` (stdin), or, when
neither is given, the live cluster (--kubeconfig/--context, else $KUBECONFIG, ~/.kube/config, in-cluster) read
once through the watch cache code (kai_opt/k8s/live.py). Shared options and the output formats live here too."""

from __future__ import annotations

import sys
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kai_opt.errors import InputError, KaiOptError

if TYPE_CHECKING:
    from kai_opt.snapshot import Snapshot

STDIN = "-"
STDIN_NAME = "<stdin>"


class Format(StrEnum):
    """-o: table (default), wide (a table with more columns), json, yaml, name (`kind/ns/name`, one a line)."""

    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


class FormatNoName(StrEnum):
    """-o of commands whose output is no list of objects."""

    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


def snapshot_argument() -> Any:  # typer.Argument: typed Any, as typer types it
    return typer.Argument(None, help="Snapshot: kubectl YAML/JSON (file or directory), KAI zip, scenario; `-` "
                          "reads it from stdin; none: the live cluster (--kubeconfig/--context)")


def output_option(default: StrEnum) -> Any:  # typer.Option
    return typer.Option(default, "--output", "-o", help="Output format: " + ", ".join(type(default)))


def kubeconfig_option() -> Any:  # typer.Option
    return typer.Option(None, "--kubeconfig", help="Read the live cluster with this kubeconfig (default without a "
                        "snapshot: $KUBECONFIG, ~/.kube/config, in-cluster)")


def context_option() -> Any:  # typer.Option
    return typer.Option(None, "--context", help="kubeconfig context of the live cluster (default: current)")


def namespace_option(help: str = "Only pods and podgroups of this namespace in the output (the cycle still "
                     "sees the whole cluster)") -> Any:  # typer.Option
    return typer.Option(None, "--namespace", "-n", help=help)


def all_namespaces_option() -> Any:  # typer.Option
    return typer.Option(False, "--all-namespaces", "-A", help="Every namespace (the default; overrides -n)")


def namespace_filter(namespace: str | None, all_namespaces: bool) -> str | None:
    """The namespace the output is restricted to: None for all (-A wins over -n, as in kubectl)."""
    return None if all_namespaces else namespace


def load(snapshot: str | None, *, kubeconfig: Path | None = None, context: str | None = None,
         scheduler_names: tuple[str, ...] | None = None) -> Snapshot:
    """The snapshot of SNAPSHOT (file, directory, `-`), or of the live cluster when SNAPSHOT is not given."""
    if snapshot is not None and (kubeconfig is not None or context is not None):
        raise typer.BadParameter("give a snapshot or --kubeconfig/--context (the live cluster), not both",
                                 param_hint="SNAPSHOT")
    if snapshot is None:
        from kai_opt.k8s.live import read_cluster

        return read_cluster(kubeconfig=kubeconfig, context=context, scheduler_names=scheduler_names,
                            note=lambda m: print(f"kai-opt: note: {m}", file=sys.stderr))
    from kai_opt.loaders import load_snapshot

    if snapshot != STDIN:
        return load_snapshot(Path(snapshot), scheduler_names=scheduler_names)
    return _load_stdin(scheduler_names)


def _load_stdin(scheduler_names: tuple[str, ...] | None) -> Snapshot:
    """Stdin holds one snapshot file (YAML, JSON, a KAI zip, a scenario): written to a private temporary file and
    read by the file loaders; errors name `<stdin>`."""
    from kai_opt.limits import ceiling
    from kai_opt.loaders import load_snapshot

    limit = ceiling("MAX_INPUT_BYTES")
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"holds more than {limit:,} bytes (set KAI_OPT_MAX_INPUT_BYTES to raise it)",
                         source=STDIN_NAME)
    suffix = ".zip" if data.startswith(b"PK\x03\x04") else ".json" if data.lstrip()[:1] in (b"{", b"[") else ".yaml"
    with tempfile.TemporaryDirectory(prefix="kai-opt-stdin-") as tmp:
        path = Path(tmp) / f"stdin{suffix}"
        path.write_bytes(data)
        try:
            return load_snapshot(path, scheduler_names=scheduler_names)
        except InputError as exc:
            raise _renamed(exc, str(path)) from None


def _renamed(exc: InputError, path: str) -> InputError:
    source = exc.source.replace(path, STDIN_NAME) if exc.source else exc.source
    message = exc.message.replace(path, STDIN_NAME)
    return type(exc)(message, source=source, line=exc.line, obj=exc.obj, field=exc.field)


def one_of(what: str, **given: object) -> None:
    """A usage error unless exactly one of the options is given."""
    if sum(v is not None for v in given.values()) != 1:
        raise KaiOptError(f"give exactly one of {what}")
