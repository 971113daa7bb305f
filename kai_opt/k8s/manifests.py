"""Everything needed to run kai-opt in a cluster, described once for two renderers (kai_opt/k8s/tmpl.py):
`kai-opt manifests` evaluates the descriptions for the chart values, scripts/gen-chart writes them as the Helm
chart's templates (deploy/helm/kai-opt). The objects: the CRDs (KAI-Scheduler's, verbatim), optionally a Namespace,
a ServiceAccount with least-privilege RBAC, the configuration as a ConfigMap, a leader-elected Deployment with
probes on the metrics port, a Service for the metrics port (optional ServiceMonitor), a PodDisruptionBudget, KAI's
default PriorityClasses and a default Queue (both optional).

The ClusterRole grants exactly what the scheduler does: read (get/list/watch) Nodes, Pods, PodGroups, Queues,
PriorityClasses, Topologies and the pod grouper's owner kinds; get SchedulingShards (a shard reads its own); bind
(pods/binding, which also records the GPU devices) and evict (pods/eviction); patch Pods (the grouper's
pod-group-name annotation) and their status (nominatedNodeName); create and patch PodGroups (the grouper) and
update/patch their status and Queue status; create/patch Events (core and events.k8s.io); create and patch
ConfigMaps (the shared-GPU ConfigMaps of GPU-sharing pods; never read, never deleted: they go with their pod). A
Role in its own namespace covers the leader-election Lease (get/create/update). With GPU sharing on
(`runtime.gpu_sharing.enabled`), the reservation namespace (`kai-resource-reservation`) is created with a Role
letting kai-opt create and delete pods there (the GPU reservation pods), and a ServiceAccount for the reservation
pods whose Role lets them get and patch pods there only (each reports its GPU in its own annotation). The
GPU-sharing admission webhook comes with its Service, its MutatingWebhookConfiguration, and for its certificate a
Role to create Secrets in kai-opt's namespace and read Secret kai-opt-webhook-tls only, plus get/patch of that one
configuration (its caBundle). Nothing else (no other Secret read, no deletes outside the reservation namespace, no
Queue spec writes). With autoscaler support
on (`autoscaler.enabled`), a Role in the placeholder namespace (`kai-opt-scaling`, created unless
`create_namespace: false`) lets kai-opt create and delete pods there and patch their status, and a PriorityClass
of negative value is created for them unless `create_priority_class: false`.

With `runtime.binder: kai` (the default with `existingKai`, unless the config sets `binder`) KAI's binder binds:
kai-opt gets create/get/list/watch/delete on BindRequests instead of pods/binding and ConfigMap writes, and no
reservation namespace objects (KAI's binder makes the reservation pods in its own).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kai_opt import __version__
from kai_opt.config import BinderKind, Config, parse_config
from kai_opt.k8s.chart_values import DEFAULTS, check, merge
from kai_opt.k8s.dashboard import CONFIGMAP as DASHBOARD_CONFIGMAP
from kai_opt.k8s.dashboard import FILE as DASHBOARD_FILE
from kai_opt.k8s.dashboard import dashboard_json
from kai_opt.k8s.kinds import (
    BINDREQUEST_API_VERSION,
    BINDREQUEST_PLURAL,
    KAI_GROUP,
    OWNER_KINDS,
    PODGROUP,
    QUEUE,
    SCHEDULING_GROUP,
    TOPOLOGY,
    crd_manifests,
    parse_yaml,
)
from kai_opt.k8s.tmpl import (
    NAMESPACE,
    Cond,
    Context,
    Doc,
    Val,
    When,
    all_of,
    any_of,
    flag,
    item,
    negate,
    render,
    value,
)
from kai_opt.k8s.webhook_config import (
    PATH,
    SECRET_NAME,
    SERVICE_NAME,
    SYSTEM_NAMESPACES,
    WEBHOOK_NAME,
    configuration_body,
)
from kai_opt.priorities import DEFAULT_PRIORITY_CLASSES

NAME = "kai-opt"
DEFAULT_NAMESPACE = "kai-opt"
DEFAULT_IMAGE = f"kai-opt:{__version__}"
CONFIG_PATH = "/etc/kai-opt/config.yaml"
DASHBOARD_CHART_FILE = f"files/{DASHBOARD_FILE}"  # the Grafana dashboard in the chart (kai_opt/k8s/dashboard.py)
LEASE_NAME = NAME
READ = ["get", "list", "watch"]
RBAC = "rbac.authorization.k8s.io"
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": NAME}
_SELECTOR = {"app.kubernetes.io/name": NAME}


def _meta(name: Any, namespace: Any = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(_LABELS)}
    if namespace is not None:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


def cluster_rules(binder: BinderKind | Cond = BinderKind.kai_opt) -> list[Any]:
    """The ClusterRole's rules (least privilege; see the module docstring). `binder`: who binds, or a Cond that
    holds when KAI's binder does (the rules then carry it as When markers, for the chart)."""
    own: list[dict[str, Any]] = [  # kai-opt binds: pods/binding, and the shared-GPU ConfigMaps it writes
        {"apiGroups": [""], "resources": ["pods/binding", "pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}]
    kais: list[dict[str, Any]] = [  # KAI's binder binds what kai-opt writes as BindRequests
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [BINDREQUEST_API_VERSION.split("/")[0]], "resources": [BINDREQUEST_PLURAL],
         "verbs": ["create", *READ, "delete"]}]
    binding: list[Any]
    if isinstance(binder, Cond):
        binding = [*(When(negate(binder), r) for r in own), *(When(binder, r) for r in kais)]
    else:
        binding = list(kais if binder == BinderKind.kai else own)
    rules: list[Any] = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": READ},
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*READ, "patch"]},
        *binding,
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},  # nominatedNodeName (pipelined)
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [SCHEDULING_GROUP], "resources": [PODGROUP.plural], "verbs": [*READ, "create", "patch"]},
        {"apiGroups": [SCHEDULING_GROUP], "resources": [QUEUE.plural], "verbs": READ},
        {"apiGroups": [SCHEDULING_GROUP], "resources": [f"{PODGROUP.plural}/status", f"{QUEUE.plural}/status"],
         "verbs": ["update", "patch"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": READ},
        {"apiGroups": [KAI_GROUP], "resources": [TOPOLOGY.plural], "verbs": READ},
        {"apiGroups": [KAI_GROUP], "resources": ["schedulingshards"], "verbs": ["get"]},  # a shard's own (shard.py)
        # DRA: devices are read, claims allocated and reserved (status), a template's claim made for its pod
        {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses", "resourceslices", "resourceclaimtemplates",
                                                         "devicetaintrules"], "verbs": READ},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": [*READ, "create"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update", "patch"]},
    ]
    owners: dict[str, list[str]] = {}
    for api_version, _kind, plural in OWNER_KINDS:
        group = api_version.split("/")[0] if "/" in api_version else ""
        if plural not in owners.setdefault(group, []):
            owners[group].append(plural)
    rules += [{"apiGroups": [group], "resources": plurals, "verbs": READ} for group, plurals in owners.items()]
    return rules



