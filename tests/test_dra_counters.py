"""DRA shared counters of partitionable devices (ResourceSlice `sharedCounters`, device `consumesCounters`): the
whole GPU and its partitions draw on one counter set, so what is allocated of them stays within its counters, in
both engines, the checker and the devices chosen at bind time."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, podgroup, queue, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from test_dra import CONFIG, CPSAT, DRIVER, V, checked_cycle, claim_pod, device_class

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Engine
from kai_opt.dra.allocate import choose
from kai_opt.engine import run_cycle
from kai_opt.plan import Placement, Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state


def partitioned(node_name: str, gpus: int = 1, part: str = "20Gi", parts: int = 4,
                counters_apart: bool = True) -> list[RawObject]:
    """Per physical GPU a counter set of 80Gi, a whole device (80Gi) and `parts` partitions of `part`; the
    counters in a slice of their own (as Kubernetes 1.35+ wants) or with the devices."""
    sets = [{"name": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}} for g in range(gpus)]
    devices = []
    for g in range(gpus):
        devices.append({"name": f"gpu-{g}", "attributes": {"profile": {"string": "whole"}},
                        "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}}]})
        devices += [{"name": f"gpu-{g}-p{i}", "attributes": {"profile": {"string": "part"}},
                     "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": part}}}]}
                    for i in range(parts)]
    pool = {"name": node_name, "generation": 1, "resourceSliceCount": 2 if counters_apart else 1}

    def sl(name: str, spec: dict[str, Any]) -> RawObject:
        return RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": name},
                                           "spec": {"driver": DRIVER, "pool": pool, **spec}})
    if counters_apart:
        return [sl(f"{node_name}-counters", {"nodeName": node_name, "sharedCounters": sets}),
                sl(f"{node_name}-devices", {"nodeName": node_name, "devices": devices})]
    return [sl(f"{node_name}-devices", {"nodeName": node_name, "devices": devices, "sharedCounters": sets})]


def profile_template(name: str, profile: str, count: int = 1) -> RawObject:
    sel = [{"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}]
    return RawObject("ResourceClaimTemplate", {"apiVersion": V, "kind": "ResourceClaimTemplate",
                                               "metadata": {"name": name, "namespace": "default"},
                                               "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                                                   "deviceClassName": DRIVER, "count": count,
                                                   "selectors": sel}}]}}}})


def allocated(name: str, node_name: str, device: str, reserved: str | None = None) -> RawObject:
    status: dict[str, Any] = {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": DRIVER, "pool": node_name, "device": device}]}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": reserved, "uid": reserved}]
    return RawObject("ResourceClaim", {"apiVersion": V, "kind": "ResourceClaim",
                                       "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"},
                                       "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                                           "deviceClassName": DRIVER}}]}}, "status": status})


def group(name: str, template_name: str) -> list[RawObject]:
    return [podgroup(name, "q"), claim_pod(name, name, template_name=template_name)]


def cycle(objs: list[RawObject], engine: Engine = Engine.greedy) -> tuple[Any, Plan]:
    st = build_state(snapshot(objs))
    plan, fs = run_cycle(st, CPSAT if engine == Engine.cpsat else CONFIG, engine=engine)
    check_plan(st, plan, fs, CONFIG)
    return st, plan


def names(st: Any, plan: Plan) -> set[str]:
    return {st.pods[p.pod].name for p in plan.placements}


BASE = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0)]


def test_counters_are_read_from_their_own_slice_or_the_devices_slice() -> None:
    for apart in (True, False):
        s = snapshot(partitioned("n0", counters_apart=apart))
        sets = [x.shared_counters for x in s.resource_slices if x.shared_counters]
        assert sets == [{"gpu-0-cs": {"memory": 80 * 2**30}}]
        dev = next(d for x in s.resource_slices for d in x.devices if d.name == "gpu-0-p0")
        assert dev.consumes == (("gpu-0-cs", (("memory", 20 * 2**30),)),)


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_the_whole_gpu_and_a_partition_of_it_are_not_both_allocated(engine: Engine) -> None:
    objs = [*BASE, *partitioned("n0"), profile_template("w", "whole"), profile_template("p", "part"),
            *group("whole", "w"), *group("part", "p")]
    _st, plan = cycle(objs, engine)
    assert len(plan.placements) == 1
    objs = [*BASE, *partitioned("n0"), profile_template("p", "part"), *[x for i in range(4)
                                                                       for x in group(f"p{i}", "p")]]
    _st, plan = cycle(objs, engine)
    assert len(plan.placements) == 4  # four partitions of 20Gi fill the 80Gi


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_counters_not_the_device_count_limit_the_partitions(engine: Engine) -> None:
    objs = [*BASE, *partitioned("n0", part="30Gi", parts=3), profile_template("p", "part"),
            *[x for i in range(3) for x in group(f"p{i}", "p")]]
    _st, plan = cycle(objs, engine)
    assert len(plan.placements) == 2  # 3 x 30Gi > 80Gi


def test_an_allocated_whole_gpu_leaves_no_room_for_partitions_there() -> None:
    objs = [*BASE, *partitioned("n0"), node("n1", gpus=0), *partitioned("n1"), allocated("held", "n0", "gpu-0",
                                                                                         reserved="gone"),
            profile_template("p", "part"), *group("p0", "p")]
    st, plan = cycle(objs)
    assert {st.node_names[p.node] for p in plan.placements} == {"n1"}


def test_new_claims_go_to_the_counter_set_with_the_most_room() -> None:
    """gpu-0's set has a partition allocated, gpu-1's is free: a whole GPU fits (gpu-1), a second does not."""
    objs = [*BASE, *partitioned("n0", gpus=2), allocated("held", "n0", "gpu-0-p0", reserved="gone"),
            profile_template("w", "whole"), *group("w0", "w"), *group("w1", "w")]
    st, plan = cycle(objs)
    assert len(plan.placements) == 1
    assert st.dra is not None
    got = choose(st.dra, st.dra.claims[st.dra.pod_claims[f"default/{st.pods[plan.placements[0].pod].name}"][0]],
                 "n0", set(st.dra.allocated))
    assert got is not None and [r.device for r in got] == ["gpu-1"]


def test_the_checker_refuses_a_whole_gpu_and_a_partition_on_one_set() -> None:
    objs = [*BASE, *partitioned("n0"), profile_template("w", "whole"), profile_template("p", "part"),
            *group("whole", "w"), *group("part", "p")]
    st = build_state(snapshot(objs))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    bad = Plan(engine="greedy", placements=[Placement(pod=st.pod_index[f"default/{n}"], node=0, devices=())
                                            for n in ("whole", "part")])
    with pytest.raises(PlanViolation):
        check_plan(st, bad, fs, CONFIG)


@hs.composite
def counter_clusters(draw: hs.DrawFn) -> list[RawObject]:
    objs: list[RawObject] = [queue("q", gpu=(draw(hs.integers(0, 16)), 1, -1)), device_class()]
    for i in range(draw(hs.integers(1, 3))):
        gpus = draw(hs.integers(1, 2))
        objs += [node(f"n{i}", gpus=0), *partitioned(f"n{i}", gpus=gpus, part=draw(hs.sampled_from(("20Gi", "30Gi"))),
                                                     parts=draw(hs.integers(1, 4)))]
        for g in range(gpus):
            if draw(hs.booleans()):
                dev = draw(hs.sampled_from((f"gpu-{g}", f"gpu-{g}-p0")))
                who = f"r{i}{g}"
                objs += [allocated(who, f"n{i}", dev, reserved=who), podgroup(who, "q", priority_class="train"),
                         claim_pod(who, who, claim_name=who, node_name=f"n{i}")]
    objs += [profile_template("w", "whole"), profile_template("p", "part"), profile_template("p2", "part", 2)]
    for k in range(draw(hs.integers(1, 6))):
        objs += group(f"g{k}", draw(hs.sampled_from(("w", "p", "p2"))))
    return objs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counter_clusters(), hs.sampled_from([Engine.greedy, Engine.cpsat]))
def test_the_checker_never_fires_on_random_clusters_with_shared_counters(objs: list[RawObject],
                                                                        engine: Engine) -> None:
    checked_cycle(objs, engine)
