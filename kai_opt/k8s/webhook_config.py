"""The GPU-sharing webhook's MutatingWebhookConfiguration and its names, scoped as kai_opt/k8s/webhook.py's
docstring says: one description for `kai-opt run` (which keeps its caBundle) and the manifests/chart
(kai_opt/k8s/manifests.py), kept apart from the webhook server so that rendering manifests imports no client."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

WEBHOOK_NAME = "kai-opt"  # the MutatingWebhookConfiguration
SERVICE_NAME = "kai-opt-webhook"
SECRET_NAME = "kai-opt-webhook-tls"
PATH = "/mutate-pods"
DEFAULT_PORT = 9443
OPT_OUT_LABEL = "kai-opt.io/gpu-sharing-webhook"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
ADMISSION = "admissionregistration.k8s.io/v1"


def webhook_configuration(namespace: str, scheduler_names: Sequence[str], *, reservation_namespace: str,
                          ca_bundle: str = "", url: str | None = None, port: int = 443) -> dict[str, Any]:
    """kai-opt's MutatingWebhookConfiguration: the webhook Service in `namespace` (or `url`), scoped as
    kai_opt/k8s/webhook.py's docstring says."""
    client_config: dict[str, Any] = ({"url": url} if url else
                                     {"service": {"namespace": namespace, "name": SERVICE_NAME, "path": PATH,
                                                  "port": port}})
    if ca_bundle:
        client_config["caBundle"] = base64.b64encode(ca_bundle.encode()).decode()
    names = ", ".join(json.dumps(n) for n in scheduler_names)
    excluded = sorted({*SYSTEM_NAMESPACES, namespace, reservation_namespace})
    metadata = {"name": WEBHOOK_NAME, "labels": {"app.kubernetes.io/name": "kai-opt",
                                                 "app.kubernetes.io/part-of": "kai-opt"}}
    return configuration_body(metadata, client_config, excluded,
                              f"has(object.spec.schedulerName) && object.spec.schedulerName in [{names}]")


def configuration_body(metadata: Any, client_config: Any, excluded: Any, scheduled_by_us: Any) -> dict[str, Any]:
    """The configuration with its variable parts given (values here, template markers in the chart: the one
    description both use)."""
    return {
        "apiVersion": ADMISSION, "kind": "MutatingWebhookConfiguration", "metadata": metadata,
        "webhooks": [{
            "name": "gpu-sharing.kai-opt.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "timeoutSeconds": 5,
            "clientConfig": client_config,
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                        "values": excluded}]},
            "objectSelector": {"matchExpressions": [{"key": OPT_OUT_LABEL, "operator": "NotIn",
                                                     "values": ["disabled"]}]},
            "matchConditions": [
                {"name": "shares-a-gpu", "expression": "has(object.metadata.annotations) && "
                 "('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations)"},
                {"name": "kai-opt-schedules-it", "expression": scheduled_by_us},
            ],
        }],
    }
