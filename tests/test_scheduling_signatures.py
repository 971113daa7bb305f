"""KAI's scheduling signatures in the victim actions: a pending job no easier to place than a failed one with the
same constraints is not searched again in the same action run (reclaim, preempt: per queue; consolidate: per
cluster), and the comparisons are KAI's (minimal_job_comparison.go)."""

from __future__ import annotations

import numpy as np
import pytest
from builders import node, pod, podgroup, queue, state

import kai_opt.heuristics.actions.base as base
from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.heuristics.actions.signatures import easier, smaller


def rows(*reqs: tuple[int, ...]) -> np.ndarray:
    """Sorted pending requests (as pending_requests gives them)."""
    return np.array(reqs, dtype=np.int64) if reqs else np.zeros((0, 2), dtype=np.int64)


def test_easier_is_kais_comparison() -> None:
    rep = rows((2, 8), (4, 8))
    assert easier(rows((2, 8)), rep)  # fewer pending pods
    assert easier(rows((1, 8), (4, 8)), rep)  # one request smaller, none larger at that point
    assert not easier(rows((2, 8), (4, 8)), rep)  # the same
    assert not easier(rows((2, 9), (4, 9)), rep)  # larger
    assert easier(rows((3, 1), (4, 7)), rep)  # not comparable first (stepped over), then smaller
    assert not easier(rows((2, 8), (4, 8), (5, 9)), rep)  # more pods: runs past the failed job's list
    assert easier(rows((1, 1), (2, 8), (4, 8)), rep)  # ... unless a smaller request comes first (KAI's walk)
    assert not easier(rows(), rep) and not easier(rep, rows())


def test_smaller_is_kais_footprint() -> None:
    rep = rows((2, 8), (4, 8))
    assert smaller(rows((2, 8), (4, 8)), rep)  # no larger: a new representative
    assert smaller(rows((1, 8)), rep)
    assert not smaller(rows((2, 9), (4, 8)), rep)
    assert not smaller(rows((1, 1), (1, 1), (1, 1)), rep)  # more pods


def _objs() -> list:
    """Two pending 2x2-GPU jobs of one starved queue (the later one asks more CPU: not the same search), a 1x1-GPU
    one, and every victim protected by the over
    queue's min runtime: each reclaim search fails."""
    objs = [node("a", gpus=8), queue("over", gpu=(2, 1, -1), created_min=0, reclaimMinRuntime="10m"),
            queue("starved", gpu=(4, 1, -1), created_min=1)]
    objs += [podgroup(f"o{i}", "over", created_min=i) for i in range(4)]
    objs += [pod(f"o{i}-0", group=f"o{i}", gpus=2, node_name="a", started_min_ago=1) for i in range(4)]
    for name, created, n, gpus, cpu in (("s1", 1, 2, 2, "1"), ("s2", 2, 2, 2, "2"), ("small", 3, 1, 1, "1")):
        objs.append(podgroup(name, "starved", min_member=n, created_min=created))
        objs += [pod(f"{name}-{i}", group=name, gpus=gpus, cpu=cpu) for i in range(n)]
    return objs


@pytest.mark.parametrize("on", [True, False])
def test_a_job_no_easier_than_a_failed_one_is_not_searched(on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[str] = []
    solve = base.solve_with_victims

    def counting(sess, gang, g, *args, **kw):  # type: ignore[no-untyped-def]
        searched.append(sess.state.pg_keys[g])
        return solve(sess, gang, g, *args, **kw)

    monkeypatch.setattr(base, "solve_with_victims", counting)
    st = state(_objs())
    config = parse_config({"engine": "greedy", "use_scheduling_signatures": on,
                           "actions": {"consolidate": False, "preempt": False}})
    plan, _ = run_cycle(st, config)
    assert not plan.evictions
    s2 = plan.pending[st.pg_index["default/s2"]]
    if on:
        assert sorted(searched) == ["default/s1", "default/small"]  # small: other constraints (one pod)
        [why] = [r for r in s2 if r.code == "ReclaimSkipped"]
        assert why.details["like"] == "default/s1"
    else:
        assert sorted(searched) == ["default/s1", "default/s2", "default/small"]
        assert not [r for r in s2 if r.code == "ReclaimSkipped"]
