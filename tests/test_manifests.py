"""`kai-opt manifests` without a cluster: the objects, the RBAC covering the grouper's owner kinds, the default
classes and queue, and one-line errors for bad options."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kai_opt.api.priorityclass import DEFAULT_PRIORITY_CLASSES
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
            assert o["metadata"]["namespace"] == "sched"
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [container] = dep["spec"]["template"]["spec"]["containers"]
    assert dep["spec"]["replicas"] == 2 and container["image"] == "img:1"
    assert container["args"][0] == "run" and "--leader-elect" in container["args"]
    assert {o["metadata"]["name"]: o["value"] for o in objs if o["kind"] == "PriorityClass"} == \
        DEFAULT_PRIORITY_CLASSES
    [queue] = [o for o in objs if o["kind"] == "Queue"]
    assert queue["metadata"]["name"] == "default-queue"
    [binding] = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kai-opt", "namespace": "sched"}]


def test_cluster_role_reads_every_owner_kind_and_never_deletes_or_reads_secrets() -> None:
    rules = cluster_rules()
    for api_version, _, plural in OWNER_KINDS:
        group = api_version.split("/")[0] if "/" in api_version else ""
        assert any(group in r["apiGroups"] and plural in r["resources"] and {"get", "list", "watch"} <= set(
            r["verbs"]) for r in rules), plural
    assert not any(v in r["verbs"] for r in rules for v in ("delete", "deletecollection", "*", "escalate", "bind"))
    assert not any(res in r["resources"] for r in rules for res in ("secrets", "*", "configmaps"))


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
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                         "RoleBinding", "ConfigMap", "Deployment"]
    full = build_manifests()
    assert docs == [o for o in full if o["kind"] not in ("CustomResourceDefinition", "PriorityClass", "Queue")]
