"""A preferred topology level orders nodes by KAI's preferred-domain scores when no preferred domain holds the
pods (KAI cases allocate/055, 056, 065, 066): the emptiest domain first, the later domain name among equals."""

from __future__ import annotations

from builders import node, pod, podgroup, queue, state

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.snapshot import RawObject

GREEDY = Config(engine=Engine.greedy)


def _topology(*levels: str) -> RawObject:
    return RawObject("Topology", {"metadata": {"name": "topo"},
                                  "spec": {"levels": [{"nodeLabel": lv} for lv in levels]}})


def _placed(objs: list[RawObject]) -> dict[str, str]:
    st = state(objs)
    plan, _ = run_cycle(st, GREEDY)
    return {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements if not p.moved}


def test_no_rack_holds_the_gang_first_pod_goes_to_the_later_equal_rack() -> None:
    """055: two racks with one free GPU each; a 2-pod gang preferring a rack starts in rack2 (KAI scores the
    last of equally full domains highest)."""
    objs = [node("node0", gpus=2, labels={"rack": "rack1"}), node("node1", gpus=2, labels={"rack": "rack2"}),
            _topology("rack"), queue("q", gpu=(4, 1, -1))]
    for i in range(2):
        objs += [podgroup(f"r{i}", "q"), pod(f"r{i}-0", group=f"r{i}", gpus=1, node_name=f"node{i}")]
    objs += [podgroup("p", "q", min_member=2, topologyConstraint={"topology": "topo",
                                                                  "preferredTopologyLevel": "rack"})]
    objs += [pod(f"p-{i}", group="p", gpus=1) for i in range(2)]
    assert _placed(objs) == {"p-0": "node1", "p-1": "node0"}


def test_required_rack_then_preferred_spine_scores_order_the_rack_nodes() -> None:
    """056: required rack (only rack2 fits), preferred spine (no spine fits): inside rack2 the pods follow the
    spine scores taken over the whole tree, spine2 of rack2 first."""
    layout = {"node0": ("rack1", "spine1"), "node1": ("rack1", "spine2"), "node2": ("rack2", "spine1"),
              "node3": ("rack2", "spine2")}
    objs = [node(n, gpus=2, labels={"rack": r, "spine": s}) for n, (r, s) in layout.items()]
    objs += [_topology("rack", "spine"), queue("q", gpu=(8, 1, -1)), podgroup("r", "q", min_member=5)]
    objs += [pod(f"r-{i}", group="r", gpus=1, node_name=n) for i, n in enumerate(["node0", "node0", "node1",
                                                                                   "node2", "node3"])]
    objs += [podgroup("p", "q", min_member=2, topologyConstraint={
        "topology": "topo", "requiredTopologyLevel": "rack", "preferredTopologyLevel": "spine"})]
    objs += [pod(f"p-{i}", group="p", gpus=1) for i in range(2)]
    assert _placed(objs) == {"p-0": "node3", "p-1": "node2"}


def _eight_nodes() -> list[RawObject]:
    objs = []
    for i in range(8):
        objs.append(node(f"node{i}", gpus=1, labels={"zone": "zone1", "spine": f"spine{i // 4 + 1}",
                                                    "rack": f"rack{i // 2 + 1}"}))
    return [*objs, _topology("zone", "spine", "rack"), queue("q", gpu=(8, 1, -1))]


def _sub_pods(subs: list[str]) -> list[RawObject]:
    return [pod(f"p-{i}", group="p", gpus=1, labels={"kai.scheduler/subgroup-name": s})
            for i, s in enumerate(subs)]


def test_group_preferring_a_spine_fills_the_emptiest_spine_first() -> None:
    """065: 6 pods, no spine holds them: the group's spine scores send the first four to spine2."""
    objs = [*_eight_nodes(), podgroup("p", "q", min_member=6, topologyConstraint={
        "topology": "topo", "preferredTopologyLevel": "spine"},
        subGroups=[{"name": "a", "minMember": 3}, {"name": "b", "minMember": 3}])]
    objs += _sub_pods(["a"] * 3 + ["b"] * 3)
    assert _placed(objs) == {"p-0": "node4", "p-1": "node5", "p-2": "node6", "p-3": "node7", "p-4": "node0",
                             "p-5": "node1"}


def test_sub_groups_preferring_racks_take_scores_over_what_they_are_offered() -> None:
    """066: sub-groups of 3 preferring a rack (none holds 3) inside the spine that fits: each takes the rack
    scores of its own start, so sub-group b (after a filled rack2 and node0) starts in rack4."""
    tc = {"topology": "topo", "preferredTopologyLevel": "rack"}
    objs = [*_eight_nodes(), podgroup("p", "q", min_member=6, topologyConstraint={
        "topology": "topo", "preferredTopologyLevel": "spine"},
        subGroups=[{"name": "a", "minMember": 3, "topologyConstraint": tc},
                   {"name": "b", "minMember": 3, "topologyConstraint": tc}])]
    objs += _sub_pods(["a"] * 3 + ["b"] * 3)
    assert _placed(objs) == {"p-0": "node2", "p-1": "node3", "p-2": "node0", "p-3": "node6", "p-4": "node7",
                             "p-5": "node4"}
