"""The one fit path (kai_opt/heuristics/nodefilter.py): its feasible mask and its reasons come from the same checks,
so on any cluster a node passes the filter iff no reason names it, and asking for reasons changes no mask."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
from builders import node, pod, podgroup, queue, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import clusters
from test_session_ops import _step as random_op

from kai_opt.config import Config, Engine
from kai_opt.explain import make_context
from kai_opt.fairshare import compute_fair_share
from kai_opt.heuristics.nodefilter import FIT_MEMO_MIN, FitReasons, format_fit_error
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import Session
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TAINT = {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}
ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "spread"}}, "topologyKey": "rack"}]}}


@st.composite
def filtered_clusters(draw: st.DrawFn) -> list[RawObject]:
    """clusters() plus what only the filter's other checks see: tainted, not-ready, cordoned and unlabelled
    nodes, pending pods with a node selector, a toleration, pod anti-affinity, a gpu-memory request."""
    objs = draw(clusters(max_nodes=5, max_jobs=5))
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["taint", "not-ready", "cordoned", "unlabelled", "cpu-only", "small"]))
        n = node(f"x{i}", gpus=0 if kind == "cpu-only" else draw(st.sampled_from([1, 2, 8])),
                 cpu=draw(st.sampled_from(["2", "64"])), labels={"rack": f"rack{i}", "pool": f"p{i % 2}"},
                 taints=[TAINT] if kind == "taint" else None, ready=kind != "not-ready",
                 unschedulable=kind == "cordoned", gpu_memory_mib=20000 if kind == "small" else 81920)
        if kind == "unlabelled":
            del n.obj["metadata"]["labels"]["nvidia.com/gpu.memory"]
        objs.append(n)
    objs.append(queue("extra", gpu=(-1, 1, -1)))
    for j in range(draw(st.integers(1, 4))):
        objs.append(podgroup(f"e{j}", "extra", min_member=1, created_min=20 + j))
        spec: dict = {}
        if draw(st.booleans()):
            spec["nodeSelector"] = {"pool": draw(st.sampled_from(["p0", "p1"]))}
        if draw(st.booleans()):
            spec["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
        labels = None
        if draw(st.booleans()):
            spec["affinity"] = ANTI
            labels = {"app": "spread"}
        ann = {"gpu-memory": str(draw(st.sampled_from([10000, 40000])))} if draw(st.booleans()) else None
        objs.append(pod(f"e{j}-0", group=f"e{j}", gpus=0 if ann else draw(st.sampled_from([0, 0.5, 1, 4])),
                        cpu=draw(st.sampled_from(["1", "32"])), annotations=ann, labels=labels, **spec))
    return objs


def _check_pod(placer: Placer, p: int) -> None:
    st_ = placer.sess.state
    d = placer.diagnose(p)
    assert d.total == st_.n_nodes
    nodes = np.arange(st_.n_nodes)
    # a node is feasible iff no reason names it
    assert np.array_equal(np.sort(d.feasible), nodes[~d.why.failed]), (d.feasible, d.reasons)
    assert sum(d.reasons.values()) >= int(d.why.failed.sum())
    assert all(c > 0 for c in d.reasons.values())
    # the same nodes as the hot path's mask, which asks for no reasons
    cand = np.flatnonzero(placer.static_mask(int(st_.pod_sig[p])))
    if len(cand):
        now_ok, future_ok = placer.filter(p, cand)
        assert np.array_equal(cand[future_ok], np.sort(d.feasible))
        assert not (now_ok & ~future_ok).any()
        # the column-by-column path (over 32 candidates) decides and counts as the rows-at-once path
        small, big = FitReasons(st_.n_nodes), FitReasons(st_.n_nodes)
        rows = placer.fit(p, cand, small)
        reps = 33 // len(cand) + 1
        cols = placer.fit(p, np.tile(cand, reps), big)
        assert np.array_equal(np.tile(rows[0], reps), cols[0]) and np.array_equal(np.tile(rows[1], reps), cols[1])
        assert big.counts == Counter({r: c * reps for r, c in small.counts.items()})
        assert np.array_equal(placer.fit(p, cand)[1], rows[1])  # asking for reasons changes no mask
    if len(d.feasible) == 0:
        assert format_fit_error(d.total, d.reasons).startswith(f"0/{d.total} nodes are available")


@SETTINGS
@given(filtered_clusters())
def test_feasible_iff_no_reason(objs: list[RawObject]) -> None:
    state = build_state(snapshot(objs))
    ctx = make_context(state, Config(engine=Engine.greedy))  # the cluster as the plan leaves it
    for p in range(state.n_pods):
        _check_pod(ctx.placer, p)


def test_reasons_name_each_failing_check() -> None:
    objs = [node("a", gpus=8), node("b", gpus=8, taints=[TAINT]), node("c", gpus=8, ready=False),
            node("d", gpus=0), node("e", gpus=8, gpu_memory_mib=20000), node("f", gpus=8),
            queue("q", gpu=(-1, 1, -1)), podgroup("g", "q"),
            pod("run", gpus=8, node_name="a", queue_name="q"),
            pod("p", group="g", annotations={"gpu-memory": "40000"})]
    del objs[5].obj["metadata"]["labels"]["nvidia.com/gpu.memory"]
    state = build_state(snapshot(objs))
    placer = Placer(Session(state, compute_fair_share(state), Config()))  # the cluster before any plan
    d = placer.diagnose(state.pod_index["default/p"])
    assert d.reasons == Counter({
        "node(s) were unschedulable or not ready": 1,  # c
        "node(s) had untolerated taint {dedicated: infer}": 1,  # b
        "Insufficient GPU share on any device": 2,  # a (full), d (no GPU)
        "node(s) had less GPU memory per device than the requested 40000 MiB": 1,  # e
        "node(s) had no GPU memory label (nvidia.com/gpu.memory), which a gpu-memory request needs": 1,  # f
    })
    assert len(d.feasible) == 0 and d.why.failed.sum() == 6


def test_a_share_without_a_device_of_its_own_still_counts_against_its_node() -> None:
    """Three 0.6 shares bound to a 2-GPU node: the third finds no device left (the state warns) but holds node GPU
    all the same. A 0.3 share fits device 0 by its device alone; the node's GPU total refuses it (the checker
    would reject the plan), so it goes to b, and the reason names the node's GPUs."""
    from kai_opt.checker import check_plan
    from kai_opt.engine import run_cycle

    dev0 = {"kai-opt.io/gpu-devices": "0"}
    dev1 = {"kai-opt.io/gpu-devices": "1"}
    objs = [node("a", gpus=2), node("b", gpus=1), queue("q", gpu=(-1, 1, -1)),
            pod("r0", gpus=0.6, node_name="a", queue_name="q", annotations=dev0),
            pod("r1", gpus=0.6, node_name="a", queue_name="q", annotations=dev1),
            pod("r2", gpus=0.6, node_name="a", queue_name="q"),
            podgroup("g", "q"), pod("p", group="g", gpus=0.3)]
    state = build_state(snapshot(objs))
    assert any("no GPU device left for its share" in w for w in state.warnings)
    placer = Placer(Session(state, compute_fair_share(state), Config()))
    d = placer.diagnose(state.pod_index["default/p"])
    assert [state.node_names[n] for n in d.feasible] == ["b"]
    assert d.reasons == Counter({"Insufficient nvidia.com/gpu": 1})  # a
    for engine in (Engine.greedy, Engine.cpsat):
        plan, fs = run_cycle(state, Config(engine=engine))
        assert [state.node_names[pl.node] for pl in plan.placements] == ["b"], engine
        check_plan(state, plan, fs, Config(engine=engine))


