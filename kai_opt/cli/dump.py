"""`kai-opt dump`: the cluster's scheduling objects as one kubectl-style List (a snapshot for every other command)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from enum import StrEnum
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


class DumpFormat(StrEnum):
    yaml = "yaml"
    json = "json"


@app.command()
def dump(
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, "
                                           "~/.kube/config, or in-cluster config inside a pod)"),
    context: str | None = typer.Option(None, "--context", help="kubeconfig context (default: current)"),
    file: Path | None = typer.Option(None, "--file", "-f", help="write to FILE instead of stdout (`-`: stdout)"),
    output: DumpFormat = typer.Option(DumpFormat.yaml, "--output", "-o", help="Output format: yaml or json (both "
                                      "are snapshots every command reads)"),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="only the Pods and PodGroups of this "
                                         "namespace (cluster-scoped kinds stay whole)"),
    all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="every namespace (the default; "
                                        "overrides -n)"),
) -> None:
    """Nodes, Pods, PodGroups, Queues, PriorityClasses and Topologies as one YAML List (managedFields removed)."""
    from kai_opt.k8s.client import make_api_client
    from kai_opt.k8s.dump import dump_cluster

    to_stdout = file is None or str(file) == "-"
    if file is not None and not to_stdout:
        _check_writable(file)  # before the (possibly long) listing
    with make_api_client(kubeconfig=kubeconfig, context=context) as api:
        data = dump_cluster(api, note=lambda m: print(f"kai-opt: note: {m}", file=sys.stderr))
    ns = None if all_namespaces else namespace
    if ns is not None:
        data["items"] = [o for o in data["items"]
                         if o["kind"] not in ("Pod", "PodGroup") or (o.get("metadata") or {}).get("namespace") == ns]
    write = write_json if output == DumpFormat.json else write_yaml
    if file is None or to_stdout:
        write(data, sys.stdout)
        return
    _write_file(file, data, write)
    counts: dict[str, int] = {}
    for item in data["items"]:
        counts[item["kind"]] = counts.get(item["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no objects"
    print(f"kai-opt: wrote {summary} to {file}", file=sys.stderr)


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


def write_json(data: Any, stream: Any) -> None:
    json.dump(data, stream, indent=2)
    stream.write("\n")


def _write_file(path: Path, data: Any, write: Callable[[Any, Any], None] = write_yaml) -> None:
    """Write atomically: a partial dump never replaces a good one."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(data, f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a dump is an ordinary file
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from exc
