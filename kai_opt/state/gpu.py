"""GPU devices held by bound pods: which device each pod sits on, and how much of each device is used.

Devices are known from kai-opt's annotation when present; otherwise, as KAI-Scheduler does, fractional pods with
the same GPU group on a node share one device, a fractional pod without a group gets a fresh device, and
whole-GPU pods take the lowest free devices.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ExplicitDevices:
    """Each pod's annotated device indexes within its node, as CSR: pod p has devices dev[start[p]:start[p+1]]
    when has[p]. Read as a mapping pod -> tuple by the per-node path."""

    has: np.ndarray  # bool[P]
    start: np.ndarray  # int64[P+1]
    dev: np.ndarray  # int64

    def __post_init__(self) -> None:
        self.any = bool(self.has.any())

    def __bool__(self) -> bool:
        return self.any

    def __contains__(self, p: int) -> bool:
        return bool(self.has[p])

    def __getitem__(self, p: int) -> tuple[int, ...]:
        return tuple(self.dev[self.start[p]:self.start[p + 1]].tolist())

    def count(self, pods: np.ndarray) -> np.ndarray:
        return self.start[pods + 1] - self.start[pods]

    def of(self, pods: np.ndarray) -> np.ndarray:
        """The devices of `pods`, concatenated in their order."""
        lens = self.count(pods)
        at = np.cumsum(lens) - lens
        return self.dev[np.repeat(self.start[pods] - at, lens) + np.arange(int(lens.sum()))]


def assign_devices(
    *,
    dev_start: np.ndarray,
    node_gpu_mem_mib: np.ndarray,
    holders: np.ndarray,  # int64[H] pods holding resources (bound or releasing)
    pod_node: np.ndarray,
    releasing: np.ndarray,  # bool[P]
    whole: np.ndarray,  # int32[P]
    frac: np.ndarray,  # int32[P] milli per device
    mem: np.ndarray,  # int64[P] MiB per device
    ndev: np.ndarray,  # int32[P]
    explicit: ExplicitDevices,  # pod -> device indexes within its node (annotation)
    groups: dict[int, str],  # pod -> GPU group label
    n_pods: int,
    pod_name: Callable[[int], str] = str,
    node_name: Callable[[int], str] = str,
    pipelined: np.ndarray | None = None,  # bool[P]: nominated pods, which claim devices still being released
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Returns dev_used (bound + releasing pods), dev_releasing, dev_pipelined, pod_dev_start (int64[P+1]),
    pod_dev, warnings."""
    n_dev = int(dev_start[-1])
    a = _Assign(dev_start, node_gpu_mem_mib, pod_node, releasing, whole, frac, mem, ndev, explicit, groups,
                pipelined if pipelined is not None else np.zeros(n_pods, dtype=bool), pod_name, node_name,
                np.zeros(n_dev, dtype=np.int64), np.zeros(n_dev, dtype=np.int64), np.zeros(n_dev, dtype=np.int64))
    gpu_holders = holders[(whole[holders] > 0) | (frac[holders] > 0) | (mem[holders] > 0)]
    if len(gpu_holders) == 0:
        return (a.dev_used, a.dev_rel, a.dev_pipe, np.zeros(n_pods + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                a.warnings)
    fast = _fast_path(a, gpu_holders)
    rest = gpu_holders[~fast]
    ex_pods, ex_devs = _explicit_now(rest, explicit, a.piped, dev_start, pod_node)
    if len(ex_pods):
        counts_ex = _apply_explicit_now(a, ex_pods, ex_devs)
        done = np.zeros(n_pods, dtype=bool)
        done[ex_pods] = True
        rest = rest[~done[rest]]
    else:
        counts_ex = np.zeros(0, dtype=np.int64)
    # careful path: nodes with explicit devices or shared GPUs
    by_node: dict[int, list[int]] = defaultdict(list)
    for p in rest.tolist():
        by_node[int(pod_node[p])].append(p)
    for n, pods in by_node.items():
        _careful_node(a, n, pods)
    pod_dev_start, pod_dev = _devices_per_pod(a.per_pod, ex_pods, counts_ex, ex_devs, n_pods)
    return a.dev_used, a.dev_rel, a.dev_pipe, pod_dev_start, pod_dev, a.warnings


@dataclass
class _Assign:
    """The inputs of assign_devices, and what its steps fill: device usage, each pod's devices (but those of
    _apply_explicit_now) and warnings."""

    dev_start: np.ndarray
    node_gpu_mem_mib: np.ndarray
    pod_node: np.ndarray
    releasing: np.ndarray
    whole: np.ndarray
    frac: np.ndarray
    mem: np.ndarray
    ndev: np.ndarray
    explicit: ExplicitDevices
    groups: dict[int, str]
    piped: np.ndarray
    pod_name: Callable[[int], str]
    node_name: Callable[[int], str]
    dev_used: np.ndarray
    dev_rel: np.ndarray
    dev_pipe: np.ndarray
    per_pod: dict[int, list[int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _fast_path(a: _Assign, gpu_holders: np.ndarray) -> np.ndarray:
    """Nodes with only whole-GPU pods of unknown devices: consecutive devices in pod order, in bulk. Returns
    which of gpu_holders it placed."""
    whole, explicit, pod_node, dev_start, per_pod = a.whole, a.explicit, a.pod_node, a.dev_start, a.per_pod
    nodes_of = pod_node[gpu_holders]
    simple_whole = (whole[gpu_holders] > 0) & ~explicit.has[gpu_holders]
    complex_nodes = np.zeros(len(dev_start) - 1, dtype=bool)
    complex_nodes[nodes_of[~simple_whole | a.piped[gpu_holders]]] = True
    fast = simple_whole & ~complex_nodes[nodes_of]
    fp = gpu_holders[fast]
    if len(fp):
        order = np.argsort(pod_node[fp], kind="stable")
        fp = fp[order]
        fn = pod_node[fp]
        k = whole[fp].astype(np.int64)
        cs = np.cumsum(k)
        first_of_run = np.ones(len(fp), dtype=bool)
        first_of_run[1:] = fn[1:] != fn[:-1]
        run_base = np.maximum.accumulate(np.where(first_of_run, cs - k, 0))
        offset = cs - k - run_base
        capacity = dev_start[fn + 1] - dev_start[fn]
        for p, n, o, kk, cap in zip(fp.tolist(), fn.tolist(), offset.tolist(), k.tolist(), capacity.tolist(),
                                    strict=True):
            take = min(kk, max(0, cap - o))
            if take < kk:
                a.warnings.append(f"Node {a.node_name(n)}: pods hold more GPUs than the node has")
            per_pod[p] = [int(dev_start[n]) + o + i for i in range(take)]
        all_devs = np.fromiter((d for p in fp.tolist() for d in per_pod[p]), dtype=np.int64)
        np.add.at(a.dev_used, all_devs, 1000)
        releasing = a.releasing
        rel_devs = np.fromiter((d for p in fp.tolist() if releasing[p] for d in per_pod[p]), dtype=np.int64)
        if len(rel_devs):
            np.add.at(a.dev_rel, rel_devs, 1000)
    return fast


def _apply_explicit_now(a: _Assign, ex_pods: np.ndarray, ex_devs: np.ndarray) -> np.ndarray:
    """Explicit devices of pods holding them now (not pipelined): they come first on their node and do not
    depend on anything else there, so they are applied at once (when a device index is out of range,
    _explicit_now gives none, and the careful path reports it in node order). Returns each pod's device count."""
    counts_ex = a.explicit.count(ex_pods)
    amount = _per_device(ex_pods, a.frac, a.mem, a.node_gpu_mem_mib[a.pod_node[ex_pods]])
    np.add.at(a.dev_used, ex_devs, np.repeat(amount, counts_ex))
    rel_mask = np.repeat(a.releasing[ex_pods], counts_ex)
    if rel_mask.any():
        np.add.at(a.dev_rel, ex_devs[rel_mask], np.repeat(amount, counts_ex)[rel_mask])
    return counts_ex


def _careful_node(a: _Assign, n: int, pods: list[int]) -> None:
    """The devices of the pods on node n, one by one as KAI does: pods holding devices now first, then pipelined
    pods (they claim devices being released); in each, explicit devices, shared GPUs by group, whole GPUs, then
    shares without a group."""
    frac, mem, whole, ndev, node_gpu_mem_mib = a.frac, a.mem, a.whole, a.ndev, a.node_gpu_mem_mib
    piped, releasing, explicit, groups = a.piped, a.releasing, a.explicit, a.groups
    dev_used, dev_rel, dev_pipe, per_pod, warnings, pod_name = a.dev_used, a.dev_rel, a.dev_pipe, a.per_pod, \
        a.warnings, a.pod_name
    base, count = int(a.dev_start[n]), int(a.dev_start[n + 1] - a.dev_start[n])

    def per_device(p: int, n: int = n) -> int:
        if frac[p]:
            return int(frac[p])
        if mem[p]:
            return min(1000, -(-int(mem[p]) * 1000 // max(1, int(node_gpu_mem_mib[n]))))
        return 1000

    def put(p: int, d: int, amount: int) -> None:
        if piped[p]:
            dev_pipe[d] += amount
        else:
            dev_used[d] += amount
            if releasing[p]:
                dev_rel[d] += amount
        per_pod.setdefault(p, []).append(d)

    group_dev: dict[str, int] = {}
    def occupied(sl: slice, pipelined_pass: bool) -> np.ndarray:
        # pods holding devices now (bound and releasing) see what is held now; pipelined pods see what
        # stays held once releases finish plus the other pipelined claims
        if pipelined_pass:
            return dev_used[sl] - dev_rel[sl] + dev_pipe[sl]
        return dev_used[sl] + dev_pipe[sl]

    for pipelined_pass in (False, True):
        batch = [p for p in pods if bool(piped[p]) == pipelined_pass]
        sl = slice(base, base + count)
        # 1) explicit devices
        for p in batch:
            if p in explicit:
                amount = per_device(p)
                for local in explicit[p]:
                    if 0 <= local < count:
                        put(p, base + local, amount)
                    else:
                        warnings.append(f"Pod {pod_name(p)}: GPU device {local} does not exist on its node")
        # 2) shared GPUs by group (a group already on a device from the first pass keeps it)
        for p in batch:
            if p in explicit or whole[p] or p not in groups:
                continue
            g = groups[p]
            if g in group_dev:
                put(p, group_dev[g], per_device(p))
                continue
            d = _pick_shared(occupied(sl, pipelined_pass), per_device(p), fresh_first=True)
            if d is None:
                warnings.append(f"Pod {pod_name(p)}: no GPU device left for its share")
                continue
            group_dev[g] = base + d
            put(p, base + d, per_device(p))
        # 3) whole GPUs: lowest free devices
        for p in batch:
            if p in explicit or not whole[p]:
                continue
            free = np.nonzero(occupied(sl, pipelined_pass) == 0)[0][: int(whole[p])]
            if len(free) < whole[p]:
                warnings.append(f"Node {a.node_name(n)}: pods hold more GPUs than the node has")
            for d in free.tolist():
                put(p, base + d, 1000)
        # 4) shares without a group: a fresh device each (num-devices fresh devices)
        for p in batch:
            if p in explicit or whole[p] or p in groups:
                continue
            amount = per_device(p)
            for _ in range(int(ndev[p])):
                d = _pick_shared(occupied(sl, pipelined_pass), amount, fresh_first=True,
                                 exclude=[x - base for x in per_pod.get(p, [])])
                if d is None:
                    warnings.append(f"Pod {pod_name(p)}: no GPU device left for its share")
                    break
                put(p, base + d, amount)


def _devices_per_pod(per_pod: dict[int, list[int]], ex_pods: np.ndarray, counts_ex: np.ndarray,
                     ex_devs: np.ndarray, n_pods: int) -> tuple[np.ndarray, np.ndarray]:
    """(pod_dev_start, pod_dev): devices per pod, in pod order (each pod's devices in the order it was given
    them)."""
    keys = np.fromiter(per_pod, dtype=np.int64, count=len(per_pod))
    lens = np.fromiter((len(d) for d in per_pod.values()), dtype=np.int64, count=len(per_pod))
    flat = np.fromiter((x for d in per_pod.values() for x in d), dtype=np.int64, count=int(lens.sum()))
    owner = np.concatenate([np.repeat(keys, lens), np.repeat(ex_pods, counts_ex)])
    flat = np.concatenate([flat, ex_devs])
    counts = np.bincount(owner, minlength=n_pods).astype(np.int64)
    pod_dev_start = np.zeros(n_pods + 1, dtype=np.int64)
    np.cumsum(counts, out=pod_dev_start[1:])
    return pod_dev_start, flat[np.argsort(owner, kind="stable")]


def _per_device(pods: np.ndarray, frac: np.ndarray, mem: np.ndarray, gpu_mem_mib: np.ndarray) -> np.ndarray:
    """Milli-GPU per device of each pod (gpu_mem_mib: the GPU memory of each pod's node)."""
    f = frac[pods].astype(np.int64)
    m = mem[pods].astype(np.int64)
    by_mem = np.minimum(1000, -((-m * 1000) // np.maximum(1, gpu_mem_mib.astype(np.int64))))
    return np.where(f > 0, f, np.where(m > 0, by_mem, 1000))


def _explicit_now(pods: np.ndarray, explicit: ExplicitDevices, piped: np.ndarray, dev_start: np.ndarray,
                  pod_node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pods (sorted) with explicit devices that are not pipelined, and their global devices (concatenated in pod
    order); empty when there are none or any index is out of range on its node."""
    empty = np.zeros(0, dtype=np.int64)
    if not explicit or not len(pods):
        return empty, empty
    ex = pods[explicit.has[pods] & ~piped[pods]].astype(np.int64)
    if not len(ex):
        return empty, empty
    counts = explicit.count(ex)
    local = explicit.of(ex)
    nodes = np.repeat(pod_node[ex].astype(np.int64), counts)
    size = dev_start[nodes + 1] - dev_start[nodes]
    if ((local < 0) | (local >= size)).any():
        return empty, empty
    return ex, dev_start[nodes] + local


def _pick_shared(used: np.ndarray, amount: int, *, fresh_first: bool, exclude: list[int] | None = None) -> int | None:
    """A device for a share: a fresh (unused) one first, else the fullest one it still fits on."""
    ok = np.ones(len(used), dtype=bool)
    if exclude:
        ok[exclude] = False
    fresh = np.nonzero((used == 0) & ok)[0]
    if fresh_first and len(fresh):
        return int(fresh[0])
    fits = np.nonzero((used + amount <= 1000) & ok & (used > 0))[0]
    if len(fits):
        return int(fits[np.argmax(used[fits])])
    return None
