"""Everything `kubectl apply -f -` needs to run kai-opt in a cluster (`kai-opt manifests`): the CRDs (package
data, schema-compatible with KAI-Scheduler's), a Namespace, a ServiceAccount with least-privilege RBAC, the
configuration as a ConfigMap, a 2-replica leader-elected Deployment with probes on the metrics port, KAI's default
PriorityClasses and a default Queue.

The ClusterRole grants exactly what the scheduler does: read (get/list/watch) Nodes, Pods, PodGroups, Queues,
PriorityClasses, Topologies and the pod grouper's owner kinds; bind (pods/binding, which also records the GPU
devices) and evict (pods/eviction); patch Pods (the grouper's pod-group-name annotation) and their status
(nominatedNodeName); create and patch PodGroups (the grouper) and update/patch their status and Queue status;
create/patch Events (core and events.k8s.io); create and patch ConfigMaps (the shared-GPU ConfigMaps of GPU-sharing
pods; never read, never deleted: they go with their pod). A Role in its own namespace covers the leader-election
Lease (get/create/update). With GPU sharing on (`runtime.gpu_sharing.enabled`), the reservation namespace
(`kai-resource-reservation`) is created with a Role letting kai-opt create and delete pods there (the GPU
reservation pods), and a ServiceAccount for the reservation pods whose Role lets them get and patch pods there
only (each reports its GPU in its own annotation). The GPU-sharing admission webhook comes with its Service, its
MutatingWebhookConfiguration, and for its certificate a Role to create Secrets in kai-opt's namespace and read
Secret kai-opt-webhook-tls only, plus get/patch of that one configuration (its caBundle). Nothing else (no
other Secret read, no deletes outside the reservation namespace, no Queue spec writes).

With `runtime.binder: kai` (the default with `--existing-kai`, unless the config sets `binder`) KAI's binder binds:
kai-opt gets create/get/list/watch/delete on BindRequests instead of pods/binding and ConfigMap writes, and no
reservation namespace objects (KAI's binder makes the reservation pods in its own).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kai_opt import __version__
from kai_opt.api.priorityclass import DEFAULT_PRIORITY_CLASSES
from kai_opt.config import BinderKind, Config, default_config_yaml
from kai_opt.errors import InputError
from kai_opt.k8s.client import KAI_GROUP, PODGROUP, QUEUE, SCHEDULING_GROUP, TOPOLOGY, crd_manifests, parse_yaml
from kai_opt.k8s.grouper import OWNER_KINDS
from kai_opt.k8s.kaibind import API_VERSION as BINDREQUEST_API_VERSION
from kai_opt.k8s.kaibind import PLURAL as BINDREQUEST_PLURAL
from kai_opt.k8s.webhook import DEFAULT_PORT as DEFAULT_WEBHOOK_PORT
from kai_opt.k8s.webhook import SECRET_NAME, SERVICE_NAME, WEBHOOK_NAME, webhook_configuration

NAME = "kai-opt"
DEFAULT_NAMESPACE = "kai-opt"
DEFAULT_IMAGE = f"kai-opt:{__version__}"
METRICS_PORT = 8080
WEBHOOK_PORT = DEFAULT_WEBHOOK_PORT
CONFIG_PATH = "/etc/kai-opt/config.yaml"
LEASE_NAME = NAME
READ = ["get", "list", "watch"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": NAME}


def _meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(_LABELS)}
    if namespace:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


def cluster_rules(binder: BinderKind = BinderKind.kai_opt) -> list[dict[str, Any]]:
    """The ClusterRole's rules (least privilege; see the module docstring)."""
    kai = binder == BinderKind.kai
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": READ},
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*READ, "patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"] if kai else ["pods/binding", "pods/eviction"],
         "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},  # nominatedNodeName (pipelined)
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        *([{"apiGroups": [BINDREQUEST_API_VERSION.split("/")[0]], "resources": [BINDREQUEST_PLURAL],
            "verbs": ["create", *READ, "delete"]}] if kai else
          [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}]),  # shared-GPU ConfigMaps
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [SCHEDULING_GROUP], "resources": [PODGROUP.plural], "verbs": [*READ, "create", "patch"]},
        {"apiGroups": [SCHEDULING_GROUP], "resources": [QUEUE.plural], "verbs": READ},
        {"apiGroups": [SCHEDULING_GROUP], "resources": [f"{PODGROUP.plural}/status", f"{QUEUE.plural}/status"],
         "verbs": ["update", "patch"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": READ},
        {"apiGroups": [KAI_GROUP], "resources": [TOPOLOGY.plural], "verbs": READ},
    ]
    owners: dict[str, list[str]] = {}
    for api_version, _kind, plural in OWNER_KINDS:
        group = api_version.split("/")[0] if "/" in api_version else ""
        if plural not in owners.setdefault(group, []):
            owners[group].append(plural)
    rules += [{"apiGroups": [group], "resources": plurals, "verbs": READ} for group, plurals in owners.items()]
    return rules


def _deployment(namespace: str, image: str, replicas: int, *, webhook: bool) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": NAME}
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["run", "--config", CONFIG_PATH, "--leader-elect", "--lease-namespace", namespace,
                 "--metrics-port", str(METRICS_PORT), *(["--webhook-port", str(WEBHOOK_PORT)] if webhook else [])],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                  *([{"name": "webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"}] if webhook else [])],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "initialDelaySeconds": 15,
                          "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "initialDelaySeconds": 5,
                           "periodSeconds": 10, "timeoutSeconds": 5},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/kai-opt", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(NAME, namespace),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # replace pods one at a time: the other replica, synced and ready (leader or standby), keeps scheduling
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {
                "metadata": {"labels": {**_LABELS, **selector},
                             "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                                             "prometheus.io/path": "/metrics"}},
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": f"{NAME}-config"}},
                                {"name": "tmp", "emptyDir": {}}],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                           "labelSelector": {"matchLabels": selector}}}]}},
                },
            },
        },
    }


