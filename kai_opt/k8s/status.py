"""What a cycle tells the cluster besides binds and evictions: PodGroup status, Queue status, and Events.

PodGroup status: `schedulingConditions` as KAI's scheduler writes them, and, only with config
`runtime.podgroup_counts`, `phase` (Pending | Running | Succeeded | Failed) and pod counts (`running` = bound and
not finished, `pending`, `succeeded`, `failed`): fields of KAI's PodGroup CRD that KAI-Scheduler (72de64f) itself
leaves unset (its podgroup-controller writes `resourcesStatus` instead), off by default because keeping them
current is one more PodGroup write per group start and end (with the option off, counts a kai-opt with it on
wrote are cleared: every group is looked at in the first cycle). The conditions: while the plan leaves the group
pending, one entry `{type: UnschedulableOnNodePool, nodePool, status: "True", reason, message, reasons: [{reason,
message}], transitionID, lastTransitionTime}` built verbatim from the plan's `Reason`s (`reason` = the first
code, `message` = the messages joined by "; "); `transitionID` counts up from the last entry's, and an unchanged
entry keeps its ID and time. The entry is removed once no pod of the group is pending. A PodGroup the snapshot
rejected (malformed) gets the same entry with the snapshot's issue as reason and message.

Queue status: `allocated`, `allocatedNonPreemptible` and `requested` (resource lists: nvidia.com/gpu in devices,
cpu, memory in bytes; subtree sums at the start of the cycle), `childQueues`, and a `Valid` condition
that is False (with the issue) while the queue is rejected (e.g. its parent does not exist) and set back to True
once it is fixed.

PodGroup annotations (KAI's, read back by the engine): `kai.scheduler/stale-podgroup-timestamp` is set when a
group with running pods stays below minMember after the cycle's plan (and removed once it is whole again or has
no running pods): the stale-gang action evicts it after `stale_gang_grace_s`; `kai.scheduler/last-start-timestamp`
is set when the plan starts a group that had no running pods (the min-runtime rules measure from it).
kai-opt's own `kai-opt.io/queue-position` and `kai-opt.io/queue-position-in-queue` (1-based integers; KAI's
PodGroup CRD has no field for them) are set on every group the plan leaves pending, numbered among those in the
order the cycle took them up (kai_opt.heuristics.positions), and removed once the group is no longer pending.

Events: `FailedScheduling` (Warning) on each pending pod and `Unschedulable` (Warning) on its PodGroup with the
plan's reason messages; a Warning named by the issue's reason on every object the snapshot rejected or warned
about. `Scheduled`/`Evicted` events come from the binder's and evictor's results (see runner.py). All writes are
asynchronous on the status pool (latest status per object wins), fenced by leadership, skipped when the cached
object already shows them; a bad object never stops the others.

Only kai-opt's own objects are written (kai_opt.k8s.coexist): PodGroups named by at least one pod of ours get
status, conditions, annotations and Events; other PodGroups (KAI-Scheduler's, or with no pods yet) and other
schedulers' pods are left alone. Queue status and Queue Events are written only while `write_queues()` says so
(config runtime.queue_status; by default not while KAI-Scheduler, whose queue controller owns them, is installed).
"""

from __future__ import annotations

import json
import logging
import operator
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from kai_opt.api import Pod
from kai_opt.api.meta import format_time, now_rfc3339  # (now_rfc3339 a module name here: tests set the time)
from kai_opt.api.podgroup import LAST_START_ANNOTATION, STALE_TIMESTAMP_ANNOTATION
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.positions import Position
from kai_opt.k8s.cache import SCHEDULING_KINDS, ClusterCache
from kai_opt.k8s.client import MERGE_PATCH, PODGROUP, QUEUE, object_path, request
from kai_opt.k8s.coexist import pod_is_ours
from kai_opt.k8s.events import WARNING, EventRecorder
from kai_opt.k8s.status_changes import Members, PodGroupChanges, podgroup_key
from kai_opt.k8s.workqueue import TokenBucket, WorkPool, classify
from kai_opt.plan import Plan, Reason
from kai_opt.snapshot import Issue, Snapshot
from kai_opt.state import ClusterState, PodStatus
from kai_opt.units import GPU_RESOURCE

