"""`victim_search: cheapest` (kai_opt/heuristics/cheapest_victims.py) on the scale instance at 1,000 nodes: the plan
passes the checker, and every reclaim in it passes KAI's own reclaim predicates at its turn, on a ledger that
follows the plan's decisions in their order (the victims differ from KAI's search; the rules may not)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from builders import node, pod, podgroup, queue, state

from kai_opt.actions import ACTION_BY_NAME
from kai_opt.checker import check_plan
from kai_opt.config import Config, Engine
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.reclaim import can_reclaim, reclaimable, victim_chunks
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.plan import Plan
from kai_opt.snapshot import RawObject
from kai_opt.state import ClusterState, build_state
from models.generators import as_snapshot, scale

CHEAPEST = Config(engine=Engine.greedy, victim_search="cheapest")


def test_reclaims_pass_kais_predicates_in_turn() -> None:
    st = build_state(as_snapshot(scale(1000, 10_000, 1000, 0)))
    fs = compute_fair_share(st)
    plan = greedy_plan(st, fs, CHEAPEST)
    check_plan(st, plan, fs, CHEAPEST)
    reclaim = ACTION_BY_NAME["reclaim"].eviction_reason
    moved = {p.pod for p in plan.placements if p.moved}  # victims re-placed: they keep running, no victims
    by_group: dict[int, list[int]] = {}
    for e in plan.evictions:
        if e.reason == reclaim and e.pod not in moved:
            by_group.setdefault(e.beneficiary, []).append(e.pod)
    assert by_group, "the instance has reclaims under this search"
    placed: dict[int, list[tuple[int, int]]] = {}
    for p in plan.placements:
        if not p.moved:
            placed.setdefault(int(st.pod_pg[p.pod]), []).append((p.pod, p.node))
    ledger = QueueLedger.start(st, fs)
    verdicts: dict[str, int] = {}
    for g in plan.turns:
        q, preemptible = int(st.pg_queue[g]), bool(st.pg_preemptible[g])
        pods = placed.get(g, [])
        request = st.pod_queue_request(np.array([p for p, _ in pods]), np.array([n for _, n in pods])).sum(axis=0)
        chunks: list[tuple[int, np.ndarray]] = []
        for v in dict.fromkeys(int(st.pod_pg[p]) for p in by_group.get(g, [])):
            gone = np.array([p for p in by_group[g] if int(st.pod_pg[p]) == v])
            chunks += [(int(st.pg_queue[v]), c) for c in victim_chunks(
                st.pod_queue_request(gone, st.pod_node[gone]), int(st.pg_min_member[v]))]
        if g in by_group:
            why = None if can_reclaim(fs, ledger, q, request, preemptible=preemptible) else "can_reclaim"
            why = why or reclaimable(fs, ledger, q, request, chunks, preemptible=preemptible,
                                     saturation_multiplier=CHEAPEST.reclaim_saturation_multiplier)
            verdicts[why or "allowed"] = verdicts.get(why or "allowed", 0) + 1
        ledger.add(q, request, non_preemptible=not preemptible)
        for vq, c in chunks:
            ledger.add(vq, -c, non_preemptible=False)
    assert verdicts == {"allowed": len(by_group)}


def test_auto_is_kais_search_below_its_size_and_the_cheapest_victims_from_it() -> None:
    cfg = Config()
    assert cfg.victim_search == "auto"
    assert cfg.victim_search_for(cfg.victim_search_auto_nodes - 1) == "kai"
    assert cfg.victim_search_for(cfg.victim_search_auto_nodes) == "cheapest"
    assert Config(victim_search="kai").victim_search_for(10**6) == "kai"
    assert Config(victim_search="cheapest").victim_search_for(1) == "cheapest"
    st = build_state(as_snapshot(scale(1000, 10_000, 1000, 0)))
    fs = compute_fair_share(st)

    def decisions(cfg: Config) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
        plan = greedy_plan(st, fs, cfg)
        return sorted((p.pod, p.node) for p in plan.placements), sorted((e.pod, e.reason) for e in plan.evictions)

    kai, cheapest = decisions(Config(engine=Engine.greedy, victim_search="kai")), decisions(CHEAPEST)
    assert kai != cheapest, "the instance tells the two searches apart"
    assert decisions(Config(engine=Engine.greedy)) == kai  # 1,000 nodes: below the default size
    assert decisions(Config(engine=Engine.greedy, victim_search_auto_nodes=1000)) == cheapest



def test_a_search_places_once_on_the_state_it_found_when_victims_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenarios whose victims all come back (their jobs go first) leave the session as the search found it: the
    placement that failed there is not tried again on that same state within the search (it is deterministic)."""
    import kai_opt.heuristics.actions.base as base
    from kai_opt.heuristics import cheapest_victims as cv
    from kai_opt.heuristics.gang import GangPlacer

    st = build_state(as_snapshot(scale(1000, 10_000, 1000, 0)))
    fs = compute_fair_share(st)
    cfg = Config(engine=Engine.greedy, victim_search="cheapest")
    import itertools

    numbers = itertools.count(1)
    searches: list[int] = []  # the running search's number (empty: outside a search)
    failed: dict[tuple[int, int, bytes, bytes], int] = {}  # (search, group, statuses, ledger) -> failed placements
    place, solve = GangPlacer.place, cv.solve_cheapest

    def counted_place(self: GangPlacer, g: int, tasks: list[int], **kw: object) -> object:
        out = place(self, g, tasks, **kw)  # type: ignore[arg-type]
        if searches and not out.ok:
            key = (searches[-1], g, self.sess.status.tobytes(), self.sess.ledger.allocated.tobytes())
            failed[key] = failed.get(key, 0) + 1
        return out

    def counted_solve(*a: object, **kw: object) -> object:
        searches.append(next(numbers))
        try:
            return solve(*a, **kw)  # type: ignore[arg-type]
        finally:
            searches.pop()

    monkeypatch.setattr(GangPlacer, "place", counted_place)
    monkeypatch.setattr(base, "solve_cheapest", counted_solve)
    plan = greedy_plan(st, fs, cfg)
    check_plan(st, plan, fs, cfg)
    assert failed, "the instance has searches whose placement fails"
    again = [g for (_, g, _, _), n in failed.items() if n > 1]
    assert not again, f"placed again on a state that failed in the same search: groups {sorted(set(again))[:5]}"


