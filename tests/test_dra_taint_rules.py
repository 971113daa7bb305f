"""DeviceTaintRule (resource.k8s.io/v1beta2): a rule's taint lands on the devices its selector picks (driver, pool,
device; unset fields match any, as kube-scheduler's slice tracker), so both engines, the checker and the bind-time
choice keep them from requests that do not tolerate it; from the watch cache too."""

from __future__ import annotations

from typing import Any

import pytest
from builders import node, podgroup, queue, snapshot
from test_dra import DRIVER, claim_pod, device_class
from test_dra_taints import UNHEALTHY, cycle, placed, tainted_slice, tol_template

from kai_opt.config import Engine
from kai_opt.errors import InputError
from kai_opt.k8s import cache as cache_mod
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.manifests import build_manifests
from kai_opt.snapshot import RawObject, Snapshot

BETA = "resource.k8s.io/v1beta2"


def rule(name: str, taint: dict[str, Any] | None = None, **selector: str) -> RawObject:
    spec: dict[str, Any] = {"taint": taint or UNHEALTHY}
    if selector:
        spec["deviceSelector"] = selector
    return RawObject("DeviceTaintRule", {"apiVersion": BETA, "kind": "DeviceTaintRule", "metadata": {"name": name},
                                         "spec": spec})


def taints(s: Snapshot) -> dict[str, list[str]]:
    return {f"{sl.pool}/{d.name}": [str(t) for t in d.taints] for sl in s.resource_slices for d in sl.devices}


def test_a_rules_taint_goes_to_the_devices_its_selector_picks() -> None:
    slices = [tainted_slice("n0", 2, {1: [{"key": "own", "effect": "None"}]}), tainted_slice("n1", 2, {})]
    s = snapshot([*slices, rule("one", device="gpu-0", pool="n0", driver=DRIVER)])
    assert taints(s) == {"n0/gpu-0": ["example.com/unhealthy=ecc:NoSchedule"], "n0/gpu-1": ["own:None"],
                         "n1/gpu-0": [], "n1/gpu-1": []}
    s = snapshot([*slices, rule("pool", pool="n1")])
    assert [k for k, v in taints(s).items() if "example.com/unhealthy=ecc:NoSchedule" in v] == ["n1/gpu-0",
                                                                                                  "n1/gpu-1"]
    s = snapshot([*slices, rule("every-gpu-0", device="gpu-0")])
    assert [k for k, v in taints(s).items() if any("unhealthy" in t for t in v)] == ["n0/gpu-0", "n1/gpu-0"]
    s = snapshot([*slices, rule("everything", {"key": "drain", "effect": "NoExecute"})])  # no selector: any
    assert all("drain:NoExecute" in v for v in taints(s).values())
    s = snapshot([*slices, rule("other-driver", driver="other.example.com")])
    assert taints(s)["n0/gpu-0"] == [] and len(s.device_taint_rules) == 1
    s = snapshot([*slices, rule("a", device="gpu-1", pool="n0"), rule("b", {"key": "k2", "effect": "NoSchedule"},
                                                                     device="gpu-1", pool="n0")])
    assert taints(s)["n0/gpu-1"] == ["own:None", "example.com/unhealthy=ecc:NoSchedule", "k2:NoSchedule"]


@pytest.mark.parametrize("spec, field", [
    ({"taint": {"key": "k", "effect": "Sometimes"}}, "spec.taint.effect"),
    ({"taint": {"effect": "NoSchedule"}}, "spec.taint.key"),
    ({"taint": {"key": "k", "effect": "NoSchedule"}, "deviceSelector": {"pool": 3}}, "spec.deviceSelector.pool"),
])
def test_a_bad_rule_is_a_one_line_error_naming_the_field(spec: dict[str, Any], field: str) -> None:
    obj = {"apiVersion": BETA, "kind": "DeviceTaintRule", "metadata": {"name": "bad"}, "spec": spec}
    with pytest.raises(InputError) as exc:
        snapshot([RawObject("DeviceTaintRule", obj)])
    assert field in str(exc.value) and "DeviceTaintRule bad" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_devices_a_rule_taints_are_given_only_to_claims_that_tolerate_it(engine: Engine) -> None:
    """n0's 4 devices tainted by rules (one per device for two of them, one for the pool), n1's 2 clean: a claim
    for 2 goes to n1; a second one waits unless it tolerates the taint (then it may use n0's tainted devices)."""
    base = [queue("q", gpu=(64, 1, -1)), device_class(), node("n0", gpus=0), tainted_slice("n0", 4, {}),
            node("n1", gpus=0), tainted_slice("n1", 2, {}),
            *[rule(f"r{i}", device=f"gpu-{i}", pool="n0") for i in range(2)], rule("pool", pool="n0")]
    pods = [podgroup("a", "q"), claim_pod("a", "a", template_name="t"),
            podgroup("b", "q"), claim_pod("b", "b", template_name="tol")]
    st, plan = cycle([*base, tol_template("t", 2), tol_template("tol", 2), *pods], engine)
    assert placed(st, plan) == {"a": "n1"}
    tolerating = tol_template("tol", 2, [{"key": "example.com/unhealthy", "operator": "Exists"}])
    st, plan = cycle([*base, tol_template("t", 2), tolerating, *pods], engine)
    assert placed(st, plan) == {"a": "n1", "b": "n0"}


def test_the_cache_reads_rules_and_kai_opt_may_list_them() -> None:
    c = ClusterCache(api=None)  # type: ignore[arg-type]
    objs = [tainted_slice("n0", 1, {}).obj, rule("r", pool="n0").obj]
    for o in objs:
        c._apply(c._stores[(o["apiVersion"], o["kind"])].res, "ADDED", {**o, "metadata": {**o["metadata"],
                                                                                           "uid": o["kind"]}})
    s = c.snapshot(scheduler_names=("kai-opt",))
    assert taints(s) == {"n0/gpu-0": ["example.com/unhealthy=ecc:NoSchedule"]}
    assert cache_mod.Resource(BETA, "DeviceTaintRule", "devicetaintrules", False) in cache_mod.SCHEDULING_KINDS
    role = next(o for o in build_manifests("kai-opt", "kai-opt:test") if o["kind"] == "ClusterRole")
    assert any("devicetaintrules" in r["resources"] and "resource.k8s.io" in r["apiGroups"]
               and {"list", "watch"} <= set(r["verbs"]) for r in role["rules"])
