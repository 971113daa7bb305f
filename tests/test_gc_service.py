"""`kai-opt run` sets the collector's thresholds for a long-lived process (kai_opt.gcpause.tune_for_service)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from builders import run_cli

from kai_opt import compiled
from kai_opt.gcpause import SERVICE_THRESHOLDS, tune_for_service


@pytest.fixture(autouse=True)
def _restore_thresholds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    monkeypatch.setattr(compiled, "_when_used", [])  # `run` also asks for the compiled inner loops
    yield
    gc.set_threshold(*before)


def test_tune_for_service_sets_the_thresholds() -> None:
    tune_for_service()
    assert gc.get_threshold() == SERVICE_THRESHOLDS
    assert SERVICE_THRESHOLDS[0] > 700  # fewer young collections than CPython's default


def test_young_collections_are_fewer_with_the_service_thresholds() -> None:
    def collections_for(n: int) -> int:
        counted = [0]

        def count(phase: str, info: dict[str, int]) -> None:
            if phase == "start" and info["generation"] == 0:
                counted[0] += 1

        gc.callbacks.append(count)
        try:
            keep = [[i] for i in range(n)]  # n tracked containers
        finally:
            gc.callbacks.remove(count)
        del keep
        return counted[0]

    default = collections_for(200_000)
    tune_for_service()
    tuned = collections_for(200_000)
    assert default >= 200 and tuned <= default // 10


def test_the_run_command_tunes_the_collector_first(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code, _out, err = run_cli(capsys, "run", "--config", str(tmp_path / "missing.yaml"), "--no-leader-elect")
    assert code == 2 and "missing.yaml" in err  # stopped at the config, after the tuning
    assert gc.get_threshold() == SERVICE_THRESHOLDS
