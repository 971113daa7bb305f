"""DRA (resource.k8s.io/v1): the objects' models, devices as columns, claims through the greedy and CP-SAT engines,
the checker's DRA invariant, claims after a plan, and a property test over random DRA clusters."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, pod, podgroup, queue, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from kai_opt.api.dra import ResourceClaim, ResourceSlice
from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.dra.allocate import claims_after
from kai_opt.engine import run_cycle
from kai_opt.plan import Placement, Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import ClusterState, build_state

V = "resource.k8s.io/v1"
DRIVER = "gpu.example.com"
MIG = "nvidia.com/mig-1g.10gb"
CONFIG = parse_config({"engine": "greedy"})
CPSAT = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 1, "seed": 0}})


def device_class(name: str = "gpu.example.com", expr: str | None = None) -> RawObject:
    sel = [{"cel": {"expression": expr or f'device.driver == "{DRIVER}"'}}]
    return RawObject("DeviceClass", {"apiVersion": V, "kind": "DeviceClass", "metadata": {"name": name},
                                     "spec": {"selectors": sel}})


def rslice(node_name: str, n: int, product: str, generation: int = 1, mem: str = "80Gi") -> RawObject:
    devices = [{"name": f"gpu-{i}", "attributes": {"productName": {"string": product}, "index": {"int": i}},
                "capacity": {"memory": {"value": mem}}} for i in range(n)]
    return RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice",
                                       "metadata": {"name": f"{node_name}-{DRIVER}"},
                                       "spec": {"driver": DRIVER, "nodeName": node_name, "devices": devices,
                                                "pool": {"name": node_name, "generation": generation,
                                                         "resourceSliceCount": 1}}})


def claim_spec(count: int = 1, product: str | None = None, mode: str = "ExactCount") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.example.com", "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = count
    if product:
        exactly["selectors"] = [{"cel": {"expression":
                                         f'device.attributes["{DRIVER}"].productName == "{product}"'}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def claim(name: str, count: int = 1, product: str | None = None, ns: str = "default",
          allocated: list[tuple[str, str]] | None = None, reserved: list[str] | None = None) -> RawObject:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpus", "driver": DRIVER, "pool": pool, "device": dev} for pool, dev in allocated]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": r, "uid": r} for r in reserved]
    return RawObject("ResourceClaim", {"apiVersion": V, "kind": "ResourceClaim",
                                       "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"},
                                       "spec": claim_spec(count, product), "status": status})


def template(name: str, count: int = 1, product: str | None = None, ns: str = "default") -> RawObject:
    return RawObject("ResourceClaimTemplate", {"apiVersion": V, "kind": "ResourceClaimTemplate",
                                               "metadata": {"name": name, "namespace": ns},
                                               "spec": {"spec": claim_spec(count, product)}})


def claim_pod(name: str, group: str, *, claim_name: str | None = None, template_name: str | None = None,
              node_name: str | None = None) -> RawObject:
    ref: dict[str, Any] = {"name": "gpus"}
    if claim_name:
        ref["resourceClaimName"] = claim_name
    else:
        ref["resourceClaimTemplateName"] = template_name
    return pod(name, group, node_name=node_name, resourceClaims=[ref])


def base(products: tuple[str, ...] = ("H100", "H100", "A100", "A100"), per_node: int = 8) -> list[RawObject]:
    objs = [queue("q", gpu=(64, 1, -1)), device_class()]
    for i, prod in enumerate(products):
        objs += [node(f"n{i}", gpus=0), rslice(f"n{i}", per_node, prod)]
    return objs


def cycle(objs: list[RawObject], engine: Engine = Engine.greedy) -> tuple[Any, Plan]:
    st = build_state(snapshot(objs))
    plan, fs = run_cycle(st, CPSAT if engine == Engine.cpsat else CONFIG, engine=engine)
    check_plan(st, plan, fs, CONFIG)
    return st, plan


def where(st: Any, plan: Plan) -> dict[str, str]:
    return {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}


# -- models ---------------------------------------------------------------------------------------------------
def test_models_read_slices_claims_and_pod_claims() -> None:
    s = snapshot([*base()[:4], claim("c", 2, "H100", allocated=[("n0", "gpu-0")], reserved=["p"]),
                  template("t", 1), claim_pod("p", "g", claim_name="c"), podgroup("g", "q")])
    sl = s.resource_slices[0]
    assert isinstance(sl, ResourceSlice) and sl.pool == "n0" and sl.generation == 1 and len(sl.devices) == 8
    assert sl.devices[0].attributes[f"{DRIVER}/productName"] == "H100"
    assert sl.devices[0].capacity[f"{DRIVER}/memory"] == 80 * 2**30
    c = s.resource_claims[0]
    assert isinstance(c, ResourceClaim) and c.resource_version == "7"
    assert c.spec.requests[0].alternatives[0].count == 2 and c.allocation and c.allocation[0].device == "gpu-0"
    assert c.reserved_for[0].name == "p"
    assert s.claim_templates[0].spec.requests[0].name == "gpus"
    assert s.pods[0].resource_claims[0].claim_name == "c"


def test_a_bad_claim_is_a_one_line_input_error() -> None:
    from kai_opt.errors import InputError
    bad = RawObject("ResourceClaim", {"apiVersion": V, "kind": "ResourceClaim",
                                      "metadata": {"name": "c", "namespace": "d"},
                                      "spec": {"devices": {"requests": [{"name": "r", "exactly": {"count": 1}}]}}})
    with pytest.raises(InputError, match="deviceClassName is required"):
        snapshot([bad])


# -- placement ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_a_template_claim_for_two_gpus_of_one_product_goes_to_a_node_with_that_product(engine: Engine) -> None:
    objs = [*base(), template("a100x2", 2, "A100"), podgroup("g", "q"), claim_pod("p", "g", template_name="a100x2")]
    st, plan = cycle(objs, engine)
    assert where(st, plan)["p"] in ("n2", "n3")
    assert st.pods[st.pod_index["default/p"]].dra_gpus == 2  # DRA GPUs count as GPUs for the queue


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_any_gpu_and_one_product_share_a_column_on_nodes_of_one_product(engine: Engine) -> None:
    """Queries over several kinds: kinds that never share a node share a column; a query over part of it is
    pinned to its nodes, so an H100 request never lands on the A100 nodes of the column."""
    objs = [*base(), template("any", 4), template("h", 6, "H100"), podgroup("ga", "q", min_member=4),
            podgroup("gh", "q", min_member=2, priority_class="inference")]
    objs += [claim_pod(f"a{i}", "ga", template_name="any") for i in range(4)]
    objs += [claim_pod(f"h{i}", "gh", template_name="h") for i in range(2)]
    st, plan = cycle(objs, engine)
    placed = where(st, plan)
    assert {placed["h0"], placed["h1"]} == {"n0", "n1"}  # 6 of the 8 H100 on each
    assert sorted(placed[f"a{i}"] for i in range(4)) == ["n2", "n2", "n3", "n3"]
    assert st.resources.count("dra:gpu.example.com") == 1


def test_a_query_over_kinds_that_share_a_node_is_not_placed() -> None:
    objs = [queue("q"), device_class(), node("n0", gpus=0), rslice("n0", 2, "H100")]
    other = rslice("n0", 2, "A100")
    other.obj["metadata"]["name"] = "second"
    other.obj["spec"]["pool"]["name"] = "second"
    for d in other.obj["spec"]["devices"]:
        d["name"] = "x" + d["name"]
    objs += [other, template("any", 1), template("h", 1, "H100"), podgroup("g", "q"), podgroup("g2", "q"),
             claim_pod("a", "g", template_name="any"), claim_pod("h", "g2", template_name="h")]
    st, plan = cycle(objs)
    assert where(st, plan) == {"h": "n0"}
    assert any("node n0 has devices of two of them" in w for w in st.warnings), st.warnings


def test_selectors_are_evaluated_once_per_device_and_expression() -> None:
    objs = [*base(), template("h", 1, "H100"), podgroup("g", "q", min_member=3)]
    objs += [claim_pod(f"p{i}", "g", template_name="h") for i in range(3)]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    # 32 devices, 16 of them different (8 indexes x 2 products: alike devices of other nodes share one
    # evaluation), x (the class selector + the request selector)
    assert st.dra.selectors.evaluations == 32 and st.dra.selectors.lookups == 64
    run_cycle(st, CONFIG, engine=Engine.greedy)
    assert st.dra.selectors.evaluations == 32


def test_too_many_devices_stays_pending_and_a_gang_binds_all_or_nothing() -> None:
    objs = [*base(("H100",)), template("t", 9), podgroup("g", "q"), claim_pod("big", "g", template_name="t")]
    _, plan = cycle(objs)
    assert not plan.placements
    gang = [*base(("H100", "H100"), per_node=4), template("t2", 2), podgroup("gang", "q", min_member=5)]
    gang += [claim_pod(f"w{i}", "gang", template_name="t2") for i in range(5)]
    _, plan = cycle(gang)
    assert not plan.placements  # 5 x 2 devices > 8
    gang4 = [o for o in gang if o.obj["metadata"]["name"] != "w4"]
    gang4 = [podgroup("gang", "q", min_member=4) if o.obj["metadata"]["name"] == "gang" else o for o in gang4]
    _st, plan = cycle(gang4)
    assert len(plan.placements) == 4


def test_an_allocated_claim_pins_its_pod_and_a_shared_claim_is_held_once() -> None:
    objs = [*base(), claim("c", 2, allocated=[("n3", "gpu-0"), ("n3", "gpu-1")]), podgroup("g", "q"),
            claim_pod("p", "g", claim_name="c")]
    st, plan = cycle(objs)
    assert where(st, plan) == {"p": "n3"}
    from kai_opt.heuristics.nodefilter import NodeFilter
    from kai_opt.heuristics.session import Session
    from kai_opt.state.cluster import DRA_UNAVAILABLE
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    why = NodeFilter(Session(st, fs, CONFIG)).diagnose(st.pod_index["default/p"]).reasons
    assert why[f"node(s) {DRA_UNAVAILABLE}"] == 3  # the pending reason names DRA on the 3 other nodes
    shared = [*base(("H100", "H100"), per_node=2), claim("s", 2), podgroup("g1", "q"), podgroup("g2", "q"),
              claim_pod("a", "g1", claim_name="s"), claim_pod("b", "g2", claim_name="s")]
    st, plan = cycle(shared)
    placed = where(st, plan)
    assert placed["a"] == placed["b"]  # both on the node of the one allocation, 2 devices and not 4


def test_reclaim_frees_a_claim_and_claims_after_release_it() -> None:
    objs = [queue("q1", gpu=(1, 1, -1)), queue("q2", gpu=(1, 1, -1)), device_class(),
            node("n0", gpus=0), rslice("n0", 2, "H100"),
            claim("run", 2, allocated=[("n0", "gpu-0"), ("n0", "gpu-1")], reserved=["r"]), claim("want", 1),
            podgroup("gr", "q1", priority_class="train"), podgroup("gw", "q2", priority_class="train"),
            claim_pod("r", "gr", claim_name="run", node_name="n0"), claim_pod("w", "gw", claim_name="want")]
    s = snapshot(objs)
    st = build_state(s)
    plan, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    check_plan(st, plan, fs, CONFIG)
    assert [st.pods[e.pod].name for e in plan.evictions] == ["r"]
    assert st.dra is not None
    after = {c.meta.name: c for c in claims_after(s.resource_claims, st.dra, {}, {"default/r"})}
    assert after["run"].allocation is None and after["run"].reserved_for == ()
    bound = {c.meta.name: c for c in claims_after(list(after.values()), st.dra, {"default/w": ("n0", "u")}, set())}
    assert bound["want"].allocation is not None and bound["want"].reserved_for[0].name == "w"


def test_the_checker_refuses_devices_given_twice_and_a_pod_off_its_claims_node() -> None:
    objs = [*base(("H100",), per_node=2), node("n9", gpus=0), template("t", 2), podgroup("g1", "q"),
            podgroup("g2", "q"), claim_pod("a", "g1", template_name="t"), claim_pod("b", "g2", template_name="t")]
    st = build_state(snapshot(objs))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    a, b = st.pod_index["default/a"], st.pod_index["default/b"]
    bad = Plan(engine="greedy", placements=[Placement(pod=a, node=0, devices=()), Placement(pod=b, node=0,
                                                                                            devices=())])
    with pytest.raises(PlanViolation, match=r"needs 2|Insufficient|dra"):
        check_plan(st, bad, fs, CONFIG)
    pinned = [*base(("H100", "H100"), per_node=2), claim("c", 1, allocated=[("n1", "gpu-0")]),
              podgroup("g", "q"), claim_pod("p", "g", claim_name="c")]
    st = build_state(snapshot(pinned))
    _, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    off = Plan(engine="greedy", placements=[Placement(pod=st.pod_index["default/p"], node=0, devices=())])
    with pytest.raises(PlanViolation, match="off the claim's nodes"):
        check_plan(st, off, fs, CONFIG)


def test_a_stale_slice_generation_is_not_used() -> None:
    objs = [queue("q"), device_class(), node("n0", gpus=0), rslice("n0", 4, "H100", generation=2)]
    old = rslice("n0", 8, "H100", generation=1)
    old.obj["metadata"]["name"] = "old"
    objs += [old, template("t", 6), podgroup("g", "q"), claim_pod("p", "g", template_name="t")]
    _, plan = cycle(objs)
    assert not plan.placements


def test_a_scenario_file_with_dra_devices_and_claims(tmp_path: Any) -> None:
    from kai_opt.loaders import load_snapshot
    f = tmp_path / "s.yaml"
    f.write_text("""
