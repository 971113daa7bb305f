"""Scheduling shards (kai_opt/k8s/shard.py): the snapshot filter (nodes, queues, PodGroups by the partition label;
pods by their node or PodGroup), the pod grouper's restriction, KAI's SchedulingShard mapped onto the config, the
per-shard Lease and ledger names, and `solve --shard`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import node, pod, podgroup, queue, run_cli, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters
from test_kai_binder import BR_PATH, NODE, FakeApi, _binder, _cache, _pod, _stored, fake

from kai_opt.config import Config, Strategy, parse_config
from kai_opt.engine import run_cycle
from kai_opt.errors import ConfigError
from kai_opt.k8s.leader import lease_name
from kai_opt.k8s.shard import (
    ShardFilter,
    apply_scheduling_shard,
    filter_snapshot,
    grouping_in_shard,
    offline_shard,
    shard_config,
    shard_filter,
)
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state

POOL = "kai.scheduler/node-pool"
__all__ = ["fake"]  # the fixture (tests/test_kai_binder.py)


def labelled(raw: RawObject, value: str | None) -> RawObject:
    """`raw` with the partition label set to `value` (None: without the label)."""
    meta = dict(raw.obj.get("metadata") or {})
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != POOL}
    if value is not None:
        labels[POOL] = value
    meta["labels"] = labels
    return RawObject(raw.kind, {**raw.obj, "metadata": meta})


def shard(value: str, name: str = "s") -> ShardFilter:
    return ShardFilter(name, POOL, value)


def two_pools() -> list[RawObject]:
    """Pool a: node a1, queue qa, group ga (running pod on a1, pending pod); pool b: node b1, queue qb, group gb
    (pending); unlabelled: node d1, queue qd, group gd (pending); a pod of pool b bound (by someone) to a1."""
    return [
        labelled(node("a1", gpus=8), "a"), labelled(node("b1", gpus=8), "b"), node("d1", gpus=8),
        labelled(queue("qa", gpu=(4, 1, -1)), "a"), labelled(queue("qb", gpu=(4, 1, -1)), "b"),
        queue("qd", gpu=(4, 1, -1)),
        labelled(podgroup("ga", "qa", min_member=1), "a"), labelled(podgroup("gb", "qb"), "b"),
        podgroup("gd", "qd"),
        pod("ga-0", group="ga", gpus=1, node_name="a1"), pod("ga-1", group="ga", gpus=1),
        pod("gb-0", group="gb", gpus=1), pod("gd-0", group="gd", gpus=1),
        pod("stray", group="gb", gpus=1, node_name="a1"),
        pod("loose-b", gpus=1, labels={POOL: "b"}), pod("loose-d", gpus=1),
        pod("other", gpus=0, node_name="b1", scheduler="default-scheduler"),
    ]


def names(items: list[Any]) -> set[str]:
    return {getattr(o, "key", None) or o.name for o in items}


def test_shard_of_a_value_keeps_its_labelled_objects_and_pods_by_node_or_group() -> None:
    snap = filter_snapshot(snapshot(two_pools()), shard("a"))
    assert {n.name for n in snap.nodes} == {"a1"}
    assert {q.name for q in snap.queues} == {"qa"}
    assert {g.name for g in snap.podgroups} == {"ga"}
    # a bound pod goes with its node (it uses a1's capacity, whatever its group); pending pods with their group
    assert {p.name for p in snap.pods} == {"ga-0", "ga-1", "stray"}


def test_shard_of_another_value_and_the_default_shard() -> None:
    b = filter_snapshot(snapshot(two_pools()), shard("b"))
    assert {n.name for n in b.nodes} == {"b1"}
    assert {p.name for p in b.pods} == {"gb-0", "loose-b", "other"}  # loose-b: no group, by its own label
    d = filter_snapshot(snapshot(two_pools()), shard(""))  # '' = the objects without the label (KAI's default)
    assert {n.name for n in d.nodes} == {"d1"}
    assert {q.name for q in d.queues} == {"qd"}
    assert {p.name for p in d.pods} == {"gd-0", "loose-d"}


def test_no_shard_is_the_snapshot_itself() -> None:
    snap = snapshot(two_pools())
    assert filter_snapshot(snap, None) is snap
    assert shard_filter(Config()) is None


def test_links_are_checked_again_inside_the_shard() -> None:
    """A PodGroup naming a queue of another shard is not scheduled here (QueueDoesNotExist), and a queue whose
    parent is in another shard is rejected, as KAI's listers see the shard's queues only."""
    objs = [labelled(node("a1"), "a"), labelled(queue("parent"), "b"),
            labelled(queue("child", parent="parent"), "a"), labelled(queue("qb"), "b"),
            labelled(podgroup("g", "qb"), "a"), pod("g-0", group="g", gpus=1)]
    full = snapshot(objs)
    assert not full.warnings and not full.rejected
    snap = filter_snapshot(full, shard("a"))
    assert [(w.name, w.reason) for w in snap.warnings] == [("default/g", "QueueDoesNotExist")]
    assert [(r.name, r.reason) for r in snap.rejected] == [("child", "ParentQueueDoesNotExist")]
    state = build_state(snap)
    plan, _ = run_cycle(state, parse_config({"engine": "greedy"}))
    assert not plan.binds


def test_a_nomination_onto_another_shards_node_is_dropped() -> None:
    objs = [labelled(node("a1"), "a"), labelled(node("b1"), "b"), labelled(queue("qa"), "a"),
            labelled(podgroup("ga", "qa"), "a"), pod("ga-0", group="ga", gpus=1, status={})]
    raw = objs[-1].obj
    raw["status"] = {"nominatedNodeName": "b1"}
    snap = filter_snapshot(snapshot(objs), shard("a"))
    assert [p.nominated_node for p in snap.pods] == [None]


def test_greedy_plan_of_a_shard_stays_inside_it() -> None:
    cfg = parse_config({"engine": "greedy"})
    for value, nodes in (("a", {"a1"}), ("b", {"b1"}), ("", {"d1"})):
        state = build_state(filter_snapshot(snapshot(two_pools()), shard(value)))
        plan, _ = run_cycle(state, cfg)
        assert plan.binds, value
        assert {state.node_names[b.node] for b in plan.binds} <= nodes


POOLS = st.sampled_from([None, "a", "b"])


@st.composite
def sharded_clusters(draw: st.DrawFn) -> list[RawObject]:
    """A generated cluster whose nodes, queues and PodGroups carry a random pool (a, b or none); every child
    queue is in its parent's pool (the shard keeps whole trees)."""
    objs = draw(clusters(max_nodes=5, max_jobs=6, topology=False))
    pools: dict[str, str | None] = {}
    out = []
    for o in objs:
        if o.kind in ("Node", "PodGroup"):
            o = labelled(o, draw(POOLS))
        elif o.kind == "Queue":
            parent = (o.obj.get("spec") or {}).get("parentQueue")
            value = pools[parent] if parent in pools else draw(POOLS)
            pools[o.obj["metadata"]["name"]] = value
            o = labelled(o, value)
        out.append(o)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sharded_clusters())
