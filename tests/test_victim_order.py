"""The victim order's shared work: a subset's order replayed from a superset's (`within`) equals the subset's own
order, and a session rolled back is in the same state (same state_id, the queue ledger bit for bit)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from builders import node, pod, podgroup, queue, snapshot, state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters
from test_session_ops import _step

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.session import Session
from kai_opt.heuristics.victims import (
    _chunk_order,
    _victim_mask_of,
    _victim_rank,
    active_group_mask,
    victim_chunk_order,
    victim_pods,
)
from kai_opt.state import PodStatus, build_state

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _session(objs: list) -> Session:
    state = build_state(snapshot(objs))
    return Session(state, compute_fair_share(state), Config())


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12), st.randoms(use_true_random=False))
def test_subset_order_replayed_from_superset_equals_its_own(objs: list, rnd) -> None:
    sess = _session(objs)
    every = np.flatnonzero(active_group_mask(sess))
    subset = np.array(sorted(g for g in every.tolist() if rnd.random() < 0.6), dtype=np.int64)
    own = [(g, list(c)) for g, c in _chunk_order(sess, subset)]
    # leave-one-queue-out (reclaim's case) and a random subset, both replayed from the superset's order
    queues = sorted(set(sess.state.pg_queue[every].tolist()))
    for gs in [subset] + [every[sess.state.pg_queue[every] != q] for q in queues[:2]]:
        expected = [(g, list(c)) for g, c in _chunk_order(sess, gs)]
        assert [(g, list(c)) for g, c in victim_chunk_order(sess, gs, every)] == expected
        assert [(g, list(c)) for g, c in victim_chunk_order(sess, gs, every)] == expected  # replayed again
    assert [(g, list(c)) for g, c in victim_chunk_order(sess, subset)] == own


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12))
def test_rollback_restores_state_and_ledger_exactly(objs: list) -> None:
    sess = _session(objs)
    pods = np.flatnonzero(sess.status == PodStatus.BOUND).tolist()
    before_id = sess.state_id
    allocated = sess.ledger.allocated.copy()
    cp = sess.checkpoint()
    for p in pods:
        sess.evict(p, "reclaim", -1)
    if pods:
        assert sess.state_id != before_id
    sess.rollback(cp)
    assert sess.state_id == before_id
    assert np.array_equal(sess.ledger.allocated, allocated)
    assert not sess.evictions


def test_leave_one_queue_out_on_a_scale_instance() -> None:
    """Many queues over and under their share (models.generators.scale): every leave-one-queue-out order replayed
    from the all-queue order equals the order made for that subset alone."""
    from models.generators import as_snapshot, scale

    state = build_state(as_snapshot(scale(100, 1000, 100, 0)))
    sess = Session(state, compute_fair_share(state), Config())
    every = np.flatnonzero(active_group_mask(sess) & state.pg_preemptible.astype(bool))
    queues = sorted(set(state.pg_queue[every].tolist()))
    for q in queues[:: max(1, len(queues) // 25)]:
        gs = every[state.pg_queue[every] != q]
        expected = [(g, list(c)) for g, c in _chunk_order(sess, gs)]
        assert [(g, list(c)) for g, c in victim_chunk_order(sess, gs, every)] == expected, q


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12), st.randoms(use_true_random=False))
def test_evict_many_equals_evicting_one_by_one(objs: list, rnd) -> None:
    one, many = _session(objs), _session(objs)
    pods = np.flatnonzero(one.status == PodStatus.BOUND).tolist()
    rnd.shuffle(pods)
    pods = pods[: rnd.randint(0, len(pods))]
    cp = many.checkpoint()
    for p in pods:
        one.evict(p, "reclaim", 3)
    many.evict_many(pods, "reclaim", 3)
    for name in ("held", "rel", "dev_held", "dev_rel", "status"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    assert np.array_equal(one.ledger.allocated, many.ledger.allocated)  # bit for bit: same float additions
    assert np.array_equal(one.ledger.allocated_np, many.ledger.allocated_np)
    assert one.evictions == many.evictions and one.state_id == many.state_id
    assert [(o.kind, o.pod, o.node, o.devices, o.prev_status, o.dev_amount, o.non_preemptible) for o in one.log] == \
        [(o.kind, o.pod, o.node, o.devices, o.prev_status, o.dev_amount, o.non_preemptible) for o in many.log]
    assert all(np.array_equal(a.amount, b.amount) and np.array_equal(a.queue_amount, b.queue_amount)
               for a, b in zip(one.log, many.log, strict=True))
    many.rollback(cp)
    assert not many.evictions and many.state_id == 0


def test_a_gang_whose_pods_were_moved_keeps_its_minimum_counting_them() -> None:
    """Consolidation moves v's elastic pod v-2 (to make room for p1 on n2); a moved pod keeps its releasing status
    where it was, yet it runs on where it went, so preempt for p2 may not take v's two bound pods as its core:
    that would leave v with one pod of its minimum two (found at 10,000 nodes once KAI's boundary rule changed the
    reclaims before)."""
    objs = [node("n1", gpus=2, labels={"slot": "one"}), node("n2", gpus=1, labels={"slot": "two"}),
            node("n3", gpus=1), queue("a", gpu=(4, 1, -1)),
            podgroup("v", "a", min_member=2), pod("v-0", "v", gpus=1, node_name="n1"),
            pod("v-1", "v", gpus=1, node_name="n1"), pod("v-2", "v", gpus=1, node_name="n2"),
            podgroup("p1", "a", priority_class="build-preemptible", created_min=1),
            pod("p1-0", "p1", gpus=1, nodeSelector={"slot": "two"}),
            podgroup("p2", "a", priority_class="build-preemptible", created_min=2),
            pod("p2-0", "p2", gpus=2, nodeSelector={"slot": "one"})]
    st_ = state(objs)
    plan, _ = run_cycle(st_, Config(engine=Engine.greedy))  # the checker holds
    assert sorted((st_.pods[e.pod].name, e.reason) for e in plan.evictions) == [("v-2", "consolidate")]
    assert sorted(st_.pods[p.pod].name for p in plan.placements) == ["p1-0", "v-2"]


def test_a_gang_pipelined_this_cycle_is_a_victim_and_its_placement_is_withdrawn() -> None:
    """KAI's victims are jobs' active allocated pods, pods pipelined in the same session included (integration/063:
    its reclaim takes a job consolidation pipelined). Allocate pipelines a onto the room of a pod being deleted;
    reclaim for b (queue qb, below its share) needs that room and x's: it takes x and a's pipelined pod. The
    plan neither places nor evicts a-0; a stays pending, saying its placement was taken back."""
    objs = [node("n", gpus=4), queue("qa", gpu=(0, 1, -1)), queue("qb", gpu=(4, 1, -1)),
            podgroup("leaving", "qa"), pod("leaving-0", "leaving", gpus=2, node_name="n", deleting=True),
            podgroup("x", "qa", priority_class="build-preemptible"), pod("x-0", "x", gpus=2, node_name="n"),
            podgroup("a", "qa", created_min=1), pod("a-0", "a", gpus=2),
            podgroup("b", "qb", created_min=2), pod("b-0", "b", gpus=4)]
    st_ = state(objs)
    plan, _ = run_cycle(st_, Config(engine=Engine.greedy))  # the checker holds
    assert [(st_.pods[p.pod].name, p.pipelined) for p in plan.placements] == [("b-0", True)]
    assert [(st_.pods[e.pod].name, e.reason) for e in plan.evictions] == [("x-0", "reclaim")]
    (reason,) = plan.pending[st_.pg_index["default/a"]]
    assert reason.code == "PlacementWithdrawn" and reason.details == {"action": "reclaim", "for": "default/b"}


def test_victim_pods_are_bound_pods_or_a_groups_pods_placed_this_cycle_when_none_is_bound() -> None:
    """victim_pods' rule, on both of its reads (every pod, a few groups' pods): a group with a bound pod offers its
    bound pods only (what this cycle placed of it counts towards its minimum); a group with none bound offers what
    this cycle placed of it (pipelined)."""
    objs = [node("n", gpus=8), queue("q", gpu=(8, 1, -1)),
            podgroup("g", "q"), pod("g-0", "g", gpus=1, node_name="n"), pod("g-1", "g", gpus=1),
            podgroup("h", "q"), pod("h-0", "h", gpus=1), pod("h-1", "h", gpus=1)]
    sess = _session(objs)
    st_ = sess.state
    idx = {st_.pods[p].name: p for p in range(st_.n_pods)}
    for name in ("g-1", "h-0"):
        sess.place(idx[name], 0, (), pipelined=True)
    expected = {"g-0": True, "g-1": False, "h-0": True, "h-1": False}
    whole = victim_pods(sess)
    assert {n: bool(whole[p]) for n, p in idx.items()} == expected
    for g in range(st_.n_groups):
        pods = st_.group_pods(g).astype(np.int64)
        got = _victim_mask_of(sess, pods, st_.pod_pg[pods])
        assert {st_.pods[p].name: bool(v) for p, v in zip(pods.tolist(), got, strict=True)} == \
            {st_.pods[p].name: expected[st_.pods[p].name] for p in pods.tolist()}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200), st.integers(1, 12000), st.randoms(use_true_random=False))
def test_queue_job_order_is_the_lexsort_of_queue_elasticity_rank(n: int, n_queues: int, rnd) -> None:
    # the radix path (queue x 3 + elasticity within 16 bits) and the lexsort fallback (more queues) agree with
    # np.lexsort on every input the victim order gives it: distinct ranks, elasticities 0..2
    from kai_opt.heuristics.victims import queue_job_order

    ranks = np.array(rnd.sample(range(max(n * 3, 1)), n), dtype=np.int64)
    qs = np.array([rnd.randrange(n_queues) for _ in range(n)], dtype=np.int64)
    el = np.array([rnd.randrange(3) for _ in range(n)], dtype=np.int64)
    assert np.array_equal(queue_job_order(qs, el, ranks), np.lexsort((ranks, el, qs)))


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12), st.randoms(use_true_random=False))
def test_whole_devices_without_a_subset_read_from_its_superset(objs: list, rnd) -> None:
    # the free whole devices with a subset's victims gone, made from the superset's holdings (`within`) plus the
    # left-out groups' own, equal those made for the subset alone; also after pods placed in this session (their
    # devices are the session's) and for leave-one-queue-out subsets
    from kai_opt.heuristics.actions import ActionContext
    from kai_opt.heuristics.actions.allocate import ACTION as ALLOCATE
    from kai_opt.heuristics.victims import _whole_without

    sess = _session(objs)
    ALLOCATE.run(ActionContext(sess))
    every = np.flatnonzero(active_group_mask(sess))
    queues = sorted(set(sess.state.pg_queue[every].tolist()))
    subsets = [np.array(sorted(g for g in every.tolist() if rnd.random() < 0.6), dtype=np.int64), every]
    subsets += [every[sess.state.pg_queue[every] != q] for q in queues[:3]]
    for gs in subsets:
        assert np.array_equal(_whole_without(sess, gs, every), _whole_without(sess, gs))


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12), st.randoms(use_true_random=False))
def test_job_keys_at_once_equal_one_by_one(objs: list, rnd) -> None:
    # the scenario simulation reads every victim job's key at once (jobs.job_keys); with some pods evicted
    # (a victim's elastic state changes) they must be the keys JobQueue.job_key gives one group at a time
    from kai_opt.heuristics.jobs import JobQueue, job_keys

    sess = _session(objs)
    st_ = sess.state
    running = [p for p in range(st_.n_pods) if sess.status[p] == PodStatus.BOUND and st_.pod_pg[p] >= 0]
    gone = [p for p in running if rnd.random() < 0.4]
    if gone:
        sess.evict_many(gone, "reclaimed", -1)
    groups = [g for g in range(st_.n_groups) if rnd.random() < 0.7]
    probe = JobQueue(sess, [])
    assert job_keys(sess, groups) == [probe.job_key(g) for g in groups]


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12), st.randoms(use_true_random=False), st.integers(0, 30))
def test_a_few_groups_counts_equal_the_whole_sessions(objs: list, rnd, n_ops: int) -> None:
    """_chunk_counts_of (a victim order over a few groups) gives _chunk_counts' values for those groups, after
    evictions too, and after any operations (placements, moves of evicted pods, rollbacks)."""
    from kai_opt.heuristics.victims import _chunk_counts, _chunk_counts_of

    sess = _session(objs)
    st_ = sess.state
    for p in np.flatnonzero(sess.status == PodStatus.BOUND).tolist():
        if rnd.random() < 0.3:
            sess.evict(p, "reclaim", -1)
    open_cps: list = []
    for _ in range(n_ops):
        _step(sess, rnd, open_cps)
    groups = np.arange(st_.n_groups, dtype=np.int64)
    gs = np.array(sorted(g for g in groups.tolist() if rnd.random() < 0.5), dtype=np.int64)
    victim, left, newly = _chunk_counts(sess)
    v2, l2, n2 = _chunk_counts_of(sess, np.concatenate([gs, gs[:1]]))  # a repeated group counts once
    slots = np.concatenate([np.arange(st_.pg_pod_start[g], st_.pg_pod_start[g + 1]) for g in gs.tolist()] + [[]])
    slots = slots.astype(np.int64)
    assert np.array_equal(v2[slots], victim[slots])
    assert np.array_equal(l2[gs], left[gs]) and np.array_equal(n2[gs], newly[gs])


@SETTINGS
@given(clusters(max_nodes=6, max_jobs=10), st.randoms(use_true_random=False), st.integers(0, 30))
def test_victim_pods_read_from_a_few_groups_equal_the_whole_sessions(objs: list, rnd, n_ops: int) -> None:
    """_victim_mask_of (the victim pods of a few groups, read from their pods alone) equals victim_pods after any
    operations: placements bound or pipelined this cycle, evictions, moves, rollbacks."""
    sess = _session(objs)
    st_ = sess.state
    open_cps: list = []
    for _ in range(n_ops + 1):
        gs = [g for g in range(st_.n_groups) if rnd.random() < 0.5]
        pods = np.concatenate([st_.group_pods(g) for g in gs] + [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        assert np.array_equal(_victim_mask_of(sess, pods, st_.pod_pg[pods]), victim_pods(sess)[pods])
        _step(sess, rnd, open_cps)


@SETTINGS
@given(clusters(max_nodes=8, max_jobs=12))
def test_one_jobs_order_is_its_pods_above_the_minimum_last_first_then_its_core(objs: list) -> None:
    """A victim order over one job (most searches over the cheapest victims) walks no queue tree: its victim pods
    in task order, those above its minimum one at a time from the last, then the core whole (nothing was placed
    in this session, so the core may go); the same chunks as that job's in an order over every job."""
    sess = _session(objs)
    st = sess.state
    mask = victim_pods(sess)
    every = np.flatnonzero(active_group_mask(sess))
    together: dict[int, list[list[int]]] = {}
    for g, c in _chunk_order(sess, every):
        together.setdefault(g, []).append(list(c))
    for g in every.tolist():
        pods = [p for p in st.pg_pods[st.pg_pod_start[g]:st.pg_pod_start[g + 1]].tolist() if mask[p]]
        m = int(st.pg_min_member[g])
        expected = [[p] for p in reversed(pods[m:])] + ([pods[:m]] if pods[:m] else [])
        assert [list(c) for _, c in _chunk_order(sess, np.array([g]))] == expected, g
        assert together.get(g, []) == expected, g


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2), st.sampled_from([0.0, 5.0, 7.5, math.nan, math.inf, -0.0]),
                          st.sampled_from(["a/x", "a/y", "b/x", "a/xx", "é/z", "A/x"])), max_size=30))
