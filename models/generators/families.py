"""Benchmark scenario families: `(n_nodes, seed) -> list[RawObject]`, nodes of 8 x 80 GB GPUs."""

from __future__ import annotations

import numpy as np

from kai_opt.snapshot import RawObject
from models.generators import objects as ko
from models.generators.cluster import ClusterBuilder, PodShape, gang_shapes, gpu_pod
from models.generators.objects import without_gc

GANG_GPUS = (1, 2, 4, 8, 16, 32)
PRIORITIES = ("train", "build-preemptible", "build", "inference")


def _priority(rng: np.random.Generator, p: tuple[float, ...] = (0.7, 0.1, 0.15, 0.05)) -> str:
    return str(rng.choice(PRIORITIES, p=p))


def _mixed_gang(rng: np.random.Generator) -> list[PodShape]:
    """1-32 GPUs per gang, 1-8 GPUs per pod."""
    total = int(rng.choice(GANG_GPUS, p=[0.25, 0.2, 0.2, 0.15, 0.12, 0.08]))
    per = int(rng.choice([d for d in (1, 2, 4, 8) if d <= total]))
    return gang_shapes(rng, total, per)


def _fill(b: ClusterBuilder, target_gpus: float, make: object, *, policy: str | None = None,
          mask: np.ndarray | None = None, priorities: tuple[float, ...] = (1.0, 0, 0, 0), max_fail: int = 40,
          **kw: object) -> float:
    """Run gangs from `make(rng)` (priority class drawn by `priorities`) until `target_gpus` are used or
    placements failed `max_fail` times; returns the GPUs used."""
    used, fails = 0.0, 0
    while used < target_gpus and fails < max_fail:
        shapes = make(b.rng)  # type: ignore[operator]
        pol = policy or str(b.rng.choice(["pack", "random"]))
        if b.run_gang(shapes, policy=pol, mask=mask, priority_class=_priority(b.rng, priorities), **kw) is None:
            fails += 1
        else:
            used += sum(s.gpu_total for s in shapes)
    return used


def _no_limit_leaves(b: ClusterBuilder) -> list[int]:
    t = b.tree
    assert t is not None
    return [i for i in range(len(t.leaves)) if all(t.limit[q] < 0 for q in t.chain(int(t.leaves[i])))]