def _no_consolidation(search: str) -> Config:
    """The greedy engine with this victim search and without consolidation (which would make these cases' room by
    moving pods before reclaim runs)."""
    cfg = Config(engine=Engine.greedy, victim_search=search)
    return cfg.model_copy(update={"actions": cfg.actions.model_copy(update={"consolidate": False})})


def _checked_plan(st: ClusterState, search: str) -> Plan:
    fs = compute_fair_share(st)
    cfg = _no_consolidation(search)
    plan = greedy_plan(st, fs, cfg)
    check_plan(st, plan, fs, cfg)
    return plan


def _decisions(st: ClusterState, search: str) -> tuple[list[tuple[str, int, tuple[int, ...], bool]], list[str]]:
    plan = _checked_plan(st, search)
    return ([(st.pods[p.pod].key, p.node, p.devices, p.moved) for p in plan.placements],
            [st.pods[e.pod].key for e in plan.evictions])


def _queues_a_over_b(quota: int = 10) -> list[RawObject]:
    """Queue a (no quota) runs the victims; queue b (`quota` GPUs) has, beside the cases' pending job, demand
    beyond that no node takes, so a is over its fair share and b may reclaim."""
    return [queue("a", gpu=(0, 1, -1)), queue("b", gpu=(quota, 1, -1)), podgroup("big", "b", created_min=1),
            pod("big-0", group="big", gpus=quota - 2, queue_name="b", nodeSelector={"pool": "none"})]


def _running(placed: list[tuple[str, str, float]], **annotations: str) -> list[RawObject]:
    """One single-pod group of queue a per (name, node, GPUs); `annotations`: a pod's GPU devices, by name."""
    out: list[RawObject] = []
    for name, n, gpus in placed:
        ann = {"kai-opt.io/gpu-devices": annotations[name]} if name in annotations else None
        out += [podgroup(name, "a"), pod(name, group=name, gpus=gpus, node_name=n, queue_name="a", annotations=ann)]
    return out


def test_a_share_that_fits_no_device_looks_for_victims() -> None:
    """A node whose free milli-GPUs sum to more than a share needs, spread over devices none of which holds it: the
    scan's sum says it fits without victims, the placer finds no device. The search then asks for a whole device
    and finds the plan KAI's search makes: a share reclaimed and moved next to the other one, the pending share on
    the device it left (before: the search gave up without trying victims)."""
    objs = [node("n0", gpus=4), *_queues_a_over_b(), podgroup("b", "b"),
            pod("b-0", group="b", gpus=0.75, queue_name="b")]
    objs += _running([("a0", "n0", 0.5), ("a1", "n0", 0.5), ("a2", "n0", 1), ("a3", "n0", 1)],
                     a0="0", a1="1", a2="2", a3="3")
    st = state(objs)
    kai = _decisions(st, "kai")
    assert kai == ([("default/b-0", 0, (0,), False), ("default/a0", 0, (1,), True)], ["default/a0"])
    assert _decisions(st, "cheapest") == kai


