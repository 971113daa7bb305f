"""The pod grouper's result kept up to date from the watch cache's changes.

`grouper.group_pods` walks every pod of ours every cycle; on a steady cluster almost none of them changed.
`LiveGrouping` keeps, per pod, what the grouper made of it and which owner objects its owner walk read, and per
PodGroup its members. Each call redoes only the pods written since the last one, the pods whose walk read an owner
written since, and the PodGroups they join or leave; the rest is reused. Its result equals `group_pods` over the
cache's pods of our schedulers in the cache's order (tests/test_live_grouping.py compares the two over random
change sequences). A store that was replaced (a relist) makes it start over.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client

from kai_opt.api.pod import PODGROUP_ANNOTATION
from kai_opt.k8s.cache import ClusterCache, StoreChanges, object_key
from kai_opt.k8s.client import PODGROUP
from kai_opt.k8s.grouper import (
    Grouping,
    GroupingError,
    _annotations,
    _Deferred,
    _describe,
    _Group,
    _group,
    _group_for,
    _meta,
    _pod_key,
    _podgroup,
    run_calls,
    sync_call,
    top_owner,
)
from kai_opt.k8s.kinds import OWNER_KINDS

POD = ("", "Pod")
# the stores a pod's group depends on: the pods themselves and every kind the owner walk reads
KINDS = frozenset({POD} | {(_group(api_version), kind) for api_version, kind, _ in OWNER_KINDS})

OwnerKey = tuple[str, str, str]  # (API group, kind, "namespace/name") of an object an owner walk read


@dataclass
class _Entry:
    """What the grouper made of one pod of ours (one that is not finished and has a name)."""

    rank: int  # its place in the cache's order
    key: str  # "namespace/name"
    annotated: str | None  # its pod-group-name annotation
    deps: tuple[OwnerKey, ...]  # the owners its walk read (a write to one redoes the pod)
    group: tuple[str, str] | None = None  # (namespace, name) of the PodGroup it counts in
    outcome: _Group | None = None


@dataclass
class _Members:
    """One PodGroup: its members by store key (rank, pod, the grouper's outcome for it), its object once made."""

    members: dict[str, tuple[int, dict[str, Any], _Group]]
    podgroup: dict[str, Any] | None = None
    first: int = -1  # the smallest member rank (the group's place in the output)


class LiveGrouping:
    """`group_pods` kept up to date across calls (see the module docstring); one per cache and consumer."""

    def __init__(self, default_queue: str, consumer: str = "grouper") -> None:
        self.default_queue = default_queue
        self.consumer = consumer
        self._names: frozenset[str] | None = None
        self._reset()

    def _reset(self) -> None:
        self._pods: dict[str, _Entry] = {}  # pod store key -> entry
        self._by_owner: dict[OwnerKey, set[str]] = {}  # owner -> pod store keys whose walk read it
        self._groups: dict[tuple[str, str], _Members] = {}
        self._dirty: set[tuple[str, str]] = set()  # groups whose members changed since their object was made
        self._order: list[tuple[str, str]] | None = None  # groups in output order (None: to be sorted again)
        # pods in each of the result's lists, by store key: (rank, item); a list is sorted again when it changed
        self._unbound: dict[str, tuple[int, tuple[str, str | None]]] = {}
        self._deferred: dict[str, tuple[int, str]] = {}
        self._errors: dict[str, tuple[int, str]] = {}
        self._stale = {"unbound": True, "deferred": True, "errors": True}
        self._lists: dict[str, list[Any]] = {"unbound": [], "deferred": [], "errors": []}
        self._assignments: dict[str, str] = {}
        self._annotated: dict[str, str | None] = {}

    def update(self, cache: ClusterCache, scheduler_names: tuple[str, ...]) -> Grouping:
        """The grouping of the cache's pods of these schedulers now (the lists and dicts are the caller's)."""
        names = frozenset(scheduler_names)
        changes = cache.take_changes(self.consumer, KINDS)
        pod_stores = [c for (av, kind), c in changes.items() if (_group(av), kind) == POD]
        if names != self._names or any(c.whole for c in changes.values()):
            self._names = names
            self._reset()
            if pod_stores and all(c.whole for c in pod_stores):
                pods = {k: v for c in pod_stores for k, v in c.objects.items()}
            else:  # other schedulers' names, or an owner store replaced: every pod again
                pods = cache.objects_with_rank("v1", "Pod", _all_pod_keys(cache))
        else:
            pods = {k: v for c in pod_stores for k, v in c.objects.items()}
            again = self._owned_by(changes) - pods.keys()
            if again:
                pods.update(cache.objects_with_rank("v1", "Pod", again))
        walks: dict[str, tuple[dict[str, Any] | None, tuple[OwnerKey, ...]]] = {}
        for key in sorted(pods, key=lambda k: pods[k][1]):
            self._drop(key)
            pod, rank = pods[key]
            if pod is not None and (pod.get("spec") or {}).get("schedulerName") in names:
                self._add(key, pod, rank, cache, walks)
        return self._result()

    def _owned_by(self, changes: dict[tuple[str, str], StoreChanges]) -> set[str]:
        """Pods whose owner walk read an object written since the last call."""
        out: set[str] = set()
        for (av, kind), c in changes.items():
            group = _group(av)
            for key in c.objects:
                out |= self._by_owner.get((group, kind, key), set())
        return out

    # -- one pod ---------------------------------------------------------------------------------------------------
    def _drop(self, key: str) -> None:
        e = self._pods.pop(key, None)
        if e is None:
            return
        for owner in e.deps:
            keys = self._by_owner.get(owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_owner[owner]
        for name, kept in (("unbound", self._unbound), ("deferred", self._deferred), ("errors", self._errors)):
            if kept.pop(key, None) is not None:
                self._stale[name] = True
        if e.group is not None:
            m = self._groups[e.group]
            del m.members[key]
            self._dirty.add(e.group)
            self._assignments.pop(e.key, None)
            self._annotated.pop(e.key, None)

    def _add(self, key: str, pod: dict[str, Any], rank: int, cache: ClusterCache,
             walks: dict[str, tuple[dict[str, Any] | None, tuple[OwnerKey, ...]]]) -> None:
        meta = _meta(pod)
        if not meta.get("name") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        pkey = _pod_key(pod)
        annotated = _annotations(pod).get(PODGROUP_ANNOTATION)
        unbound = not (pod.get("spec") or {}).get("nodeName")
        top, deps = _walk(pod, cache, walks)
        e = _Entry(rank, pkey, annotated, deps)
        self._pods[key] = e
        for owner in deps:
            self._by_owner.setdefault(owner, set()).add(key)
        if unbound:
            self._unbound[key] = (rank, (pkey, annotated))
            self._stale["unbound"] = True
        if top is None:  # an owner is not known yet
            if not annotated:
                self._deferred[key] = (rank, pkey)
                self._stale["deferred"] = True
            return
        try:
            outcome = _group_for(pod, top)
        except GroupingError as exc:
            if not annotated:  # its owner spec gives no valid group
                self._errors[key] = (rank, f"pod {pkey}: {_describe(top)}: {exc}")
                self._stale["errors"] = True
            return
        if annotated and annotated != outcome.name:
            return  # the user's own group
        e.group, e.outcome = (outcome.namespace, outcome.name), outcome
        m = self._groups.get(e.group)
        if m is None:
            m = self._groups[e.group] = _Members({})
        m.members[key] = (rank, pod, outcome)
        self._dirty.add(e.group)
        self._assignments[pkey] = outcome.name
        self._annotated[pkey] = annotated

    # -- the result ------------------------------------------------------------------------------------------------
    def _result(self) -> Grouping:
        for g in self._dirty:
            m = self._groups[g]
            if not m.members:
                del self._groups[g]
                self._order = None
                continue
            members = sorted(m.members.values(), key=lambda x: x[0])
            first = members[0][0]
            if first != m.first:
                m.first = first
                self._order = None
            group = replace(members[0][2], pods=[pod for _, pod, _ in members])
            m.podgroup = _podgroup(group, self.default_queue)
        self._dirty.clear()
        if self._order is None:
            self._order = sorted(self._groups, key=lambda g: self._groups[g].first)
        for name, kept in (("unbound", self._unbound), ("deferred", self._deferred), ("errors", self._errors)):
            if self._stale[name]:
                self._lists[name] = [item for _, item in sorted(kept.values(), key=lambda x: x[0])]
                self._stale[name] = False
        unbound, deferred, errors = self._lists["unbound"], self._lists["deferred"], self._lists["errors"]
        podgroups: list[dict[str, Any]] = []
        for g in self._order:
            pg = self._groups[g].podgroup
            assert pg is not None
            podgroups.append(pg)
        return Grouping(podgroups=podgroups, assignments=dict(self._assignments), annotated=dict(self._annotated),
                        deferred=list(deferred), errors=list(errors), unbound=list(unbound))


def _all_pod_keys(cache: ClusterCache) -> list[str]:
    return [object_key(p) for p in cache.list("Pod", "v1")]


def _walk(pod: dict[str, Any], cache: ClusterCache,
          walks: dict[str, tuple[dict[str, Any] | None, tuple[OwnerKey, ...]]]
          ) -> tuple[dict[str, Any] | None, tuple[OwnerKey, ...]]:
    """The pod's top owner (None: an owner is not known yet) and the owners read to find it; pods under the same
    controller share one walk per call."""
    refs = _meta(pod).get("ownerReferences") or []
    if not refs:
        return pod, ()
    ref = next((r for r in refs if isinstance(r, dict) and r.get("controller")), refs[0])
    uid = ref.get("uid") if isinstance(ref, dict) else None
    if uid and uid in walks:
        return walks[uid]
    deps: list[OwnerKey] = []

    def get_owner(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        deps.append((_group(api_version), kind, f"{namespace}/{name}"))
        return cache.get(api_version, kind, namespace, name)

    top: dict[str, Any] | None
    try:
        top = top_owner(pod, get_owner)
    except _Deferred:
        top = None
    out = (top, tuple(deps))
    if uid and top is not pod:
        walks[uid] = out
    return out


class PodGroupSync:
    """`grouper.sync_podgroups` for a caller that runs it every cycle against a watch cache: a desired PodGroup is
    compared with the cache's only when it is another object than at the last call that found the two in sync
    (LiveGrouping hands the same object while the group does not change) or the cache's PodGroup of that name was
    written since; the rest are known to be in sync. A request that fails leaves its PodGroup out of sync, so the
    next call tries again."""

    def __init__(self, consumer: str = "podgroup-sync") -> None:
        self.consumer = consumer
        self._in_sync: dict[str, dict[str, Any]] = {}  # "ns/name" -> the desired object found in sync
        self._key_of: dict[int, tuple[dict[str, Any], str]] = {}  # id(desired object) -> (it, its "ns/name")

    def sync(self, api: client.ApiClient, desired: list[dict[str, Any]], cache: ClusterCache, *,
             workers: int = 8) -> None:
        for c in cache.take_changes(self.consumer, {(PODGROUP.group, PODGROUP.kind)}).values():
            if c.whole:
                self._in_sync.clear()
            for key in () if c.whole else c.objects:
                self._in_sync.pop(key, None)
        in_sync, key_of = self._in_sync, self._key_of
        if len(key_of) > 2 * len(desired) + 1000:  # objects of groups long gone
            key_of.clear()
        co = client.CustomObjectsApi(api)
        todo = []
        for pg in desired:
            e = key_of.get(id(pg))
            if e is None or e[0] is not pg:
                meta = _meta(pg)
                e = key_of[id(pg)] = (pg, f"{meta.get('namespace') or 'default'}/{meta['name']}")
            key = e[1]
            if in_sync.get(key) is pg:
                continue
            ns, name = key.split("/", 1)
            call = sync_call(co, pg, ns, name, cache.get(PODGROUP.api_version, PODGROUP.kind, ns, name))
            if call is None:
                in_sync[key] = pg
            else:
                in_sync.pop(key, None)
                todo.append(call)
        run_calls(todo, api, "sync podgroups", workers=workers)
