"""Session.place_many (and place_plan, its form for a plan's own placements) and evict_each (the bulk paths the
CP-SAT window uses to apply the greedy plan's decisions outside the model) leave the session exactly as place() /
evict_many() called pod by pod: resources, devices, queue ledger (float sums equal to the bit), statuses and
placements; place_many's log holds one op, whose pipelined pods claimed what each claims placed alone, and a
rollback over either restores the session it started from exactly."""

from __future__ import annotations

import random

import numpy as np
from builders import node, pod, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters
from test_session_ops import _devices_for

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.session import Session
from kai_opt.state import PodStatus, build_state

GREEDY = Config(engine=Engine.greedy)


def _items(state, plan) -> list[tuple[int, int, tuple[int, ...], bool]]:
    return [(pl.pod, pl.node, tuple(int(state.dev_start[pl.node]) + d for d in pl.devices), pl.pipelined)
            for pl in plan.placements if not pl.moved]


def _view(sess: Session) -> tuple:
    return (sess.held.tolist(), sess.dev_held.tolist(), sess.rel.tolist(), sess.dev_rel.tolist(),
            sess.dev_piped.tolist(), sess.ledger.allocated.tobytes(), sess.ledger.allocated_np.tobytes(),
            sess.status.tolist(), sess.node.tolist(), dict(sess.devices), dict(sess.placements))


def _log(sess: Session) -> list[tuple]:
    return [(op.kind, op.pod, op.node, op.devices, op.prev_status, np.asarray(op.amount).tolist(), op.dev_amount,
             np.asarray(op.queue_amount).tolist(), op.non_preemptible) for op in sess.log]


def _both(state) -> tuple[tuple, tuple, int]:
    plan, _ = run_cycle(state, GREEDY)
    fs = compute_fair_share(state)
    items = _items(state, plan)
    one, bulk, fresh = Session(state, fs, GREEDY), Session(state, fs, GREEDY), Session(state, fs, GREEDY)
    for p, n, devices, pipelined in items:
        one.place(p, n, devices, pipelined=pipelined)
    start = bulk.checkpoint()
    bulk.place_many(items)
    assert [op[0] for op in _log(bulk)] == (["place_run"] if items else [])  # one op for every item
    if any(it[3] for it in items):  # each pipelined pod claimed the releasing room it claims placed alone
        run = bulk.log[-1]
        alone = {op.pod: op for op in one.log}
        dev_at = np.r_[0, np.cumsum([len(it[2]) for it in items])]
        for i, (p, _n, devices, pipelined) in enumerate(items):
            claimed = alone[p].claimed.tolist() if pipelined else [0] * len(run.claimed[i])
            assert run.claimed[i].tolist() == claimed
            claimed_dev = list(alone[p].dev_claimed) if pipelined else [0] * len(devices)
            assert run.dev_claimed[dev_at[i]:dev_at[i + 1]].tolist() == claimed_dev
    view = _view(bulk)
    bulk.rollback(start)
    assert _view(bulk) == _view(fresh)  # the runs undo exactly
    planned = Session(state, fs, GREEDY)  # place_plan: the same from the plan's own placements
    planned.place_plan([pl for pl in plan.placements if not pl.moved])
    assert _view(planned) == view
    return _view(one), view, len(items)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objs=clusters(max_nodes=8, max_jobs=12))
def test_place_many_equals_place_one_by_one_on_random_clusters(objs: list) -> None:
    one, bulk, _ = _both(build_state(snapshot(objs)))
    assert bulk == one