def test_shards_partition_the_cluster_and_their_plans_never_cross(objs: list[RawObject]) -> None:
    """Every node, queue and PodGroup is in exactly one shard; every pod bound to a node is in that node's shard
    only; a shard's plan binds only its own pending pods (their group in the shard) onto its own nodes."""
    full = snapshot(objs)
    cfg = parse_config({"engine": "greedy"})
    seen: dict[str, list[str]] = {"Node": [], "Queue": [], "PodGroup": [], "bound": []}
    for value in ("a", "b", ""):
        s = shard(value)
        snap = filter_snapshot(full, s)
        seen["Node"] += [n.name for n in snap.nodes]
        seen["Queue"] += [q.name for q in snap.queues]
        seen["PodGroup"] += [g.key for g in snap.podgroups]
        seen["bound"] += [p.key for p in snap.pods if p.node_name]
        assert all(s.matches(n.meta.labels) for n in snap.nodes)
        state = build_state(snap)
        plan, _ = run_cycle(state, cfg)
        groups = {g.key for g in snap.podgroups}
        for b in plan.binds + plan.pipelines:
            p = state.pods[b.pod]
            assert state.node_names[b.node] in {n.name for n in snap.nodes}
            assert f"{p.namespace}/{p.podgroup}" in groups
        for e in plan.evictions:
            assert state.pods[e.pod].node_name in {n.name for n in snap.nodes}
    assert sorted(seen["Node"]) == sorted(n.name for n in full.nodes)
    assert sorted(seen["Queue"]) == sorted(q.name for q in full.queues)
    assert sorted(seen["PodGroup"]) == sorted(g.key for g in full.podgroups)
    known = {n.name for n in full.nodes}
    assert sorted(seen["bound"]) == sorted(p.key for p in full.pods if p.node_name in known)


