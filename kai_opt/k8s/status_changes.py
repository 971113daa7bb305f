"""What changed since the status writer's last cycle: the PodGroups whose status or annotations may have to change.

A PodGroup's status is a function of its object, the Pod models of ours that name it and the plan's reasons for it;
its annotations of its object, its pods' counts against minMember and its queue position. The watch cache hands the
same object while it does not change, and the snapshot the same Pod model while its pod does not change, so a
cycle need only look at the groups whose object or member models are not the last cycle's, besides those the plan
names. Finding them costs set operations over the pods' identities instead of a pass over every pod and group.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

from kai_opt.api import Pod
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import PODGROUP

_consumers = itertools.count()


class Members:
    """PodGroup key (namespace/name) -> the snapshot's pods of ours that name it, kept across snapshots: a pod
    model seen before keeps its place, so only added and gone models are read."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[int, Pod]] = {}  # key -> id(pod) -> pod (insertion order)
        self._seen: dict[int, tuple[Pod, str]] = {}  # id(pod) -> (pod, its key or ''): holding the models keeps
        # their ids unique while they are compared with the next snapshot's

    def update(self, pods: list[Pod], ours: Collection[str]) -> set[str]:
        """Take in a snapshot's pods; the keys whose members changed."""
        current = dict(zip(map(id, pods), pods, strict=True))
        changed: set[str] = set()
        seen, groups = self._seen, self.groups
        for i in seen.keys() - current.keys():
            _pod, key = seen.pop(i)
            if key:
                group = groups[key]
                del group[i]
                if not group:
                    del groups[key]
                changed.add(key)
        for i in current.keys() - seen.keys():
            p = current[i]
            key = f"{p.namespace}/{p.podgroup}" if p.podgroup and p.scheduler_name in ours else ""
            seen[i] = (p, key)
            if key:
                groups.setdefault(key, {})[i] = p
                changed.add(key)
        return changed


class PodGroupChanges:
    """The cache's PodGroup objects written since the last `take` (a consumer of the watch cache of its own)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.consumer = f"status-writer-{next(_consumers)}"

    def take(self) -> set[str] | None:
        """The keys (namespace/name, as the writer names groups) of the PodGroups written since the last call;
        None when every object is to be read (the first call, a relist)."""
        out: set[str] = set()
        for c in self.cache.take_changes(self.consumer, {(PODGROUP.group, PODGROUP.kind)}).values():
            if c.whole:
                return None
            out.update(podgroup_key(obj) if obj is not None else key if "/" in key else f"default/{key}"
                       for key, (obj, _rank) in c.objects.items())  # (deleted: the cache's key, namespace/name)
        return out


def podgroup_key(obj: dict[str, Any]) -> str:
    """The writer's key of a PodGroup object: its namespace ('default' when absent) and name."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
