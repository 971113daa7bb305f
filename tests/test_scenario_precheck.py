"""The victim search's per-scenario precheck (victims._each_task_fits_somewhere): a scenario in which some task pod
fits no node of its signature, or (a required topology level) no domain the group may use could hold its tasks, even
with every victim so far evicted is skipped before KAI's scenario simulation and the placement attempt. It must be a
necessary condition of that placement, so skipping changes no plan."""

from __future__ import annotations

from typing import Any

import pytest

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.heuristics import victims
from kai_opt.heuristics.gang import GangPlacer
from kai_opt.heuristics.session import Session
from kai_opt.state import build_state

INSTANCES = ["openb:30:0", "openb:30:2", "openb:200:0", "fractions:30:0", "contention:30:1", "gangs:200:2",
             "topology:100:0", "topology:200:2"]


def _state(instance: str) -> Any:
    from models.generators import FAMILIES, as_snapshot

    fam, nodes, seed = instance.split(":")
    return build_state(as_snapshot(FAMILIES[fam].generate(int(nodes), int(seed))))


def _decisions(plan: Any) -> tuple[Any, ...]:
    return (sorted((p.pod, p.node, p.devices, p.pipelined, p.moved) for p in plan.placements),
            sorted((e.pod, e.reason) for e in plan.evictions),
            sorted((g, tuple(r.code for r in rs)) for g, rs in plan.pending.items()))


@pytest.mark.parametrize("instance", INSTANCES)
def test_a_skipped_scenario_could_not_have_placed(instance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whenever the precheck skips a scenario, the gang placer, asked right there (every victim so far evicted:
    the most room any outcome of the simulation leaves), fails too."""
    real = victims._each_task_fits_somewhere
    seen = {"skipped": 0}

    def checked(sess: Session, gang: GangPlacer, tasks: list[int]) -> bool:
        ok = real(sess, gang, tasks)
        if not ok:
            cp = sess.checkpoint()
            g = int(sess.state.pod_pg[tasks[0]])
            assert not gang.place(g, tasks, allow_pipeline=True).ok, sess.state.pg_keys[g]
            sess.rollback(cp)
            seen["skipped"] += 1
        return ok

    monkeypatch.setattr(victims, "_each_task_fits_somewhere", checked)
    run_cycle(_state(instance), Config(), engine=Engine.greedy)
    if instance.startswith(("openb", "topology")):
        assert seen["skipped"] > 0  # (the families whose searches it prunes: by node fit, by domain)


@pytest.mark.parametrize("instance", INSTANCES)
def test_the_precheck_changes_no_plan(instance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The greedy cycle's decisions and pending reasons with the precheck equal those without it."""
    st = _state(instance)
    with_check = run_cycle(st, Config(), engine=Engine.greedy)[0]
    monkeypatch.setattr(victims, "_each_task_fits_somewhere", lambda *_: True)
    without = run_cycle(st, Config(), engine=Engine.greedy)[0]
    assert _decisions(with_check) == _decisions(without)
