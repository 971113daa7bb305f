"""Autoscaler support (kai_opt/k8s/scaleadjust.py): which placeholder pods should exist (a pure function of the
state, plan and config), what they look like, and the reconciler against the fake request the k8s tests use."""

from __future__ import annotations

import math
from typing import Any

import pytest
from builders import node, pod, podgroup, queue, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_opt.config import Config, Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.errors import ConfigError
from kai_opt.k8s import scaleadjust as sa
from kai_opt.k8s.cache import SCHEDULING_KINDS, ClusterCache
from kai_opt.k8s.workqueue import TokenBucket
from kai_opt.snapshot import RawObject
from kai_opt.state import ClusterState, build_state

SELECTOR = {"nvidia.com/gpu.product": "H100"}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _config(**autoscaler: Any) -> Config:
    return parse_config({"engine": "greedy", "autoscaler": {"enabled": True, **autoscaler}})


def _full_cluster() -> list[RawObject]:
    """One 8-GPU node, all of it taken by a running non-preemptible job."""
    return [node("n1", gpus=8, labels=SELECTOR), queue("q", gpu=(8, 1, -1)),
            podgroup("busy", "q", priority_class="build"), pod("busy-0", "busy", gpus=8, node_name="n1",
                                                                 tolerations=TOLERATIONS)]


def _fraction_pods(n: int, fraction: float, prefix: str = "f", **kw: Any) -> list[RawObject]:
    out = []
    for i in range(n):
        out += [podgroup(f"{prefix}{i}", "q", created_min=i),
                pod(f"{prefix}{i}-0", f"{prefix}{i}", gpus=fraction, cpu="2", memory="8Gi",
                    nodeSelector=SELECTOR, tolerations=TOLERATIONS, **kw)]
    return out


def _decide(objs: list[RawObject], cfg: Config) -> tuple[ClusterState, list[sa.Placeholder], Any]:
    state = build_state(snapshot(objs))
    plan, fs = run_cycle(state, cfg)
    return state, sa.desired_placeholders(state, plan, fs, cfg), plan


def test_fraction_pods_with_no_room_sum_into_whole_gpu_placeholders() -> None:
    cfg = _config()
    state, phs, plan = _decide(_full_cluster() + _fraction_pods(3, 0.5), cfg)
    assert len(plan.pending) == 3 and all(sa.needs_scale_up(r) for r in plan.pending.values())
    assert [ph.gpus for ph in phs] == [1, 1], "0.5 + 0.5 share one device, the third needs another"
    assert sorted(p for ph in phs for p in ph.pods) == [f"default/f{i}-0" for i in range(3)]
    assert all(ph.cpu_milli == 2000 and ph.memory == 8 * 2**30 for ph in phs)
    reasons = sa.scale_up_reasons(state, phs, cfg.autoscaler)
    assert set(reasons) == set(plan.pending)
    assert all(r.code == "WaitingForScaleUp" and "nvidia.com/gpu" in r.message for r in reasons.values())
    # the same decision again: the same names (reconciling keeps them)
    _, again, _ = _decide(_full_cluster() + _fraction_pods(3, 0.5), cfg)
    assert [ph.name for ph in again] == [ph.name for ph in phs]


def test_a_share_never_spans_two_devices_and_gpu_memory_counts_by_the_ratio() -> None:
    _, phs, _ = _decide(_full_cluster() + _fraction_pods(3, 0.6), _config())
    assert [ph.gpus for ph in phs] == [1, 1, 1], "ceil(1.8) = 2 devices could not hold three 0.6 shares"
    mem = [podgroup("m", "q"), pod("m-0", "m", annotations={"gpu-memory": "20000"}, nodeSelector=SELECTOR,
                                   tolerations=TOLERATIONS)]
    for i in range(1, 5):
        mem += [podgroup(f"m{i}", "q"), pod(f"m{i}-0", f"m{i}", annotations={"gpu-memory": "20000"},
                                            nodeSelector=SELECTOR, tolerations=TOLERATIONS)]
    _, phs, _ = _decide(_full_cluster() + mem, _config(gpu_memory_to_fraction_ratio=0.25))
    assert sorted(len(ph.pods) for ph in phs) == [1, 4], "five gpu-memory pods at 0.25 each: two devices"


def test_devices_per_pod_and_different_constraints_make_their_own_placeholders() -> None:
    two = _fraction_pods(2, 0.5, prefix="d", annotations={"gpu-fraction-num-devices": "2"})
    other = [podgroup("o", "q"), pod("o-0", "o", gpus=0.5, nodeSelector={"pool": "b"})]
    _, phs, _ = _decide(_full_cluster() + two + other, _config())
    by_source = {ph.source: ph for ph in phs}
    assert by_source["default/d0-0"].gpus == 2 and len(by_source["default/d0-0"].pods) == 2
    assert by_source["default/o-0"].gpus == 1 and by_source["default/o-0"].pods == ("default/o-0",)


