"""The only code that talks to a cluster: connection, CRDs and manifests, dump (later: cache, binder, evictor)."""

from kai_opt.k8s.client import (
    CRD,
    CRDS,
    KAI_GROUP,
    PODGROUP,
    QUEUE,
    SCHEDULING_GROUP,
    TOPOLOGY,
    ClusterError,
    apply_objects,
    crd_manifests,
    install_crds,
    make_api_client,
    parse_yaml,
)

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
