"""KAI-Scheduler's rules for gpu-memory requests, in both engines and the checker: a gpu-memory pod goes only onto a
node with a GPU-memory label (nvidia.com/gpu.memory), and only onto devices with at least the requested memory;
otherwise it stays pending with a reason that says so, and a warning names it."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, pod, podgroup, queue, snapshot

from kai_opt.checker import PlanViolation, check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.fairshare.share import compute_fair_share
from kai_opt.formulation.solve import model_scope
from kai_opt.plan import Placement, Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import ClusterState, build_state

GREEDY = parse_config({"engine": "greedy"})
CPSAT = parse_config({"engine": "cpsat", "solver": {"deterministic": True, "time_budget_s": 2, "seed": 0}})
ENGINES = [pytest.param(GREEDY, id="greedy"), pytest.param(CPSAT, id="cpsat")]


def unlabelled(name: str, gpus: int = 8) -> RawObject:
    """A GPU node without the GPU-memory label."""
    n = node(name, gpus=gpus)
    del n.obj["metadata"]["labels"]["nvidia.com/gpu.memory"]
    return n


def mem_pod(name: str, mib: int, **kw: Any) -> RawObject:
    return pod(name, name, annotations={"gpu-memory": str(mib)}, **kw)


def cluster(nodes: list[RawObject], *pods: tuple[str, int]) -> ClusterState:
    objs: list[RawObject] = [*nodes, queue("q", gpu=(16, 1, -1))]
    for name, mib in pods:
        objs += [podgroup(name, "q"), mem_pod(name, mib)]
    return build_state(snapshot(objs))


def placed_on(st: ClusterState, config: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(pod -> node of the cycle's placements, podgroup -> its pending reasons' messages)."""
    plan, _ = run_cycle(st, config)
    where = {st.pods[pl.pod].meta.name: st.node_names[pl.node] for pl in plan.placements}
    data = plan.to_dict(st)
    why = {p["podgroup"].split("/", 1)[1]: " ".join(r["message"] for r in p["reasons"]) for p in data["pending"]}
    return where, why


@pytest.mark.parametrize("config", ENGINES)
def test_no_gpu_memory_label_stays_pending(config: Any) -> None:
    st = cluster([unlabelled("plain")], ("infer", 20000))
    where, why = placed_on(st, config)
    assert where == {}
    assert "no GPU memory label (nvidia.com/gpu.memory)" in why["infer"], why
    assert any("default/infer" in w and "nvidia.com/gpu.memory" in w for w in st.warnings), st.warnings


@pytest.mark.parametrize("config", ENGINES)
def test_labelled_node_is_chosen_over_an_unlabelled_one(config: Any) -> None:
    # by name the unlabelled node would come first (both empty, equal bin-packing score)
    st = cluster([unlabelled("a-plain"), node("b-labelled", gpu_memory_mib=40960)], ("infer", 20000))
    where, _ = placed_on(st, config)
    assert where == {"infer": "b-labelled"}
    assert not any("infer" in w for w in st.warnings), st.warnings


@pytest.mark.parametrize("config", ENGINES)
def test_more_than_one_device_stays_pending(config: Any) -> None:
    st = cluster([node("small", gpu_memory_mib=40960)], ("big", 50000), ("exact", 40960))
    where, why = placed_on(st, config)
    assert where == {"exact": "small"}  # a request of exactly one device's memory fits
    assert "less GPU memory per device than the requested 50000 MiB" in why["big"], why
    assert any("default/big" in w and "50000 MiB" in w and "40960" in w for w in st.warnings), st.warnings
    assert not any("exact" in w for w in st.warnings)


@pytest.mark.parametrize("config", ENGINES)
def test_more_than_a_small_device_goes_to_a_large_one(config: Any) -> None:
    st = cluster([node("a-small", gpu_memory_mib=40960), node("b-large", gpu_memory_mib=81920)], ("big", 50000))
    where, _ = placed_on(st, config)
    assert where == {"big": "b-large"}
    assert not any("big" in w for w in st.warnings)


def test_warnings_are_bounded() -> None:
    st = cluster([unlabelled("plain")], *((f"p{i}", 1000) for i in range(30)))
    named = [w for w in st.warnings if w.startswith("Pod ")]
    assert len(named) == 20 and any(w.startswith("10 more gpu-memory pods") for w in st.warnings), st.warnings


def test_checker_rejects_such_placements() -> None:
    st = cluster([unlabelled("plain"), node("small", gpu_memory_mib=40960)], ("infer", 20000), ("big", 50000))
    pods = {p.meta.name: i for i, p in enumerate(st.pods)}
    nodes = {n: i for i, n in enumerate(st.node_names)}
    fs = compute_fair_share(st)
    for name, where, needle in (("infer", "plain", "without a GPU-memory label"),
                                ("big", "small", "more than one device's 40960 MiB")):
        plan = Plan("test", placements=[Placement(pods[name], nodes[where], (0,))])
        with pytest.raises(PlanViolation) as err:
            check_plan(st, plan, fs, GREEDY)
        assert any(needle in p and name in p for p in err.value.problems), err.value.problems
    check_plan(st, Plan("test", placements=[Placement(pods["infer"], nodes["small"], (0,))]), fs, GREEDY)


def test_cpsat_scope_offers_no_such_node() -> None:
    """The model's candidate nodes for a gpu-memory pod leave out unlabelled and too-small nodes, also where
    evictions make room (the victims below sit on every node)."""
    objs: list[RawObject] = [unlabelled("a-plain"), node("b-small", gpu_memory_mib=40960),
                             node("c-large", gpu_memory_mib=81920), queue("q", gpu=(24, 1, -1))]
    for n in ("a-plain", "b-small", "c-large"):
        objs += [podgroup(f"train-{n}", "q"), pod(f"train-{n}", f"train-{n}", gpus=8, node_name=n)]
    objs += [podgroup("whole", "q", priority_class="build"), pod("whole", "whole", gpus=8)]
    objs += [podgroup("big", "q", priority_class="build"), mem_pod("big", 50000)]
    st = build_state(snapshot(objs))
    greedy, fs = run_cycle(st, CPSAT, engine=Engine.greedy)
    assert greedy.evictions  # the build pods preempt train pods
    _, scope = model_scope(st, fs, CPSAT, greedy)
    pools = [pool for pool in scope.pools if st.pod_gpu_mem[pool.pod]]
    assert pools
    for pool in pools:
        assert {st.node_names[n] for n in pool.nodes.tolist()} <= {"c-large"}, pool.nodes
    plan, _ = run_cycle(st, CPSAT)
    assert all(st.node_names[pl.node] == "c-large" for pl in plan.placements if st.pod_gpu_mem[pl.pod])