# -- values the descriptions use -------------------------------------------------------------------------------------
def _image_ref(values: dict[str, Any]) -> str:
    image = values["image"]
    return f"{image['repository']}:{image['tag']}" if image.get("tag") else str(image["repository"])


def effective_config(ctx: Context) -> dict[str, Any]:
    """`config` with the top-level values laid over it (the Go twin is HELPERS' "kai-opt.config")."""
    cfg = copy.deepcopy(ctx.get("config"))
    cfg["engine"] = ctx.get("engine")
    cfg["scheduler_names"] = list(ctx.get("schedulerNames"))
    cfg["default_queue"] = ctx.get("defaultQueue.name")
    runtime = cfg.setdefault("runtime", {})
    sharing = runtime.setdefault("gpu_sharing", {})
    sh = ctx.get("gpuSharing")
    sharing.update({"enabled": sh["enabled"], "reservation_namespace": sh["reservationNamespace"],
                    "reservation_service_account": sh["reservationServiceAccount"],
                    "reservation_image": sh["reservationImage"] or _image_ref(dict(ctx.values))})
    if ctx.get("existingKai") and "binder" not in runtime:  # one binder beside KAI: KAI's
        runtime["binder"] = BinderKind.kai.value
    return cfg


def _config_yaml(ctx: Context) -> str:
    import yaml

    cfg = effective_config(ctx)
    parse_config(cfg, source="the config value")  # a ConfigError (exit code 2) for a bad config
    return yaml.safe_dump(cfg, sort_keys=True)


