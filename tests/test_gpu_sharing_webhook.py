"""The GPU-sharing admission webhook: the mutation (KAI's references to the shared-GPU ConfigMaps), the
AdmissionReview answer, its scope, the certificate and the HTTPS server."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kai_opt.k8s import webhook
from kai_opt.k8s.sharing import SharingError


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` (the only operation the webhook writes) on a copy."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        target[last] = op["value"]
    return out


def _pod(ann: dict[str, str] | None = None, containers: tuple[str, ...] = ("main",), **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if ann is not None:
        meta["annotations"] = ann
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulerName": "kai-opt", "containers": [{"name": c, "image": "x"} for c in containers],
                     **spec}}


def test_a_pod_without_sharing_annotations_is_not_mutated() -> None:
    assert webhook.mutate(_pod()) == []
    assert webhook.mutate(_pod({"other": "1"})) == []
    answer = webhook.review({"request": {"uid": "u1", "operation": "CREATE", "kind": {"kind": "Pod"},
                                         "object": _pod()}})
    assert answer["response"] == {"uid": "u1", "allowed": True}


def test_shared_pod_gets_kais_configmap_references_in_the_first_container() -> None:
    pod = _pod({"gpu-fraction": "0.5"}, containers=("main", "side"),
               volumes=[{"name": "data", "emptyDir": {}}])
    pod["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "GPU_PORTION", "value": "9"}]
    out = apply_patch(pod, webhook.mutate(pod, token="abcdefg"))
    prefix = "p-abcdefg-shared-gpu"
    assert out["metadata"]["annotations"]["runai/shared-gpu-configmap"] == prefix
    main, side = out["spec"]["containers"]
    assert side == pod["spec"]["containers"][1]
    assert main["env"][0] == {"name": "A", "value": "1"}
    assert {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in main["env"][1:]} == {
        k: {"name": f"{prefix}-0", "key": k} for k in ("NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION")}
    assert main["envFrom"] == [{"configMapRef": {"name": f"{prefix}-0-evar", "optional": False}}]
    assert out["spec"]["volumes"] == [{"name": "data", "emptyDir": {}},
                                      {"name": f"{prefix}-0-vol", "configMap": {"name": f"{prefix}-0"}}]
    again = apply_patch(out, webhook.mutate(out))  # reinvoked: the same pod
    assert again == out


def test_named_container_and_init_container_and_a_missing_one() -> None:
    pod = _pod({"gpu-memory": "2000", "gpu-fraction-container-name": "gpu", "runai/shared-gpu-configmap": "given"},
               containers=("side", "gpu"))
    out = apply_patch(pod, webhook.mutate(pod))
    assert "env" not in out["spec"]["containers"][0]
    assert out["spec"]["containers"][1]["envFrom"] == [{"configMapRef": {"name": "given-1-evar", "optional": False}}]
    assert out["metadata"]["annotations"]["runai/shared-gpu-configmap"] == "given"
    init = _pod({"gpu-fraction": "0.3", "gpu-fraction-container-name": "prep"},
                initContainers=[{"name": "prep", "image": "x"}])
    out = apply_patch(init, webhook.mutate(init, token="zzzzzzz"))
    assert out["spec"]["initContainers"][0]["envFrom"][0]["configMapRef"]["name"] == "p-zzzzzzz-shared-gpu-i0-evar"
    assert "env" not in out["spec"]["containers"][0]
    bad = _pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"})
    with pytest.raises(SharingError):
        webhook.mutate(bad)
    answer = webhook.review({"request": {"uid": "u", "operation": "CREATE", "object": bad}})["response"]
    assert answer["allowed"] is False and "nope" in answer["status"]["message"]


def test_review_answers_with_a_base64_json_patch() -> None:
    pod = _pod({"gpu-fraction": "0.5"})
    del pod["metadata"]["namespace"]
    answer = webhook.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "request": {"uid": "u2", "operation": "CREATE", "namespace": "team",
                                         "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": pod}})
    r = answer["response"]
    assert answer["kind"] == "AdmissionReview" and r["uid"] == "u2" and r["allowed"] and r["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(r["patch"]))
    out = apply_patch(pod, ops)
    assert out["metadata"]["annotations"]["runai/shared-gpu-configmap"].endswith("-shared-gpu")


def test_configuration_is_scoped_to_kai_opts_shared_gpu_pods() -> None:
    cfg = webhook.webhook_configuration("kai-opt", ["kai-opt", "other"],
                                        reservation_namespace="kai-resource-reservation", ca_bundle="PEM")
    (wh,) = cfg["webhooks"]
    assert wh["clientConfig"] == {"service": {"namespace": "kai-opt", "name": "kai-opt-webhook",
                                              "path": "/mutate-pods", "port": 443},
                                  "caBundle": base64.b64encode(b"PEM").decode()}
    assert wh["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                            "resources": ["pods"], "scope": "Namespaced"}]
    assert wh["namespaceSelector"]["matchExpressions"] == [{
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": ["kai-opt", "kai-resource-reservation", "kube-node-lease", "kube-public", "kube-system"]}]
    assert wh["objectSelector"]["matchExpressions"] == [{"key": "kai-opt.io/gpu-sharing-webhook", "operator": "NotIn",
                                                         "values": ["disabled"]}]
    exprs = " ".join(c["expression"] for c in wh["matchConditions"])
    assert "'gpu-fraction' in object.metadata.annotations" in exprs and "'gpu-memory'" in exprs
    assert 'object.spec.schedulerName in ["kai-opt", "other"]' in exprs
    assert wh["sideEffects"] == "None" and wh["admissionReviewVersions"] == ["v1"]
    by_url = webhook.webhook_configuration("x", ["kai-opt"], reservation_namespace="r", url="https://127.0.0.1:1/m")
    assert by_url["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:1/m"}


def test_https_server_answers_reviews_with_the_generated_certificate(tmp_path: Path) -> None:
    tls = webhook.generate_tls(["127.0.0.1", "kai-opt-webhook.kai-opt.svc"])
    server = webhook.WebhookServer(tls, host="127.0.0.1", port=0).start()
    try:
        ca = tmp_path / "ca.pem"
        ca.write_text(tls.ca_pem)
        ctx = ssl.create_default_context(cafile=str(ca))  # verifies the chain and the IP address
        body = json.dumps({"request": {"uid": "u3", "operation": "CREATE",
                                       "object": _pod({"gpu-fraction": "0.5"})}}).encode()
        req = urllib.request.Request(f"https://127.0.0.1:{server.port}/mutate-pods", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["response"]["uid"] == "u3" and answer["response"]["patchType"] == "JSONPatch"
        with urllib.request.urlopen(f"https://127.0.0.1:{server.port}/healthz", context=ctx, timeout=10) as resp:
            assert resp.read() == b"ok"
    finally:
        server.stop()


def _sent_to_webhook(wh: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether the apiserver would call the webhook for `pod`'s CREATE: the configuration's namespaceSelector,
    objectSelector and its two matchConditions, evaluated here for the exact expressions it has."""
    ns_rule = wh["namespaceSelector"]["matchExpressions"][0]
    obj_rule = wh["objectSelector"]["matchExpressions"][0]
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    shares, ours = (c["expression"] for c in wh["matchConditions"])
    assert shares == ("has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || "
                      "'gpu-memory' in object.metadata.annotations)"), "evaluated below as written"
    prefix = "has(object.spec.schedulerName) && object.spec.schedulerName in ["
    assert ours.startswith(prefix) and ours.endswith("]")
    names = json.loads("[" + ours[len(prefix):])
    return (meta["namespace"] not in ns_rule["values"]
            and (meta.get("labels") or {}).get(obj_rule["key"]) not in obj_rule["values"]
            and ("gpu-fraction" in annotations or "gpu-memory" in annotations)
            and pod["spec"].get("schedulerName") in names)


