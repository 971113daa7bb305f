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
                counters_apart: bool = True, pair: str | None = None) -> list[RawObject]:
    """Per physical GPU a counter set of 80Gi, a whole device (80Gi) and `parts` partitions of `part`; the
    counters in a slice of their own (as Kubernetes 1.35+ wants) or with the devices. `pair`: a device on the
    first two GPUs, consuming that much of both counter sets."""
    sets = [{"name": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}} for g in range(gpus)]
    devices = []
    for g in range(gpus):
        devices.append({"name": f"gpu-{g}", "attributes": {"profile": {"string": "whole"}},
                        "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": "80Gi"}}}]})
        devices += [{"name": f"gpu-{g}-p{i}", "attributes": {"profile": {"string": "part"}},
                     "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": part}}}]}
                    for i in range(parts)]
    if pair is not None:
        devices.append({"name": "pair", "attributes": {"profile": {"string": "pair"}},
                        "consumesCounters": [{"counterSet": f"gpu-{g}-cs", "counters": {"memory": {"value": pair}}}
                                             for g in range(2)]})
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


PAIR_BASE = [*BASE, *partitioned("n0", gpus=2, pair="80Gi"), profile_template("pair", "pair"),
             profile_template("w", "whole"), profile_template("p", "part")]


def test_a_device_on_two_counter_sets_consumes_from_both() -> None:
    st = build_state(snapshot(PAIR_BASE))
    assert st.dra is not None
    d = next(i for i, dev in enumerate(st.dra.devices) if dev.name == "pair")
    assert [(k[2], a) for k, a in st.dra.counters_of(d)] == [("counterSet:gpu-0-cs", (("memory", 80 * 2**30),)),
                                                             ("counterSet:gpu-1-cs", (("memory", 80 * 2**30),))]
    assert not any("pair" in w and "not allocated" in w for w in st.warnings)


def test_a_device_on_a_counter_set_no_slice_has_is_not_allocated() -> None:
    sl = partitioned("n0", gpus=2, parts=0, pair="40Gi")
    sl[1].obj["spec"]["devices"][-1]["consumesCounters"][1]["counterSet"] = "gpu-9-cs"
    st, plan = cycle([*BASE, *sl, profile_template("pair", "pair"), *group("a", "pair")])
    assert plan.placements == []
    assert any("pair: consumes counters of an unknown set gpu-9-cs; it is not allocated" in w for w in st.warnings)


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_a_device_on_two_counter_sets_is_allocated_when_both_have_room(engine: Engine) -> None:
    st, plan = cycle([*PAIR_BASE, *group("a", "pair")], engine)
    assert names(st, plan) == {"a"}
    assert st.dra is not None
    got = choose(st.dra, st.dra.claims[st.dra.pod_claims["default/a"][0]], "n0", set(st.dra.allocated))
    assert got is not None and [r.device for r in got] == ["pair"]


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_a_device_on_two_counter_sets_and_a_device_on_either_set_are_not_both_allocated(engine: Engine) -> None:
    """The pair takes all of gpu-0's and gpu-1's sets: with a whole GPU or a partition (of either GPU, whichever
    set the cycle designates), one of the two is placed."""
    for other in ("w", "p"):
        _st, plan = cycle([*PAIR_BASE, *group("a", "pair"), *group("b", other)], engine)
        assert len(plan.placements) == 1


@pytest.mark.parametrize("held", ["gpu-0-p0", "gpu-1-p0"])
def test_an_allocated_partition_on_either_set_keeps_the_pair_off(held: str) -> None:
    objs = [*PAIR_BASE, allocated("held", "n0", held, reserved="gone"), *group("a", "pair")]
    st, plan = cycle(objs)
    assert plan.placements == []
    assert st.dra is not None
    d = next(i for i, dev in enumerate(st.dra.devices) if dev.name == "pair")
    assert not st.dra.counters_fit(d, st.dra.consumed)


