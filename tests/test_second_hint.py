"""The second hint with wall time: the FGD-scored greedy plan computed in a process beside the cycle, used as the
model's starting plan when ready, or weighed against the worker's plan at the end."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from kai_opt.bench.instances import Instance
from kai_opt.checker import check_plan
from kai_opt.config import Engine, parse_config
from kai_opt.engine import run_cycle
from kai_opt.formulation import second_hint, solve
from kai_opt.formulation.solve import plan_score
from kai_opt.state import build_state

# the second hint and the worker forked at the cycle start, as on clusters large enough for it
pytestmark = pytest.mark.usefixtures("fork_early")

# the pattern plan off: on this instance it beats the FGD-scored plan, which these tests are about
# (tests/test_pattern_plan.py has the pattern plan with the second hint on)
WALL = {"deterministic": False, "time_budget_s": 3, "seed": 0, "pattern_hint": False}


def _state():
    return build_state(Instance("fragmentation", 200, 0).snapshot())  # FGD scoring dodges some of its traps


def test_the_plan_is_never_worse_than_the_fgd_plan_computed_beside() -> None:
    st = _state()
    config = parse_config({"engine": "cpsat", "solver": WALL})
    kai, fs = run_cycle(st, config, engine=Engine.greedy)
    fgd = second_hint.compute(st, fs, config, None)
    assert fgd is not None and plan_score(st, fs, fgd)[0] > plan_score(st, fs, kai)[0]
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    assert plan.solver is not None and plan.solver.hint in ("kai", "fgd")
    assert plan_score(st, fs, plan)[0] >= plan_score(st, fs, fgd)[0]
    assert not mp.active_children()  # the process beside is gone with the cycle


def test_the_fgd_plan_wins_at_the_end_when_the_model_finds_nothing(monkeypatch) -> None:
    st = _state()
    # the end waits for the plan computed beside only until the deadline: a budget that leaves it time on a loaded
    # machine (it returns as soon as the plan is there)
    config = parse_config({"engine": "cpsat", "solver": {**WALL, "time_budget_s": 15}})
    kai, fs = run_cycle(st, config, engine=Engine.greedy)
    # the worker (forked after these patches) neither takes the plan computed beside nor gets a solution
    monkeypatch.setattr(second_hint.SecondHint, "ready", lambda self: False)
    monkeypatch.setattr(solve, "_inline_is_cheap", lambda *_a: False)  # nor computes it itself
    monkeypatch.setattr(solve, "run_with_watchdog", lambda *a, **k: None)
    plan, _ = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    assert plan.solver.hint == "fgd" and plan.solver.status == "FALLBACK_GREEDY"
    assert "computed beside" in plan.solver.note
    assert plan_score(st, fs, plan)[0] > plan_score(st, fs, kai)[0]
    placed = [{int(st.pod_pg[p.pod]) for p in x.placements if not p.moved} for x in (kai, plan)]
    assert placed[0] <= placed[1]  # every group the KAI-scored plan places


def test_without_the_option_nothing_runs_beside(monkeypatch) -> None:
    st = _state()
    config = parse_config({"engine": "cpsat", "solver": {**WALL, "fgd_hint": False}})
    started = []
    real = second_hint.SecondHint.start.__func__

    def spy(cls, *a, **k):
        out = real(cls, *a, **k)
        started.append(out)
        return out

    monkeypatch.setattr(second_hint.SecondHint, "start", classmethod(spy))
    plan, fs = run_cycle(st, config, engine=Engine.cpsat)
    assert started == [None] and plan.solver.hint == "kai"
    check_plan(st, plan, fs, config)


def test_a_failing_second_hint_is_reported_and_the_cycle_goes_on(monkeypatch) -> None:
    st = _state()
    config = parse_config({"engine": "cpsat", "solver": WALL})

    def broken(*_a, **_k):
        raise RuntimeError("FGD scoring broke")

    monkeypatch.setattr(second_hint, "compute", broken)  # the process beside is forked after this
    monkeypatch.setattr(second_hint.SecondHint, "ready", lambda self: False)  # left for the end of the cycle
    monkeypatch.setattr(solve, "_inline_is_cheap", lambda *_a: False)  # (not computed in the worker instead)
    plan, fs = run_cycle(st, config, engine=Engine.cpsat)
    check_plan(st, plan, fs, config)
    assert plan.solver.hint == "kai" and "second hint failed" in plan.solver.note
    assert "FGD scoring broke" in plan.solver.note


def _sleeper(_send, seconds: float) -> tuple[None, float]:
    import time

    time.sleep(seconds)
    return None, seconds


def _eventually(cond, tries: int = 200) -> bool:
    """cond() polled every 0.05 s until it holds (polled, not timed)."""
    import time

    for _ in range(tries):
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def _slow_hint(seconds: float) -> second_hint.SecondHint:
    from kai_opt.formulation.child import Child

    return second_hint.SecondHint(Child.start(_sleeper, (seconds,)))


def test_the_watch_stops_a_hint_that_can_no_longer_arrive_while_the_cycle_still_runs() -> None:
    import time

    hint = _slow_hint(30.0)
    hint.watch(time.perf_counter(), 0.2)  # the KAI-scored cycle may take at most 0.2 s for the rule to keep it
    assert _eventually(lambda: hint._stopped)  # the watch fires after 0.2 s
    assert not hint.ready() and hint.take() is None
    assert hint.keep_going(5.0, 0.2) is False
    hint.close()
    assert not mp.active_children()


def _watched() -> tuple[second_hint.SecondHint, int]:
    """A hint that never arrives, watched for a 0.2 s budget, and the threads there were before the watch."""
    import threading
    import time

    hint = _slow_hint(30.0)
    before = threading.active_count()
    hint.watch(time.perf_counter(), 0.2)
    return hint, before


def test_a_paused_watch_runs_no_thread_and_fires_when_it_would_have() -> None:
    # the CP-SAT worker is forked inside `paused` (a fork inherits no thread); the watch then still stops the hint
    # at the moment it was set for, not later
    import threading
    import time

    hint, before = _watched()
    assert threading.active_count() == before + 1
    with hint.paused():
        assert threading.active_count() == before
        time.sleep(0.3)  # past the moment: nothing fires while paused
        assert not hint._stopped
    assert _eventually(lambda: hint._stopped)  # armed again for a moment already past: fires at once
    assert hint.keep_going(5.0, 0.2) is False
    hint.close()
    assert not mp.active_children()


def test_a_watch_paused_after_the_cycle_ended_stays_off() -> None:
    import threading
    import time

    hint, before = _watched()
    assert hint.keep_going(0.01, 0.2) is True  # the cycle ended in time: the watch is off
    with hint.paused():
        pass
    time.sleep(0.3)
    assert not hint._stopped and threading.active_count() == before
    hint.close()


def test_the_watch_leaves_a_hint_alone_once_the_cycle_ended_in_time() -> None:
    import time

    hint = _slow_hint(0.5)
    hint.watch(time.perf_counter(), 0.3)
    assert hint.keep_going(0.01, 0.3) is True  # the cycle ended before the limit: the rule keeps the hint
    time.sleep(0.5)  # past the limit: the cancelled watch stops nothing
    assert not hint._stopped
    assert _eventually(hint.ready)
    hint.close()


def test_nothing_is_forked_once_the_watch_would_stop_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # a cycle whose allocate alone ran past budget / (SLOWDOWN - 1) forks no hint only to stop it at once
    import time

    started: list[int] = []
    monkeypatch.setattr(second_hint.SecondHint, "start", classmethod(lambda cls, *a: started.append(1) or None))
    config = parse_config({"engine": "cpsat", "solver": {**WALL, "time_budget_s": 1}})
    st = _state()
    now = time.perf_counter()
    limit = 1 / (second_hint.SLOWDOWN - 1.0)
    assert second_hint.SecondHint.start_watched(st, None, config, None, now - limit - 0.01) is None
    assert not started
    second_hint.SecondHint.start_watched(st, None, config, None, now)
    assert started == [1]


def test_the_watch_keeps_a_hint_that_is_ready_in_time() -> None:
    import time

    hint = _slow_hint(0.0)
    assert _eventually(hint.ready)
    hint.watch(time.perf_counter(), 0.0)  # the limit is now, but the plan is there: keep_going keeps ready plans
    time.sleep(0.2)
    assert not hint._stopped and hint.keep_going(10.0, 0.0) is True
    hint.close()


class _Spent:
    """A process beside that has used `used` CPU seconds."""

    def __init__(self, used: float | None) -> None:
        self.used = used

    def cpu_seconds(self) -> float | None:
        return self.used

    def poll(self, _timeout: float = 0.0) -> bool:
        return False


@pytest.mark.parametrize(("used", "elapsed", "sooner"), [
    (0.35, 0.4, True),  # nearly a core, 0.25 s of 0.6 left: about 0.29 s, sooner than 0.6 s here
    (0.2, 0.4, False),  # half a core, 0.4 s left: 0.8 s, later than computing it here
    (0.0, 0.4, False),  # starved (a loaded machine): never
    (None, 0.4, False),  # its CPU time cannot be read: computed here, as before
])
def test_the_plan_beside_is_waited_for_only_when_it_is_expected_first(used, elapsed, sooner) -> None:
    import time

    from kai_opt.plan import Plan

    hint = second_hint.SecondHint(_Spent(used))  # type: ignore[arg-type]
    hint.started = time.perf_counter() - elapsed
    # 0.3 s of actions: the work is SLOWDOWN x 0.3 = 0.6 s
    greedy = Plan("greedy", phases={"allocate": 0.25, "reclaim": 0.05, "fair_share": 9.0, "total": 9.0})
    assert solve._beside_is_sooner(hint, greedy) is sooner
    if used:
        expected = hint.expected_s(0.6)
        assert expected == pytest.approx((0.6 - used) / (used / elapsed), rel=0.05)


def test_plans_with_the_same_decisions_in_another_order_are_the_same() -> None:
    """second_hint_note skips the measures for an FGD-scored plan that decides exactly what the KAI-scored one
    does: any other device, node, pipelining or eviction makes them differ."""
    from kai_opt.formulation.solve import _same_decisions
    from kai_opt.plan import Eviction, Placement, Plan

    def plan(placements: list, evictions: list) -> Plan:
        return Plan("greedy", placements=placements, evictions=evictions)

    base = [Placement(1, 0, (0,)), Placement(2, 1, (3,), pipelined=True)]
    ev = [Eviction(5, "reclaim", 0)]
    assert _same_decisions(plan(base, ev), plan(base[::-1], ev))
    for other in ([Placement(1, 0, (1,)), base[1]], [Placement(1, 2, (0,)), base[1]],
                  [base[0], Placement(2, 1, (3,))], base[:1]):
        assert not _same_decisions(plan(base, ev), plan(other, ev))
    assert not _same_decisions(plan(base, ev), plan(base, []))
    assert not _same_decisions(plan(base, ev), plan(base, [Eviction(5, "preempt", 0)]))
