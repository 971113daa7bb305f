"""The plan checker catches each invariant it guards (DESIGN section 5): hand-made bad plans on small clusters.

The property tests show that the engines' plans never trip it; these show that it would if they did.
"""

from __future__ import annotations

import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Config
from kai_opt.fairshare.share import compute_fair_share
from kai_opt.plan import WITHDRAWN, Eviction, Placement, Plan, Reason
from kai_opt.snapshot import RawObject
from kai_opt.state import ClusterState

CFG = Config()


def _cluster() -> ClusterState:
    topo = RawObject("Topology", {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": "rack"}]}})
    return state([
        node("n1", gpus=4, labels={"rack": "r1"}), node("n2", gpus=4, labels={"rack": "r2"}),
        node("down", gpus=4, labels={"rack": "r1"}, ready=False), topo,
        queue("a", gpu=(2, 1, 4)), queue("b", gpu=(2, 1, -1)),
        podgroup("run", "b", min_member=2), pod("run-0", "run", gpus=1, node_name="n1"),
        pod("run-1", "run", gpus=1, node_name="n1"),
        podgroup("important", "b", priority_class="inference"),
        pod("important-0", "important", gpus=1, node_name="n2"),
        podgroup("gang", "a", min_member=3), *(pod(f"gang-{i}", "gang", gpus=1) for i in range(3)),
        podgroup("racked", "a", min_member=2, topologyConstraint={"topology": "t", "requiredTopologyLevel": "rack"}),
        *(pod(f"racked-{i}", "racked", gpus=1) for i in range(2)),
        podgroup("big", "a"), pod("big-0", "big", gpus=4),
        podgroup("np", "a", priority_class="build"), pod("np-0", "np", gpus=3),
        podgroup("gated", "a"), pod("gated-0", "gated", gpus=1, schedulingGates=[{"name": "wait"}]),
        pod("theirs", gpus=1, node_name="down", scheduler="default-scheduler"),
    ])


def _ids(st: ClusterState) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    pods = {p.meta.name: i for i, p in enumerate(st.pods)}
    groups = {k.split("/", 1)[1]: i for i, k in enumerate(st.pg_keys)}
    nodes = {n: i for i, n in enumerate(st.node_names)}
    return pods, groups, nodes


def _problems(st: ClusterState, placements: list[Placement], evictions: list[Eviction] | None = None) -> str:
    fs = compute_fair_share(st)
    with pytest.raises(PlanViolation) as err:
        check_plan(st, Plan("test", placements=placements, evictions=evictions or []), fs, CFG)
    return "; ".join(err.value.problems)


def test_a_valid_plan_passes() -> None:
    st = _cluster()
    p, _, n = _ids(st)
    plan = Plan("test", placements=[Placement(p[f"gang-{i}"], n["n2"], (i + 1,)) for i in range(3)])
    check_plan(st, plan, compute_fair_share(st), CFG)


def test_node_and_device_over_capacity() -> None:
    st = _cluster()
    p, _, n = _ids(st)
    text = _problems(st, [Placement(p["big-0"], n["n1"], (0, 1, 2, 3))])
    assert "node n1 over capacity now in nvidia.com/gpu" in text
    assert "GPU device 0 of n1 over capacity" in text


def test_partial_gang() -> None:
    st = _cluster()
    p, _, n = _ids(st)
    text = _problems(st, [Placement(p["gang-0"], n["n2"], (1,)), Placement(p["gang-1"], n["n2"], (2,))])
    assert "podgroup default/gang gets placements but ends with 2 pods, minMember 3" in text


def test_required_topology_spanning_two_racks() -> None:
    st = _cluster()
    p, _, n = _ids(st)
    text = _problems(st, [Placement(p["racked-0"], n["n1"], (2,)), Placement(p["racked-1"], n["n2"], (1,))])
    assert "podgroup default/racked podgroup spans 2 domains of required level rack" in text


def test_queue_limit_and_non_preemptible_quota() -> None:
    st = _cluster()
    p, _, n = _ids(st)
    text = _problems(st, [Placement(p["big-0"], n["n2"], (0, 1, 2, 3))])  # queue a: limit 4 is fine ...
    assert "limit" not in text
    pl = [Placement(p["gang-0"], n["n2"], (1,)), Placement(p["gang-1"], n["n2"], (2,)),
          Placement(p["gang-2"], n["n2"], (3,)), Placement(p["np-0"], n["n1"], (2, 3)),
          Placement(p["racked-0"], n["n1"], ()), Placement(p["racked-1"], n["n1"], ())]
    text = _problems(st, pl)
    assert "queue a exceeds its gpu limit 4" in text
    assert "queue a non-preemptible gpu 3 exceeds its quota 2" in text
    assert "got 0 GPU devices, needs 1" in text and "got 2 GPU devices, needs 3" in text


def test_evictions_need_a_beneficiary_a_preemptible_victim_and_a_whole_gang() -> None:
    st = _cluster()
    p, g, _ = _ids(st)
    text = _problems(st, [], [Eviction(p["run-0"], "reclaim", g["gang"])])
    assert "pod default/run-0 evicted (reclaim) without a beneficiary placed in the plan" in text
    assert "podgroup default/run is left with 1 pods after evictions, below its minMember 2" in text
    text = _problems(st, [], [Eviction(p["important-0"], "preempt", g["gang"])])
    assert "its podgroup is non-preemptible" in text and "preempted for a podgroup of another queue" in text
    text = _problems(st, [], [Eviction(p["run-0"], "tidy-up")])
    assert "evicted with unknown reason 'tidy-up'" in text
    text = _problems(st, [], [Eviction(p["run-0"], "consolidate", g["gang"])])
    assert "consolidated but not re-placed" in text


def test_a_beneficiary_whose_placement_was_taken_back_still_counts() -> None:
    """KAI's victims include pods placed in the same session: a consolidation may move a pod for a group that a
    later reclaim takes back. The group is then pending with a PlacementWithdrawn reason naming the group it was
    taken for, and the move's eviction keeps its beneficiary while that group is placed; any other pending reason
    does not do."""
    st = _cluster()
    p, g, n = _ids(st)
    evictions = [Eviction(p["run-0"], "consolidate", g["big"]), Eviction(p["run-1"], "consolidate", g["big"])]
    moves = [Placement(p["run-0"], n["n2"], (1,), True, True), Placement(p["run-1"], n["n2"], (2,), True, True)]
    fs = compute_fair_share(st)
    # the group it was taken for (gang) is placed: on n1, where the moved pods' room went
    gang = [Placement(p[f"gang-{i}"], n["n1"], (i,), True) for i in range(3)]
    taken = Reason(WITHDRAWN, "placed in this cycle, then taken back as a victim (reclaim) for default/gang",
                   {"action": "reclaim", "for": "default/gang"})
    check_plan(st, Plan("test", placements=moves + gang, evictions=evictions, pending={g["big"]: [taken]}), fs, CFG)
    # taken for a group the plan does not place: the moves served nobody
    with pytest.raises(PlanViolation, match="without a beneficiary placed in the plan"):
        check_plan(st, Plan("test", placements=moves, evictions=evictions, pending={g["big"]: [taken]}), fs, CFG)
    other = Reason("Unschedulable", "no room")
    with pytest.raises(PlanViolation, match="without a beneficiary placed in the plan"):
        check_plan(st, Plan("test", placements=moves + gang, evictions=evictions, pending={g["big"]: [other]}), fs,
                   CFG)


def test_only_our_pending_ungated_pods_are_placed_on_ready_nodes() -> None:
    st = _cluster()
    p, _, n = _ids(st)
    assert "gated-0" in _problems(st, [Placement(p["gated-0"], n["n2"], (1,))])
    assert "theirs is not one of our pending" in _problems(st, [Placement(p["theirs"], n["n2"], (1,))])
    assert "theirs evicted but it is not one of our running" in _problems(st, [], [Eviction(p["theirs"], "stale-gang")])
    assert "run-0 is not one of our pending" in _problems(st, [Placement(p["run-0"], n["n2"], (1,))])
    assert "placed on unschedulable node down" in _problems(st, [Placement(p["big-0"], n["down"], (0, 1, 2, 3))])
    twice = [Placement(p["big-0"], n["n2"], (0, 1, 2, 3)), Placement(p["big-0"], n["n2"], (0, 1, 2, 3))]
    assert "placed twice" in _problems(st, twice)
