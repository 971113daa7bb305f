"""The greedy engine on crafted clusters: one behaviour per test."""

from __future__ import annotations

import json

import pytest
from builders import NOW, node, pod, podgroup, queue, snapshot, state

from kai_opt.cli.main import main
from kai_opt.config import Config, Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state

GREEDY = Config(engine=Engine.greedy)


def plan_of(objs, config: Config | None = None, actions=None):
    st = state(objs)
    plan, _ = run_cycle(st, config or GREEDY, actions=actions)
    return st, plan


def placed(st, plan) -> dict[str, str]:
    return {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements if not p.moved}


def evicted(st, plan) -> dict[str, str]:
    return {st.pods[e.pod].name: e.reason for e in plan.evictions}


def test_gang_is_all_or_nothing() -> None:
    objs = [node("a", gpus=8), node("b", gpus=8), queue("q", gpu=(16, 1, -1)),
            podgroup("big", "q", min_member=5)] + [pod(f"big-{i}", group="big", gpus=4) for i in range(5)]
    objs += [podgroup("ok", "q", min_member=3)] + [pod(f"ok-{i}", group="ok", gpus=4) for i in range(3)]
    st, plan = plan_of(objs)
    names = placed(st, plan)
    assert not any(n.startswith("big") for n in names)
    assert sum(n.startswith("ok") for n in names) == 3
    reasons = plan.pending[st.pg_index["default/big"]]
    assert reasons[0].code == "Unschedulable"
    assert "while 5 are required for gang scheduling" in reasons[0].message
    assert "0/2 nodes are available" in reasons[0].message


def test_binpack_fills_the_fullest_node_and_spread_the_emptiest() -> None:
    objs = [node("a", gpus=8), node("b", gpus=8), queue("q", gpu=(16, 1, -1)),
            podgroup("r", "q"), pod("r-0", group="r", gpus=2, node_name="a"),
            podgroup("p", "q"), pod("p-0", group="p", gpus=1)]
    st, plan = plan_of(objs)
    assert placed(st, plan)["p-0"] == "a"
    cfg = parse_config({"placement": {"gpu": "spread"}})
    st, plan = plan_of(objs, cfg)
    assert placed(st, plan)["p-0"] == "b"


def test_fractions_share_one_device() -> None:
    objs = [node("a", gpus=2), queue("q", gpu=(2, 1, -1))]
    for i in range(2):
        objs += [podgroup(f"f{i}", "q"), pod(f"f{i}-0", group=f"f{i}", gpus=0.5)]
    _, plan = plan_of(objs)
    devs = {p.devices for p in plan.placements}
    assert len(plan.placements) == 2 and len(devs) == 1


def test_a_share_joins_a_shared_device_not_one_whose_pods_all_leave() -> None:
    """KAI's GPU order for a share: a device whose pods are all being released is a whole GPU being released
    (score 0 under gpupack), not a shared device; the share packs onto the device a running share holds."""
    objs = [node("a", gpus=2), queue("q", gpu=(2, 1, -1)),
            podgroup("r", "q"), pod("r-0", "r", gpus=0.3, node_name="a", labels={"runai-gpu-group": "g0"}),
            podgroup("d", "q"), pod("d-0", "d", gpus=0.4, node_name="a", labels={"runai-gpu-group": "g1"},
                                    deleting=True),
            podgroup("p", "q", created_min=1), pod("p-0", "p", gpus=0.4)]
    st, plan = plan_of(objs)
    (p,) = plan.placements
    assert st.pods[p.pod].name == "p-0" and not p.pipelined
    running = int(st.pod_devices(st.pod_index["default/r-0"])[0]) - int(st.dev_start[0])
    assert p.devices == (running,)


def test_required_topology_keeps_the_gang_in_one_rack() -> None:
    objs = [node(f"n{i}", gpus=4, labels={"rack": f"r{i // 2}"}) for i in range(4)]
    objs.append(RawObject("Topology", {"metadata": {"name": "racks"}, "spec": {"levels": [{"nodeLabel": "rack"}]}}))
    objs += [queue("q", gpu=(16, 1, -1)), podgroup("r", "q", min_member=1), pod("r-0", group="r", gpus=4,
                                                                                  node_name="n0")]
    objs += [podgroup("g", "q", min_member=3, topologyConstraint={"topology": "racks",
                                                                  "requiredTopologyLevel": "rack"})]
    objs += [pod(f"g-{i}", group="g", gpus=2) for i in range(3)]
    st, plan = plan_of(objs)
    nodes = {placed(st, plan)[f"g-{i}"] for i in range(3)}
    racks = {st.node_labels[st.node_index[n]]["rack"] for n in nodes}
    assert len(racks) == 1


