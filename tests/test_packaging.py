"""Packaging: the lock agrees with pyproject, the image context keeps what `kai-opt bench` needs, one version
source, py.typed, and plotting without the `bench` extra is one clear line (exit code 2)."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from builders import run_cli
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import kai_opt
from kai_opt.lockfile import LOCK_FILE, dependencies, dependencies_digest, parse

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _lock() -> tuple[str | None, dict]:
    return parse((REPO / LOCK_FILE).read_text())


def test_the_lock_was_written_from_the_current_pyproject_dependencies() -> None:
    digest, _ = _lock()
    assert digest == dependencies_digest(dependencies(REPO / "pyproject.toml")), "run scripts/lock"


def test_every_dependency_is_locked_at_a_version_it_allows_with_hashes() -> None:
    _, entries = _lock()
    assert len(entries) >= 20
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        entry = entries.get(canonicalize_name(req.name))
        assert entry is not None, f"{req.name} is not in {LOCK_FILE} (run scripts/lock)"
        assert req.specifier.contains(entry.version, prereleases=True), (spec, entry.version)
    for entry in entries.values():
        assert entry.name == canonicalize_name(entry.name)
        assert 1 <= len(entry.hashes) <= 2 and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in entry.hashes)
    text = (REPO / LOCK_FILE).read_text()
    assert sum(1 for line in text.splitlines() if "==" in line) == len(entries)  # every pin parsed


def test_bench_only_packages_are_an_extra_and_not_in_the_image() -> None:
    deps = {canonicalize_name(Requirement(d).name) for d in PYPROJECT["project"]["dependencies"]}
    bench = {canonicalize_name(Requirement(d).name) for d in PYPROJECT["project"]["optional-dependencies"]["bench"]}
    assert "matplotlib" in bench and not deps & bench
    assert "matplotlib" not in _lock()[1]


def test_one_version_source() -> None:
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kai_opt.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", kai_opt.__version__)
    with pytest.raises(metadata.PackageNotFoundError) if _not_installed() else _nothing():
        assert metadata.version("kai-opt") == kai_opt.__version__
    chart = (REPO / "deploy/helm/kai-opt/Chart.yaml").read_text()
    assert f"version: {kai_opt.__version__}\n" in chart and f"appVersion: {kai_opt.__version__}\n" in chart
    assert not re.search(r"\d+\.\d+\.\d+", (REPO / "Dockerfile").read_text().split("FROM", 1)[1].split("\n", 1)[1]
                         .replace("3.11", "")), "the Dockerfile names no kai-opt version"


def _not_installed() -> bool:
    try:
        metadata.version("kai-opt")
    except metadata.PackageNotFoundError:
        return True
    return False


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_py_typed_ships_with_the_package() -> None:
    assert (REPO / "kai_opt" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["kai_opt"]


def _pattern(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex (Go's filepath.Match plus `**`: any number of directories)."""
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(glob[i], re.escape(glob[i]))
            i += 1
    return re.compile(out)


def _dockerignore_keeps(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its directories decides; `!` keeps."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    keep = True
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        rx = _pattern(line.lstrip("!").strip("/"))
        if any(rx.fullmatch(p) for p in prefixes):
            keep = line.startswith("!")
    return keep


def test_the_image_context_keeps_what_the_image_installs_and_bench_needs() -> None:
    for path in ("pyproject.toml", "README.md", LOCK_FILE, "kai_opt/__init__.py", "kai_opt/py.typed",
                 "kai_opt/k8s/manifests/crds.yaml", "models/__init__.py", "models/generators/__init__.py",
                 "models/examples/quickstart.yaml"):
        assert (REPO / path).exists(), path
        assert _dockerignore_keeps(path), f".dockerignore drops {path}"
    for path in ("tests/test_packaging.py", "docs/DESIGN-NOTES.md", ".git/HEAD", "kai_opt/__pycache__/x.pyc",
                 "models/generators/__pycache__/x.pyc", "deploy/helm/kai-opt/Chart.yaml"):
        assert not _dockerignore_keeps(path), f".dockerignore keeps {path}"


def test_the_dockerfile_is_multi_stage_locked_and_non_root() -> None:
    text = (REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert len(froms) == 2 and all(image == "${BASE_IMAGE}" for image, _ in froms), froms
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base is not None and re.fullmatch(r"python:3\.11-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base.group(1))
    assert f"--require-hashes --no-deps -r {LOCK_FILE}" in text
    assert "COPY models ./models" in text
    assert re.search(r"^USER 65532:65532$", text, re.M)
    assert text.rstrip().splitlines()[-2].startswith("ENTRYPOINT")


@pytest.mark.parametrize("args", [("simulate", "models/examples/quickstart.yaml", "--plot", "x.png"),
                                  ("bench", "run", "--quick", "--plot", "plots")])
def test_plot_without_matplotlib_is_one_line_naming_the_extra(args: tuple[str, ...], capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.chdir(tmp_path)
    args = tuple(str(REPO / a) if a.startswith("models/") else a for a in args)
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--plot needs matplotlib" in err and "pip install 'kai-opt[bench]'" in err
    assert not list(tmp_path.iterdir())  # refused before any work


def test_the_chart_runs_the_images_user_on_a_read_only_root_filesystem() -> None:
    from kai_opt.k8s.manifests import render_manifests

    [deploy] = [o for o in render_manifests({}) if o["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    [container] = pod["containers"]
    user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert user is not None
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(user.group(1)), int(user.group(2)))
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]  # the one writable place
