"""KAI's GPU-sharing contract: the object builders of kai_opt/k8s/sharing.py and the reservation entrypoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kai_opt import reservation
from kai_opt.config import Config, parse_config
from kai_opt.errors import ConfigError
from kai_opt.k8s import sharing
from kai_opt.k8s.sharing import ContainerRef, SharingError


def _pod(name: str = "p", *, ann: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         containers: tuple[str, ...] = ("main",), init: tuple[str, ...] = (), owner: str | None = None,
         uid: str = "uid-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid, "annotations": dict(ann or {}),
                            "labels": dict(labels or {})}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": "o"}]
    spec: dict[str, Any] = {"containers": [{"name": c, "image": "x"} for c in containers]}
    if init:
        spec["initContainers"] = [{"name": c, "image": "x"} for c in init]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def test_shares_gpu_only_with_kai_sharing_annotations() -> None:
    assert sharing.shares_gpu(_pod(ann={"gpu-fraction": "0.5"}))
    assert sharing.shares_gpu(_pod(ann={"gpu-memory": "2000"}))
    assert not sharing.shares_gpu(_pod())
    assert not sharing.shares_gpu(None)


def test_group_labels_single_and_multi_device() -> None:
    one = _pod(ann={"gpu-fraction": "0.5"})
    assert sharing.group_labels(one, ["g1"]) == {"runai-gpu-group": "g1"}
    multi = _pod(ann={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})
    assert sharing.group_labels(multi, ["g1", "g2"]) == {"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2"}
    labelled = _pod(labels={"runai-gpu-group": "a", "runai-gpu-group/b": "b", "other": "c"})
    assert sharing.pod_groups(labelled) == {"a", "b"}


def test_new_groups_are_uuids() -> None:
    g = sharing.new_group()
    assert len(g) == 36 and g.count("-") == 4 and g != sharing.new_group()


def test_fraction_container_default_named_and_init() -> None:
    assert sharing.fraction_container(_pod(containers=("a", "b"))) == ContainerRef("a", 0)
    named = _pod(ann={"gpu-fraction-container-name": "b"}, containers=("a", "b"))
    assert sharing.fraction_container(named) == ContainerRef("b", 1)
    init = _pod(ann={"gpu-fraction-container-name": "prep"}, containers=("a",), init=("prep",))
    ref = sharing.fraction_container(init)
    assert ref == ContainerRef("prep", 0, init=True) and ref.suffix == "i0"
    with pytest.raises(SharingError, match="no container named 'zzz'"):
        sharing.fraction_container(_pod(ann={"gpu-fraction-container-name": "zzz"}))


def test_configmap_prefix_names_and_lengths() -> None:
    ref = ContainerRef("main", 0)
    assert sharing.configmap_prefix(_pod(ann={"runai/shared-gpu-configmap": "given"}), ref) == "given"
    p = sharing.configmap_prefix(_pod("train-0", owner="train"), ref)
    assert p.startswith("train-") and p.endswith("-shared-gpu") and len(p.split("-")[1]) == 7
    assert p == sharing.configmap_prefix(_pod("train-0", owner="train"), ref)  # from the uid: stable
    assert p != sharing.configmap_prefix(_pod("train-0", owner="train", uid="uid-2"), ref)
    long = sharing.configmap_prefix(_pod("x" * 200), ref)
    cap, direct = sharing.configmap_names(long, ref)
    assert cap == f"{long}-0" and direct == f"{long}-0-evar"
    assert len(direct) <= 63 and len(f"{cap}-vol") <= 63
    assert sharing.configmap_names("pre", ContainerRef("i", 2, init=True)) == ("pre-i2", "pre-i2-evar")


def test_gpu_portion_from_fraction_or_memory() -> None:
    node = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": "8000"}}}
    assert sharing.gpu_portion(_pod(ann={"gpu-fraction": "0.5"}), node) == "0.50"
    assert sharing.gpu_portion(_pod(ann={"gpu-memory": "2000"}), node) == "0.25"
    assert sharing.gpu_portion(_pod(ann={"gpu-memory": "20000"}), node) == "1.00"
    assert sharing.gpu_portion(_pod(ann={"gpu-memory": "2000"}), {"metadata": {"name": "n"}}) == ""


def test_configmaps_owned_by_the_pod_with_device_portion_and_memory_limit() -> None:
    pod = _pod(ann={"gpu-memory": "2000"})
    ref = ContainerRef("main", 0)
    cap, direct = sharing.configmaps(pod, "pre", ref, "GPU-1234", "0.25")
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-1"}]
    assert cap["metadata"]["name"] == "pre-0" and cap["metadata"]["namespace"] == "ns"
    assert cap["metadata"]["ownerReferences"] == owner and direct["metadata"]["ownerReferences"] == owner
    assert cap["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-1234", "GPU_PORTION": "0.25", "RUNAI_NUM_OF_GPUS": "0.25",
                           "GPU_MEMORY_LIMIT_MIB": "2000"}
    assert direct["metadata"]["name"] == "pre-0-evar" and direct["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-1234"}
    frac = sharing.configmaps(_pod(ann={"gpu-fraction": "0.5"}), "pre", ref, "GPU-1", "0.50")[0]
    assert "GPU_MEMORY_LIMIT_MIB" not in frac["data"] and frac["data"]["GPU_PORTION"] == "0.50"
    assert sharing.device_names(["a", "b"], cdi=True) == ("k8s.device-plugin.nvidia.com/gpu=a,"
                                                         "k8s.device-plugin.nvidia.com/gpu=b")
    assert sharing.device_names(["a", "b"], cdi=False) == "a,b"


def test_reservation_pod_spec() -> None:
    cfg = Config().runtime.gpu_sharing
    pod = sharing.reservation_pod(cfg, "node-1", "g1", 3)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["namespace"] == "kai-resource-reservation"
    assert meta["name"].startswith("gpu-reservation-node-1-") and len(meta["name"]) == len("gpu-reservation-node-1-")+5
    assert meta["labels"] == {"app": "kai-resource-reservation", "runai-gpu-group": "g1",
                              "app.kubernetes.io/managed-by": "kai-opt"}
    assert meta["annotations"] == {"karpenter.sh/do-not-disrupt": "true", "kai-opt.io/gpu-devices": "3"}
    assert spec["nodeName"] == "node-1" and spec["runtimeClassName"] == "nvidia"
    assert spec["serviceAccountName"] == "kai-opt-reservation"
    (c,) = spec["containers"]
    assert c["image"] == cfg.reservation_image and c["command"] == ["python", "-m", "kai_opt.reservation"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {
        "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    custom = parse_config({"runtime": {"gpu_sharing": {"runtime_class_name": "", "reservation_namespace": "resv",
                                                       "reservation_image": "reg/kai-opt:1"}}})
    other = sharing.reservation_pod(custom.runtime.gpu_sharing, "n", "g", 0, name="r")
    assert "runtimeClassName" not in other["spec"] and other["metadata"]["namespace"] == "resv"
    assert other["metadata"]["name"] == "r" and other["spec"]["containers"][0]["image"] == "reg/kai-opt:1"
    long = sharing.reservation_pod(cfg, "n" * 300, "g", 0)
    assert len(long["metadata"]["name"]) <= 253


def test_reservation_pods_hold_no_gpu_in_the_snapshot() -> None:
    pod = sharing.reservation_pod(Config().runtime.gpu_sharing, "n", "g", 0)
    stripped = sharing.without_gpu(pod)
    assert stripped["spec"]["containers"][0]["resources"] == {"limits": {}, "requests": {}}
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # not modified


@pytest.mark.parametrize("field,value", [
    ("reservation_namespace", "Not_A_Label"), ("reservation_timeout_s", 0), ("reservation_image", "a b"),
    ("runtime_class_name", "UPPER"), ("reservation_app_label", ""), ("unknown", 1)])
def test_sharing_config_is_validated(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"runtime.gpu_sharing.{field}"):
        parse_config({"runtime": {"gpu_sharing": {field: value}}})


def test_reservation_entrypoint_reads_the_device_plugins_gpu(tmp_path: Path) -> None:
    assert reservation.visible_gpu({"NVIDIA_VISIBLE_DEVICES": "GPU-8f2a"}) == "GPU-8f2a"
    for bad in ("", "all", "void", "GPU-1,GPU-2"):
        with pytest.raises(ValueError):
            reservation.visible_gpu({"NVIDIA_VISIBLE_DEVICES": bad})
    (tmp_path / "GPU-77").touch()  # the device plugin's volume-mounts strategy
    assert reservation.visible_gpu({"NVIDIA_VISIBLE_DEVICES": str(tmp_path)}) == "GPU-77"


def test_reservation_entrypoint_patches_its_own_pod_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kai_opt.k8s import client as k8s_client

    calls: list[tuple[str, str, Any]] = []
    annotations: dict[str, str] = {}

    def fake_request(api: Any, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        calls.append((method, path, body))
        if method == "PATCH":
            annotations.update(body["metadata"]["annotations"])
        return {"metadata": {"annotations": dict(annotations)}}

    monkeypatch.setattr(k8s_client, "request", fake_request)
    assert reservation.report(None, "kai-resource-reservation", "r", "GPU-1")
    assert annotations == {"run.ai/reserve_for_gpu_index": "GPU-1"}
    assert calls[-1][:2] == ("PATCH", "/api/v1/namespaces/kai-resource-reservation/pods/r")
    calls.clear()
    assert reservation.report(None, "kai-resource-reservation", "r", "GPU-2")  # already reported: kept
    assert [c[0] for c in calls] == ["GET"] and annotations["run.ai/reserve_for_gpu_index"] == "GPU-1"
    monkeypatch.delenv("POD_NAME", raising=False)
    assert reservation.main([]) == 1


class _Cache:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def list(self, kind: str, api_version: str | None = None) -> list[dict[str, Any]]:
        return list(self.pods)

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name),
                    None)

    def get(self, api_version: str, kind: str, ns: str | None, name: str) -> dict[str, Any] | None:
        return None


def _reservation(name: str, node: str, group: str, *, ours: bool = True, age_s: float = 60) -> dict[str, Any]:
    import datetime as dt

    p = sharing.reservation_pod(Config().runtime.gpu_sharing, node, group, 0, name=name)
    p["metadata"]["creationTimestamp"] = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=age_s)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    if not ours:
        del p["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    return p


def _sharer(name: str, node: str, group: str, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    p = _pod(name, ann={"gpu-fraction": "0.5"}, labels={"runai-gpu-group": group})
    p["metadata"].update(meta)
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": phase}
    return p


def test_sync_deletes_only_kai_opts_reservations_nobody_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    deleted: list[str] = []

    def fake_request(api: Any, method: str, path: str, **_: Any) -> Any:
        assert method == "DELETE"
        deleted.append(path.rsplit("/", 1)[-1])
        return {}

    monkeypatch.setattr(sharing, "request", fake_request)
    cache = _Cache([
        _reservation("r-used", "n1", "g1"), _sharer("a", "n1", "g1"),
        _reservation("r-done", "n1", "g2"), _sharer("b", "n1", "g2", phase="Succeeded"),
        _reservation("r-terminating-user", "n1", "g3"),
        _sharer("c", "n1", "g3", deletionTimestamp="2026-01-01T00:00:00Z"),
        _reservation("r-other-node", "n2", "g4"), _sharer("d", "n1", "g4"),
        _reservation("r-kais", "n1", "g5", ours=False),
        _reservation("r-new", "n1", "g6", age_s=0),
    ])
    binder = sharing.GpuSharingBinder(None, cache, Config().runtime.gpu_sharing, write=lambda: None,
                                      stop=threading.Event())
    assert sorted(binder.sync()) == ["r-done", "r-other-node"]
    assert sorted(deleted) == ["r-done", "r-other-node"]


def test_the_cache_snapshot_gives_reservation_pods_no_gpu() -> None:
    from kai_opt.k8s import cache as cache_mod

    c = cache_mod.ClusterCache(api=None, kinds=cache_mod.SCHEDULING_KINDS,  # type: ignore[arg-type]
                               reservation_app="kai-resource-reservation")
    res = c._stores[("v1", "Pod")].res
    resv = sharing.reservation_pod(Config().runtime.gpu_sharing, "n1", "g", 0, name="r")
    resv["metadata"]["uid"] = "ur"
    whole = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "ns", "uid": "uw"},
             "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                 "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}}
    for p in (resv, whole):
        c._apply(res, "ADDED", p)
    objs = {o.obj["metadata"]["name"]: o.obj for o in c.scheduling_objects(("kai-opt",)) if o.kind == "Pod"}
    assert objs["r"]["spec"]["containers"][0]["resources"]["requests"] == {}
    assert objs["w"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # others keep it
    assert c.pod("kai-resource-reservation", "r")["spec"]["containers"][0]["resources"]["requests"] == {
        "nvidia.com/gpu": "1"}  # the stored object is not modified