# Go twins of `_image_ref` and `effective_config`, written into the chart's templates/_helpers.tpl
HELPERS = """{{/* generated by scripts/gen-chart from kai_opt/k8s/manifests.py: do not edit */}}
{{- define "kai-opt.image" -}}
{{- if .Values.image.tag }}{{ printf "%s:%v" .Values.image.repository .Values.image.tag }}{{ else }}\
{{ .Values.image.repository }}{{ end -}}
{{- end -}}

{{- define "kai-opt.config" -}}
{{- $c := deepCopy (.Values.config | default dict) -}}
{{- $_ := set $c "engine" .Values.engine -}}
{{- $_ = set $c "scheduler_names" .Values.schedulerNames -}}
{{- $_ = set $c "default_queue" .Values.defaultQueue.name -}}
{{- $rt := get $c "runtime" | default dict -}}
{{- $_ = set $c "runtime" $rt -}}
{{- $gs := get $rt "gpu_sharing" | default dict -}}
{{- $_ = set $rt "gpu_sharing" $gs -}}
{{- $_ = set $gs "enabled" .Values.gpuSharing.enabled -}}
{{- $_ = set $gs "reservation_namespace" .Values.gpuSharing.reservationNamespace -}}
{{- $_ = set $gs "reservation_service_account" .Values.gpuSharing.reservationServiceAccount -}}
{{- $_ = set $gs "reservation_image" (.Values.gpuSharing.reservationImage | default (include "kai-opt.image" .)) -}}
{{- if and .Values.existingKai (not (hasKey $rt "binder")) }}{{ $_ = set $rt "binder" "kai" }}{{ end -}}
{{- toYaml $c -}}
{{- end -}}

{{- define "kai-opt.mergeInto" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- if and (kindIs "map" $v) (kindIs "map" (get $dst $k)) -}}
{{- $_ := include "kai-opt.mergeInto" (dict "dst" (get $dst $k) "src" $v) -}}
{{- else if kindIs "invalid" $v -}}
{{- $_ := unset $dst $k -}}
{{- else -}}
{{- $_ := set $dst $k $v -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kai-opt.shardConfig" -}}
{{- $c := include "kai-opt.config" .root | fromYaml -}}
{{- $_ := include "kai-opt.mergeInto" (dict "dst" $c "src" (.shard.config | default dict)) -}}
{{- $s := get $c "shard" | default dict -}}
{{- $_ = set $c "shard" $s -}}
{{- $_ = set $s "name" .shard.name -}}
{{- $_ = set $s "partition_value" (.shard.partitionValue | default "") -}}
{{- toYaml $c -}}
{{- end -}}

{{- define "kai-opt.ledgerNames" -}}
{{- $ledger := (.Values.config.usage_db | default dict).ledger | default dict -}}
{{- $name := $ledger.config_map_name | default "kai-opt-usage" -}}
{{- if .Values.shards -}}
{{- $out := list -}}
{{- range .Values.shards -}}
{{- $suffix := printf "-%s" .name -}}
{{- $out = append $out (ternary $name (printf "%s%s" $name $suffix) (hasSuffix $suffix $name)) -}}
{{- end -}}
{{- toJson $out -}}
{{- else -}}
{{- toJson (list $name) -}}
{{- end -}}
{{- end -}}

{{- define "kai-opt.binder" -}}
{{- $rt := (.Values.config | default dict).runtime | default dict -}}
{{- if hasKey $rt "binder" }}{{ $rt.binder }}{{ else if .Values.existingKai }}kai{{ else }}kai-opt{{ end -}}
{{- end -}}
"""

IMAGE = Val('include "kai-opt.image" .', lambda c: _image_ref(dict(c.values)))
CONFIG = Val('include "kai-opt.config" .', _config_yaml)
SHARING = flag("gpuSharing.enabled")
RESV_NS = value("gpuSharing.reservationNamespace")
RESV_SA = value("gpuSharing.reservationServiceAccount")
CERT_MANAGER = all_of(SHARING, flag("webhook.certManager.enabled"))
SERVICE_MONITOR = flag("metrics.serviceMonitor.enabled")
KAI_DEFAULTS = negate(flag("existingKai"))
KAI_BINDER = Cond('eq (include "kai-opt.binder" .) "kai"',
                  lambda c: parse_config(effective_config(c), source="the config value").runtime.binder
                  == BinderKind.kai)
