"""KAI's scenario simulation in reclaim: the pending jobs, the evicted victims' jobs and the reclaimer are
allocated in allocate's job order, so a victim job that order pops before the reclaimer takes its room back and
the scenario fails (KAI's integration case "queue0 is over quota, queue1 is under quota, yet we don't reclaim
because allocate will cause a loop"). Both engines."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.heuristics import victims
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.session import Session
from kai_opt.state import PodStatus, build_state


def _cluster(with_big_head: bool) -> list:
    """One 4-GPU node, full: queue0 (fair share 2) runs 3 GPUs, queue1 (fair share 2) runs 1. queue1's
    pending_job1 (1 GPU) may reclaim (1 + 1 <= 2). With `with_big_head`, queue1's next job in allocate's order is
    pending_job0 (3 GPUs), so its dominant share counting that job (4 / 2) is above queue0's with its evicted
    victim (3 / 2): queue0 goes first and takes the GPU back."""
    objs = [node("node0", gpus=4),
            queue("dept", gpu=(-1, 1, -1)),
            queue("queue0", "dept", gpu=(2, 2, -1)), queue("queue1", "dept", gpu=(2, 2, -1), created_min=1),
            podgroup("running_job0", "queue0"), pod("running_job0-0", "running_job0", gpus=2, node_name="node0"),
            podgroup("running_job1", "queue0", created_min=1),
            pod("running_job1-0", "running_job1", gpus=1, node_name="node0"),
            podgroup("running_job2", "queue1", created_min=2),
            pod("running_job2-0", "running_job2", gpus=1, node_name="node0"),
            podgroup("pending_job1", "queue1", created_min=4), pod("pending_job1-0", "pending_job1", gpus=1),
            podgroup("pending_job2", "queue0", created_min=5), pod("pending_job2-0", "pending_job2", gpus=1)]
    if with_big_head:
        objs += [podgroup("pending_job0", "queue1", created_min=3), pod("pending_job0-0", "pending_job0", gpus=3)]
    return objs


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_no_reclaim_when_the_victim_queue_would_take_its_room_back(engine: Engine) -> None:
    st = state(_cluster(with_big_head=True))
    plan, _ = run_cycle(st, Config(), engine=engine)
    assert not plan.evictions, [st.pods[e.pod].name for e in plan.evictions]


@pytest.mark.parametrize("engine", [Engine.greedy, Engine.cpsat])
def test_reclaim_when_the_reclaimer_queue_goes_first(engine: Engine) -> None:
    st = state(_cluster(with_big_head=False))  # queue1's next job is pending_job1: 1 + 1 within deserved
    plan, _ = run_cycle(st, Config(), engine=engine)
    assert [e.reason for e in plan.evictions] == ["reclaim"]
    assert {st.pods[p.pod].name for p in plan.placements} == {"pending_job1-0"}


class _PlainOrder(JobQueue):
    """JobQueue with the victims' requests fixed to what the scenario evicted of them."""

    def __init__(self, sess: Session, jobs: list[int], fixed: dict[int, np.ndarray]) -> None:
        self._fixed = fixed
        super().__init__(sess, jobs)

    def request(self, g: int) -> np.ndarray:
        r = self._fixed.get(g)
        return r if r is not None else super().request(g)


def _plain_simulation(sess: Session, g: int, accumulated: list[list[int]]) -> set[int]:
    """KAI's scenario simulation done literally: every pending job, the victim jobs and the preemptor in one
    JobQueue, popped until the preemptor (or every victim) pops; victims popped first go back."""
    st = sess.state
    chunks: dict[int, list[int]] = {}
    for i, c in enumerate(accumulated):
        chunks.setdefault(int(st.pod_pg[c[0]]), []).append(i)
    pods = np.flatnonzero((sess.status == PodStatus.PENDING) & (st.pod_pg >= 0))
    pending = [int(x) for x in np.unique(st.pod_pg[pods]).tolist() if st.pg_problem[x] is None]
    assert g in pending
    fixed = {v: sess.queue_request([p for i in idx for p in accumulated[i]]).sum(axis=0) for v, idx in chunks.items()}
    jq = _PlainOrder(sess, [x for x in pending if x not in chunks] + list(chunks), fixed)
    ahead: set[int] = set()
    left = len(chunks)
    while left:
        h = jq.pop()
        if h is None or h == g:
            break
        if h in chunks:
            sess.unevict_many([p for i in chunks[h] for p in accumulated[i]])
            ahead.update(chunks[h])
            left -= 1
    return ahead


