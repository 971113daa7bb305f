"""`kai-opt run` with autoscaler support on a real apiserver (kai_opt/k8s/scaleadjust.py): pending GPU-sharing pods
with no room make whole-GPU placeholder pods with their constraints; a node the test adds (playing the autoscaler)
gets the real pods and the placeholders go; a pending gang makes the placeholders of all its pods at once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client import ApiClient

from kai_opt.config import Config, parse_config
from kai_opt.k8s.client import object_path, request

from .schedharness import (
    FAST_RUNTIME,
    NS,
    bound,
    create,
    fresh,
    get_podgroup,
    namespace,
    node,
    pod,
    podgroup,
    queue,
    scheduler,
    wait_for,
)
from .testcluster import LocalCluster, ensure_namespace

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

SCALING_NS = "kai-opt-scaling"
POOL = {"pool": "gpu"}
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _config() -> Config:
    return parse_config({"engine": "greedy", "schedule_period_s": 0.2, "runtime": FAST_RUNTIME,
                         "autoscaler": {"enabled": True, "cool_down_s": 0}})


def _priority_class() -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "kai-opt-scaling-placeholder"}, "value": -100, "preemptionPolicy": "Never"}


def placeholders(api: ApiClient) -> list[dict[str, Any]]:
    return [p for p in request(api, "GET", object_path("v1", "pods", SCALING_NS))["items"]
            if not p["metadata"].get("deletionTimestamp")]


def _gpus(p: dict[str, Any]) -> str:
    return p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]


def _unschedulable(p: dict[str, Any]) -> bool:
    """PodScheduled=False/Unschedulable, as autoscalers look for (written right after the create)."""
    return any((c["type"], c["status"], c.get("reason")) == ("PodScheduled", "False", "Unschedulable")
               for c in (p.get("status") or {}).get("conditions") or [])


def _covered(phs: list[dict[str, Any]]) -> int:
    return sum(len(p["metadata"]["annotations"]["kai-opt.io/placeholder-for"].split(",")) for p in phs)


def _setup(api: ApiClient, extra: list[dict[str, Any]]) -> None:
    ensure_namespace(api, SCALING_NS)
    busy = pod("busy", gpus=1, queue_name="team")  # takes the only GPU there is
    busy["spec"]["tolerations"] = [TOLERATION]
    create(api, [namespace(), _priority_class(), node("n1", 1, POOL), queue("team"), busy])
    wait_for("busy bound", lambda: bound(api).get("busy") == "n1")
    create(api, extra)


def test_fraction_pods_make_whole_gpu_placeholders_until_a_new_node_takes_them(fresh: LocalCluster) -> None:
    shared = []
    for name in ("f1", "f2", "f3"):
        p = pod(name, fraction="0.5", queue_name="team")
        p["spec"]["nodeSelector"] = dict(POOL)
        p["spec"]["tolerations"] = [TOLERATION]
        shared.append(p)
    with fresh.api_client() as api, fresh.kwok(), scheduler(fresh, _config()):
        _setup(api, [])
        create(api, shared)
        def settled() -> list[dict[str, Any]] | None:
            """Two placeholders, marked unschedulable, covering all three pods: while the pods arrive over several
            cycles the set is made again as it grows (one placeholder for f1, then for f1 and f2, ...)."""
            x = placeholders(api)
            return x if len(x) == 2 and all(_unschedulable(p) for p in x) and _covered(x) == len(shared) else None

        phs = wait_for("two placeholders covering the three pods, marked unschedulable", settled, timeout=40)
        time.sleep(1.0)  # a few more cycles: still exactly these two
        assert sorted(p["metadata"]["name"] for p in placeholders(api)) == sorted(p["metadata"]["name"] for p in phs)
        for ph in phs:
            spec = ph["spec"]
            assert _gpus(ph) == "1" and spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
            assert spec["nodeSelector"] == POOL and spec["tolerations"][0]["key"] == "nvidia.com/gpu"
            assert spec["schedulerName"] == "default-scheduler" and not spec.get("nodeName")
            assert spec["priorityClassName"] == "kai-opt-scaling-placeholder" and spec["priority"] == -100
        covered = sorted(x for ph in phs for x in ph["metadata"]["annotations"]["kai-opt.io/placeholder-for"]
                         .split(","))
        assert covered == [f"{NS}/f1", f"{NS}/f2", f"{NS}/f3"]
        assert bound(api) == {"busy": "n1"}

        def waiting(name: str) -> bool:
            # the pod's own PodGroup, by the grouper's annotation (a name match could hit another group's uid)
            pod_ = request(api, "GET", object_path("v1", "pods", NS, name))
            group = (pod_["metadata"].get("annotations") or {}).get("pod-group-name")
            pgs = request(api, "GET", object_path("scheduling.run.ai/v2alpha2", "podgroups", NS))["items"]
            pg = next((g for g in pgs if g["metadata"]["name"] == group), None)
            conds = ((pg or {}).get("status") or {}).get("schedulingConditions") or []
            return any(r["reason"] == "WaitingForScaleUp" for c in conds for r in c.get("reasons") or [])

        wait_for("the pending reason says it waits for a scale-up", lambda: all(waiting(n) for n in ("f1", "f2")),
                 timeout=40)
        # the autoscaler adds a node with room for all three
        new = node("n2", 2, POOL)
        new["spec"] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
        create(api, [new])
        wait_for("the real pods on the new node", lambda: all(bound(api).get(n) == "n2" for n in ("f1", "f2", "f3")),
                 timeout=60)
        wait_for("the placeholders gone", lambda: not placeholders(api), timeout=40)


def test_a_pending_gang_makes_all_its_placeholders_at_once(fresh: LocalCluster) -> None:
    gang = [podgroup("big", 4, "team")] + [pod(f"big-{i}", gpus=8, group="big", cpu="16", memory="64Gi")
                                           for i in range(4)]
    with fresh.api_client() as api, fresh.kwok(), scheduler(fresh, _config()):
        _setup(api, gang)
        wait_for("a placeholder", lambda: placeholders(api), timeout=20)
        t0 = time.monotonic()
        seen: list[tuple[float, int]] = []
        while time.monotonic() < t0 + 3.0:
            seen.append((time.monotonic() - t0, len(placeholders(api))))
            time.sleep(0.05)
        full = next((t for t, n in seen if n == 4), None)
        # the whole gang's demand in one reconcile (four POSTs back to back), not one placeholder per cycle; and
        # then it stays the same four
        assert full is not None and full < 1.0 and max(n for _, n in seen) == 4, seen
        assert all(n == 4 for t, n in seen if t >= full), seen
        phs = placeholders(api)
        assert [_gpus(p) for p in phs] == ["8"] * 4
        assert sorted(p["metadata"]["annotations"]["kai-opt.io/placeholder-for"] for p in phs) == \
            [f"{NS}/big-{i}" for i in range(4)]

        def says_scale_up() -> bool:
            conds = (get_podgroup(api, "big").get("status") or {}).get("schedulingConditions") or []
            return bool(conds) and "placeholder pod(s)" in conds[-1]["message"]

        wait_for("the PodGroup's condition says it waits for a scale-up", says_scale_up)
        assert not bound(api).get("big-0")


def test_the_manifests_rbac_is_enough_for_placeholders_and_pending_groups_carry_their_position(
        fresh: LocalCluster) -> None:
    """kai-opt as its own ServiceAccount (the manifests with autoscaler.enabled: the placeholder namespace, its Role
    and PriorityClass) creates, marks and deletes placeholders, and annotates pending PodGroups with their queue
    position."""
    import threading

    from kai_opt.k8s.client import apply_objects
    from kai_opt.k8s.manifests import NAME, build_manifests
    from kai_opt.k8s.runner import Runner

    from .testcluster import delete_cluster_rbac

    sched_ns = "kai-opt-autoscaler-e2e"
    cfg = _config()
    jobs = []
    for name in ("j1", "j2"):
        p = pod(name, fraction="0.5", queue_name="team")
        p["spec"]["nodeSelector"] = dict(POOL)
        jobs.append(p)
    try:
        with fresh.api_client() as api, fresh.kwok():
            objs = [o for o in build_manifests(sched_ns, "kai-opt:test", config=cfg)
                    if o["kind"] != "MutatingWebhookConfiguration"]
            assert {(o["kind"], o["metadata"]["name"]) for o in objs} >= {
                ("Namespace", SCALING_NS), ("PriorityClass", "kai-opt-scaling-placeholder"),
                ("Role", "kai-opt-scaling-placeholders")}
            apply_objects(api, objs)
            create(api, [namespace(), node("n1", 1, POOL), queue("team"), pod("busy", gpus=1, queue_name="team")])
            with fresh.service_account_client(sched_ns, NAME) as sa:
                runner = Runner(sa, cfg, identity="rbac", leader_elect=False)
                errors: list[BaseException] = []

                def main() -> None:
                    try:
                        runner.run()
                    except BaseException as exc:  # re-raised below
                        errors.append(exc)

                t = threading.Thread(target=main, daemon=True)
                t.start()
                try:
                    wait_for("busy bound", lambda: bound(api).get("busy") == "n1")
                    create(api, jobs)
                    (ph,) = wait_for("one placeholder", lambda: (lambda x: x if len(x) == 1 else None)(
                        placeholders(api)))
                    assert _gpus(ph) == "1" and ph["spec"]["priority"] == -100
                    wait_for("marked unschedulable", lambda: any(
                        c["type"] == "PodScheduled" and c["reason"] == "Unschedulable"
                        for c in (placeholders(api)[0]["status"].get("conditions") or [])))

                    def positions() -> dict[str, str] | None:
                        pgs = request(api, "GET", object_path("scheduling.run.ai/v2alpha2", "podgroups", NS))["items"]
                        out = {g["metadata"]["name"]: (g["metadata"].get("annotations") or {}).get(
                            "kai-opt.io/queue-position") for g in pgs if "j" in g["metadata"]["name"]}
                        return out if len(out) == 2 and all(out.values()) else None

                    got = wait_for("queue positions on the pending PodGroups", positions)
                    assert sorted(got.values()) == ["1", "2"], got
                    create(api, [node("n2", 1, POOL)])
                    wait_for("both on the new node", lambda: all(bound(api).get(n) == "n2" for n in ("j1", "j2")),
                             timeout=30)
                    wait_for("the placeholder gone", lambda: not placeholders(api), timeout=20)
                    wait_for("the positions gone", lambda: not any(
                        (g["metadata"].get("annotations") or {}).get("kai-opt.io/queue-position")
                        for g in request(api, "GET", object_path("scheduling.run.ai/v2alpha2", "podgroups",
                                                                 NS))["items"]))
                finally:
                    runner.stop()
                    t.join(15)
                assert not errors, errors
                assert runner.scale is not None and runner.scale.failures == 0
    finally:
        with fresh.api_client() as api:
            delete_cluster_rbac(api, NAME)
