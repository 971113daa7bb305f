"""Queue positions (kai_opt/heuristics/positions.py): the allocate action's own order; `kai-opt queue`; `explain`'s
position line; the PodGroup annotations the status writer keeps (with the fake request the k8s tests use)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from builders import node, pod, podgroup, queue, run_cli, snapshot
from hypothesis import HealthCheck, given, settings
from strategies import clusters

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.heuristics.gang import GangPlacer
from kai_opt.heuristics.positions import queue_positions
from kai_opt.k8s import status as status_mod
from kai_opt.k8s.cache import SCHEDULING_KINDS, ClusterCache
from kai_opt.k8s.workqueue import TokenBucket, WorkPool
from kai_opt.snapshot import API_VERSIONS, RawObject
from kai_opt.state import build_state

GREEDY = Config(engine=Engine.greedy)


def _cluster(free_gpus: int = 0) -> list[RawObject]:
    """Two queues of equal quota, each running 8 non-preemptible GPUs; four pending 4-GPU jobs, no room."""
    objs = [node("n1", gpus=8), node("n2", gpus=8 + free_gpus),
            queue("a", gpu=(8, 1, -1)), queue("b", gpu=(8, 1, -1)),
            podgroup("run-b", "b", priority_class="build"), pod("run-b-0", "run-b", gpus=8, node_name="n1"),
            podgroup("run-a", "a", priority_class="build"), pod("run-a-0", "run-a", gpus=8, node_name="n2")]
    for name, q, prio, minute in (("a-low", "a", "train", 0), ("a-high", "a", "build-preemptible", 5),
                                  ("b-1", "b", "train", 1), ("a-2", "a", "train", 2)):
        objs += [podgroup(name, q, priority_class=prio, created_min=minute), pod(f"{name}-0", name, gpus=4)]
    return objs


def test_positions_follow_the_queue_order_rules() -> None:
    state = build_state(snapshot(_cluster()))
    pos = queue_positions(state, compute_fair_share(state), GREEDY)
    order = sorted(pos, key=lambda g: pos[g].overall)
    names = [state.pg_keys[g].split("/")[1] for g in order]
    # a (its next job a-high: priority first within the queue) and b alternate by DRF share with the next job;
    # a's jobs in priority, then age order
    assert [n for n in names if n.startswith("a")] == ["a-high", "a-low", "a-2"]
    assert [pos[g].overall for g in order] == [1, 2, 3, 4]
    in_a = [pos[g].in_queue for g in order if state.pg_keys[g].split("/")[1].startswith("a")]
    assert in_a == [1, 2, 3] and [pos[g].in_queue for g in order if "b-1" in state.pg_keys[g]] == [1]
    assert all(pos[g].request[0] == 4 for g in order)


def _unschedulable(objs: list[RawObject]) -> list[RawObject]:
    out = []
    for o in objs:
        if o.kind == "Node":
            body = copy.deepcopy(o.obj)
            body.setdefault("spec", {})["unschedulable"] = True
            o = RawObject("Node", body)
        out.append(o)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_positions_are_the_order_the_allocate_action_takes_groups_up(objs: list[RawObject],
                                                                     ) -> None:
    """Rule: while the allocate action places nothing, it tries the groups in exactly position order."""
    state = build_state(snapshot(_unschedulable(objs)))
    fs = compute_fair_share(state)
    tried: list[int] = []
    original = GangPlacer.place

    def spy(self: GangPlacer, g: int, tasks: list[int], **kw: Any) -> Any:
        tried.append(g)
        return original(self, g, tasks, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(GangPlacer, "place", spy)
    try:
        greedy_plan(state, fs, GREEDY, actions=("allocate",))
    finally:
        mp.undo()
    pos = queue_positions(state, fs, GREEDY)
    assert tried == sorted(pos, key=lambda g: pos[g].overall)
    per_queue: dict[int, list[int]] = {}
    for g in tried:
        per_queue.setdefault(int(state.pg_queue[g]), []).append(pos[g].in_queue)
    assert all(v == list(range(1, len(v) + 1)) for v in per_queue.values())


def _write(tmp_path: Any, objs: list[RawObject]) -> Any:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([{"apiVersion": API_VERSIONS[o.kind], "kind": o.kind, **o.obj}
                                        for o in objs], sort_keys=False))
    return path


def test_queue_command_lists_positions_reasons_and_filters_by_queue(tmp_path: Any, capsys: Any) -> None:
    path = _write(tmp_path, _cluster())
    code, out, err = run_cli(capsys, "queue", str(path), "-e", "greedy", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)["podgroups"]
    assert [r["position"] for r in rows] == [1, 2, 3, 4]
    assert all(r["cycle"] == "pending" and r["reasons"] for r in rows)
    assert all(r["requested"]["gpu"] == 4 for r in rows)
    deficit = {r["queue"]: r["fair_share_deficit"]["gpu"] for r in rows}
    state = build_state(snapshot(_cluster()))
    fs = compute_fair_share(state)
    for q, d in deficit.items():
        qi = state.q_index[q]
        assert d == pytest.approx(fs.fair_share[qi, 0] - fs.allocated[qi, 0])
    code, out, _ = run_cli(capsys, "queue", "b", str(path), "-e", "greedy", "-o", "json")
    only_b = json.loads(out)["podgroups"]
    assert code == 0 and [r["podgroup"] for r in only_b] == ["default/b-1"]
    assert only_b[0]["position"] == next(r["position"] for r in rows if r["podgroup"] == "default/b-1")
    code, out, _ = run_cli(capsys, "queue", str(path), "-e", "greedy")
    assert code == 0 and "a-high" in out and "Pending PodGroups" in out
    code, _, err = run_cli(capsys, "queue", "nope", str(path), "-e", "greedy")
    assert code == 2 and "queue 'nope' not found" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "queue", "a", "b", str(path))
    assert code == 2 and "[QUEUE] [SNAPSHOT]" in err


def test_explain_prints_the_position_of_a_pending_pod() -> None:
    from kai_opt.explain import explain

    state = build_state(snapshot(_cluster()))
    out = explain(state, GREEDY, pod="default/b-1-0", solve=False)
    assert out["position"]["in_queue"] == 1 and out["position"]["overall"] >= 1
    assert any(line.startswith("queue position ") for line in out["summary"])


# -- the PodGroup annotations ------------------------------------------------------------------------------------
def _writer(monkeypatch: pytest.MonkeyPatch, objs: list[RawObject]) -> tuple[status_mod.StatusWriter,
                                                                             list[tuple[str, Any]], WorkPool]:
    written: list[tuple[str, Any]] = []
    monkeypatch.setattr(status_mod, "request", lambda api, method, path, **kw: written.append((path, kw["body"])))
    cache = ClusterCache(api=None, kinds=SCHEDULING_KINDS)  # type: ignore[arg-type]
    for o in objs:
        if o.kind == "PodGroup":
            body = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", **copy.deepcopy(o.obj)}
            body["metadata"]["uid"] = o.obj["metadata"]["name"]
            cache._apply(cache._stores[("scheduling.run.ai/v2alpha2", "PodGroup")].res, "ADDED", body)
    pool = WorkPool("status-test", 1)
    w = status_mod.StatusWriter(None, cache, pool, TokenBucket(1000, 100), _NoEvents())  # type: ignore[arg-type]
    return w, written, pool


class _NoEvents:
    def emit(self, *a: Any, **kw: Any) -> bool:
        return False


def _annotation_patches(written: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {path.rsplit("/", 1)[1]: {k: v for k, v in body["metadata"]["annotations"].items()
                                    if k.startswith("kai-opt.io/queue-position")}
           for path, body in written if "metadata" in body}
    return {k: v for k, v in out.items() if v}


def test_pending_podgroups_get_their_position_annotations_and_lose_them_when_placed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    objs = _cluster()
    snap = snapshot(objs)
    state = build_state(snap)
    plan, fs = run_cycle(state, GREEDY)
    assert {state.pg_keys[g] for g in plan.pending} == {f"default/{n}" for n in ("a-low", "a-high", "b-1", "a-2")}
    pos = queue_positions(state, fs, GREEDY, among=set(plan.pending))
    w, written, pool = _writer(monkeypatch, objs)
    w.update(snap, state, plan, fs, pos)
    assert pool.wait_idle(30)
    got = _annotation_patches(written)
    by_name = {state.pg_keys[g].split("/")[1]: p for g, p in pos.items()}
    for name, p in by_name.items():
        assert got[name] == {"kai-opt.io/queue-position": str(p.overall),
                             "kai-opt.io/queue-position-in-queue": str(p.in_queue)}
    assert "run-a" not in got and "run-b" not in got, "running groups carry no position"
    assert json.loads(json.dumps(got))  # plain strings

    # the next cycle: room for a-high (4 free GPUs); its annotations go, the others are renumbered
    objs2 = _cluster(free_gpus=4)
    for o in objs2:
        if o.kind == "PodGroup" and o.obj["metadata"]["name"] in by_name:
            o.obj["metadata"]["annotations"] = {
                "kai-opt.io/queue-position": str(by_name[o.obj["metadata"]["name"]].overall),
                "kai-opt.io/queue-position-in-queue": str(by_name[o.obj["metadata"]["name"]].in_queue)}
    snap2 = snapshot(objs2)
    state2 = build_state(snap2)
    plan2, fs2 = run_cycle(state2, GREEDY)
    placed = {state2.pg_keys[int(state2.pod_pg[p.pod])].split("/")[1] for p in plan2.placements}
    assert placed == {"a-high"}
    pos2 = queue_positions(state2, fs2, GREEDY, among=set(plan2.pending))
    w2, written2, pool2 = _writer(monkeypatch, objs2)
    w2.update(snap2, state2, plan2, fs2, pos2)
    assert pool2.wait_idle(30)
    got2 = _annotation_patches(written2)
    assert got2["a-high"] == {"kai-opt.io/queue-position": None, "kai-opt.io/queue-position-in-queue": None}
    assert sorted(int(p.overall) for p in pos2.values()) == [1, 2, 3]
    for g, p in pos2.items():
        name = state2.pg_keys[g].split("/")[1]
        before = {"kai-opt.io/queue-position": str(by_name[name].overall),
                  "kai-opt.io/queue-position-in-queue": str(by_name[name].in_queue)}
        after = {**before, **got2.get(name, {})}
        assert after == {"kai-opt.io/queue-position": str(p.overall),
                         "kai-opt.io/queue-position-in-queue": str(p.in_queue)}
        assert (name in got2) == (after != before), "only a changed position is written"
    pool.stop()
    pool2.stop()


def test_without_positions_the_annotations_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    objs = _cluster()
    snap = snapshot(objs)
    state = build_state(snap)
    plan, fs = run_cycle(state, GREEDY)
    w, written, pool = _writer(monkeypatch, objs)
    w.update(snap, state, plan, fs, None)
    assert pool.wait_idle(30)
    assert not any("kai-opt.io/queue-position" in a for a in _annotation_patches(written).values())
    pool.stop()
