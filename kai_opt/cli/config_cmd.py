"""`kai-opt config`: print the documented default configuration, or validate a file.

The default is printed from the committed kai_opt/schemas/default-config.yaml (a test keeps it equal to what the
config models give, `--generate`), so `config --print-default` imports neither the models nor pydantic.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import typer

from kai_opt.cli.app import app

DEFAULT_CONFIG_FILE = ("schemas", "default-config.yaml")  # in the kai_opt package


def committed_default_config() -> str:
    """The default configuration as committed in kai_opt/schemas/default-config.yaml (read, nothing imported)."""
    return resources.files("kai_opt").joinpath(*DEFAULT_CONFIG_FILE).read_text(encoding="utf-8")


@app.command("config")
def config_command(
    print_default: bool = typer.Option(False, "--print-default", help="Print the default configuration (YAML)"),
    check: Path | None = typer.Option(None, "--check", help="Validate a config file and print it resolved"),
    reference: bool = typer.Option(False, "--reference", help="Every setting as a markdown table"),
    generate: bool = typer.Option(False, "--generate", help="Build the default configuration from the config "
                                  "models instead of printing the committed file (to regenerate that file)"),
) -> None:
    """Print the default configuration, or check a configuration file (one-line error naming the field)."""
    if reference:
        from kai_opt.config import reference_table

        typer.echo(reference_table(), nl=False)
        return
    if check is not None:
        from kai_opt.config import load_config

        cfg = load_config(check)
        typer.echo(f"{check}: valid (engine {cfg.engine.value}, time budget {cfg.solver.time_budget_s:g}s)")
        return
    if generate:
        from kai_opt.config import default_config_yaml

        typer.echo(default_config_yaml(), nl=False)
        return
    typer.echo(committed_default_config(), nl=False)
