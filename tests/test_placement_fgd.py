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
        placer.fgd.score(int(st.pod_index["default/p0-0"]), np.arange(st.n_nodes))  # brings the cache up to date
        fresh = FgdScorer(placer)
        for name in ("cnt", "below", "free", "cpu", "frag"):
            assert np.allclose(getattr(placer.fgd, name), getattr(fresh, name)), name
        # the scores remembered per pod shape and node equal a fresh scorer's, for a subset of nodes too
        every = np.arange(st.n_nodes)
        for q in range(st.n_pods):
            for nodes in (every, every[::2], every[1:]):
                assert np.array_equal(placer.fgd.score(q, nodes), fresh.score(q, nodes)), (q, nodes)

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
    first.fgd.score(0, np.arange(st.n_nodes))  # its statistics follow its session
    later = Placer(Session(st, fs, cfg)).fgd
    assert later.model is first.fgd.model
    placer_mod._last_target.clear()
    fresh = FgdScorer(Placer(Session(st, fs, cfg)))
    assert fresh.model is not later.model
    for name in ("cnt", "below", "free", "cpu", "frag"):
        assert np.array_equal(getattr(later, name), getattr(fresh, name)), name
    assert not np.array_equal(first.fgd.free, fresh.free)  # (the first session did change them)


def test_share_fill_cost_counts_what_common_sizes_cannot_fill() -> None:
    from kai_opt.heuristics.fragmentation import share_fill_cost

    # the openb default trace's abundant share sizes (each at least 4% of the share weight) and one rare size
    sizes = np.array([810, 470, 320, 650, 230, 460, 160, 1000, 0])
    weight = np.array([0.37, 0.26, 0.10, 0.08, 0.042, 0.041, 0.019, 0.05, 0.05])
    num = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0])
    cost = share_fill_cost(sizes, num, weight)
    # 0.19 and 0.21 fit no common size; 0.35 takes a 0.32 (0.03 left), 0.53 a 0.47, 0.68 a 0.65; the rare 0.16
    # share fills nothing; a whole free device is no leftover
    assert [int(cost[x]) for x in (190, 210, 350, 530, 680, 1000, 0)] == [190, 210, 30, 60, 30, 0, 0]
    # a size counts by its weight over every shape asking for it: two 0.16 shapes of 3% each (6% together) fill
    cost2 = share_fill_cost(np.array([810, 160, 160]), np.array([1, 1, 1]), np.array([0.94, 0.03, 0.03]))
    assert int(cost2[190]) == 30 and int(cost2[150]) == 150
    # no share in the workload: nothing fills anything
    assert (share_fill_cost(np.array([1000]), np.array([1]), np.array([1.0]))[:1000] == np.arange(1000)).all()


def test_fgd_puts_a_share_where_what_is_left_can_still_be_filled() -> None:
    # a's device holds 0.47 (0.53 free), b's device holds 0.32 (0.68 free); the workload's shares are 0.47 and
    # 0.32 (and the 0.81 running on c). A new 0.32 share on a would leave 0.21 that no common share fills; on b it
    # leaves 0.36, which a 0.32 fills: b. (FGD's one-step growth alone prefers a, the tighter device.)
    objs = [node("a", gpus=1, cpu="64"), node("b", gpus=1, cpu="64"), node("c", gpus=1, cpu="64"),
            queue("q", gpu=(3, 1, -1))]
    running = (("a", 0.47), ("b", 0.32), ("c", 0.81))
    for i, (n, g) in enumerate(running):
        objs += [podgroup(f"r{i}", "q"), pod(f"r{i}-0", group=f"r{i}", gpus=g, cpu="1", node_name=n,
                                             annotations={"kai-opt.io/gpu-devices": "0"})]
    for i in range(3):  # pending shares of the common sizes: the one placed first is a 0.32
        objs += [podgroup(f"p{i}", "q", created_min=i), pod(f"p{i}-0", group=f"p{i}", gpus=(0.32, 0.47, 0.47)[i],
                                                            cpu="1")]
    st, plan = plan_of(objs, "fgd")
    where = {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}
    assert where["p0-0"] == "b"


def test_fgd_keeps_cpu_next_to_free_gpus() -> None:
    # a: 4 GPUs, 16 CPUs; b: 4 GPUs, 64 CPUs. The workload: six (1 GPU, 2 CPUs) pods and one (1 GPU, 8 CPUs), ~2.9
    # CPUs per GPU. The 8-CPU pod fits both nodes and every shape still fits either afterwards, so FGD's growth is
    # 0 on both, and the old tie rule (free CPU after closest to the ratio x free GPUs) took a. But on a it leaves
    # 3 GPUs with 8 CPUs, short of the ~8.6 they need, while b has CPU to spare: the imbalance term takes b.
    objs = [node("a", gpus=4, cpu="16"), node("b", gpus=4, cpu="64"), queue("q", gpu=(8, 1, -1))]
    for i in range(6):
        objs += [podgroup(f"w{i}", "q", created_min=1 + i), pod(f"w{i}-0", group=f"w{i}", gpus=1, cpu="2")]
    objs += [podgroup("big", "q", created_min=0), pod("big-0", group="big", gpus=1, cpu="8")]
    st = state(objs)
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.heuristics.placer import Placer
    from kai_opt.heuristics.session import Session

    sess = Session(st, compute_fair_share(st), parse_config({"placement": {"gpu": "fgd"}}))
    placer = Placer(sess)
    fgd = placer.fgd
    p = int(st.pod_index["default/big-0"])
    nodes = np.arange(st.n_nodes)
    a, b = st.node_names.index("a"), st.node_names.index("b")
    growth = fgd.model.expected(fgd.model.frag(fgd.cpu[nodes] - 8000, fgd.free[nodes] - 1000, fgd.cnt[nodes] - 1,
                                               fgd.below[nodes], fgd.access[nodes]) - fgd.frag[nodes])
    assert growth[a] == growth[b] == 0  # FGD alone cannot tell them apart
    k2, _ = fgd.tie_keys(p, nodes, True)
    assert k2[a] > k2[b]  # the tie rule alone would take a
    assert fgd.score(p, nodes)[b] > fgd.score(p, nodes)[a]
    choice = placer.choose(p)
    assert choice is not None and st.node_names[choice.node] == "b"