log = logging.getLogger(__name__)

SCHEDULING_CONDITION = "UnschedulableOnNodePool"  # KAI's SchedulingConditionType
NODE_POOL_LABEL = "kai.scheduler/node-pool"
DEFAULT_NODE_POOL = "default"
VALID_CONDITION = "Valid"
_API_VERSION = {r.kind: r.api_version for r in SCHEDULING_KINDS}
QUEUE_POSITION_ANNOTATION = "kai-opt.io/queue-position"
QUEUE_POSITION_IN_QUEUE_ANNOTATION = "kai-opt.io/queue-position-in-queue"


# -- PodGroup status -------------------------------------------------------------------------------------------------
def pod_counts(pods: list[Pod]) -> dict[str, int]:
    running = sum(1 for p in pods if p.node_name and not p.finished and not p.releasing)
    pending = sum(1 for p in pods if not p.node_name and not p.finished and not p.releasing)
    succeeded = sum(1 for p in pods if p.phase == "Succeeded")
    failed = sum(1 for p in pods if p.phase == "Failed")
    return {"running": running, "pending": pending, "succeeded": succeeded, "failed": failed}


def podgroup_phase(counts: dict[str, int], min_member: int) -> str:
    total = sum(counts.values())
    if total and counts["succeeded"] == total:
        return "Succeeded"
    if counts["running"] >= max(min_member, 1):
        return "Running"
    if counts["failed"] and not counts["running"] and not counts["pending"]:
        return "Failed"
    return "Pending"


def scheduling_condition(reasons: list[Reason], node_pool: str) -> dict[str, Any]:
    """KAI's scheduling condition from the plan's reasons (used verbatim), without transitionID/time."""
    entries = []
    for r in reasons:
        entry: dict[str, Any] = {"reason": r.code, "message": r.message}
        if isinstance(r.details, dict) and isinstance(r.details.get("queueDetails"), dict):
            entry["details"] = {"queueDetails": r.details["queueDetails"]}
        entries.append(entry)
    return {"type": SCHEDULING_CONDITION, "nodePool": node_pool, "status": "True",
            "reason": reasons[0].code if reasons else "Unschedulable",
            "message": "; ".join(r.message for r in reasons), "reasons": entries}


