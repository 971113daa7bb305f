"""The eviction-model probe (scripts/probe_model_evictions.py, issue 16 item 3): whatever solution CP-SAT returns,
every reclaim it decides must pass KAI's own reclaim predicates in turn, which is what the probe's numbers in
DESIGN-NOTES rest on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_module import load_script


@pytest.fixture(scope="module")
def probe() -> object:
    return load_script("probe_model_evictions")


def test_every_modelled_reclaim_passes_kais_predicates(probe: object, tmp_path: Path) -> None:
    from kai_opt.fairshare import compute_fair_share

    st = probe._state(str(tmp_path), 1000, 0)  # type: ignore[attr-defined]
    fs = compute_fair_share(st)
    out = probe.probe_bundles(st, fs, 100, 1.0, preempt=True, hint=True)  # type: ignore[attr-defined]
    verdicts = {k: v for k, v in out.items() if not k.endswith(" groups")}
    assert out["reclaim groups"] > 0  # the hint alone places some: a complete, feasible start
    assert verdicts == {"allowed": out["reclaim groups"]}


def test_shared_greedy_reclaims_pass_the_checker_and_kais_predicates(probe: object, tmp_path: Path) -> None:
    """The node-sharing greedy (reclaim, then preempt), replayed on the session with KAI's scenario simulation: the
    plan passes check_plan (inside the probe; it raises otherwise) and every reclaim as made passes KAI's predicates
    in turn."""
    from kai_opt.fairshare import compute_fair_share

    st = probe._state(str(tmp_path), 1000, 0)  # type: ignore[attr-defined]
    fs = compute_fair_share(st)
    out = probe.probe_shared(st, fs, spread=True, hint_order="queue", rule="turn",  # type: ignore[attr-defined]
                             preempt=True)
    verdicts = {k: v for k, v in out.items() if not k.endswith(" groups")}
    assert out["reclaim groups"] > 0 and out["preempt groups"] > 0
    assert verdicts == {"allowed": out["reclaim groups"]}
