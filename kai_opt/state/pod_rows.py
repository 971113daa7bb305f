"""Per-object rows as column arrays, kept from one state build to the next by object identity.

The in-cluster cache hands the build the same (immutable) models every cycle while their objects do not change, so
what a pod or a PodGroup alone gives the state is read once: a build gathers the rows of known objects from the last
build's columns and reads only the new objects. Strings the columns compare (group keys, scheduler names,
scheduling signatures, queue names) are interned to integers once, so the build works on arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np

from kai_opt.api import Pod, PodGroup
from kai_opt.api.priorityclass import NON_PREEMPTIBLE_PRIORITY as NON_PREEMPTIBLE
from kai_opt.state.id_match import slots as id_slots
from kai_opt.state.resources import BASE_RESOURCES
from kai_opt.units import GPU_RESOURCE, gpu_milli_from_fraction

NAN = float("nan")
NO_SIG: tuple[Any, ...] = ((), (), ())
_BASE_KEYS = frozenset(BASE_RESOURCES)

# integer columns of a pod row, in order
POD_INTS = ("cpu", "mem", "npods", "gpu", "whole", "frac", "gmem", "ndev", "prio", "has_prio", "pclass",
            "finished", "deleted", "gated", "subgroup", "has_node", "has_extra", "has_devices", "has_gpu_group",
            "nominated_set", "sched", "gkey", "ikey", "skey", "node")
# object columns of a pod row
POD_OBJS = ("node_name", "extra", "gpu_group", "nominated")


class Interned:
    """Values <-> small integers, in first-seen order."""

    def __init__(self) -> None:
        self.ids: dict[Hashable, int] = {}
        self.values: list[Any] = []

    def __len__(self) -> int:
        return len(self.values)

    def id(self, value: Hashable) -> int:
        i = self.ids.get(value)
        if i is None:
            i = self.ids[value] = len(self.values)
            self.values.append(value)
        return i

    def ids_of(self, values: Sequence[Hashable]) -> np.ndarray:
        """int64 ids of `values`, interning the new ones."""
        out = np.fromiter(map(self.ids.get, values, repeat(-1)), dtype=np.int64, count=len(values))
        for i in np.flatnonzero(out < 0).tolist():
            out[i] = self.id(values[i])
        return out


class RowCache:
    """Column arrays of per-object rows aligned with a list of objects. `read(objects)` gives the columns of objects
    not in the last list (by identity); the last list is held, so no identity is reused while its rows live."""

    def __init__(self, read: Callable[[list[Any]], dict[str, np.ndarray]]) -> None:
        self._read = read
        self.clear()

    def clear(self) -> None:
        self._objs: list[Any] = []
        self._ids = np.zeros(0, dtype=np.int64)  # id() of each of _objs
        self._cols: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._objs)

    def columns(self, objs: Sequence[Any]) -> dict[str, np.ndarray]:
        n = len(objs)
        ids = np.fromiter(map(id, objs), dtype=np.int64, count=n)
        slots = id_slots(self._ids, ids)  # the known objects' rows, matched by identity
        new = np.flatnonzero(slots < 0)
        cols = self._cols
        if len(new) or not cols:
            fresh = _with_starts(self._read([objs[i] for i in new.tolist()]))
            slots[new] = len(self._objs) + np.arange(len(new))
            cols = _concat(cols, fresh) if cols else fresh
        same = len(new) == 0 and n == len(self._objs) and bool(np.array_equal(slots, np.arange(n)))
        out = cols if same else take_rows(cols, slots)
        for v in out.values():
            v.setflags(write=False)  # shared with the next build
        self._objs, self._ids, self._cols = list(objs), ids, out
        return out


# A ragged column `name` (a list of ints per row) is held as three arrays: f"{name}{LEN}" (per row),
# f"{name}{START}" (per row: where its values start in the flat array) and f"{name}{FLAT}" (the values).
LEN, START, FLAT = "@len", "@start", "@flat"


def _with_starts(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for name in [k[: -len(LEN)] for k in cols if k.endswith(LEN)]:
        lens = cols[name + LEN]
        cols[name + START] = np.cumsum(lens) - lens
    return cols


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in b.items():
        if k.endswith(START):
            out[k] = np.concatenate([a[k], v + len(a[k[: -len(START)] + FLAT])])
        else:
            out[k] = np.concatenate([a[k], v])
    return out


def take_rows(cols: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    """The rows `idx` of `cols` (ragged columns compacted)."""
    out = {k: v[idx] for k, v in cols.items() if not k.endswith(FLAT)}
    for name in [k[: -len(FLAT)] for k in cols if k.endswith(FLAT)]:
        lens, starts = out[name + LEN], out[name + START]
        at = np.cumsum(lens) - lens
        total = int(lens.sum())
        out[name + FLAT] = cols[name + FLAT][np.repeat(starts - at, lens) + np.arange(total)]
        out[name + START] = at
    return out


class PodRows:
    """Pods' rows (`POD_INTS`, `POD_OBJS`, creation and start times) with the interned strings they refer to:
    scheduler names, group keys ("ns/podgroup" and the implicit "ns/pg-<pod>"), scheduling-signature keys."""

    def __init__(self) -> None:
        self.names = Interned()  # scheduler names
        self.keys = Interned()  # group keys
        self.sigs = Interned()  # signature keys
        self.nodes = Interned()  # node names pods are bound to
        self.classes = Interned()  # priority class names pods name
        self._node_lookup: tuple[dict[str, int], np.ndarray] | None = None
        self.sig_objects: dict[int, Any] = {}  # signature key id -> its SchedulingSig (made by the build)
        self.rows = RowCache(self._read)

    def node_lookup(self, node_index: dict[str, int]) -> np.ndarray:
        """int64[interned node names]: each name's index in `node_index`, -1 when not a node of it (remembered
        while `node_index` is the same dict and no name was added)."""
        last = self._node_lookup
        if last is not None and last[0] is node_index and len(last[1]) == len(self.nodes):
            return last[1]
        ids = self.nodes.ids
        out = np.full(len(self.nodes), -1, dtype=np.int64)
        for name, i in node_index.items():
            at = ids.get(name)
            if at is not None:
                out[at] = i
        out.setflags(write=False)
        self._node_lookup = (node_index, out)
        return out

    def columns(self, pods: Sequence[Pod]) -> dict[str, np.ndarray]:
        if len(self.keys) > 4 * len(pods) + 100_000:  # keys of pods long gone: start again
            self.__init__()  # type: ignore[misc]
        return self.rows.columns(pods)

    def _read(self, pods: list[Pod]) -> dict[str, np.ndarray]:
        n = len(pods)
        ints = np.zeros((n, len(POD_INTS)), dtype=np.int64)
        times = np.zeros((n, 2), dtype=np.float64)
        objs = np.empty((n, len(POD_OBJS)), dtype=object)
        devices: list[tuple[int, ...]] = []
        for i, pod in enumerate(pods):
            ints[i], times[i], objs[i] = self._row(pod)
            devices.append(pod.gpu_devices or ())
        out: dict[str, np.ndarray] = {c: ints[:, j] for j, c in enumerate(POD_INTS)}
        out.update({c: objs[:, j] for j, c in enumerate(POD_OBJS)})
        out["creation"], out["start"] = times[:, 0], times[:, 1]
        out["devices" + LEN] = np.fromiter(map(len, devices), dtype=np.int64, count=n)
        out["devices" + FLAT] = np.fromiter(chain.from_iterable(devices), dtype=np.int64,
                                            count=int(out["devices" + LEN].sum()))
        return out

    def _row(self, pod: Pod) -> tuple[tuple[int, ...], tuple[float, float], tuple[Any, ...]]:
        """What a pod alone gives the state."""
        req = pod.requests
        get = req.get
        gpu = whole = frac = gmem = 0
        ndev = 1
        v = get(GPU_RESOURCE)
        if v is not None:
            gpu, whole = v, v // 1000
        if pod.gpu_fraction is not None:
            frac = gpu_milli_from_fraction(pod.gpu_fraction)
            ndev = pod.gpu_fraction_num_devices
            gpu = frac * ndev
        elif pod.gpu_memory_mib is not None:
            gmem = pod.gpu_memory_mib
            ndev = pod.gpu_fraction_num_devices
        meta = pod.meta
        extra = () if _BASE_KEYS.issuperset(req) else tuple((r, x) for r, x in req.items() if r not in _BASE_KEYS)
        ns = meta.namespace or "default"
        selector, affinity, tolerations = pod.node_selector, pod.node_affinity, pod.tolerations
        skey = NO_SIG if not (selector or affinity or tolerations or pod.dra_nodes is not None) else (
            tuple(sorted(selector.items())) if selector else (), affinity, tolerations,
            frozenset(pod.dra_nodes) if pod.dra_nodes is not None else None)
        ints = (get("cpu", 0), get("memory", 0), get("pods", 0), gpu, whole, frac, gmem, ndev,
                pod.priority if pod.priority is not None else 0, pod.priority is not None,
                self.classes.id(pod.priority_class_name) if pod.priority_class_name else -1,
                pod.finished, meta.deletion_timestamp is not None, bool(pod.scheduling_gates), bool(pod.subgroup),
                bool(pod.node_name), bool(extra), pod.gpu_devices is not None, bool(pod.gpu_group),
                bool(pod.nominated_node), self.names.id(pod.scheduler_name),
                self.keys.id(f"{ns}/{pod.podgroup}") if pod.podgroup else -1, self.keys.id(f"{ns}/pg-{meta.name}"),
                self.sigs.id(skey), self.nodes.id(pod.node_name) if pod.node_name else -1)
        times = (meta.creation_timestamp if meta.creation_timestamp is not None else NAN,
                 pod.start_time if pod.start_time is not None else NAN)
        return ints, times, (pod.node_name, extra, pod.gpu_group, pod.nominated_node)


# integer and float columns of a declared PodGroup's row (valid for groups whose values come from the spec alone)
GROUP_INTS = ("alone", "min_member", "prio", "preempt", "queue")
GROUP_FLOATS = ("creation", "last_start", "stale")


class GroupRows:
    """Declared PodGroups' rows: for a group without subgroups or topology, all its values but the queue's index
    come from the spec (`alone` 1) or, without a known priority class of its own, all but its priority too, which
    its pods give (`alone` 2; `preempt` -1 when that priority decides it); other groups are read on each build.
    Valid while the priority classes are the same. Column `kid`: each group's key interned in `keys` (the pods'
    group keys, PodRows.keys), valid while that table is the same."""

    def __init__(self) -> None:
        self.queues = Interned()  # queue names (-1: none named)
        self.rows = RowCache(self._read)
        self.classes: tuple[dict[str, int], int] | None = None
        self.keys: Interned | None = None

    def columns(self, groups: Sequence[PodGroup], pc_value: dict[str, int], global_default: int,
                keys: Interned) -> dict[str, np.ndarray]:
        if self.classes != (pc_value, global_default) or len(self.queues) > 4 * len(groups) + 100_000 \
                or self.keys is not keys:
            self.__init__()  # type: ignore[misc]
            self.classes, self.keys = (dict(pc_value), global_default), keys
        return self.rows.columns(groups)

    def _read(self, groups: list[PodGroup]) -> dict[str, np.ndarray]:
        assert self.classes is not None
        pc_value, _ = self.classes
        n = len(groups)
        ints = np.zeros((n, len(GROUP_INTS)), dtype=np.int64)
        floats = np.full((n, len(GROUP_FLOATS)), NAN, dtype=np.float64)
        keys = np.empty(n, dtype=object)
        for i, spec in enumerate(groups):
            keys[i] = spec.key
            pc = spec.priority_class_name
            if spec.sub_groups or spec.topology_constraint is not None:
                ints[i, 4] = self.queues.id(spec.queue) if spec.queue else -1
                continue
            value = pc_value.get(pc) if pc else None  # None: its pods give the priority
            preempt = (spec.preemptibility == "preemptible") if spec.preemptibility else \
                (value < NON_PREEMPTIBLE if value is not None else -1)
            ints[i] = (1 if value is not None else 2, spec.min_member, value if value is not None else 0, preempt,
                       self.queues.id(spec.queue) if spec.queue else -1)
            floats[i] = (_t(spec.meta.creation_timestamp), _t(spec.last_start), _t(spec.stale_since))
        out: dict[str, np.ndarray] = {c: ints[:, j] for j, c in enumerate(GROUP_INTS)}
        out.update({c: floats[:, j] for j, c in enumerate(GROUP_FLOATS)})
        out["key"] = keys
        assert self.keys is not None
        out["kid"] = self.keys.ids_of(keys.tolist())
        return out


def _t(x: float | None) -> float:
    return NAN if x is None else float(x)

