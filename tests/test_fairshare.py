"""Fair share division: worked examples (KAI docs and hand-computed), queue order, capacity and reclaim rules."""

from __future__ import annotations

import numpy as np
import pytest
from builders import departments, node, pod, podgroup, queue, state

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.capacity import capacity_violation, non_preemptible_over_quota, over_limit
from kai_opt.fairshare.division import QueueShare, divide
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.order import QueueOrder
from kai_opt.fairshare.reclaim import can_reclaim, leveled, reclaimable, victim_chunks


def shares(total: float, spec: list[tuple[float, float, float, int, float]]) -> list[float]:
    """spec: (deserved, limit, weight, priority, request) per sibling queue."""
    qs = [QueueShare(index=i, name=f"q{i}", deserved=d, limit=lim, weight=w, priority=p, creation=float(i),
                     request=r) for i, (d, lim, w, p, r) in enumerate(spec)]
    divide(total, qs)
    return [q.fair_share for q in qs]


def test_docs_example_quota_first_then_surplus_by_priority_and_weight() -> None:
    # KAI "Scheduling Deep Dive": a 10-GPU cluster, three queues get their quotas; the 3 surplus GPUs go to the
    # highest priority bucket, split 2:1 by weight; the lower-priority queue gets no surplus.
    vision, llm, research = shares(10, [(3, -1, 2, 2, 100), (2, -1, 1, 2, 100), (2, -1, 100, 1, 100)])
    assert (vision, llm, research) == (5, 3, 2)


def test_docs_priority_beats_weight() -> None:
    # "A queue with priority=2, weight=1 gets surplus before a queue with priority=1, weight=100"
    high, low = shares(10, [(0, -1, 1, 2, 6), (0, -1, 100, 1, 100)])
    assert (high, low) == (6, 4)


def test_deserved_is_capped_by_request_and_minus_one_means_everything() -> None:
    assert shares(10, [(4, -1, 1, 100, 1), (-1, -1, 0, 100, 3)]) == [1, 3]
    # deserved -1 takes the whole amount in the deserved pass (up to its request)
    assert shares(10, [(-1, -1, 1, 100, 20), (0, -1, 1, 100, 5)]) == [10, 0]


def test_deserved_quota_is_guaranteed_even_when_over_committed() -> None:
    # KAI: deserved is handed out in full even if the quotas add up to more than there is; nothing is left over
    assert shares(10, [(-1, -1, 1, 100, 20), (2, -1, 1, 100, 5)]) == [10, 2]
    assert shares(4, [(3, -1, 1, 100, 10), (3, -1, 1, 100, 10)]) == [3, 3]


def test_limit_caps_requestable() -> None:
    assert shares(10, [(0, 3, 1, 100, 8), (0, -1, 1, 100, 8)]) == [3, 7]


def test_zero_weight_gets_no_over_quota() -> None:
    assert shares(10, [(1, -1, 0, 100, 8), (1, -1, 1, 100, 5)]) == [1, 5]


def test_whole_units_per_round_and_leftover_by_largest_remainder() -> None:
    # 10 over three equal weights: 3.33 each -> 3 each in round 1 (remainders 1/3 each), leftover 1 unit to the
    # oldest (ties on remainder broken by creation time)
    assert shares(10, [(0, -1, 1, 100, 9), (0, -1, 1, 100, 9), (0, -1, 1, 100, 9)]) == [4, 3, 3]
    # weights 1:2 over 5: shares 1.67 / 3.33 -> 1 and 3; remainders .67 and .33 -> leftover unit to the first
    assert shares(5, [(0, -1, 1, 100, 9), (0, -1, 2, 100, 9)]) == [2, 3]


def test_rounds_repeat_when_a_queue_is_satisfied() -> None:
    # 12 over three: q0 needs only 1 -> satisfied in round 1; the rest is split again between q1 and q2
    assert shares(12, [(0, -1, 1, 100, 1), (0, -1, 1, 100, 20), (0, -1, 1, 100, 20)]) == [1, 6, 5]


def test_fractional_gpu_requests_never_overshoot() -> None:
    out = shares(3, [(0, -1, 1, 100, 0.5), (0, -1, 1, 100, 1.25)])
    assert out == [0.5, 1.25]


def _two_team_cluster(extra: list | None = None):
    objs = [node("n1", gpus=8), node("n2", gpus=8),
            queue("dept", gpu=(8, 1, -1)),
            queue("a", parent="dept", gpu=(4, 2, 12), created_min=1),
            queue("b", parent="dept", gpu=(4, 1, -1), created_min=2)]
    objs += extra or []
    return state(objs)


