"""The README's configuration reference is the code's (`kai-opt config --reference`)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kai_opt.config import parse_config, reference_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_reference_matches_the_code() -> None:
    text = README.read_text()
    m = re.search(r"<!-- config-reference:start -->\n(.*?)<!-- config-reference:end -->", text, re.S)
    assert m, "README.md lacks the config-reference markers"
    assert m.group(1) == reference_table()


def test_readme_config_example_is_valid() -> None:
    text = README.read_text()
    section = text[text.index("## Configuration"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example
    cfg = parse_config(yaml.safe_load(example.group(1)), source="README.md")
    assert cfg.engine.value == "cpsat" and not cfg.actions.consolidate