def test_autoscaler_placeholders_are_never_mutated() -> None:
    """The placeholders of GPU-sharing pods (kai_opt/k8s/scaleadjust.py) carry no sharing annotation and another
    scheduler's name (the config refuses one of kai-opt's), so the configuration `kai-opt manifests` renders never
    sends them to the webhook, and the webhook would not patch one if it were: the placeholder namespace needs no
    entry of its own in the namespaceSelector (it may be a namespace real GPU-sharing work runs in too)."""
    from kai_opt.config import parse_config
    from kai_opt.k8s import scaleadjust as sa
    from kai_opt.k8s.manifests import render_manifests, values_from_config

    cfg = parse_config({"autoscaler": {"enabled": True}})
    objs = render_manifests(values_from_config(cfg))
    (configuration,) = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    (wh,) = configuration["webhooks"]
    shared = _pod({"gpu-fraction": "0.5"})
    shared["metadata"]["namespace"] = "team-a"
    shared["spec"]["nodeSelector"] = {"gpu": "a100"}
    assert _sent_to_webhook(wh, shared), "the probe sees a pod the webhook is for"
    ph = sa.Placeholder("kai-opt-ph-x-0", 1, 1000, 2**30, "team-a/p", ("team-a/p",), (0,))
    placeholder = sa.placeholder_pod(ph, shared, cfg.autoscaler)
    assert placeholder["metadata"]["namespace"] == cfg.autoscaler.namespace
    assert not _sent_to_webhook(wh, placeholder)
    assert webhook.mutate(placeholder) == []
    answer = webhook.review({"request": {"uid": "u2", "operation": "CREATE", "kind": {"kind": "Pod"},
                                         "object": placeholder}})
    assert answer["response"] == {"uid": "u2", "allowed": True}