def test_grouper_writes_only_its_shards_podgroups() -> None:
    def pg(name: str, value: str | None) -> dict[str, Any]:
        labels = {POOL: value} if value is not None else {}
        return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "spec": {"minMember": 1}}

    desired = [pg("new-a", "a"), pg("new-b", "b"), pg("moved", "a"), pg("plain", None)]
    existing = [pg("moved", "b")]  # relabelled by hand to shard b: its own label decides
    assignments = {"ns/p1": "new-a", "ns/p2": "new-b", "ns/p3": "moved", "ns/p4": "plain"}
    kept, assigned = grouping_in_shard(shard("a"), desired, assignments, existing)
    assert [g["metadata"]["name"] for g in kept] == ["new-a"]
    assert assigned == {"ns/p1": "new-a"}
    kept, assigned = grouping_in_shard(shard("b"), desired, assignments, existing)
    assert [g["metadata"]["name"] for g in kept] == ["new-b", "moved"]
    kept, assigned = grouping_in_shard(None, desired, assignments, existing)
    assert kept == desired and assigned == assignments


KAI_SHARD = {  # KAI's docs/operator/scheduling-shards.md "Advanced Shard Configuration"
    "apiVersion": "kai.scheduler/v1", "kind": "SchedulingShard", "metadata": {"name": "gpu-shard"},
    "spec": {"partitionLabelValue": "gpu-nodes", "args": {"leader-elect": "true", "log-level": "3"},
             "placementStrategy": {"gpu": "spread", "cpu": "spread"},
             "queueDepthPerAction": {"preempt": 15, "reclaim": 8, "allocate": 25},
             "minRuntime": {"preemptMinRuntime": "10m", "reclaimMinRuntime": "5m"},
             "kValue": 2.5, "actions": {"consolidation": {"enabled": False}, "unknownaction": {"enabled": True}}},
}


def test_scheduling_shard_maps_onto_the_config() -> None:
    cfg = parse_config({"shard": {"name": "gpu-shard"}})
    merged, notes = apply_scheduling_shard(cfg, KAI_SHARD)
    assert merged.shard.partition_value == "gpu-nodes"
    assert merged.placement.gpu == Strategy.spread and merged.placement.cpu == Strategy.spread
    assert merged.preempt_min_runtime_s == 600 and merged.reclaim_min_runtime_s == 300
    assert merged.k_value == 2.5
    assert merged.actions.consolidate is False and merged.actions.reclaim is True  # type: ignore[attr-defined]
    text = "\n".join(notes)
    for ignored in ("args", "queueDepthPerAction", "actions.unknownaction"):
        assert f"{ignored}" in text and "ignored" in text


