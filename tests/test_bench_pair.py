"""scripts/bench_pair.py runs two trees' cycles together and reports paired ratios (here the same tree twice, on a
tiny scale instance: the script's plumbing, not a speed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_two_sides_run_together_and_report_each_phase(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_pair.py"), str(ROOT), str(ROOT),
                          "--nodes", "20", "--rounds", "2", "--cycles", "1", "--cache-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert sum(line.startswith("round ") for line in lines) == 2
    header = next(line for line in lines if line.split()[:1] == ["cycle"])
    assert header.split()[:2] == ["cycle", "allocate"]
    ratios = next(line for line in lines if line.startswith("new/base")).split()[1:]
    assert len(ratios) == len(header.split()) and all(float(r) > 0 for r in ratios[:2])
    assert list(tmp_path.glob("kai-opt-greedy-20-200-20-0.pkl"))  # the instance, built once and cached


def test_a_side_that_is_not_a_tree_or_revision_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_pair.py"), "no-such-revision", str(ROOT),
                          "--nodes", "20", "--rounds", "1", "--cycles", "1", "--cache-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 2
    assert out.stderr.strip() == "bench_pair: 'no-such-revision' is neither a directory nor a git revision"
