"""DRA consumable capacity (resource.k8s.io/v1, beta in 1.36): a device with `allowMultipleAllocations` is shared
by claims up to each capacity, `requestPolicy` rounds what a share consumes; the greedy and CP-SAT engines, the
victim search, the checker and the claim writes (consumedCapacity) all see it."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, podgroup, queue, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from test_dra import CONFIG, DRIVER, V, checked_cycle, claim_pod, device_class, placed

from kai_opt.api.dra import CapacityPolicy
from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Engine
from kai_opt.dra.allocate import claims_after
from kai_opt.engine import run_cycle
from kai_opt.plan import Placement, Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state

GI = 2**30


def shared_slice(node_name: str, mems: tuple[str, ...] = ("80Gi",), policy: dict[str, Any] | None = None,
                 shared: bool = True) -> RawObject:
    devices = []
    for i, mem in enumerate(mems):
        cap: dict[str, Any] = {"value": mem}
        if policy:
            cap["requestPolicy"] = policy
        devices.append({"name": f"gpu-{i}", "allowMultipleAllocations": shared,
                        "attributes": {"productName": {"string": "H100"}}, "capacity": {"memory": cap}})
    return RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice",
                                       "metadata": {"name": f"{node_name}-{DRIVER}"},
                                       "spec": {"driver": DRIVER, "nodeName": node_name, "devices": devices,
                                                "pool": {"name": node_name, "generation": 1,
                                                         "resourceSliceCount": 1}}})


def mem_spec(mem: str | None, count: int = 1, mode: str = "ExactCount") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": mode}
    if mode == "ExactCount" and count != 1:
        exactly["count"] = count
    if mem:
        exactly["capacity"] = {"requests": {"memory": mem}}
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def mem_template(name: str, mem: str | None, count: int = 1, mode: str = "ExactCount") -> RawObject:
    return RawObject("ResourceClaimTemplate", {"apiVersion": V, "kind": "ResourceClaimTemplate",
                                               "metadata": {"name": name, "namespace": "default"},
                                               "spec": {"spec": mem_spec(mem, count, mode)}})


def mem_claim(name: str, mem: str, node_name: str, device: str = "gpu-0", reserved: str | None = None,
              devices: tuple[str, ...] = ()) -> RawObject:
    """An allocated claim with a share of `mem` on `device` (or on each of `devices`, count len(devices))."""
    results = [{"request": "gpus", "driver": DRIVER, "pool": node_name, "device": dev,
                "consumedCapacity": {"memory": mem}, "shareID": f"00000000-0000-0000-0000-0000000000{j}{len(name)}"}
               for j, dev in enumerate(devices or (device,))]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": reserved, "uid": reserved}]
    return RawObject("ResourceClaim", {"apiVersion": V, "kind": "ResourceClaim",
                                       "metadata": {"name": name, "namespace": "default", "resourceVersion": "3"},
                                       "spec": mem_spec(mem, max(1, len(devices))), "status": status})


cycle = checked_cycle  # (test_dra: the plan checked, no CP-SAT plan failing the checker)


def pods_of(n: int, template_name: str, prefix: str = "p") -> list[RawObject]:
    out: list[RawObject] = []
    for i in range(n):
        out += [podgroup(f"{prefix}{i}", "q"), claim_pod(f"{prefix}{i}", f"{prefix}{i}", template_name=template_name)]
    return out


def test_request_policy_rounds_and_refuses_as_kubernetes() -> None:
    assert CapacityPolicy().consumed(None, 80) == 80  # nothing requested, no default: the whole capacity
    assert CapacityPolicy(default=10, min=10, max=40, step=5).consumed(None, 80) == 10
    assert CapacityPolicy(default=10, min=10, max=40, step=5).consumed(12, 80) == 15  # up to the step
    assert CapacityPolicy(default=10, min=10, max=40, step=5).consumed(3, 80) == 10  # up to the minimum
    assert CapacityPolicy(default=10, min=10, max=40, step=5).consumed(41, 80) is None  # over the range
    assert CapacityPolicy(default=20, values=(20, 40)).consumed(25, 80) == 40
    assert CapacityPolicy(default=20, values=(20, 40)).consumed(50, 80) is None


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_four_claims_of_20gi_share_one_80gi_device_and_a_fifth_waits(engine: Engine) -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            mem_template("t", "20Gi"), *pods_of(5, "t")]
    st, plan = cycle(objs, engine)
    assert len(plan.placements) == 4 and set(placed(st, plan).values()) == {"n0"}
    snap = snapshot(objs)
    assert st.dra is not None
    # the four claims' shares all go to the one device, each recording what it consumes
    after = claims_after(list(snap.resource_claims), st.dra, {}, set())
    assert after == []  # template claims are made by the binder; what it writes is chosen as below
    from kai_opt.dra.allocate import choose
    used: dict[Any, Any] = {}
    results = [choose(st.dra, st.dra.claims[i], "n0", set(), used) for i in range(5)]
    assert [r[0].consumed if r else None for r in results] == [{f"{DRIVER}/memory": 20 * GI}] * 4 + [None]


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_allocated_shares_leave_room_for_the_rest_only(engine: Engine) -> None:
    """n0's device has 60Gi taken by a claim nobody in the snapshot holds: a 40Gi claim goes to n1."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            node("n1", gpus=0), shared_slice("n1"), mem_claim("old", "60Gi", "n0", reserved="gone"),
            mem_template("t", "40Gi"), *pods_of(1, "t")]
    objs[0] = queue("q", gpu=(64, 1, -1))
    st, plan = cycle(objs, engine)
    assert placed(st, plan) == {"p0": "n1"}
    objs[-3] = mem_template("t", "20Gi")
    st, plan = cycle(objs, engine)
    assert placed(st, plan)["p0"] in ("n0", "n1")