def test_the_checker_refuses_a_pair_and_a_whole_gpu_on_one_of_its_sets() -> None:
    objs = [*BASE, *partitioned("n0", gpus=2, pair="80Gi", parts=0), profile_template("pair", "pair"),
            profile_template("w", "whole"), *group("a", "pair"), *group("b", "w"), *group("c", "w")]
    st = build_state(snapshot(objs))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    bad = Plan(engine="greedy", placements=[Placement(pod=st.pod_index[f"default/{n}"], node=0, devices=())
                                            for n in ("a", "b")])
    with pytest.raises(PlanViolation, match="b-gpus request gpus: 0 free matching devices"):  # the DRA family
        check_plan(st, bad, fs, CONFIG)  # finds no whole GPU with room on its set once the pair took both


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_pairs_are_in_play_only_while_the_other_set_has_room_for_all_of_them(engine: Engine) -> None:
    """Two half pairs (40Gi of each set), 20Gi of gpu-1's set taken: the designated set (gpu-0's, the most free)
    has room for both, gpu-1's for one only, so one is in play and placed (both would take 80Gi of its 60Gi)."""
    sl = partitioned("n0", gpus=2, parts=1, pair="40Gi")
    sl[1].obj["spec"]["devices"].append(dict(sl[1].obj["spec"]["devices"][-1], name="pair-b"))
    objs = [*BASE, *sl, allocated("held", "n0", "gpu-1-p0", reserved="gone"), profile_template("pair", "pair"),
            *group("a", "pair"), *group("b", "pair")]
    st, plan = cycle(objs, engine)
    assert len(plan.placements) == 1
    assert st.dra is not None
    assert {st.dra.devices[d].name for d in st.dra.out_of_play} >= {"pair-b", "gpu-1"}


def test_the_counters_of_devices_in_flight_are_counted_at_bind_time() -> None:
    """A whole GPU chosen for a bind still in flight: a partition of it is not chosen for the next bind (a later
    cycle that does not see the first claim allocated yet)."""
    from kai_opt.k8s.dra import ClaimDevices
    objs = [*BASE, *partitioned("n0"), profile_template("w", "whole"), profile_template("p", "part"),
            *group("a", "w"), *group("b", "p")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    chooser = ClaimDevices()
    first = chooser.for_bind(st.dra, "default/a", "n0")
    assert first is not None and first[0].results is not None and first[0].results[0].device == "gpu-0"
    assert chooser.for_bind(st.dra, "default/b", "n0") is None
    chooser.forget(first, "default/a")
    assert chooser.for_bind(st.dra, "default/b", "n0") is not None


@hs.composite
def counter_clusters(draw: hs.DrawFn) -> list[RawObject]:
    objs: list[RawObject] = [queue("q", gpu=(draw(hs.integers(0, 16)), 1, -1)), device_class()]
    for i in range(draw(hs.integers(1, 3))):
        if draw(hs.sampled_from((False, False, False, True))):  # plain devices (no counters) of both profiles
            objs += [node(f"n{i}", gpus=0), RawObject("ResourceSlice", {
                "apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": f"n{i}-plain"},
                "spec": {"driver": DRIVER, "nodeName": f"n{i}",
                         "pool": {"name": f"n{i}", "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": f"d{j}", "attributes": {"profile": {"string": prof}}}
                                     for j, prof in enumerate(("whole", "part", "part"))]}})]
            continue
        gpus = draw(hs.integers(1, 2))
        pair = draw(hs.sampled_from((None, "40Gi", "80Gi"))) if gpus == 2 else None
        objs += [node(f"n{i}", gpus=0), *partitioned(f"n{i}", gpus=gpus, part=draw(hs.sampled_from(("20Gi", "30Gi"))),
                                                     parts=draw(hs.integers(1, 4)), pair=pair)]
        held = False
        for g in range(gpus):
            if draw(hs.booleans()):
                dev = draw(hs.sampled_from((f"gpu-{g}", f"gpu-{g}-p0", "pair") if pair and g == 1 and not held
                                           else (f"gpu-{g}", f"gpu-{g}-p0")))  # (the pair: on both sets)
                held = True
                who = f"r{i}{g}"
                objs += [allocated(who, f"n{i}", dev, reserved=who), podgroup(who, "q", priority_class="train"),
                         claim_pod(who, who, claim_name=who, node_name=f"n{i}")]
    objs += [profile_template("w", "whole"), profile_template("p", "part"), profile_template("p2", "part", 2),
             profile_template("pair", "pair")]
    for k in range(draw(hs.integers(1, 6))):
        objs += group(f"g{k}", draw(hs.sampled_from(("w", "p", "p2", "pair"))))
    return objs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counter_clusters(), hs.sampled_from([Engine.greedy, Engine.cpsat]))
def test_the_checker_never_fires_on_random_clusters_with_shared_counters(objs: list[RawObject],
                                                                        engine: Engine) -> None:
    checked_cycle(objs, engine)
