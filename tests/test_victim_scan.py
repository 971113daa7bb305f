"""The cheapest-victims scan (kai_opt/heuristics/victim_scan.py): the numba-compiled loops, the same loops run by
Python, and the numpy form take the same decisions on random victim units, rooms and tasks; and hand-made cases
pin what the decisions are."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pytest
from builders import run_cli
from hypothesis import given, settings
from hypothesis import strategies as hs

from kai_opt import compiled
from kai_opt.compiled import Kernel
from kai_opt.config import Config, Engine
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics import victim_scan as vs
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.state import build_state
from models.generators import as_snapshot, scale

WIDTH = 5  # cpu, memory, gpu, pods, whole GPU devices


def _instance(n_nodes: int, units: list[tuple[int, int, int, list[int]]], room: list[list[int]],
              feasible: list[bool], live: list[bool], reqs: list[list[int]]) -> tuple[np.ndarray, ...]:
    """scan's arguments from units (group, node, cost, frees), sorted as victim_units sorts them."""
    order = sorted(range(len(units)), key=lambda u: (units[u][1], units[u][2], units[u][0]))
    group = np.array([units[u][0] for u in order], dtype=np.int64)
    node = np.array([units[u][1] for u in order], dtype=np.int64)
    cost = np.array([units[u][2] for u in order], dtype=np.int64)
    frees = np.array([units[u][3] for u in order], dtype=np.int64).reshape(len(units), WIDTH)
    n_groups = int(group.max()) + 1 if len(group) else 1
    by_group = np.argsort(group, kind="stable").astype(np.int64)
    return (np.array(reqs, dtype=np.int64).reshape(len(reqs), WIDTH), np.array(feasible, dtype=bool),
            np.array(room, dtype=np.int64).reshape(n_nodes, WIDTH), np.array([live[u] for u in order], dtype=bool),
            node, group, frees, cost,
            np.searchsorted(group[by_group], np.arange(n_groups + 1)).astype(np.int64), by_group)


@hs.composite
def instances(draw: hs.DrawFn) -> tuple[np.ndarray, ...]:
    n_nodes = draw(hs.integers(1, 7))
    n_groups = draw(hs.integers(1, 6))
    amount = hs.integers(0, 4)
    units: dict[tuple[int, int], tuple[int, int, int, list[int]]] = {}
    for _ in range(draw(hs.integers(0, 20))):  # one unit per (group, node); a group's cost is the same everywhere
        g, n = draw(hs.integers(0, n_groups - 1)), draw(hs.integers(0, n_nodes - 1))
        units[(g, n)] = (g, n, 0, [draw(amount) for _ in range(WIDTH)])
    cost_of = [draw(hs.integers(0, 8)) for _ in range(n_groups)]
    unit_list = [(g, n, cost_of[g], f) for g, n, _, f in units.values()]
    room = [[draw(hs.integers(-1, 4)) for _ in range(WIDTH)] for _ in range(n_nodes)]
    feasible = [draw(hs.booleans()) for _ in range(n_nodes)]
    # a unit may go only on a feasible node (cheapest_victims' mask)
    live = [draw(hs.booleans()) and feasible[n] for _, n, _, _ in unit_list]
    # a few distinct requests, repeated as a gang's tasks repeat theirs (the scan keeps prices per request)
    task = hs.lists(hs.integers(0, 4), min_size=WIDTH, max_size=WIDTH)
    kinds = draw(hs.lists(hs.one_of(task, hs.sampled_from([[1, 1, 0, 1, 2], [1, 1, 0, 1, 1]])), min_size=1,
                          max_size=3))
    reqs = draw(hs.lists(hs.sampled_from(kinds), min_size=1, max_size=6))
    return _instance(n_nodes, unit_list, room, feasible, live, reqs)


def _run(fn: vs.ScanFn, args: tuple[np.ndarray, ...]) -> tuple[int, list[int]]:
    status, chosen = fn(*[a.copy() for a in args])
    return status, chosen.tolist()


