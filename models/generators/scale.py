"""`scale`: the large instance (10,000 nodes x 8 GPUs, 100,000 running pods, 10,000 pending pods in gangs),
generated with numpy: every node draws a layout of running GPU pods (exact devices), CPU-only pods fill the
running-pod count, pods of one kind on neighbouring nodes form gangs."""

from __future__ import annotations

import numpy as np

from kai_opt.snapshot import RawObject
from models.generators import objects as ko
from models.generators.queues import QueueTree, queue_tree, shape_for

RACK_LABEL = "topology.kai-opt.io/rack"
BLOCK_LABEL = "topology.kai-opt.io/block"

# node layouts of running GPU pods: (probability, slots); a slot is (whole GPUs | -milli-GPU share, devices)
LAYOUTS: tuple[tuple[float, tuple[tuple[int, tuple[int, ...]], ...]], ...] = (
    (0.14, ((8, (0, 1, 2, 3, 4, 5, 6, 7)),)),
    (0.12, ((4, (0, 1, 2, 3)), (4, (4, 5, 6, 7)))),
    (0.08, ((4, (0, 1, 2, 3)), (2, (4, 5)), (2, (6, 7)))),
    (0.08, ((2, (0, 1)), (2, (2, 3)), (2, (4, 5)), (2, (6, 7)))),
    (0.08, ((4, (0, 1, 2, 3)), (1, (4,)), (1, (5,)), (1, (6,)), (1, (7,)))),
    (0.10, tuple((1, (d,)) for d in range(8))),
    (0.06, ((2, (0, 1)), (2, (2, 3)), (1, (4,)), (1, (5,)), (1, (6,)), (1, (7,)))),
    (0.06, ((-500, (0,)), (-500, (0,)), (-250, (1,)), (-250, (1,)), (-250, (1,)), (-250, (1,)),
            *((1, (d,)) for d in range(2, 8)))),
    (0.04, ((-300, (0,)), (-300, (0,)), (-300, (0,)), (-700, (1,)), (2, (2, 3)), (4, (4, 5, 6, 7)))),
    (0.07, ((4, (0, 1, 2, 3)),)),
    (0.06, ((4, (0, 1, 2, 3)), (1, (4,)))),
    (0.06, ((4, (0, 1, 2, 3)), (2, (4, 5)), (1, (6,)))),
    (0.03, ((-500, (0,)), (2, (1, 2)))),
    (0.02, ()),
)
# pods per gang by pod kind (8, 4, 2, 1 GPUs, shares, CPU-only): choices and probabilities
GANG_SIZES = {8: ((1, 2, 4, 8, 16), (0.3, 0.3, 0.2, 0.15, 0.05)), 4: ((1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1)),
              2: ((1, 2, 4), (0.5, 0.3, 0.2)), 1: ((1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1)),
              0: ((1, 2, 4), (0.5, 0.3, 0.2)), -1: ((1, 2, 4), (0.6, 0.3, 0.1))}
PRIORITY_NAMES = np.array(["train", "build-preemptible", "build", "inference"])


def _layout_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(probabilities, slot offsets per layout, slot amount, slot device-string id, device strings)."""
    probs = np.array([p for p, _ in LAYOUTS])
    offsets = np.zeros(len(LAYOUTS) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for _, s in LAYOUTS])
    amount, dev_id, strings = [], [], {}  # type: list[int], list[int], dict[str, int]
    for _, slots in LAYOUTS:
        for a, devs in slots:
            amount.append(a)
            dev_id.append(strings.setdefault(",".join(map(str, devs)), len(strings)))
    return probs / probs.sum(), offsets, np.array(amount, dtype=np.int64), np.array(dev_id), list(strings)


def _gangs(rng: np.random.Generator, kind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut pods (already sorted so that equal kinds are adjacent) into gangs of one kind.
    Returns gang id per pod (0..G-1, in pod order) and the kind of each gang."""
    gang = np.zeros(len(kind), dtype=np.int64)
    gang_kind: list[np.ndarray] = []
    base = 0
    bounds = np.flatnonzero(np.r_[True, kind[1:] != kind[:-1], True])
    for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        k = int(kind[s])
        sizes, p = GANG_SIZES[k]
        draw = rng.choice(sizes, size=e - s, p=p)
        ends = np.cumsum(draw)
        n_g = int(np.searchsorted(ends, e - s - 1, side="right")) + 1
        gang[s:e] = base + np.searchsorted(ends, np.arange(e - s), side="right")
        gang_kind.append(np.full(n_g, k))
        base += n_g
    return gang, np.concatenate(gang_kind) if gang_kind else np.zeros(0, dtype=np.int64)