OWN_SHARING = all_of(SHARING, negate(KAI_BINDER))  # kai-opt makes the reservation pods (KAI's binder makes its own)

# -- scheduling shards (values `shards`: one Deployment and ConfigMap per item; kai_opt/k8s/shard.py) ---------------
SHARD_LABEL = "kai-opt.io/shard"
UNSHARDED = negate(flag("shards"))
SHARD_NAME = Val(f'printf "{NAME}-%s" $item.name', lambda c: f"{NAME}-{(c.item or {})['name']}")
SHARD_CONFIG_NAME = Val(f'printf "{NAME}-%s-config" $item.name', lambda c: f"{NAME}-{(c.item or {})['name']}-config")
SHARD_REPLICAS = Val("$item.replicas | default .Values.replicas",
                     lambda c: (c.item or {}).get("replicas") or c.get("replicas"))


def _shard_selector() -> dict[str, Any]:
    return {**_SELECTOR, SHARD_LABEL: item("name")}


def shard_effective_config(ctx: Context) -> dict[str, Any]:
    """A shard's config: the release's (`effective_config`), the item's `config` merged over it, and its shard
    section's name and partition_value from the item (the Go twin is HELPERS' "kai-opt.shardConfig")."""
    s = ctx.item or {}
    cfg = merge(effective_config(ctx), s.get("config") or {})
    cfg["shard"] = {**(cfg.get("shard") or {}), "name": s["name"], "partition_value": s.get("partitionValue") or ""}
    return cfg


def _shard_config_yaml(ctx: Context) -> str:
    import yaml

    cfg = shard_effective_config(ctx)
    parse_config(cfg, source=f"the config of shard {cfg['shard']['name']}")
    return yaml.safe_dump(cfg, sort_keys=True)


SHARD_CONFIG = Val('include "kai-opt.shardConfig" (dict "root" . "shard" $item)', _shard_config_yaml)


def _port_str(path: str) -> Val:
    return Val(f"toString .Values.{path}", lambda c: str(c.get(path)))


def _subject() -> list[dict[str, Any]]:
    return [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]


# -- the objects -----------------------------------------------------------------------------------------------------
def _rbac_docs() -> list[Doc]:
    le = f"{NAME}-leader-election"
    return [
        Doc("serviceaccount.yaml", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, NAMESPACE)}),
        Doc("clusterrole.yaml", {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": _meta(NAME),
                                 "rules": cluster_rules(KAI_BINDER)}),
        Doc("clusterrolebinding.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": _meta(NAME),
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": NAME}, "subjects": _subject()}),
        Doc("role-leader-election.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _meta(le, NAMESPACE),
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["get", "create", "update"]}]}),
        Doc("rolebinding-leader-election.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": _meta(le, NAMESPACE),
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": le}, "subjects": _subject()}),
    ]


_USAGE_DB = "(.Values.config.usage_db | default dict)"
_LEDGER = f"({_USAGE_DB}.ledger | default dict)"


def _ledger_config(ctx: Context) -> Any:
    return parse_config(effective_config(ctx), source="the config value").usage_db


def _ledger_names(ctx: Context) -> list[str]:
    """The ledger ConfigMap's name, or with shards each shard's (kai_opt.k8s.shard.shard_config)."""
    name = _ledger_config(ctx).ledger.config_map_name
    shards = ctx.get("shards") or []
    return [name if name.endswith(f"-{s['name']}") else f"{name}-{s['name']}" for s in shards] or [name]


def _usage_ledger_docs() -> list[Doc]:
    """Time-based fair share with kai-opt's ledger (config usage_db.client_type: ledger): get/update of that one
    ConfigMap (creating it is in the ClusterRole already, for the shared-GPU ConfigMaps)."""
    on = Cond(f'eq ({_USAGE_DB}.client_type | default "") "ledger"',
              lambda c: _ledger_config(c).client_type == "ledger")
    names = Val('include "kai-opt.ledgerNames" . | fromJsonArray', _ledger_names)  # one per shard
    namespace = Val(f"{_LEDGER}.config_map_namespace | default .Release.Namespace",
                    lambda c: _ledger_config(c).ledger.config_map_namespace or c.namespace)
    role = f"{NAME}-usage-ledger"
    return [
        Doc("usage-ledger-role.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _meta(role, namespace),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": names,
                       "verbs": ["get", "update"]}]}, on),
        Doc("usage-ledger-rolebinding.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": _meta(role, namespace),
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": role}, "subjects": _subject()}, on),
    ]


