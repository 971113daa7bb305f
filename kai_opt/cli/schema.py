"""`kai-opt schema`: the JSON Schema of kai-opt's native scenario format (kai_opt/schemas/scenario.schema.json)."""

from __future__ import annotations

import json
import sys
from importlib import resources

import typer

from kai_opt.cli.app import app


def schema_text() -> str:
    """The schema generated from the scenario models (tests keep the committed file equal to it)."""
    from kai_opt.loaders.scenario import scenario_json_schema

    return json.dumps(scenario_json_schema(), indent=2) + "\n"


def committed_schema_text() -> str:
    """The schema as committed in kai_opt/schemas/scenario.schema.json (read, nothing imported)."""
    return resources.files("kai_opt").joinpath("schemas", "scenario.schema.json").read_text(encoding="utf-8")


@app.command()
def schema(
    generate: bool = typer.Option(False, "--generate", help="Generate it from the scenario models instead of "
                                  "printing the committed file (to regenerate that file)"),
) -> None:
    """Print the JSON Schema of the scenario format (`kind: Scenario`), for editors and validation."""
    sys.stdout.write(schema_text() if generate else committed_schema_text())
