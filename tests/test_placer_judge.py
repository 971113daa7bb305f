"""The placer's judgement in compiled loops (kai_opt/heuristics/placer_judge.py) against its array path
(`Placer._judge` with the loops not in use): the same verdicts and keys on random clusters, for every strategy, on
every node and on a few, as placements change the nodes; and the FGD scorer's refresh of its per-node statistics
the same way (`FgdScorer._refresh`)."""

from __future__ import annotations

import numpy as np
import pytest
from builders import state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from strategies import clusters

from kai_opt.config import parse_config
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics import placer_judge
from kai_opt.heuristics.placer import Placer, _Ranked
from kai_opt.heuristics.session import Session
from kai_opt.state import PodStatus

STRATEGIES = [{"gpu": "binpack", "cpu": "binpack"}, {"gpu": "spread", "cpu": "spread"},
              {"gpu": "fgd", "cpu": "fgd"}, {"gpu": "fgd", "cpu": "binpack"}]


def _judged(placer: Placer, p: int, nodes: np.ndarray, at: np.ndarray | None, allow: bool,
            compiled: bool, monkeypatch: pytest.MonkeyPatch) -> _Ranked:
    kept = _Ranked(nodes, placer.topology_score, 0)
    kept.keys[1][:] = 7.0  # (positions the judge leaves alone keep what they had)
    with monkeypatch.context() as m:
        m.setattr(placer_judge.JUDGE, "wanted", lambda: compiled)
        placer._judge(p, kept, at, allow)
    return kept


def _agree(placer: Placer, p: int, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    st = placer.sess.state
    nodes = np.flatnonzero(placer.static_mask(int(st.pod_sig[p])))
    if not len(nodes):
        return
    some = np.flatnonzero(rng.random(len(nodes)) < 0.5)
    for at in (None, some):
        for allow in (True, False):
            a = _judged(placer, p, nodes, at, allow, True, monkeypatch)
            b = _judged(placer, p, nodes, at, allow, False, monkeypatch)
            assert np.array_equal(a.now, b.now), (p, at, allow)
            for ka, kb in zip(a.keys, b.keys, strict=True):
                assert np.array_equal(ka, kb), (p, at, allow, ka, kb)


def _refresh_agrees(placer: Placer, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    fgd = placer.fgd
    names = ("cnt", "below", "free", "cpu", "frag")
    nodes = np.flatnonzero(rng.random(placer.sess.state.n_nodes) < 0.5)
    known = fgd._known
    out = []
    for compiled in (True, False):
        for name in names:
            setattr(fgd, name, np.full_like(getattr(fgd, name), -1))
        fgd._known = np.zeros((2, placer.sess.state.n_nodes))  # (the growths remembered: dropped at `nodes`)
        with monkeypatch.context() as m:
            m.setattr(placer_judge.REFRESH, "wanted", lambda c=compiled: c)
            fgd._refresh(nodes)
        out.append([getattr(fgd, name).copy() for name in (*names, "_known")])
    for a, b, name in zip(*out, (*names, "_known"), strict=True):
        assert np.array_equal(a, b, equal_nan=True), name
    fgd._known = known
    fgd._refresh(np.arange(placer.sess.state.n_nodes))  # (back to the session's statistics)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(objs=clusters(max_nodes=8, max_jobs=10), strategy=hs.sampled_from(STRATEGIES), topology=hs.booleans(),
       seed=hs.integers(0, 2**31))
def test_compiled_judge_agrees_with_the_array_path(monkeypatch: pytest.MonkeyPatch, objs, strategy, topology,
                                                   seed) -> None:
    assert placer_judge.JUDGE.use_compiled() and placer_judge.REFRESH.use_compiled(), "numba is a dependency"
    st = state(objs)
    sess = Session(st, compute_fair_share(st), parse_config({"placement": strategy}))
    placer = Placer(sess)
    rng = np.random.default_rng(seed)
    if topology:
        placer.topology_score = rng.integers(0, 3, st.n_nodes) * 10_000
    pending = [p for p in range(st.n_pods) if sess.status[p] == PodStatus.PENDING
               and not (st.pod_gpu_frac[p] or st.pod_gpu_mem[p])]
    for p in pending:  # each judged on the nodes as the placements before it left them
        _agree(placer, p, monkeypatch, rng)
        with placer.releasing_free():
            _agree(placer, p, monkeypatch, rng)
        if "fgd" in strategy.values():
            _refresh_agrees(placer, monkeypatch, rng)
        choice = placer.choose(p)
        if choice is not None:
            sess.place(p, choice.node, choice.devices, pipelined=choice.pipelined)


def test_a_pod_with_a_gpu_share_is_judged_by_the_array_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from builders import node, pod, podgroup, queue

    st = state([node("a", gpus=2), queue("q"), podgroup("s", "q"), pod("s-0", group="s", gpus=0.5)])
    placer = Placer(Session(st, compute_fair_share(st), parse_config({})))
    kept = _Ranked(np.arange(st.n_nodes), None, 0)
    assert placer_judge.JUDGE.use_compiled()
    assert not placer._judge_compiled(int(st.pod_index["default/s-0"]), kept, None, kept.nodes, True)