def test_scheduling_shard_usage_db_config_takes_a_cron_window() -> None:
    """KAI's usageDBConfig with windowType cron and its cronString, as the SchedulingShard spells them."""
    shard = {"metadata": {"name": "s"}, "spec": {"usageDBConfig": {
        "clientType": "prometheus", "connectionString": "http://prometheus-operated:9090",
        "usageParams": {"windowType": "cron", "cronString": "0 0 1 * *", "halfLifePeriod": "1h"}}}}
    merged, _ = apply_scheduling_shard(parse_config({"shard": {"name": "s"}}), shard)
    p = merged.usage_db.usage_params
    assert (p.window_type, p.cron_string, p.half_life_period) == ("cron", "0 0 1 * *", 3600.0)
    shard["spec"]["usageDBConfig"]["usageParams"]["cronString"] = "0 0 32 * *"
    with pytest.raises(ConfigError) as err:
        apply_scheduling_shard(parse_config({"shard": {"name": "s"}}), shard)
    text = str(err.value)
    assert "SchedulingShard s" in text and "usageParams.cronString" in text and "32 is out of range" in text, text


def test_the_config_file_wins_over_the_scheduling_shard_but_not_its_partition() -> None:
    cfg = parse_config({"shard": {"name": "gpu-shard", "partition_value": "other"},
                        "placement": {"gpu": "binpack"}, "k_value": 1.0})
    merged, notes = apply_scheduling_shard(cfg, KAI_SHARD)
    assert merged.shard.partition_value == "gpu-nodes"  # the SchedulingShard defines the partition
    assert merged.placement.gpu == Strategy.binpack  # set in the file: kept
    assert merged.placement.cpu == Strategy.spread  # not set: the shard's
    assert merged.k_value == 1.0
    assert any("replaces the config's 'other'" in n for n in notes)


def test_kais_default_shard_has_the_empty_partition() -> None:
    merged, _ = apply_scheduling_shard(parse_config({"shard": {"name": "default", "partition_value": "x"}}),
                                       {"metadata": {"name": "default"}})
    assert merged.shard.partition_value == ""
    assert shard_filter(merged) == ShardFilter("default", POOL, "")