def _check_against_plain(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make every reclaim scenario run both victims._victims_ahead and the literal simulation and assert they put
    back the same victims; returns the counts of scenarios and of those that put some back (filled as they run)."""
    fast = victims._victims_ahead
    seen = {"scenarios": 0, "put_back": 0}

    def both(sess: Session, g: int, accumulated: list[list[int]], po: Any) -> set[int]:
        cp = sess.checkpoint()
        want = _plain_simulation(sess, g, accumulated)
        sess.rollback(cp)
        got = fast(sess, g, accumulated, po)
        assert got == want, (sess.state.pg_keys[g], sorted(got ^ want))
        seen["scenarios"] += 1
        seen["put_back"] += bool(got)
        return got

    monkeypatch.setattr(victims, "_victims_ahead", both)
    return seen


@pytest.mark.parametrize("instance", ["contention:30:0", "contention:30:1", "contention:30:2", "openb:30:0",
                                      "openb:30:2", "fractions:30:0", "gangs:200:2",
                                      "openb:100:0", "openb:200:0", "contention:200:2"])
def test_the_simulation_pops_as_one_plain_job_queue(instance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """victims._victims_ahead (per-state pending order, only the subtrees that can decide, queue order rules 1-2
    without popping) puts back exactly the victims a literal JobQueue simulation does, in every reclaim scenario
    of a cycle."""
    from models.generators import FAMILIES, as_snapshot

    fam, nodes, seed = instance.split(":")
    st = build_state(as_snapshot(FAMILIES[fam].generate(int(nodes), int(seed))))
    seen = _check_against_plain(monkeypatch)
    run_cycle(st, Config(), engine=Engine.greedy)
    assert seen["scenarios"] > 0


def _tie_prone_cluster(rng: random.Random) -> list:
    """Sibling queues alike in everything but their names (created together, one quota), full nodes, and pending
    jobs of one or two GPUs: queue keys often tie exactly, so the walk's tie rule decides between siblings."""
    nodes = rng.randint(2, 3)
    objs = [node(f"n{i}", gpus=4) for i in range(nodes)]
    depts = rng.randint(1, 2)
    leaves = []
    for d in range(depts):
        objs.append(queue(f"d{d}", gpu=(-1, 1, -1)))
        for i in range(rng.randint(2, 4)):
            leaves.append(f"d{d}q{i}")
            objs.append(queue(leaves[-1], f"d{d}", gpu=(1, 1, -1)))
    free = [4] * nodes
    for j in range(4 * nodes):  # running 1-GPU jobs fill the nodes
        n = j % nodes
        if free[n] and rng.random() < 0.9:
            q = rng.choice(leaves[: max(1, len(leaves) // 2)] if rng.random() < 0.7 else leaves)
            objs += [podgroup(f"r{j}", q, created_min=rng.randint(0, 3)),
                     pod(f"r{j}-0", f"r{j}", gpus=1, node_name=f"n{n}", started_min_ago=600)]
            free[n] -= 1
    for j in range(rng.randint(6, 16)):
        objs += [podgroup(f"p{j}", rng.choice(leaves), created_min=rng.randint(4, 6)),
                 pod(f"p{j}-0", f"p{j}", gpus=rng.choice([1, 1, 2]))]
    return objs


def test_the_simulation_pops_as_one_plain_job_queue_when_keys_tie(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuzz: the same check on small random clusters whose sibling queues are alike, where keys tie and the
    shortcut that pops along the last path (_Simulation.pop_along) must leave ties to the walk."""
    seen = _check_against_plain(monkeypatch)
    rng = random.Random(17)
    for _ in range(150):
        run_cycle(state(_tie_prone_cluster(rng)), Config(), engine=Engine.greedy)
    assert seen["scenarios"] > 100 and seen["put_back"] > 10, seen
