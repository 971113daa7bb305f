"""`kai-opt run` on a real apiserver carries out KAI's GPU-sharing contract: GPU group labels, one reservation pod
per shared device (kwok plays the kubelet; the `fresh` fixture's `gpu_node` plays the device plugin and the
reservation container by writing the reservation pod's `run.ai/reserve_for_gpu_index`), the pods' shared-GPU
ConfigMaps, reservation time-outs, the RBAC of the manifests, and the admission webhook's injection."""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import MERGE_PATCH, object_path, request

from .schedharness import (
    NS,
    bound,
    create,
    events,
    fast_config,
    fresh,
    gpu_node,
    namespace,
    node,
    pod,
    pods,
    queue,
    scheduler,
    wait_for,
)
from .testcluster import LocalCluster, delete_cluster_rbac, ensure_namespace

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

RESV_NS = "kai-resource-reservation"
NS_B = "sched-b"
GPU_INDEX = "run.ai/reserve_for_gpu_index"


def reservation_pods(api: ApiClient, ns: str = RESV_NS) -> list[dict[str, Any]]:
    return [p for p in request(api, "GET", object_path("v1", "pods", ns))["items"]
            if not p["metadata"].get("deletionTimestamp")]


def reported_gpu(reservation: dict[str, Any]) -> str:
    return reservation["metadata"]["annotations"][GPU_INDEX]