def test_node_selector_and_taints() -> None:
    objs = [node("a", gpus=8, labels={"pool": "x"}),
            node("b", gpus=8, labels={"pool": "y"},
                 taints=[{"key": "dedicated", "value": "y", "effect": "NoSchedule"}]),
            queue("q", gpu=(16, 1, -1)), podgroup("s", "q"),
            pod("s-0", group="s", gpus=1, nodeSelector={"pool": "y"})]
    st, plan = plan_of(objs)
    assert not plan.placements
    msg = plan.pending[st.pg_index["default/s"]][0].message
    assert "didn't match Pod's node affinity/selector" in msg and "untolerated taint" in msg
    objs[-1] = pod("s-0", group="s", gpus=1, nodeSelector={"pool": "y"},
                   tolerations=[{"key": "dedicated", "operator": "Equal", "value": "y", "effect": "NoSchedule"}])
    st, plan = plan_of(objs)
    assert placed(st, plan) == {"s-0": "b"}


def test_queue_limit_blocks_with_over_limit_reason() -> None:
    objs = [node("a", gpus=8), queue("q", gpu=(2, 1, 3)), podgroup("r", "q"), pod("r-0", group="r", gpus=2,
                                                                                    node_name="a"),
            podgroup("p", "q"), pod("p-0", group="p", gpus=2)]
    st, plan = plan_of(objs)
    assert not plan.placements
    r = plan.pending[st.pg_index["default/p"]][0]
    assert r.code == "OverLimit" and r.details["queue"] == "q"


def test_non_preemptible_work_stays_within_quota() -> None:
    objs = [node("a", gpus=8), queue("q", gpu=(2, 1, -1)),
            podgroup("p", "q", priority_class="build"), pod("p-0", group="p", gpus=3)]
    st, plan = plan_of(objs)
    assert not plan.placements
    assert plan.pending[st.pg_index["default/p"]][0].code == "NonPreemptibleOverQuota"


def _reclaim_objs(started_min_ago: float = 60):
    objs = [node("a", gpus=8), queue("over", gpu=(2, 1, -1), created_min=0), queue("starved", gpu=(4, 1, -1),
                                                                                    created_min=1)]
    objs += [podgroup(f"o{i}", "over", created_min=i) for i in range(4)]
    objs += [pod(f"o{i}-0", group=f"o{i}", gpus=2, node_name="a", started_min_ago=started_min_ago) for i in range(4)]
    objs += [podgroup("s", "starved", min_member=2)] + [pod(f"s-{i}", group="s", gpus=2) for i in range(2)]
    return objs


def test_reclaim_evicts_from_the_queue_over_its_share_and_pipelines_the_reclaimer() -> None:
    st, plan = plan_of(_reclaim_objs())
    assert set(evicted(st, plan).values()) == {"reclaim"}
    assert len(plan.evictions) == 2
    assert {st.pods[p.pod].name for p in plan.pipelines} == {"s-0", "s-1"}
    assert all(e.beneficiary == st.pg_index["default/s"] for e in plan.evictions)


def test_a_victim_search_gives_up_after_max_victim_chunks() -> None:
    # the reclaimer needs two 2-GPU victims; a search allowed one chunk gives up and says so
    st, plan = plan_of(_reclaim_objs(), parse_config({"max_victim_chunks": 1, "actions": {"consolidate": False}}))
    assert not plan.evictions
    [reason] = [r for r in plan.pending[st.pg_index["default/s"]] if r.code == "ReclaimNotPossible"]
    assert "gave up after 1 victim chunks (max_victim_chunks)" in reason.message
    st, plan = plan_of(_reclaim_objs(), parse_config({"max_victim_chunks": 2}))
    assert len(plan.evictions) == 2


def test_min_runtime_protects_young_victims() -> None:
    objs = _reclaim_objs(started_min_ago=1)
    objs[1] = queue("over", gpu=(2, 1, -1), reclaimMinRuntime="10m")
    _, plan = plan_of(objs)
    assert not plan.evictions


def test_preempt_within_a_queue_by_priority_only() -> None:
    objs = [node("a", gpus=4), queue("q", gpu=(4, 1, -1)),
            podgroup("low", "q", priority_class="train"), pod("low-0", group="low", gpus=4, node_name="a"),
            podgroup("hi", "q", priority_class="inference"), pod("hi-0", group="hi", gpus=4)]
    st, plan = plan_of(objs)
    assert evicted(st, plan) == {"low-0": "preempt"}
    assert {st.pods[p.pod].name for p in plan.pipelines} == {"hi-0"}
    # an equal-priority pod may not preempt
    objs[-2] = podgroup("hi", "q", priority_class="train")
    st, plan = plan_of(objs)
    assert not plan.evictions


