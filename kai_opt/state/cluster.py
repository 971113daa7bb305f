"""ClusterState: nodes x resources, GPU devices, pods, podgroups, sub-groups and the queue tree as arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property

import numpy as np

from kai_opt.api import Pod, Taint
from kai_opt.api.meta import NodeSelectorTerm, Toleration
from kai_opt.dra.prepare import DraState
from kai_opt.state.resources import QR_COLUMN, QR_DIVISOR, R_GPU

DRA_UNAVAILABLE = "cannot allocate all claims (DRA: no matching devices there, or a claim allocated elsewhere)"


class PodStatus(IntEnum):
    PENDING = 0  # ours, waiting to be placed
    GATED = 1  # ours, has scheduling gates: never placed
    BOUND = 2  # holds resources on a node (running, or bound and starting); ours or another scheduler's
    RELEASING = 3  # bound and being deleted: still holds its resources until it is gone
    IGNORED = 4  # not ours and not on a node, or ours but deleted before placement
    PIPELINED = 5  # ours, nominated onto a node whose resources are still being released (holds them there)
    # placed in this cycle, to be bound: only a simulation (heuristics.session) sets it; build_state never does
    ALLOCATED = 6


@dataclass(frozen=True)
class SchedulingSig:
    """What restricts a pod to nodes, independent of other pods: node selector, required affinity, tolerations."""

    node_selector: tuple[tuple[str, str], ...]
    node_affinity: tuple[NodeSelectorTerm, ...]
    tolerations: tuple[Toleration, ...]
    dra_nodes: frozenset[str] | None = None  # the nodes the pod's DRA claims allow (kai_opt.dra); None: any

    def allows(self, labels: dict[str, str], taints: tuple[Taint, ...], node_name: str) -> bool:
        if self.dra_nodes is not None and node_name not in self.dra_nodes:
            return False
        for k, v in self.node_selector:
            if labels.get(k) != v:
                return False
        if self.node_affinity and not any(t.matches(labels, node_name) for t in self.node_affinity):
            return False
        for t in taints:
            if t.effect in ("NoSchedule", "NoExecute") and not any(
                    tol.tolerates(t.key, t.value, t.effect) for tol in self.tolerations):
                return False
        return True

    def first_failure(self, labels: dict[str, str], taints: tuple[Taint, ...], node_name: str) -> str | None:
        """kube-scheduler style reason a node fails this signature, or None."""
        for k, v in self.node_selector:
            if labels.get(k) != v:
                return "didn't match Pod's node affinity/selector"
        if self.node_affinity and not any(t.matches(labels, node_name) for t in self.node_affinity):
            return "didn't match Pod's node affinity/selector"
        for t in taints:
            if t.effect in ("NoSchedule", "NoExecute") and not any(
                    tol.tolerates(t.key, t.value, t.effect) for tol in self.tolerations):
                shown = f"{t.key}: {t.value}" if t.value else t.key
                return f"had untolerated taint {{{shown}}}"
        if self.dra_nodes is not None and node_name not in self.dra_nodes:
            return DRA_UNAVAILABLE
        return None


@dataclass
class TopologyIndex:
    """Domains of one Topology: for level i (top -> bottom), the domain id of each node (-1: not labelled)."""

    name: str
    levels: tuple[str, ...]
    domain: list[np.ndarray]  # per level: int32[N]
    domain_names: list[list[str]]  # per level: name of each domain id

    def level_index(self, label: str) -> int:
        return self.levels.index(label)

    @cached_property
    def name_rank(self) -> list[np.ndarray]:
        """Per level: the rank of each domain's name (orderings break ties by name)."""
        out = []
        for names in self.domain_names:
            r = np.empty(len(names), dtype=np.int64)
            r[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
            out.append(r)
        return out


@dataclass
class ClusterState:
    now: float
    resources: tuple[str, ...]
    # -- nodes (N) -------------------------------------------------------------------------------------------------
    node_names: list[str]
    node_alloc: np.ndarray  # int64[N, R]
    node_used: np.ndarray  # int64[N, R]: held now by bound and releasing pods (ours and others')
    node_releasing: np.ndarray  # int64[N, R]: the part of node_used that releasing pods hold
    node_pipelined: np.ndarray  # int64[N, R]: claimed by pipelined pods once releases finish (not in node_used)
    node_ok: np.ndarray  # bool[N]: Ready and not cordoned
    node_gpu_mem_mib: np.ndarray  # int64[N] MiB per device (0: no GPUs; a default when not labelled)
    node_gpu_mem_known: np.ndarray  # bool[N]: GPUs with a GPU-memory label; only these take gpu-memory requests
    node_labels: list[dict[str, str]]
    node_taints: list[tuple[Taint, ...]]
    node_class: np.ndarray  # int32[N]: nodes alike for every pod signature (labels that matter + taints)
    # -- GPU devices (D), grouped by node: devices of node n are dev_start[n]:dev_start[n+1] ------------------------
    dev_start: np.ndarray  # int64[N+1]
    dev_used: np.ndarray  # int64[D] milli-GPU held now (incl. releasing)
    dev_releasing: np.ndarray  # int64[D] milli-GPU held by releasing pods
    dev_pipelined: np.ndarray  # int64[D] milli-GPU claimed by pipelined pods (not in dev_used)
    # -- pods (P) --------------------------------------------------------------------------------------------------
    pods: list[Pod]
    pod_status: np.ndarray  # int8[P] PodStatus
    pod_ours: np.ndarray  # bool[P]
    pod_node: np.ndarray  # int32[P], -1 = none
    pod_req: np.ndarray  # int64[P, R]; GPU column: whole*1000, or fraction*devices; 0 for gpu-memory pods
    pod_gpu_whole: np.ndarray  # int32[P] whole devices
    pod_gpu_frac: np.ndarray  # int32[P] milli-GPU per device of a sharing pod (0: not sharing, or by memory)
    pod_gpu_mem: np.ndarray  # int64[P] MiB per device of a gpu-memory pod (0: not)
    pod_gpu_ndev: np.ndarray  # int32[P] devices of a sharing pod (1 unless gpu-fraction-num-devices)
    pod_dev_start: np.ndarray  # int64[P+1]: devices held by a bound pod are pod_dev[pod_dev_start[p]:...]
    pod_dev: np.ndarray  # int64[*] global device index
    pod_pg: np.ndarray  # int32[P], -1 = not ours / no group
    pod_sg: np.ndarray  # int32[P] global sub-group index, -1 = none
    pod_sig: np.ndarray  # int32[P] index into sigs
    pod_priority: np.ndarray  # int32[P] pod spec priority (task order inside a job)
    pod_creation: np.ndarray  # float64[P] epoch s (nan: unknown)
    pod_start: np.ndarray  # float64[P] epoch s when it started running (nan: unknown)
    sigs: list[SchedulingSig]
    # -- podgroups (G) ---------------------------------------------------------------------------------------------
    pg_keys: list[str]
    pg_queue: np.ndarray  # int32[G], -1 = unknown (see pg_problem)
    pg_min_member: np.ndarray  # int32[G]
    pg_priority: np.ndarray  # int32[G]
    pg_preemptible: np.ndarray  # bool[G]
    pg_creation: np.ndarray  # float64[G]
    pg_last_start: np.ndarray  # float64[G]
    pg_stale_since: np.ndarray  # float64[G]
    pg_implicit: np.ndarray  # bool[G]: made by kai-opt for a pod without a PodGroup
    pg_pod_start: np.ndarray  # int64[G+1]; pods of group g: pg_pods[pg_pod_start[g]:pg_pod_start[g+1]]
    pg_pods: np.ndarray  # int64[*]
    pg_topology: np.ndarray  # int32[G] index into topologies, -1 = none
    pg_required_level: np.ndarray  # int32[G] level index in that topology, -1 = none
    pg_preferred_level: np.ndarray  # int32[G]
    pg_problem: list[str | None]  # reason the group cannot be scheduled at all (QueueDoesNotExist, ...)
    pg_problem_message: list[str | None]
    # -- sub-groups (S), global ------------------------------------------------------------------------------------
    sg_pg: np.ndarray  # int32[S]
    sg_names: list[str]
    sg_min_member: np.ndarray  # int32[S]
    sg_parent: np.ndarray  # int32[S] global index, -1 = top level of its group
    sg_topology: np.ndarray  # int32[S]
    sg_required_level: np.ndarray  # int32[S]
    sg_preferred_level: np.ndarray  # int32[S]
    # -- queues (Q), quantities in KAI units (QR order: gpu devices, cpu millicores, memory bytes) -----------------
    q_names: list[str]
    q_parent: np.ndarray  # int32[Q], -1 = top level
    q_priority: np.ndarray  # int32[Q]
    q_creation: np.ndarray  # float64[Q]
    q_deserved: np.ndarray  # float64[Q, 3], -1 = unlimited
    q_limit: np.ndarray  # float64[Q, 3], -1 = unlimited
    q_oqw: np.ndarray  # float64[Q, 3]
    q_preempt_min_runtime: np.ndarray  # float64[Q] seconds, inherited; nan = not set anywhere
    q_reclaim_min_runtime: np.ndarray  # float64[Q]
    topologies: list[TopologyIndex]
    warnings: list[str] = field(default_factory=list)
    dra: DraState | None = None  # the DRA view (kai_opt.dra.prepare) when the snapshot has DRA objects
    # float64[3] queue units: the summed status.capacity of every node, ready or not (what KAI's time-based fair
    # share normalises usage by: sum(kube_node_status_capacity)); None: not read (fall back to the divisible total)
    node_capacity_total: np.ndarray | None = None

    # -- sizes and indexes -----------------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def n_pods(self) -> int:
        return len(self.pods)

    @property
    def n_groups(self) -> int:
        return len(self.pg_keys)

    @property
    def n_queues(self) -> int:
        return len(self.q_names)

    @cached_property
    def node_index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.node_names)}

    @cached_property
    def pod_index(self) -> dict[str, int]:
        return {p.key: i for i, p in enumerate(self.pods)}

    @cached_property
    def pg_index(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self.pg_keys)}

    @cached_property
    def q_index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.q_names)}

    @cached_property
    def q_children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.q_names]
        for q, p in enumerate(self.q_parent):
            if p >= 0:
                out[p].append(q)
        return out

    @cached_property
    def q_is_leaf(self) -> np.ndarray:
        leaf = np.ones(self.n_queues, dtype=bool)
        leaf[self.q_parent[self.q_parent >= 0]] = False
        return leaf

    @cached_property
    def q_ancestors(self) -> list[list[int]]:
        """For each queue: itself, then its parent, ... up to the top level."""
        out = []
        for q in range(self.n_queues):
            chain, cur = [], q
            while cur >= 0:
                chain.append(cur)
                cur = int(self.q_parent[cur])
            out.append(chain)
        return out

    def group_pods(self, g: int) -> np.ndarray:
        return self.pg_pods[self.pg_pod_start[g]:self.pg_pod_start[g + 1]]

    def node_devices(self, n: int) -> slice:
        return slice(int(self.dev_start[n]), int(self.dev_start[n + 1]))

    def pod_devices(self, p: int) -> np.ndarray:
        return self.pod_dev[self.pod_dev_start[p]:self.pod_dev_start[p + 1]]

    # -- derived quantities ----------------------------------------------------------------------------------------
    @property
    def node_free(self) -> np.ndarray:
        """int64[N, R] free now (releasing resources are not free yet)."""
        return self.node_alloc - self.node_used

    @property
    def node_gpus(self) -> np.ndarray:
        return np.diff(self.dev_start).astype(np.int64)

    @property
    def dev_node(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_nodes, dtype=np.int64), np.diff(self.dev_start))

    def pod_gpu_per_device(self, p: int, n: int) -> int:
        """Milli-GPU per device that pod p needs on node n (gpu-memory converted with n's GPU memory)."""
        if self.pod_gpu_frac[p]:
            return int(self.pod_gpu_frac[p])
        if self.pod_gpu_mem[p]:
            mem = int(self.node_gpu_mem_mib[n]) or 1
            return min(1000, -(-int(self.pod_gpu_mem[p]) * 1000 // mem))
        return 1000 if self.pod_gpu_whole[p] else 0

    def pod_gpu_per_device_many(self, pods: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """pod_gpu_per_device for each (pods[i], nodes[i]), as int64."""
        frac = self.pod_gpu_frac[pods].astype(np.int64)
        mem = self.pod_gpu_mem[pods].astype(np.int64)
        node_mem = self.node_gpu_mem_mib[nodes].astype(np.int64)
        by_mem = np.minimum(1000, -(-mem * 1000 // np.where(node_mem == 0, 1, node_mem)))
        return np.where(frac > 0, frac, np.where(mem > 0, by_mem, np.where(self.pod_gpu_whole[pods] > 0, 1000, 0)))

    @cached_property
    def _pod_qreq(self) -> np.ndarray:
        """float64[P, 3]: pod requests in queue units (gpu-memory pods fixed up per call)."""
        out = np.empty((self.n_pods, len(QR_COLUMN)), dtype=np.float64)
        for j, (col, div) in enumerate(zip(QR_COLUMN, QR_DIVISOR, strict=True)):
            out[:, j] = self.pod_req[:, col] / div
        if self.dra is not None:  # DRA GPUs count as GPUs (KAI's queue accounting)
            out[:, 0] += np.array([p.dra_gpus for p in self.pods], dtype=np.float64)
        return out

    def pod_queue_request(self, pods: np.ndarray, nodes: np.ndarray | None = None) -> np.ndarray:
        """float64[len(pods), 3]: what pods count against a queue (KAI units). gpu-memory pods count their
        fraction of the node they are on, or of the smallest GPU memory in the cluster when not placed."""
        out = self._pod_qreq[pods]
        mem = self.pod_gpu_mem[pods]
        if mem.any():
            where = np.nonzero(mem)[0]
            gpu_mem = self.node_gpu_mem_mib
            default = float(gpu_mem[gpu_mem > 0].min()) if (gpu_mem > 0).any() else 1.0
            for w in where:
                n = -1 if nodes is None else int(nodes[w])
                denom = float(gpu_mem[n]) if n >= 0 and gpu_mem[n] > 0 else default
                out[w, 0] = min(1.0, mem[w] / denom) * self.pod_gpu_ndev[pods[w]]
        return out

    def gpu_milli_used_on(self, n: int) -> int:
        return int(self.node_used[n, R_GPU])