@pytest.mark.parametrize("spec, field", [
    ({"placementStrategy": {"gpu": "diagonal"}}, "placement.gpu"),
    ({"minRuntime": {"preemptMinRuntime": "ten minutes"}}, "spec.minRuntime.preemptMinRuntime"),
    ({"kValue": -1}, "k_value"),
    ({"partitionLabelValue": "not a value"}, "shard.partition_value"),
])
def test_bad_scheduling_shard_values_are_config_errors(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        apply_scheduling_shard(parse_config({"shard": {"name": "s"}}), {"metadata": {"name": "s"}, "spec": spec})
    assert "SchedulingShard s" in str(err.value) and field in str(err.value) and "\n" not in str(err.value)


def test_per_shard_names() -> None:
    assert lease_name("kai-opt") == "kai-opt"
    assert lease_name("kai-opt", "pool-a") == "kai-opt-pool-a"
    cfg = shard_config(parse_config({"shard": {"name": "pool-a"}}))
    assert cfg.usage_db.ledger.config_map_name == "kai-opt-usage-pool-a"
    assert shard_config(cfg) == cfg  # once
    assert shard_config(Config()) == Config()


@pytest.mark.parametrize("shard_cfg, error", [
    ({"name": "Pool_A"}, "shard.name"),
    ({"name": "a", "partition_label": "a/b/c"}, "shard.partition_label"),
    ({"name": "a", "partition_value": "x y"}, "shard.partition_value"),
    ({"name": "a", "zone": "x"}, "unknown field"),
])
def test_shard_config_is_validated(shard_cfg: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config({"shard": shard_cfg})


def test_offline_shard_option() -> None:
    cfg = parse_config({"shard": {"name": "a", "partition_value": "a", "partition_label": "pool"}})
    assert offline_shard(cfg, None) == ShardFilter("a", "pool", "a")
    assert offline_shard(cfg, "b") == ShardFilter("a", "pool", "b")
    assert offline_shard(Config(), "") == ShardFilter("default", POOL, "")
    assert offline_shard(Config(), None) is None
    with pytest.raises(ConfigError):
        offline_shard(Config(), "no spaces")


def test_solve_shard_option(tmp_path: Path, capsys: Any) -> None:
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump_all([
        {"apiVersion": {"Node": "v1", "Pod": "v1", "Queue": "scheduling.run.ai/v2",
                        "PodGroup": "scheduling.run.ai/v2alpha2"}[o.kind], "kind": o.kind, **o.obj}
        for o in two_pools()]), encoding="utf-8")
    placed: dict[str, set[str]] = {}
    for value in ("a", "b", ""):
        code, out, err = run_cli(capsys, "solve", str(snap), "-e", "greedy", "-o", "json", "--shard", value)
        assert code == 0, err
        placed[value] = {b["node"] for b in json.loads(out)["binds"]}
    assert placed == {"a": {"a1"}, "b": {"b1"}, "": {"d1"}}
    code, _, err = run_cli(capsys, "solve", str(snap), "--shard", "bad value")
    assert code == 2 and "--shard" in err


def test_queue_shard_option(tmp_path: Path, capsys: Any) -> None:
    """`queue --shard` lists the pending PodGroups of that shard only, in the order its own cycle takes them up
    (as `solve --shard` plans only that shard)."""
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump_all([
        {"apiVersion": {"Node": "v1", "Pod": "v1", "Queue": "scheduling.run.ai/v2",
                        "PodGroup": "scheduling.run.ai/v2alpha2"}[o.kind], "kind": o.kind, **o.obj}
        for o in two_pools()]), encoding="utf-8")
    code, out, err = run_cli(capsys, "queue", str(snap), "-e", "greedy", "-o", "json")
    assert code == 0, err
    everything = {r["podgroup"] for r in json.loads(out)["podgroups"]}
    listed: dict[str, set[str]] = {}
    for value in ("a", "b", ""):
        code, out, err = run_cli(capsys, "queue", str(snap), "-e", "greedy", "-o", "json", "--shard", value)
        assert code == 0, err
        listed[value] = {r["podgroup"] for r in json.loads(out)["podgroups"]}
    # the queueless loose pods go with their own label (pod loose-b) or the unlabelled shard
    assert listed == {"a": {"default/ga"}, "b": {"default/gb", "default/pg-loose-b"},
                      "": {"default/gd", "default/pg-loose-d"}}
    assert set().union(*listed.values()) == everything
    code, out, err = run_cli(capsys, "queue", "qb", str(snap), "-o", "json", "--shard", "b")  # with a queue name
    assert code == 0 and {r["queue"] for r in json.loads(out)["podgroups"]} == {"qb"}, err
    code, _, err = run_cli(capsys, "queue", str(snap), "--shard", "bad value")
    assert code == 2 and "--shard" in err and err.count("\n") == 1


def test_readme_shard_examples_are_valid() -> None:
    import re

    from kai_opt.k8s.manifests import render_manifests

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("## Scheduling shards"):text.index("## Benchmarks")]
    config, values = (yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S))
    cfg = parse_config(config, source="README.md")
    assert shard_filter(cfg) == ShardFilter("pool-a", POOL, "pool-a")
    deps = [o["metadata"]["name"] for o in render_manifests(values, "ns") if o["kind"] == "Deployment"]
    assert deps == ["kai-opt-pool-a", "kai-opt-pool-b", "kai-opt-default"]


