"""A cycle's mutable simulation state, changed only through typed operations and undone exactly (KAI's Statement).

Resources per node are split into `held` (bound, newly placed or pipelined pods) and `rel` (pods being
released). Free now = allocatable - held - rel; free once releases finish = allocatable - held. GPU devices
follow the same split in milli-GPUs.

The state-changing API is the Session's: checkpoint / rollback / commit around the operations place, place_many,
evict, evict_many, evict_each, unevict, unevict_many and convert_to_pipelined. Each operation appends one typed
record to the log (Allocate, AllocateRun, Pipeline, Evict, Move, Unevict, UnevictMany) that carries its own undo; a
rollback undoes the records above its checkpoint, newest first. The arrays readers see (held, rel, dev_held, dev_rel,
dev_piped, status, node) are read-only views of the session's own. Every cache over the state is declared in
SessionCaches with the rule that keeps it valid.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import ClassVar, TypeVar

import numpy as np

from kai_opt.config import Config
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.share import FairShare
from kai_opt.plan import Eviction, Placement
from kai_opt.state import R_GPU, ClusterState, PodStatus
from kai_opt.state.segments import concat_ranges
from kai_opt.usage import pod_queue

ACTIVE = (PodStatus.BOUND, PodStatus.PIPELINED, PodStatus.ALLOCATED)  # counts towards a gang's minMember
IS_ACTIVE = np.zeros(16, dtype=bool)  # status -> in ACTIVE (a table lookup instead of np.isin in hot loops)
IS_ACTIVE[list(ACTIVE)] = True
DEV = 1000  # milli-GPU per device
T = TypeVar("T")
FEW_TOUCHED = 256  # touched_since: up to this many entries, a Python set sorts them faster than np.unique
MEMO_STATES = 4  # states whose memo() results are kept (a search returns to the state it started from)
_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


def _read_only(a: np.ndarray) -> np.ndarray:
    """A view of `a` that cannot be written through (the session writes `a` itself; readers see the change)."""
    v = a.view()
    v.flags.writeable = False
    return v


class SessionCaches:
    """Every cache kept over a session's state, each with the rule that keeps it valid. The session calls touch /
    touch_many for each node an operation (or its undo) changes and bump() for a change that moves no resource;
    readers only read these."""

    __slots__ = ("_memo", "_static", "dirty", "touched", "version")

    def __init__(self) -> None:
        # +1 per node an operation or undo changes (and per pipeline conversion): equal versions mean no change
        # since; version == seen + 1 means exactly one single-node change since (the placer's last-choice cache)
        self.version = 0
        # every node whose resources changed, in order, never shortened: a reader that keeps how many entries it
        # has read refreshes only the nodes after them (the placer's fragmentation scorer)
        self.touched: list[int] = []
        # nodes whose GPU summaries (Session.whole_idle, whole_future, max_idle, max_future) are stale: the session
        # recomputes them, and empties the set, on the next read of a summary
        self.dirty: set[int] = set()
        # state_id -> key -> result (Session.memo): a result is valid while the session's state_id is the one it was
        # made in; the MEMO_STATES most recently used states are kept
        self._memo: OrderedDict[int, dict[object, object]] = OrderedDict()
        # key -> result (static()): depends on the snapshot, fair share and config only, valid for the whole session
        self._static: dict[str, object] = {}

    def touch(self, n: int) -> None:
        self.version += 1
        self.touched.append(n)
        self.dirty.add(n)

    def touch_many(self, nodes: list[int]) -> None:
        self.version += len(nodes)
        self.touched.extend(nodes)
        self.dirty.update(nodes)

    def bump(self) -> None:
        self.version += 1

    def changed_since(self, seen: int, n_nodes: int) -> np.ndarray | None:
        """For a reader that kept rows per node as of `seen` entries of `touched`: the nodes to make again
        (touched_since; empty when none), or None when more than a quarter of `n_nodes` entries were logged since
        (all rows made again at once cost less than so many one by one)."""
        logged = len(self.touched) - seen
        if logged == 0:
            return _EMPTY
        return None if logged > n_nodes // 4 else self.touched_since(seen)

    def touched_since(self, seen: int) -> np.ndarray:
        """The distinct nodes logged after the first `seen` entries of `touched`, ascending."""
        tail = self.touched[seen:]
        if len(tail) <= FEW_TOUCHED:  # (most calls: the nodes of one placement or two)
            return np.array(sorted(set(tail)), dtype=np.int64)
        return np.unique(np.asarray(tail, dtype=np.int64))

    def memo(self, state_id: int, key: object, make: Callable[[], T]) -> T:
        memo = self._memo.get(state_id)
        if memo is None:
            memo = self._memo[state_id] = {}
            while len(self._memo) > MEMO_STATES:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(state_id)
        if key in memo:
            return memo[key]  # type: ignore[return-value]
        out = memo[key] = make()
        return out

    def static(self, key: str, make: Callable[[], T]) -> T:
        if key in self._static:
            return self._static[key]  # type: ignore[return-value]
        out = self._static[key] = make()
        return out


# -- operations: one record per change, each with its undo ----------------------------------------------------------
class Op:
    """A logged change of the session. `serial` is unique per op of a session (Session.state_id)."""

    __slots__ = ("serial",)
    kind: ClassVar[str]
    serial: int

    def undo(self, sess: Session) -> None:
        raise NotImplementedError

    @classmethod
    def undo_all(cls, sess: Session, ops: list[Op]) -> None:
        """Undo a run of consecutive ops of this class, newest first (as popped from the log)."""
        for op in ops:
            op.undo(sess)


class PodOp(Op):
    """A change of one pod on one node: what it moved, so its undo moves it back."""

    __slots__ = (
        "_amount_list",
        "amount",
        "dev_amount",
        "devices",
        "node",
        "non_preemptible",
        "pod",
        "prev_status",
        "queue_amount",
    )

    def __init__(self, pod: int, node: int, devices: tuple[int, ...], prev_status: int, amount: np.ndarray,
                 dev_amount: int, queue_amount: np.ndarray, non_preemptible: bool) -> None:
        self.pod = pod
        self.node = node
        self.devices = devices  # global device indexes
        self.prev_status = prev_status  # the pod's status before the op
        self.amount = amount  # node resources moved
        self.dev_amount = dev_amount  # milli-GPU on each of `devices`
        self.queue_amount = queue_amount  # the pod's queue resources moved
        self.non_preemptible = non_preemptible
        self._amount_list: list[int] | None = None

    def amount_list(self) -> list[int]:
        """`amount` as Python ints (made once)."""
        if self._amount_list is None:
            self._amount_list = self.amount.tolist()
        return self._amount_list


class Allocate(PodOp):
    """Pending pod bound (or pipelined: `claimed` set) on a node in this cycle."""

    __slots__ = ("claimed", "dev_claimed")
    kind = "place"

    def __init__(self, pod: int, node: int, devices: tuple[int, ...], prev_status: int, amount: np.ndarray,
                 dev_amount: int, queue_amount: np.ndarray, non_preemptible: bool, claimed: np.ndarray | None,
                 dev_claimed: tuple[int, ...]) -> None:
        super().__init__(pod, node, devices, prev_status, amount, dev_amount, queue_amount, non_preemptible)
        self.claimed = claimed  # pipelined: the releasing resources it claimed (None: bound now)
        self.dev_claimed = dev_claimed  # pipelined: releasing milli-GPU it claimed on each of `devices`

    def undo(self, sess: Session) -> None:
        n = self.node
        sess._held[n] -= self.amount
        for d in self.devices:
            sess._dev_held[d] -= self.dev_amount
        if self.claimed is not None:
            for d in self.devices:
                sess._dev_piped[d] -= self.dev_amount
            sess._rel[n] += self.claimed
            for d, c in zip(self.devices, self.dev_claimed, strict=True):
                sess._dev_rel[d] += c
        sess.ledger.add(int(sess.queue_of_pod[self.pod]), -self.queue_amount, non_preemptible=self.non_preemptible)
        self._forget(sess)
        sess.caches.touch(n)

    def _forget(self, sess: Session) -> None:
        p = self.pod
        sess._status[p] = self.prev_status
        sess._node[p] = -1
        sess.devices.pop(p, None)
        del sess.placements[p]


class Move(Allocate):
    """An evicted pod re-placed by consolidation (pipelined onto its new node; it keeps its status and node)."""

    __slots__ = ()
    kind = "move"

    def _forget(self, sess: Session) -> None:
        del sess.moves[self.pod]


class Pipeline(Op):
    """A pod allocated in this cycle turned pipelined (its gang waits for releases); it keeps its resources."""

    __slots__ = ("node", "pod")
    kind = "pipeline"
    prev_status = PodStatus.ALLOCATED

    def __init__(self, pod: int, node: int) -> None:
        self.pod = pod
        self.node = node

    def undo(self, sess: Session) -> None:
        p = self.pod
        sess._status[p] = PodStatus.ALLOCATED
        old = sess.placements[p]
        sess.placements[p] = Placement(old.pod, old.node, old.devices, False)
        for d in sess.devices.get(p, ()):
            sess._dev_piped[d] -= sess.gpu_per_device(p, self.node)


class Evict(PodOp):
    """A pod evicted: its resources turn releasing and leave its queue."""

    __slots__ = ()
    kind = "evict"

    def undo(self, sess: Session) -> None:
        Evict.undo_all(sess, [self])

    @classmethod
    def undo_all(cls, sess: Session, ops: list[Op]) -> None:
        run: list[Evict] = ops  # type: ignore[assignment]  # undo_all is only called with ops of its class
        sess._apply_evictions(run, -1)
        for op in run:
            sess._status[op.pod] = op.prev_status
            del sess.evictions[op.pod]
        sess.caches.touch_many([op.node for op in run])


class Unevict(Op):
    """An eviction made in this session taken back (the pod keeps running as if never chosen)."""

    __slots__ = ("evict", "eviction")
    kind = "unevict"

    def __init__(self, evict: Evict, eviction: Eviction) -> None:
        self.evict = evict
        self.eviction = eviction

    def undo(self, sess: Session) -> None:
        ev = self.evict
        sess._apply_eviction(ev, +1)
        sess._status[ev.pod] = PodStatus.RELEASING
        sess.evictions[ev.pod] = self.eviction
        sess.caches.touch(ev.node)


class _ManyPods:
    """An op over many pods: the single-pod fields of a log record read as none."""

    __slots__ = ()

    pod: ClassVar[int] = -1
    node: ClassVar[int] = -1
    devices: ClassVar[tuple[int, ...]] = ()
    prev_status: ClassVar[int] = 0
    amount: ClassVar[np.ndarray] = _EMPTY
    dev_amount: ClassVar[int] = 0
    queue_amount: ClassVar[np.ndarray] = _EMPTY
    non_preemptible: ClassVar[bool] = False


class UnevictMany(_ManyPods, Op):
    """Unevict of many pods at once (Session.unevict_many), in order."""

    __slots__ = ("batch",)
    kind = "unevict_many"

    def __init__(self, batch: list[tuple[Evict, Eviction]]) -> None:
        self.batch = batch  # the eviction ops taken back and their evictions, in order

    def undo(self, sess: Session) -> None:
        ops = [o for o, _ in reversed(self.batch)]
        sess._apply_evictions(ops, +1)
        for o, eviction in self.batch:
            sess._status[o.pod] = PodStatus.RELEASING
            sess.evictions[o.pod] = eviction
        sess.caches.touch_many([o.node for o in ops])


class AllocateRun(_ManyPods, Op):
    """A run of placements made at once (Session.place_many): per pod, in order; pipelined ones (`piped`) also
    claim releasing room (`claimed` per pod, `dev_claimed` per entry of `run_devices`), as `Allocate` records."""

    __slots__ = ("amounts", "claimed", "dev_amounts", "dev_claimed", "dev_piped", "flags", "nodes", "piped", "pods",
                 "prev_statuses", "queue_amounts", "run_devices")
    kind = "place_run"

    def __init__(self, pods: np.ndarray, nodes: np.ndarray, amounts: np.ndarray, run_devices: np.ndarray,
                 dev_amounts: np.ndarray, queue_amounts: np.ndarray, flags: np.ndarray,
                 prev_statuses: np.ndarray, piped: np.ndarray | None = None, claimed: np.ndarray | None = None,
                 dev_claimed: np.ndarray | None = None, dev_piped: np.ndarray | None = None) -> None:
        self.pods = pods
        self.nodes = nodes
        self.amounts = amounts  # node resources taken
        self.run_devices = run_devices  # global devices, pod after pod
        self.dev_amounts = dev_amounts  # milli-GPU on each of `run_devices`
        self.queue_amounts = queue_amounts
        self.flags = flags  # non-preemptible, per pod
        self.prev_statuses = prev_statuses
        self.piped = piped  # pipelined, per pod (None: every pod bound)
        self.claimed = claimed  # releasing resources each pod claimed (pipelined ones; 0 for the others)
        self.dev_claimed = dev_claimed  # releasing milli-GPU claimed on each of `run_devices`
        self.dev_piped = dev_piped  # each of `run_devices` is a pipelined pod's

    def undo(self, sess: Session) -> None:
        sess._apply_run(self, -1)
        sess._status[self.pods] = self.prev_statuses
        sess._node[self.pods] = -1
        for q in self.pods.tolist():
            sess.devices.pop(q, None)
            del sess.placements[q]
        sess.caches.touch_many(self.nodes.tolist())


class _Mark:
    """The queue ledger at an open checkpoint (a rollback restores it exactly: undoing float additions could
    leave last-bit differences behind); `refs`: checkpoints at this log length not yet committed."""

    __slots__ = ("allocated", "allocated_np", "at", "refs")

    def __init__(self, at: int, allocated: np.ndarray, allocated_np: np.ndarray) -> None:
        self.at = at
        self.allocated = allocated
        self.allocated_np = allocated_np
        self.refs = 1


class Session:
    def __init__(self, state: ClusterState, fs: FairShare, config: Config) -> None:
        self.state = state
        self.fs = fs
        self.cfg = config
        self.alloc = state.node_alloc
        # held: stays once releases finish (bound + pipelined); rel: being released and not yet claimed
        self._held = state.node_used - state.node_releasing + state.node_pipelined
        self._rel = np.maximum(state.node_releasing - state.node_pipelined, 0)
        self._dev_held = state.dev_used - state.dev_releasing + state.dev_pipelined
        self._dev_rel = np.maximum(state.dev_releasing - state.dev_pipelined, 0)
        self._dev_piped = state.dev_pipelined.copy()  # milli-GPU reserved by pods waiting to bind (shared devices)
        self._status = state.pod_status.astype(np.int8).copy()
        self._node = state.pod_node.copy()
        self.held, self.rel = _read_only(self._held), _read_only(self._rel)
        self.dev_held, self.dev_rel = _read_only(self._dev_held), _read_only(self._dev_rel)
        self.dev_piped = _read_only(self._dev_piped)
        self.status, self.node = _read_only(self._status), _read_only(self._node)
        self.dev_start = state.dev_start
        self.dev_node = state.dev_node
        self.devices: dict[int, tuple[int, ...]] = {}  # global device indexes of pods placed in this cycle
        self.ledger = QueueLedger.start(state, fs)
        self.queue_of_pod = pod_queue(state)
        self.log: list[Op] = []
        self.placements: dict[int, Placement] = {}
        self.moves: dict[int, Placement] = {}
        self.evictions: dict[int, Eviction] = {}
        self.caches = SessionCaches()
        self._serial = 0
        self._marks: list[_Mark] = []  # open checkpoints, by log length
        # pod -> an eviction op of it (unevict undoes it; a pod's evictions in one session are all alike)
        self._evict_op: dict[int, Evict] = {}
        self.eviction_ops: Mapping[int, Evict] = MappingProxyType(self._evict_op)  # read-only view
        n = state.n_nodes
        # GPU summaries per node, brought up to date lazily (SessionCaches.dirty)
        self._whole_idle = np.zeros(n, dtype=np.int64)  # devices with nothing on them now
        self._whole_future = np.zeros(n, dtype=np.int64)  # devices free once releases finish
        self._max_idle = np.zeros(n, dtype=np.int64)  # most milli-GPU free now on one device
        self._max_future = np.zeros(n, dtype=np.int64)
        self._refresh_gpu_summary(np.arange(n))

    # -- GPU summaries per node --------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self.caches.dirty:
            nodes = np.fromiter(self.caches.dirty, dtype=np.int64, count=len(self.caches.dirty))
            self.caches.dirty.clear()
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
    def _log(self, op: Op) -> None:
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
        return self.caches.memo(self.state_id, key, make)

    def static(self, key: str, make: Callable[[], T]) -> T:
        """make(), computed once per session (a result that depends on the snapshot, fair share and config only).
        Results are shared: callers must not change them."""
        return self.caches.static(key, make)

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

    # -- the state-changing API: checkpoint / rollback / commit around the operations --------------------------
    def checkpoint(self) -> int:
        """Open a checkpoint at the current state; close it with rollback (back to it) or commit (keep)."""
        cp = len(self.log)  # marks above the log's length were dropped by the rollback that shortened it
        marks = self._marks
        if marks and marks[-1].at == cp:
            marks[-1].refs += 1
        else:
            marks.append(_Mark(cp, self.ledger.allocated.copy(), self.ledger.allocated_np.copy()))
        return cp

    def rollback(self, checkpoint: int) -> None:
        """Undo every op since `checkpoint`, newest first; the checkpoint stays open (roll back to it again, or
        commit it), the ones opened after it are closed."""
        log = self.log
        changed = len(log) > checkpoint
        while len(log) > checkpoint:
            cls = type(log[-1])
            run = [log.pop()]
            while len(log) > checkpoint and type(log[-1]) is cls:
                run.append(log.pop())
            cls.undo_all(self, run)
        marks = self._marks
        while marks and marks[-1].at > checkpoint:
            marks.pop()
        if changed and marks and marks[-1].at == checkpoint:
            mark = marks[-1]
            self.ledger.allocated[...] = mark.allocated
            self.ledger.allocated_np[...] = mark.allocated_np

    def commit(self, checkpoint: int) -> None:
        """Keep every op since `checkpoint` and close it (a rollback to an earlier checkpoint still undoes them)."""
        marks = self._marks
        for i in range(len(marks) - 1, -1, -1):
            if marks[i].at == checkpoint:
                marks[i].refs -= 1
                if marks[i].refs == 0:
                    del marks[i]
                return
            if marks[i].at < checkpoint:
                return

    def place(self, p: int, n: int, devices: tuple[int, ...], *, pipelined: bool, moved: bool = False) -> None:
        """Bind (or pipeline) pending pod p on node n; `moved`: a consolidation re-placement of an evicted pod."""
        amount = self.pod_node_amount(p, n)
        per_dev = self.gpu_per_device(p, n) if devices else 0
        self._held[n] += amount
        for d in devices:
            self._dev_held[d] += per_dev
        claimed = None
        dev_claimed: tuple[int, ...] = ()
        if pipelined:
            for d in devices:
                self._dev_piped[d] += per_dev
            claimed = np.minimum(amount, self._rel[n])
            self._rel[n] -= claimed
            dev_claimed = tuple(int(min(per_dev, self._dev_rel[d])) for d in devices)
            for d, c in zip(devices, dev_claimed, strict=True):
                self._dev_rel[d] -= c
        q = int(self.queue_of_pod[p])
        qa = self.queue_request([p], np.array([n]))[0]
        np_flag = not self.is_preemptible(p)
        self.ledger.add(q, qa, non_preemptible=np_flag)
        prev = int(self._status[p])
        if moved:
            self.moves[p] = Placement(p, n, tuple(d - int(self.dev_start[n]) for d in devices), True, True)
        else:
            self._status[p] = PodStatus.PIPELINED if pipelined else PodStatus.ALLOCATED
            self._node[p] = n
            self.devices[p] = devices
            self.placements[p] = Placement(p, n, tuple(d - int(self.dev_start[n]) for d in devices), pipelined)
        self._log((Move if moved else Allocate)(p, n, devices, prev, amount, per_dev, qa, np_flag, claimed,
                                                dev_claimed))
        self.caches.touch(n)

    def place_many(self, items: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """place() for each (pod, node, devices, pipelined), in order, as one AllocateRun op (undone as a whole):
        the same state and queue ledger float sums as one place() per item. The resources, devices and queue
        ledger are updated in one vectorised step each (the ledger's sums in item order); a pipelined pod claims
        the releasing room left on its node and devices after the pipelined items before it."""
        if not items:
            return
        k = len(items)
        counts = np.fromiter((len(it[2]) for it in items), dtype=np.int64, count=k)
        nodes = np.fromiter((it[1] for it in items), dtype=np.int64, count=k)
        devs = np.fromiter((d for it in items for d in it[2]), dtype=np.int64, count=int(counts.sum()))
        base = np.repeat(self.dev_start[nodes], counts)
        self._place_run(np.fromiter((it[0] for it in items), dtype=np.int64, count=k), nodes,
                        np.fromiter((it[3] for it in items), dtype=bool, count=k), devs, counts,
                        [Placement(p, n, tuple(d - b for d, b in zip(ds, bs, strict=True)), piped)
                         for (p, n, ds, piped), bs in zip(items, _split(base.tolist(), counts), strict=True)],
                        [it[2] for it in items])

    def place_plan(self, placements: list[Placement]) -> None:
        """place_many for a plan's own placements (devices within their node; none of them a move), in order."""
        if not placements:
            return
        k = len(placements)
        counts = np.fromiter((len(pl.devices) for pl in placements), dtype=np.int64, count=k)
        nodes = np.fromiter((pl.node for pl in placements), dtype=np.int64, count=k)
        devs = np.fromiter((d for pl in placements for d in pl.devices), dtype=np.int64, count=int(counts.sum())) \
            + np.repeat(self.dev_start[nodes], counts)
        self._place_run(np.fromiter((pl.pod for pl in placements), dtype=np.int64, count=k), nodes,
                        np.fromiter((pl.pipelined for pl in placements), dtype=bool, count=k), devs, counts,
                        placements, [tuple(ds) for ds in _split(devs.tolist(), counts)])

    def _place_run(self, pods: np.ndarray, nodes: np.ndarray, piped: np.ndarray, devs: np.ndarray,
                   counts: np.ndarray, placements: list[Placement], global_devs: list[tuple[int, ...]]) -> None:
        """One AllocateRun: pod i goes to nodes[i] on the global devices devs[sum(counts[:i]):][:counts[i]]
        (also global_devs[i]); placements[i] is its record."""
        st = self.state
        k = len(pods)
        amounts = st.pod_req[pods].copy()
        per_dev = st.pod_gpu_per_device_many(pods, nodes)
        mem = st.pod_gpu_mem[pods] > 0
        amounts[mem, R_GPU] = per_dev[mem] * st.pod_gpu_ndev[pods[mem]]
        per_dev[counts == 0] = 0
        dev_amounts = np.repeat(per_dev, counts)
        claimed = np.zeros_like(amounts)
        dev_claimed = np.zeros(len(devs), dtype=np.int64)
        any_piped = bool(piped.any())
        if any_piped:  # releasing room, claimed in item order (what is left after the claims before)
            rel: dict[int, np.ndarray] = {}
            dev_rel: dict[int, int] = {}
            dev_at = np.r_[0, np.cumsum(counts)].tolist()
            for i in np.flatnonzero(piped).tolist():
                n = int(nodes[i])
                left = rel.get(n)
                if left is None:
                    left = rel[n] = self._rel[n].copy()
                claimed[i] = np.minimum(amounts[i], left)
                left -= claimed[i]
                for j in range(dev_at[i], dev_at[i + 1]):
                    d = int(devs[j])
                    have = dev_rel.get(d, int(self._dev_rel[d]))
                    dev_claimed[j] = min(int(per_dev[i]), have)
                    dev_rel[d] = have - int(dev_claimed[j])
        qas = self.queue_request(pods, nodes)
        groups = st.pod_pg[pods]
        np_flags = (groups >= 0) & ~st.pg_preemptible.astype(bool)[np.maximum(groups, 0)] if st.n_groups \
            else np.zeros(k, dtype=bool)  # is_preemptible: a pod without a group is preemptible
        prevs = self._status[pods].copy()
        op = AllocateRun(pods, nodes, amounts, devs, dev_amounts, qas, np_flags, prevs,
                         *((piped, claimed, dev_claimed, np.repeat(piped, counts)) if any_piped else ()))
        self._apply_run(op, 1)
        self._status[pods] = np.where(piped, PodStatus.PIPELINED, PodStatus.ALLOCATED)
        self._node[pods] = nodes
        pod_list = pods.tolist()
        self.devices.update(zip(pod_list, global_devs, strict=True))
        self.placements.update(zip(pod_list, placements, strict=True))
        self._log(op)
        self.caches.touch_many(nodes.tolist())

    def _apply_run(self, run: AllocateRun, sign: int) -> None:
        """sign +1: a run of placements takes its resources, devices, queue amounts and (pipelined pods) the
        releasing room they claimed; -1: gives them back."""
        np.add.at(self._held, run.nodes, sign * run.amounts)
        if len(run.run_devices):
            np.add.at(self._dev_held, run.run_devices, sign * run.dev_amounts)
        if run.piped is not None:
            assert run.claimed is not None and run.dev_claimed is not None and run.dev_piped is not None
            np.add.at(self._rel, run.nodes, -sign * run.claimed)
            if len(run.run_devices):
                np.add.at(self._dev_rel, run.run_devices, -sign * run.dev_claimed)
                on = run.dev_piped
                np.add.at(self._dev_piped, run.run_devices[on], sign * run.dev_amounts[on])
        queues = self.queue_of_pod[run.pods]
        ok = queues >= 0
        if ok.any():
            table = np.where(ok[:, None], self._ancestor_table()[np.maximum(queues, 0)], -1)  # pod-major
            rows = table.ravel()
            which = np.repeat(np.arange(len(run.pods)), table.shape[1])
            keep = rows >= 0
            np.add.at(self.ledger.allocated, rows[keep], sign * run.queue_amounts[which[keep]])
            keep &= run.flags[which]
            if keep.any():
                np.add.at(self.ledger.allocated_np, rows[keep], sign * run.queue_amounts[which[keep]])

    def evict(self, p: int, reason: str, beneficiary: int) -> None:
        self.evict_many([p], reason, beneficiary)

    def evict_many(self, pods: list[int], reason: str, beneficiary: int) -> None:
        """Evict each of `pods` (distinct), in order: one Evict op each in the log; the resources turn releasing
        and leave the pods' queues (a pod not bound, pipelined or placed counts for no queue) in one vectorised
        step, in op order (_apply_evictions), so the queue ledger's float sums are the one-by-one ones."""
        self.evict_each(pods, [reason] * len(pods), [beneficiary] * len(pods))

    def evict_each(self, pods: list[int], reasons: list[str], beneficiaries: list[int]) -> None:
        """evict_many with a reason and a beneficiary per pod: the same ops, state and float sums as one evict_many
        per pod in this order (a replayed plan's evictions in one step)."""
        if not pods:
            return
        st = self.state
        arr = np.asarray(pods, dtype=np.int64)
        nodes = self._node[arr]
        node_list = nodes.tolist()
        amounts = st.pod_req[arr].copy()
        qas = self.queue_request(arr, nodes)
        groups = st.pod_pg[arr]
        np_flags = ((groups >= 0) & ~st.pg_preemptible.astype(bool)[np.maximum(groups, 0)]).tolist() \
            if st.n_groups else [False] * len(pods)  # is_preemptible: a pod without a group is preemptible
        prevs = self._status[arr].tolist()
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
            self._status[p] = PodStatus.RELEASING
            self.evictions[p] = Eviction(p, reasons[i], beneficiaries[i])
            op = Evict(p, n, devices, prev, amounts[i], per_dev, qa, np_flags[i])
            self._log(op)
            self._evict_op[p] = op
            ops.append(op)
        self._apply_evictions(ops, 1)
        self.caches.touch_many(node_list)

    def unevict(self, p: int) -> None:
        """Take back the eviction of p made in this session (the pod keeps running as if never chosen)."""
        ev = self._evict_op[p]
        self._apply_eviction(ev, -1)
        self._status[p] = ev.prev_status
        self._log(Unevict(ev, self.evictions.pop(p)))
        self.caches.touch(ev.node)

    def unevict_many(self, pods: list[int]) -> None:
        """unevict for many pods at once (one log entry, vectorised; same result as one by one in this order)."""
        if not pods:
            return
        ops = [self._evict_op[p] for p in pods]
        self._apply_evictions(ops, -1)
        batch = []
        for op in ops:
            self._status[op.pod] = op.prev_status
            batch.append((op, self.evictions.pop(op.pod)))
        self._log(UnevictMany(batch))
        self.caches.touch_many([op.node for op in ops])

    def convert_to_pipelined(self, pods: list[int]) -> None:
        """KAI: when any task of a gang must wait for releases, the whole gang waits (pipelined). The pods keep
        the resources they were given (free now); they are bound together once the rest is released."""
        self.caches.bump()
        for p in pods:
            if int(self._status[p]) == PodStatus.ALLOCATED:
                n = int(self._node[p])
                self._log(Pipeline(p, n))
                self._status[p] = PodStatus.PIPELINED
                old = self.placements[p]
                self.placements[p] = Placement(old.pod, old.node, old.devices, True)
                for d in self.devices.get(p, ()):
                    self._dev_piped[d] += self.gpu_per_device(p, n)

    # -- applying evictions (used by Evict, Unevict and UnevictMany and their undo) -----------------------------
    def _apply_evictions(self, ops: list[Evict], sign: int) -> None:
        """_apply_eviction of each op, in order (np.add.at applies repeated indices one after the other, so the
        queue ledger's float sums come out as the op-by-op loop's)."""
        nodes = np.fromiter((op.node for op in ops), dtype=np.int64, count=len(ops))
        amounts = np.stack([op.amount for op in ops])
        np.add.at(self._held, nodes, -sign * amounts)
        np.add.at(self._rel, nodes, sign * amounts)
        devs = [d for op in ops for d in op.devices]
        if devs:
            per = np.array([op.dev_amount for op in ops for _ in op.devices], dtype=self._dev_held.dtype)
            np.add.at(self._dev_held, devs, -sign * per)
            np.add.at(self._dev_rel, devs, sign * per)
        self._apply_queue_amounts(ops, sign)

    def unevict_in_ledger(self, pods: list[int]) -> None:
        """The queue ledger as if `pods` (evicted in this session) ran again, and nothing else: what a victim
        simulation reads between its steps (victims._Simulation). The caller puts the ledger back as it was and
        then unevicts the same pods in the same order, which adds the same amounts in the same order."""
        self._apply_queue_amounts([self._evict_op[p] for p in pods], -1)

    def _apply_queue_amounts(self, ops: list[Evict], sign: int) -> None:
        """The queue ledger's part of _apply_evictions (np.add.at: repeated indices one after the other)."""
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
        return self.static("ancestor_table", self._make_ancestor_table)

    def _make_ancestor_table(self) -> np.ndarray:
        anc = self.ledger.ancestors
        depth = max((len(a) for a in anc), default=1)
        pad = np.full((len(anc), max(depth, 1)), -1, dtype=np.int64)
        for q, a in enumerate(anc):
            pad[q, :len(a)] = a
        return pad

    def _apply_eviction(self, op: Evict, sign: int) -> None:
        """sign +1: the pod's resources turn releasing and leave its queue; -1: back."""
        n = op.node
        self._held[n] -= sign * op.amount
        self._rel[n] += sign * op.amount
        for d in op.devices:
            self._dev_held[d] -= sign * op.dev_amount
            self._dev_rel[d] += sign * op.dev_amount
        self.ledger.add(int(self.queue_of_pod[op.pod]), -sign * op.queue_amount, non_preemptible=op.non_preemptible)


def _split(values: list[int], counts: np.ndarray) -> list[list[int]]:
    """values cut into consecutive runs of counts[i] each."""
    out, at = [], 0
    for c in counts.tolist():
        out.append(values[at:at + c])
        at += c
    return out
