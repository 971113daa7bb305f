"""Explain for pods with DRA claims: the devices a claim has or gets, and when the pod waits, which selector,
capacity, taint or allocation keeps the devices from each request."""

from __future__ import annotations

from typing import Any

from builders import node, podgroup, queue, snapshot
from test_dra import CONFIG, DRIVER, base, claim, claim_pod, device_class, template
from test_dra_capacity import mem_claim, mem_template, shared_slice
from test_dra_taints import UNHEALTHY, tainted_slice, tol_template

from kai_opt.explain import explain
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state

A100 = f'device.attributes["{DRIVER}"].productName == "A100"'


def ex(objs: list[RawObject], pod: str) -> dict[str, Any]:
    return explain(build_state(snapshot(objs)), CONFIG, pod=pod, solve=False)


def test_a_placed_pod_names_the_devices_its_claim_gets() -> None:
    out = ex([*base(), template("a", 2, "A100"), podgroup("g", "q"), claim_pod("p", "g", template_name="a")],
             "default/p")
    c = out["claims"][0]["claims"][0]
    assert c["node"] in ("n2", "n3") and c["devices"] == [f"{DRIVER}/{c['node']}/gpu-0", f"{DRIVER}/{c['node']}/gpu-1"]
    assert any(line.startswith("claim default/p-gpus (default/p): devices") for line in out["summary"])


def test_an_allocated_claim_names_its_allocation() -> None:
    out = ex([*base(), claim("c", 1, allocated=[("n1", "gpu-3")]), podgroup("g", "q"),
              claim_pod("p", "g", claim_name="c")], "default/p")
    assert out["claims"][0]["claims"][0] == {"claim": "default/c", "devices": [f"{DRIVER}/n1/gpu-3"],
                                             "allocated": True}


def test_a_pending_pod_names_the_selector_that_keeps_devices_from_it() -> None:
    objs = [*base(("H100", "H100", "A100")), template("a", 9, "A100"), podgroup("g", "q"),
            claim_pod("p", "g", template_name="a")]
    out = ex(objs, "default/p")
    alt = out["claims"][0]["claims"][0]["requests"][0]["alternatives"][0]
    assert alt["free"] == 8 and alt["count"] == 9 and alt["best_node"] == {"node": "n2", "free": 8}
    assert alt["blocked"] == {f"selector {A100}": 16}
    assert any("8 free matching devices, needs 9; best node n2 has 8 (blocked: 16 selector" in line
               for line in out["summary"])


def test_taints_and_allocations_are_named() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            tainted_slice("n0", 4, {0: [UNHEALTHY], 1: [UNHEALTHY]}), claim("held", 2,
                                                                            allocated=[("n0", "gpu-2"),
                                                                                       ("n0", "gpu-3")]),
            tol_template("t", 1), podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    out = ex(objs, "default/p")
    alt = out["claims"][0]["claims"][0]["requests"][0]["alternatives"][0]
    assert alt["free"] == 0
    assert alt["blocked"] == {"taint example.com/unhealthy=ecc:NoSchedule": 2, "allocated to another claim": 2}


def test_a_full_shared_device_reads_no_capacity_left() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0"),
            mem_claim("old", "70Gi", "n0", reserved="gone"), mem_template("t", "20Gi"), podgroup("g", "q"),
            claim_pod("p", "g", template_name="t")]
    out = ex(objs, "default/p")
    alt = out["claims"][0]["claims"][0]["requests"][0]["alternatives"][0]
    assert alt["blocked"] == {"no capacity left": 1} and alt["share"] == {f"{DRIVER}/memory": 20 * 2**30}


def test_used_up_shared_counters_are_named() -> None:
    from test_dra_counters import BASE, allocated, group, partitioned, profile_template
    objs = [*BASE, *partitioned("n0"), allocated("held", "n0", "gpu-0", reserved="gone"),
            profile_template("p", "part"), *group("p0", "p")]
    out = ex(objs, "default/p0")
    alt = out["claims"][0]["claims"][0]["requests"][0]["alternatives"][0]
    assert alt["free"] == 0 and alt["blocked"]["shared counters of gpu-0-cs used up"] == 4


def test_a_claim_for_two_shares_with_one_device_of_room_says_so() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi", "80Gi")),
            mem_claim("old", "70Gi", "n0", reserved="gone"), mem_template("t", "40Gi", 2), podgroup("g", "q"),
            claim_pod("p", "g", template_name="t")]
    out = ex(objs, "default/p")
    alt = out["claims"][0]["claims"][0]["requests"][0]["alternatives"][0]
    assert alt["count"] == 2 and alt["free"] == 1 and alt["blocked"] == {"no capacity left": 1}
    assert any("needs 2 distinct devices with room for a share each" in line for line in out["summary"])


def test_the_used_up_set_of_a_device_on_two_sets_is_named() -> None:
    from test_dra_counters import PAIR_BASE, allocated, group
    out = ex([*PAIR_BASE, allocated("held", "n0", "gpu-1-p0", reserved="gone"), *group("a", "pair")], "default/a")
    alt = out["claims"][0]["claims"][0]["requests"][0]["alternatives"][0]
    assert alt["free"] == 0 and alt["blocked"]["shared counters of gpu-1-cs used up"] == 1
