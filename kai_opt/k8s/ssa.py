"""Server-side apply (`kai-opt manifests --apply`): each object is sent as a PATCH of type
`application/apply-patch+yaml` with `fieldManager=kai-opt`, so the apiserver merges it field by field and keeps
the fields other managers own (KAI's Helm release on shared CRDs, kai-opt's own webhook caBundle, an HPA's
replicas), unlike create-then-replace, which drops them.

Conflicts (kubectl's rule): when another manager owns a field kai-opt sets to a different value, the apply fails
with `ApplyConflictError` naming the managers and fields, unless `force` (`--force-conflicts`), which takes those
fields over. A field kai-opt applied before and no longer sets is removed (unless another manager owns it too).
Objects no longer rendered are not deleted (no pruning): delete them by hand after an upgrade that drops them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.errors import KaiOptError
from kai_opt.k8s.client import Discovery, apply_in_order, cluster_error, object_path, request_status

FIELD_MANAGER = "kai-opt"
APPLY_PATCH = "application/apply-patch+yaml"


class ApplyConflictError(KaiOptError):
    """Another field manager owns fields this apply would change (re-run with --force-conflicts to take them)."""


def _label(obj: dict[str, Any]) -> str:
    api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    return f"{kind.lower()}.{api_version.split('/')[0]}/{name}" if "/" in api_version else f"{kind.lower()}/{name}"


def _conflict_message(exc: ApiException, label: str) -> str:
    try:
        causes = (json.loads(exc.body or "{}").get("details") or {}).get("causes") or []
    except ValueError:
        causes = []
    what = "; ".join(" ".join(str(c.get("message", "")).split()) for c in causes[:5]) or "conflicts"
    more = f" (and {len(causes) - 5} more)" if len(causes) > 5 else ""
    return f"apply {label}: {what}{more}; re-run with --force-conflicts to take these fields over"


def apply_one(api: client.ApiClient, disco: Discovery, obj: dict[str, Any], *,
              field_manager: str = FIELD_MANAGER, force: bool = False) -> str:
    """Server-side apply one object; "<kind>.<group>/<name> created" or "... serverside-applied"."""
    meta = obj.get("metadata") or {}
    label = _label(obj)
    try:
        plural, namespaced = disco.resource(obj["apiVersion"], obj["kind"])
        namespace = (meta.get("namespace") or "default") if namespaced else None
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        status, _ = request_status(api, "PATCH", object_path(obj["apiVersion"], plural, namespace, meta["name"]),
                                   body=json.dumps(obj), query=query, content_type=APPLY_PATCH)
    except ApiException as exc:
        if exc.status == 409 and not force:
            raise ApplyConflictError(_conflict_message(exc, label)) from exc
        raise cluster_error(exc, f"apply {label}", api) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise cluster_error(exc, f"apply {label}", api) from exc
    return f"{label} {'created' if status == 201 else 'serverside-applied'}"


def server_side_apply(api: client.ApiClient, objects: Iterable[dict[str, Any]], *,
                      field_manager: str = FIELD_MANAGER, force: bool = False,
                      crd_timeout: float = 60.0) -> list[str]:
    """Apply every object (CRDs and Namespaces first; the CRDs are waited for until Established, so the objects of
    their kinds that follow are known). Returns one line per object, as kubectl prints."""
    return apply_in_order(api, objects, lambda a, d, o: apply_one(a, d, o, field_manager=field_manager, force=force),
                          crd_timeout=crd_timeout)
