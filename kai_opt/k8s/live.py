"""One-shot read of a live cluster for the CLI (`kai-opt show|solve|explain|fairshare` without a snapshot file).

Rule: the objects are read through `run`'s watch cache code (kai_opt/k8s/cache.py): one list of each scheduling
kind, no watch, no assumptions, into the same `Snapshot` the file loaders build from a `kai-opt dump` of the same
cluster (strict: a bad object is an error, as it is in a file). A kind the cluster does not serve (its CRD is not
installed) or RBAC forbids reading is left out with a note, as `kai-opt dump` does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import urllib3
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import cluster_error, make_api_client
from kai_opt.limits import check_counts
from kai_opt.snapshot import RawObject, Snapshot


def read_cluster(*, kubeconfig: str | Path | None = None, context: str | None = None,
                 scheduler_names: tuple[str, ...] | None = None, now: float | None = None,
                 note: Callable[[str], None] = lambda _m: None) -> Snapshot:
    """The cluster's scheduling objects as a `Snapshot` (source "cluster"). Raises `ClusterError` when the cluster
    cannot be read (connection, authentication, a refused list other than a missing CRD)."""
    with make_api_client(kubeconfig=kubeconfig, context=context) as api:
        cache = ClusterCache(api)
        for store in list(cache._stores.values()):  # one list per kind: the cache's own list code, no watch
            res = store.res
            try:
                cache._list(res)
            except ApiException as exc:
                if exc.status in (403, 404) and res.kind not in ("Node", "Pod"):
                    cache._mark_absent(res, forbidden=exc.status == 403)
                    why = "forbidden by RBAC" if exc.status == 403 else "not served (CRD not installed)"
                    note(f"{res.kind} ({res.api_version}): {why}; read as none")
                    continue
                raise cluster_error(exc, f"list {res.plural}", api) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise cluster_error(exc, f"list {res.plural}", api) from exc
        # no scheduler names: nothing is rewritten (no assumptions exist), the objects are as listed
        # typed list[RawObject]: mypy reads cache.py's `list` annotation as the cache's method `list`
        objects: list[RawObject] = cache.scheduling_objects(())  # type: ignore[valid-type]
    kinds: dict[str, int] = {}
    for o in objects:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    check_counts(kinds, source="cluster")
    snap = Snapshot.from_objects(objects, scheduler_names=scheduler_names, now=now, source="cluster")
    check_counts({"GPU devices": sum(n.gpus for n in snap.nodes)}, source="cluster")
    return snap
