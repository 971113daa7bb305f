"""Dump the objects kai-opt schedules from (Nodes, Pods, PodGroups, Queues, PriorityClasses, Topologies) as one
kubectl-style `kind: List`, readable by `kai-opt show` and every other snapshot command.

Objects are kept as the server sent them (raw JSON, nothing dropped) except `metadata.managedFields`; every item
carries apiVersion and kind. Lists are read in pages. A CRD the cluster does not serve is skipped with a note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import PODGROUP, QUEUE, TOPOLOGY, cluster_error, object_path, request

PAGE_SIZE = 500


@dataclass(frozen=True)
class Source:
    """One kind to dump: where it is served and whether a 404 means "not installed" (CRDs)."""

    kind: str
    api_version: str
    plural: str
    optional: bool = False


SOURCES: tuple[Source, ...] = (
    Source("Node", "v1", "nodes"),
    Source("Pod", "v1", "pods"),
    *(Source(c.kind, c.api_version, c.plural, optional=True) for c in (PODGROUP, QUEUE)),
    Source("PriorityClass", "scheduling.k8s.io/v1", "priorityclasses"),
    Source(TOPOLOGY.kind, TOPOLOGY.api_version, TOPOLOGY.plural, optional=True),
)


def list_objects(api: client.ApiClient, src: Source, *, page_size: int = PAGE_SIZE) -> list[dict[str, Any]]:
    """Every object of one kind in all namespaces, read in pages, with apiVersion/kind set and managedFields
    removed. A page token that expired (410, very large lists) restarts the list. Raises `ApiException` /
    urllib3 errors as they come."""
    path = object_path(src.api_version, src.plural, None)
    for _attempt in range(3):
        items: list[dict[str, Any]] = []
        cont: str | None = None
        try:
            while True:
                page = request(api, "GET", path, query={"limit": page_size, "continue": cont})
                items.extend(clean(item, src) for item in page.get("items") or [])
                cont = (page.get("metadata") or {}).get("continue") or None
                if not cont:
                    return items
        except ApiException as exc:
            if exc.status != 410 or cont is None:
                raise
    raise ApiException(status=410, reason=f"the list of {src.plural} kept expiring while being read")


def clean(item: dict[str, Any], src: Source) -> dict[str, Any]:
    """An item of a list answer as a standalone object: apiVersion and kind first, no managedFields."""
    meta = dict(item.get("metadata") or {})
    meta.pop("managedFields", None)
    rest = {k: v for k, v in item.items() if k not in ("apiVersion", "kind", "metadata")}
    return {"apiVersion": src.api_version, "kind": src.kind, "metadata": meta, **rest}


def dump_cluster(api: client.ApiClient, *, note: Callable[[str], None] = lambda _m: None,
                 sources: tuple[Source, ...] = SOURCES) -> dict[str, Any]:
    """All objects of `sources` as one `{"apiVersion": "v1", "kind": "List", "items": [...]}`.
    A missing optional kind (404) is reported through `note`; any other failure raises `ClusterError`."""
    items: list[dict[str, Any]] = []
    for src in sources:
        try:
            items.extend(list_objects(api, src))
        except ApiException as exc:
            if exc.status == 404 and src.optional:
                note(f"{src.kind} ({src.plural}.{src.api_version.split('/')[0]}) is not served by the cluster "
                     f"(CRD not installed); skipped")
                continue
            raise cluster_error(exc, f"list {src.plural}", api) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise cluster_error(exc, f"list {src.plural}", api) from exc
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