def _reservation_docs() -> list[Doc]:
    """GPU sharing: the reservation namespace, kai-opt's Role there (create/delete the reservation pods), and the
    reservation pods' ServiceAccount with its Role (get/patch pods there: a pod reports its GPU on itself)."""
    manage = f"{NAME}-manage-reservations"

    def role(file: str, name: Any, verbs: list[str], subjects: list[dict[str, Any]]) -> list[Doc]:
        return [Doc(f"reservation-role-{file}.yaml", {
                    "apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _meta(name, RESV_NS),
                    "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]}, OWN_SHARING),
                Doc(f"reservation-rolebinding-{file}.yaml", {
                    "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": _meta(name, RESV_NS),
                    "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name}, "subjects": subjects}, OWN_SHARING)]

    return [
        Doc("reservation-namespace.yaml", {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(RESV_NS)},
            all_of(OWN_SHARING, flag("gpuSharing.createReservationNamespace"))),
        *role("manage", manage, ["create", "delete"], _subject()),
        Doc("reservation-serviceaccount.yaml", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                "metadata": _meta(RESV_SA, RESV_NS)}, OWN_SHARING),
        *role("pods", RESV_SA, ["get", "patch"], [{"kind": "ServiceAccount", "name": RESV_SA, "namespace": RESV_NS}]),
    ]


_AUTOSCALER = "(.Values.config.autoscaler | default dict)"


def _autoscaler_config(ctx: Context) -> Any:
    return parse_config(effective_config(ctx), source="the config value").autoscaler


def _autoscaler_docs() -> list[Doc]:
    """Autoscaler support (config autoscaler.enabled): the placeholder namespace (optional), kai-opt's Role there
    (create and delete the placeholder pods, patch their status: PodScheduled=False), and the negative-priority
    PriorityClass of the placeholders (optional)."""
    on = Cond(f"{_AUTOSCALER}.enabled", lambda c: _autoscaler_config(c).enabled)

    def unless_false(key: str) -> Cond:  # a boolean whose default is true
        return Cond(f'ne (toString {_AUTOSCALER}.{key}) "false"', lambda c: bool(getattr(_autoscaler_config(c), key)))

    ns = Val(f'{_AUTOSCALER}.namespace | default "kai-opt-scaling"', lambda c: _autoscaler_config(c).namespace)
    pc = Val(f'{_AUTOSCALER}.priority_class_name | default "kai-opt-scaling-placeholder"',
             lambda c: _autoscaler_config(c).priority_class_name)
    pv = Val(f"{_AUTOSCALER}.priority_value | default -100", lambda c: _autoscaler_config(c).priority_value)
    role = f"{NAME}-scaling-placeholders"
    return [
        Doc("autoscaler-namespace.yaml", {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)},
            all_of(on, unless_false("create_namespace"))),
        Doc("autoscaler-role.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _meta(role, ns),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
                      {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]}, on),
        Doc("autoscaler-rolebinding.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": _meta(role, ns),
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": role}, "subjects": _subject()}, on),
        Doc("autoscaler-priorityclass.yaml", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": _meta(pc), "value": pv,
            "globalDefault": False, "preemptionPolicy": "Never",
            "description": "kai-opt's placeholder pods for autoscalers: below all real work"},
            all_of(on, unless_false("create_priority_class"))),
    ]


def _excluded(c: Context) -> list[str]:
    return sorted({*SYSTEM_NAMESPACES, c.namespace, c.get("gpuSharing.reservationNamespace")})


_EXCLUDED = Val("list " + " ".join(f'"{n}"' for n in SYSTEM_NAMESPACES)
                + " .Release.Namespace .Values.gpuSharing.reservationNamespace | uniq | sortAlpha", _excluded)
_SCHEDULED_BY_US = Val(
    'printf "has(object.spec.schedulerName) && object.spec.schedulerName in [%s]" '
    '(.Values.schedulerNames | toJson | trimPrefix "[" | trimSuffix "]" | replace "\\",\\"" "\\", \\"")',
    lambda c: "has(object.spec.schedulerName) && object.spec.schedulerName in ["
              + ", ".join(json.dumps(n) for n in c.get("schedulerNames")) + "]")


def _webhook_configuration() -> dict[str, Any]:
    """The MutatingWebhookConfiguration of kai_opt.k8s.webhook_config.webhook_configuration (a test keeps them equal),
    written with the values; its caBundle is kai-opt's to set at start (or cert-manager's)."""
    meta = _meta(WEBHOOK_NAME)
    meta["annotations"] = When(CERT_MANAGER, {"cert-manager.io/inject-ca-from": Val(
        f'printf "%s/{SERVICE_NAME}" .Release.Namespace', lambda c: f"{c.namespace}/{SERVICE_NAME}")})
    client_config = {"service": {"namespace": NAMESPACE, "name": SERVICE_NAME, "path": PATH, "port": 443}}
    return configuration_body(meta, client_config, _EXCLUDED, _SCHEDULED_BY_US)


def _webhook_docs() -> list[Doc]:
    """GPU sharing's admission webhook: its Service, its configuration, and the rights kai-opt needs for its
    certificate: create Secrets in its own namespace and read only Secret kai-opt-webhook-tls (a `create` cannot
    be limited to one name), get/patch only that configuration. With cert-manager: a self-signed Issuer and the
    Certificate that keeps the same Secret."""
    tls = f"{NAME}-webhook-tls"
    hosts = [Val(f'printf "{SERVICE_NAME}.%s{suffix}" .Release.Namespace',
                 lambda c, s=suffix: f"{SERVICE_NAME}.{c.namespace}{s}")
             for suffix in (".svc", ".svc.cluster.local", "")]
    issuer = f"{NAME}-webhook-selfsigned"
    return [
        Doc("webhook-service.yaml", {
            "apiVersion": "v1", "kind": "Service", "metadata": _meta(SERVICE_NAME, NAMESPACE),
            "spec": {"selector": dict(_SELECTOR),
                     "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]}},
            SHARING),
        Doc("webhook-role.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _meta(tls, NAMESPACE),
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                      {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET_NAME], "verbs": ["get"]}]},
            SHARING),
        Doc("webhook-rolebinding.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": _meta(tls, NAMESPACE),
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": tls}, "subjects": _subject()}, SHARING),
        Doc("webhook-clusterrole.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": _meta(f"{NAME}-webhook"),
            "rules": [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                       "resourceNames": [WEBHOOK_NAME], "verbs": ["get", "patch"]}]}, SHARING),
        Doc("webhook-clusterrolebinding.yaml", {
            "apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": _meta(f"{NAME}-webhook"),
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": f"{NAME}-webhook"},
            "subjects": _subject()}, SHARING),
        Doc("webhook-configuration.yaml", _webhook_configuration(), SHARING),
        Doc("webhook-issuer.yaml", {"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                                    "metadata": _meta(issuer, NAMESPACE), "spec": {"selfSigned": {}}}, CERT_MANAGER),
        Doc("webhook-certificate.yaml", {
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": _meta(SERVICE_NAME, NAMESPACE),
            "spec": {"secretName": SECRET_NAME, "dnsNames": hosts, "duration": "87600h",
                     "issuerRef": {"name": issuer, "kind": "Issuer"}}}, CERT_MANAGER),
    ]


def _deployment(sharded: bool = False) -> dict[str, Any]:
    """The scheduler's Deployment; `sharded`: the one of a `shards` item (its own name, config, selector)."""
    name: Any = SHARD_NAME if sharded else NAME
    selector = _shard_selector() if sharded else dict(_SELECTOR)
    container = {
        "name": NAME,
        "image": IMAGE,
        "imagePullPolicy": value("image.pullPolicy"),
        "args": ["run", "--config", CONFIG_PATH, "--leader-elect", "--lease-namespace", NAMESPACE,
                 "--metrics-port", _port_str("metrics.port"),
                 When(SHARING, "--webhook-port"), When(SHARING, _port_str("webhook.port"))],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "metrics", "containerPort": value("metrics.port"), "protocol": "TCP"},
                  When(SHARING, {"name": "webhook", "containerPort": value("webhook.port"), "protocol": "TCP"})],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "initialDelaySeconds": 15,
                          "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "initialDelaySeconds": 5,
                           "periodSeconds": 10, "timeoutSeconds": 5},
        "resources": value("resources"),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/kai-opt", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {**_meta(name, NAMESPACE), "labels": {**_LABELS, **selector}},
        "spec": {
            "replicas": SHARD_REPLICAS if sharded else value("replicas"),
            "selector": {"matchLabels": dict(selector)},
            # replace pods one at a time: the other replica, synced and ready (leader or standby), keeps scheduling
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {
                "metadata": {"labels": {**_LABELS, **selector},
                             "annotations": {"prometheus.io/scrape": "true",
                                             "prometheus.io/port": _port_str("metrics.port"),
                                             "prometheus.io/path": "/metrics"}},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": When(flag("priorityClassName"), value("priorityClassName")),
                    "nodeSelector": When(flag("nodeSelector"), value("nodeSelector")),
                    "tolerations": When(flag("tolerations"), value("tolerations")),
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": SHARD_CONFIG_NAME if sharded
                                                                 else f"{NAME}-config"}},
                                {"name": "tmp", "emptyDir": {}}],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                           "labelSelector": {"matchLabels": dict(selector)}}}]}},
                },
            },
        },
    }


