"""DRA requests whose query matches devices of several kinds (issue 21): kinds that are never on one node share a
column (different GPU models, shared devices of different capacities or request policies, partitions consuming
different amounts of their counters), so the request is placed on whichever kind each node has; kinds that are on
one node, or that cannot be counted alike, are refused with a warning that says why (naming the node)."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, queue, snapshot
from test_dra import DRIVER, V, checked_cycle, device_class, rslice, template
from test_dra_capacity import GI, mem_template, pods_of, shared_slice
from test_dra_counters import group, partitioned, profile_template

from kai_opt.config import Engine
from kai_opt.dra.allocate import choose
from kai_opt.explain.dra import claim_entry, summary_lines
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state

ENGINES = [Engine.greedy, Engine.cpsat]
STEP40 = {"default": "40Gi", "validRange": {"min": "40Gi", "max": "80Gi", "step": "40Gi"}}


def on_nodes(st: Any, plan: Any) -> dict[str, str]:
    return {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}


def counts(placed: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in placed.values():
        out[n] = out.get(n, 0) + 1
    return out


def consumed_on(st: Any, node_name: str, pod: str) -> list[dict[str, int]]:
    """What the binder's choice writes for the pod's claim on the node (one entry per result)."""
    [ci] = st.dra.pod_claims[f"default/{pod}"]
    got = choose(st.dra, st.dra.claims[ci], node_name, set(st.dra.allocated))
    assert got is not None
    return [dict(r.consumed) for r in got]


@pytest.mark.parametrize("engine", ENGINES)
def test_shared_devices_of_different_capacities_on_different_nodes_take_shares_on_both(engine: Engine) -> None:
    """An 80Gi shared device on n0, a 40Gi one on n1: 30Gi shares, two on n0 and one on n1; a fourth waits."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi",)),
            node("n1", gpus=0), shared_slice("n1", ("40Gi",)), mem_template("t", "30Gi"), *pods_of(4, "t")]
    st, plan = checked_cycle(objs, engine)
    placed = on_nodes(st, plan)
    assert counts(placed) == {"n0": 2, "n1": 1}
    assert not st.warnings
    assert st.dra is not None and len(set(st.dra.kind_column)) == 1  # one column for both kinds
    n1_pod = next(p for p, n in placed.items() if n == "n1")
    assert consumed_on(st, "n1", n1_pod) == [{f"{DRIVER}/memory": 30 * GI}]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_only_the_larger_device_admits_is_pinned_to_its_nodes(engine: Engine) -> None:
    """A 60Gi share fits the 80Gi device only: it goes to n0 although the 40Gi device of n1 is in its column
    (the 30Gi shares share that column: they fill n1 and what n0 has left)."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi",)),
            node("n1", gpus=0), shared_slice("n1", ("40Gi",)), mem_template("big", "60Gi"),
            mem_template("t", "30Gi"), *pods_of(1, "big", prefix="b"), *pods_of(1, "t")]
    st, plan = checked_cycle(objs, engine)
    placed = on_nodes(st, plan)
    assert placed["b0"] == "n0" and placed["p0"] == "n1"
    assert st.dra is not None and len(set(st.dra.kind_column)) == 1
    [ci] = st.dra.pod_claims["default/b0"]
    assert st.dra.claims[ci].nodes == {"n0"}


@pytest.mark.parametrize("engine", ENGINES)
def test_kinds_whose_policies_round_apart_ask_the_larger_share(engine: Engine) -> None:
    """n0's 80Gi device rounds a 20Gi request to 40Gi, n1's (no policy) gives 20Gi: the column asks 40Gi per
    share (never too little: two on each node, though n1 could take four) and the binder writes what each
    node's device consumes."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0", ("80Gi",), policy=STEP40), node("n1", gpus=0), shared_slice("n1", ("80Gi",)),
            mem_template("t", "20Gi"), *pods_of(5, "t")]
    st, plan = checked_cycle(objs, engine)
    placed = on_nodes(st, plan)
    assert counts(placed) == {"n0": 2, "n1": 2}
    on = {n: p for p, n in placed.items()}
    assert consumed_on(st, "n0", on["n0"]) == [{f"{DRIVER}/memory": 40 * GI}]
    assert consumed_on(st, "n1", on["n1"]) == [{f"{DRIVER}/memory": 20 * GI}]


