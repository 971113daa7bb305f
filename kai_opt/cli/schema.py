"""`kai-opt schema`: the JSON Schema of kai-opt's native scenario format (kai_opt/schemas/scenario.schema.json)."""

from __future__ import annotations

import json
import sys

from kai_opt.cli.app import app


def schema_text() -> str:
    """The schema exactly as committed in kai_opt/schemas/scenario.schema.json."""
    from kai_opt.loaders.scenario import scenario_json_schema

    return json.dumps(scenario_json_schema(), indent=2) + "\n"


@app.command()
def schema() -> None:
    """Print the JSON Schema of the scenario format (`kind: Scenario`), for editors and validation."""
    sys.stdout.write(schema_text())