def _racks_and_a_gang(running: list[RawObject], racks: int = 3, per_rack: int = 2,
                      pod_cpu: str = "1", quota: int = 10) -> ClusterState:
    """`racks` racks of `per_rack` 2-GPU nodes (two each: n0-n1, n2-n3, ...), `running` on them, and queue b's gang
    g of two whole-node pods (`pod_cpu` CPUs each) that must share a rack."""
    objs = [RawObject("Topology", {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": "rack"}]}})]
    objs += [node(f"n{i}", gpus=2, labels={"rack": f"r{i // per_rack}"}) for i in range(per_rack * racks)]
    objs += [*_queues_a_over_b(quota), *running]
    objs += [podgroup("g", "b", min_member=2, topologyConstraint={"topology": "t", "requiredTopologyLevel": "rack"})]
    objs += [pod(f"g-{i}", group="g", gpus=2, cpu=pod_cpu, queue_name="b") for i in range(2)]
    return state(objs)


def test_a_gang_with_a_required_rack_reclaims_inside_one_rack() -> None:
    """The scan over every node finds room for the gang's two whole-node pods on two racks (one cheap victim
    each); the placer must put both in one rack. The search then prices one rack at a time and finds the plan
    KAI's search makes: the victims of rack r0, one of them moved to the free GPU on r1 (before: the gang stayed
    pending)."""
    st = _racks_and_a_gang(_running([("a0", "n0", 1), ("a1", "n1", 2), ("a2", "n2", 2), ("a3", "n3", 1),
                                     ("a4", "n4", 2), ("a5", "n5", 2)]))
    kai = _decisions(st, "kai")
    assert kai == ([("default/g-0", 1, (0, 1), False), ("default/g-1", 0, (1, 0), False),
                    ("default/a0", 3, (1,), True)], ["default/a0", "default/a1"])
    assert _decisions(st, "cheapest") == kai


def test_of_the_racks_that_could_hold_the_gang_the_cheapest_is_tried_first() -> None:
    """Rack r0 has the most room free, but its only victim is a job that also runs on r2 (4 GPUs evicted); on r1
    two single pods make the room (3 GPUs). The search prices the racks and takes r1, as KAI's search does."""
    x = [podgroup("x", "a", min_member=2)]
    x += [pod(f"x-{i}", group="x", gpus=2, node_name=n, queue_name="a") for i, n in enumerate(("n1", "n5"))]
    st = _racks_and_a_gang(_running([("a0", "n2", 1), ("a1", "n3", 2), ("a2", "n4", 2)]) + x)
    plan = _checked_plan(st, "cheapest")
    assert sorted(st.pods[e.pod].key for e in plan.evictions) == ["default/a0", "default/a1"]
    assert {st.node_names[p.node] for p in plan.placements if not p.moved} == {"n2", "n3"}


def test_the_domains_priced_are_those_that_can_take_a_task_and_no_more_batches_than_scenarios(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Six racks of three nodes whose summed room could hold the gang's two 2-GPU, 40-CPU pods. On r0 no node can
    take one (30 of its 64 CPUs held by a pod that is no victim on each); on r1-r5 the first node can, once its
    victim goes, the other two keep too few CPUs. The rack search prices r1-r5 only, and no more batches of them
    than the search has scenarios."""
    import kai_opt.heuristics.cheapest_victims as cv

    racks = range(6)
    running = [podgroup("keep", "a", priority_class="build", preemptible=False)]
    held = [f"n{3 * r + i}" for r in racks for i in (0, 1, 2) if r == 0 or i > 0]
    running += [pod(f"keep-{n}", group="keep", cpu="30", node_name=n, queue_name="a") for n in held]
    running += _running([(f"v{r}", f"n{3 * r}", 2) for r in racks if r > 0])
    st = _racks_and_a_gang(running, racks=6, per_rack=3, pod_cpu="40", quota=32)
    scanned: list[frozenset[str]] = []
    scan = cv._scan

    def counting(sess: Any, tasks: list[int], live: np.ndarray, feasible: np.ndarray, whole: bool) -> Any:
        scanned.append(frozenset(st.node_names[n] for n in np.flatnonzero(feasible)))
        return scan(sess, tasks, live, feasible, whole)

    monkeypatch.setattr(cv, "_scan", counting)
    assert not _checked_plan(st, "cheapest").evictions
    in_racks = [s for s in scanned if len(s) == 3]  # (the whole-cluster scans see every node)
    assert sorted(in_racks, key=sorted) == sorted((frozenset(f"n{3 * r + i}" for i in (0, 1, 2)) for r in racks
                                                   if r > 0), key=sorted)
    scanned.clear()
    one = _no_consolidation("cheapest").model_copy(update={"max_victim_scenarios": 1})
    greedy_plan(st, compute_fair_share(st), one)
    assert len([s for s in scanned if len(s) == 3]) == cv.DOMAIN_BATCH