def test_hierarchy_children_divide_parents_share_and_other_schedulers_reduce_total() -> None:
    objs = [podgroup("ja", "a", min_member=2)]
    objs += [pod(f"ja-{i}", group="ja", gpus=4) for i in range(2)]
    objs += [podgroup("jb", "b"), pod("jb-0", group="jb", gpus=2, node_name="n2")]
    objs += [pod("other", gpus=1, node_name="n1", scheduler="default-scheduler")]
    st = _two_team_cluster(objs)
    fs = compute_fair_share(st)
    q = st.q_index
    assert fs.total[0] == 15  # 16 GPUs minus one held by another scheduler
    assert fs.requested[q["a"], 0] == 8 and fs.requested[q["b"], 0] == 2
    assert fs.fair_share[q["dept"], 0] == 10  # its request (8 + 2) within deserved 8 + over-quota
    assert fs.fair_share[q["a"], 0] == 8 and fs.fair_share[q["b"], 0] == 2
    # allocatable share = max(deserved, fair share), capped by the limit
    assert fs.allocatable_share[q["a"], 0] == 8 and fs.allocatable_share[q["b"], 0] == 4
    # the children divide exactly what their parent got, nothing more or less
    assert fs.fair_share[q["a"], 0] + fs.fair_share[q["b"], 0] == fs.fair_share[q["dept"], 0]


def test_releasing_pods_count_in_neither_allocated_nor_requested() -> None:
    objs = [podgroup("jb", "b"), pod("jb-0", group="jb", gpus=2, node_name="n2", deleting=True)]
    st = _two_team_cluster(objs)
    fs = compute_fair_share(st)
    assert fs.allocated[st.q_index["b"], 0] == 0 and fs.requested[st.q_index["b"], 0] == 0


def test_drf_share_and_queue_order() -> None:
    objs = [podgroup("ja", "a"), pod("ja-0", group="ja", gpus=6, node_name="n1"),
            podgroup("jb", "b"), pod("jb-0", group="jb", gpus=1, node_name="n2"),
            podgroup("pa", "a"), pod("pa-0", group="pa", gpus=1),
            podgroup("pb", "b"), pod("pb-0", group="pb", gpus=1)]
    st = _two_team_cluster(objs)
    fs = compute_fair_share(st)
    q = st.q_index
    drf = fs.dominant_share()
    assert drf[q["a"]] > drf[q["b"]]
    order = QueueOrder(fs, QueueLedger.start(st, fs), st.q_names, st.q_creation, st.q_priority)
    job = {q["a"]: np.array([1.0, 1000, 2**30]), q["b"]: np.array([1.0, 1000, 2**30])}
    # b is within deserved with its job, a is over deserved -> b first
    assert order.best([q["a"], q["b"]], job) == q["b"]


def test_queue_order_prefers_higher_queue_priority_when_both_starved() -> None:
    st = state([node("n1"), queue("hi", gpu=(4, 1, -1), priority=200), queue("lo", gpu=(4, 1, -1), priority=50)])
    fs = compute_fair_share(st)
    order = QueueOrder(fs, QueueLedger.start(st, fs), st.q_names, st.q_creation, st.q_priority)
    job = np.array([1.0, 1000, 2**30])
    assert order.best([st.q_index["lo"], st.q_index["hi"]], {0: job, 1: job}) == st.q_index["hi"]


def test_over_limit_checks_every_ancestor() -> None:
    st = state([node("n1", gpus=16), queue("dept", gpu=(8, 1, 6)), queue("a", parent="dept", gpu=(8, 1, 10)),
                podgroup("r", "a"), pod("r-0", group="r", gpus=4, node_name="n1")])
    fs = compute_fair_share(st)
    ledger = QueueLedger.start(st, fs)
    v = over_limit(fs, ledger, st.q_index["a"], np.array([4.0, 0, 0]))
    assert v is not None and v.reason == "OverLimit" and st.q_names[v.queue] == "dept" and v.bound == 6
    assert over_limit(fs, ledger, st.q_index["a"], np.array([2.0, 0, 0])) is None
    assert "limit" in v.message(st.q_names)


def test_non_preemptible_work_stays_within_deserved() -> None:
    st = state([node("n1", gpus=16), queue("a", gpu=(4, 1, -1)),
                podgroup("r", "a", priority_class="build"), pod("r-0", group="r", gpus=3, node_name="n1")])
    fs = compute_fair_share(st)
    ledger = QueueLedger.start(st, fs)
    a = st.q_index["a"]
    assert fs.allocated_np[a, 0] == 3
    v = non_preemptible_over_quota(fs, ledger, a, np.array([2.0, 0, 0]))
    assert v is not None and v.reason == "NonPreemptibleOverQuota"
    assert capacity_violation(fs, ledger, a, np.array([2.0, 0, 0]), preemptible=True) is None
    assert capacity_violation(fs, ledger, a, np.array([1.0, 0, 0]), preemptible=False) is None


