"""ClusterBuilder: nodes with exact free-resource bookkeeping, running gangs placed on devices, pending gangs.

Running pods record their GPU devices in the `kai-opt.io/gpu-devices` annotation, so the state built from the
snapshot has exactly the device usage the builder tracked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kai_opt.snapshot import RawObject
from models.generators import objects as ko
from models.generators.queues import QueueTree, queue_tree, shape_for

MAX_GPUS = 8


@dataclass(frozen=True)
class PodShape:
    """What one pod asks for: whole GPUs, or a share of one device (fraction or GPU memory), CPU and memory."""

    cpu_m: int
    memory_mi: int
    gpus: int = 0
    fraction: float | None = None
    gpu_memory_mib: int | None = None

    @property
    def gpu_total(self) -> float:
        """GPUs this pod counts against its queue (gpu-memory counted against an 80 GB device)."""
        if self.fraction is not None:
            return self.fraction
        if self.gpu_memory_mib is not None:
            return min(1.0, self.gpu_memory_mib / ko.H100[1])
        return float(self.gpus)


@dataclass
class Occupancy:
    """Free resources per node, with per-node GPU summaries kept up to date pod by pod."""

    dev: np.ndarray  # int64[N, 8] milli-GPU used per device (1000 on devices a node lacks)
    cpu: np.ndarray  # int64[N] free millicores
    mem: np.ndarray  # int64[N] free MiB
    gpu_mem: np.ndarray  # int64[N] MiB per device
    whole: np.ndarray = field(init=False)  # int64[N] devices with nothing on them
    room: np.ndarray = field(init=False)  # int64[N] most milli-GPU free on one device
    used: np.ndarray = field(init=False)  # int64[N] milli-GPU used on the node

    def __post_init__(self) -> None:
        self.whole = (self.dev == 0).sum(axis=1)
        self.room = 1000 - self.dev.min(axis=1)
        self.used = self.dev.sum(axis=1)

    def refresh(self, n: int) -> None:
        row = self.dev[n]
        self.whole[n] = int((row == 0).sum())
        self.room[n] = 1000 - int(row.min())
        self.used[n] = int(row.sum())


@dataclass
class ClusterBuilder:
    rng: np.random.Generator
    objects: list[RawObject] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    n_gpus: list[int] = field(default_factory=list)
    gpu_mem: list[int] = field(default_factory=list)
    cpu: list[int] = field(default_factory=list)  # capacity, millicores
    mem: list[int] = field(default_factory=list)  # capacity, MiB
    tree: QueueTree | None = None
    _occ: Occupancy | None = None
    _serial: int = 0

    # -- nodes ---------------------------------------------------------------------------------------------------
    def add_node(self, name: str, *, gpus: int = 8, cpu: int | None = None, memory_gi: int | None = None,
                 product: str = ko.H100[0], gpu_memory_mib: int = ko.H100[1],
                 labels: dict[str, str] | None = None) -> int:
        """A node (default: 8 x 80 GB GPUs, 96-128 CPUs, 1-2 TiB); returns its index. Add nodes before pods."""
        assert self._occ is None, "nodes must be added before any pod is placed"
        cpu = cpu if cpu is not None else int(self.rng.choice([96, 112, 128]))
        memory_gi = memory_gi if memory_gi is not None else int(self.rng.choice([1024, 1536, 2048]))
        self.objects.append(ko.node(name, gpus=gpus, cpu=cpu, memory_gi=memory_gi, product=product,
                                    gpu_memory_mib=gpu_memory_mib, labels=labels))
        self.names.append(name)
        self.n_gpus.append(gpus)
        self.gpu_mem.append(gpu_memory_mib)
        self.cpu.append(cpu * 1000)
        self.mem.append(memory_gi * 1024)
        return len(self.names) - 1

    def add_nodes(self, n: int, prefix: str = "node", **kw: object) -> list[int]:
        return [self.add_node(f"{prefix}-{i:05d}", **kw) for i in range(n)]  # type: ignore[arg-type]

    @property
    def occ(self) -> Occupancy:
        if self._occ is None:
            dev = np.zeros((len(self.names), MAX_GPUS), dtype=np.int64)
            dev[np.arange(MAX_GPUS)[None, :] >= np.array(self.n_gpus)[:, None]] = 1000
            self._occ = Occupancy(dev, np.array(self.cpu, dtype=np.int64), np.array(self.mem, dtype=np.int64),
                                  np.array(self.gpu_mem, dtype=np.int64))
        return self._occ

    @property
    def total_gpus(self) -> int:
        return int(sum(self.n_gpus))

    # -- queues and priority classes ------------------------------------------------------------------------------
    def add_queues(self, shape: tuple[int, int, int, int] | None = None, n_queues: int = 106,
                   quota_fraction: float = 0.9) -> QueueTree:
        self.tree = queue_tree(self.rng, self.total_gpus, shape=shape or shape_for(n_queues),
                               quota_fraction=quota_fraction)
        self.objects.extend(self.tree.objects)
        self.objects.extend(ko.priority_classes())
        return self.tree

    # -- placement ------------------------------------------------------------------------------------------------
    def _share_milli(self, s: PodShape, n: int) -> int:
        if s.fraction is not None:
            return max(1, round(s.fraction * 1000))
        assert s.gpu_memory_mib is not None
        return min(1000, -(-s.gpu_memory_mib * 1000 // int(self.occ.gpu_mem[n])))

    def candidates(self, s: PodShape, mask: np.ndarray | None = None) -> np.ndarray:
        o = self.occ
        ok = (o.cpu >= s.cpu_m) & (o.mem >= s.memory_mi)
        if s.gpus:
            ok &= o.whole >= s.gpus
        elif s.fraction is not None:
            ok &= o.room >= max(1, round(s.fraction * 1000))
        elif s.gpu_memory_mib is not None:
            ok &= o.room >= np.minimum(1000, -(-s.gpu_memory_mib * 1000 // np.maximum(o.gpu_mem, 1)))
        if mask is not None:
            ok &= mask
        return np.nonzero(ok)[0]

    def fit(self, s: PodShape, n: int) -> tuple[int, ...] | None:
        """Devices pod shape s would take on node n (whole GPUs: lowest free; share: fullest device it fits)."""
        o = self.occ
        if o.cpu[n] < s.cpu_m or o.mem[n] < s.memory_mi:
            return None
        if s.gpus:
            free = np.nonzero(o.dev[n] == 0)[0]
            return tuple(free[: s.gpus].tolist()) if len(free) >= s.gpus else None
        if s.fraction is None and s.gpu_memory_mib is None:
            return ()
        amount = self._share_milli(s, n)
        room = np.nonzero(o.dev[n] + amount <= 1000)[0]
        if not len(room):
            return None
        return (int(room[np.argmax(o.dev[n, room])]),)

    def _move(self, s: PodShape, n: int, devices: tuple[int, ...], sign: int) -> None:
        o = self.occ
        o.cpu[n] -= sign * s.cpu_m
        o.mem[n] -= sign * s.memory_mi
        amount = 1000 if s.gpus else (self._share_milli(s, n) if devices else 0)
        for d in devices:
            o.dev[n, d] += sign * amount
        if devices:
            o.refresh(n)

    def take(self, s: PodShape, n: int, devices: tuple[int, ...]) -> None:
        self._move(s, n, devices, 1)

    def give_back(self, s: PodShape, n: int, devices: tuple[int, ...]) -> None:
        self._move(s, n, devices, -1)

    def choose(self, s: PodShape, policy: str = "pack", mask: np.ndarray | None = None) -> int | None:
        """A node for s: `pack` = most GPU already used (then lowest index), `random` = any fitting node."""
        cand = self.candidates(s, mask)
        if not len(cand):
            return None
        if policy == "random":
            return int(cand[int(self.rng.integers(len(cand)))])
        return int(cand[np.argmax(self.occ.used[cand])])

    def place_gang(self, shapes: list[PodShape], policy: str = "pack", mask: np.ndarray | None = None,
                   nodes: list[int] | None = None) -> list[tuple[int, tuple[int, ...]]] | None:
        """Places all pods or none (explicit `nodes` per pod, or chosen by policy); returns (node, devices)."""
        done: list[tuple[int, tuple[int, ...]]] = []
        for i, s in enumerate(shapes):
            n = nodes[i] if nodes is not None else self.choose(s, policy, mask)
            devs = self.fit(s, n) if n is not None else None
            if n is None or devs is None:
                for (m, d), t in zip(done, shapes, strict=False):
                    self.give_back(t, m, d)
                return None
            self.take(s, n, devs)
            done.append((n, devs))
        return done

    # -- workloads -------------------------------------------------------------------------------------------------
    def _name(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}-{self._serial:06d}"

    def add_gang(self, shapes: list[PodShape], *, leaf: int, priority_class: str = "train",
                 placements: list[tuple[int, tuple[int, ...]]] | None = None, min_member: int | None = None,
                 prefix: str = "job", topology: dict[str, str] | None = None,
                 sub_groups: list[dict[str, object]] | None = None, subgroup_of: list[str] | None = None,
                 age_s: float | None = None) -> str:
        """A PodGroup and its pods; running (bound to `placements`) or pending. Returns the group name."""
        tree = self.tree
        assert tree is not None, "add_queues first"
        name = self._name(prefix)
        ns, qn = tree.namespace[leaf], tree.names[int(tree.leaves[leaf])]
        running = placements is not None
        age = age_s if age_s is not None else float(self.rng.uniform(3600, 7 * 86400) if running
                                                    else self.rng.uniform(60, 7200))
        created = ko.NOW - age
        self.objects.append(ko.podgroup(name, ns, qn, min_member=min_member or len(shapes),
                                        priority_class=priority_class, created=created, topology=topology,
                                        sub_groups=sub_groups))  # type: ignore[arg-type]
        for i, s in enumerate(shapes):
            node_name = devices = None
            if placements is not None:
                n, devs = placements[i]
                node_name = self.names[n]
                devices = ",".join(map(str, devs)) if devs else None
            self.objects.append(ko.pod(
                f"{name}-{i}", ns, name, qn, cpu_m=s.cpu_m, memory_mi=s.memory_mi, priority_class=priority_class,
                created=created, gpus=s.gpus, fraction=s.fraction, gpu_memory_mib=s.gpu_memory_mib,
                node_name=node_name, devices=devices, started=created + 30 if running else None,
                subgroup=subgroup_of[i] if subgroup_of else None))
        if running:
            tree.charge(leaf, sum(s.gpu_total for s in shapes))
        return name

    def run_gang(self, shapes: list[PodShape], *, leaf: int | None = None, policy: str = "pack",
                 mask: np.ndarray | None = None, nodes: list[int] | None = None, **kw: object) -> str | None:
        """Place and add a running gang (leaf drawn by quota within limits when None); None if it does not fit."""
        assert self.tree is not None
        gpus = sum(s.gpu_total for s in shapes)
        if leaf is None:
            leaf = self.tree.pick(self.rng, gpus)
        elif not self.tree.fits(leaf, gpus):
            return None
        placed = self.place_gang(shapes, policy, mask, nodes)
        if placed is None:
            return None
        return self.add_gang(shapes, leaf=leaf, placements=placed, **kw)  # type: ignore[arg-type]

    def pend_gang(self, shapes: list[PodShape], *, leaf: int | None = None, **kw: object) -> str:
        assert self.tree is not None
        if leaf is None:
            leaf = int(self.rng.choice(len(self.tree.leaves), p=self.tree.weights()))
        return self.add_gang(shapes, leaf=leaf, **kw)  # type: ignore[arg-type]


def gpu_pod(rng: np.random.Generator, gpus: int) -> PodShape:
    """A whole-GPU pod with 6-12 cores and 64-128 GiB per GPU (a full node's worth always fits a node)."""
    return PodShape(cpu_m=gpus * int(rng.choice([6000, 8000, 10000, 12000])),
                    memory_mi=gpus * int(rng.choice([64, 96, 128])) * 1024, gpus=gpus)


def gang_shapes(rng: np.random.Generator, total_gpus: int, per_pod: int) -> list[PodShape]:
    """total_gpus split into pods of per_pod GPUs, every pod alike (one template per gang, as a Job would be)."""
    tmpl = gpu_pod(rng, per_pod)
    return [tmpl] * max(1, total_gpus // per_pod)
