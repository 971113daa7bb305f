"""A cycle's mutable simulation state with an operation log: checkpoint, rollback, commit (KAI's Statement).

Resources per node are split into `held` (bound, newly placed or pipelined pods) and `rel` (pods being
released). Free now = allocatable - held - rel; free once releases finish = allocatable - held. GPU devices
follow the same split in milli-GPUs. Every change is logged so a failed attempt rolls back exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from kai_opt.config import Config
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.share import FairShare
from kai_opt.plan import Eviction, Placement
from kai_opt.state import R_GPU, ClusterState, PodStatus
from kai_opt.state.segments import concat_ranges
from kai_opt.usage import pod_queue

ALLOCATED = 6  # placed in this cycle, to be bound (PodStatus values 0..5 come from the snapshot)
ACTIVE = (PodStatus.BOUND, PodStatus.PIPELINED, ALLOCATED)  # counts towards a gang's minMember
IS_ACTIVE = np.zeros(16, dtype=bool)  # status -> in ACTIVE (a table lookup instead of np.isin in hot loops)
IS_ACTIVE[list(ACTIVE)] = True
DEV = 1000  # milli-GPU per device
T = TypeVar("T")
MEMO_STATES = 4  # states whose memo() results are kept (a search returns to the state it started from)


@dataclass
class _Run:
    """A run of binds made at once (Session.place_many): per pod, in order."""

    pods: np.ndarray
    nodes: np.ndarray
    amounts: np.ndarray  # node resources taken
    devices: np.ndarray  # global devices, pod after pod
    dev_amounts: np.ndarray  # milli-GPU on each of `devices`
    queue_amounts: np.ndarray
    non_preemptible: np.ndarray
    prev_status: np.ndarray


@dataclass
class _Op:
    kind: str  # place | evict | move | pipeline | unevict
    pod: int
    node: int
    devices: tuple[int, ...]
    prev_status: int
    amount: np.ndarray  # node resources moved
    dev_amount: int  # milli-GPU per device
    queue_amount: np.ndarray
    non_preemptible: bool
    claimed: np.ndarray | None = None  # releasing resources a pipelined placement claimed
    dev_claimed: tuple[int, ...] = ()
    eviction: Eviction | None = None  # unevict: the eviction it took back
    batch: list[tuple[_Op, Eviction]] | None = None  # unevict_many: the eviction ops taken back, in order
    run: _Run | None = None  # place_run: the binds it made
    _amount_list: list[int] | None = None
    serial: int = 0  # unique per op of a session (Session.state_id)

    def amount_list(self) -> list[int]:
        """`amount` as Python ints (made once)."""
        if self._amount_list is None:
            self._amount_list = self.amount.tolist()
        return self._amount_list


class Session:
    def __init__(self, state: ClusterState, fs: FairShare, config: Config) -> None:
        self.state = state
        self.fs = fs
        self.cfg = config
        self.alloc = state.node_alloc
        # held: stays once releases finish (bound + pipelined); rel: being released and not yet claimed
        self.held = state.node_used - state.node_releasing + state.node_pipelined
        self.rel = np.maximum(state.node_releasing - state.node_pipelined, 0)
        self.dev_held = state.dev_used - state.dev_releasing + state.dev_pipelined
        self.dev_rel = np.maximum(state.dev_releasing - state.dev_pipelined, 0)
        self.dev_piped = state.dev_pipelined.copy()  # milli-GPU reserved by pods waiting to bind (shared devices)
        self.dev_start = state.dev_start
        self.dev_node = state.dev_node
        self.status = state.pod_status.astype(np.int8).copy()
        self.node = state.pod_node.copy()
        self.devices: dict[int, tuple[int, ...]] = {}  # global device indexes of pods placed in this cycle
        self.ledger = QueueLedger.start(state, fs)
        self.queue_of_pod = pod_queue(state)
        self.log: list[_Op] = []
        self.placements: dict[int, Placement] = {}
        self.moves: dict[int, Placement] = {}
        self.evictions: dict[int, Eviction] = {}
        self.touched: list[int] = []  # nodes changed, in order (caches re-check these)
        self.version = 0  # bumped by every change of the state (place, evict, pipeline, undo)
        self._serial = 0
        # ledger values at checkpoints (log length, allocated, allocated_np): a rollback restores them exactly
        # (undoing float additions could leave last-bit differences behind)
        self._marks: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._memo: OrderedDict[int, dict[object, object]] = OrderedDict()  # state_id -> key -> result: memo()
        # pod -> an eviction op of it (unevict undoes it; a pod's evictions in one session are all alike)
        self._evict_op: dict[int, _Op] = {}
        self._anc_pad: np.ndarray | None = None
        n = state.n_nodes
        # GPU summaries per node, brought up to date lazily: changes mark their node dirty, reads refresh
        self._whole_idle = np.zeros(n, dtype=np.int64)  # devices with nothing on them now
        self._whole_future = np.zeros(n, dtype=np.int64)  # devices free once releases finish
        self._max_idle = np.zeros(n, dtype=np.int64)  # most milli-GPU free now on one device
        self._max_future = np.zeros(n, dtype=np.int64)
        self._dirty: set[int] = set()
        self._refresh_gpu_summary(np.arange(n))

    # -- GPU summaries per node --------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self._dirty:
            nodes = np.fromiter(self._dirty, dtype=np.int64, count=len(self._dirty))
            self._dirty.clear()
            self._refresh_gpu_summary(nodes)

    @property
    def whole_idle(self) -> np.ndarray:
        self._flush()
        return self._whole_idle

    @property
    def whole_future(self) -> np.ndarray:
        self._flush()
        return self._whole_future

    @property
    def max_idle(self) -> np.ndarray:
        self._flush()
        return self._max_idle

    @property
    def max_future(self) -> np.ndarray:
        self._flush()
        return self._max_future

    def _refresh_gpu_summary(self, nodes: np.ndarray) -> None:
        if len(self.dev_held) == 0:
            return
        if len(nodes) > 64:  # vectorised over all devices
            idle = DEV - self.dev_held - self.dev_rel
            future = DEV - self.dev_held
            n_all = self.state.n_nodes
            wi = np.bincount(self.dev_node, weights=(idle == DEV), minlength=n_all).astype(np.int64)
            wf = np.bincount(self.dev_node, weights=(future == DEV), minlength=n_all).astype(np.int64)
            mi = np.zeros(n_all, dtype=np.int64)
            mf = np.zeros(n_all, dtype=np.int64)
            has = np.diff(self.dev_start) > 0
            starts = self.dev_start[:-1][has]
            mi[has] = np.maximum.reduceat(idle, starts)
            mf[has] = np.maximum.reduceat(future, starts)
            self._whole_idle[nodes], self._whole_future[nodes] = wi[nodes], wf[nodes]
            self._max_idle[nodes], self._max_future[nodes] = mi[nodes], mf[nodes]
            return
        if len(nodes) > 4:  # vectorised over these nodes' devices
            starts = self.dev_start[nodes]
            counts = self.dev_start[nodes + 1] - starts
            has = counts > 0
            nodes, starts, counts = nodes[has], starts[has], counts[has]
            if not len(nodes):
                return
            devs, seg = concat_ranges(starts, counts)
            held = self.dev_held[devs]
            future = DEV - held
            idle = future - self.dev_rel[devs]
            self._whole_idle[nodes] = np.add.reduceat((idle == DEV).astype(np.int64), seg)
            self._whole_future[nodes] = np.add.reduceat((future == DEV).astype(np.int64), seg)
            self._max_idle[nodes] = np.maximum.reduceat(idle, seg)
            self._max_future[nodes] = np.maximum.reduceat(future, seg)
            return
        for n in nodes.tolist():
            a, b = int(self.dev_start[n]), int(self.dev_start[n + 1])
            if a == b:
                continue
            idle = DEV - self.dev_held[a:b] - self.dev_rel[a:b]
            future = DEV - self.dev_held[a:b]
            self._whole_idle[n] = int((idle == DEV).sum())
            self._whole_future[n] = int((future == DEV).sum())
            self._max_idle[n] = int(idle.max())
            self._max_future[n] = int(future.max())

    # -- state identity ---------------------------------------------------------------------------------------
    def _log(self, op: _Op) -> None:
        self._serial += 1
        op.serial = self._serial
        self.log.append(op)

    @property
    def state_id(self) -> int:
        """Identifies the session's state: equal ids mean equal states (every change appends a new op, and a
        rollback restores the state, ledger included, exactly as it was when its top op was the top)."""
        return self.log[-1].serial if self.log else 0

    def memo(self, key: object, make: Callable[[], T]) -> T:
        """make(), remembered for key while the session stays in this state (a result that depends on the
        session's state and key only). Results are shared: callers must not change them."""
        sid = self.state_id
        memo = self._memo.get(sid)
        if memo is None:
            memo = self._memo[sid] = {}
            while len(self._memo) > MEMO_STATES:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(sid)
        if key in memo:
            return memo[key]  # type: ignore[return-value]
        out = memo[key] = make()
        return out

    # -- queries -----------------------------------------------------------------------------------------------
    def idle(self) -> np.ndarray:
        return self.alloc - self.held - self.rel

    def future(self) -> np.ndarray:
        return self.alloc - self.held

    def queue_request(self, pods: np.ndarray | list[int], nodes: np.ndarray | None = None) -> np.ndarray:
        pods = np.asarray(pods, dtype=np.int64)
        return self.state.pod_queue_request(pods, nodes)

    def gpu_per_device(self, p: int, n: int) -> int:
        return self.state.pod_gpu_per_device(p, n)

    def pod_node_amount(self, p: int, n: int) -> np.ndarray:
        """What pod p holds on node n (gpu-memory pods converted with n's GPU memory)."""
        amount = self.state.pod_req[p].copy()
        if self.state.pod_gpu_mem[p]:
            amount[R_GPU] = self.gpu_per_device(p, n) * int(self.state.pod_gpu_ndev[p])
        return amount

    def pod_devices(self, p: int) -> tuple[int, ...]:
        if p in self.devices:
            return self.devices[p]
        return tuple(int(d) for d in self.state.pod_devices(p))

    def is_preemptible(self, p: int) -> bool:
        g = int(self.state.pod_pg[p])
        return bool(self.state.pg_preemptible[g]) if g >= 0 else True

    # -- operations --------------------------------------------------------------------------------------------
    def checkpoint(self) -> int:
        cp = len(self.log)  # marks above the log's length were dropped by the rollback that shortened it
        if not self._marks or self._marks[-1][0] != cp:
            self._marks.append((cp, self.ledger.allocated.copy(), self.ledger.allocated_np.copy()))
        return cp

    def place(self, p: int, n: int, devices: tuple[int, ...], *, pipelined: bool, moved: bool = False) -> None:
        """Bind (or pipeline) pending pod p on node n; `moved`: a consolidation re-placement of an evicted pod."""
        amount = self.pod_node_amount(p, n)
        per_dev = self.gpu_per_device(p, n) if devices else 0
        self.held[n] += amount
        for d in devices:
            self.dev_held[d] += per_dev
        claimed = None
        dev_claimed: tuple[int, ...] = ()
        if pipelined:
            for d in devices:
                self.dev_piped[d] += per_dev
            claimed = np.minimum(amount, self.rel[n])
            self.rel[n] -= claimed
            dev_claimed = tuple(int(min(per_dev, self.dev_rel[d])) for d in devices)
            for d, c in zip(devices, dev_claimed, strict=True):
                self.dev_rel[d] -= c
        q = int(self.queue_of_pod[p])
        qa = self.queue_request([p], np.array([n]))[0]
        np_flag = not self.is_preemptible(p)
        self.ledger.add(q, qa, non_preemptible=np_flag)
        prev = int(self.status[p])
        if moved:
            self.moves[p] = Placement(p, n, tuple(d - int(self.dev_start[n]) for d in devices), True, True)
        else:
            self.status[p] = PodStatus.PIPELINED if pipelined else ALLOCATED
            self.node[p] = n
            self.devices[p] = devices
            self.placements[p] = Placement(p, n, tuple(d - int(self.dev_start[n]) for d in devices), pipelined)
        self._log(_Op("move" if moved else "place", p, n, devices, prev, amount, per_dev, qa, np_flag,
                            claimed, dev_claimed))
        self._touch(n)

    def place_many(self, items: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """place() for each (pod, node, devices, pipelined), in order: runs of binds in one vectorised step (the
        same ops in the log, the ledger's float sums added in op order), pipelined pods one by one (they claim
        releasing room in turn)."""
        i = 0
        while i < len(items):
            if items[i][3]:
                p, n, devices, _ = items[i]
                self.place(p, n, devices, pipelined=True)
                i += 1
                continue
            j = i
            while j < len(items) and not items[j][3]:
                j += 1
            self._bind_run(items[i:j])
            i = j

    def _bind_run(self, run: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """Bind a run of pending pods at once: one "place_run" op in the log (undone as a whole), the resources,
        devices and queue ledger updated in one vectorised step each, the ledger's float sums in pod order."""
        st = self.state
        pods = np.fromiter((it[0] for it in run), dtype=np.int64, count=len(run))
        nodes = np.fromiter((it[1] for it in run), dtype=np.int64, count=len(run))
        amounts = st.pod_req[pods].copy()
        per_dev = np.zeros(len(run), dtype=np.int64)
        counts = np.fromiter((len(it[2]) for it in run), dtype=np.int64, count=len(run))
        for k in np.nonzero((st.pod_gpu_mem[pods] > 0) | (counts > 0))[0].tolist():
            p, n = int(pods[k]), int(nodes[k])
            if st.pod_gpu_mem[p]:
                amounts[k, R_GPU] = self.gpu_per_device(p, n) * int(st.pod_gpu_ndev[p])
            if counts[k]:
                per_dev[k] = self.gpu_per_device(p, n)
        devs = np.fromiter((d for it in run for d in it[2]), dtype=np.int64, count=int(counts.sum()))
        qas = self.queue_request(pods, nodes)
        groups = st.pod_pg[pods]
        np_flags = (groups >= 0) & ~st.pg_preemptible.astype(bool)[np.maximum(groups, 0)] if st.n_groups \
            else np.zeros(len(run), dtype=bool)  # is_preemptible: a pod without a group is preemptible
        prevs = self.status[pods].copy()
        batch = _Run(pods, nodes, amounts, devs, np.repeat(per_dev, counts), qas, np_flags, prevs)
        self._apply_run(batch, 1)
        self.status[pods] = ALLOCATED
        self.node[pods] = nodes
        starts = st.dev_start[nodes].tolist()
        for (p, n, devices, _), base in zip(run, starts, strict=True):
            self.devices[p] = devices
            self.placements[p] = Placement(p, n, tuple(d - base for d in devices), False)
        self._log(_Op("place_run", -1, -1, (), 0, np.zeros(0), 0, np.zeros(0), False, run=batch))
        self._touch_many(nodes.tolist())

    def _apply_run(self, run: _Run, sign: int) -> None:
        """sign +1: a run of binds takes its resources, devices and queue amounts; -1: gives them back."""
        np.add.at(self.held, run.nodes, sign * run.amounts)
        if len(run.devices):
            np.add.at(self.dev_held, run.devices, sign * run.dev_amounts)
        queues = self.queue_of_pod[run.pods]
        ok = queues >= 0
        if ok.any():
            table = np.where(ok[:, None], self._ancestor_table()[np.maximum(queues, 0)], -1)  # pod-major
            rows = table.ravel()
            which = np.repeat(np.arange(len(run.pods)), table.shape[1])
            keep = rows >= 0
            np.add.at(self.ledger.allocated, rows[keep], sign * run.queue_amounts[which[keep]])
            keep &= run.non_preemptible[which]
            if keep.any():
                np.add.at(self.ledger.allocated_np, rows[keep], sign * run.queue_amounts[which[keep]])

    def evict(self, p: int, reason: str, beneficiary: int) -> None:
        self.evict_many([p], reason, beneficiary)

    def evict_many(self, pods: list[int], reason: str, beneficiary: int) -> None:
        """Evict each of `pods` (distinct), in order: one "evict" op each in the log; the resources turn releasing
        and leave the pods' queues (a pod not bound, pipelined or placed counts for no queue) in one vectorised
        step, in op order (_apply_evictions), so the queue ledger's float sums are the one-by-one ones."""
        if not pods:
            return
        st = self.state
        arr = np.asarray(pods, dtype=np.int64)
        nodes = self.node[arr]
        node_list = nodes.tolist()
        amounts = st.pod_req[arr].copy()
        qas = self.queue_request(arr, nodes)
        groups = st.pod_pg[arr]
        np_flags = ((groups >= 0) & ~st.pg_preemptible.astype(bool)[np.maximum(groups, 0)]).tolist() \
            if st.n_groups else [False] * len(pods)  # is_preemptible: a pod without a group is preemptible
        prevs = self.status[arr].tolist()
        gpu_mem = st.pod_gpu_mem[arr].tolist()
        ops = []
        for i, p in enumerate(pods):
            n = node_list[i]
            if gpu_mem[i]:
                amounts[i, R_GPU] = self.gpu_per_device(p, n) * int(st.pod_gpu_ndev[p])
            devices = self.pod_devices(p)
            per_dev = self.gpu_per_device(p, n) if devices else 0
            prev = prevs[i]
            qa = qas[i] if prev in ACTIVE else qas[i] * 0
            self.status[p] = PodStatus.RELEASING
            self.evictions[p] = Eviction(p, reason, beneficiary)
            op = _Op("evict", p, n, devices, prev, amounts[i], per_dev, qa, np_flags[i])
            self._log(op)
            self._evict_op[p] = op
            ops.append(op)
        self._apply_evictions(ops, 1)
        self._touch_many(node_list)

    def unevict(self, p: int) -> None:
        """Take back the eviction of p made in this session (the pod keeps running as if never chosen)."""
        ev = self._evict_op[p]
        self._apply_eviction(ev, -1)
        self.status[p] = ev.prev_status
        eviction = self.evictions.pop(p)
        self._log(_Op("unevict", p, ev.node, ev.devices, ev.prev_status, ev.amount, ev.dev_amount,
                            ev.queue_amount, ev.non_preemptible, eviction=eviction))
        self._touch(ev.node)

    def unevict_many(self, pods: list[int]) -> None:
        """unevict for many pods at once (one log entry, vectorised; same result as one by one in this order)."""
        if not pods:
            return
        ops = [self._evict_op[p] for p in pods]
        self._apply_evictions(ops, -1)
        batch = []
        for op in ops:
            self.status[op.pod] = op.prev_status
            batch.append((op, self.evictions.pop(op.pod)))
        self._log(_Op("unevict_many", -1, -1, (), 0, np.zeros(0), 0, np.zeros(0), False, batch=batch))
        self._touch_many([op.node for op in ops])

    def _apply_evictions(self, ops: list[_Op], sign: int) -> None:
        """_apply_eviction of each op, in order (np.add.at applies repeated indices one after the other, so the
        queue ledger's float sums come out as the op-by-op loop's)."""
        nodes = np.fromiter((op.node for op in ops), dtype=np.int64, count=len(ops))
        amounts = np.stack([op.amount for op in ops])
        np.add.at(self.held, nodes, -sign * amounts)
        np.add.at(self.rel, nodes, sign * amounts)
        devs = [d for op in ops for d in op.devices]
        if devs:
            per = np.array([op.dev_amount for op in ops for _ in op.devices], dtype=self.dev_held.dtype)
            np.add.at(self.dev_held, devs, -sign * per)
            np.add.at(self.dev_rel, devs, sign * per)
        pad = self._ancestor_table()
        queues = self.queue_of_pod[np.fromiter((op.pod for op in ops), dtype=np.int64, count=len(ops))]
        ok = queues >= 0
        if ok.any():
            qa = -sign * np.stack([op.queue_amount for op in ops])
            table = np.where(ok[:, None], pad[np.maximum(queues, 0)], -1)  # pod-major: ops in order
            rows = table.ravel()
            which = np.repeat(np.arange(len(ops)), table.shape[1])
            keep = rows >= 0
            np.add.at(self.ledger.allocated, rows[keep], qa[which[keep]])
            np_flag = np.fromiter((op.non_preemptible for op in ops), dtype=bool, count=len(ops))
            if np_flag.any():
                keep &= np_flag[which]
                np.add.at(self.ledger.allocated_np, rows[keep], qa[which[keep]])

    def _ancestor_table(self) -> np.ndarray:
        """int64[Q, depth]: each queue's ledger ancestors (itself first), padded with -1."""
        if self._anc_pad is None:
            anc = self.ledger.ancestors
            depth = max((len(a) for a in anc), default=1)
            pad = np.full((len(anc), max(depth, 1)), -1, dtype=np.int64)
            for q, a in enumerate(anc):
                pad[q, :len(a)] = a
            self._anc_pad = pad
        return self._anc_pad

    def _apply_eviction(self, op: _Op, sign: int) -> None:
        """sign +1: the pod's resources turn releasing and leave its queue; -1: back."""
        n = op.node
        self.held[n] -= sign * op.amount
        self.rel[n] += sign * op.amount
        for d in op.devices:
            self.dev_held[d] -= sign * op.dev_amount
            self.dev_rel[d] += sign * op.dev_amount
        self.ledger.add(int(self.queue_of_pod[op.pod]), -sign * op.queue_amount, non_preemptible=op.non_preemptible)

    def convert_to_pipelined(self, pods: list[int]) -> None:
        """KAI: when any task of a gang must wait for releases, the whole gang waits (pipelined). The pods keep
        the resources they were given (free now); they are bound together once the rest is released."""
        self.version += 1
        for p in pods:
            if int(self.status[p]) == ALLOCATED:
                self._log(_Op("pipeline", p, int(self.node[p]), (), ALLOCATED, np.zeros(0), 0, np.zeros(0),
                                    False))
                self.status[p] = PodStatus.PIPELINED
                old = self.placements[p]
                self.placements[p] = Placement(old.pod, old.node, old.devices, True)
                n = int(self.node[p])
                for d in self.devices.get(p, ()):
                    self.dev_piped[d] += self.gpu_per_device(p, n)

    def rollback(self, checkpoint: int) -> None:
        changed = len(self.log) > checkpoint
        self._undo(checkpoint)
        while self._marks and self._marks[-1][0] > checkpoint:
            self._marks.pop()
        if changed and self._marks and self._marks[-1][0] == checkpoint:
            _, allocated, allocated_np = self._marks[-1]
            self.ledger.allocated[...] = allocated
            self.ledger.allocated_np[...] = allocated_np

    def _undo(self, checkpoint: int) -> None:
        while len(self.log) > checkpoint:
            if self.log[-1].kind == "evict":  # a run of evictions is undone at once
                run: list[_Op] = []
                while len(self.log) > checkpoint and self.log[-1].kind == "evict":
                    run.append(self.log.pop())
                self._apply_evictions(run, -1)
                for op in run:
                    self.status[op.pod] = op.prev_status
                    del self.evictions[op.pod]
                self._touch_many([op.node for op in run])
                continue
            op = self.log.pop()
            p, n = op.pod, op.node
            if op.kind == "place_run":
                assert op.run is not None
                self._apply_run(op.run, -1)
                self.status[op.run.pods] = op.run.prev_status
                self.node[op.run.pods] = -1
                for q in op.run.pods.tolist():
                    self.devices.pop(q, None)
                    del self.placements[q]
                self._touch_many(op.run.nodes.tolist())
                continue
            if op.kind == "unevict_many":
                assert op.batch is not None
                ops = [o for o, _ in reversed(op.batch)]
                self._apply_evictions(ops, +1)
                for o, eviction in op.batch:
                    self.status[o.pod] = PodStatus.RELEASING
                    self.evictions[o.pod] = eviction
                self._touch_many([o.node for o in ops])
                continue
            if op.kind == "pipeline":
                self.status[p] = ALLOCATED
                old = self.placements[p]
                self.placements[p] = Placement(old.pod, old.node, old.devices, False)
                for d in self.devices.get(p, ()):
                    self.dev_piped[d] -= self.gpu_per_device(p, n)
                continue
            if op.kind == "unevict":
                self._apply_eviction(op, +1)
                self.status[p] = PodStatus.RELEASING
                assert op.eviction is not None
                self.evictions[p] = op.eviction
                self._touch(n)
                continue
            q = int(self.queue_of_pod[p])
            if op.kind in ("place", "move"):
                self.held[n] -= op.amount
                for d in op.devices:
                    self.dev_held[d] -= op.dev_amount
                if op.claimed is not None:
                    for d in op.devices:
                        self.dev_piped[d] -= op.dev_amount
                    self.rel[n] += op.claimed
                    for d, c in zip(op.devices, op.dev_claimed, strict=True):
                        self.dev_rel[d] += c
                self.ledger.add(q, -op.queue_amount, non_preemptible=op.non_preemptible)
                if op.kind == "move":
                    del self.moves[p]
                else:
                    self.status[p] = op.prev_status
                    self.node[p] = -1
                    self.devices.pop(p, None)
                    del self.placements[p]
            else:  # evict
                self._apply_eviction(op, -1)
                self.status[p] = op.prev_status
                del self.evictions[p]
            self._touch(n)

    def _touch_many(self, nodes: list[int]) -> None:
        self.version += len(nodes)
        self.touched.extend(nodes)
        self._dirty.update(nodes)

    def _touch(self, n: int) -> None:
        self.version += 1
        self.touched.append(n)
        self._dirty.add(n)