def build_manifests(namespace: str = DEFAULT_NAMESPACE, image: str = DEFAULT_IMAGE, *, replicas: int = 2,
                    config: Config | None = None, existing_kai: bool = False) -> list[dict[str, Any]]:
    """The objects to apply, in apply order (CRDs and the Namespace first).

    existing_kai: the cluster already runs KAI-Scheduler. Its CRDs, PriorityClasses and queues are already there
    and stay KAI's (re-applying ours would replace KAI's CRD schemas, and a PriorityClass's value is immutable), so
    only the scheduler's own objects are returned: Namespace, ServiceAccount, RBAC, ConfigMap and Deployment."""
    if not _DNS_LABEL.match(namespace):
        raise InputError(f"invalid namespace {namespace!r}: must be a DNS label (lowercase letters, digits, '-', "
                         "at most 63 characters)", field="--namespace")
    if not image or any(c.isspace() for c in image):
        raise InputError(f"invalid image {image!r}", field="--image")
    if replicas < 1:
        raise InputError(f"replicas must be at least 1, got {replicas}", field="--replicas")
    cfg = config or Config()
    if existing_kai and "binder" not in cfg.runtime.model_fields_set:  # one binder: KAI's
        cfg = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"binder": BinderKind.kai})})
    objs: list[dict[str, Any]] = [] if existing_kai else list(parse_yaml(crd_manifests()))
    objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(namespace)})
    objs.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, namespace)})
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(NAME),
                 "rules": cluster_rules(cfg.runtime.binder)})
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(NAME),
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
                 "subjects": subject})
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": _meta(f"{NAME}-leader-election", namespace),
                 "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                            "verbs": ["get", "create", "update"]}]})
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": _meta(f"{NAME}-leader-election", namespace),
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": f"{NAME}-leader-election"},
                 "subjects": subject})
    objs += _reservation_objects(cfg, subject)
    objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{NAME}-config", namespace),
                 "data": {"config.yaml": _config_yaml(cfg)}})
    webhook = cfg.runtime.gpu_sharing.enabled
    if webhook:
        objs += _webhook_objects(cfg, namespace, subject)
    objs.append(_deployment(namespace, image, replicas, webhook=webhook))
    if existing_kai:
        return json.loads(json.dumps(objs))
    for name, value in DEFAULT_PRIORITY_CLASSES.items():
        objs.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": _meta(name),
                     "value": value, "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority",
                     "description": f"KAI-Scheduler default class {name} ({'non-' if value >= 100 else ''}"
                                    "preemptible)"})
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    objs.append({"apiVersion": QUEUE.api_version, "kind": QUEUE.kind, "metadata": _meta(cfg.default_queue),
                 "spec": {"displayName": "Default queue (workloads that name none)",
                          "resources": {"gpu": dict(unlimited), "cpu": dict(unlimited),
                                        "memory": dict(unlimited)}}})
    return json.loads(json.dumps(objs))  # no shared sub-objects (YAML anchors), safe to modify


def _reservation_objects(cfg: Config, scheduler: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPU sharing: the reservation namespace, kai-opt's Role there (create/delete the reservation pods), and the
    reservation pods' ServiceAccount with its Role (get/patch pods there: a pod reports its GPU on itself)."""
    sh = cfg.runtime.gpu_sharing
    if not sh.enabled or cfg.runtime.binder == BinderKind.kai:  # KAI's binder makes its reservation pods
        return []
    ns, sa = sh.reservation_namespace, sh.reservation_service_account
    rbac = "rbac.authorization.k8s.io"

    def role(name: str, verbs: list[str], subjects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": _meta(name, ns),
                 "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]},
                {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": _meta(name, ns),
                 "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name}, "subjects": subjects}]

    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)},
        *role(f"{NAME}-manage-reservations", ["create", "delete"], scheduler),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(sa, ns)},
        *role(sa, ["get", "patch"], [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]),
    ]


def _webhook_objects(cfg: Config, namespace: str, subject: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPU sharing's admission webhook: its Service, its MutatingWebhookConfiguration (caBundle filled in by kai-opt
    at start), and the rights kai-opt needs for its certificate: create Secrets in its own namespace and read only
    Secret kai-opt-webhook-tls (a `create` cannot be limited to one name), get/patch only that configuration."""
    rbac = "rbac.authorization.k8s.io"
    name = f"{NAME}-webhook-tls"
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(SERVICE_NAME, namespace),
         "spec": {"selector": {"app.kubernetes.io/name": NAME},
                  "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]}},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": _meta(name, namespace),
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                   {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET_NAME], "verbs": ["get"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": _meta(name, namespace),
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name}, "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": _meta(f"{NAME}-webhook"),
         "rules": [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                    "resourceNames": [WEBHOOK_NAME], "verbs": ["get", "patch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": _meta(f"{NAME}-webhook"),
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": f"{NAME}-webhook"}, "subjects": subject},
        webhook_configuration(namespace, list(cfg.scheduler_names),
                              reservation_namespace=cfg.runtime.gpu_sharing.reservation_namespace),
    ]


def _config_yaml(cfg: Config) -> str:
    if cfg == Config():
        return default_config_yaml()
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