def _metrics_docs() -> list[Doc]:
    labels = {**_LABELS, "app.kubernetes.io/component": "metrics"}
    monitor_labels = Val("merge (dict " + " ".join(f'"{k}" "{v}"' for k, v in labels.items())
                         + ") .Values.metrics.serviceMonitor.labels",
                         lambda c: {**c.get("metrics.serviceMonitor.labels"), **labels})
    dashboard_labels = Val("merge (dict " + " ".join(f'"{k}" "{v}"' for k, v in _LABELS.items())
                           + ") .Values.dashboard.labels", lambda c: {**c.get("dashboard.labels"), **_LABELS})
    return [
        Doc("metrics-service.yaml", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{NAME}-metrics", "namespace": NAMESPACE, "labels": labels},
            "spec": {"selector": dict(_SELECTOR),
                     "ports": [{"name": "metrics", "port": value("metrics.port"), "targetPort": "metrics",
                                "protocol": "TCP"}]}},
            any_of(flag("metrics.service.enabled"), SERVICE_MONITOR)),
        Doc("servicemonitor.yaml", {
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": monitor_labels},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": NAME,
                                                  "app.kubernetes.io/component": "metrics"}},
                     "endpoints": [{"port": "metrics", "path": "/metrics",
                                    "interval": value("metrics.serviceMonitor.interval")}]}},
            SERVICE_MONITOR),
        Doc("dashboard-configmap.yaml", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DASHBOARD_CONFIGMAP, "namespace": NAMESPACE, "labels": dashboard_labels},
            "data": {DASHBOARD_FILE: Val(f'.Files.Get "{DASHBOARD_CHART_FILE}"', lambda c: dashboard_json())}},
            flag("dashboard.enabled")),
    ]


