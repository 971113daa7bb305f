"""DRA device taints and tolerations (resource.k8s.io/v1 `devices[].taints`, a request's `tolerations`): a device
with a NoSchedule or NoExecute taint goes only to requests that tolerate it, in both engines and the checker."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, podgroup, queue, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from test_dra import CONFIG, DRIVER, V, checked_cycle, claim_pod, device_class, dra_clusters, placed

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Engine
from kai_opt.engine import run_cycle
from kai_opt.errors import InputError
from kai_opt.plan import Placement, Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state


def tainted_slice(node_name: str, n: int, taints: dict[int, list[dict[str, Any]]]) -> RawObject:
    devices = [{"name": f"gpu-{i}", **({"taints": taints[i]} if i in taints else {})} for i in range(n)]
    return RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice",
                                       "metadata": {"name": f"{node_name}-{DRIVER}"},
                                       "spec": {"driver": DRIVER, "nodeName": node_name, "devices": devices,
                                                "pool": {"name": node_name, "generation": 1,
                                                         "resourceSliceCount": 1}}})


def tol_template(name: str, count: int, tolerations: list[dict[str, Any]] | None = None) -> RawObject:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": count}
    if tolerations:
        exactly["tolerations"] = tolerations
    return RawObject("ResourceClaimTemplate", {"apiVersion": V, "kind": "ResourceClaimTemplate",
                                               "metadata": {"name": name, "namespace": "default"},
                                               "spec": {"spec": {"devices": {"requests": [
                                                   {"name": "gpus", "exactly": exactly}]}}}})


UNHEALTHY = {"key": "example.com/unhealthy", "value": "ecc", "effect": "NoSchedule"}


cycle = checked_cycle  # (test_dra: the plan checked, no CP-SAT plan failing the checker)


def test_taints_and_tolerations_are_read() -> None:
    s = snapshot([tainted_slice("n0", 1, {0: [UNHEALTHY]}),
                  tol_template("t", 1, [{"key": "example.com/unhealthy", "operator": "Exists"}])])
    assert s.resource_slices[0].devices[0].taints[0].key == "example.com/unhealthy"
    assert s.claim_templates[0].spec.requests[0].alternatives[0].tolerations[0].operator == "Exists"
    with pytest.raises(InputError, match="unknown effect"):
        snapshot([tainted_slice("n0", 1, {0: [{"key": "k", "effect": "Sometimes"}]})])


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_tainted_device_is_not_given_without_a_toleration(engine: Engine, effect: str) -> None:
    """n0 has 4 devices, 2 tainted; n1 has 2 clean ones: a claim for 3 waits, for 2 goes to either."""
    taint = {**UNHEALTHY, "effect": effect}
    base = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            tainted_slice("n0", 4, {0: [taint], 1: [taint]}), node("n1", gpus=0), tainted_slice("n1", 2, {})]
    st, plan = cycle([*base, tol_template("t", 3), podgroup("g", "q"), claim_pod("p", "g", template_name="t")],
                     engine)
    assert not plan.placements
    st, plan = cycle([*base, tol_template("t", 2), podgroup("g", "q", min_member=2),
                      claim_pod("p", "g", template_name="t"), claim_pod("p2", "g", template_name="t")], engine)
    assert sorted(placed(st, plan).values()) == ["n0", "n1"]


@pytest.mark.parametrize("toleration", [
    {"key": "example.com/unhealthy", "operator": "Exists"},
    {"key": "example.com/unhealthy", "value": "ecc"},
    {"operator": "Exists", "effect": "NoSchedule"}])
def test_a_tolerating_request_may_get_tainted_devices(toleration: dict[str, Any]) -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            tainted_slice("n0", 4, {i: [UNHEALTHY] for i in range(4)}), tol_template("t", 4, [toleration]),
            podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    st, plan = cycle(objs)
    assert placed(st, plan) == {"p": "n0"}


def test_a_toleration_of_another_key_or_effect_does_not_help_and_informational_taints_do_not_block() -> None:
    for tol in ({"key": "other", "operator": "Exists"}, {"key": "example.com/unhealthy", "operator": "Exists",
                                                          "effect": "NoExecute"}):
        objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
                tainted_slice("n0", 1, {0: [UNHEALTHY]}), tol_template("t", 1, [tol]), podgroup("g", "q"),
                claim_pod("p", "g", template_name="t")]
        _st, plan = cycle(objs)
        assert not plan.placements
    info = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            tainted_slice("n0", 1, {0: [{"key": "note", "effect": "None"}]}), tol_template("t", 1),
            podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    _st, plan = cycle(info)
    assert len(plan.placements) == 1


def test_the_checker_refuses_a_claim_on_tainted_devices() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), tainted_slice("n0", 2, {}),
            node("n1", gpus=0), tainted_slice("n1", 2, {0: [UNHEALTHY], 1: [UNHEALTHY]}),
            tol_template("t", 2), podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    st = build_state(snapshot(objs))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    bad = Plan(engine="greedy", placements=[Placement(pod=st.pod_index["default/p"], node=1, devices=())])
    with pytest.raises(PlanViolation):
        check_plan(st, bad, fs, CONFIG)


def test_devices_chosen_at_bind_skip_tainted_ones() -> None:
    from kai_opt.k8s.dra import ClaimDevices
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            tainted_slice("n0", 4, {0: [UNHEALTHY], 2: [UNHEALTHY]}), tol_template("t", 2), podgroup("g", "q"),
            claim_pod("p", "g", template_name="t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    writes = ClaimDevices().for_bind(st.dra, "default/p", "n0")
    assert writes is not None and [r.device for r in writes[0].results or ()] == ["gpu-1", "gpu-3"]


@hs.composite
def tainted_clusters(draw: hs.DrawFn) -> list[RawObject]:
    """test_dra's random DRA + MIG clusters, some devices tainted and some requests tolerating it."""
    objs = draw(dra_clusters())
    for o in objs:
        if o.kind == "ResourceSlice":
            for d in o.obj["spec"]["devices"]:
                if draw(hs.booleans()):
                    d["taints"] = [{**UNHEALTHY, "effect": draw(hs.sampled_from(("NoSchedule", "NoExecute")))}]
        elif o.kind in ("ResourceClaimTemplate", "ResourceClaim") and draw(hs.booleans()):
            spec = o.obj["spec"]["spec"] if o.kind == "ResourceClaimTemplate" else o.obj["spec"]
            spec["devices"]["requests"][0]["exactly"]["tolerations"] = [{"key": UNHEALTHY["key"],
                                                                         "operator": "Exists"}]
    return objs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tainted_clusters(), hs.sampled_from([Engine.greedy, Engine.cpsat]))
def test_the_checker_never_fires_on_random_clusters_with_tainted_devices(objs: list[RawObject],
                                                                        engine: Engine) -> None:
    checked_cycle(objs, engine)
