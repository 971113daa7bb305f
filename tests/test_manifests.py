"""`kai-opt manifests` without a cluster: the objects, the RBAC covering the grouper's owner kinds, the default
classes and queue, and one-line errors for bad options."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kai_opt.api.priorityclass import DEFAULT_PRIORITY_CLASSES
from kai_opt.config import BinderKind, parse_config
from kai_opt.errors import InputError
from kai_opt.k8s.client import crd_manifests, parse_yaml
from kai_opt.k8s.grouper import OWNER_KINDS
from kai_opt.k8s.manifests import build_manifests, cluster_rules


def test_objects_in_apply_order_with_the_namespace_everywhere() -> None:
    objs = build_manifests("sched", "img:1")
    kinds = [o["kind"] for o in objs]
    assert kinds[:3] == ["CustomResourceDefinition"] * 3 and kinds[3] == "Namespace"
    assert objs[:3] == parse_yaml(crd_manifests())
    for o in objs:
        if o["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment"):
            assert o["metadata"]["namespace"] in ("sched", "kai-resource-reservation")
            assert (o["metadata"]["namespace"] == "sched") == ("reservation" not in o["metadata"]["name"])
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [container] = dep["spec"]["template"]["spec"]["containers"]
    assert dep["spec"]["replicas"] == 2 and container["image"] == "img:1"
    assert container["args"][0] == "run" and "--leader-elect" in container["args"]
    assert {o["metadata"]["name"]: o["value"] for o in objs if o["kind"] == "PriorityClass"} == \
        DEFAULT_PRIORITY_CLASSES
    [queue] = [o for o in objs if o["kind"] == "Queue"]
    assert queue["metadata"]["name"] == "default-queue"
    bindings = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert [b["metadata"]["name"] for b in bindings] == ["kai-opt", "kai-opt-webhook"]
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kai-opt", "namespace": "sched"}]


def test_cluster_role_reads_every_owner_kind_and_never_deletes_or_reads_secrets() -> None:
    rules = cluster_rules()
    for api_version, _, plural in OWNER_KINDS:
        group = api_version.split("/")[0] if "/" in api_version else ""
        assert any(group in r["apiGroups"] and plural in r["resources"] and {"get", "list", "watch"} <= set(
            r["verbs"]) for r in rules), plural
    assert not any(v in r["verbs"] for r in rules for v in ("delete", "deletecollection", "*", "escalate", "bind"))
    assert not any(res in r["resources"] for r in rules for res in ("secrets", "*"))
    # the shared-GPU ConfigMaps are written, never read or deleted (they go with their pod)
    assert [r["verbs"] for r in rules if "configmaps" in r["resources"]] == [["create", "patch"]]


def test_reservation_namespace_rbac_is_scoped_to_it() -> None:
    objs = build_manifests("sched", "img:1")
    resv = [o for o in objs if o["metadata"].get("namespace") == "kai-resource-reservation"]
    named = [o["kind"] for o in objs if o["metadata"]["name"] == "kai-resource-reservation"]
    assert named == ["Namespace"]
    roles = {o["metadata"]["name"]: o["rules"] for o in resv if o["kind"] == "Role"}
    assert roles == {"kai-opt-manage-reservations": [{"apiGroups": [""], "resources": ["pods"],
                                                      "verbs": ["create", "delete"]}],
                     "kai-opt-reservation": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]}
    subjects = {o["metadata"]["name"]: o["subjects"] for o in resv if o["kind"] == "RoleBinding"}
    assert subjects == {
        "kai-opt-manage-reservations": [{"kind": "ServiceAccount", "name": "kai-opt", "namespace": "sched"}],
        "kai-opt-reservation": [{"kind": "ServiceAccount", "name": "kai-opt-reservation",
                                 "namespace": "kai-resource-reservation"}]}
    assert [o["metadata"]["name"] for o in resv if o["kind"] == "ServiceAccount"] == ["kai-opt-reservation"]
    off = parse_config({"runtime": {"gpu_sharing": {"enabled": False}}})
    assert not [o for o in build_manifests("sched", config=off)
                if "reservation" in o["metadata"]["name"] or "webhook" in o["metadata"]["name"].lower()
                or o["kind"] == "MutatingWebhookConfiguration"
                or (o["kind"] == "Service" and o["metadata"]["name"] != "kai-opt-metrics")]


def test_webhook_objects_and_the_one_secret_kai_opt_may_read() -> None:
    objs = build_manifests("sched", "img:1")
    [svc] = [o for o in objs if o["kind"] == "Service" and "webhook" in o["metadata"]["name"]]
    assert svc["metadata"] == {"name": "kai-opt-webhook", "namespace": "sched", "labels": svc["metadata"]["labels"]}
    assert svc["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [container] = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    assert container["args"][-2:] == ["--webhook-port", "9443"]
    [mwc] = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    assert mwc["webhooks"][0]["clientConfig"]["service"] == {"namespace": "sched", "name": "kai-opt-webhook",
                                                             "path": "/mutate-pods", "port": 443}
    [tls_role] = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "kai-opt-webhook-tls"]
    assert tls_role["metadata"]["namespace"] == "sched"
    assert tls_role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["kai-opt-webhook-tls"], "verbs": ["get"]}]
    [wh_role] = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "kai-opt-webhook"]
    assert wh_role["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"],
                                 "resources": ["mutatingwebhookconfigurations"], "resourceNames": ["kai-opt"],
                                 "verbs": ["get", "patch"]}]


@pytest.mark.parametrize(("args", "field"), [(["--namespace", "Not_A_Label"], "--namespace"),
                                             (["--image", "a b"], "--image"),
                                             (["--replicas", "0"], "--replicas")])
def test_bad_options_are_one_line_errors_with_exit_code_2(args: list[str], field: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", *args], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"field {field}" in proc.stderr


def test_cli_prints_multi_document_yaml() -> None:
    proc = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "-n", "x"], capture_output=True,
                          text=True, check=True)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert docs == build_manifests("x")


def test_build_rejects_bad_namespace() -> None:
    with pytest.raises(InputError):
        build_manifests("-bad")


def test_existing_kai_leaves_kais_crds_classes_and_queues_alone() -> None:
    proc = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "--existing-kai"],
                          capture_output=True, text=True, check=True)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    # KAI's binder binds (binder: kai), so no reservation namespace objects of kai-opt's
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                         "RoleBinding", "ConfigMap", "Service", "Role", "RoleBinding", "ClusterRole",
                                         "ClusterRoleBinding", "MutatingWebhookConfiguration", "Service",
                                         "PodDisruptionBudget", "Deployment"]
    full = build_manifests(config=parse_config({"runtime": {"binder": "kai"}}))
    assert docs == [o for o in full if o["kind"] not in ("CustomResourceDefinition", "PriorityClass", "Queue")]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert parse_config(yaml.safe_load(cm["data"]["config.yaml"])).runtime.binder == "kai"


def test_existing_kai_keeps_a_binder_the_config_names() -> None:
    objs = build_manifests(config=parse_config({"runtime": {"binder": "kai-opt"}}), existing_kai=True)
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    assert parse_config(yaml.safe_load(cm["data"]["config.yaml"])).runtime.binder == "kai-opt"
    assert "kai-resource-reservation" in [o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"]


def test_kai_binder_rules_write_bindrequests_instead_of_binding() -> None:
    rules = cluster_rules(BinderKind.kai)
    [br] = [r for r in rules if "bindrequests" in r["resources"]]
    assert br == {"apiGroups": ["scheduling.run.ai"], "resources": ["bindrequests"],
                  "verbs": ["create", "get", "list", "watch", "delete"]}
    assert not any(res in r["resources"] for r in rules for res in ("pods/binding", "configmaps"))
    assert any("pods/eviction" in r["resources"] for r in rules)
    # the only delete is of BindRequests
    assert [r["resources"] for r in rules if "delete" in r["verbs"]] == [["bindrequests"]]
    assert not any("bindrequests" in r["resources"] for r in cluster_rules())


def test_crds_read_by_libyaml_are_what_the_pure_python_loader_reads() -> None:
    """parse_yaml takes libyaml's CSafeLoader when PyYAML has it (start-up of `kai-opt manifests`): the same
    objects as the pure-Python safe loader."""
    import yaml

    pure = [d for d in yaml.load_all(crd_manifests(), Loader=yaml.SafeLoader) if d is not None]
    assert parse_yaml(crd_manifests()) == pure and len(pure) == 3