def test_victim_rank_orders_by_priority_then_newer_then_key_then_index(rows: list) -> None:
    """The victim rank (array sort) equals sorting the groups by (priority, newer first with an unknown creation
    as 0, key, index)."""
    prio = np.array([r[0] for r in rows], dtype=np.int64)
    created = np.array([r[1] for r in rows], dtype=float)
    keys = [r[2] for r in rows]
    sess = SimpleNamespace(state=SimpleNamespace(n_groups=len(rows), pg_priority=prio, pg_creation=created,
                                                 pg_keys=keys))
    made = np.nan_to_num(created, nan=0.0).tolist()
    want = sorted(range(len(rows)), key=lambda g: (int(prio[g]), -made[g], keys[g], g))
    assert np.argsort(_victim_rank(sess)).tolist() == want  # type: ignore[arg-type]


def test_a_leaf_and_a_department_tied_at_their_level_both_give_victims() -> None:
    # a top-level leaf queue and a department (a parent queue) holding the same: their level keys tie, so the
    # order compares what is below them, a job for the leaf and a child queue for the department (a comparison
    # of a job key with a queue key raised TypeError before; hypothesis found it in test_nodefilter)
    objs = [node("n0", gpus=2, cpu="8"), queue("dept", gpu=(-1, 1, -1)), queue("q0", parent="dept"),
            queue("extra", gpu=(-1, 1, -1)), podgroup("a", "q0"), podgroup("b", "extra"),
            pod("a-0", group="a", cpu="2", node_name="n0"), pod("b-0", group="b", cpu="2", node_name="n0")]
    sess = _session(objs)
    st = sess.state
    groups = [st.pg_index["default/a"], st.pg_index["default/b"]]
    order = list(_chunk_order(sess, np.array(groups, dtype=np.int64)))
    assert sorted(g for g, _ in order) == sorted(groups)  # each job's one pod, once
    assert all(len(chunk) == 1 for _, chunk in order)
