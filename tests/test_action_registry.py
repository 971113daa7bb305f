"""The actions' declaration (kai_opt.actions.ACTIONS) is the single source: the config's flags, the cycle order, the
eviction reasons, the checker's per-reason rules, the conformance names and the greedy registry all equal what it
derives, and no other module spells the list again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt import actions as spec
from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config
from kai_opt.conformance import ACTION_NAMES
from kai_opt.engine import ACTION_ORDER as ENGINE_ORDER
from kai_opt.engine import greedy_plan
from kai_opt.fairshare.share import compute_fair_share
from kai_opt.heuristics.actions import REGISTRY, enabled_actions
from kai_opt.heuristics.actions.base import VictimAction
from kai_opt.loaders.kaicase import ACTIONS as KAI_CASE_ACTIONS
from kai_opt.plan import EVICTION_REASONS, Eviction, Plan
from kai_opt.state import ClusterState, PodStatus

NAMES = ("allocate", "consolidate", "reclaim", "preempt", "stale_gang")  # KAI's cycle order, as this test expects it
PACKAGE = Path(__file__).resolve().parents[1] / "kai_opt"


def test_cycle_order_and_registry_follow_the_declaration() -> None:
    assert spec.ACTION_ORDER == NAMES
    assert tuple(a.name for a in REGISTRY) == spec.ACTION_ORDER == ENGINE_ORDER
    assert all(a.spec is spec.ACTION_BY_NAME[a.name] for a in REGISTRY)


def test_config_flags_are_the_actions() -> None:
    flags = Config().actions
    assert tuple(type(flags).model_fields) == spec.ACTION_ORDER
    assert all(getattr(flags, a.flag) is True for a in REGISTRY)
    assert [type(flags).model_fields[a.name].description for a in spec.ACTIONS] == [a.description for a in spec.ACTIONS]
    off = Config.model_validate({"actions": {"reclaim": False}})
    assert enabled_actions(off, None) == tuple(n for n in NAMES if n != "reclaim")
    assert enabled_actions(off, ("reclaim",)) == ("reclaim",)


def test_eviction_reasons_are_those_of_the_evicting_actions() -> None:
    assert tuple(a.eviction_reason for a in REGISTRY if a.eviction_reason is not None) == EVICTION_REASONS
    assert set(EVICTION_REASONS) == {"consolidate", "reclaim", "preempt", "stale-gang"}
    assert set(spec.EVICTION_RULES) == set(EVICTION_REASONS)
    for a in REGISTRY:  # an action that searches victims writes an eviction reason with rules for the checker
        if isinstance(a, VictimAction):
            assert a.eviction_reason is not None and spec.EVICTION_RULES[a.eviction_reason].beneficiary


def test_conformance_names_map_kai_names_to_ours() -> None:
    assert {a.spec.kai_name: a.name for a in REGISTRY} == ACTION_NAMES
    assert tuple(ACTION_NAMES.values()) == spec.ACTION_ORDER
    assert tuple(ACTION_NAMES) == KAI_CASE_ACTIONS


def _one_victim_state() -> ClusterState:
    """One node: a running preemptible pod of queue a, a pending pod of queue b."""
    return state([node("n1", gpus=1), queue("a", gpu=(1, 1, -1)), queue("b", gpu=(1, 1, -1)),
                  podgroup("run", "a"), pod("run-0", "run", gpus=1, node_name="n1"),
                  podgroup("want", "b"), pod("want-0", "want", gpus=1)])


@pytest.mark.parametrize("reason", sorted(spec.EVICTION_RULES))
def test_the_checker_holds_each_reason_to_its_declared_rules(reason: str) -> None:
    st = _one_victim_state()
    victim = next(i for i, p in enumerate(st.pods) if p.meta.name == "run-0")
    assert st.pod_status[victim] == PodStatus.BOUND
    plan = Plan(engine="greedy", placements=[], evictions=[Eviction(victim, reason, -1)], pending={})
    rules = spec.EVICTION_RULES[reason]
    if rules.beneficiary:  # an eviction for no one placed is a violation, named with the reason
        with pytest.raises(PlanViolation, match=re.escape(f"evicted ({reason}) without a beneficiary")):
            check_plan(st, plan, compute_fair_share(st), Config())
    else:
        check_plan(st, plan, compute_fair_share(st), Config())


def test_no_module_spells_the_action_list_again() -> None:
    """The KAI action names and the stale-gang action and reason appear as string literals only in the declaration
    (and where an implementation names its entry, spec_name)."""
    pattern = re.compile(r"[\"'](stalegangeviction|stale-gang|stale_gang)[\"']")
    offenders = []
    for f in PACKAGE.rglob("*.py"):
        if f == PACKAGE / "actions.py":
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and not line.strip().startswith("spec_name = "):
                offenders.append(f"{f.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_greedy_runs_the_registry_in_order() -> None:
    st = _one_victim_state()
    said: list[str] = []
    plan = greedy_plan(st, compute_fair_share(st), Config(), progress=said.append)
    assert said == [f"greedy: {n.replace('_', '-')}" for n in NAMES]
    assert tuple(plan.phases) == NAMES
