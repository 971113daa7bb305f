"""Hypothesis strategies: small random clusters with queues, gangs, fractions, topology, running work."""

from __future__ import annotations

from builders import node, pod, podgroup, queue
from hypothesis import strategies as st

from kai_opt.snapshot import RawObject


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 6, max_jobs: int = 8, topology: bool = True) -> list[RawObject]:
    objs: list[RawObject] = []
    n_nodes = draw(st.integers(1, max_nodes))
    gpus = [draw(st.sampled_from([0, 1, 2, 4, 8])) for _ in range(n_nodes)]
    racks = [f"rack{i // 2}" for i in range(n_nodes)]
    for i in range(n_nodes):
        objs.append(node(f"n{i}", gpus=gpus[i], cpu=str(draw(st.sampled_from([8, 16, 64]))),
                         memory=f"{draw(st.sampled_from([32, 128, 512]))}Gi", labels={"rack": racks[i]}))
    if topology:
        objs.append(RawObject("Topology", {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": "rack"}]}}))
    n_queues = draw(st.integers(1, 3))
    objs.append(queue("dept", gpu=(draw(st.sampled_from([-1, 4, 8])), 1, -1)))
    leaf = []
    for q in range(n_queues):
        name = f"q{q}"
        leaf.append(name)
        objs.append(queue(name, parent="dept", created_min=q,
                          gpu=(draw(st.sampled_from([0, 1, 2, 4])), draw(st.sampled_from([0, 1, 2])),
                               draw(st.sampled_from([-1, -1, 3, 8]))),
                          priority=draw(st.sampled_from([None, None, 50, 150]))))
    # keep track of free whole devices per node so running pods are consistent
    free = list(gpus)
    used_cpu = [0] * n_nodes
    n_jobs = draw(st.integers(1, max_jobs))
    for j in range(n_jobs):
        q = draw(st.sampled_from(leaf))
        size = draw(st.integers(1, 4))
        frac = draw(st.sampled_from([0, 0, 0, 0.25, 0.5]))
        per = 0 if frac else draw(st.sampled_from([0, 1, 1, 2]))
        ndev = draw(st.sampled_from([1, 1, 1, 2])) if frac else 1  # gpu-fraction-num-devices
        min_member = draw(st.integers(1, size))
        pclass = draw(st.sampled_from(["train", "train", "build", "inference"]))
        spec = {}
        if topology and draw(st.integers(0, 4)) == 0:
            spec["topologyConstraint"] = {"topology": "t", draw(st.sampled_from(
                ["requiredTopologyLevel", "preferredTopologyLevel"])): "rack"}
        objs.append(podgroup(f"j{j}", q, min_member=min_member, priority_class=pclass, created_min=j, **spec))
        running = draw(st.booleans())
        for k in range(size):
            placed_on = None
            if running:
                need = ndev if frac else per
                cands = [i for i in range(n_nodes) if free[i] >= need and used_cpu[i] < 6]
                if cands:
                    placed_on = draw(st.sampled_from(cands))
                    free[placed_on] -= need
                    used_cpu[placed_on] += 1
            deleting = placed_on is not None and draw(st.integers(0, 9)) == 0
            objs.append(pod(f"j{j}-{k}", group=f"j{j}", gpus=frac or per, cpu="1", memory="1Gi",
                            node_name=f"n{placed_on}" if placed_on is not None else None, deleting=deleting,
                            started_min_ago=draw(st.sampled_from([1, 60, 600])),
                            annotations={"gpu-fraction-num-devices": str(ndev)} if ndev > 1 else None))
    return objs
