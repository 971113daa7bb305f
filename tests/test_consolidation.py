"""Consolidation as KAI runs it (kai_opt/heuristics/consolidation.py): capacity-only admission, by-node scenarios,
the scenario simulated in allocation order (victims back home keep their devices), KAI's node order inside it, the
pending job's tasks solved one more at a time."""

from __future__ import annotations

from builders import node, pod, podgroup, queue, state

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.consolidation import _IdleGpus
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan
from kai_opt.state import ClusterState

GREEDY = Config(engine=Engine.greedy)


def _consolidate(objs: list) -> tuple[ClusterState, Plan]:
    st = state(objs)
    plan, _ = run_cycle(st, GREEDY, actions=("consolidate",))  # the checker holds
    return st, plan


def _summary(st: ClusterState, plan: Plan) -> tuple[dict[str, tuple[str, tuple[int, ...], bool]], list[str]]:
    """(pod -> (node, devices, moved)) and the evicted pods."""
    placed = {st.pods[p.pod].name: (st.node_names[p.node], p.devices, p.moved) for p in plan.placements}
    return placed, sorted(st.pods[e.pod].name for e in plan.evictions)


def _two_queues(pending_first: bool = False) -> list:
    """KAI's consolidation/021 on two 4-GPU nodes: q0 runs j0 (2 GPUs, n0), q1 runs j1 (1 GPU, n0) and j2 (3 GPUs,
    n1); p (q0, 2 GPUs) waits. q0 deserves 1 GPU and gets no over-quota share: with p it would hold 4."""
    objs = [node("n0", gpus=4), node("n1", gpus=4), queue("q0", gpu=(1, 0, -1)), queue("q1", gpu=(1, 0, -1)),
            podgroup("j0", "q0", created_min=1), pod("j0-0", "j0", gpus=2, node_name="n0"),
            podgroup("j1", "q1", created_min=2), pod("j1-0", "j1", gpus=1, node_name="n0"),
            podgroup("j2", "q1", created_min=3), pod("j2-0", "j2", gpus=3, node_name="n1"),
            podgroup("p", "q0", created_min=0 if pending_first else 4), pod("p-0", "p", gpus=2)]
    return objs


def test_consolidation_admits_work_over_its_fair_share_and_simulates_by_node() -> None:
    """KAI admits a consolidation on idle GPUs alone (its AllocateJob checks the queue's capacity, not its fair
    share). Victims accumulate j2, j0, j1; the scenario of j1's node evicts j0 and j1 only (not j2, on another
    node), and in allocation order j0 (q0, now at 0, older than p) goes back to n0 on its own devices, p takes
    n0's other two GPUs and j1 moves to n1: one pod moved, nothing else evicted."""
    st, plan = _consolidate(_two_queues())
    placed, evicted = _summary(st, plan)
    assert evicted == ["j1-0"]
    assert placed["j1-0"][0] == "n1" and placed["j1-0"][2]
    assert placed["p-0"][0] == "n0" and not placed["p-0"][2]
    j0_devices = {int(d) - int(st.dev_start[0]) for d in st.pod_devices(st.pod_index["default/j0-0"])}
    assert set(placed["p-0"][1]).isdisjoint(j0_devices)


def test_a_victim_back_home_keeps_its_devices_when_the_pending_job_took_them_first() -> None:
    """p older than j0: in allocation order p is placed first, on n0, where the device choice may take one of
    j0's devices; j0 then goes back home by count (KAI counts whole GPUs), so it keeps running on its own
    devices and p gets the two others."""
    st, plan = _consolidate(_two_queues(pending_first=True))
    placed, evicted = _summary(st, plan)
    assert evicted == ["j1-0"] and placed["j1-0"][0] == "n1"
    j0_devices = {int(d) - int(st.dev_start[0]) for d in st.pod_devices(st.pod_index["default/j0-0"])}
    assert placed["p-0"][0] == "n0" and len(placed["p-0"][1]) == 2
    assert set(placed["p-0"][1]).isdisjoint(j0_devices)


def test_a_victim_moves_to_the_fullest_node_counting_releasing_room_as_free() -> None:
    """KAI's consolidation/022: j0 (2 GPUs, n0) and j1 (higher priority, 2 GPUs, n1); p needs 3. Evicting j0 makes
    n0 hold 2 idle and 2 releasing GPUs; KAI's bin-pack measures what is not allocated (idle plus releasing), so
    j0 goes to n1 (2 free) rather than back to n0 (4), and p takes n0."""
    objs = [node("n0", gpus=4), node("n1", gpus=4), queue("q", gpu=(2, 0, -1)),
            podgroup("j0", "q", created_min=1), pod("j0-0", "j0", gpus=2, node_name="n0"),
            podgroup("j1", "q", priority_class="build-preemptible", created_min=2),
            pod("j1-0", "j1", gpus=2, node_name="n1"),
            podgroup("p", "q", created_min=3), pod("p-0", "p", gpus=3)]
    st, plan = _consolidate(objs)
    placed, evicted = _summary(st, plan)
    assert evicted == ["j0-0"]
    assert placed["j0-0"][0] == "n1" and placed["p-0"][0] == "n0"