def test_under_fgd_a_share_does_not_have_to_join_a_shared_device() -> None:
    # KAI's tiers send a share to an already shared device first. a's device holds 0.3 (0.7 free), b's is idle;
    # the workload's shares are 0.5. A 0.5 share on a leaves 0.2 that no common share fills; on b it leaves 0.5,
    # which the next 0.5 fills: under fgd the fill cost decides (b), binpack keeps KAI's tier (a).
    objs = [node("a", gpus=1, cpu="64"), node("b", gpus=1, cpu="64"), queue("q", gpu=(2, 1, -1)),
            podgroup("r", "q"), pod("r-0", group="r", gpus=0.3, cpu="1", node_name="a",
                                    annotations={"kai-opt.io/gpu-devices": "0"})]
    for i in range(4):
        objs += [podgroup(f"p{i}", "q", created_min=i), pod(f"p{i}-0", group=f"p{i}", gpus=0.5, cpu="1")]
    for strategy, first in (("binpack", "a"), ("fgd", "b")):
        st, plan = plan_of(objs, strategy)
        where = {st.pods[p.pod].name: st.node_names[p.node] for p in plan.placements}
        assert where["p0-0"] == first, strategy


def test_explain_terms_of_a_share_under_fgd_add_up() -> None:
    # explain splits a node's tier into its terms; under fgd there is no GPU-sharing term (none left over)
    from kai_opt.explain.scores import device_choice, rank_nodes, terms
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.heuristics.placer import Placer
    from kai_opt.heuristics.session import Session

    objs = [node("a", gpus=1, cpu="64"), node("b", gpus=1, cpu="64"), queue("q", gpu=(2, 1, -1)),
            podgroup("r", "q"), pod("r-0", group="r", gpus=0.3, cpu="1", node_name="a",
                                    annotations={"kai-opt.io/gpu-devices": "0"}),
            podgroup("p", "q"), pod("p-0", group="p", gpus=0.5, cpu="1")]
    st = state(objs)
    for strategy, sharing in (("fgd", 0), ("binpack", 1000)):
        placer = Placer(Session(st, compute_fair_share(st), parse_config({"placement": {"gpu": strategy}})))
        p = int(st.pod_index["default/p-0"])
        rk = rank_nodes(placer, p)
        a = rk.index(st.node_names.index("a"))
        split = terms(placer, p, rk, a)
        assert split["gpu_sharing"] == sharing and "other" not in split, (strategy, split)
    placer = Placer(Session(st, compute_fair_share(st), parse_config({"placement": {"gpu": "fgd"}})))
    assert "fill cost" in str(device_choice(placer, p, st.node_names.index("a"), (0,), "fgd")["rule"])


def test_a_placement_that_changes_no_fragmentation_scores_the_same_on_every_node() -> None:
    # ~60 target shapes and nodes whose devices hold shares of many sizes: a node's expected fragmentation is a
    # weighted sum over the shapes, which BLAS adds up in blocks that depend on how many nodes are scored at once.
    # A tiny CPU-only pod changes no shape's fragmentation on any node, so its growth is 0 and its FGD score 50 on
    # every node, scored over all nodes or one at a time (as the difference of two such sums, each made in a batch
    # of another size, it was a few ulps off 0 on 4 of these nodes, which scored 49)
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.heuristics.placer import Placer
    from kai_opt.heuristics.session import Session

    rng = np.random.default_rng(0)
    objs = [queue("q", gpu=(10_000, 1, -1))]
    for i in range(60):
        objs.append(node(f"n{i:02d}", cpu="1000"))
        for d in range(8):
            r, cpu = rng.random(), str(int(rng.integers(1, 9)))
            gpus = float(rng.choice([0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75])) if r < 0.4 else 1.0
            if r < 0.6:
                objs += [podgroup(f"r{i}-{d}", "q"),
                         pod(f"r{i}-{d}-0", group=f"r{i}-{d}", gpus=gpus, cpu=cpu, node_name=f"n{i:02d}",
                             annotations={"kai-opt.io/gpu-devices": str(d)})]
    objs += [podgroup("tiny", "q"), pod("tiny-0", group="tiny", cpu="1m")]
    st = state(objs)
    sess = Session(st, compute_fair_share(st), parse_config({"placement": {"gpu": "fgd", "cpu": "fgd"}}))
    fgd = Placer(sess).fgd
    assert len(fgd.model.p) >= 50
    p = int(st.pod_index["default/tiny-0"])
    every = np.arange(st.n_nodes)
    assert (fgd.score(p, every) == 50).all()
    assert [int(fgd._score_of(p, np.array([n]))[0]) for n in every.tolist()] == [50] * st.n_nodes