apiVersion: kai-opt/v1
kind: Scenario
deviceClasses: [{name: gpu.example.com, selectors: ['device.driver == "gpu.example.com"']}]
nodePools:
- {name: h, count: 2, template: {cpu: "64", memory: 512Gi},
   draDevices: {driver: gpu.example.com, count: 8, attributes: {productName: H100}}}
- {name: a, count: 2, template: {cpu: "64", memory: 512Gi},
   draDevices: {driver: gpu.example.com, count: 8, attributes: {productName: A100}}}
queues: [{name: team, gpu: {quota: 32}}]
jobs:
- name: train
  queue: team
  replicas: 5
  pod: {claims: [{deviceClass: gpu.example.com, count: 3,
                  selectors: ['device.attributes["gpu.example.com"].productName == "A100"']}]}
""")
    snap = load_snapshot(f)
    assert len(snap.resource_slices) == 4 and len(snap.claim_templates) == 1 and snap.device_classes
    st = build_state(snap)
    plan, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    check_plan(st, plan, fs, CONFIG)
    assert not plan.placements  # a gang of 5 x 3 A100 on 2 x 8 A100 devices: all or nothing
    f.write_text(f.read_text().replace("replicas: 5", "replicas: 4"))
    st = build_state(load_snapshot(f))
    plan, _ = run_cycle(st, CONFIG, engine=Engine.greedy)
    assert sorted(st.node_names[p.node] for p in plan.placements) == ["a-0", "a-0", "a-1", "a-1"]


def test_without_dra_objects_the_state_is_unchanged() -> None:
    objs = [queue("q"), node("n0"), podgroup("g", "q"), pod("p", "g", gpus=1)]
    st = build_state(snapshot(objs))
    assert st.dra is None and "default/p" in st.pod_index


def test_mig_profiles_are_placed_and_checked_as_extended_resources() -> None:
    n = node("n0", gpus=0)
    n.obj["status"]["allocatable"][MIG] = "2"
    objs = [queue("q", gpu=(8, 1, -1)), n, podgroup("g", "q", min_member=3)]
    for i in range(3):
        p = pod(f"m{i}", "g")
        p.obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", MIG: "1"}, "limits": {MIG: "1"}}
        objs.append(p)
    _, plan = cycle(objs)
    assert not plan.placements  # 3 profiles on a node of 2: the gang waits
    two = [podgroup("g", "q", min_member=2) if o.obj["metadata"]["name"] == "g" else o for o in objs
           if o.obj["metadata"]["name"] != "m2"]
    _, plan = cycle(two)
    assert len(plan.placements) == 2


# -- property: the checker never fires ------------------------------------------------------------------------
@hs.composite
def dra_clusters(draw: hs.DrawFn) -> list[RawObject]:
    products = ("H100", "A100")
    n_nodes = draw(hs.integers(1, 4))
    objs: list[RawObject] = [queue("qa", gpu=(draw(hs.integers(0, 8)), 1, -1)),
                             queue("qb", gpu=(draw(hs.integers(0, 8)), 1, -1)), device_class()]
    for i in range(n_nodes):
        n = node(f"n{i}", gpus=draw(hs.integers(0, 2)))
        mig = draw(hs.integers(0, 3))
        if mig:  # MIG profiles (mixed strategy): extended resources per profile
            n.obj["status"]["allocatable"][MIG] = str(mig)
            n.obj["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
        objs += [n, rslice(f"n{i}", draw(hs.integers(0, 4)), draw(hs.sampled_from(products)),
                           mem=draw(hs.sampled_from(("80Gi", "40Gi"))))]  # (kinds of one class on other nodes)
    n_groups = draw(hs.integers(1, 5))
    for g in range(n_groups):
        size = draw(hs.integers(1, 3))
        q = draw(hs.sampled_from(("qa", "qb")))
        objs.append(podgroup(f"g{g}", q, min_member=draw(hs.integers(1, size)),
                             priority_class=draw(hs.sampled_from(("train", "inference")))))
        kind = draw(hs.sampled_from(("template", "shared", "plain")))
        count = draw(hs.integers(1, 3))
        prod = draw(hs.sampled_from((None, *products)))
        if kind == "template":
            objs.append(template(f"t{g}", count, prod))
            if draw(hs.booleans()):  # only the 80Gi devices
                objs[-1].obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
                    "requests": {"memory": "80Gi"}}
        elif kind == "shared":
            objs.append(claim(f"c{g}", count, prod))
        for k in range(size):
            running = draw(hs.booleans()) and kind == "plain"
            name = f"g{g}-{k}"
            if kind == "template":
                objs.append(claim_pod(name, f"g{g}", template_name=f"t{g}"))
            elif kind == "shared":
                objs.append(claim_pod(name, f"g{g}", claim_name=f"c{g}"))
            else:
                p = pod(name, f"g{g}", gpus=draw(hs.integers(0, 1)),
                        node_name=f"n{draw(hs.integers(0, n_nodes - 1))}" if running else None)
                if draw(hs.booleans()) and not running:
                    req = p.obj["spec"]["containers"][0]["resources"]
                    req["requests"].pop("nvidia.com/gpu", None)
                    req["limits"] = {MIG: "1"}
                    req["requests"][MIG] = "1"
                objs.append(p)
    return objs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dra_clusters(), hs.sampled_from([Engine.greedy, Engine.cpsat]))
def test_the_checker_never_fires_on_random_dra_and_mig_clusters(objs: list[RawObject], engine: Engine) -> None:
    st, plan = checked_cycle(objs, engine)
    for pl in plan.placements:  # a MIG request lands only where the profile is
        if st.pods[pl.pod].requests.get(MIG):
            assert st.node_alloc[pl.node, st.resources.index(MIG)] >= 1


def placed(st: ClusterState, plan: Plan) -> dict[str, str]:
    """Pod name -> node name of every placement of the plan."""
    return {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}


def checked_cycle(objs: list[RawObject], engine: Engine = Engine.greedy) -> tuple[ClusterState, Plan]:
    """One cycle of `engine` on the objects: its plan passes the checker, and a CP-SAT plan did not fail it
    (a fallback for that reason would hide a model bug behind the greedy plan)."""
    st = build_state(snapshot(objs))
    plan, fs = run_cycle(st, CPSAT if engine == Engine.cpsat else CONFIG, engine=engine)
    check_plan(st, plan, fs, CONFIG)
    if plan.solver is not None:
        assert "failed the checker" not in (plan.solver.note or "")
    return st, plan


def test_devices_chosen_for_binds_in_flight_are_not_chosen_again() -> None:
    from kai_opt.k8s.dra import ClaimDevices
    objs = [*base(("H100",), per_node=4), template("t", 2), podgroup("g", "q", min_member=3)]
    objs += [claim_pod(f"p{i}", "g", template_name="t") for i in range(3)]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    chooser = ClaimDevices()
    first = chooser.for_bind(st.dra, "default/p0", "n0")
    second = chooser.for_bind(st.dra, "default/p1", "n0")
    assert first is not None and second is not None
    got = [r.device for w in (*first, *second) for r in w.results or ()]
    assert sorted(got) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert first[0].pod_claim == "gpus" and first[0].name is None and first[0].template == "t"
    assert chooser.for_bind(st.dra, "default/p2", "n0") is None  # all 4 in flight
    chooser.forget(first)  # p0's bind failed: its devices are free again
    again = chooser.for_bind(st.dra, "default/p2", "n0")
    assert again is not None and sorted(r.device for r in again[0].results or ()) == ["gpu-0", "gpu-1"]


def test_a_device_in_flight_is_free_once_its_claim_was_seen_allocated_and_then_released() -> None:
    """A chosen device counts as taken until the watch shows its claim allocated (then the allocation holds it);
    released soon after (a reclaim victim's), it is free at once, not INFLIGHT_S after it was chosen."""
    from kai_opt.k8s.dra import ClaimDevices
    objs = [*base(("H100",), per_node=2), template("t", 2), podgroup("g", "q"), podgroup("h", "q"),
            claim_pod("p0", "g", template_name="t"), claim_pod("p1", "h", template_name="t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    chooser = ClaimDevices()
    assert chooser.for_bind(st.dra, "default/p0", "n0") is not None
    assert chooser.for_bind(st.dra, "default/p1", "n0") is None  # p0's 2 devices in flight
    seen = {(d.driver, d.pool, d.name) for d in st.dra.devices if d.node == "n0"}
    st.dra.allocated |= seen  # a later cycle (no bind of DRA pods in it): the watch shows p0's claim allocated
    chooser.seen(st.dra)
    st.dra.allocated -= seen  # p0 evicted, its claim released
    again = chooser.for_bind(st.dra, "default/p1", "n0")
    assert again is not None and sorted(r.device for r in again[0].results or ()) == ["gpu-0", "gpu-1"]