@SETTINGS
@given(filtered_clusters(), st.randoms(use_true_random=False), st.integers(1, 30))
def test_memoised_verdicts_equal_the_checks_after_any_operations(objs: list[RawObject], rnd: random.Random,
                                                                 n_ops: int) -> None:
    """The per-shape verdicts (NodeFilter.fit_memo) that many candidates read equal the checks made afresh, after
    any sequence of operations, rollbacks and commits on the session (each read refreshes the nodes touched)."""
    state = build_state(snapshot(objs))
    placer = Placer(Session(state, compute_fair_share(state), Config()))
    sess = placer.sess
    every = np.tile(np.arange(state.n_nodes), FIT_MEMO_MIN // max(state.n_nodes, 1) + 1)  # enough to read the memo
    open_cps: list = []
    pods = rnd.sample(range(state.n_pods), min(state.n_pods, 6))

    def check(some: list[int]) -> int:
        used = 0
        for p in some:
            used += placer.fit_memo(p) is not None
            memo_now, memo_future = placer.fit(p, every)
            now, future = placer._fit(p, every)
            assert np.array_equal(memo_now, now) and np.array_equal(memo_future, future)
        return used

    for _ in range(n_ops):
        random_op(sess, rnd, open_cps)
        check(rnd.sample(pods, rnd.randint(0, len(pods))))  # some shapes are read after several changes
    used = check(pods)
    if state.n_nodes and any(not (state.pod_gpu_frac[p] or state.pod_gpu_mem[p]) for p in pods):
        assert used  # the memo was read (pods without a share always have one)


@SETTINGS
@given(filtered_clusters(), st.randoms(use_true_random=False), st.integers(0, 20))
def test_one_node_verdicts_equal_the_array_checks_after_any_operations(objs: list[RawObject], rnd: random.Random,
                                                                       n_ops: int) -> None:
    """The one-node form of the checks (NodeFilter._fit_one, scalars) gives the array form's verdicts for every
    pod and node, after any operations (the array form is read with the node twice, which the one-node form
    never takes)."""
    state = build_state(snapshot(objs))
    placer = Placer(Session(state, compute_fair_share(state), Config()))
    open_cps: list = []
    for _ in range(n_ops + 1):
        for p in range(state.n_pods):
            for n in range(state.n_nodes):
                one_now, one_future = placer._fit(p, np.array([n]))
                now, future = placer._fit(p, np.array([n, n]))
                assert (one_now.tolist(), one_future.tolist()) == (now[:1].tolist(), future[:1].tolist()), (p, n)
        random_op(placer.sess, rnd, open_cps)


def _keys_of(rnd: random.Random, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random choice keys over n positions, with many ties (and the tier of a node that may not take the pod)."""
    from kai_opt.heuristics.placer_judge import NO_NODE

    tier = np.array([rnd.choice([NO_NODE, 0, 100, 100, 110]) for _ in range(n)], dtype=np.int64)
    return (tier, *(np.array([float(rnd.randint(-2, 2)) * rnd.choice([1.0, 0.5]) for _ in range(n)])
                     for _ in range(3)))


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(1, 60), st.integers(1, 70))
def test_lex_top_is_the_sorted_order(rnd: random.Random, n: int, k: int) -> None:
    """lex_top's positions are the first k of every position sorted by the keys (highest first) then the rank
    (lowest first), and its first is lex_best's."""
    from kai_opt.heuristics.placer import lex_best, lex_top

    keys = _keys_of(rnd, n)
    rank = np.array(rnd.sample(range(3 * n), n), dtype=np.int64)
    ref = sorted(range(n), key=lambda i: (*(-float(key[i]) for key in keys), int(rank[i])))
    assert lex_top(keys, rank, k).tolist() == ref[:k]
    assert lex_best(keys, None, rank) == ref[0]


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(1, 60), st.integers(1, 40), st.integers(1, 8),
       st.integers(0, 12))
def test_ranked_best_is_lex_best_after_any_changes(rnd: random.Random, n: int, n_ops: int, top_keep: int,
                                                   changed_max: int) -> None:
    """_Ranked's best, read from its kept top and the positions judged since, is lex_best over every position
    (None when no node may take the pod), after any sequence of changed keys."""
    import kai_opt.heuristics.placer as placer_mod

    kept = placer_mod._Ranked(np.arange(n, dtype=np.int64), None, 0)
    name_rank = np.array(rnd.sample(range(n), n), dtype=np.int64)
    old = placer_mod.TOP_KEEP, placer_mod.CHANGED_MAX
    placer_mod.TOP_KEEP, placer_mod.CHANGED_MAX = top_keep, changed_max
    try:
        for step in range(n_ops):
            at = np.arange(n) if step == 0 else np.array(sorted(rnd.sample(range(n), rnd.randint(0, n))),
                                                         dtype=np.int64)
            fresh = _keys_of(rnd, len(at))
            kept.judged(at)
            for have, new in zip(kept.keys, fresh, strict=True):
                have[at] = new
            kept.now[at] = [rnd.random() < 0.5 for _ in range(len(at))]
            got = kept.best(name_rank)
            if kept.keys[0].max() == placer_mod.NO_NODE:
                assert got is None
            else:
                i = placer_mod.lex_best(kept.keys, None, name_rank)
                assert got == (i, bool(kept.now[i]))
    finally:
        placer_mod.TOP_KEEP, placer_mod.CHANGED_MAX = old


@SETTINGS
@given(filtered_clusters(), st.randoms(use_true_random=False), st.integers(1, 30),
       st.sampled_from(["binpack", "spread", "fgd"]))
def test_kept_choice_keys_choose_as_fresh_scores_after_any_operations(objs: list[RawObject], rnd: random.Random,
                                                                      n_ops: int, strategy: str) -> None:
    """The choice read off a pod shape's kept keys (Placer.kept_keys, refreshed for the nodes touched since)
    is the choice made from fresh verdicts and scores, after any sequence of operations, rollbacks and commits."""
    import kai_opt.heuristics.placer as placer_mod

    state = build_state(snapshot(objs))
    config = Config.model_validate({"placement": {"gpu": strategy, "cpu": strategy}})
    placer = Placer(Session(state, compute_fair_share(state), config))
    sess = placer.sess
    open_cps: list = []
    pods = rnd.sample(range(state.n_pods), min(state.n_pods, 6))
    kept = 0

    def check(some: list[int]) -> int:
        used = 0
        for p in some:
            for allow in (True, False):
                kept = placer.kept_keys(p, allow)
                if kept is not None:
                    used += 1
                    assert kept.best(placer.name_rank) == placer._fresh_best(p, None, allow, -1), (p, allow)
        return used

    old = placer_mod.RANK_MIN
    placer_mod.RANK_MIN = 1  # the small clusters drawn here: keep keys from one candidate on
    try:
        for _ in range(n_ops):
            random_op(sess, rnd, open_cps)
            kept += check(rnd.sample(pods, rnd.randint(0, len(pods))))
        kept += check(pods)
    finally:
        placer_mod.RANK_MIN = old
    if any(placer.rank_key(p, True) is not None and placer.static_mask(int(state.pod_sig[p])).any() for p in pods):
        assert kept


@SETTINGS
@given(filtered_clusters(), st.randoms(use_true_random=False), st.integers(1, 30))
def test_kept_reasons_diagnose_as_the_checks_after_any_operations(objs: list[RawObject], rnd: random.Random,
                                                                  n_ops: int) -> None:
    """diagnose read off a pod shape's kept failing masks (NodeFilter._reason_memo, refreshed with its verdicts)
    gives the reasons, in the same order, the feasible nodes and the failing nodes the checks made afresh give,
    over every node and over a random node set, after any sequence of operations, rollbacks and commits."""
    state = build_state(snapshot(objs))
    placer = Placer(Session(state, compute_fair_share(state), Config()))
    sess = placer.sess
    open_cps: list = []
    pods = rnd.sample(range(state.n_pods), min(state.n_pods, 6))
    kept = {"read": 0}

    def check(some: list[int]) -> None:
        for p in some:
            for mask in (None, np.array([rnd.random() < 0.5 for _ in range(state.n_nodes)], dtype=bool)):
                memo = placer.diagnose(p, mask)
                kept["read"] += placer._reason_memo(p) is not None
                fresh_placer = Placer.__new__(Placer)
                fresh_placer.__dict__.update(placer.__dict__)
                fresh_placer._reason_memo = lambda _p: None  # type: ignore[method-assign]
                fresh = fresh_placer.diagnose(p, mask)
                assert list(memo.reasons.items()) == list(fresh.reasons.items()), (memo.reasons, fresh.reasons)
                assert np.array_equal(np.sort(memo.feasible), np.sort(fresh.feasible))
                assert np.array_equal(memo.why.failed, fresh.why.failed)

    for _ in range(n_ops):
        random_op(sess, rnd, open_cps)
        check(rnd.sample(pods, rnd.randint(0, len(pods))))
    check(pods)
    if state.n_nodes and any(not (state.pod_gpu_frac[p] or state.pod_gpu_mem[p]) for p in pods):
        assert kept["read"]