def test_a_gang_that_cannot_fit_asks_for_all_its_nodes_at_once() -> None:
    gang = [podgroup("g", "q", min_member=4)] + [pod(f"g-{i}", "g", gpus=8, cpu="16", memory="64Gi")
                                                 for i in range(4)]
    _, phs, _ = _decide(_full_cluster() + gang, _config())
    assert [ph.gpus for ph in phs] == [8, 8, 8, 8]
    assert sorted(ph.source for ph in phs) == [f"default/g-{i}" for i in range(4)]
    assert len({g for ph in phs for g in ph.groups}) == 1
    _, none, _ = _decide(_full_cluster() + gang, _config(whole_gpu_pods=False))
    assert none == []
    _, capped, _ = _decide(_full_cluster() + gang, _config(max_placeholders=3))
    assert capped == [], "a gang's demand is one: all its placeholders or none"
    singles = [x for i in range(3) for x in (podgroup(f"s{i}", "q", created_min=i), pod(f"s{i}-0", f"s{i}", gpus=8))]
    _, capped, _ = _decide(_full_cluster() + singles, _config(max_placeholders=2))
    assert sorted(ph.source for ph in capped) == ["default/s0-0", "default/s1-0"], "the first in queue order"


def test_no_placeholder_when_a_node_would_not_help_or_the_pod_fits() -> None:
    limited = [node("n1", gpus=8), queue("lim", gpu=(0, 1, 1)),
               podgroup("l", "lim"), pod("l-0", "l", gpus=2)]  # its queue's limit: 1 GPU
    _, phs, plan = _decide(limited, _config())
    assert plan.pending and phs == [], [r.code for rs in plan.pending.values() for r in rs]
    fits = [node("n1", gpus=8), queue("q"), podgroup("a", "q"), pod("a-0", "a", gpus=0.5)]
    _, phs, plan = _decide(fits, _config())
    assert not plan.pending and phs == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=40))
def test_packing_fills_no_device_over_one_and_needs_at_least_the_summed_fractions(millis: list[int]) -> None:
    objs = [node("n1", gpus=0), queue("q")]
    for i, m in enumerate(millis):
        objs += [podgroup(f"p{i}", "q"), pod(f"p{i}-0", f"p{i}", gpus=m / 1000 if m < 1000 else 0.999)]
    state = build_state(snapshot(objs))
    items = [(int(state.pod_gpu_frac[p]), p, int(state.pod_pg[p])) for p in range(state.n_pods)]
    bins = sa._pack(state, "k", items)
    assert sorted(p for b in bins for p in b.pods) == sorted(state.pods[p].key for p in range(state.n_pods))
    frac = {state.pods[p].key: int(state.pod_gpu_frac[p]) for p in range(state.n_pods)}
    assert all(sum(frac[p] for p in b.pods) <= 1000 for b in bins)
    assert len(bins) >= math.ceil(sum(frac.values()) / 1000)
    assert len(bins) <= max(1, 2 * math.ceil(sum(frac.values()) / 1000))  # first-fit decreasing bound


def test_placeholder_pod_copies_the_constraints_and_stays_out_of_kai_opts_way() -> None:
    cfg = _config().autoscaler
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    source = {"metadata": {"name": "f0-0", "namespace": "team"},
              "spec": {"nodeSelector": SELECTOR, "tolerations": TOLERATIONS, "affinity": affinity}}
    ph = sa.Placeholder("kai-opt-ph-x-0", 2, 2000, 2**30, "team/f0-0", ("team/f0-0",), (0,))
    obj = sa.placeholder_pod(ph, source, cfg)
    spec = obj["spec"]
    assert obj["metadata"]["namespace"] == cfg.namespace and obj["metadata"]["labels"][sa.PLACEHOLDER_LABEL]
    assert spec["schedulerName"] == "default-scheduler" and spec["priorityClassName"] == cfg.priority_class_name
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2", "cpu": "2000m",
                                                              "memory": str(2**30)}
    assert spec["nodeSelector"] == SELECTOR and spec["tolerations"] == TOLERATIONS
    assert spec["affinity"]["nodeAffinity"] == affinity["nodeAffinity"]
    term = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["namespaces"] == ["team"], "pinned to the pod's namespace"
    assert "namespaces" not in affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    with pytest.raises(ConfigError, match="scheduler_names"):
        parse_config({"autoscaler": {"scheduler_name": "kai-opt"}})
    assert not Config().autoscaler.enabled, "off by default"


# -- the reconciler ----------------------------------------------------------------------------------------------
def _placeholder_obj(name: str, *, spec_digest: str = "", node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "placeholder"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "kai-opt-scaling", "uid": name, "labels": {sa.PLACEHOLDER_LABEL: "true"},
        "annotations": {sa.SPEC_ANNOTATION: spec_digest}}, "spec": spec, "status": {}}


