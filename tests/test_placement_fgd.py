"""placement.gpu: fgd in the greedy engine: the node (and device) whose FGD fragmentation grows least."""

from __future__ import annotations

import numpy as np
from builders import node, pod, podgroup, queue, state
from hypothesis import given, settings
from hypothesis import strategies as hst

from kai_opt.bench import trace
from kai_opt.config import parse_config
from kai_opt.engine import run_cycle
from kai_opt.heuristics.fragmentation import FragModel, popular_rows, popular_shapes, typical_shapes


def plan_of(objs, strategy: str):
    st = state(objs)
    cfg = parse_config({"engine": "greedy", "placement": {"gpu": strategy}, "actions": {"consolidate": False}})
    plan, _ = run_cycle(st, cfg)
    return st, plan


def test_fgd_does_not_strand_gpus_behind_exhausted_cpu() -> None:
    # a: 2 GPUs but only 2 CPUs; b: 3 GPUs, plenty of CPU. p0 (1 GPU, 2 CPUs) comes first, then four 1-GPU pods.
    # binpack sends p0 to a (fewest free GPUs): a's CPUs are gone, its other GPU is stranded and p4 stays pending.
    # fgd sends p0 to b (on a it would strand a GPU for every shape), and all five pods fit.
    objs = [node("a", gpus=2, cpu="2"), node("b", gpus=3, cpu="64"), queue("q", gpu=(5, 1, -1))]
    for i in range(5):
        objs += [podgroup(f"p{i}", "q", created_min=i), pod(f"p{i}-0", group=f"p{i}", gpus=1,
                                                            cpu="2" if i == 0 else "1")]
    st, plan = plan_of(objs, "binpack")
    where = {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}
    assert where["p0-0"] == "a" and len(where) == 4
    st, plan = plan_of(objs, "fgd")
    where = {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}
    assert where["p0-0"] == "b" and len(where) == 5


def test_fgd_puts_a_share_on_the_device_that_fragments_least() -> None:
    # a: device 0 holds 0.7 (0.3 free), device 1 is idle; b is full with five 0.2 shares. The workload is mostly
    # 0.2 shares, so a new 0.2 share on device 0 would leave 0.1 that no shape can use; on device 1 it costs
    # nothing (0.8 left holds the 0.7 and 0.2 shapes). binpack takes the fullest device (0), fgd device 1.
    objs = [node("a", gpus=2), node("b", gpus=1), queue("q", gpu=(3, 1, -1)),
            podgroup("r", "q"), pod("r-0", group="r", gpus=0.7, node_name="a",
                                    annotations={"kai-opt.io/gpu-devices": "0"})]
    for i in range(5):
        objs += [podgroup(f"s{i}", "q"), pod(f"s{i}-0", group=f"s{i}", gpus=0.2, node_name="b",
                                             annotations={"kai-opt.io/gpu-devices": "0"})]
    objs += [podgroup("p", "q"), pod("p-0", group="p", gpus=0.2)]
    for strategy, device in (("binpack", 0), ("fgd", 1)):
        st, plan = plan_of(objs, strategy)
        (pl,) = plan.placements
        assert st.node_names[pl.node] == "a" and tuple(pl.devices) == (device,), strategy


def test_trace_fgd_policy_uses_the_shared_math() -> None:
    wl = typical_shapes(np.array([1000, 2000, 1000]), np.array([1000, 500, 1000]), np.array([1, 1, 2]),
                        ["", "", ""], ())
    model = FragModel(wl.cpu, wl.milli, wl.num, wl.weight)
    gpu_free = np.array([[1000, 300], [500, 0]])
    cnt, below = model.levels_of(gpu_free)
    owner = np.array([0, 0, 1, 1])
    cnt2, below2 = model.device_levels(gpu_free.ravel(), owner, 2)
    assert (cnt == cnt2).all() and (below == below2).all()
    for n in range(2):  # one node alone (its own path) gives that node's row
        one = model.device_levels(gpu_free[n], np.zeros(2, dtype=np.int64), 1)
        assert (one[0] == cnt[n:n + 1]).all() and (one[1] == below[n:n + 1]).all()
    cluster = trace.Cluster(("m",), np.array([0, 0]), np.array([2, 2]), np.array([8000, 8000]),
                            np.array([1, 1]), np.array([8000, 8000]), np.array([1, 1]), gpu_free)
    policy = trace.FgdPolicy(cluster, np.random.default_rng(0), wl)
    access = np.ones((2, len(wl)), dtype=bool)
    expect = model.expected(model.frag(cluster.cpu_free, gpu_free.sum(axis=1), cnt, below, access))
    assert np.allclose(policy.node_fragmentation(), expect)