@ko.without_gc
def scale(n_nodes: int = 10_000, running_pods: int = 100_000, pending_pods: int = 10_000, seed: int = 0,
          n_queues: int = 1_000) -> list[RawObject]:
    """n_nodes x 8 GPUs (80 GB), running_pods running in gangs (devices exact), pending_pods pending in gangs,
    a 4-level queue tree of about n_queues queues (up to ~10,000)."""
    rng = np.random.default_rng(seed)
    N = n_nodes
    objs: list[RawObject] = []

    # -- nodes: 8 GPUs, 96-128 cores, 1-2 TiB; racks of 8 nodes, blocks of 4 racks -------------------------------
    node_cpu = rng.choice([96, 112, 128], size=N)
    node_mem = rng.choice([1024, 1536, 2048], size=N)
    names = [f"node-{i:05d}" for i in range(N)]
    for i, (c, m) in enumerate(zip(node_cpu.tolist(), node_mem.tolist(), strict=True)):
        objs.append(ko.node(names[i], gpus=8, cpu=c, memory_gi=m,
                            labels={RACK_LABEL: f"rack-{i // 8:04d}", BLOCK_LABEL: f"block-{i // 32:03d}"}))
    objs.append(ko.topology("datacenter", [BLOCK_LABEL, RACK_LABEL, ko.HOSTNAME_LABEL]))
    objs.extend(ko.priority_classes())
    tree = queue_tree(rng, 8 * N, shape=shape_for(n_queues))
    L = len(tree.leaves)

    # -- running GPU pods: one layout per node ---------------------------------------------------------------------
    probs, offsets, amount, dev_id, dev_str = _layout_table()
    layout = rng.choice(len(probs), size=N, p=probs)
    counts = offsets[layout + 1] - offsets[layout]
    slot_node = np.repeat(np.arange(N), counts)
    local = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    slot = offsets[layout][slot_node] + local
    if len(slot) > running_pods:  # fewer running pods than the layouts hold: keep a random subset
        keep = np.sort(rng.choice(len(slot), size=running_pods, replace=False))
        slot_node, slot = slot_node[keep], slot[keep]
    g_amt = amount[slot]
    whole = np.maximum(g_amt, 0)
    share = np.maximum(-g_amt, 0)
    gpu_cpu = np.where(whole > 0, whole * rng.choice([4000, 6000, 8000], size=len(slot)), 2000)
    gpu_mem = np.where(whole > 0, whole * rng.choice([48, 64, 96], size=len(slot)) * 1024, 16 * 1024)

    # -- CPU-only pods fill the running count, spread evenly; sized to what their node has left ------------------
    n_cpu = max(0, running_pods - len(slot))
    per_node = np.full(N, n_cpu // N)
    per_node[rng.permutation(N)[: n_cpu % N]] += 1
    cpu_node = np.repeat(np.arange(N), per_node)
    used_cpu = np.bincount(slot_node, weights=gpu_cpu, minlength=N)
    used_mem = np.bincount(slot_node, weights=gpu_mem, minlength=N)
    room_cpu = ((node_cpu * 1000 - used_cpu) // np.maximum(per_node, 1) // 100 * 100).astype(np.int64)
    room_mem = ((node_mem * 1024 - used_mem) // np.maximum(per_node, 1)).astype(np.int64)
    c_cpu = np.minimum(rng.choice([500, 1000, 2000], size=n_cpu), room_cpu[cpu_node])
    c_mem = np.minimum(rng.choice([2, 4, 8], size=n_cpu) * 1024, room_mem[cpu_node])

    # all running pods: kind (8/4/2/1 whole GPUs, -1 share, 0 CPU-only), node, devices, cpu, memory
    r_kind = np.concatenate([np.where(share > 0, -1, whole), np.zeros(n_cpu, dtype=np.int64)])
    r_node = np.concatenate([slot_node, cpu_node])
    r_share = np.concatenate([share, np.zeros(n_cpu, dtype=np.int64)])
    r_dev = np.concatenate([dev_id[slot], np.full(n_cpu, -1)])
    r_cpu = np.concatenate([gpu_cpu, c_cpu]).astype(np.int64)
    r_mem = np.concatenate([gpu_mem, c_mem]).astype(np.int64)
    order = np.lexsort((r_node, -r_kind))
    r_kind, r_node, r_share, r_dev, r_cpu, r_mem = (a[order] for a in (r_kind, r_node, r_share, r_dev, r_cpu, r_mem))
    r_gang, r_gang_kind = _gangs(rng, r_kind)
    n_run_gangs = len(r_gang_kind)

    # -- pending pods in gangs ---------------------------------------------------------------------------------------
    p_kinds = np.array([8, 4, 2, 1, -1, 0])
    p_kind_probs = np.array([0.25, 0.15, 0.15, 0.25, 0.12, 0.08])
    n_est = max(1, pending_pods)
    g_kind = p_kinds[rng.choice(len(p_kinds), size=n_est, p=p_kind_probs)]
    g_size = rng.choice([1, 2, 4, 8, 16, 32], size=n_est, p=[0.3, 0.2, 0.2, 0.15, 0.1, 0.05])
    ends = np.cumsum(g_size)
    n_pend_gangs = int(np.searchsorted(ends, pending_pods - 1, side="right")) + 1 if pending_pods else 0
    g_kind, g_size = g_kind[:n_pend_gangs], g_size[:n_pend_gangs].copy()
    if n_pend_gangs:
        g_size[-1] -= int(ends[n_pend_gangs - 1]) - pending_pods
    p_gang = np.repeat(np.arange(n_pend_gangs), g_size)
    p_kind = g_kind[p_gang] if n_pend_gangs else np.zeros(0, dtype=np.int64)
    p_share = np.where(p_kind == -1, rng.choice([100, 250, 300, 500, 750], size=len(p_kind)), 0)
    p_whole = np.maximum(p_kind, 0)
    p_cpu = np.where(p_whole > 0, p_whole * 6000, np.where(p_kind == -1, 2000, 4000))
    p_mem = np.where(p_whole > 0, p_whole * 64, 16) * 1024

    # -- gangs: queue, priority, age, minMember --------------------------------------------------------------------
    G = n_run_gangs + n_pend_gangs
    gang_leaf = rng.choice(L, size=G, p=tree.weights())
    gang_prio = rng.choice(4, size=G, p=[0.7, 0.05, 0.15, 0.1])
    run_age = (rng.uniform(3600, 7 * 86400, size=n_run_gangs) // 60 * 60)
    pend_age = (rng.uniform(60, 7200, size=n_pend_gangs) // 60 * 60)
    gang_created = ko.NOW - np.concatenate([run_age, pend_age])
    run_gpus = np.bincount(r_gang, weights=np.where(r_kind > 0, r_kind, 0) + r_share / 1000.0,
                           minlength=n_run_gangs)
    _raise_limits(rng, tree, gang_leaf[:n_run_gangs], run_gpus)
    objs.extend(tree.objects)

    run_sizes = np.bincount(r_gang, minlength=n_run_gangs)
    elastic = (np.concatenate([r_gang_kind, g_kind]) == -1) | (rng.random(G) < 0.1)
    sizes = np.concatenate([run_sizes, g_size])
    min_member = np.where(elastic, np.maximum(1, sizes // 2), sizes)
    rack_req = np.zeros(G, dtype=bool)
    rack_req[n_run_gangs:] = (g_kind == 8) & (g_size <= 8) & (rng.random(n_pend_gangs) < 0.3)
    gang_names = [f"run-{g:06d}" for g in range(n_run_gangs)] + [f"pend-{g:06d}" for g in range(n_pend_gangs)]
    leaf_ns = tree.namespace
    leaf_name = [tree.names[int(q)] for q in tree.leaves]
    prio_names = PRIORITY_NAMES[gang_prio].tolist()
    leaves_l = gang_leaf.tolist()
    created_l = gang_created.tolist()
    req_rack = {"topology": "datacenter", "requiredTopologyLevel": RACK_LABEL}
    for g, (leaf, mm, rr) in enumerate(zip(gang_leaf.tolist(), min_member.tolist(), rack_req.tolist(),
                                           strict=True)):
        objs.append(ko.podgroup(gang_names[g], leaf_ns[leaf], leaf_name[leaf], min_member=mm,
                                priority_class=prio_names[g], created=created_l[g],
                                topology=dict(req_rack) if rr else None))

    # -- pod objects ------------------------------------------------------------------------------------------------
    def emit(gang: np.ndarray, kind: np.ndarray, share_m: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
             node: np.ndarray | None, dev: np.ndarray | None, gang_offset: int) -> None:
        first = np.r_[True, gang[1:] != gang[:-1]]
        idx_in_gang = np.arange(len(gang)) - np.maximum.accumulate(np.where(first, np.arange(len(gang)), 0))
        cols = [gang.tolist(), idx_in_gang.tolist(), kind.tolist(), share_m.tolist(), cpu.tolist(), mem.tolist()]
        nodes = node.tolist() if node is not None else [None] * len(gang)
        devs = dev.tolist() if dev is not None else [-1] * len(gang)
        for g0, i, k, sm, c, m, n, d in zip(*cols, nodes, devs, strict=True):
            g = g0 + gang_offset
            leaf = leaves_l[g]
            created = created_l[g]
            objs.append(ko.pod(
                f"{gang_names[g]}-{i}", leaf_ns[leaf], gang_names[g], leaf_name[leaf], cpu_m=c, memory_mi=m,
                priority_class=prio_names[g], created=created, gpus=k if k > 0 else 0,
                fraction=sm / 1000 if sm else None, node_name=names[n] if n is not None else None,
                devices=dev_str[d] if d >= 0 else None, started=created + 30 if n is not None else None))

    emit(r_gang, r_kind, r_share, r_cpu, r_mem, r_node, r_dev, 0)
    emit(p_gang, p_kind, p_share, p_cpu, p_mem, None, None, n_run_gangs)
    return objs


def _raise_limits(rng: np.random.Generator, tree: QueueTree, run_leaf: np.ndarray, run_gpus: np.ndarray) -> None:
    """Where the generated running work exceeds a queue's GPU limit, lift the limit to 110-150% of that usage."""
    leaf_used = np.zeros(len(tree.names))
    np.add.at(leaf_used, tree.leaves[run_leaf], run_gpus)
    used = _rollup(tree.parent, leaf_used)
    over = np.nonzero((tree.limit >= 0) & (used > tree.limit))[0]
    for q, f in zip(over.tolist(), rng.uniform(1.1, 1.5, size=len(over)).tolist(), strict=True):
        tree.limit[q] = float(np.ceil(used[q] * f))
        tree.objects[q].obj["spec"]["resources"]["gpu"]["limit"] = tree.limit[q]
    tree.used[:] = used


def _rollup(parent: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Usage of every queue: its own plus all its descendants' (one tree level per step)."""
    total, cur = own.copy(), own.copy()
    has = parent >= 0
    while cur[has].any():
        nxt = np.zeros_like(cur)
        np.add.at(nxt, parent[has], cur[has])
        total += nxt
        cur = nxt
    return total