def test_the_reconciler_creates_missing_deletes_unneeded_and_bound_ones_and_cools_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, Any]] = []
    monkeypatch.setattr(sa, "request", lambda api, method, path, **kw: calls.append((method, path, kw["body"])))
    cfg = _config(cool_down_s=30).autoscaler
    cache = ClusterCache(api=None, kinds=SCHEDULING_KINDS)  # type: ignore[arg-type]
    res = cache._stores[("v1", "Pod")].res
    now = [1000.0]
    adj = sa.ScaleAdjuster(None, cache, TokenBucket(1000, 100), cfg, clock=lambda: now[0])
    keep = sa.Placeholder("kai-opt-ph-keep", 1, 1000, 1, "default/a", ("default/a",), (0,))
    new = sa.Placeholder("kai-opt-ph-new", 8, 1000, 1, "default/b", ("default/b",), (1,))
    sources = {n: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "default", "uid": n},
                   "spec": {"schedulerName": "kai-opt", "nodeSelector": SELECTOR, "containers": [{"name": "c"}]},
                   "status": {"phase": "Pending"}} for n in ("a", "b")}
    for obj in sources.values():
        cache._apply(res, "ADDED", obj)
    digest = sa.placeholder_pod(keep, sources["a"], cfg)["metadata"]["annotations"][sa.SPEC_ANNOTATION]
    for obj in (_placeholder_obj("kai-opt-ph-keep", spec_digest=digest), _placeholder_obj("kai-opt-ph-old"),
                _placeholder_obj("kai-opt-ph-new", spec_digest="stale", node_name="n9")):
        cache._apply(res, "ADDED", obj)
    created, deleted = adj.sync([keep, new])
    assert sorted(deleted) == ["kai-opt-ph-new", "kai-opt-ph-old"], "not needed, and bound to a node"
    assert created == [], "a deletion starts the cool-down"
    now[0] += 31
    cache._apply(res, "DELETED", _placeholder_obj("kai-opt-ph-old"))
    cache._apply(res, "DELETED", _placeholder_obj("kai-opt-ph-new"))
    calls.clear()
    created, deleted = adj.sync([keep, new])
    assert created == ["kai-opt-ph-new"] and deleted == []
    post = next(c for c in calls if c[0] == "POST")
    assert post[1] == "/api/v1/namespaces/kai-opt-scaling/pods"
    assert post[2]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert post[2]["spec"]["nodeSelector"] == SELECTOR, "the constraints of the source pod"
    status = next(c for c in calls if c[0] == "PATCH")
    assert status[1].endswith("/pods/kai-opt-ph-new/status")
    assert status[2]["status"]["conditions"][0]["reason"] == "Unschedulable"
    # the source pod of a desired placeholder is gone: nothing is made for it (and the kept one stays)
    cache._apply(res, "DELETED", sources["b"])
    now[0] += 31
    cache._apply(res, "DELETED", _placeholder_obj("kai-opt-ph-new"))
    calls.clear()
    assert adj.sync([keep, new]) == ([], []) and calls == []
    fenced = sa.ScaleAdjuster(None, cache, TokenBucket(1000, 100), cfg, fence=lambda: False)
    calls.clear()
    assert fenced.sync([]) == ([], []) and calls == [], "only the leader writes"
    adj.stop()
    fenced.stop()


def test_the_runner_adds_the_scale_up_reason_to_the_plan() -> None:
    cfg = _config()
    state = build_state(snapshot(_full_cluster() + _fraction_pods(2, 0.5)))
    plan, fs = run_cycle(state, cfg)
    cache = ClusterCache(api=None, kinds=SCHEDULING_KINDS)  # type: ignore[arg-type]
    adj = sa.ScaleAdjuster(None, cache, TokenBucket(1000, 100), cfg.autoscaler, fence=lambda: False)
    desired = adj.cycle(state, plan, fs, cfg)
    assert len(desired) == 1 and desired[0].gpus == 1
    assert all(rs[-1].code == "WaitingForScaleUp" for rs in plan.pending.values())
    assert adj.pool.wait_idle(10)
    adj.stop()
    assert Engine.greedy == cfg.engine


def test_the_manifests_grant_placeholder_pods_in_their_namespace_only_when_enabled() -> None:
    from kai_opt.k8s.manifests import render_manifests

    def scaling(values: dict[str, Any]) -> list[dict[str, Any]]:
        return [o for o in render_manifests(values) if "scaling" in o["metadata"]["name"]]

    assert scaling({}) == [], "off by default: nothing"
    objs = {o["kind"]: o for o in scaling({"config": {"autoscaler": {"enabled": True}}})}
    assert set(objs) == {"Namespace", "Role", "RoleBinding", "PriorityClass"}
    assert objs["Role"]["metadata"]["namespace"] == "kai-opt-scaling"
    assert objs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
                                     {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]
    assert objs["PriorityClass"]["value"] == -100 and objs["PriorityClass"]["preemptionPolicy"] == "Never"
    bare = {o["kind"] for o in scaling({"config": {"autoscaler": {
        "enabled": True, "create_namespace": False, "create_priority_class": False}}})}
    assert bare == {"Role", "RoleBinding"}


def test_the_readme_autoscaler_example_is_a_valid_config() -> None:
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("## Autoscaler support"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example
    cfg = parse_config(yaml.safe_load(example.group(1)), source="README.md")
    assert cfg.autoscaler.enabled and cfg.autoscaler.namespace == "kai-opt-scaling"