@pytest.mark.parametrize("engine", ENGINES)
def test_two_shares_on_nodes_of_different_capacities(engine: Engine) -> None:
    """count 2 of 30Gi: n0 has two 80Gi devices, n1 two 40Gi ones: one claim fits n1, two n0."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi", "80Gi")),
            node("n1", gpus=0), shared_slice("n1", ("40Gi", "40Gi")), mem_template("t", "30Gi", 2),
            *pods_of(4, "t")]
    st, plan = checked_cycle(objs, engine)
    assert counts(on_nodes(st, plan)) == {"n0": 2, "n1": 1}


@pytest.mark.parametrize("engine", ENGINES)
def test_partitions_consuming_different_counters_on_different_nodes_are_placed_on_both(engine: Engine) -> None:
    """Partitions of 20Gi on n0 and of 40Gi on n1 (each GPU 80Gi of counters): a partition request is placed on
    both nodes; the column asks the larger amount (40Gi) of the counters, so n0 takes two, not four."""
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), *partitioned("n0", part="20Gi"),
            node("n1", gpus=0), *partitioned("n1", part="40Gi", parts=2), profile_template("t", "part")]
    for k in range(7):
        objs += group(f"g{k}", "t")
    st, plan = checked_cycle(objs, engine)
    assert counts(on_nodes(st, plan)) == {"n0": 2, "n1": 2}
    assert not st.warnings


@pytest.mark.parametrize("engine", ENGINES)
def test_gpus_of_different_models_and_memory_on_different_nodes_share_a_column(engine: Engine) -> None:
    """Exclusive devices: H100s of 80Gi on n0, A100s of 40Gi on n1. "any GPU" goes to either, a request for
    at least 80Gi of memory only to n0 (pinned), both in one column."""
    big = RawObject("ResourceClaimTemplate", {
        "apiVersion": V, "kind": "ResourceClaimTemplate", "metadata": {"name": "big", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "count": 2, "capacity": {"requests": {"memory": "80Gi"}}}}]}}}})
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), rslice("n0", 2, "H100"),
            node("n1", gpus=0), rslice("n1", 2, "A100", mem="40Gi"), big, template("any", 2),
            *pods_of(1, "big", prefix="b"), *pods_of(2, "any")]
    st, plan = checked_cycle(objs, engine)
    placed = on_nodes(st, plan)
    assert placed["b0"] == "n0" and counts(placed) == {"n0": 1, "n1": 1}
    assert st.dra is not None and len(set(st.dra.kind_column)) == 1


def test_shared_devices_of_two_capacities_on_one_node_are_refused_naming_it() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi",)),
            node("n1", gpus=0), shared_slice("n1", ("80Gi", "40Gi")), mem_template("t", "30Gi"),
            *pods_of(1, "t")]
    st, plan = checked_cycle(objs)
    assert not plan.placements
    assert any("node n1 has devices of two of them" in w for w in st.warnings), st.warnings


def test_exclusive_devices_with_and_without_counters_are_refused_saying_why() -> None:
    """n0's partitions consume counters, n1's plain devices of the same profile do not: no one column counts
    both (the request waits, the warning says so and names no node)."""
    plain = RawObject("ResourceSlice", {"apiVersion": V, "kind": "ResourceSlice", "metadata": {"name": "n1-plain"},
                                        "spec": {"driver": DRIVER, "nodeName": "n1",
                                                 "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                                                 "devices": [{"name": "d0", "attributes": {
                                                     "profile": {"string": "part"}}}]}})
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), *partitioned("n0"),
            node("n1", gpus=0), plain, profile_template("t", "part"), *group("g", "t")]
    st, plan = checked_cycle(objs)
    assert not plan.placements
    assert any("kinds kai-opt counts apart (devices consuming different shared counters)" in w
               for w in st.warnings), st.warnings


def test_explain_shows_the_share_of_the_node_it_goes_to() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0),
            shared_slice("n0", ("80Gi",), policy=STEP40), node("n1", gpus=0), shared_slice("n1", ("80Gi",)),
            mem_template("t", "20Gi"), *pods_of(1, "t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    [ci] = st.dra.pod_claims["default/p0"]
    entry = claim_entry(st.dra, st.dra.claims[ci], "n1")
    assert entry["devices"] == [f"{DRIVER}/n1/gpu-0 (share {{'{DRIVER}/memory': {20 * GI}}})"]
    entry = claim_entry(st.dra, st.dra.claims[ci], "n0")
    assert entry["devices"] == [f"{DRIVER}/n0/gpu-0 (share {{'{DRIVER}/memory': {40 * GI}}})"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_whole_device_share_over_80gi_and_40gi_devices_is_counted_at_80gi_and_explain_says_so(
        engine: Engine) -> None:
    """Without capacity.requests a share takes its device whole: 80Gi on n0, 40Gi on n1. The column counts the
    larger (conservative: never too little), so the pod goes to n0 only; with n0 partly taken it waits, and
    explain says the share is counted at the most its devices take."""
    from test_dra_capacity import mem_claim
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), shared_slice("n0", ("80Gi",)),
            node("n1", gpus=0), shared_slice("n1", ("40Gi",)), mem_template("t", None), *pods_of(1, "t")]
    st, plan = checked_cycle(objs, engine)
    assert on_nodes(st, plan) == {"p0": "n0"}
    objs.append(mem_claim("old", "10Gi", "n0", reserved="gone"))
    st, plan = checked_cycle(objs, engine)
    assert not plan.placements
    assert st.dra is not None
    [ci] = st.dra.pod_claims["default/p0"]
    entry = claim_entry(st.dra, st.dra.claims[ci], None)
    lines = summary_lines([{"pod": "default/p0", "claims": [entry]}])
    assert any(f"each share counted as {{'{DRIVER}/memory': {80 * GI}}}, the most its devices on different nodes"
               in line for line in lines), lines


def test_explain_says_partitions_are_counted_at_the_larger_size() -> None:
    objs = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), *partitioned("n0", part="20Gi"),
            node("n1", gpus=0), *partitioned("n1", part="40Gi", parts=2), profile_template("t", "part"),
            *group("g", "t")]
    st = build_state(snapshot(objs))
    assert st.dra is not None
    [ci] = st.dra.pod_claims["default/g"]
    assert st.dra.claims[ci].larger == [f"request gpus: each device counted as {{'memory': {40 * GI}}} of its shared "
                                        "counters, the most its devices on different nodes take (some take less)"]