def _kai_default_docs() -> list[Doc]:
    classes = [Doc(f"priorityclass-{name}.yaml", {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": _meta(name), "value": v,
        "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority",
        "description": f"KAI-Scheduler default class {name} ({'non-' if v >= 100 else ''}preemptible)"},
        all_of(KAI_DEFAULTS, flag("priorityClasses.create"))) for name, v in DEFAULT_PRIORITY_CLASSES.items()]
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    queue = Doc("default-queue.yaml", {
        "apiVersion": QUEUE.api_version, "kind": QUEUE.kind, "metadata": _meta(value("defaultQueue.name")),
        "spec": {"displayName": "Default queue (workloads that name none)",
                 "resources": {"gpu": dict(unlimited), "cpu": dict(unlimited), "memory": dict(unlimited)}}},
        all_of(KAI_DEFAULTS, flag("defaultQueue.create")))
    return [*classes, queue]


def documents() -> list[Doc]:
    """Every object but the CRDs, in apply order, with the condition it is rendered under."""
    return [
        Doc("namespace.yaml", {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(NAMESPACE)},
            flag("createNamespace")),
        *_rbac_docs(),
        *_reservation_docs(),
        *_usage_ledger_docs(),
        *_autoscaler_docs(),
        Doc("configmap.yaml", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{NAME}-config", NAMESPACE),
                               "data": {"config.yaml": CONFIG}}, UNSHARDED),
        Doc("shard-configmap.yaml", {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {**_meta(SHARD_CONFIG_NAME, NAMESPACE),
                                                  "labels": {**_LABELS, **_shard_selector()}},
                                     "data": {"config.yaml": SHARD_CONFIG}}, each="shards"),
        *_webhook_docs(),
        *_metrics_docs(),
        Doc("poddisruptionbudget.yaml", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(NAME, NAMESPACE),
            "spec": {"maxUnavailable": value("podDisruptionBudget.maxUnavailable"),
                     "selector": {"matchLabels": dict(_SELECTOR)}}},
            all_of(flag("podDisruptionBudget.enabled"), UNSHARDED)),
        Doc("deployment.yaml", _deployment(), UNSHARDED),
        Doc("shard-poddisruptionbudget.yaml", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {**_meta(SHARD_NAME, NAMESPACE), "labels": {**_LABELS, **_shard_selector()}},
            "spec": {"maxUnavailable": value("podDisruptionBudget.maxUnavailable"),
                     "selector": {"matchLabels": _shard_selector()}}}, flag("podDisruptionBudget.enabled"),
            each="shards"),
        Doc("shard-deployment.yaml", _deployment(sharded=True), each="shards"),
        *_kai_default_docs(),
    ]