def test_offline_commands_take_the_shard(tmp_path: Path, capsys: Any) -> None:
    """fairshare, simulate and explain see the same shard as solve (`--shard`, or the config's section)."""
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump_all([
        {"apiVersion": {"Node": "v1", "Pod": "v1", "Queue": "scheduling.run.ai/v2",
                        "PodGroup": "scheduling.run.ai/v2alpha2"}[o.kind], "kind": o.kind, **o.obj}
        for o in two_pools()]), encoding="utf-8")
    cfg = tmp_path / "shard-b.yaml"
    cfg.write_text("engine: greedy\nshard: {name: pool-b, partition_value: b}\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "fairshare", str(snap), "-o", "json", "--shard", "a")
    assert code == 0, err
    assert [q["name"] for q in json.loads(out)["queues"]] == ["qa"]
    code, out, err = run_cli(capsys, "fairshare", str(snap), "-o", "json", "-c", str(cfg))
    assert code == 0, err
    assert [q["name"] for q in json.loads(out)["queues"]] == ["qb"]
    code, out, err = run_cli(capsys, "simulate", str(snap), "-o", "json", "--cycles", "2", "-c", str(cfg))
    assert code == 0, err
    assert json.loads(out)["end"]["nodes"] == 1
    code, out, err = run_cli(capsys, "explain", str(snap), "--podgroup", "default/ga", "-o", "json", "-e", "greedy",
                             "--shard", "a")
    assert code == 0, err
    assert json.loads(out)["queue"] == "qa"
    code, out, err = run_cli(capsys, "explain", str(snap), "--podgroup", "default/ga", "-e", "greedy", "--shard", "")
    assert code == 2 and "not found" in err  # another shard's PodGroup


def test_binder_kai_labels_its_bindrequests_and_follows_its_shards_only(fake: FakeApi) -> None:
    """binder: kai: a shard's BindRequests carry its partition label (KAI's createBindRequest), and a shard
    follows only those of its partition: another shard's pending BindRequest is neither held nor deleted."""
    from kai_opt.k8s.binder import BindRequest
    from kai_opt.k8s.kaibind import bind_request_body

    c = _cache(_pod("p", "u1", gpus=1), _pod("other", "u2", gpus=1))
    b = _binder(c, [])
    assert b.kai is not None
    b.kai.shard = shard("pool-a")
    assert b.submit([BindRequest("ns", "p", "u1", "n1", (1,))]) and b.wait_idle(5)
    [(_, body)] = fake.of("POST", BR_PATH)
    assert body["metadata"]["labels"][POOL] == "pool-a"
    theirs = bind_request_body(_pod("other", "u2", gpus=1), "n1", (2,), groups=[], node_obj=NODE, backoff_limit=1,
                               labels={POOL: "pool-b"})
    _stored(c, theirs)
    gone = bind_request_body(_pod("gone", "u-old"), "n1", (), groups=[], node_obj=NODE, backoff_limit=1,
                             labels={POOL: "pool-b"})
    _stored(c, gone)  # another shard's to clean up, not this one's
    b.kai.sync()
    assert not fake.of("DELETE") and not b.kai.tracking("u2") and "u2" not in c.assumed()[0]
    b.kai.shard = shard("")  # the default shard: its BindRequests carry no partition label
    assert shard("").labels() == {}
    b.stop()


def test_the_idle_check_skips_pods_of_another_shards_podgroups() -> None:
    from test_kai_binder import _put

    pg = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
          "metadata": {"name": "gb", "namespace": "ns", "labels": {POOL: "pool-b"}}, "spec": {"minMember": 1}}
    waiting = _pod("w", "u1", annotations={"pod-group-name": "gb"})
    c = _cache(waiting)
    assert c.has_unscheduled(("kai-opt",), shard("pool-a"))  # its PodGroup is not known yet: it may be ours
    _put(c, pg)
    assert not c.has_unscheduled(("kai-opt",), shard("pool-a"))
    assert c.has_unscheduled(("kai-opt",), shard("pool-b")) and c.has_unscheduled(("kai-opt",))
    _put(c, _pod("new", "u2"))  # not grouped yet: the grouper must run
    assert c.has_unscheduled(("kai-opt",), shard("pool-a"))
