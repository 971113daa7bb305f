"""The typer application and shared option types."""

from __future__ import annotations

from enum import StrEnum

import typer

app = typer.Typer(
    name="kai-opt",
    help="Optimization-based Kubernetes scheduler for AI/GPU clusters (KAI-Scheduler compatible).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Output(StrEnum):
    table = "table"
    json = "json"


class OutputWithYaml(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def _version(value: bool) -> None:
    if value:
        from kai_opt import __version__

        typer.echo(f"kai-opt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Optimization-based Kubernetes scheduler for AI/GPU clusters (KAI-Scheduler compatible)."""
