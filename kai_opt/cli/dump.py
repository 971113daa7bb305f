"""`kai-opt dump`: the cluster's scheduling objects as one kubectl-style List (a snapshot for every other command)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer
import yaml

from kai_opt.cli.app import app
from kai_opt.errors import InputError

try:  # the C emitter is much faster on large clusters
    _Dumper: type = yaml.CSafeDumper
except AttributeError:  # pragma: no cover
    _Dumper = yaml.SafeDumper


@app.command()
def dump(
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, "
                                           "~/.kube/config, or in-cluster config inside a pod)"),
    context: str | None = typer.Option(None, "--context", help="kubeconfig context (default: current)"),
    output: Path | None = typer.Option(None, "--output", "-o", help="write to FILE instead of stdout"),
) -> None:
    """Nodes, Pods, PodGroups, Queues, PriorityClasses and Topologies as one YAML List (managedFields removed)."""
    from kai_opt.k8s.client import make_api_client
    from kai_opt.k8s.dump import dump_cluster

    to_stdout = output is None or str(output) == "-"
    if output is not None and not to_stdout:
        _check_writable(output)  # before the (possibly long) listing
    with make_api_client(kubeconfig=kubeconfig, context=context) as api:
        data = dump_cluster(api, note=lambda m: print(f"kai-opt: note: {m}", file=sys.stderr))
    if output is None or to_stdout:
        write_yaml(data, sys.stdout)
        return
    _write_file(output, data)
    counts: dict[str, int] = {}
    for item in data["items"]:
        counts[item["kind"]] = counts.get(item["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no objects"
    print(f"kai-opt: wrote {summary} to {output}", file=sys.stderr)


def write_yaml(data: Any, stream: Any) -> None:
    yaml.dump(data, stream, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
              width=1 << 16)


def _check_writable(path: Path) -> None:
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError("is a directory", source=str(path))
    if not directory.is_dir():
        raise InputError(f"directory {directory} does not exist", source=str(path))
    if not os.access(directory, os.W_OK):
        raise InputError(f"directory {directory} is not writable", source=str(path))


def _write_file(path: Path, data: Any) -> None:
    """Write atomically: a partial dump never replaces a good one."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write_yaml(data, f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a dump is an ordinary file
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from exc
