"""The only code that talks to a cluster: connection, CRDs and manifests, cache, binder, evictor, status, webhook.

Importing the package (which every `kai_opt.k8s.X` import does) imports no Kubernetes client: the kinds come from
kai_opt/k8s/kinds.py, and the client's names below are imported on first use, so rendering manifests
(`kai-opt manifests`) stays without the client (a third of a second).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from kai_opt.k8s.kinds import (
    CRD,
    CRDS,
    KAI_GROUP,
    PODGROUP,
    QUEUE,
    SCHEDULING_GROUP,
    TOPOLOGY,
    crd_manifests,
    parse_yaml,
)

if TYPE_CHECKING:
    from kai_opt.k8s.client import ClusterError, apply_objects, install_crds, make_api_client

_FROM_CLIENT = ("ClusterError", "apply_objects", "install_crds", "make_api_client")


def __getattr__(name: str) -> Any:
    if name in _FROM_CLIENT:
        return getattr(import_module("kai_opt.k8s.client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CRD",
    "CRDS",
    "KAI_GROUP",
    "PODGROUP",
    "QUEUE",
    "SCHEDULING_GROUP",
    "TOPOLOGY",
    "ClusterError",
    "apply_objects",
    "crd_manifests",
    "install_crds",
    "make_api_client",
    "parse_yaml",
]