def test_place_many_equals_place_one_by_one_on_a_scale_instance() -> None:
    from models.generators import as_snapshot, scale

    one, bulk, placed = _both(build_state(as_snapshot(scale(300, 3000, 300, 0))))
    assert placed > 100
    assert bulk == one


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objs=clusters(max_nodes=8, max_jobs=12), rnd=st.randoms(use_true_random=False))
def test_evict_each_equals_evict_many_pod_by_pod(objs: list, rnd: random.Random) -> None:
    """Session.evict_each (a replayed plan's evictions, each with its own reason and beneficiary, in one step)
    leaves the session, its log, its evictions and its caches' change record as evict_many called per pod."""
    state = build_state(snapshot(objs))
    fs = compute_fair_share(state)
    bound = np.flatnonzero(state.pod_status == PodStatus.BOUND).tolist()
    pods = rnd.sample(bound, rnd.randint(0, len(bound)))
    reasons = [rnd.choice(["reclaim", "preempt", "consolidate"]) for _ in pods]
    beneficiaries = [rnd.randint(-1, max(0, state.n_groups - 1)) for _ in pods]
    one, bulk, fresh = Session(state, fs, GREEDY), Session(state, fs, GREEDY), Session(state, fs, GREEDY)
    for p, r, b in zip(pods, reasons, beneficiaries, strict=True):
        one.evict_many([p], r, b)
    start = bulk.checkpoint()
    bulk.evict_each(pods, reasons, beneficiaries)
    assert _view(bulk) == _view(one)
    assert _log(bulk) == _log(one)
    assert bulk.evictions == one.evictions
    assert (bulk.caches.touched, bulk.caches.version) == (one.caches.touched, one.caches.version)
    bulk.rollback(start)
    assert _view(bulk) == _view(fresh)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objs=clusters(max_nodes=6, max_jobs=12), rnd=st.randoms(use_true_random=False))
def test_place_many_pipelined_pods_share_releasing_room_in_order(objs: list, rnd: random.Random) -> None:
    """Several pipelined pods onto the nodes (and devices) where evicted pods release room: each claims what the
    ones before it left, as place() called pod by pod; binds between them claim nothing."""
    state = build_state(snapshot(objs))
    fs = compute_fair_share(state)
    bound = np.flatnonzero(state.pod_status == PodStatus.BOUND).tolist()
    pending = np.flatnonzero(state.pod_status == PodStatus.PENDING).tolist()
    if not bound or not pending:
        return
    gone = rnd.sample(bound, rnd.randint(1, len(bound)))
    nodes = sorted({int(state.pod_node[p]) for p in gone})
    one, bulk = Session(state, fs, GREEDY), Session(state, fs, GREEDY)
    for sess in (one, bulk):
        sess.evict_many(gone, "reclaim", -1)
    items = []
    for p in rnd.sample(pending, rnd.randint(1, len(pending))):
        n = rnd.choice(nodes)
        items.append((p, n, _devices_for(bulk, p, n), rnd.random() < 0.8))
    for p, n, devices, pipelined in items:
        one.place(p, n, devices, pipelined=pipelined)
    start = bulk.checkpoint()
    fresh = _view(bulk)
    bulk.place_many(items)
    assert _view(bulk) == _view(one)
    bulk.rollback(start)
    assert _view(bulk) == fresh


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objs=clusters(max_nodes=8, max_jobs=12), mem=st.lists(st.integers(1, 90_000), max_size=4),
       node_mem=st.sampled_from([16_384, 40_000, 81_920]))
def test_gpu_per_device_many_equals_one_by_one(objs: list, mem: list[int], node_mem: int) -> None:
    """ClusterState.pod_gpu_per_device_many (place_many's) gives pod_gpu_per_device for every pod on every node,
    gpu-memory pods (converted with each node's GPU memory) included."""
    objs = objs + [node("mem-node", gpu_memory_mib=node_mem)] + [
        pod(f"mem-{i}", annotations={"gpu-memory": str(m)}) for i, m in enumerate(mem)]
    state = build_state(snapshot(objs))
    assert int((state.pod_gpu_mem > 0).sum()) == len(mem)
    pods = np.repeat(np.arange(state.n_pods), state.n_nodes)
    nodes = np.tile(np.arange(state.n_nodes), state.n_pods)
    want = [state.pod_gpu_per_device(p, n) for p, n in zip(pods.tolist(), nodes.tolist(), strict=True)]
    assert state.pod_gpu_per_device_many(pods, nodes).tolist() == want
