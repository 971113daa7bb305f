"""Start-up cost (issue 22 item 6): the CLI imports only what the command asked for uses, through the lazy
registry of kai_opt/cli/app.py; `kai-opt --help` lists the commands without importing them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kai_opt.cli.app import COMMANDS, app, load_command

HEAVY = ("kai_opt.engine", "kai_opt.heuristics", "kai_opt.formulation", "kai_opt.state", "kai_opt.loaders",
         "ortools", "scipy", "numpy", "kubernetes", "matplotlib")

_PROBE = """
import json, sys
from kai_opt.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print("\\n" + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("ortools", "scipy", "numpy",
      "kubernetes", "matplotlib") or m.startswith(("kai_opt.engine", "kai_opt.heuristics", "kai_opt.formulation",
      "kai_opt.state", "kai_opt.loaders")))))
"""


def _imported(args: list[str]) -> list[str]:
    """The heavy modules in sys.modules after `kai-opt ARGS` ran in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(proc.stdout.rstrip().rsplit("\n", 1)[-1])


def test_importing_the_entry_point_imports_nothing_heavy() -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys, kai_opt.cli.main; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, timeout=120, check=True)
    loaded = set(proc.stdout.split())
    assert not [m for m in loaded if m.split(".")[0] in ("ortools", "scipy", "numpy", "kubernetes", "pydantic")
                or m.startswith(HEAVY[:5])]
    # no command module either: each is imported when its command runs
    assert not [m for m in loaded if m.startswith("kai_opt.cli.") and m not in ("kai_opt.cli.app", "kai_opt.cli.main")]


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["config", "--print-default"], ["schema"],
                                  ["config", "--help"], ["show", "--help"]])
def test_light_commands_import_no_engine(args: list[str]) -> None:
    assert _imported(args) == []


def test_a_command_that_plans_loads_the_engine() -> None:
    """The probe sees heavy imports when there are some: solve on the bundled example plans with the engine."""
    assert "kai_opt.engine" in _imported(["solve", "models/examples/quickstart.yaml", "-o", "json"])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_registry_help_is_the_commands_docstring(name: str) -> None:
    """The help line `kai-opt --help` shows without importing equals the command's own help."""
    cmd = load_command(name)
    assert " ".join((cmd.help or "").split("\n\n")[0].split()) == COMMANDS[name].help


def test_every_registered_command_is_in_the_registry() -> None:
    from kai_opt.cli.app import load_all

    load_all()
    names = {info.name or (info.callback.__name__ if info.callback else "") for info in app.registered_commands}
    names |= {g.name for g in app.registered_groups if g.name}
    assert names <= set(COMMANDS), names - set(COMMANDS)


def test_python_dash_m_kai_opt() -> None:
    proc = subprocess.run([sys.executable, "-m", "kai_opt", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("kai-opt ")


def test_shell_completion_completes_commands_and_formats() -> None:
    """Completion is on (typer's add_completion): the shell asks the program itself, through _KAI_OPT_COMPLETE."""
    import os

    def complete(words: str) -> list[str]:
        env = {**os.environ, "_KAI_OPT_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
        proc = subprocess.run([sys.executable, "-m", "kai_opt"], capture_output=True, text=True, timeout=120,
                              env=env, check=False)
        return proc.stdout.split()

    assert complete("kai-opt ex") == ["explain"]
    assert complete("kai-opt show -o ") == ["table", "wide", "json", "yaml", "name"]


# -- issue 22 item 6: what each light command leaves out (scripts/bench_startup.py measures the time) ---------------
_MODULES_PROBE = """
import json, sys
from kai_opt.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print("\\n" + json.dumps(sorted(sys.modules)))
"""

NEVER_LIGHT = ("ortools", "scipy", "numpy", "pandas", "matplotlib", "kubernetes", "urllib3", "kai_opt.engine",
               "kai_opt.heuristics", "kai_opt.formulation", "kai_opt.state", "kai_opt.loaders", "kai_opt.api")


def _loaded(args: list[str]) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _MODULES_PROBE, json.dumps(args)], capture_output=True, text=True,
                          timeout=120, check=True)
    return set(json.loads(proc.stdout.rstrip().rsplit("\n", 1)[-1]))


def _any_of(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("args", [["--version"], ["config", "--print-default"], ["config"], ["schema"]])
def test_version_config_and_schema_import_neither_pydantic_nor_the_config_models(args: list[str]) -> None:
    """No pydantic at all: typer builds no coercer for options not given, `config --print-default` prints the
    committed default and `schema` the committed schema."""
    loaded = _loaded(args)
    assert _any_of(loaded, (*NEVER_LIGHT, "pydantic", "pydantic_core", "kai_opt.config", "yaml")) == []


def test_manifests_imports_no_kubernetes_client() -> None:
    """Rendering needs the config models (the config value is validated) but no Kubernetes client, no API
    models and no engine: the kinds, the webhook configuration and the default PriorityClasses come from modules
    that import none of them."""
    loaded = _loaded(["manifests"])
    assert _any_of(loaded, NEVER_LIGHT) == []
    assert "kai_opt.k8s.manifests" in loaded and "kai_opt.config" in loaded, "the probe ran the command"


def test_manifests_apply_still_finds_the_client() -> None:
    """The client's names of kai_opt.k8s are imported on first use (module __getattr__), the same objects."""
    import kai_opt.k8s
    from kai_opt.k8s import client

    assert kai_opt.k8s.make_api_client is client.make_api_client and kai_opt.k8s.ClusterError is client.ClusterError
    assert kai_opt.k8s.CRDS == client.CRDS
    with pytest.raises(AttributeError):
        kai_opt.k8s.no_such_name  # noqa: B018


def test_committed_default_config_is_the_models_default() -> None:
    """Regenerate with: kai-opt config --generate > kai_opt/schemas/default-config.yaml"""
    from kai_opt.cli.config_cmd import committed_default_config
    from kai_opt.config import default_config_yaml

    assert committed_default_config() == default_config_yaml()


@pytest.mark.parametrize("args", [["config", "--print-default"], ["config"], ["config", "--generate"]])
def test_config_prints_the_default(args: list[str]) -> None:
    from kai_opt.config import default_config_yaml

    proc = subprocess.run([sys.executable, "-m", "kai_opt", *args], capture_output=True, text=True, timeout=120,
                          check=True)
    assert proc.stdout == default_config_yaml()


@pytest.mark.parametrize(("args", "needle"), [
    (["manifests", "--replicas", "two"], "--replicas"),
    (["solve", "models/examples/quickstart.yaml", "-e", "nope"], "--engine"),
    (["simulate", "models/examples/quickstart.yaml", "--cycles", "x"], "--cycles"),
])
def test_given_values_are_still_coerced_by_typer(args: list[str], needle: str) -> None:
    """Only absent (None) values skip typer's coercer: a given bad value is the same one-line usage error."""
    proc = subprocess.run([sys.executable, "-m", "kai_opt", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("kai-opt: error: ") and needle in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