# -- rendering -------------------------------------------------------------------------------------------------------
def render_manifests(values: dict[str, Any] | None = None, namespace: str = DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
    """The objects for chart values `values` (over the chart's defaults) in release namespace `namespace`, in
    apply order: what `helm template --include-crds` renders (without the CRDs when existingKai)."""
    vals = merge(DEFAULTS, values or {})
    check(vals, namespace)
    ctx = Context(vals, namespace)
    objs = [] if vals["existingKai"] else list(parse_yaml(crd_manifests()))
    objs += render(documents(), ctx)
    return json.loads(json.dumps(objs))  # no shared sub-objects, safe to modify


def values_from_config(cfg: Config) -> dict[str, Any]:
    """Chart values carrying a kai-opt configuration: the fields that are values of their own go there (they
    override `config`), the rest (non-default fields only) into `config`."""
    data = cfg.model_dump(mode="json", exclude_defaults=True)
    if "binder" in cfg.runtime.model_fields_set:  # set, even to its default: existingKai then keeps it
        data.setdefault("runtime", {})["binder"] = cfg.runtime.binder.value
    sh = cfg.runtime.gpu_sharing
    default_image = Config().runtime.gpu_sharing.reservation_image
    for key in ("engine", "scheduler_names", "default_queue"):
        data.pop(key, None)
    gs = data.get("runtime", {}).get("gpu_sharing", {})
    for key in ("enabled", "reservation_namespace", "reservation_service_account", "reservation_image"):
        gs.pop(key, None)
    if "runtime" in data and not gs:
        data["runtime"].pop("gpu_sharing", None)
        if not data["runtime"]:
            data.pop("runtime")
    return {"engine": cfg.engine.value, "schedulerNames": list(cfg.scheduler_names),
            "defaultQueue": {"name": cfg.default_queue},
            "gpuSharing": {"enabled": sh.enabled, "reservationNamespace": sh.reservation_namespace,
                           "reservationServiceAccount": sh.reservation_service_account,
                           "reservationImage": "" if sh.reservation_image == default_image else sh.reservation_image},
            "config": data}


def image_values(image: str) -> dict[str, Any]:
    """`repository[:tag]` as the chart's image values (a registry port is not a tag)."""
    repo, sep, tag = image.rpartition(":")
    if sep and repo and "/" not in tag:
        return {"repository": repo, "tag": tag}
    return {"repository": image, "tag": ""}


def build_manifests(namespace: str = DEFAULT_NAMESPACE, image: str = DEFAULT_IMAGE, *, replicas: int = 2,
                    config: Config | None = None, existing_kai: bool = False) -> list[dict[str, Any]]:
    """`kai-opt manifests` with its defaults (the Namespace included, as for `kubectl apply -f -`).

    existing_kai: the cluster already runs KAI-Scheduler. Its CRDs, PriorityClasses and queues are already there
    and stay KAI's (re-applying ours would replace KAI's CRD schemas, and a PriorityClass's value is immutable), so
    only the scheduler's own objects are returned."""
    values: dict[str, Any] = {"createNamespace": True, "image": image_values(image), "replicas": replicas,
                              "existingKai": existing_kai}
    if config is not None:
        values = merge(values, values_from_config(config))
    return render_manifests(values, namespace)