@settings(max_examples=400, deadline=None)
@given(instances())
def test_loops_agree_with_the_numpy_reference(args: tuple[np.ndarray, ...]) -> None:
    assert _run(vs._scan_loops, args) == _run(vs.scan_numpy, args)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_compiled_scan_agrees_with_the_numpy_reference(args: tuple[np.ndarray, ...]) -> None:
    kernel = Kernel("victim scan", vs._scan_loops, vs.scan_numpy)
    assert kernel.use_compiled(), "numba is a dependency"
    assert _run(kernel.compiled[0], args) == _run(vs.scan_numpy, args)


def _prices_args(args: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    reqs, feasible, room, live, node, _, frees, cost, _, _ = args
    return reqs[0], feasible, room, live, node, frees, cost


@settings(max_examples=300, deadline=None)
@given(instances())
def test_node_prices_loops_agree_with_the_numpy_reference(args: tuple[np.ndarray, ...]) -> None:
    a = _prices_args(args)
    want = vs.node_prices_numpy(*a).tolist()
    assert vs._node_prices_loops(*a).tolist() == want
    kernel = Kernel("victim node prices", vs._node_prices_loops, vs.node_prices_numpy)
    assert kernel.use_compiled(), "numba is a dependency"
    assert kernel.compiled[0](*a).tolist() == want


@pytest.mark.parametrize("fn", [vs.node_prices_numpy, vs._node_prices_loops], ids=["numpy", "loops"])
def test_node_prices(fn: Callable[..., np.ndarray]) -> None:
    one_gpu, two = [0, 0, 1, 0, 0], [0, 0, 2, 0, 0]
    # node 0: room already (0); node 1: its units cheapest first until 2 GPUs are free (1 + 3); node 2: even its
    # one live unit is not enough; node 3: infeasible
    units = [(0, 1, 1, one_gpu), (1, 1, 3, one_gpu), (2, 1, 9, two), (3, 2, 1, one_gpu), (4, 3, 1, two)]
    args = _instance(4, units, [[0, 0, 2, 0, 0], [0] * WIDTH, [0] * WIDTH, [0] * WIDTH], [True, True, True, False],
                     [True] * 4 + [False], [two])
    assert fn(*_prices_args(args)).tolist() == [0, 4, int(vs.BIG), int(vs.BIG)]


def test_a_cycle_takes_the_same_plan_with_either_form(monkeypatch: pytest.MonkeyPatch) -> None:
    st = build_state(as_snapshot(scale(300, 3000, 300, 1)))
    fs = compute_fair_share(st)
    cfg = Config(engine=Engine.greedy, victim_search="cheapest")
    calls: list[int] = []
    numpy_form = vs.scan_numpy
    monkeypatch.setattr(vs, "SCAN", Kernel("victim scan", vs._scan_loops,
                                           lambda *a: calls.append(1) or numpy_form(*a)))
    monkeypatch.setattr(compiled, "_when_used", [])  # an earlier test may have run a long-lived command
    by_numpy = greedy_plan(st, fs, cfg)
    assert calls and by_numpy.evictions, "the instance evicts through the cheapest victims"
    assert vs.SCAN.use_compiled()
    n_calls = len(calls)
    by_loops = greedy_plan(st, fs, cfg)
    assert len(calls) == n_calls
    assert (by_loops.placements, by_loops.evictions) == (by_numpy.placements, by_numpy.evictions)


def test_scan_is_the_numpy_form_until_a_process_asks_for_the_compiled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(vs, "SCAN", Kernel("victim scan", vs._scan_loops,
                                           lambda *a: calls.append("numpy") or (vs.NONE_NEEDED, a[4][:0])))
    monkeypatch.setattr(compiled, "_when_used", [])  # an earlier test may have run a long-lived command
    args = _instance(1, [], [[1] * WIDTH], [True], [], [[1, 0, 0, 0, 0]])
    vs.scan(*args)
    assert calls == ["numpy"]
    assert vs.SCAN.use_compiled()
    status, chosen = vs.scan(*args)
    assert (status, chosen.tolist()) == (vs.NONE_NEEDED, [])
    assert calls == ["numpy"], "the compiled loops answer once in use"


@pytest.mark.parametrize("fn", [vs.scan_numpy, vs._scan_loops], ids=["numpy", "loops"])
def test_decisions(fn: vs.ScanFn) -> None:
    one_gpu = [0, 0, 1, 0, 0]
    # room on nodes 0 and 2: the tightest in GPUs (node 2), nothing evicted
    args = _instance(3, [(0, 1, 1, one_gpu)], [[0, 0, 3, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]],
                     [True, True, True], [True], [one_gpu])
    assert _run(fn, args) == (vs.NONE_NEEDED, [])
    # no room: on each node the units in cost order until the request fits; the node costing fewest GPUs wins
    # (node 0: groups 0 and 2, 2 GPUs); then a tie at 3 (group 1 on either node) goes to the lower node, and the
    # group goes whole: its unit on node 1 frees room there, which the third task takes without a victim
    two = [0, 0, 2, 0, 0]
    units = [(0, 0, 1, one_gpu), (2, 0, 1, one_gpu), (1, 1, 3, two), (1, 0, 3, two), (3, 1, 5, two)]
    args = _instance(2, units, [[0] * WIDTH, [0] * WIDTH], [True, True], [True] * 5, [two, two, two])
    assert _run(fn, args) == (vs.FOUND, [0, 2, 1])
    # a task no node can hold even with every victim gone
    args = _instance(2, units, [[0] * WIDTH, [0] * WIDTH], [True, True], [True] * 5, [[0, 0, 9, 0, 0]])
    assert _run(fn, args) == (vs.NO_ROOM, [])
    # units that may not go (live False) neither free room nor cost
    args = _instance(1, [(0, 0, 1, one_gpu), (1, 0, 2, one_gpu)], [[0] * WIDTH], [True], [False, True],
                     [one_gpu])
    assert _run(fn, args) == (vs.FOUND, [1])
    # prices kept for one request are made again where another request's task took room: task 2 (1 GPU) takes
    # node 1's free GPU, so for task 3 (2 GPUs, as task 1) node 1's one victim no longer makes room
    args = _instance(2, [(0, 0, 1, two), (1, 1, 1, one_gpu)], [[0] * WIDTH, [0, 0, 1, 0, 0]], [True, True],
                     [True, True], [two, one_gpu, two])
    assert _run(fn, args) == (vs.NO_ROOM, [])


def test_long_lived_commands_ask_for_the_compiled_scan(capsys: pytest.CaptureFixture[str], tmp_path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_when_used", [])
    thresholds = gc.get_threshold()
    try:
        code, _out, err = run_cli(capsys, "run", "--config", str(tmp_path / "missing.yaml"), "--no-leader-elect")
    finally:
        gc.set_threshold(*thresholds)  # `run` tunes the collector too
    assert code == 2 and "missing.yaml" in err  # stopped at the config, after asking
    assert compiled._when_used == [True]
    monkeypatch.setattr(compiled, "_when_used", [])
    code, _out, err = run_cli(capsys, "solve", str(tmp_path / "missing.yaml"))
    assert code == 2 and compiled._when_used == [], "a one-shot solve keeps the numpy form"


@pytest.mark.parametrize("where", ["loading", "running"])
def test_a_failing_compiled_form_leaves_the_numpy_form(where: str, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(vs, "SCAN", Kernel("victim scan", vs._scan_loops, vs.scan_numpy))
    monkeypatch.setattr(compiled, "_when_used", [True])

    def fails(*_a: object) -> tuple[int, np.ndarray]:
        raise RuntimeError("injected")

    if where == "loading":
        monkeypatch.setattr(vs.SCAN, "use_compiled", fails)
    else:
        monkeypatch.setattr(vs.SCAN, "use_compiled", lambda: vs.SCAN.compiled.append(fails) or True)
    two = [0, 0, 2, 0, 0]
    args = _instance(2, [(0, 0, 1, two), (1, 1, 2, two)], [[0] * WIDTH, [0] * WIDTH], [True, True], [True, True],
                     [two])
    with caplog.at_level("WARNING", logger="kai_opt.compiled"):
        assert _run(vs.scan, args) == _run(vs.scan_numpy, args) == (vs.FOUND, [0])
    assert f"failed {where}" in caplog.text
    assert vs.SCAN.compiled == [] and vs.SCAN.failed, "not tried again"
    assert compiled._when_used == [True], "other kernels still compile"