def test_a_gang_is_solved_one_more_task_at_a_time_with_the_victims_moved_so_far() -> None:
    """Two 4-GPU pods on nodes where v0 and v1 (1 GPU each) sit; n2 has room for both. The first task's solution
    moves v0 (recorded); the second task's scenarios evict it again and add v1: both move to n2."""
    objs = [node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=2), queue("q", gpu=(10, 1, -1)),
            podgroup("v0", "q", created_min=1), pod("v0-0", "v0", gpus=1, node_name="n0"),
            podgroup("v1", "q", created_min=2), pod("v1-0", "v1", gpus=1, node_name="n1"),
            podgroup("g", "q", min_member=2, created_min=3), pod("g-0", "g", gpus=4), pod("g-1", "g", gpus=4)]
    st, plan = _consolidate(objs)
    placed, evicted = _summary(st, plan)
    assert evicted == ["v0-0", "v1-0"]
    assert placed["v0-0"][0] == placed["v1-0"][0] == "n2"
    assert {placed["g-0"][0], placed["g-1"][0]} == {"n0", "n1"}


def test_the_idle_gpu_filter_matches_tasks_to_the_freest_nodes_greedily() -> None:
    """KAI's accumulated idle-GPUs filter: each task's GPUs, largest first, on one of the len(tasks) nodes with the
    most GPUs idle or releasing once the accumulated victims are gone."""
    objs = [node("a", gpus=3), node("b", gpus=2), node("c", gpus=2), queue("q", gpu=(10, 1, -1)),
            podgroup("x", "q"), pod("x-0", "x", gpus=1, node_name="b"),
            podgroup("y", "q"), pod("y-0", "y", gpus=2, node_name="c"),
            podgroup("g", "q", min_member=2), pod("g-0", "g", gpus=2), pod("g-1", "g", gpus=2)]
    st = state(objs)
    sess = Session(st, compute_fair_share(st), GREEDY)
    g0, g1 = st.pod_index["default/g-0"], st.pod_index["default/g-1"]
    idle = _IdleGpus(sess, [g0, g1])
    assert not idle.ok()  # a: 3 free, b: 1, c: 0 -> the second 2-GPU task fits on neither of the top two
    idle.add([st.pod_index["default/x-0"]])
    assert idle.ok()  # b: 2


def test_a_group_of_an_unknown_queue_is_never_a_victim() -> None:
    # orphan's queue does not exist (QueueDoesNotExist: not in KAI's session), so its running pods use capacity but
    # are neither moved by consolidation nor reclaimed; the 2-GPU job that would need orphan-0 moved stays pending
    objs = [node("n", gpus=2), node("m", gpus=2), queue("q", gpu=(4, 1, -1))]
    objs += [podgroup("orphan", "missing"), pod("orphan-0", group="orphan", gpus=1, node_name="n"),
             podgroup("other", "q"), pod("other-0", group="other", gpus=1, node_name="m")]
    objs += [podgroup("want", "q", created_min=1), pod("want-0", group="want", gpus=2)]
    st = state(objs)
    for actions in (("consolidate",), ("reclaim",), None):
        plan, _ = run_cycle(st, GREEDY, actions=actions)
        placed, evicted = _summary(st, plan)
        assert "orphan-0" not in placed and "orphan-0" not in evicted, actions


def _room_for_another_queue(a_waits: bool) -> list:
    """n0 (2 GPUs) runs two half-GPU shares of queue a, one per device; p (queue b, fair share 0) waits for a whole
    GPU. With `a_waits`, a also waits for 2 GPUs that cannot fit: a stays below its fair share (2) with unmet
    demand; without it a holds exactly its share (1, all it asks for)."""
    objs = [node("n0", gpus=2), queue("a", gpu=(2, 0, -1)), queue("b", gpu=(0, 0, -1)),
            podgroup("s", "a", min_member=2, created_min=1),
            pod("s-0", "s", gpus=0.5, node_name="n0"), pod("s-1", "s", gpus=0.5, node_name="n0"),
            podgroup("p", "b", created_min=2), pod("p-0", "p", gpus=1)]
    if a_waits:
        objs += [podgroup("big", "a", created_min=3), pod("big-0", "big", gpus=2)]
    return objs


def test_no_move_of_a_queue_below_its_fair_share_for_work_over_its_own() -> None:
    """p would leave b over its fair share: a share of queue a moves for it only when a holds its fair share. A
    queue below its share with demand is entitled to the room (and a moved pod that failed to land would reclaim
    it back: the settle property's consolidate / reclaim loop)."""
    st, plan = _consolidate(_room_for_another_queue(a_waits=False))
    placed, evicted = _summary(st, plan)
    assert len(evicted) == 1 and placed["p-0"][0] == "n0"
    st, plan = _consolidate(_room_for_another_queue(a_waits=True))
    assert not plan.evictions and not plan.placements