def test_stale_gang_is_evicted_whole_after_the_grace_period() -> None:
    from builders import _ts

    ann = {"kai.scheduler/stale-podgroup-timestamp": _ts(NOW - 120)}
    objs = [node("a", gpus=8), queue("q", gpu=(8, 1, -1)),
            podgroup("g", "q", min_member=3),
            pod("g-0", group="g", gpus=1, node_name="a"), pod("g-1", group="g", gpus=1, node_name="a")]
    pg = objs[2].obj
    pg["metadata"]["annotations"] = ann
    objs[2] = RawObject("PodGroup", pg)
    st, plan = plan_of(objs)
    assert evicted(st, plan) == {"g-0": "stale-gang", "g-1": "stale-gang"}
    st, plan = plan_of(objs, parse_config({"stale_gang_grace_s": 600}))
    assert not plan.evictions


def test_gated_pods_and_other_schedulers_are_left_alone() -> None:
    objs = [node("a", gpus=8), queue("q", gpu=(8, 1, -1)),
            podgroup("g", "q"), pod("g-0", group="g", gpus=1, schedulingGates=[{"name": "wait"}]),
            pod("foreign", gpus=1, scheduler="default-scheduler")]
    _, plan = plan_of(objs)
    assert not plan.placements and not plan.evictions


def test_consolidation_moves_a_pod_so_a_whole_node_gang_fits() -> None:
    objs = [node("a", gpus=4), node("b", gpus=4), queue("q", gpu=(8, 1, -1)),
            podgroup("s1", "q"), pod("s1-0", group="s1", gpus=2, node_name="a"),
            podgroup("s2", "q"), pod("s2-0", group="s2", gpus=2, node_name="b"),
            podgroup("big", "q"), pod("big-0", group="big", gpus=4)]
    st, plan = plan_of(objs)
    assert len(plan.evictions) == 1 and plan.evictions[0].reason == "consolidate"
    moved = plan.moves[0]
    assert moved.pod == plan.evictions[0].pod and moved.node != int(st.pod_node[moved.pod])
    assert {st.pods[p.pod].name for p in plan.pipelines} == {"big-0"}


def test_elastic_group_gets_its_minimum_then_extra_pods() -> None:
    objs = [node("a", gpus=3), queue("q", gpu=(3, 1, -1)),
            podgroup("e", "q", min_member=2)] + [pod(f"e-{i}", group="e", gpus=1) for i in range(5)]
    st, plan = plan_of(objs)
    assert len(plan.binds) == 3
    assert st.pg_index["default/e"] in plan.pending  # two pods still wait


def test_unknown_queue_is_a_pending_reason_not_an_error() -> None:
    objs = [node("a", gpus=8), queue("q", gpu=(8, 1, -1)), podgroup("x", "missing"), pod("x-0", group="x", gpus=1)]
    st, plan = plan_of(objs)
    assert plan.pending[st.pg_index["default/x"]][0].code == "QueueDoesNotExist"


def test_solve_json_shape(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["solve", "models/examples/quickstart.yaml", "-o", "json", "-e", "greedy"])
    assert done.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert {"engine", "solver", "binds", "pipelines", "evictions", "pending", "summary"} <= set(data)
    assert data["engine"] == "greedy" and data["solver"]["status"] == "HEURISTIC"
    for b in data["binds"]:
        assert {"pod", "podgroup", "node", "gpu_devices"} <= set(b)


def test_solve_uses_cpsat_by_default(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["solve", "models/examples/quickstart.yaml", "-o", "json"])
    assert done.value.code == 0
    data = json.loads(capsys.readouterr().out)
    solver = data["solver"]
    assert data["engine"] == "cpsat" and solver["hint"] in ("kai", "fgd")
    assert solver["status"] in ("OPTIMAL", "FEASIBLE", "GREEDY_KEPT", "FALLBACK_GREEDY") and solver["note"]
    assert data["binds"] or data["pipelines"]


def test_solve_table_says_where_a_consolidated_pod_goes(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["solve", "models/examples/topology.yaml", "-e", "greedy"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "consolidate" in line)
    assert "moves to" in out and "gpu-10 (0,1,2,3,4,5,6,7)" in row


def test_a_cycle_is_deterministic() -> None:
    objs = _reclaim_objs()
    snap = snapshot(objs)
    for config in (GREEDY, parse_config({"engine": "cpsat", "solver": {"deterministic": True}})):
        a, _ = run_cycle(build_state(snap), config)
        b, _ = run_cycle(build_state(snap), config)
        assert a.placements == b.placements and a.evictions == b.evictions
