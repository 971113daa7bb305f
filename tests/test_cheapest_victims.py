"""`victim_search: cheapest` (kai_opt/heuristics/cheapest_victims.py) on the scale instance at 1,000 nodes: the plan
passes the checker, and every reclaim in it passes KAI's own reclaim predicates at its turn, on a ledger that
follows the plan's decisions in their order (the victims differ from KAI's search; the rules may not)."""

from __future__ import annotations

import numpy as np
import pytest

from kai_opt.actions import ACTION_BY_NAME
from kai_opt.checker import check_plan
from kai_opt.config import Config, Engine
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.reclaim import can_reclaim, reclaimable, victim_chunks
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.state import build_state
from models.generators import as_snapshot, scale

CHEAPEST = Config(engine=Engine.greedy, victim_search="cheapest")


def test_reclaims_pass_kais_predicates_in_turn() -> None:
    st = build_state(as_snapshot(scale(1000, 10_000, 1000, 0)))
    fs = compute_fair_share(st)
    plan = greedy_plan(st, fs, CHEAPEST)
    check_plan(st, plan, fs, CHEAPEST)
    reclaim = ACTION_BY_NAME["reclaim"].eviction_reason
    by_group: dict[int, list[int]] = {}
    for e in plan.evictions:
        if e.reason == reclaim:
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