def _same_condition(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("type", "nodePool", "status", "reason", "message")
    return all(a.get(k) == b.get(k) for k in keys) and (a.get("reasons") or []) == (b.get("reasons") or [])


def merge_scheduling_conditions(existing: list[dict[str, Any]], new: dict[str, Any] | None, node_pool: str,
                                now: str) -> list[dict[str, Any]]:
    """The list with our entry for `node_pool` set to `new` (None: removed). An equal entry is kept as it is;
    a changed one is appended last (KAI: the newest last) with the next transitionID."""
    ours = [c for c in existing if c.get("type") == SCHEDULING_CONDITION and c.get("nodePool") == node_pool]
    others = [c for c in existing if c not in ours]
    if new is None:
        return others
    if ours and _same_condition(ours[-1], new):
        return existing
    last_id = 0
    if existing:
        try:
            last_id = int(existing[-1].get("transitionID") or 0)
        except (TypeError, ValueError):
            last_id = 0
    return [*others, {**new, "transitionID": str(last_id + 1), "lastTransitionTime": now}]


COUNT_FIELDS = ("phase", "running", "pending", "succeeded", "failed")


def podgroup_status(obj: dict[str, Any], pods: list[Pod], reasons: list[Reason] | None,
                    now: str, *, with_counts: bool = True) -> dict[str, Any]:
    """The status fields kai-opt owns for one PodGroup object: schedulingConditions, and with `with_counts` phase and
    pod counts; without, those fields are cleared (None: a merge patch removes them) so none is left stale."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    counts = pod_counts(pods)
    min_member = spec.get("minMember") if isinstance(spec.get("minMember"), int) else 1
    node_pool = ((obj.get("metadata") or {}).get("labels") or {}).get(NODE_POOL_LABEL) or DEFAULT_NODE_POOL
    existing = [c for c in (status.get("schedulingConditions") or []) if isinstance(c, dict)]
    if reasons:
        conds = merge_scheduling_conditions(existing, scheduling_condition(reasons, node_pool), node_pool, now)
    elif counts["pending"] == 0:
        conds = merge_scheduling_conditions(existing, None, node_pool, now)
    else:
        conds = existing  # placed but not bound yet (pipelined, binding): keep what is there
    if not with_counts:
        return {**dict.fromkeys(COUNT_FIELDS), "schedulingConditions": conds}
    return {"phase": podgroup_phase(counts, min_member), **counts, "schedulingConditions": conds}


def _same_inputs(a: tuple[Any, Sequence[Pod], Any], b: tuple[Any, Sequence[Pod], Any]) -> bool:
    """The same PodGroup object, the same member Pod models (identity: the snapshot reuses the model of an
    unchanged pod) and equal reasons."""
    return (a[0] is b[0] and len(a[1]) == len(b[1]) and all(map(operator.is_, a[1], b[1])) and a[2] == b[2])


def _changed(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The desired fields that differ from `current` (an empty list equals a missing field)."""
    out = {}
    for k, v in desired.items():
        have = current.get(k)
        if v == have or (v in ([], {}, 0) and have is None):
            continue
        out[k] = v
    return out


def position_annotations(ann: dict[str, Any], pos: Position | None) -> dict[str, str | None]:
    """The annotation patch that makes `ann` carry `pos` (None: no position, the annotations go)."""
    want = {QUEUE_POSITION_ANNOTATION: str(pos.overall) if pos else None,
            QUEUE_POSITION_IN_QUEUE_ANNOTATION: str(pos.in_queue) if pos else None}
    return {k: v for k, v in want.items() if ann.get(k) != v}


# -- Queue status ----------------------------------------------------------------------------------------------------
def _num(x: float) -> str:
    if abs(x - round(x)) < 1e-9:
        return str(round(x))
    return f"{x:.3f}".rstrip("0").rstrip(".")


def resource_list(row: np.ndarray) -> dict[str, str]:
    """KAI queue units (GPU devices, CPU millicores, memory bytes) as a Kubernetes resource list."""
    gpu, cpu, mem = (float(v) for v in row)
    cpu_text = _num(cpu / 1000) if abs(cpu / 1000 - round(cpu / 1000)) < 1e-9 else f"{round(cpu)}m"
    return {GPU_RESOURCE: _num(max(gpu, 0.0)), "cpu": cpu_text, "memory": str(max(round(mem), 0))}


def queue_status(obj: dict[str, Any] | None, fs: FairShare | None, q: int, children: list[str],
                 issue: Issue | None, now: str) -> dict[str, Any]:
    """The status fields kai-opt owns for one Queue (`fs`/`q` absent for a rejected queue)."""
    status = (obj or {}).get("status") or {}
    out: dict[str, Any] = {}
    if fs is not None and q >= 0:
        out["allocated"] = resource_list(fs.allocated[q])
        out["allocatedNonPreemptible"] = resource_list(fs.allocated_np[q])
        out["requested"] = resource_list(fs.requested[q])
        # rule: only fields of KAI's Queue status schema (the CRD prunes others, and a pruned field would differ
        # from the desired status every cycle: a write per queue per cycle); fair share is in the metrics
        out["childQueues"] = sorted(children)
    conds = [c for c in (status.get("conditions") or []) if isinstance(c, dict)]
    valid = next((c for c in conds if c.get("type") == VALID_CONDITION), None)
    if issue is not None:
        want = {"type": VALID_CONDITION, "status": "False", "reason": issue.reason, "message": issue.message}
    elif valid is not None and valid.get("status") != "True":
        want = {"type": VALID_CONDITION, "status": "True", "reason": "Valid", "message": "the queue is valid"}
    else:
        want = None
    if want is not None:
        same = valid is not None and all(valid.get(k) == v for k, v in want.items())
        if not same:
            out["conditions"] = [c for c in conds if c.get("type") != VALID_CONDITION] + [
                {**want, "lastTransitionTime": now}]
    return out


def _stale_and_started(state: ClusterState, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Per group of the state: stale once the plan lands (running pods, fewer than minMember with its placements)
    and started by the plan (it binds a pod of a group with none running)."""
    active = np.isin(state.pod_status, (PodStatus.BOUND,)) & (state.pod_pg >= 0)
    for e in plan.evictions:
        active[e.pod] = False
    running = np.bincount(state.pod_pg[active], minlength=state.n_groups) if state.n_groups else np.zeros(0)
    placed = np.zeros(state.n_groups, dtype=np.int64)  # binds and pipelined
    binds = np.zeros(state.n_groups, dtype=np.int64)
    for pl in plan.placements:
        g = int(state.pod_pg[pl.pod])
        if g >= 0 and not pl.moved:
            placed[g] += 1
            binds[g] += not pl.pipelined
    return (running > 0) & (running + placed < state.pg_min_member), (binds > 0) & (running == 0)


# -- the writer ------------------------------------------------------------------------------------------------------
class StatusWriter:
    """Writes PodGroup and Queue status and scheduling Events after each cycle (see the module docstring)."""

    def __init__(self, api: Any, cache: ClusterCache, pool: WorkPool, limiter: TokenBucket,
                 recorder: EventRecorder, *, fence: Callable[[], bool] = lambda: True, resend_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, busy: Callable[[], bool] = lambda: False,
                 defer_max_s: float = 0.0, write_queues: Callable[[], bool] = lambda: True,
                 counts: bool = True) -> None:
        self.api = api
        self.counts = counts  # PodGroup phase and pod counts (config runtime.podgroup_counts)
        self.write_queues = write_queues
        # Status yields to binds and evictions: while `busy()` (they are queued or in flight) a write waits, up to
        # `defer_max_s`. The apiserver then serves the binds first, and the writes still queued meanwhile are
        # replaced by later cycles' (a PodGroup goes from Pending to Running in one write, not two).
        self.busy = busy
        self.defer_max_s = defer_max_s
        self.cache = cache
        self.pool = pool
        self.limiter = limiter
        self.recorder = recorder
        self.fence = fence
        self.resend_s = resend_s
        self.clock = clock
        self._sent: dict[str, tuple[str, float]] = {}  # guarded by _sent_lock (write workers drop failed keys)
        self._sent_lock = threading.Lock()
        self._pruned = clock()
        self.failures = 0
        # PodGroup key -> (object, member Pod models, reasons) of the last cycle that found its status in sync:
        # the same objects (the watch replaces a changed object, the snapshot re-parses only changed pods) and
        # the same reasons give the same desired status, so it is in sync again (status compute thread only)
        self._in_sync: dict[str, tuple[dict[str, Any], tuple[Pod, ...], tuple[tuple[str, str], ...]]] = {}
        # the same rule for the annotations of a PodGroup: key -> (object, inputs) while its annotations were in
        # sync; inputs = (stale, position or None, positions given) - a group the plan starts is always computed
        # (its patch depends on the cycle's time)
        self._ann_in_sync: dict[str, tuple[dict[str, Any], tuple[Any, ...]]] = {}
        # and for a Queue: name -> (object, inputs) while its status was in sync; inputs = (its fair-share rows,
        # child queues, issue)
        self._queue_in_sync: dict[str | None, tuple[dict[str, Any], tuple[Any, ...]]] = {}
        # id(PodGroup object) -> (object, namespace/name): the key of an unchanged object is not formatted again
        self._pg_keys: dict[int, tuple[dict[str, Any], str]] = {}
        # Only the PodGroups whose inputs may have changed are looked at (status_changes): those whose object or
        # member pods changed, those the plan or the snapshot names now or named last cycle, those whose
        # annotation inputs (stale, queue position, started) changed, and those left out of sync last cycle
        self._members = Members()
        self._pg_changes = PodGroupChanges(cache)
        self._named: set[str] = set()  # keys the last cycle's plan left pending or its snapshot rejected
        self._look_again: set[str] = set()  # keys whose status was computed and not in sync last cycle
        # key -> (inputs, the _sent entry) of the status patch last submitted for a key still out of sync: while
        # its inputs and that entry stay, the patch is not worked out again (the watch has not shown it yet)
        self._submitted: dict[str, tuple[tuple[Any, ...], tuple[str, float] | None]] = {}
        self._ann_look_again: set[str] = set()  # the same for the annotations
        self._marks: dict[str, tuple[bool, tuple[int, int] | None]] = {}  # key -> (stale, position) last cycle,
        # for the groups stale or with a position
        self._positions_given: bool | None = None
        self._rescan = False  # a cycle raised after taking the cache's changes: look at every group

    def update(self, snap: Snapshot, state: ClusterState, plan: Plan, fs: FairShare | None,
               positions: dict[int, Position] | None = None) -> dict[str, int]:
        """Queue this cycle's status writes and events; returns counts {podgroups, queues, events}. `positions`:
        the queue positions of the groups the plan leaves pending (None: the position annotations are left
        as they are)."""
        now = now_rfc3339()
        rejected = {(i.kind, i.name): i for i in snap.rejected}
        counts = {"podgroups": 0, "queues": 0, "events": 0}
        queues = self.write_queues()
        try:  # (the cache's changes taken here are lost if this raises: every group is looked at next cycle)
            flags = _stale_and_started(state, plan)
            status_pgs, ann_pgs, whole = self._to_look_at(snap, state, plan, positions, flags)
            counts["podgroups"] = self._podgroups(status_pgs, state, plan, rejected, now, whole=whole)
            counts["podgroups"] += self._annotations(ann_pgs, state, positions, flags, whole=whole)
        except BaseException:
            self._members, self._rescan = Members(), True
            raise
        owned = self._members.groups  # = owned_podgroups(snap.pods, snap.scheduler_names)
        counts["queues"] = self._queues(state, fs, rejected, now) if queues else 0
        counts["events"] = (self._pending_events(state, plan, owned)
                            + self._issue_events(snap, owned, queues=queues))
        return counts

    # PodGroups
    def _to_look_at(self, snap: Snapshot, state: ClusterState, plan: Plan, positions: dict[int, Position] | None,
                    flags: tuple[np.ndarray, np.ndarray]) -> tuple[list[tuple[str, dict[str, Any]]],
                                                                  list[tuple[str, dict[str, Any]]], bool]:
        """(key, object) of the PodGroups whose status and whose annotations are computed this cycle, and whether
        those are every cached PodGroup (the first cycle, after a relist, when positions are turned on or off)."""
        moved = self._members.update(snap.pods, snap.scheduler_names)
        written = self._pg_changes.take()
        named = {state.pg_keys[g] for g in plan.pending} | {i.name for i in snap.rejected if i.kind == "PodGroup"}
        marks = self._annotation_marks(state, flags[0], positions)
        whole = written is None or self._rescan or self._positions_given != (positions is not None)
        self._rescan = False
        before = self._marks
        self._marks, self._positions_given = marks, positions is not None
        if whole:
            self._named = named
            pgs = self._podgroup_objects()
            return pgs, pgs, True
        # a group's reasons may depend on other objects (a rejection): named now or last cycle, it is looked at
        look = moved | written | named | self._named | self._look_again
        self._named = named
        changed_marks = {k for k in marks.keys() | before.keys() if marks.get(k) != before.get(k)}
        started = {state.pg_keys[g] for g in np.flatnonzero(flags[1]).tolist()}
        ann_look = moved | written | named | self._ann_look_again | changed_marks | started
        objs = {k: self._podgroup_object(k) for k in sorted(look | ann_look)}
        for k, o in objs.items():
            if o is None:  # gone: nothing to write, nothing in sync
                self._in_sync.pop(k, None)
                self._ann_in_sync.pop(k, None)
        return ([(k, o) for k, o in objs.items() if o is not None and k in look],
                [(k, o) for k, o in objs.items() if o is not None and k in ann_look], False)

    def _podgroup_object(self, key: str) -> dict[str, Any] | None:
        ns, _, name = key.partition("/")
        obj = self.cache.get(PODGROUP.api_version, PODGROUP.kind, ns, name)
        if obj is None and ns == "default":  # (an object without a namespace is named in 'default')
            obj = self.cache.get(PODGROUP.api_version, PODGROUP.kind, None, name)
        return obj

    @staticmethod
    def _annotation_marks(state: ClusterState, stale: np.ndarray,
                          positions: dict[int, Position] | None) -> dict[str, tuple[bool, tuple[int, int] | None]]:
        """key -> (stale, queue position) of every group stale after the plan or with a position."""
        out: dict[str, tuple[bool, tuple[int, int] | None]] = {
            state.pg_keys[g]: (True, None) for g in np.flatnonzero(stale).tolist()}
        for g, pos in (positions or {}).items():
            key = state.pg_keys[g]
            out[key] = (key in out, (pos.overall, pos.in_queue))
        return out

    def _podgroup_objects(self) -> list[tuple[str, dict[str, Any]]]:
        """(namespace/name, object) of every cached PodGroup."""
        out = []
        keys, before = {}, self._pg_keys
        for obj in self.cache.list(PODGROUP.kind, PODGROUP.api_version):
            hit = before.get(id(obj))
            if hit is None or hit[0] is not obj:
                hit = (obj, podgroup_key(obj))
            keys[id(obj)] = hit
            out.append((hit[1], obj))
        self._pg_keys = keys
        return out

    def _podgroups(self, pgs: list[tuple[str, dict[str, Any]]], state: ClusterState, plan: Plan,
                   rejected: dict[tuple[str, str], Issue], now: str, *, whole: bool) -> int:
        """The status of the groups `pgs` (every cached one when `whole`; else the others stay as they were)."""
        n = 0
        before = self._in_sync
        in_sync = {} if whole else before
        look_again: set[str] = set()
        members = owned = self._members.groups
        submitted = self._submitted
        rejected_pgs = {name: i for (kind, name), i in rejected.items() if kind == "PodGroup"}
        pg_index, pending = state.pg_index, plan.pending
        for key, obj in pgs:
            last = before.pop(key, None) if not whole else before.get(key)
            if key not in owned:
                continue
            issue = rejected_pgs.get(key)
            if issue is not None:
                reasons: list[Reason] | None = [Reason(issue.reason, issue.message)]
            else:
                g = pg_index.get(key)
                reasons = pending.get(g) if g is not None else None
            pods = tuple(members[key].values())
            inputs = (obj, pods, tuple((r.code, r.message) for r in reasons) if reasons else ())
            if last is not None and _same_inputs(last, inputs):
                in_sync[key] = last
                continue
            held = submitted.get(key)
            if held is not None and _same_inputs(held[0], inputs) and self._still_sent(f"podgroup/{key}", held[1]):
                look_again.add(key)  # the patch of these inputs is on its way: _submit would skip it again
                continue
            meta = obj.get("metadata") or {}
            desired = podgroup_status(obj, list(pods), reasons, now, with_counts=self.counts)
            patch = _changed(obj.get("status") or {}, desired)
            if not patch:
                in_sync[key] = inputs
                continue
            look_again.add(key)
            if self._submit(f"podgroup/{key}", object_path(
                    PODGROUP.api_version, PODGROUP.plural, meta.get("namespace"), meta.get("name")) + "/status",
                    patch):
                n += 1
            submitted[key] = (inputs, self._sent_entry(f"podgroup/{key}"))
        self._in_sync = in_sync
        self._look_again = look_again
        self._submitted = {k: submitted[k] for k in look_again if k in submitted}
        return n

    def _annotations(self, pgs: list[tuple[str, dict[str, Any]]], state: ClusterState,
                     positions: dict[int, Position] | None, flags: tuple[np.ndarray, np.ndarray], *,
                     whole: bool) -> int:
        """Stale and last-start timestamps and queue positions of declared PodGroups (see the module
        docstring), for the groups `pgs` (every cached one when `whole`; else the others stay as they were);
        `flags`: _stale_and_started."""
        stale_of, start_of = (a.tolist() for a in flags)
        owned = self._members.groups
        stamp = format_time(state.now)
        implicit = state.pg_implicit.tolist()
        n = 0
        before = self._ann_in_sync
        in_sync = {} if whole else before
        look_again: set[str] = set()
        for key, obj in pgs:
            last = before.pop(key, None) if not whole else before.get(key)
            g = state.pg_index.get(key)
            if g is None or implicit[g] or key not in owned:
                continue
            stale = stale_of[g]
            pos = positions.get(g) if positions is not None else None
            inputs = (stale, (pos.overall, pos.in_queue) if pos is not None else None, positions is not None)
            start = start_of[g]
            if not start and last is not None and last[0] is obj and last[1] == inputs:
                in_sync[key] = last
                continue
            meta = obj.get("metadata") or {}
            ann = meta.get("annotations") or {}
            patch: dict[str, Any] = {}
            if stale and STALE_TIMESTAMP_ANNOTATION not in ann:
                patch[STALE_TIMESTAMP_ANNOTATION] = stamp
            elif not stale and STALE_TIMESTAMP_ANNOTATION in ann:
                patch[STALE_TIMESTAMP_ANNOTATION] = None
            if start and ann.get(LAST_START_ANNOTATION) != stamp:
                patch[LAST_START_ANNOTATION] = stamp
            if positions is not None:
                patch.update(position_annotations(ann, pos))
            if not patch:
                if not start:
                    in_sync[key] = (obj, inputs)
                    continue
            elif self._submit(f"podgroup-meta/{key}", object_path(
                    PODGROUP.api_version, PODGROUP.plural, meta.get("namespace"), meta.get("name")),
                    {"metadata": {"annotations": patch}}, wrap=False):
                n += 1
            look_again.add(key)
        self._ann_in_sync = in_sync
        self._ann_look_again = look_again
        return n

    # Queues
    def _queues(self, state: ClusterState, fs: FairShare | None, rejected: dict[tuple[str, str], Issue],
                now: str) -> int:
        n = 0
        children = {name: [state.q_names[c] for c in state.q_children[q]] for q, name in enumerate(state.q_names)}
        rows = (np.concatenate([fs.allocated, fs.allocated_np, fs.requested], axis=1).astype(np.float64)
                if fs is not None else None)
        in_sync, before = {}, self._queue_in_sync
        for obj in self.cache.list(QUEUE.kind, QUEUE.api_version):
            name = (obj.get("metadata") or {}).get("name")
            q = state.q_index.get(name, -1)
            issue = rejected.get(("Queue", name))
            mine = children.get(name, [])
            inputs = (rows[q].tobytes() if rows is not None and q >= 0 else None, tuple(mine),
                      (issue.reason, issue.message) if issue is not None else None)
            last = before.get(name)
            if last is not None and last[0] is obj and last[1] == inputs:
                in_sync[name] = last
                continue
            desired = queue_status(obj, fs if q >= 0 else None, q, mine, issue, now)
            patch = _changed(obj.get("status") or {}, desired)
            if not patch:
                in_sync[name] = (obj, inputs)
            elif self._submit(f"queue/{name}", object_path(QUEUE.api_version, QUEUE.plural, None, name)
                                      + "/status", patch):
                n += 1
        self._queue_in_sync = in_sync
        return n

    def _submit(self, key: str, path: str, patch: dict[str, Any], *, wrap: bool = True) -> bool:
        """Queue a merge patch (of `status`, unless `wrap` is False); an identical one sent within `resend_s`
        is skipped (the watch has not shown it yet)."""
        body = {"status": patch} if wrap else patch
        digest = json.dumps(body, sort_keys=True, default=str)
        now = self.clock()
        with self._sent_lock:
            last = self._sent.get(key)
            if last is not None and last[0] == digest and now - last[1] < self.resend_s:
                return False
            self._sent[key] = (digest, now)
            if len(self._sent) > 4 * 1024 and now - self._pruned > self.resend_s:
                self._sent = {k: v for k, v in self._sent.items() if now - v[1] < self.resend_s}
                self._pruned = now
        return self.pool.submit(key, lambda: self._write(key, path, body), replace=True)

    def _sent_entry(self, key: str) -> tuple[str, float] | None:
        with self._sent_lock:
            return self._sent.get(key)

    def _still_sent(self, key: str, entry: tuple[str, float] | None) -> bool:
        """Whether `entry` is still the last patch sent for `key` (a failed write drops it) and within
        `resend_s`: _submit would skip the same patch."""
        with self._sent_lock:
            return entry is not None and self._sent.get(key) is entry and self.clock() - entry[1] < self.resend_s

    def _write(self, key: str, path: str, body: dict[str, Any]) -> None:
        deadline = time.monotonic() + self.defer_max_s
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.fence():
            return
        self.limiter.acquire()
        try:
            request(self.api, "PATCH", path, body=body, content_type=MERGE_PATCH)
        except Exception as exc:  # one object's status never stops the others
            f = classify(exc)
            with self._sent_lock:
                self._sent.pop(key, None)
            if f.status != 404:
                self.failures += 1
                log.warning("status of %s: %s %s", key, f.status or "", f.message)

    # Events
    def _pending_events(self, state: ClusterState, plan: Plan, owned: Collection[str]) -> int:
        n = 0
        for g, reasons in plan.pending.items():
            if not reasons:
                continue
            message = "; ".join(r.message for r in reasons)
            key = state.pg_keys[g]
            ns, name = key.split("/", 1)
            pg = self.cache.get(PODGROUP.api_version, PODGROUP.kind, ns, name) if key in owned else None
            if pg is not None and self.recorder.emit(pg, WARNING, "Unschedulable", message):
                n += 1
            for p in state.group_pods(g).tolist():
                if int(state.pod_status[p]) != PodStatus.PENDING or not state.pod_ours[p]:
                    continue
                pod = state.pods[p]
                raw = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "namespace": pod.namespace, "name": pod.name, "uid": pod.meta.uid}}
                if self.recorder.emit(raw, WARNING, "FailedScheduling", message):
                    n += 1
        return n

    def _issue_events(self, snap: Snapshot, owned: Collection[str], *, queues: bool) -> int:
        """Events on the objects the snapshot rejected or warned about: our pods, our PodGroups, Queues while
        kai-opt writes Queue status, and every Node, PriorityClass and Topology."""
        n = 0
        for issue in [*snap.rejected, *snap.warnings]:
            api_version = _API_VERSION.get(issue.kind)
            if api_version is None or issue.name in ("", "?"):
                continue
            if (issue.kind == "PodGroup" and issue.name not in owned) or (issue.kind == "Queue" and not queues):
                continue
            ns, _, name = issue.name.rpartition("/")
            obj = self.cache.get(api_version, issue.kind, ns or None, name)
            if issue.kind == "Pod" and not pod_is_ours(obj, snap.scheduler_names):
                continue
            if obj is not None and self.recorder.emit(obj, WARNING, issue.reason, issue.message):
                n += 1
        return n
