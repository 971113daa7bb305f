"""scripts/bench_report.py rebuilds README's Benchmarks section from the stored parts only while the section is what
it last wrote there: results recorded in it by hand are never silently dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from script_module import load_script


@pytest.fixture
def report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    br = load_script("bench_report")
    out = tmp_path / "docs" / "bench"
    out.mkdir(parents=True)
    (out / "state.md").write_text("### Snapshot to cluster state\n\nold numbers\n")
    monkeypatch.setattr(br, "OUT", out)
    monkeypatch.setattr(br, "README", tmp_path / "README.md")
    monkeypatch.setattr(br, "ROOT", tmp_path)
    br.README.write_text(f"# x\n\n{br.START}\nplaceholder\n{br.END}\n")
    br.rebuild_readme()
    return br


def test_a_section_as_the_script_wrote_it_is_rebuilt(report: Any) -> None:
    assert not report.edited_by_hand()
    (report.OUT / "state.md").write_text("### Snapshot to cluster state\n\nnew numbers\n")
    assert report.main(["--readme-only"]) == 0
    assert "new numbers" in report.README.read_text() and "old numbers" not in report.README.read_text()


def test_a_section_with_results_added_by_hand_is_left_alone_unless_forced(report: Any) -> None:
    text = report.README.read_text().replace("old numbers\n", "old numbers\n\nRerun 2026-12-06: 42 pods/s\n")
    report.README.write_text(text)
    assert report.edited_by_hand()
    (report.OUT / "state.md").write_text("### Snapshot to cluster state\n\nnew numbers\n")
    assert report.main(["--readme-only"]) == 2
    assert report.README.read_text() == text
    assert report.main(["--readme-only", "--force"]) == 0
    assert "Rerun" not in report.README.read_text() and "new numbers" in report.README.read_text()
    assert not report.edited_by_hand()


def test_a_readme_the_script_never_wrote_counts_as_edited(report: Any) -> None:
    (report.OUT / report.DIGEST_FILE).unlink()
    assert report.edited_by_hand() and report.main(["--readme-only"]) == 2