def _reclaim_cluster():
    # a holds 6 GPUs (deserved 2), b is starved (deserved 2) and wants 2
    objs = [node("n1", gpus=8), queue("a", gpu=(2, 1, -1)), queue("b", gpu=(2, 1, -1)),
            podgroup("ja", "a", min_member=2)]
    objs += [pod(f"ja-{i}", group="ja", gpus=1, node_name="n1") for i in range(6)]
    objs += [podgroup("jb", "b", min_member=2)] + [pod(f"jb-{i}", group="jb", gpus=1) for i in range(4)]
    return state(objs)


def test_reclaim_rules() -> None:
    st = _reclaim_cluster()
    fs = compute_fair_share(st)
    ledger = QueueLedger.start(st, fs)
    a, b = st.q_index["a"], st.q_index["b"]
    req = np.array([2.0, 2000, 2 * 2**30])
    # 8 GPUs: each deserves 2; requests 6 and 4 -> over-quota 4 split 2/2 -> fair shares 4 / 4
    assert fs.fair_share[a, 0] == 4 and fs.fair_share[b, 0] == 4
    assert can_reclaim(fs, ledger, b, req, preemptible=True)
    one = np.array([1.0, 1000, 2**30])
    # taking 2 single-pod chunks of a: a stays above its allocatable share (4) -> allowed
    assert reclaimable(fs, ledger, b, req, [(a, one), (a, one)], preemptible=True) is None
    # asking for far more than fair share: the reclaimer would go over its fair share
    big = np.array([6.0, 0, 0])
    assert not can_reclaim(fs, ledger, b, big, preemptible=True)
    assert leveled(ledger, a, b) == (a, b)


def test_reclaim_stops_when_the_victim_queue_reaches_its_share() -> None:
    st = _reclaim_cluster()
    fs = compute_fair_share(st)
    ledger = QueueLedger.start(st, fs)
    a, b = st.q_index["a"], st.q_index["b"]
    one = np.array([1.0, 1000, 2**30])
    # a holds 6 with allocatable 4: the first two chunks are taken while a is above 4; the third finds a at 4
    assert reclaimable(fs, ledger, b, 3 * one, [(a, one)] * 3, preemptible=True) in (
        "VictimQueueBelowFairShare", "ReclaimerOverFairShare")


def test_victim_chunks_split_elastic_pods_from_the_core() -> None:
    reqs = np.array([[1.0, 0, 0]] * 5)
    chunks = victim_chunks(reqs, 3)
    assert len(chunks) == 3 and chunks[-1][0] == 3
    assert len(victim_chunks(reqs, 5)) == 1


@pytest.mark.parametrize("total", [0, 1, 7])
def test_nothing_negative(total: float) -> None:
    assert all(x >= 0 for x in shares(total, [(2, -1, 1, 100, 5), (0, 4, 3, 50, 9)]))


def test_a_department_may_go_over_its_fair_share_reclaiming_from_a_more_saturated_sibling() -> None:
    """d1 ends at 5 of fair share 4 (1.25), d2 at 7 of 4 (1.75): KAI's boundary rule allows it (the reclaimer's
    side needs to stay less saturated than each sibling it takes from, not within its fair share)."""
    st = departments(8)
    fs = compute_fair_share(st)
    ledger = QueueLedger.start(st, fs)
    d1, d2 = st.q_index["d1"], st.q_index["d2"]
    assert fs.fair_share[d1, 0] == 4 and fs.fair_share[d2, 0] == 4
    one = np.array([1.0, 1000, 2**30])
    assert reclaimable(fs, ledger, st.q_index["d1_p1"], one, [(st.q_index["d2_p1"], one)],
                       preemptible=False) is None
    plan, _ = run_cycle(st, Config(engine=Engine.greedy))
    assert [st.pods[e.pod].name.split("-")[0] for e in plan.evictions] == ["d2_p1"]  # the most saturated
    assert [st.pods[p.pod].name for p in plan.placements] == ["inf-0"]


def test_reclaim_refused_when_the_reclaimer_side_ends_as_saturated_as_the_sibling() -> None:
    """d2 runs 5: after one victim it is at 4 of 4 (1.0) while d1 would be at 5 of 4 (1.25): refused."""
    st = departments(5)
    fs = compute_fair_share(st)
    ledger = QueueLedger.start(st, fs)
    one = np.array([1.0, 1000, 2**30])
    assert reclaimable(fs, ledger, st.q_index["d1_p1"], one, [(st.q_index["d2_p1"], one)],
                       preemptible=False) == "ReclaimerOverFairShare"
