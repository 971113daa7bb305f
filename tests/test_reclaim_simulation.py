"""KAI's scenario simulation in reclaim: the pending jobs, the evicted victims' jobs and the reclaimer are
allocated in allocate's job order, so a victim job that order pops before the reclaimer takes its room back and
the scenario fails (KAI's integration case "queue0 is over quota, queue1 is under quota, yet we don't reclaim
because allocate will cause a loop"). Both engines."""

from __future__ import annotations

import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle


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