def test_a_request_policy_rounds_the_share_up() -> None:
    """Steps of 30Gi: a 20Gi request consumes 30Gi, so only two fit on 80Gi."""
    policy = {"default": "30Gi", "validRange": {"min": "30Gi", "max": "80Gi", "step": "30Gi"}}
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", policy=policy),
            mem_template("t", "20Gi"), *pods_of(3, "t")]
    _st, plan = cycle(objs)
    assert len(plan.placements) == 2


def test_without_a_capacity_request_a_share_takes_the_whole_device() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            mem_template("t", None), *pods_of(2, "t")]
    _st, plan = cycle(objs)
    assert len(plan.placements) == 1


def test_a_capacity_request_on_an_exclusive_device_selects_devices_that_have_it() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0", ("40Gi", "40Gi"), shared=False), node("n1", gpus=0),
            shared_slice("n1", ("80Gi",), shared=False), mem_template("t", "60Gi"), *pods_of(2, "t")]
    st, plan = cycle(objs)
    assert placed(st, plan) == {"p0": "n1"} or placed(st, plan) == {"p1": "n1"}  # one 80Gi device, exclusive


def test_two_shared_devices_on_a_node_new_shares_go_to_the_one_with_room() -> None:
    """gpu-0 has 70Gi taken by a running pod, gpu-1 is free: two 40Gi claims both land on gpu-1."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0", ("80Gi", "80Gi")), mem_claim("run", "70Gi", "n0", "gpu-0", reserved="r"),
            podgroup("r", "q"), claim_pod("r", "r", claim_name="run", node_name="n0"),
            mem_template("t", "40Gi"), *pods_of(3, "t")]
    st, plan = cycle(objs)
    assert len(plan.placements) == 2
    assert st.dra is not None
    used = {k: dict(v) for k, v in st.dra.consumed.items()}
    from kai_opt.dra.allocate import choose
    got = [choose(st.dra, st.dra.claims[st.dra.pod_claims[f"default/p{i}"][0]], "n0", set(), used)
           for i in range(3)]
    assert [g[0].device if g else None for g in got] == ["gpu-1", "gpu-1", None]


def test_reclaim_evicts_a_share_holder_and_the_reclaimer_gets_the_share() -> None:
    objs = [queue("q1", gpu=(0, 1, -1)), queue("q2", gpu=(1, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0"), mem_claim("run", "80Gi", "n0", reserved="r"),
            podgroup("r", "q1", priority_class="train"), claim_pod("r", "r", claim_name="run", node_name="n0"),
            mem_template("t", "40Gi"), podgroup("w", "q2", priority_class="train"),
            claim_pod("w", "w", template_name="t")]
    st, plan = cycle(objs)
    assert [st.pods[e.pod].name for e in plan.evictions] == ["r"]
    assert {st.pods[p.pod].name for p in plan.placements} == {"w"}  # pipelined onto the freed share


def test_the_checker_refuses_shares_over_the_capacity() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            mem_template("t", "50Gi"), *pods_of(2, "t")]
    st = build_state(snapshot(objs))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    bad = Plan(engine="greedy", placements=[Placement(pod=st.pod_index[f"default/p{i}"], node=0, devices=())
                                            for i in range(2)])
    with pytest.raises(PlanViolation, match=r"memory|room"):
        check_plan(st, bad, fs, CONFIG)


def test_shares_of_binds_in_flight_are_counted_and_written_with_consumed_capacity() -> None:
    from kai_opt.k8s.dra import ClaimDevices, _result
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            mem_template("t", "20Gi"), *pods_of(5, "t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    chooser = ClaimDevices()
    writes = [chooser.for_bind(st.dra, f"default/p{i}", "n0") for i in range(5)]
    assert all(w is not None for w in writes[:4]) and writes[4] is None
    first = writes[0]
    assert first is not None and first[0].results is not None
    out = _result(first[0].results[0])
    assert out["device"] == "gpu-0" and out["consumedCapacity"] == {"memory": str(20 * GI)} and out["shareID"]
    chooser.forget(first, "default/p0")
    assert chooser.for_bind(st.dra, "default/p4", "n0") is not None


def shares_of(st: Any, pod: str, node_name: str, used: dict[Any, Any] | None = None) -> list[tuple[str, Any]]:
    """(device, consumed) of what the binder takes for the pod's claim on the node."""
    from kai_opt.dra.allocate import choose
    assert st.dra is not None
    got = choose(st.dra, st.dra.claims[st.dra.pod_claims[f"default/{pod}"][0]], node_name, set(), used)
    assert got is not None
    return [(r.device, r.consumed) for r in got]


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_a_count_of_two_shares_takes_two_distinct_devices(engine: Engine) -> None:
    """n0 has one shared device, n1 two: a claim for 2 x 30Gi goes to n1 and gets a share of each of its devices
    (one device with room for both shares is not enough)."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            node("n1", gpus=0), shared_slice("n1", ("80Gi", "80Gi")), mem_template("t", "30Gi", 2), *pods_of(1, "t")]
    st, plan = cycle(objs, engine)
    assert placed(st, plan) == {"p0": "n1"}
    assert shares_of(st, "p0", "n1") == [("gpu-0", {f"{DRIVER}/memory": 30 * GI}),
                                         ("gpu-1", {f"{DRIVER}/memory": 30 * GI})]
    st, plan = cycle(objs[:3] + objs[4:5] + objs[6:], engine)  # only n0: it waits
    assert placed(st, plan) == {}


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_every_share_of_a_request_needs_room_on_its_own_device(engine: Engine) -> None:
    """n0's gpu-0 has 70Gi taken by a running pod: 2 x 40Gi does not fit there (10Gi left on one of the two), but
    on n1; two such claims fill n1's devices (4 x 40Gi on 2 x 80Gi) and a third waits."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi", "80Gi")),
            mem_claim("run", "70Gi", "n0", "gpu-0", reserved="r"), podgroup("r", "q", priority_class="train"),
            claim_pod("r", "r", claim_name="run", node_name="n0"), node("n1", gpus=0),
            shared_slice("n1", ("80Gi", "80Gi")), mem_template("t", "40Gi", 2), *pods_of(3, "t")]
    st, plan = cycle(objs, engine)
    assert sorted(placed(st, plan).values()) == ["n1", "n1"]
    used: dict[Any, Any] = {}
    got = [shares_of(st, p, "n1", used) for p in placed(st, plan)]
    assert sorted(d for g in got for d, _ in g) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    from kai_opt.dra.allocate import choose
    assert st.dra is not None  # on n0 the binder does not put both shares on gpu-1 either
    assert choose(st.dra, st.dra.claims[st.dra.pod_claims["default/p2"][0]], "n0", set()) is None


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_all_takes_a_share_of_every_matching_device_of_the_node(engine: Engine) -> None:
    """All on n0's three shared devices: a share of each; a device without room keeps the claim off n0."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0", ("80Gi", "80Gi", "80Gi")), mem_template("t", "50Gi", mode="All"), *pods_of(2, "t")]
    st, plan = cycle(objs, engine)
    assert len(plan.placements) == 1  # the second would need 100Gi of each device
    pod = next(iter(placed(st, plan)))
    assert [d for d, _ in shares_of(st, pod, "n0")] == ["gpu-0", "gpu-1", "gpu-2"]
    objs = [*objs[:4], mem_claim("old", "40Gi", "n0", "gpu-2", reserved="gone"), *objs[4:]]
    _st, plan = cycle(objs, engine)
    assert plan.placements == []


def test_evicting_the_holder_of_a_claim_with_two_shares_frees_both() -> None:
    objs = [queue("q1", gpu=(0, 1, -1)), queue("q2", gpu=(2, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0", ("80Gi", "80Gi")), mem_claim("run", "80Gi", "n0", reserved="r",
                                                            devices=("gpu-0", "gpu-1")),
            podgroup("r", "q1", priority_class="train"), claim_pod("r", "r", claim_name="run", node_name="n0"),
            mem_template("t", "60Gi", 2), podgroup("w", "q2", priority_class="train"),
            claim_pod("w", "w", template_name="t")]
    st, plan = cycle(objs)
    assert [st.pods[e.pod].name for e in plan.evictions] == ["r"]
    assert {st.pods[p.pod].name for p in plan.placements} == {"w"}


def test_the_checker_refuses_two_shares_of_one_request_on_one_device() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            mem_template("t", "20Gi", 2), *pods_of(1, "t")]
    st = build_state(snapshot(objs))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    bad = Plan(engine="greedy", placements=[Placement(pod=st.pod_index["default/p0"], node=0, devices=())])
    with pytest.raises(PlanViolation, match="distinct"):
        check_plan(st, bad, fs, CONFIG)


def test_a_bind_of_two_shares_writes_two_results_with_their_own_share_ids() -> None:
    from kai_opt.k8s.dra import ClaimDevices, _result
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi", "80Gi")),
            mem_template("t", "50Gi", 2), *pods_of(2, "t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    chooser = ClaimDevices()
    first = chooser.for_bind(st.dra, "default/p0", "n0")
    assert first is not None and first[0].results is not None
    out = [_result(r) for r in first[0].results]
    assert [o["device"] for o in out] == ["gpu-0", "gpu-1"]
    assert all(o["consumedCapacity"] == {"memory": str(50 * GI)} for o in out)
    assert out[0]["shareID"] != out[1]["shareID"]
    assert chooser.for_bind(st.dra, "default/p1", "n0") is None  # 30Gi left on each: the shares in flight count


def test_claims_after_a_plan_hold_two_shares_and_give_both_back() -> None:
    """A named claim for 2 x 30Gi bound by the plan: allocated with a share on each device; once its pod left,
    both shares are free again (a second claim gets the same two devices)."""
    claim = RawObject("ResourceClaim", {"apiVersion": V, "kind": "ResourceClaim",
                                        "metadata": {"name": "c2", "namespace": "default", "resourceVersion": "1"},
                                        "spec": mem_spec("30Gi", 2)})
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi", "80Gi")),
            claim, podgroup("p0", "q"), claim_pod("p0", "p0", claim_name="c2")]
    st, plan = cycle(objs)
    assert placed(st, plan) == {"p0": "n0"} and st.dra is not None
    after = claims_after(list(snapshot(objs).resource_claims), st.dra, {"default/p0": ("n0", "u0")}, set())
    got = after[0].allocation
    assert got is not None and sorted(r.device for r in got) == ["gpu-0", "gpu-1"]
    assert all(r.consumed == {f"{DRIVER}/memory": 30 * GI} for r in got)
    objs2 = [*objs[:4], RawObject("ResourceClaim", {
        **claim.obj, "status": {"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": DRIVER, "pool": "n0", "device": r.device,
             "consumedCapacity": {"memory": "30Gi"}, "shareID": f"00000000-0000-0000-0000-00000000000{j}"}
            for j, r in enumerate(got)]}}, "reservedFor": [{"resource": "pods", "name": "p0", "uid": "u0"}]}}),
        objs[5], RawObject("Pod", {**objs[6].obj, "spec": {**objs[6].obj["spec"], "nodeName": "n0"}})]
    st2 = build_state(snapshot(objs2))
    assert st2.dra is not None
    assert st2.dra.consumed == {(DRIVER, "n0", f"gpu-{j}"): {f"{DRIVER}/memory": 30 * GI} for j in range(2)}
    released = claims_after(list(snapshot(objs2).resource_claims), st2.dra, {}, {"default/p0"})
    assert released[0].allocation is None and released[0].reserved_for == ()


@hs.composite
def shared_clusters(draw: hs.DrawFn) -> list[RawObject]:
    objs: list[RawObject] = [queue("qa", gpu=(draw(hs.integers(0, 8)), 1, -1)),
                             queue("qb", gpu=(draw(hs.integers(0, 8)), 1, -1)), device_class()]
    n_nodes = draw(hs.integers(1, 3))
    for i in range(n_nodes):
        mems = tuple(f"{draw(hs.sampled_from((40, 80)))}Gi" for _ in range(draw(hs.integers(1, 2))))
        if draw(hs.booleans()):  # devices alike on the node (the kinds of other nodes can share its column)
            mems = (mems[0],) * len(mems)
        policy = draw(hs.sampled_from((None, None, {"default": "20Gi", "validRange": {"min": "20Gi", "step": "20Gi"}})))
        objs += [node(f"n{i}", gpus=0), shared_slice(f"n{i}", mems, policy=policy)]
        both: tuple[str, ...] = ()
        for d in range(len(mems)):
            if both:
                break
            if draw(hs.booleans()):
                who = f"r{i}{d}"
                both = ("gpu-0", "gpu-1") if d == 0 and len(mems) == 2 and draw(hs.booleans()) else ()  # one
                # claim with a share of each device
                objs += [mem_claim(who, f"{draw(hs.sampled_from((10, 30)))}Gi", f"n{i}", f"gpu-{d}", reserved=who,
                                   devices=both),
                         podgroup(who, draw(hs.sampled_from(("qa", "qb"))), priority_class="train"),
                         claim_pod(who, who, claim_name=who, node_name=f"n{i}")]
    for g in range(draw(hs.integers(1, 5))):
        mem = draw(hs.sampled_from(("10Gi", "20Gi", "35Gi", "60Gi")))
        size = draw(hs.integers(1, 3))
        count, mode = draw(hs.sampled_from(((1, "ExactCount"), (1, "ExactCount"), (2, "ExactCount"), (1, "All"))))
        objs += [mem_template(f"t{g}", mem, count, mode), podgroup(f"g{g}", draw(hs.sampled_from(("qa", "qb"))),
                                                      min_member=draw(hs.integers(1, size)),
                                                      priority_class=draw(hs.sampled_from(("train", "inference"))))]
        objs += [claim_pod(f"g{g}-{k}", f"g{g}", template_name=f"t{g}") for k in range(size)]
    return objs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_clusters(), hs.sampled_from([Engine.greedy, Engine.cpsat]))
def test_the_checker_never_fires_on_random_clusters_with_shared_devices(objs: list[RawObject],
                                                                       engine: Engine) -> None:
    checked_cycle(objs, engine)
