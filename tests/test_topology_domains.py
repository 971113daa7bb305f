"""A required-topology gang is tried domain by domain; on large trees a domain whose free resources, summed, cannot
hold the pods is not tried (gang._may_hold). The bound must be necessary: no domain it rules out could have taken
the gang."""

from __future__ import annotations

import pytest

from kai_opt.bench.instances import Instance
from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.gang import GangPlacer, _domain_mask, _may_hold
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.tasks import tasks_to_allocate
from kai_opt.state import PodStatus, build_state


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_domain_the_bound_rules_out_never_takes_the_gang(seed: int) -> None:
    # every pending required-topology gang of a topology instance, in every domain of its level: where a
    # placement attempt succeeds the bound holds (also after the cycle's own placements, the state victim
    # searches try domains in)
    state = build_state(Instance("topology", 200, seed).snapshot())
    config = Config(engine=Engine.greedy)
    fs = compute_fair_share(state)
    plan, _ = run_cycle(state, config)
    for placed_first in (False, True):
        sess = Session(state, fs, config)
        if placed_first:
            starts = state.dev_start
            sess.place_many([(pl.pod, pl.node, tuple(int(starts[pl.node]) + d for d in pl.devices), pl.pipelined)
                             for pl in plan.placements if not pl.moved])
        gangs = GangPlacer(sess, Placer(sess))
        tried = ruled_out = 0
        for g in range(state.n_groups):
            topo, level = int(state.pg_topology[g]), int(state.pg_required_level[g])
            if topo < 0 or level < 0 or not (sess.status[state.group_pods(g)] == PodStatus.PENDING).any():
                continue
            tasks = tasks_to_allocate(sess, g)
            if not tasks:
                continue
            holds = _may_hold(sess, topo, level, None, tasks)
            for d in range(len(state.topologies[topo].domain_names[level])):
                cp = sess.checkpoint()
                with gangs._quiet():
                    ok = gangs._place_in(g, tasks, _domain_mask(sess, topo, level, d, None), True,
                                         int(state.pg_preferred_level[g]), topo).ok
                sess.rollback(cp)
                tried += 1
                ruled_out += int(not holds[d])
                assert holds[d] or not ok, (state.pg_keys[g], d)
        assert tried and ruled_out  # the bound is exercised: it rules domains out


def test_the_bound_counts_whole_devices_per_node_not_only_the_gpu_sum() -> None:
    # two 2-GPU pods need two nodes with 2 free devices each (or one with 4): a domain with four nodes of one free
    # device each has 4 GPUs free in sum but cannot hold them
    from builders import node, pod, podgroup, queue
    from builders import state as make_state

    from kai_opt.snapshot import RawObject

    topo = RawObject("Topology", {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": "rack"}]}})
    objs = [topo, queue("q", gpu=(-1, 1, -1))]
    for i in range(4):
        objs += [node(f"a{i}", gpus=2, labels={"rack": "ra"}), node(f"b{i}", gpus=2, labels={"rack": "rb"})]
        objs += [podgroup(f"r{i}", "q"), pod(f"r{i}", group=f"r{i}", gpus=1, node_name=f"a{i}")]
    objs += [podgroup("g", "q", min_member=2, topologyConstraint={"topology": "t", "requiredTopologyLevel": "rack"})]
    objs += [pod(f"g-{i}", group="g", gpus=2) for i in range(2)]
    st = make_state(objs)
    sess = Session(st, compute_fair_share(st), Config(engine=Engine.greedy))
    g = st.pg_keys.index("default/g")
    holds = _may_hold(sess, 0, 0, None, tasks_to_allocate(sess, g))
    names = st.topologies[0].domain_names[0]
    assert dict(zip(names, holds.tolist(), strict=True)) == {"ra": False, "rb": True}
