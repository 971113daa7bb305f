"""The watch cache: list+watch of the kinds kai-opt schedules from (and any kind added with `add_kind`), one thread
per kind, into an in-memory store of raw objects; the scheduling snapshot of a cycle is built from it, never
re-listed.

Each kind is listed (in pages), then watched from the list's resourceVersion with bookmarks. A watch that ends is
resumed from the last resourceVersion seen; 410 Gone (the version expired) relists; any other failure reconnects
with exponential backoff (with jitter, up to `backoff_max_s`). A kind the server does not serve (its CRD is not
installed: 404) is marked absent, counts as synced, and is looked for again every `absent_recheck_s`.

Objects are stored as the server sent them, without `metadata.managedFields`, with apiVersion and kind set. They
are never modified in place (an event replaces the whole object), so readers may hold them without copying but
must not mutate them.

Assumptions (what kai-opt did that the watch has not shown yet):
- bound: the binder accepted a placement; the pod counts as bound to that node with those GPU devices until the
  watch shows it bound, the bind fails (`forget_bound`), or `assume_ttl_s` passes after the API accepted the bind;
- releasing: an eviction was requested; the pod counts as being deleted until it is gone, the watch shows its
  deletionTimestamp, or the eviction is refused (`forget_releasing`).

Pods are also indexed by node (`node_view`: the node, the pods bound to it as watched, our binds assumed onto it),
for the binder's re-check right before a bind, and pods the watch shows turning Failed by the kubelet's admission
(kai_opt.k8s.coexist.kubelet_rejection) are kept until `take_kubelet_rejections`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.api.meta import now_rfc3339 as _now_rfc3339  # (a module name: tests set the time here)
from kai_opt.api.pod import GPU_DEVICES_ANNOTATION, PODGROUP_ANNOTATION
from kai_opt.gcpause import gc_paused
from kai_opt.k8s.client import PODGROUP, QUEUE, TOPOLOGY, object_path, request, stream_lines
from kai_opt.k8s.coexist import kubelet_rejection
from kai_opt.k8s.shard import ShardFilter, filter_snapshot, pod_group_of
from kai_opt.k8s.sharing import APP_LABEL, without_gpu
from kai_opt.snapshot import DEFAULT_SCHEDULER_NAMES, KINDS, Issue, Links, RawObject, Snapshot, is_constrained, read_raw

log = logging.getLogger(__name__)

PAGE_SIZE = 500
MAX_KEPT_REJECTIONS = 10_000  # kubelet rejections not taken yet beyond this are dropped (oldest first)


@dataclass(frozen=True)
class Resource:
    """One kind to watch."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    def __str__(self) -> str:
        return f"{self.plural}.{self.api_version}"