@without_gc
def gangs(n_nodes: int, seed: int) -> list[RawObject]:
    """Gangs of 1-32 GPUs (1-8 per pod) running at 70-85% GPU use; pending gangs ask for 30-50% more."""
    rng = np.random.default_rng(seed)
    b = ClusterBuilder(rng)
    b.add_nodes(n_nodes)
    b.add_queues()
    _fill(b, b.total_gpus * rng.uniform(0.7, 0.85), _mixed_gang, priorities=(0.8, 0.05, 0.1, 0.05))
    demand, want = 0.0, b.total_gpus * rng.uniform(0.3, 0.5)
    while demand < want:
        shapes = _mixed_gang(rng)
        elastic = len(shapes) > 1 and rng.random() < 0.2
        b.pend_gang(shapes, priority_class=_priority(rng),
                    min_member=max(1, len(shapes) // 2) if elastic else None)
        demand += sum(s.gpu_total for s in shapes)
    return b.objects


@without_gc
def fragmentation(n_nodes: int, seed: int) -> list[RawObject]:
    """Adversarial packing: 3-free/4-free GPU gaps for 2- and 3-GPU pods, 1-free gaps, CPU-heavy pods that
    strand GPUs. Everything pending fits in one exact packing; greedy orders leave some of it pending."""
    rng = np.random.default_rng(seed)
    b = ClusterBuilder(rng)
    n = max(n_nodes, 10)
    sizes = np.maximum(1, np.floor(rng.dirichlet(np.array([0.3, 0.3, 0.1, 0.15, 0.15]) * 80) * n)).astype(int)
    sizes[0] += n - int(sizes.sum())  # gap3 / gap4 / gap1 / cpu-used / gpu-full nodes
    a, bb, c, e, f = sizes.tolist()
    kinds = ["gap3"] * a + ["gap4"] * bb + ["gap1"] * c + ["cpu-used"] * e + ["gpu-full"] * f
    rng.shuffle(kinds)  # node names carry no hint of the trap
    cpus = {"gap3": 112, "gap4": 112, "gap1": 112, "cpu-used": 112, "gpu-full": 128}
    nodes = {k: [] for k in cpus}  # type: dict[str, list[int]]
    for i, k in enumerate(kinds):
        nodes[k].append(b.add_node(f"node-{i:05d}", cpu=cpus[k], memory_gi=1024))
    b.add_queues()

    def run_on(group: list[int], shape: PodShape, per_gang: int) -> None:
        for i in range(0, len(group), per_gang):
            chunk = group[i:i + per_gang]
            b.run_gang([shape] * len(chunk), nodes=chunk, priority_class="train")

    light = PodShape(cpu_m=8000, memory_mi=64 * 1024, gpus=8)  # a whole node's GPUs, little CPU
    run_on(nodes["gap3"], gpu_pod(rng, 4), 2)
    run_on(nodes["gap3"], PodShape(cpu_m=8000, memory_mi=96 * 1024, gpus=1), 4)
    run_on(nodes["gap4"], gpu_pod(rng, 4), 4)
    run_on(nodes["gap1"], PodShape(cpu_m=42000, memory_mi=600 * 1024, gpus=7), 1)
    run_on(nodes["cpu-used"], PodShape(cpu_m=40000, memory_mi=128 * 1024), 2)
    run_on(nodes["gpu-full"], light, 2)

    free = _no_limit_leaves(b) or list(range(len(b.tree.leaves)))  # type: ignore[union-attr]
    q = [free[int(i)] for i in rng.choice(len(free), size=3, replace=len(free) < 3)]
    # trap 1 (binpack): 2-GPU pods first take the 3-free nodes, so the 3-GPU pods lose them
    for _ in range(bb):
        b.pend_gang([PodShape(cpu_m=12000, memory_mi=128 * 1024, gpus=2)] * 2, leaf=q[0],
                    priority_class="build-preemptible")
    for _ in range(a):
        b.pend_gang([PodShape(cpu_m=18000, memory_mi=192 * 1024, gpus=3)], leaf=q[0], priority_class="train")
    # trap 2: 1-GPU pods fill 1-free gaps unless spread onto whole nodes first
    for _ in range(c):
        b.pend_gang([PodShape(cpu_m=4000, memory_mi=32 * 1024, gpus=1)], leaf=q[1], priority_class="train")
    # trap 3 (CPU): CPU-heavy pods fit both node kinds, the 8-GPU pods only where the CPU stays free
    for _ in range(f):
        b.pend_gang([PodShape(cpu_m=64000, memory_mi=256 * 1024)], leaf=q[2], priority_class="build-preemptible")
    for i in range(0, e, 2):
        k = min(2, e - i)
        b.pend_gang([PodShape(cpu_m=48000, memory_mi=512 * 1024, gpus=8)] * k, leaf=q[2], priority_class="train")
    return b.objects


FRACTIONS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9)
GPU_MEMORY_MIB = (8192, 10240, 16384, 20480, 40960)


def _share_pod(rng: np.random.Generator) -> PodShape:
    cpu, mem = int(rng.choice([1000, 2000, 4000])), int(rng.choice([8, 16, 32])) * 1024
    if rng.random() < 0.2:
        return PodShape(cpu_m=cpu, memory_mi=mem, gpu_memory_mib=int(rng.choice(GPU_MEMORY_MIB)))
    return PodShape(cpu_m=cpu, memory_mi=mem, fraction=float(rng.choice(FRACTIONS)))


def _share_group(rng: np.random.Generator) -> list[PodShape]:
    """1-4 replicas of one sharing pod template (an inference service)."""
    return [_share_pod(rng)] * int(rng.integers(1, 5))


@without_gc
def fractions(n_nodes: int, seed: int) -> list[RawObject]:
    """Fractional GPUs (gpu-fraction 0.1-0.9, some gpu-memory) shared on devices next to whole-GPU gangs."""
    rng = np.random.default_rng(seed)
    b = ClusterBuilder(rng)
    b.add_nodes(n_nodes)
    b.add_queues()
    shared = rng.random(n_nodes) < 0.5
    _fill(b, shared.sum() * 8 * rng.uniform(0.5, 0.7), _share_group, mask=shared, policy="random",
          priorities=(0.3, 0, 0, 0.7), min_member=1)
    _fill(b, (~shared).sum() * 8 * rng.uniform(0.6, 0.85), _mixed_gang, mask=~shared)
    demand, want = 0.0, b.total_gpus * rng.uniform(0.2, 0.35)
    while demand < want:
        if rng.random() < 0.6:
            shapes = _share_group(rng)
            b.pend_gang(shapes, priority_class=str(rng.choice(["inference", "train"])),
                        min_member=int(rng.integers(1, len(shapes) + 1)))
        else:
            shapes = gang_shapes(rng, int(rng.choice([1, 2, 4])), 1)
            b.pend_gang(shapes, priority_class="train")
        demand += sum(s.gpu_total for s in shapes)
    return b.objects


BLOCK_LABEL = "topology.kai-opt.io/block"
RACK_LABEL = "topology.kai-opt.io/rack"
NODES_PER_RACK, RACKS_PER_BLOCK = 8, 4
TOPOLOGY_NAME = "datacenter"


@without_gc
def topology(n_nodes: int, seed: int) -> list[RawObject]:
    """Racks of 8 nodes, blocks of 4 racks; running work fragments racks; pending gangs require or prefer a rack
    or a block (some with a leader/workers sub-group split)."""
    rng = np.random.default_rng(seed)
    b = ClusterBuilder(rng)
    racks = np.arange(n_nodes) // NODES_PER_RACK
    for i in range(n_nodes):
        r = int(racks[i])
        b.add_node(f"node-{i:05d}",
                   labels={RACK_LABEL: f"rack-{r:04d}", BLOCK_LABEL: f"block-{r // RACKS_PER_BLOCK:03d}"})
    b.add_queues()
    b.objects.append(ko.topology(TOPOLOGY_NAME, [BLOCK_LABEL, RACK_LABEL, ko.HOSTNAME_LABEL]))
    req_rack = {"topology": TOPOLOGY_NAME, "requiredTopologyLevel": RACK_LABEL}
    # running: rack-local multi-node jobs, then small jobs scattered over racks
    for r in range(int(racks.max()) + 1):
        if rng.random() < 0.5:
            k = int(rng.integers(2, 5))
            b.run_gang([gpu_pod(rng, 8)] * k, mask=racks == r, priority_class="train", topology=req_rack)
    _fill(b, b.total_gpus * rng.uniform(0.25, 0.35), lambda g: gang_shapes(g, int(g.choice([1, 2, 4])), 1),
          policy="random")
    demand, want = 0.0, b.total_gpus * rng.uniform(0.3, 0.45)
    while demand < want:
        kind = rng.choice(["rack", "block", "preferred", "subgroups"], p=[0.35, 0.15, 0.3, 0.2])
        prio = _priority(rng, (0.8, 0.1, 0.1, 0.0))
        if kind == "rack":
            shapes = [gpu_pod(rng, 8)] * int(rng.integers(2, 7))
            b.pend_gang(shapes, priority_class=prio, topology=req_rack)
        elif kind == "block":
            shapes = [gpu_pod(rng, 8)] * int(rng.integers(8, 17))
            b.pend_gang(shapes, priority_class=prio,
                        topology={"topology": TOPOLOGY_NAME, "requiredTopologyLevel": BLOCK_LABEL})
        elif kind == "preferred":
            shapes = [gpu_pod(rng, 4)] * int(rng.integers(2, 9))
            b.pend_gang(shapes, priority_class=prio, topology={"topology": TOPOLOGY_NAME,
                                                               "preferredTopologyLevel": RACK_LABEL})
        else:
            workers = int(rng.integers(2, 5))
            shapes = [PodShape(cpu_m=8000, memory_mi=64 * 1024)] + [gpu_pod(rng, 8)] * workers
            subs = [{"name": "leader", "minMember": 1},
                    {"name": "workers", "minMember": workers,
                     "topologyConstraint": {"topology": TOPOLOGY_NAME, "preferredTopologyLevel": RACK_LABEL}}]
            b.pend_gang(shapes, priority_class=prio, sub_groups=subs, subgroup_of=["leader"] + ["workers"] * workers,
                        topology={"topology": TOPOLOGY_NAME, "requiredTopologyLevel": BLOCK_LABEL})
        demand += sum(s.gpu_total for s in shapes)
    return b.objects


@without_gc
def contention(n_nodes: int, seed: int) -> list[RawObject]:
    """A full cluster held by over-quota preemptible (train) work of some queues, while other queues, under
    quota, wait with train and build gangs: reclaim is needed; some pending work preempts within its queue."""
    rng = np.random.default_rng(seed)
    b = ClusterBuilder(rng)
    b.add_nodes(n_nodes)
    tree = b.add_queues()
    n_leaves = len(tree.leaves)
    hungry = rng.random(n_leaves) < 0.35
    hungry[int(np.argmax(tree.leaf_quota))] = True
    p = np.where(hungry, 0.0, tree.leaf_quota + 1.0)
    p /= p.sum()
    used, fails = 0.0, 0
    while used < b.total_gpus * 0.97 and fails < 40:
        shapes = _mixed_gang(rng)
        gpus = sum(s.gpu_total for s in shapes)
        leaf = tree.pick(rng, gpus, p=p)
        if hungry[leaf] or b.run_gang(shapes, leaf=leaf, policy="pack", priority_class="train") is None:
            fails += 1
        else:
            used += gpus
    for leaf in np.nonzero(hungry)[0].tolist():  # under-quota queues: work up to 1.5x their quota
        want, demand = float(tree.leaf_quota[leaf]) * rng.uniform(0.5, 1.5), 0.0
        while demand < want:
            shapes = _mixed_gang(rng)
            b.pend_gang(shapes, leaf=leaf, priority_class=str(rng.choice(["train", "build"], p=[0.7, 0.3])))
            demand += sum(s.gpu_total for s in shapes)
    for leaf in rng.choice(np.nonzero(~hungry)[0], size=max(1, int((~hungry).sum()) // 4), replace=False).tolist():
        b.pend_gang(_mixed_gang(rng), leaf=leaf, priority_class="build-preemptible")  # preempts train in-queue
    return b.objects
