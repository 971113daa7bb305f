"""DRA in the LP bound (kai_opt/bench/bound.py) and the benchmark's GPU count: DRA GPUs count as GPUs in both,
and the bound stays above what either engine allocates on random DRA clusters."""

from __future__ import annotations

from builders import podgroup, snapshot
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from test_dra import CONFIG, CPSAT, base, claim_pod, dra_clusters, template

from kai_opt.bench.bound import lp_bound
from kai_opt.bench.metrics import gpus_allocated
from kai_opt.config import Engine
from kai_opt.engine import run_cycle
from kai_opt.snapshot import RawObject
from kai_opt.state import build_state


def test_dra_gpus_count_in_the_bound_and_the_metric() -> None:
    objs = [*base(("H100", "H100")), template("t", 3), podgroup("g", "q", min_member=4)]
    objs += [claim_pod(f"p{i}", "g", template_name="t") for i in range(4)]
    st = build_state(snapshot(objs))
    plan, fs = run_cycle(st, CONFIG, engine=Engine.greedy)
    assert len(plan.placements) == 4  # two claims of 3 devices on each node of 8
    assert gpus_allocated(st, plan)[0] == 12.0
    b = lp_bound(st, fs)
    assert b.status == "optimal" and 12.0 - 1e-6 <= b.gpus <= 16.0 + 1e-6


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dra_clusters(), hs.sampled_from([Engine.greedy, Engine.cpsat]))
def test_the_bound_holds_on_random_dra_clusters(objs: list[RawObject], engine: Engine) -> None:
    st = build_state(snapshot(objs))
    # running pods over their node's allocatable (the generator allows it) are outside what the bound models:
    # a movable pod is kept only where it fits
    assume(bool((st.node_used <= st.node_alloc).all()))
    plan, fs = run_cycle(st, CPSAT if engine == Engine.cpsat else CONFIG, engine=engine)
    got, weighted = gpus_allocated(st, plan)
    b = lp_bound(st, fs)
    assert got <= b.gpus + 1e-6 and weighted <= b.weighted + 1e-6
