"""The helm binary for the chart's tests (scripts/build-testbin builds it into helm-<version>/ beside the cluster
binaries' directory) and `helm template` parsed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .testcluster import REPO, ClusterStartError, find_testbin

CHART = REPO / "deploy" / "helm" / "kai-opt"


def helm_version() -> str:
    """The default HELM_VERSION of scripts/build-testbin (the one place it is written)."""
    text = (REPO / "scripts" / "build-testbin").read_text(encoding="utf-8")
    m = re.search(r'^HELM_VERSION="\$\{HELM_VERSION:-([^}]+)\}"', text, re.M)
    assert m, "HELM_VERSION not found in scripts/build-testbin"
    return m.group(1)


def find_helm() -> Path:
    """$KAI_OPT_HELM when executable, else build-testbin's helm (built when missing)."""
    env = os.environ.get("KAI_OPT_HELM")
    if env and os.access(env, os.X_OK):
        return Path(env)
    root = find_testbin().parent
    helm = root / f"helm-{helm_version()}" / "helm"
    if not os.access(helm, os.X_OK):
        proc = subprocess.run([str(REPO / "scripts" / "build-testbin"), "helm"], capture_output=True, text=True,
                              check=False, env={**os.environ, "KAI_OPT_TESTBIN": str(root)})
        if proc.returncode != 0 or not os.access(helm, os.X_OK):
            raise ClusterStartError(f"scripts/build-testbin helm failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return helm


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(find_helm()), *args], capture_output=True, text=True, check=check, timeout=300)


def helm_template(values_file: Path, namespace: str, *, crds: bool = True) -> list[dict[str, Any]]:
    """`helm template kai-opt deploy/helm/kai-opt -n NAMESPACE -f VALUES [--include-crds]`, parsed."""
    out = helm("template", "kai-opt", str(CHART), "-n", namespace, "-f", str(values_file),
               *(["--include-crds"] if crds else [])).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def write_values(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path
