"""Tables kept up to date from the pods whose status changed (heuristics.status_watch and the pending jobs every
reclaim simulation starts from) equal the same tables made from scratch, after any sequence of operations,
checkpoints, rollbacks and commits, read after every step or only now and then."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters
from test_session_ops import _session, _step

from kai_opt.config import Config
from kai_opt.heuristics.cheapest_victims import _Room, _room_rows, _unit_counts, victim_units
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.session import IS_ACTIVE, Session
from kai_opt.heuristics.status_watch import group_active_counts
from kai_opt.heuristics.victims import _PendingJobs, _PendingOrder, protected_by_min_runtime, protected_mask

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _active_groups(sess: Session) -> np.ndarray:
    st_ = sess.state
    out = np.zeros(st_.n_groups, dtype=bool)
    out[st_.pod_pg[IS_ACTIVE[sess.status] & (st_.pod_pg >= 0)]] = True
    return out


def _alive_units(sess: Session) -> np.ndarray:
    units = victim_units(sess)
    return np.bincount(units.pod_unit, weights=IS_ACTIVE[sess.status[units.pods]], minlength=len(units.group)) > 0


def _pending(sess: Session) -> tuple:
    jobs = _PendingJobs(sess.state.n_queues)
    jobs.update(sess, JobQueue(sess, []))
    return _view(jobs)


def _view(jobs: _PendingJobs) -> tuple:
    return ({x: r.tobytes() for x, r in jobs.request.items()}, dict(jobs.request_bytes),
            {q: list(v) for q, v in jobs.own.items() if v}, list(jobs.count))


@SETTINGS
@given(clusters(max_nodes=6, max_jobs=10), st.randoms(use_true_random=False), st.integers(0, 40))
def test_kept_up_to_date_equals_made_again(objs: list, rnd: random.Random, n_ops: int) -> None:
    sess = _session(objs)
    kept = _PendingJobs(sess.state.n_queues)
    open_cps: list[tuple[int, tuple]] = []
    for _ in range(n_ops + 1):
        if rnd.random() < 0.6:  # read now and then: a read may see many steps at once
            assert np.array_equal(group_active_counts(sess).any_active(sess), _active_groups(sess))
            assert np.array_equal(_unit_counts(sess, victim_units(sess)).any_active(sess), _alive_units(sess))
            kept.update(sess, JobQueue(sess, []))
            assert _view(kept) == _pending(sess)
        _step(sess, rnd, open_cps)


def _fresh_order(sess: Session) -> _PendingOrder:
    """A pending order made from scratch (no earlier order's sequences to take over)."""
    saved = sess.caches._static.pop("pending_jobs", None)
    try:
        return _PendingOrder(sess)
    finally:
        if saved is not None:
            sess.caches._static["pending_jobs"] = saved


def _sequences(po: _PendingOrder, queues: list[int]) -> list:
    return [([po.item(q, i) for i in range(po.count[q])], [po.key(q, i) for i in range(po.count[q])])
            for q in queues]


@SETTINGS
@given(clusters(max_nodes=6, max_jobs=10), st.randoms(use_true_random=False), st.integers(0, 30))
def test_pending_orders_taking_over_sequences_equal_fresh_ones(objs: list, rnd: random.Random, n_ops: int) -> None:
    """A pending order that takes over an earlier state's sequences (subtrees whose jobs and allocations did not
    change) pops and keys every subtree as one made from scratch, however far the earlier ones were read."""
    sess = _session(objs)
    queues = list(range(sess.state.n_queues))
    open_cps: list[tuple[int, tuple]] = []
    for _ in range(n_ops + 1):
        if rnd.random() < 0.6:
            po = _PendingOrder(sess)
            for q in rnd.sample(queues, rnd.randint(0, len(queues))):  # partly read: later orders share it so
                if po.count[q]:
                    po.item(q, rnd.randrange(po.count[q]))
            assert _sequences(po, queues) == _sequences(_fresh_order(sess), queues)
        _step(sess, rnd, open_cps)


@SETTINGS
@given(clusters(max_nodes=6, max_jobs=10), st.randoms(use_true_random=False), st.integers(0, 40))
def test_protected_mask_kept_up_to_date_equals_each_group_judged(objs: list, rnd: random.Random,
                                                                 n_ops: int) -> None:
    """protected_mask, judged again only for the groups of pods whose status changed, equals
    protected_by_min_runtime of every group (pods started 1, 60 or 600 minutes ago; min runtimes of 30 minutes,
    so evicting a group's oldest pod can protect it)."""
    sess = _session(objs)
    sess = Session(sess.state, sess.fs, Config.model_validate({"reclaim_min_runtime_s": 1800,
                                                               "preempt_min_runtime_s": 1800}))
    open_cps: list[tuple[int, tuple]] = []
    for _ in range(n_ops + 1):
        if rnd.random() < 0.6:
            for kind in ("reclaim", "preempt"):
                want = [protected_by_min_runtime(sess, g, kind) for g in range(sess.state.n_groups)]
                assert protected_mask(sess, kind).tolist() == want
        _step(sess, rnd, open_cps)


@SETTINGS
@given(clusters(max_nodes=6, max_jobs=10), st.randoms(use_true_random=False), st.integers(0, 40))
def test_room_after_releases_kept_up_to_date_equals_made_again(objs: list, rnd: random.Random, n_ops: int) -> None:
    """The cheapest search's room per node, refreshed for the nodes the session touched since the last read, equals
    the room made from every node, however many steps (operations, rollbacks, commits) lie between reads."""
    sess = _session(objs)
    room = _Room(sess)
    open_cps: list[tuple[int, tuple]] = []
    for _ in range(n_ops + 1):
        if rnd.random() < 0.6:
            assert np.array_equal(room.now(sess), _room_rows(sess, slice(None)))
        _step(sess, rnd, open_cps)