SCHEDULING_KINDS: tuple[Resource, ...] = (
    Resource("v1", "Node", "nodes", False),
    Resource("v1", "Pod", "pods", True),
    Resource(PODGROUP.api_version, PODGROUP.kind, PODGROUP.plural, True),
    Resource(QUEUE.api_version, QUEUE.kind, QUEUE.plural, False),
    Resource("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False),
    Resource(TOPOLOGY.api_version, TOPOLOGY.kind, TOPOLOGY.plural, False),
    # DRA (kai_opt.dra); a server without resource.k8s.io/v1 leaves them absent
    Resource("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False),
    Resource("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False),
    Resource("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True),
    Resource("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
    # beta, off by default in 1.36 (resource.k8s.io/v1beta2 and the DRADeviceTaintRules gate): absent unless enabled
    Resource("resource.k8s.io/v1beta2", "DeviceTaintRule", "devicetaintrules", False),
)


def object_key(obj: dict[str, Any]) -> str:
    """`namespace/name` of a namespaced object, `name` of a cluster-scoped one."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def clean(obj: dict[str, Any], res: Resource) -> dict[str, Any]:
    """An object as stored: apiVersion and kind set, no managedFields."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    return {"apiVersion": res.api_version, "kind": res.kind, "metadata": meta, **rest}


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


@dataclass
class _Store:
    res: Resource
    items: dict[str, dict[str, Any]]
    synced: bool = False
    absent: bool = False  # the server does not serve this kind (CRD not installed), or we may not read it
    forbidden: bool = False  # absent because RBAC forbids reading it
    resource_version: str = ""
    relists: int = 0
    errors: int = 0
    # consumer -> the keys written since its last look (`ClusterCache.take_changes`; the snapshot views, the grouper);
    # None: `items` was replaced since (a relist), the consumer reads everything
    changed: dict[str, set[str] | None] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # key -> its rank in `items` (dict order: first insertion)
    next_order: int = 0

    def replace(self, items: dict[str, dict[str, Any]]) -> None:
        """A new `items` dict (a relist, an absent kind): consumers see the new dict and start over."""
        self.items = items
        self.changed = dict.fromkeys(self.changed)
        self.order = dict(zip(items, range(len(items)), strict=True))
        self.next_order = len(items)

    def take_changed(self, consumer: str) -> set[str] | None:
        """The keys written since `consumer` last took them (None: its first look, or `items` was replaced since;
        it reads everything)."""
        out = self.changed.get(consumer)
        self.changed[consumer] = set()
        return out


@dataclass(frozen=True)
class StoreChanges:
    """What a store's consumer reads (ClusterCache.take_changes): key -> (object, its rank in the store's order),
    (None, -1) for a key deleted; `whole`: these are all the objects, the consumer starts over."""

    whole: bool
    objects: dict[str, tuple[Any, int]]


@dataclass(frozen=True)
class Assumed:
    """A pod the binder accepted: where it goes. `bound_at`: when the API accepted the bind (monotonic)."""

    namespace: str
    name: str
    node: str
    devices: tuple[int, ...]
    bound_at: float | None = None
    # binder: kai: (claim name, allocation) of the pod's pending BindRequest, assumed until KAI's binder writes them
    claims: tuple[tuple[str, Any], ...] = ()


class ClusterCache:
    """Watch cache of raw objects (see the module docstring). `start()` begins watching, `wait_synced()` waits for
    the first lists, `snapshot()` gives the cycle's `Snapshot`; `get`/`list` read single kinds."""

    def __init__(self, api: client.ApiClient, *, kinds: Iterable[Resource] = SCHEDULING_KINDS,
                 watch_timeout_s: float = 60.0, backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0,
                 absent_recheck_s: float = 30.0, assume_ttl_s: float = 30.0, page_size: int = PAGE_SIZE,
                 reservation_app: str | None = None) -> None:
        self.api = api
        # pods with label app=<reservation_app> are GPU reservation pods: they hold no GPU in the snapshot
        self.reservation_app = reservation_app
        self.watch_timeout_s = watch_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.absent_recheck_s = absent_recheck_s
        self.assume_ttl_s = assume_ttl_s
        self.page_size = page_size
        self._lock = threading.RLock()
        self._synced_cond = threading.Condition(self._lock)
        self._stores: dict[tuple[str, str], _Store] = {}
        self._threads: dict[tuple[str, str], threading.Thread] = {}
        self._responses: dict[tuple[str, str], Any] = {}
        self._stop = threading.Event()
        self._started = False
        self._bound: dict[str, Assumed] = {}  # pod uid -> assumption (changed only by _set_bound/_drop_bound)
        self._bound_on: dict[str, set[str]] = {}  # node -> uids of _bound assumed onto it
        self._on_node: dict[str, dict[str, dict[str, Any]]] = {}  # node -> pod key -> pod bound to it (watched)
        self._rejections: list[dict[str, Any]] = []  # pods the kubelet rejected, not taken yet
        self._releasing: dict[str, float | None] = {}  # pod uid -> when the API accepted the eviction
        self._memo: dict[tuple[str, ...], Any] = {}  # parsed models of unchanged objects (snapshot thread only)
        # what the last snapshot made of each store's objects (snapshot thread only)
        self._views: dict[tuple[str, str], _View] = {}
        self._missing_groups = _MissingGroups()
        for res in kinds:
            self.add_kind(res.api_version, res.kind, res.plural, res.namespaced)

    # -- kinds and threads -------------------------------------------------------------------------------------------
    def add_kind(self, api_version: str, kind: str, plural: str, namespaced: bool) -> None:
        """Watch one more kind (idempotent); starts its thread at once when the cache runs."""
        res = Resource(api_version, kind, plural, namespaced)
        with self._lock:
            if (api_version, kind) in self._stores:
                return
            self._stores[(api_version, kind)] = _Store(res, {})
            if self._started:
                self._start_thread(res)

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            for store in self._stores.values():
                self._start_thread(store.res)

    def _start_thread(self, res: Resource) -> None:
        t = threading.Thread(target=self._run, args=(res,), name=f"watch-{res.plural}", daemon=True)
        self._threads[(res.api_version, res.kind)] = t
        t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End every watch (open streams are shut down) and wait briefly for the threads."""
        self._stop.set()
        with self._lock:
            responses = list(self._responses.values())
            threads = list(self._threads.values())
        for resp in responses:
            with contextlib.suppress(Exception):  # closing a dying socket may fail in many ways
                resp.shutdown()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def synced(self) -> bool:
        with self._lock:
            return all(s.synced for s in self._stores.values())

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every kind was listed once (or found absent); False on timeout or stop."""
        deadline = time.monotonic() + timeout
        with self._synced_cond:
            while not all(s.synced for s in self._stores.values()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._synced_cond.wait(min(left, 0.5))
            return True

    def status(self) -> dict[str, dict[str, Any]]:
        """Per kind: objects held, synced, absent, relists, errors (for logs and tests)."""
        with self._lock:
            return {str(s.res): {"objects": len(s.items), "synced": s.synced, "absent": s.absent,
                                 "forbidden": s.forbidden, "relists": s.relists, "errors": s.errors}
                    for s in self._stores.values()}

    # -- the watch loop of one kind ----------------------------------------------------------------------------------
    def _run(self, res: Resource) -> None:
        backoff = self.backoff_initial_s
        rv = ""  # "" = list first; else resume the watch from here
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list(res)
                    backoff = self.backoff_initial_s
                while not self._stop.is_set():
                    rv = self._watch(res, rv)
                    backoff = self.backoff_initial_s
            except _Gone:
                log.info("watch %s: resourceVersion expired; listing again", res)
                rv = ""
                continue
            except ApiException as exc:
                rv = self._resume_point(res) if exc.status not in (403, 404, 410) else ""
                if exc.status in (403, 404):  # not installed, or we may not read it: look again later
                    self._mark_absent(res, forbidden=exc.status == 403)
                    self._stop.wait(self.absent_recheck_s)
                    continue
                self._count_error(res)
                log.warning("watch %s: the API server answered %s %s; retrying in %.1fs", res, exc.status,
                            exc.reason, backoff)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stop.is_set():
                    return
                rv = self._resume_point(res)  # a broken connection: watch again from the last version seen
                self._count_error(res)
                log.warning("watch %s: %s; retrying in %.1fs", res, " ".join(str(exc).split())[:200], backoff)
            self._stop.wait(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, self.backoff_max_s)

    def _resume_point(self, res: Resource) -> str:
        with self._lock:
            store = self._stores[(res.api_version, res.kind)]
            return store.resource_version if store.synced and not store.absent else ""

    def _list(self, res: Resource) -> str:
        """List all objects (in pages) and replace the store; returns the list's resourceVersion."""
        path = object_path(res.api_version, res.plural, None)
        items: dict[str, dict[str, Any]] = {}
        cont: str | None = None
        rv = ""
        while True:
            try:
                page = request(self.api, "GET", path, query={"limit": self.page_size, "continue": cont})
            except ApiException as exc:
                if exc.status == 410 and cont is not None:  # the continue token expired: start over
                    items, cont = {}, None
                    continue
                raise
            for item in page.get("items") or []:
                obj = clean(item, res)
                items[object_key(obj)] = obj
            meta = page.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "")
            cont = meta.get("continue") or None
            if not cont:
                break
        with self._lock:
            store = self._stores[(res.api_version, res.kind)]
            was_absent = store.absent
            old = store.items
            store.replace(items)
            store.resource_version = rv
            store.absent = store.forbidden = False
            store.relists += 1
            if res.kind == "Pod" and res.api_version == "v1":
                self._reindex_nodes(items)
                for key, pod in items.items():
                    self._note_rejection(old.get(key), pod)
                self._reconcile_assumptions(items)
            store.synced = True
            self._synced_cond.notify_all()
        if was_absent:
            log.info("watch %s: the kind is served now", res)
        return rv

    def _watch(self, res: Resource, rv: str) -> str:
        """One watch request from `rv`; returns the last resourceVersion seen when the server ends it."""
        path = object_path(res.api_version, res.plural, None)
        query = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": int(self.watch_timeout_s)}
        key = (res.api_version, res.kind)

        def opened(resp: Any) -> None:
            with self._lock:
                self._responses[key] = resp
            if self._stop.is_set():
                resp.shutdown()

        try:
            for line in stream_lines(self.api, path, query=query, timeout=(5.0, self.watch_timeout_s + 15.0),
                                     opened=opened):
                event = json.loads(line)
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise _Gone()
                    raise ApiException(status=code or 500, reason=obj.get("message") or "watch error")
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = str(new_rv)
                if etype == "BOOKMARK":
                    with self._lock:
                        self._stores[key].resource_version = rv
                    continue
                self._apply(res, etype, clean(obj, res), rv)
        finally:
            with self._lock:
                self._responses.pop(key, None)
        with self._lock:
            self._stores[key].resource_version = rv
        return rv

    def _apply(self, res: Resource, etype: str | None, obj: dict[str, Any], rv: str = "") -> None:
        key = object_key(obj)
        is_pod = res.kind == "Pod" and res.api_version == "v1"
        with self._lock:
            store = self._stores[(res.api_version, res.kind)]
            if rv:
                store.resource_version = rv
            old = store.items.get(key)
            for keys in store.changed.values():
                if keys is not None:
                    keys.add(key)
            if etype == "DELETED":
                store.items.pop(key, None)
                store.order.pop(key, None)
                if is_pod:
                    self._index_node(key, old, None)
                    uid = (obj.get("metadata") or {}).get("uid")
                    self._drop_bound(uid)
                    self._releasing.pop(uid, None)
            else:
                if key not in store.items:
                    store.order[key] = store.next_order
                    store.next_order += 1
                store.items[key] = obj
                if is_pod:
                    self._index_node(key, old, obj)
                    self._note_rejection(old, obj)
                    self._confirm(obj)

    def _mark_absent(self, res: Resource, *, forbidden: bool = False) -> None:
        with self._lock:
            store = self._stores[(res.api_version, res.kind)]
            if not store.absent or store.forbidden != forbidden:
                if forbidden:
                    log.warning("watch %s: forbidden (RBAC); checking again every %gs", res, self.absent_recheck_s)
                else:
                    log.info("watch %s: not served by the cluster (CRD not installed); checking again every %gs",
                             res, self.absent_recheck_s)
            store.absent = True
            store.forbidden = forbidden
            store.replace({})
            store.synced = True
            self._synced_cond.notify_all()

    def _count_error(self, res: Resource) -> None:
        with self._lock:
            self._stores[(res.api_version, res.kind)].errors += 1

    # -- reading -----------------------------------------------------------------------------------------------------
    def _store_for(self, api_version: str, kind: str) -> _Store | None:
        store = self._stores.get((api_version, kind))
        if store is not None:
            return store
        group = api_version.split("/")[0] if "/" in api_version else ""
        return next((s for s in self._stores.values() if s.res.kind == kind and s.res.group == group), None)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One object (or None); another served version of the same group and kind is used when this exact
        apiVersion is not watched. Do not modify the result."""
        with self._lock:
            store = self._store_for(api_version, kind)
            if store is None:
                return None
            key = f"{namespace}/{name}" if store.res.namespaced and namespace else name
            return store.items.get(key)

    def take_changes(self, consumer: str, kinds: Collection[tuple[str, str]]) -> dict[tuple[str, str], StoreChanges]:
        """For a consumer that keeps its own state from some stores ((group, kind) pairs): per watched store of
        those kinds, by (apiVersion, kind), the objects written since the consumer's last call, or every object
        (`whole`) on its first call and after the store was replaced (a relist). Do not modify the objects."""
        out: dict[tuple[str, str], StoreChanges] = {}
        with self._lock:
            for k, store in self._stores.items():
                if (store.res.group, store.res.kind) not in kinds:
                    continue
                keys = store.take_changed(consumer)
                items, order = store.items, store.order
                if keys is None:
                    out[k] = StoreChanges(True, {key: (obj, order[key]) for key, obj in items.items()})
                else:
                    out[k] = StoreChanges(False, {key: (items[key], order[key]) if key in items else (None, -1)
                                                  for key in keys})
        return out

    def objects_with_rank(self, api_version: str, kind: str, keys: Iterable[str]) -> dict[str, tuple[Any, int]]:
        """The objects of these keys now, with their rank in the store's order ((None, -1): gone)."""
        with self._lock:
            store = self._stores.get((api_version, kind))
            items, order = (store.items, store.order) if store is not None else ({}, {})
            return {key: (items[key], order[key]) if key in items else (None, -1) for key in keys}

    def list(self, kind: str, api_version: str | None = None) -> list[dict[str, Any]]:
        """Every object of `kind` (of every watched apiVersion, unless one is given). Do not modify them."""
        with self._lock:
            out: list[dict[str, Any]] = []
            for (av, k), store in self._stores.items():
                if k == kind and (api_version is None or av == api_version):
                    out.extend(store.items.values())
            return out

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("v1", "Pod", namespace, name)

    def has_unscheduled(self, scheduler_names: Collection[str], shard: ShardFilter | None = None) -> bool:
        """Whether some pod of these schedulers waits for a placement: not bound, not assumed bound, not being
        deleted, not finished (a cheap look at the pod store, without a snapshot); with a `shard`, a pod whose
        PodGroup is another shard's does not count (one without a PodGroup yet does: the grouper decides)."""
        ours = set(scheduler_names)
        with self._lock:
            bound = self._bound
            groups = self._stores.get((PODGROUP.api_version, PODGROUP.kind)) if shard is not None else None
            for (av, kind), store in self._stores.items():
                if kind != "Pod" or av != "v1":
                    continue
                for pod in store.items.values():
                    spec = pod.get("spec") or {}
                    if spec.get("nodeName") or spec.get("schedulerName") not in ours:
                        continue
                    meta = pod.get("metadata") or {}
                    if meta.get("uid") in bound or meta.get("deletionTimestamp"):
                        continue
                    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    if shard is not None and groups is not None:
                        group = groups.items.get(f"{meta.get('namespace') or 'default'}/{pod_group_of(pod)}")
                        if group is not None and not shard.matches((group.get("metadata") or {}).get("labels")):
                            continue
                    return True
        return False

    def absent_kinds(self) -> list[str]:
        """Kinds not served (or forbidden), e.g. "queues.scheduling.run.ai/v2 (forbidden)"."""
        with self._lock:
            return [str(s.res) + (" (forbidden)" if s.forbidden else "") for s in self._stores.values() if s.absent]

    # -- assumptions -------------------------------------------------------------------------------------------------
    def assume_bound(self, uid: str, namespace: str, name: str, node: str, devices: tuple[int, ...]) -> None:
        """The binder accepted this placement: the pod counts as bound there from now on."""
        with self._lock:
            self._set_bound(uid, Assumed(namespace, name, node, tuple(devices)))

    def bind_accepted(self, uid: str) -> None:
        """The API accepted the bind: the assumption now lasts until the watch shows it, or `assume_ttl_s`."""
        with self._lock:
            a = self._bound.get(uid)
            if a is not None:
                pod = self.pod(a.namespace, a.name)
                if pod is not None and (pod.get("spec") or {}).get("nodeName"):
                    self._drop_bound(uid)  # the watch was faster
                else:
                    self._set_bound(uid, Assumed(a.namespace, a.name, a.node, a.devices, time.monotonic()))

    def hold_bound(self, uid: str, namespace: str, name: str, node: str, devices: tuple[int, ...],
                   claims: tuple[tuple[str, Any], ...] = ()) -> None:
        """Someone else binds this pod for us (KAI's binder, from our pending BindRequest): it counts as bound on
        `node` for another `assume_ttl_s` from now (the caller refreshes this while the bind is pending); `claims`
        (claim name, allocation): the BindRequest's claims count as allocated and reserved for the pod while they
        are not (KAI's scheduler assumes its pending BindRequests' claims the same way)."""
        with self._lock:
            old = self._bound.get(uid)
            self._set_bound(uid, Assumed(namespace, name, node, tuple(devices), time.monotonic(), tuple(claims)))
            if old is None or old.node != node or old.devices != tuple(devices) or old.claims != tuple(claims):
                self.generation += 1

    def forget_bound(self, uid: str) -> None:
        """The bind failed or was dropped: the pod is pending again (it is placed again next cycle)."""
        with self._lock:
            self._drop_bound(uid)

    def assume_releasing(self, uid: str) -> None:
        """An eviction of this pod was decided: it counts as being deleted from now on."""
        with self._lock:
            self._releasing[uid] = None

    def eviction_accepted(self, uid: str) -> None:
        """The API accepted the eviction: the assumption lasts until the watch shows it, or `assume_ttl_s`."""
        with self._lock:
            if uid in self._releasing:
                self._releasing[uid] = time.monotonic()

    def forget_releasing(self, uid: str) -> None:
        with self._lock:
            self._releasing.pop(uid, None)

    def assumed(self) -> tuple[dict[str, Assumed], set[str]]:
        """Copies of the bound and releasing assumptions (pod uid keys)."""
        with self._lock:
            self._expire()
            return dict(self._bound), set(self._releasing)

    def _set_bound(self, uid: str, a: Assumed) -> None:
        old = self._bound.get(uid)
        if old is not None and old.node != a.node:
            self._bound_on.get(old.node, set()).discard(uid)
        self._bound[uid] = a
        self._bound_on.setdefault(a.node, set()).add(uid)

    def _drop_bound(self, uid: str | None) -> Assumed | None:
        a = self._bound.pop(uid, None) if uid is not None else None
        if a is not None:
            on = self._bound_on.get(a.node)
            if on is not None:
                on.discard(uid)  # type: ignore[arg-type]
                if not on:
                    del self._bound_on[a.node]
        return a

    # -- pods by node, kubelet rejections ----------------------------------------------------------------------------
    def _index_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        was = ((old or {}).get("spec") or {}).get("nodeName")
        now = ((new or {}).get("spec") or {}).get("nodeName")
        if was and was != now:
            on = self._on_node.get(was)
            if on is not None:
                on.pop(key, None)
                if not on:
                    del self._on_node[was]
        if now and new is not None:
            self._on_node.setdefault(now, {})[key] = new

    def _reindex_nodes(self, items: dict[str, dict[str, Any]]) -> None:
        self._on_node = {}
        for key, pod in items.items():
            self._index_node(key, None, pod)

    def _note_rejection(self, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        """Keep a pod the watch shows turning kubelet-rejected (a pod first seen rejected is old news)."""
        if old is not None and kubelet_rejection(new) and not kubelet_rejection(old):
            self._rejections.append(new)
            if len(self._rejections) > MAX_KEPT_REJECTIONS:
                del self._rejections[:len(self._rejections) - MAX_KEPT_REJECTIONS]

    def take_kubelet_rejections(self) -> list[dict[str, Any]]:
        """The pods the kubelet rejected since the last call (as the watch showed them then)."""
        with self._lock:
            out, self._rejections = self._rejections, []
            return out

    def node_view(self, node: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[tuple[str, Assumed]]]:
        """One consistent read of a node: its object (None: gone), the pods the watch shows bound to it, and our
        binds assumed onto it that the watch does not show yet (uid, assumption). Do not modify the objects."""
        now = time.monotonic()
        with self._lock:
            store = self._store_for("v1", "Node")
            obj = store.items.get(node) if store is not None else None
            pods = list((self._on_node.get(node) or {}).values())
            assumed = [(uid, a) for uid in self._bound_on.get(node, ()) if (a := self._bound[uid]).bound_at is None
                       or now - a.bound_at <= self.assume_ttl_s]  # (expired ones are dropped by _expire)
            return obj, pods, assumed

    def _confirm(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if uid in self._bound and (pod.get("spec") or {}).get("nodeName"):
            self._drop_bound(uid)
        if uid in self._releasing and (pod.get("metadata") or {}).get("deletionTimestamp"):
            del self._releasing[uid]

    def _reconcile_assumptions(self, items: dict[str, dict[str, Any]]) -> None:
        present = {(p.get("metadata") or {}).get("uid"): p for p in items.values()}
        for uid in list(self._bound):
            if uid not in present:
                self._drop_bound(uid)
        for uid in list(self._releasing):
            if uid not in present:
                del self._releasing[uid]
        for pod in present.values():
            self._confirm(pod)

    def _expire(self) -> None:
        now = time.monotonic()
        for uid, a in list(self._bound.items()):
            if a.bound_at is not None and now - a.bound_at > self.assume_ttl_s:
                log.warning("pod %s/%s: bound %.0fs ago but the watch does not show it; assumption dropped",
                            a.namespace, a.name, now - a.bound_at)
                self._drop_bound(uid)
        for uid, since in list(self._releasing.items()):
            if since is not None and now - since > self.assume_ttl_s:
                del self._releasing[uid]

    # -- the cycle's snapshot ----------------------------------------------------------------------------------------
    def scheduling_objects(self, scheduler_names: tuple[str, ...], *, pod_groups: Mapping[str, str] | None = None,
                           hold: Collection[str] = ()) -> list[RawObject]:
        """The objects of a scheduling snapshot with assumptions applied (shallow copies where changed).
        Our pods that are not bound lose `status.nominatedNodeName`: a pipelined pod is placed again every cycle
        (KAI semantics), the nomination is only informational. `pod_groups` ("ns/pod" -> PodGroup name): the
        group of pods whose `pod-group-name` annotation is not written yet; `hold`: unbound pods ("ns/pod") left
        out of this snapshot (the grouper could not group them yet)."""
        return [r for _kind, view, keys in self._look(scheduler_names, pod_groups or {}, hold)
                for r in map(view.raw.get, keys) if r is not None]

    def _look(self, scheduler_names: tuple[str, ...], groups: Mapping[str, str],
              hold: Collection[str]) -> _Looks:
        """Each scheduling kind's view brought up to date, with the store's keys in order. Only what may have
        changed is made again: objects written since the last look, pods whose assumption, release, hold or
        group of this cycle changed, releasing pods (their deletion stamp is now), claims a bind holds. What to
        make again, and those keys' objects, are taken under the lock (no copy of a whole store); the views are
        brought up to date after it."""
        with self._lock:
            self._expire()
            ctx = _PodContext(set(scheduler_names), self.reservation_app, dict(self._bound), set(self._releasing),
                              groups, set(hold), _now_rfc3339())
            held = {(a.namespace, claim): (alloc, a.name, uid) for uid, a in ctx.bound.items()
                    for claim, alloc in a.claims}
            kinds = {(r.api_version, r.kind) for r in SCHEDULING_KINDS}
            work = []
            for k, st in self._stores.items():
                if k not in kinds:
                    continue
                changed = st.take_changed("snapshot")
                kind, items = k[1], st.items
                view = self._views.get(k)
                if view is None:
                    view = self._views[k] = _View(kind)
                if view.src is not items or (kind == "Pod" and view.for_ != (ctx.ours, ctx.reservation_app)):
                    view.reset(items, (ctx.ours, ctx.reservation_app))
                    changed = None
                if changed is None:
                    changed = set(items)
                if kind == "Pod":
                    changed |= view.pods_touched(ctx)
                elif kind == "ResourceClaim" and (held or view.held):
                    changed = changed | view.held | {f"{ns}/{name}" for ns, name in held}
                    view.held = {f"{ns}/{name}" for ns, name in held}
                work.append((kind, view, list(items), {key: items.get(key) for key in changed}))
        out = []
        for kind, view, keys, objs in work:
            for key, obj in objs.items():
                if obj is None:
                    view.drop(key)
                elif kind == "Pod":
                    view.put_pod(key, obj, ctx)
                else:
                    raw = view.raw.get(key)
                    if raw is None or raw.obj is not obj:
                        raw = RawObject(kind, obj, "cluster", memo_key=_memo_key(kind, obj))
                    view.put(key, (_held_claim(obj, held) if kind == "ResourceClaim" and held else None) or raw)
            if kind == "Pod":
                view.last = ctx
            out.append((kind, view, keys))
        return out

    def snapshot(self, *, scheduler_names: tuple[str, ...], now: float | None = None,
                 pod_groups: Mapping[str, str] | None = None, hold: Collection[str] = (),
                 shard: ShardFilter | None = None) -> Snapshot:
        """The cycle's `Snapshot` (lenient: a bad object is set aside in `rejected`, the rest is scheduled);
        with a `shard`, only that shard's part of it (kai_opt.k8s.shard.filter_snapshot). Objects whose view did
        not change keep their models; the others are read (`read_raw`, with the memo by uid and
        resourceVersion)."""
        with gc_paused():
            looks = self._look(scheduler_names, pod_groups or {}, hold)
            snap = Snapshot(now=now if now is not None else time.time(), source="cluster",
                            scheduler_names=tuple(scheduler_names) or DEFAULT_SCHEDULER_NAMES)
            buckets: dict[str, list[Any]] = {kind: [] for kind in KINDS}
            total = 0
            for kind, view, keys in looks:
                for key in _read_order(view.unread, view.model, keys):
                    raw = view.raw.get(key)
                    if raw is not None:
                        view.read(key, *read_raw(raw, strict=False, memo=self._memo, source="cluster"))
                view.unread = set()
                total += len(keys)
                models = view.model
                if len(models) == len(keys) and list(models) != keys:  # a key's model went away and came back,
                    # or a key was deleted and added again between looks: the models put in the store's order
                    ordered = {k: m for k in keys if (m := models.get(k)) is not None}
                    if len(ordered) == len(keys):
                        models = view.model = ordered
                if len(models) == len(keys):  # (every key has its model, in the store's order: the common case)
                    buckets[kind].extend(models.values())
                else:
                    buckets[kind].extend(m for m in map(models.get, keys) if m is not None)
                if view.issues:
                    for key in keys:
                        issue = view.issues.get(key)
                        if issue is not None:
                            (snap.warnings if issue.reason == "UnsupportedAPIVersion" else snap.rejected).append(issue)
            snap.fill(buckets, strict=False, unique=True, links=_links(looks, self._missing_groups))
        snap = filter_snapshot(snap, shard)
        if len(self._memo) > 2 * total:  # forget objects that changed or went away
            with self._lock:
                kinds = {(r.api_version, r.kind) for r in SCHEDULING_KINDS}
                present = {_memo_key(k[1], o) for k, st in self._stores.items() if k in kinds
                           for o in st.items.values()}
            self._memo = {k: v for k, v in self._memo.items() if k[:3] in present}
        return snap


_Looks = list[tuple[str, "_View", list[str]]]  # (kind, its view, the store's keys in order)


def _read_order(unread: set[str], models: dict[str, Any], keys: list[str]) -> list[str]:
    """The order to read a look's changed keys in, so that the view's models dict keeps the store's order (the
    snapshot then lists each kind's models without looking up every key): keys that have a model first (a
    replaced model keeps its place), then the new ones in the store's order (`keys`), found from its end, where
    the store adds them."""
    known = [k for k in unread if k in models]
    new = unread.difference(known)
    if len(new) <= 1:
        return known + list(new)
    found: list[str] = []
    for k in reversed(keys):
        if k in new:
            found.append(k)
            if len(found) == len(new):
                break
    found.reverse()
    if len(found) < len(new):  # (not among the store's keys: read all the same)
        found += sorted(new.difference(found))
    return known + found


def _links(looks: _Looks, missing: _MissingGroups) -> Links | None:
    """The cross-object checks' inputs from the Pod and PodGroup views (None: a kind is not watched)."""
    by_kind = {kind: (view, keys) for kind, view, keys in looks}
    if "Pod" not in by_kind or "PodGroup" not in by_kind:
        return None
    (pv, pod_keys), (gv, group_keys) = by_kind["Pod"], by_kind["PodGroup"]

    def pods_naming(groups: set[str]) -> list[Any]:
        return [pv.model[k] for k in pod_keys if k in pv.facts and pv.facts[k][0] in groups]

    def groups_naming(queues: set[str]) -> list[Any]:
        return [gv.model[k] for k in group_keys if k in gv.facts and gv.facts[k][1] in queues]

    def constrained() -> list[Any]:
        return [gv.model[k] for k in group_keys if k in gv.constrained] if gv.constrained else []

    unknown = missing.update(pv, gv)
    return Links(pv.counts[0].keys(), gv.counts[0].keys(), gv.counts[1].keys(), pods_naming, groups_naming,
                 constrained, bool(pv.claiming), lambda: set(unknown))


class _MissingGroups:
    """The group keys pods name that no PodGroup has (the snapshot's PodGroupDoesNotExist check), kept up to date
    from the keys whose counts the Pod and PodGroup views changed since the last update: a look costs what changed,
    not a pass over every pod's group and every PodGroup."""

    def __init__(self) -> None:
        self.keys: set[str] | None = None

    def update(self, pv: _View, gv: _View) -> set[str]:
        pods_moved, groups_moved = pv.take_moved(), gv.take_moved()
        named, present = pv.counts[0], gv.counts[0]
        if self.keys is None or pods_moved is None or groups_moved is None:  # (a view started again)
            self.keys = {k for k in named if k is not None and k not in present}
        else:
            for k in pods_moved | groups_moved:
                if k is not None and k in named and k not in present:
                    self.keys.add(k)
                else:
                    self.keys.discard(k)
        return self.keys


@dataclass
class _PodContext:
    """What a pod's snapshot object depends on besides the pod: the cycle's assumptions, releases, holds, groups."""

    ours: set[str]
    reservation_app: str | None
    bound: dict[str, Assumed]
    releasing: set[str]
    groups: Mapping[str, str]
    hold: set[str]
    stamp: str


class _View:
    """What the last snapshot made of one store's objects, by key: the object as the snapshot reads it (`raw`;
    absent: left out) and its model (`model`; absent: left out, skipped or rejected, with `issues`). The view
    follows one `items` dict of the store (a relist replaces it: the view starts again)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.reset(None, None)

    def reset(self, src: dict[str, Any] | None, for_: Any) -> None:
        self.src, self.for_ = src, for_
        self.raw: dict[str, RawObject] = {}
        self.model: dict[str, Any] = {}
        self.issues: dict[str, Issue] = {}
        self.unread: set[str] = set()
        self.held: set[str] = set()
        # what the cross-object checks read (`Links`), by key: pods: (group key,); PodGroups: (key, queue), with
        # counts of each value, and the keys of constrained PodGroups
        self.facts: dict[str, tuple[Any, ...]] = {}
        self.counts: tuple[Counter[Any], ...] = (Counter(), Counter())
        self.moved: set[Any] | None = None  # the values of counts[0] changed since take_moved (None: all, anew)
        self.constrained: set[str] = set()
        self.claiming: set[str] = set()  # pods: the keys of pods with resource claims
        # pods: (pod, key, uid, annotated, bound, plain, RawObject as it is) by key; the keys by uid; the keys
        # whose group of this cycle matters (not annotated); what the last look used
        self.entry: dict[str, tuple[Any, ...]] = {}
        self.key_of: dict[str, str] = {}
        self.unannotated: set[str] = set()
        self.last: _PodContext | None = None

    def put(self, key: str, raw: RawObject | None) -> None:
        old = self.raw.get(key)
        if raw is None:
            self.drop(key)
        elif raw is not old:
            self.raw[key] = raw
            self.unread.add(key)

    def drop(self, key: str) -> None:
        self.raw.pop(key, None)
        self._forget(key)
        self.model.pop(key, None)
        self.issues.pop(key, None)
        e = self.entry.pop(key, None)
        if e is not None and self.key_of.get(e[2]) == key:
            del self.key_of[e[2]]
        self.unannotated.discard(key)

    def read(self, key: str, model: Any, warning: Issue | None, rejection: Issue | None) -> None:
        self._forget(key)
        if model is not None:
            self.model[key] = model
            self.issues.pop(key, None)
            facts = (model.group_key,) if self.kind == "Pod" else (model.key, model.queue) \
                if self.kind == "PodGroup" else None
            if facts is not None:
                self.facts[key] = facts
                for c, v in zip(self.counts, facts, strict=False):
                    c[v] += 1
                if self.moved is not None:
                    self.moved.add(facts[0])
                if self.kind == "PodGroup" and is_constrained(model):
                    self.constrained.add(key)
                elif self.kind == "Pod" and model.resource_claims:
                    self.claiming.add(key)
        else:
            self.model.pop(key, None)
            issue = warning or rejection
            if issue is not None:
                self.issues[key] = issue

    def _forget(self, key: str) -> None:
        facts = self.facts.pop(key, None)
        if facts is not None:
            for c, v in zip(self.counts, facts, strict=False):
                c[v] -= 1
                if not c[v]:
                    del c[v]
            if self.moved is not None:
                self.moved.add(facts[0])
        self.constrained.discard(key)
        self.claiming.discard(key)

    def take_moved(self) -> set[Any] | None:
        """The values of counts[0] changed since the last take (None: the view started again since: all)."""
        out, self.moved = self.moved, set()
        return out

    def pods_touched(self, ctx: _PodContext) -> set[str]:
        """Keys of pods whose snapshot object may differ from the last look's for reasons outside the pod."""
        last = self.last
        if last is None:
            return set(self.entry)
        out: set[str] = set()
        for uid in ctx.bound.keys() | last.bound.keys():
            a, b = ctx.bound.get(uid), last.bound.get(uid)
            if a is not b:
                for x in (a, b):
                    if x is not None:
                        out.add(f"{x.namespace}/{x.name}")
        for uid in ctx.releasing | last.releasing:  # a releasing pod carries this look's stamp
            key = self.key_of.get(uid)
            if key is not None:
                out.add(key)
        out |= ctx.hold ^ last.hold
        out.update(k for k in self.unannotated if ctx.groups.get(k) != last.groups.get(k))
        return out

    def put_pod(self, key: str, pod: dict[str, Any], ctx: _PodContext) -> None:
        e = self.entry.get(key)
        if e is None or e[0] is not pod:
            if e is not None and self.key_of.get(e[2]) == key:
                del self.key_of[e[2]]
            e = self.entry[key] = _pod_entry(pod, ctx.ours, ctx.reservation_app)
            if e[2]:
                self.key_of[e[2]] = key
            if e[3]:
                self.unannotated.discard(key)
            else:
                self.unannotated.add(key)
        self.put(key, _pod_object(e, ctx))


def _pod_entry(pod: dict[str, Any], ours: set[str], reservation_app: str | None) -> tuple[Any, ...]:
    """(pod, key, uid, annotated, bound, plain, RawObject as it is); `plain`: nothing but an assumption, a hold or
    a group of this cycle can change it."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotated = bool((meta.get("annotations") or {}).get(PODGROUP_ANNOTATION))
    reservation = bool(reservation_app) and (meta.get("labels") or {}).get(APP_LABEL) == reservation_app
    nominated = (not spec.get("nodeName") and status.get("nominatedNodeName")
                 and spec.get("schedulerName") in ours)
    plain = not reservation and not nominated and not meta.get("deletionTimestamp")
    return (pod, f"{meta.get('namespace') or 'default'}/{meta.get('name')}", meta.get("uid"), annotated,
            bool(spec.get("nodeName")), plain, RawObject("Pod", pod, "cluster", memo_key=_memo_key("Pod", pod)))


def _pod_object(e: tuple[Any, ...], ctx: _PodContext) -> RawObject | None:
    """A pod as this cycle's snapshot reads it (None: held out of it)."""
    pod, key, uid, annotated, has_node, plain, raw = e
    bound, releasing, groups, hold = ctx.bound, ctx.releasing, ctx.groups, ctx.hold
    if plain and uid not in bound and uid not in releasing and (annotated or key not in groups) and (
            not hold or has_node or key not in hold):
        return raw
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    a = bound.get(uid)
    if hold and key in hold and a is None and not spec.get("nodeName"):
        return None
    changes: tuple[str, ...] = ()  # what was changed here: part of the memo key of the result
    if ctx.reservation_app and (meta.get("labels") or {}).get(APP_LABEL) == ctx.reservation_app:
        pod = without_gpu(pod)  # a GPU reservation pod: the pods sharing its device account for it
        changes += ("reservation",)
    group = groups.get(key)
    if group and not (meta.get("annotations") or {}).get(PODGROUP_ANNOTATION):
        meta = {**meta, "annotations": {**(meta.get("annotations") or {}), PODGROUP_ANNOTATION: group}}
        pod = {**pod, "metadata": meta}
        changes += ("group", group)
    if a is not None and not spec.get("nodeName"):
        ann = dict(meta.get("annotations") or {})
        devices = ",".join(str(d) for d in a.devices)
        if devices:
            ann[GPU_DEVICES_ANNOTATION] = devices
        else:
            ann.pop(GPU_DEVICES_ANNOTATION, None)
        status = {k: v for k, v in status.items() if k != "nominatedNodeName"}
        pod = {**pod, "metadata": {**meta, "annotations": ann}, "spec": {**spec, "nodeName": a.node},
               "status": status}
        changes += ("bound", a.node, devices)
    elif (not spec.get("nodeName") and status.get("nominatedNodeName")
          and spec.get("schedulerName") in ctx.ours):
        pod = {**pod, "status": {k: v for k, v in status.items() if k != "nominatedNodeName"}}
        changes += ("unnominated",)
    if uid in releasing and not meta.get("deletionTimestamp"):
        pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "deletionTimestamp": ctx.stamp}}
        changes += ("releasing", ctx.stamp)
    if not changes:
        return raw
    memo_key = _memo_key("Pod", pod)
    return RawObject("Pod", pod, "cluster", memo_key=memo_key + changes if memo_key is not None else None)


def _held_claim(claim: dict[str, Any], held: Mapping[tuple[str, str], tuple[Any, str, str]]) -> RawObject | None:
    """A claim a pending BindRequest of ours will allocate, as it will be (allocated, reserved for the pod); None:
    not one, or the claim has an allocation already."""
    meta = claim.get("metadata") or {}
    h = held.get((meta.get("namespace") or "default", meta.get("name") or ""))
    status = claim.get("status") or {}
    if h is None or status.get("allocation") is not None:
        return None
    alloc, pod, uid = h
    reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
    status = {**status, "allocation": alloc, "reservedFor": [*reserved, {"resource": "pods", "name": pod, "uid": uid}]}
    return RawObject("ResourceClaim", {**claim, "status": status}, "cluster")


def _memo_key(kind: str, obj: dict[str, Any]) -> tuple[str, ...] | None:
    """(kind, uid, resourceVersion): the same key means the same content, so its parsed model can be reused."""
    meta = obj.get("metadata") or {}
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    return (kind, str(uid), str(rv)) if uid and rv else None


def watch_kinds_of(owner_kinds: Iterable[tuple[str, str, str]]) -> list[Resource]:
    """Resources for (api_version, kind, plural) triples of namespaced workload kinds (the pod grouper's owners)."""
    return [Resource(av, kind, plural, True) for av, kind, plural in owner_kinds]

