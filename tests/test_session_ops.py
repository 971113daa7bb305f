"""The session's framework layer: typed operations that each carry their own undo, checkpoint / rollback / commit as
the state-changing API, read-only arrays, the caches' rules (SessionCaches), and PodStatus.ALLOCATED. The property:
any sequence of operations, with nested checkpoints rolled back or committed, then a rollback to a checkpoint
restores every array, map and the queue ledger exactly (bit for bit)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from builders import snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters

from kai_opt.config import Config
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.session import (
    Allocate,
    AllocateRun,
    Evict,
    Move,
    Pipeline,
    Session,
    Unevict,
    UnevictMany,
)
from kai_opt.state import PodStatus, build_state

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _session(objs: list) -> Session:
    state = build_state(snapshot(objs))
    return Session(state, compute_fair_share(state), Config())


def _view(sess: Session) -> tuple:
    """Everything a rollback must restore."""
    return (sess.held.tobytes(), sess.rel.tobytes(), sess.dev_held.tobytes(), sess.dev_rel.tobytes(),
            sess.dev_piped.tobytes(), sess.status.tobytes(), sess.node.tobytes(), sess.ledger.allocated.tobytes(),
            sess.ledger.allocated_np.tobytes(), dict(sess.devices), dict(sess.placements), dict(sess.moves),
            dict(sess.evictions), sess.state_id, len(sess.log), sess.whole_idle.tobytes(),
            sess.whole_future.tobytes(), sess.max_idle.tobytes(), sess.max_future.tobytes())


def _devices_for(sess: Session, p: int, n: int) -> tuple[int, ...]:
    st = sess.state
    want = int(st.pod_gpu_whole[p]) or (int(st.pod_gpu_ndev[p]) if (st.pod_gpu_frac[p] or st.pod_gpu_mem[p]) else 0)
    a, b = int(st.dev_start[n]), int(st.dev_start[n + 1])
    return tuple(range(a, min(b, a + want)))


def _step(sess: Session, rnd: random.Random, open_cps: list[tuple[int, tuple]]) -> None:
    """One random operation (or checkpoint / rollback / commit) on the session."""
    st = sess.state
    status = sess.status
    pending = [p for p in np.flatnonzero(status == PodStatus.PENDING).tolist() if p not in sess.placements]
    bound = np.flatnonzero(status == PodStatus.BOUND).tolist()
    evicted = [p for p in sess.evictions if sess.status[p] == PodStatus.RELEASING]
    allocated = np.flatnonzero(status == PodStatus.ALLOCATED).tolist()
    kind = rnd.choice(["bind", "pipeline", "bind_many", "evict", "unevict", "unevict_many", "convert", "move",
                       "checkpoint", "rollback", "commit"])
    if kind in ("bind", "pipeline") and pending and st.n_nodes:
        p, n = rnd.choice(pending), rnd.randrange(st.n_nodes)
        sess.place(p, n, _devices_for(sess, p, n), pipelined=kind == "pipeline")
    elif kind == "bind_many" and pending and st.n_nodes:
        pods = rnd.sample(pending, rnd.randint(1, len(pending)))
        items = []
        for p in pods:
            n = rnd.randrange(st.n_nodes)
            items.append((p, n, _devices_for(sess, p, n), rnd.random() < 0.3))
        sess.place_many(items)
    elif kind == "evict" and bound:
        sess.evict_many(rnd.sample(bound, rnd.randint(1, min(4, len(bound)))), "reclaim", -1)
    elif kind == "unevict" and evicted:
        sess.unevict(rnd.choice(evicted))
    elif kind == "unevict_many" and evicted:
        sess.unevict_many(rnd.sample(evicted, rnd.randint(1, len(evicted))))
    elif kind == "convert" and allocated:
        sess.convert_to_pipelined(rnd.sample(allocated, rnd.randint(1, len(allocated))))
    elif kind == "move" and evicted and st.n_nodes:
        p = rnd.choice([q for q in evicted if q not in sess.moves] or evicted)
        if p not in sess.moves:
            n = rnd.randrange(st.n_nodes)
            sess.place(p, n, _devices_for(sess, p, n), pipelined=True, moved=True)
    elif kind == "checkpoint":
        open_cps.append((sess.checkpoint(), _view(sess)))
    elif kind == "rollback" and open_cps:
        cp, view = open_cps[-1]
        sess.rollback(cp)
        assert _view(sess) == view
    elif kind == "commit" and open_cps:
        sess.commit(open_cps.pop()[0])


@SETTINGS
@given(clusters(max_nodes=6, max_jobs=10), st.randoms(use_true_random=False), st.integers(0, 40))
def test_any_ops_then_rollback_restores_every_array_exactly(objs: list, rnd: random.Random, n_ops: int) -> None:
    sess = _session(objs)
    fresh = _view(_session(objs))
    start = sess.checkpoint()
    open_cps: list[tuple[int, tuple]] = []
    mid: tuple[int, tuple] | None = None
    lowest = 0  # the shortest the log was since mid was taken (a rollback below mid undoes mid's state)
    for i in range(n_ops):
        if i == n_ops // 2:
            mid = (sess.checkpoint(), _view(sess))
            lowest = len(sess.log)
        _step(sess, rnd, open_cps)
        lowest = min(lowest, len(sess.log))
    # a rolled-back inner checkpoint is left open, committed ones are closed: rollbacks to the outer ones still
    # restore exactly
    if mid is not None and lowest >= mid[0]:
        sess.rollback(mid[0])
        assert _view(sess) == mid[1]
    sess.rollback(start)
    assert _view(sess) == fresh


def test_each_operation_logs_its_typed_record() -> None:
    from models.generators import as_snapshot, scale

    state = build_state(as_snapshot(scale(20, 120, 20, 0)))
    sess = Session(state, compute_fair_share(state), Config())
    fresh = _view(Session(state, compute_fair_share(state), Config()))
    pending = np.flatnonzero(sess.status == PodStatus.PENDING).tolist()
    bound = np.flatnonzero(sess.status == PodStatus.BOUND).tolist()
    assert len(pending) >= 4 and len(bound) >= 3
    steps = [lambda: sess.place(pending[0], 0, (), pipelined=False),
             lambda: sess.place(pending[1], 1, (), pipelined=True),
             lambda: sess.place_many([(pending[2], 2, (), False), (pending[3], 3, (), False)]),
             lambda: sess.convert_to_pipelined([pending[0]]),
             lambda: sess.evict_many(bound[:3], "reclaim", 0),
             lambda: sess.unevict(bound[0]),
             lambda: sess.unevict_many([bound[1]]),
             lambda: sess.place(bound[2], 4, (), pipelined=True, moved=True)]
    before = []  # (checkpoint, view) before each step
    for step in steps:
        before.append((sess.checkpoint(), _view(sess)))
        step()
    assert [type(op) for op in sess.log] == [Allocate, Allocate, AllocateRun, Pipeline, Evict, Evict, Evict,
                                             Unevict, UnevictMany, Move]
    assert [op.kind for op in sess.log] == ["place", "place", "place_run", "pipeline", "evict", "evict", "evict",
                                            "unevict", "unevict_many", "move"]
    assert sess.status[pending[0]] == PodStatus.PIPELINED and sess.placements[pending[0]].pipelined
    assert sess.status[pending[2]] == PodStatus.ALLOCATED and not sess.placements[pending[2]].pipelined
    assert sess.status[bound[0]] == PodStatus.BOUND and bound[0] not in sess.evictions
    assert sess.status[bound[2]] == PodStatus.RELEASING and sess.moves[bound[2]].node == 4
    assert sess.eviction_ops[bound[2]].node == int(state.pod_node[bound[2]])
    # each step's ops undone from the top leave exactly what the session was before that step
    for cp, view in reversed(before):
        sess.rollback(cp)
        assert _view(sess) == view
    assert _view(sess) == fresh


def test_arrays_readers_see_are_read_only() -> None:
    from models.generators import as_snapshot, scale

    state = build_state(as_snapshot(scale(5, 30, 5, 0)))
    sess = Session(state, compute_fair_share(state), Config())
    for name in ("held", "rel", "dev_held", "dev_rel", "dev_piped", "status", "node"):
        with pytest.raises(ValueError):
            getattr(sess, name)[0] = 1
    with pytest.raises(TypeError):
        sess.eviction_ops[0] = None  # type: ignore[index]
    p = int(np.flatnonzero(sess.status == PodStatus.PENDING)[0])
    sess.place(p, 0, (), pipelined=False)
    assert sess.status[p] == PodStatus.ALLOCATED  # the view shows the session's change


def test_caches_follow_their_rules() -> None:
    from models.generators import as_snapshot, scale

    state = build_state(as_snapshot(scale(5, 30, 5, 0)))
    sess = Session(state, compute_fair_share(state), Config())
    c = sess.caches
    pending = np.flatnonzero(sess.status == PodStatus.PENDING).tolist()
    v0, t0 = c.version, len(c.touched)
    cp = sess.checkpoint()
    sess.place(pending[0], 2, (), pipelined=False)
    assert c.version == v0 + 1 and c.touched[t0:] == [2] and 2 in c.dirty  # one single-node change
    calls: list[int] = []
    sid = sess.state_id
    assert sess.memo("k", lambda: calls.append(1) or 7) == 7 and sess.memo("k", lambda: 8) == 7
    sess.rollback(cp)
    assert c.version == v0 + 2 and c.touched[t0:] == [2, 2]  # an undo is a change too; touched never shrinks
    assert sess.memo("k", lambda: 9) == 9  # another state
    sess.place(pending[0], 2, (), pipelined=False)
    assert sess.state_id != sid  # a new op: never an old state's id
    assert sess.static("s", lambda: [1]) is sess.static("s", lambda: [2])
    _ = sess.whole_idle
    assert not c.dirty  # a summary read refreshes the stale nodes


def test_commit_keeps_changes_and_closes_only_its_checkpoint() -> None:
    from models.generators import as_snapshot, scale

    state = build_state(as_snapshot(scale(5, 30, 5, 0)))
    sess = Session(state, compute_fair_share(state), Config())
    fresh = _view(Session(state, compute_fair_share(state), Config()))
    pending = np.flatnonzero(sess.status == PodStatus.PENDING).tolist()
    outer = sess.checkpoint()
    inner = sess.checkpoint()  # same log length as outer: committing inner leaves outer's ledger copy
    sess.place(pending[0], 1, (), pipelined=False)
    sess.commit(inner)
    assert pending[0] in sess.placements
    sess.rollback(outer)
    assert _view(sess) == fresh


def test_allocated_is_a_status_the_snapshot_never_produces() -> None:
    from models.generators import FAMILIES, as_snapshot

    assert int(PodStatus.ALLOCATED) == 6  # arrays (IS_ACTIVE, status int8) index by the value
    for fam in list(FAMILIES)[:4]:
        state = build_state(as_snapshot(FAMILIES[fam].generate(30, 0)))
        assert not np.any(state.pod_status == PodStatus.ALLOCATED)