def configmap(api: ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return request(api, "GET", object_path("v1", "configmaps", ns, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def shared_pod(name: str, ns: str, *, fraction: str | None = None, memory: str | None = None,
               container_name: str | None = None) -> dict[str, Any]:
    p = pod(name, ns=ns, queue_name="team", fraction=fraction)
    if memory:
        p["metadata"]["annotations"]["gpu-memory"] = memory
    if container_name:
        p["metadata"]["annotations"]["gpu-fraction-container-name"] = container_name
        p["spec"]["containers"].insert(0, {"name": "sidecar", "image": "busybox"})
    return p


def _setup(api: ApiClient, nodes: list[dict[str, Any]], extra: list[dict[str, Any]]) -> None:
    ensure_namespace(api, NS_B)
    create(api, [namespace(), *nodes, queue("team"), *extra])


def _cms_of(api: ApiClient, p: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    prefix = p["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    ns = p["metadata"]["namespace"]
    return configmap(api, ns, f"{prefix}-0"), configmap(api, ns, f"{prefix}-0-evar")


def test_two_half_gpu_pods_of_two_namespaces_share_one_reserved_device(fresh: LocalCluster) -> None:
    with fresh.api_client() as api, fresh.kwok():
        _setup(api, [node("n1", 1)], [shared_pod("a", NS, fraction="0.5"), shared_pod("b", NS_B, fraction="0.5")])
        with scheduler(fresh, fast_config()):
            wait_for("both pods bound", lambda: bound(api, NS).get("a") == "n1" and bound(api, NS_B).get("b") == "n1")
            (resv,) = reservation_pods(api)
            assert resv["spec"]["nodeName"] == "n1"
            assert resv["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
            assert resv["metadata"]["labels"]["app"] == "kai-resource-reservation"
            group = resv["metadata"]["labels"]["runai-gpu-group"]
            gpu = reported_gpu(resv)
            a, b = pods(api, NS)["a"], pods(api, NS_B)["b"]
            for p in (a, b):
                assert p["metadata"]["labels"]["runai-gpu-group"] == group
                assert p["metadata"]["annotations"]["received-resource-type"] == "Fraction"
                cap, direct = _cms_of(api, p)
                assert cap is not None and direct is not None
                assert cap["data"]["NVIDIA_VISIBLE_DEVICES"] == gpu and cap["data"]["GPU_PORTION"] == "0.50"
                assert direct["data"] == {"NVIDIA_VISIBLE_DEVICES": gpu}
                for cm in (cap, direct):
                    (owner,) = cm["metadata"]["ownerReferences"]
                    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", p["metadata"]["name"],
                                                                          p["metadata"]["uid"])
            # the first pod finishes: the device is still shared by the second
            request(api, "PATCH", object_path("v1", "pods", NS, "a") + "/status",
                    body={"status": {"phase": "Succeeded"}}, content_type=MERGE_PATCH)
            time.sleep(7.0)  # more than sharing.SETTLE_S and an idle cycle
            assert [r["metadata"]["name"] for r in reservation_pods(api)] == [resv["metadata"]["name"]]
            request(api, "DELETE", object_path("v1", "pods", NS_B, "b"), query={"gracePeriodSeconds": 0})
            wait_for("the reservation pod gone", lambda: not reservation_pods(api), timeout=20)


def test_gpu_memory_pod_gets_the_memory_limit_and_a_plain_pod_gets_nothing(fresh: LocalCluster) -> None:
    with fresh.api_client() as api, fresh.kwok():
        plain = pod("plain", ns=NS, queue_name="team", gpus=1)
        _setup(api, [node("n1", 2)], [shared_pod("m", NS, memory="2000", container_name="main"), plain,
                                      pod("cpu-only", ns=NS, queue_name="team")])
        with scheduler(fresh, fast_config()):
            wait_for("all bound", lambda: set(bound(api, NS)) == {"m", "plain", "cpu-only"})
            (resv,) = reservation_pods(api)
            m = pods(api, NS)["m"]
            assert m["metadata"]["labels"]["runai-gpu-group"] == resv["metadata"]["labels"]["runai-gpu-group"]
            prefix = m["metadata"]["annotations"]["runai/shared-gpu-configmap"]
            cap = configmap(api, NS, f"{prefix}-1")  # gpu-fraction-container-name: the second container
            assert cap is not None and configmap(api, NS, f"{prefix}-0") is None
            assert cap["data"]["GPU_MEMORY_LIMIT_MIB"] == "2000"
            assert cap["data"]["GPU_PORTION"] == f"{2000 / 81920:.2f}"
            assert cap["data"]["NVIDIA_VISIBLE_DEVICES"] == reported_gpu(resv)
            # the reservation pod holds no GPU in kai-opt's books: the whole-GPU pod took the other device
            assert m["metadata"]["annotations"]["kai-opt.io/gpu-devices"] != \
                pods(api, NS)["plain"]["metadata"]["annotations"]["kai-opt.io/gpu-devices"]
            for name in ("plain", "cpu-only"):
                p = pods(api, NS)[name]
                assert not any(k.startswith("runai-gpu-group") for k in p["metadata"].get("labels") or {})
                ann = p["metadata"].get("annotations") or {}
                assert "runai/shared-gpu-configmap" not in ann and "received-resource-type" not in ann
                owned = [c for c in request(api, "GET", object_path("v1", "configmaps", NS))["items"]
                         if any(o["uid"] == p["metadata"]["uid"] for o in c["metadata"].get("ownerReferences") or [])]
                assert owned == []


def test_a_reservation_that_never_reports_is_replaced_and_its_pod_waits(fresh: LocalCluster) -> None:
    slow = "kai-resource-reservation-slow"  # a namespace whose node side reports only when told (`report`)
    with fresh.api_client() as api, fresh.kwok():
        ensure_namespace(api, slow)
        _setup(api, [node("n1", 1)], [shared_pod("a", NS, fraction="0.5")])
        report = threading.Event()
        config = fast_config(gpu_sharing={"reservation_timeout_s": 1.0, "reservation_namespace": slow})
        with gpu_node(api, slow, report=report), scheduler(fresh, config):
            first = wait_for("a reservation pod", lambda: reservation_pods(api, slow))[0]["metadata"]["name"]
            wait_for("a FailedBinding event for the time-out",
                     lambda: [e for e in events(api, reason="FailedBinding")
                              if "reservation-timeout" in e["message"] and first in e["message"]], timeout=15)
            assert "a" not in bound(api)  # never bound before its device is known
            wait_for("the silent reservation pod deleted",
                     lambda: first not in [r["metadata"]["name"] for r in reservation_pods(api, slow)], timeout=10)
            report.set()
            wait_for("pod bound once a reservation reports", lambda: bound(api).get("a") == "n1", timeout=20)
            (resv,) = reservation_pods(api, slow)
            assert resv["metadata"]["name"] != first
            p = pods(api)["a"]
            cap, _ = _cms_of(api, p)
            assert cap is not None and cap["data"]["NVIDIA_VISIBLE_DEVICES"] == reported_gpu(resv)
            assert p["metadata"]["labels"]["runai-gpu-group"] == resv["metadata"]["labels"]["runai-gpu-group"]


def test_the_manifests_rbac_is_enough_for_gpu_sharing(fresh: LocalCluster) -> None:
    """kai-opt running as its own ServiceAccount (the manifests' RBAC) creates the reservation pod, labels the pods,
    writes their ConfigMaps, binds them and deletes the reservation pod again."""
    from kai_opt.k8s.client import apply_objects
    from kai_opt.k8s.manifests import NAME, build_manifests
    from kai_opt.k8s.runner import Runner

    sched_ns = "kai-opt-sharing-e2e"
    try:
        with fresh.api_client() as api, fresh.kwok():
            # the webhook is not served here (see the webhook test): its configuration would refuse the shared pods
            apply_objects(api, [o for o in build_manifests(sched_ns, "kai-opt:test")
                                if o["kind"] != "MutatingWebhookConfiguration"])
            _setup(api, [node("n1", 1)], [shared_pod("a", NS, fraction="0.5"), shared_pod("b", NS_B, fraction="0.5")])
            with fresh.service_account_client(sched_ns, NAME) as sa:
                runner = Runner(sa, fast_config(), identity="rbac", leader_elect=False)
                errors: list[BaseException] = []

                def main() -> None:
                    try:
                        runner.run()
                    except BaseException as exc:  # re-raised below
                        errors.append(exc)

                t = threading.Thread(target=main, daemon=True)
                t.start()
                try:
                    wait_for("both bound", lambda: bound(api, NS).get("a") == "n1" and bound(api, NS_B).get("b"))
                    (resv,) = reservation_pods(api)
                    for p in (pods(api, NS)["a"], pods(api, NS_B)["b"]):
                        assert p["metadata"]["labels"]["runai-gpu-group"] == \
                            resv["metadata"]["labels"]["runai-gpu-group"]
                        assert all(_cms_of(api, p))
                    for ns, name in ((NS, "a"), (NS_B, "b")):
                        request(api, "DELETE", object_path("v1", "pods", ns, name), query={"gracePeriodSeconds": 0})
                    wait_for("the reservation pod gone", lambda: not reservation_pods(api), timeout=20)
                finally:
                    runner.stop()
                    t.join(15)
                assert not errors, errors
    finally:
        with fresh.api_client() as api:
            delete_cluster_rbac(api, NAME)


def test_webhook_injects_the_shared_gpu_configmaps_into_the_right_container(fresh: LocalCluster) -> None:
    """The apiserver calls kai-opt's webhook (certificate from Secret, caBundle patched in) for shared-GPU pods only;
    the injected references name the ConfigMaps the binder then writes with the reserved GPU."""
    from kai_opt.k8s.webhook import (
        SECRET_NAME,
        WEBHOOK_NAME,
        WebhookServer,
        ensure_ca_bundle,
        ensure_tls,
        webhook_configuration,
    )

    mwc_path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{WEBHOOK_NAME}"
    with fresh.api_client() as api, fresh.kwok():
        tls = ensure_tls(api, "default", ["127.0.0.1"])
        assert ensure_tls(api, "default", ["127.0.0.1"]) == tls  # the Secret's, not a new one
        server = WebhookServer(tls, host="127.0.0.1", port=0).start()
        try:
            url = f"https://127.0.0.1:{server.port}/mutate-pods"
            create(api, [webhook_configuration("kai-opt", ["kai-opt"], reservation_namespace=RESV_NS, url=url)])
            assert ensure_ca_bundle(api, tls.ca_pem)
            _setup(api, [node("n1", 1)], [])

            def mutated_probe() -> bool:  # the apiserver picks the configuration up after a moment
                probe = shared_pod("probe", NS, fraction="0.5")
                probe["spec"]["schedulerName"] = "kai-opt"
                probe["spec"]["schedulingGates"] = [{"name": "test"}]
                with contextlib.suppress(ApiException):
                    request(api, "DELETE", object_path("v1", "pods", NS, "probe"), query={"gracePeriodSeconds": 0})
                made = request(api, "POST", object_path("v1", "pods", NS), body=probe)
                return "runai/shared-gpu-configmap" in (made["metadata"].get("annotations") or {})

            wait_for("the webhook called by the apiserver", mutated_probe, timeout=30, interval=0.5)
            request(api, "DELETE", object_path("v1", "pods", NS, "probe"), query={"gracePeriodSeconds": 0})
            plain = pod("plain", ns=NS, queue_name="team", gpus=1)
            create(api, [shared_pod("a", NS, fraction="0.5"),
                         shared_pod("b", NS_B, fraction="0.5", container_name="main"), plain])
            a, b, stored_plain = pods(api, NS)["a"], pods(api, NS_B)["b"], pods(api, NS)["plain"]
            assert stored_plain["spec"]["containers"][0].get("env") is None
            assert not [v for v in stored_plain["spec"].get("volumes") or [] if "shared-gpu" in v["name"]]
            assert "runai/shared-gpu-configmap" not in (stored_plain["metadata"].get("annotations") or {})
            assert "envFrom" not in b["spec"]["containers"][0]  # the sidecar is left alone
            with scheduler(fresh, fast_config()):
                wait_for("both bound", lambda: bound(api, NS).get("a") == "n1" and bound(api, NS_B).get("b") == "n1")
                (resv,) = reservation_pods(api)
                gpu = reported_gpu(resv)
                for p, index in ((a, 0), (b, 1)):
                    ns = p["metadata"]["namespace"]
                    container = p["spec"]["containers"][index]
                    refs = {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in container["env"]
                            if "valueFrom" in e}
                    cap = configmap(api, ns, refs["NVIDIA_VISIBLE_DEVICES"]["name"])
                    assert cap is not None and cap["data"]["NVIDIA_VISIBLE_DEVICES"] == gpu
                    assert cap["data"][refs["GPU_PORTION"]["key"]] == "0.50"
                    (env_from,) = container["envFrom"]
                    direct = configmap(api, ns, env_from["configMapRef"]["name"])
                    assert direct is not None and direct["data"] == {"NVIDIA_VISIBLE_DEVICES": gpu}
                    vol = next(v for v in p["spec"]["volumes"] if v["name"] == f"{cap['metadata']['name']}-vol")
                    assert vol["configMap"]["name"] == cap["metadata"]["name"]
                    assert refs["NVIDIA_VISIBLE_DEVICES"]["name"] == \
                        f"{p['metadata']['annotations']['runai/shared-gpu-configmap']}-{index}"
        finally:
            with contextlib.suppress(ApiException):
                request(api, "DELETE", mwc_path)
            server.stop()
            with contextlib.suppress(ApiException):
                request(api, "DELETE", object_path("v1", "secrets", "default", SECRET_NAME))


def test_a_pod_on_two_shared_devices_gets_a_group_and_a_reservation_per_device(fresh: LocalCluster) -> None:
    with fresh.api_client() as api, fresh.kwok():
        multi = shared_pod("multi", NS, fraction="0.5")
        multi["metadata"]["annotations"]["gpu-fraction-num-devices"] = "2"
        _setup(api, [node("n1", 2)], [multi])
        with scheduler(fresh, fast_config()):
            wait_for("bound", lambda: bound(api).get("multi") == "n1")
            resv = reservation_pods(api)
            assert len(resv) == 2 and {r["spec"]["nodeName"] for r in resv} == {"n1"}
            by_device = {r["metadata"]["annotations"]["kai-opt.io/gpu-devices"]: r for r in resv}
            p = pods(api)["multi"]
            devices = p["metadata"]["annotations"]["kai-opt.io/gpu-devices"].split(",")
            assert sorted(devices) == sorted(by_device)
            groups = [by_device[d]["metadata"]["labels"]["runai-gpu-group"] for d in devices]
            assert len(set(groups)) == 2
            labels = p["metadata"]["labels"]
            assert "runai-gpu-group" not in labels  # a multi-device pod carries KAI's per-device labels only
            assert {k: v for k, v in labels.items() if k.startswith("runai-gpu-group/")} == {
                f"runai-gpu-group/{g}": g for g in groups}
            cap, direct = _cms_of(api, p)
            want = ",".join(reported_gpu(by_device[d]) for d in devices)  # in the pod's device order
            assert cap is not None and cap["data"]["NVIDIA_VISIBLE_DEVICES"] == want
            assert direct is not None and direct["data"]["NVIDIA_VISIBLE_DEVICES"] == want
            request(api, "DELETE", object_path("v1", "pods", NS, "multi"), query={"gracePeriodSeconds": 0})
            wait_for("both reservation pods gone", lambda: not reservation_pods(api), timeout=20)


def test_kai_opt_run_serves_the_webhook_with_the_certificate_of_its_secret(fresh: LocalCluster, tmp_path: Path) -> None:
    """`kai-opt run --webhook-port`: two replicas serve one certificate (generated once into the Secret), the
    configuration's caBundle is its CA, and the server answers over TLS for the Service's name."""
    import socket
    import ssl

    from kai_opt.k8s.webhook import SECRET_NAME, WEBHOOK_NAME, webhook_configuration

    from .schedharness import FAST_RUNTIME, SchedulerProcess
    from .testcluster import free_port

    mwc_path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{WEBHOOK_NAME}"
    config = {"schedule_period_s": 0.2, "runtime": FAST_RUNTIME}
    with fresh.api_client() as api:
        with contextlib.suppress(ApiException):
            request(api, "DELETE", object_path("v1", "secrets", "default", SECRET_NAME))
        mwc = webhook_configuration("default", ["kai-opt"], reservation_namespace=RESV_NS)
        mwc["webhooks"][0]["objectSelector"] = {"matchLabels": {"never": "matches"}}  # not called in this test
        create(api, [mwc])
        ports = [free_port(), free_port()]
        procs = [SchedulerProcess(fresh, tmp_path, config, identity=f"w{i}", extra=("--webhook-port", str(port)))
                 for i, port in enumerate(ports)]
        try:
            for p in procs:
                wait_for(f"{p.identity} serving the webhook", lambda p=p: "GPU-sharing webhook on" in p.output(),
                         timeout=30)
            secret = request(api, "GET", object_path("v1", "secrets", "default", SECRET_NAME))
            ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
            bundle = request(api, "GET", mwc_path)["webhooks"][0]["clientConfig"]["caBundle"]
            assert base64.b64decode(bundle).decode() == ca
            ca_file = tmp_path / "ca.pem"
            ca_file.write_text(ca)
            ctx = ssl.create_default_context(cafile=str(ca_file))
            for port in ports:  # both replicas: the same certificate, valid for the Service's DNS name
                with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                        ctx.wrap_socket(raw, server_hostname="kai-opt-webhook.default.svc") as tls:
                    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    answer = b""
                    while chunk := tls.recv(4096):
                        answer += chunk
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
        finally:
            for p in procs:
                p.terminate()
            with contextlib.suppress(ApiException):
                request(api, "DELETE", mwc_path)
            with contextlib.suppress(ApiException):
                request(api, "DELETE", object_path("v1", "secrets", "default", SECRET_NAME))
