"""DRA network-attached devices (a ResourceSlice with `nodeSelector` or `allNodes`, or per device with
`perDeviceNodeSelection`): a device reachable from several nodes is given from one of them per cycle, never twice,
and an allocated one stays with the node of the pod that uses it."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, podgroup, queue, snapshot
from test_dra import DRIVER, V, checked_cycle, claim_pod, device_class, placed, template

from kai_opt.config import Engine
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state


def net_slice(n: int, where: dict[str, Any], per_device: list[dict[str, Any]] | None = None) -> RawObject:
    devices = [{"name": f"fpga-{i}", **((per_device or [{}] * n)[i])} for i in range(n)]
    spec: dict[str, Any] = {"driver": DRIVER, "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
                            "devices": devices, **where}
    return RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": "fabric"},
                                       "spec": spec})


def rack_node(name: str, rack: str) -> RawObject:
    n = node(name, gpus=0)
    n.obj["metadata"]["labels"]["rack"] = rack
    return n


RACK_A = {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
    {"key": "rack", "operator": "In", "values": ["a"]}]}]}}


cycle = checked_cycle  # (test_dra: the plan checked, no CP-SAT plan failing the checker)


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_devices_of_a_node_selector_slice_go_only_to_the_selected_nodes(engine: Engine) -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), rack_node("a0", "a"), rack_node("a1", "a"),
            rack_node("b0", "b"), net_slice(2, RACK_A), template("t", 2), podgroup("g", "q"),
            claim_pod("p", "g", template_name="t")]
    st, plan = cycle(objs, engine)
    assert placed(st, plan)["p"] in ("a0", "a1")
    assert not any("network-attached" in w for w in st.warnings)


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_an_all_nodes_device_is_not_given_twice(engine: Engine) -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), node("n1", gpus=0),
            net_slice(2, {"allNodes": True}), template("t", 1)]
    for i in range(3):
        objs += [podgroup(f"g{i}", "q"), claim_pod(f"p{i}", f"g{i}", template_name="t")]
    _st, plan = cycle(objs, engine)
    assert len(plan.placements) == 2  # two devices, three claims: one waits whichever nodes they reach from


def test_per_device_node_selection() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), rack_node("a0", "a"), rack_node("b0", "b"),
            net_slice(2, {"perDeviceNodeSelection": True}, [{"nodeName": "b0"}, {"allNodes": True}]),
            template("t", 2), podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    where = {d.name: d.node for d in st.dra.devices}
    assert where == {"fpga-0": "b0", "fpga-1": "a0"}  # the reachable node with the fewest, then by name
    _st, plan = cycle(objs)
    assert not plan.placements  # conservative: the claim of 2 would need both on b0 (one node per device a cycle)
    one = [o for o in objs if o.kind != "ResourceClaimTemplate"] + [template("t", 1)]
    st, plan = cycle(one)
    assert placed(st, plan)["p"] in ("a0", "b0")


def test_an_allocated_network_device_stays_with_its_pods_node() -> None:
    alloc = RawObject("ResourceClaim", {"apiVersion": V, "kind": "ResourceClaim",
                                        "metadata": {"name": "c", "namespace": "default", "resourceVersion": "1"},
                                        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                                            "deviceClassName": DRIVER}}]}},
                                        "status": {"allocation": {"devices": {"results": [
                                            {"request": "gpus", "driver": DRIVER, "pool": "fabric",
                                             "device": "fpga-0"}]}},
                                            "reservedFor": [{"resource": "pods", "name": "r", "uid": "r"}]}})
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), rack_node("a0", "a"), rack_node("a1", "a"),
            net_slice(1, RACK_A), alloc, podgroup("r", "q"), claim_pod("r", "r", claim_name="c", node_name="a1"),
            template("t", 1), podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    st, plan = cycle(objs)
    assert st.dra is not None and st.dra.devices[0].node == "a1"
    assert not plan.placements  # its one device is taken