def test_fgd_cache_follows_the_session() -> None:
    # the scorer's per-node statistics, refreshed from sess.caches.touched, equal a fresh scorer's after places,
    # evictions and a rollback
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.heuristics.placer import FgdScorer, Placer
    from kai_opt.heuristics.session import Session

    objs = [node("a", gpus=4, cpu="8"), node("b", gpus=2), node("c", gpus=0), queue("q", gpu=(8, 1, -1)),
            podgroup("r", "q"), pod("r-0", group="r", gpus=0.5, node_name="a",
                                    annotations={"kai-opt.io/gpu-devices": "1"})]
    for i, g in enumerate((1, 0.3, 2, 0.5)):
        objs += [podgroup(f"p{i}", "q"), pod(f"p{i}-0", group=f"p{i}", gpus=g, cpu="2")]
    st = state(objs)
    cfg = parse_config({"placement": {"gpu": "fgd"}})
    sess = Session(st, compute_fair_share(st), cfg)
    placer = Placer(sess)

    def same() -> None:
        placer.fgd.growth(int(st.pod_index["default/p0-0"]), np.arange(st.n_nodes))  # brings the cache up to date
        fresh = FgdScorer(placer)
        for name in ("cnt", "below", "free", "cpu", "frag"):
            assert np.allclose(getattr(placer.fgd, name), getattr(fresh, name)), name
        # the growths remembered per pod shape and node equal a fresh scorer's, for a subset of nodes too
        every = np.arange(st.n_nodes)
        for q in range(st.n_pods):
            for nodes in (every, every[::2], every[1:]):
                assert np.array_equal(placer.fgd.growth(q, nodes), fresh.growth(q, nodes)), (q, nodes)

    same()
    cp = 0
    for i in range(4):
        p = int(st.pod_index[f"default/p{i}-0"])
        choice = placer.choose(p)
        assert choice is not None
        if i == 2:
            cp = sess.checkpoint()
        sess.place(p, choice.node, choice.devices, pipelined=choice.pipelined)
        same()
    sess.evict(int(st.pod_index["default/r-0"]), "test", -1)
    same()
    sess.rollback(cp)
    same()


@settings(max_examples=200, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 5), hst.sampled_from([0, 250, 1000]), hst.integers(0, 2),
                            hst.sampled_from([0, 7, 2**60])), min_size=1, max_size=60),
       hst.sampled_from([0.5, 0.95, 1.0]))
def test_popular_rows_is_popular_shapes_in_bulk(shapes: list[tuple[int, int, int, int]], coverage: float) -> None:
    """The packed-integer ranking picks the same shapes with the same counts in the same order as the tuple
    ranking, ties (larger shape first) included; the 2**60 column makes some draws too wide to pack."""
    counts, rows = popular_rows(np.array(shapes, dtype=np.int64), coverage)
    expected = popular_shapes(shapes, coverage)
    assert [(int(n), tuple(int(x) for x in r)) for n, r in zip(counts, rows, strict=True)] == expected


def test_the_sessions_of_one_state_share_its_fgd_target_and_start_statistics() -> None:
    # a later session of the same state scores from the target and the start statistics the first one made (not
    # from what that session changed since), and they equal those made afresh
    import kai_opt.heuristics.placer as placer_mod
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.heuristics.placer import FgdScorer, Placer
    from kai_opt.heuristics.session import Session

    objs = [node("a", gpus=4, cpu="8"), node("b", gpus=2), queue("q", gpu=(8, 1, -1)),
            podgroup("r", "q"), pod("r-0", group="r", gpus=0.5, node_name="a")]
    for i, g in enumerate((1, 0.3, 2)):
        objs += [podgroup(f"p{i}", "q"), pod(f"p{i}-0", group=f"p{i}", gpus=g, cpu="2")]
    st = state(objs)
    fs = compute_fair_share(st)
    cfg = parse_config({"placement": {"gpu": "fgd"}})
    first = Placer(Session(st, fs, cfg))
    for i in range(3):
        p = int(st.pod_index[f"default/p{i}-0"])
        choice = first.choose(p)
        assert choice is not None
        first.sess.place(p, choice.node, choice.devices, pipelined=choice.pipelined)
    first.fgd.growth(0, np.arange(st.n_nodes))  # its statistics follow its session
    later = Placer(Session(st, fs, cfg)).fgd
    assert later.model is first.fgd.model
    placer_mod._last_target.clear()
    fresh = FgdScorer(Placer(Session(st, fs, cfg)))
    assert fresh.model is not later.model
    for name in ("cnt", "below", "free", "cpu", "frag"):
        assert np.array_equal(getattr(later, name), getattr(fresh, name)), name
    assert not np.array_equal(first.fgd.free, fresh.free)  # (the first session did change them)
