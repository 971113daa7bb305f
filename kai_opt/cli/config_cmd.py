"""`kai-opt config`: print the documented default configuration, or validate a file."""

from __future__ import annotations

from pathlib import Path

import typer

from kai_opt.cli.app import app
from kai_opt.config import default_config_yaml, load_config, reference_table


@app.command("config")
def config_command(
    print_default: bool = typer.Option(False, "--print-default", help="Print the default configuration (YAML)"),
    check: Path | None = typer.Option(None, "--check", help="Validate a config file and print it resolved"),
    reference: bool = typer.Option(False, "--reference", help="Every setting as a markdown table"),
) -> None:
    """Print the default configuration, or check a configuration file (one-line error naming the field)."""
    if reference:
        typer.echo(reference_table(), nl=False)
        return
    if check is not None:
        cfg = load_config(check)
        typer.echo(f"{check}: valid (engine {cfg.engine.value}, time budget {cfg.solver.time_budget_s:g}s)")
        return
    if print_default or check is None:
        typer.echo(default_config_yaml(), nl=False)
