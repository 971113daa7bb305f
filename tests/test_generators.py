"""Benchmark generators (models/generators): every family at 100 nodes with two seeds, and a small `scale`."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # models/ lives at the repository root

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.loaders import load_snapshot
from kai_opt.snapshot import RawObject
from kai_opt.state import R_GPU, ClusterState, PodStatus, build_state
from models.generators import FAMILIES, as_snapshot, scale, write_json

N_NODES = 100
SEEDS = (0, 1)
CASES = [(name, seed) for name in FAMILIES for seed in SEEDS]


@cache
def objects(name: str, seed: int) -> tuple[RawObject, ...]:
    return tuple(FAMILIES[name](N_NODES, seed))


@cache
def state(name: str, seed: int) -> ClusterState:
    snap = as_snapshot(objects(name, seed))
    assert not snap.warnings and not snap.rejected, snap.warnings[:3]
    return build_state(snap)


def check_consistent(st: ClusterState) -> None:
    """No warnings, nothing over capacity, every group schedulable, every running GPU pod on known devices."""
    assert not st.warnings, st.warnings[:3]
    assert (st.node_used <= st.node_alloc).all()
    assert (st.dev_used <= 1000).all()
    assert all(p is None for p in st.pg_problem), [p for p in st.pg_problem if p][:3]
    assert not st.pg_implicit.any()
    bound = np.nonzero(st.pod_status == PodStatus.BOUND)[0]
    gpu = bound[st.pod_req[bound, R_GPU] > 0]
    assert (np.diff(st.pod_dev_start)[gpu] > 0).all()
    assert all(st.pods[p].gpu_devices is not None for p in gpu.tolist())


@pytest.mark.parametrize(("name", "seed"), CASES)
def test_family_is_valid_deterministic_and_has_work(name: str, seed: int) -> None:
    objs = objects(name, seed)
    assert list(objs) == FAMILIES[name](N_NODES, seed)  # same seed, same objects
    st = state(name, seed)
    check_consistent(st)
    assert st.n_nodes == N_NODES
    assert (st.pod_status == PodStatus.BOUND).sum() > 0
    pending = np.nonzero(st.pod_status == PodStatus.PENDING)[0]
    assert len(pending) > 0 and (st.pod_pg[pending] >= 0).all()
    assert (st.pod_status != PodStatus.GATED).all()
    assert len(st.q_names) > 100 and int(np.max([len(a) for a in st.q_ancestors])) == 4  # 4-level tree


@pytest.mark.parametrize("name", list(FAMILIES))
def test_seeds_differ(name: str) -> None:
    assert objects(name, 0) != objects(name, 1)


def test_family_features() -> None:
    def annotated(name: str, key: str) -> int:
        return sum(1 for o in objects(name, 0) if o.kind == "Pod" and key in o.obj["metadata"]["annotations"])

    assert annotated("fractions", "gpu-fraction") > 0 and annotated("fractions", "gpu-memory") > 0
    assert annotated("openb", "gpu-fraction") > 0
    st = state("openb", 0)
    assert (st.pod_req[:, R_GPU] == 0).any()  # CPU-only pods
    assert len({lab["nvidia.com/gpu.product"] for lab in st.node_labels}) > 2  # node models mix
    topo = state("topology", 0)
    assert len(topo.topologies) == 1 and (topo.pg_required_level >= 0).any() and (topo.pg_preferred_level >= 0).any()
    assert len(topo.sg_names) > 0
    gangs = state("gangs", 0)
    sizes = np.diff(gangs.pg_pod_start)
    assert sizes.max() >= 4 and (gangs.pg_min_member > 1).any()


def test_fragmentation_is_tight() -> None:
    """Everything pending fits in one exact packing: pending GPUs == idle GPUs."""
    for seed in SEEDS:
        st = state("fragmentation", seed)
        pending = st.pod_status == PodStatus.PENDING
        assert st.pod_req[pending, R_GPU].sum() == (st.node_alloc - st.node_used)[:, R_GPU].sum()


def test_contention_has_over_and_under_quota_queues() -> None:
    st = state("contention", 0)
    bound = np.nonzero(st.pod_status == PodStatus.BOUND)[0]
    pending = np.nonzero(st.pod_status == PodStatus.PENDING)[0]
    q_used = np.bincount(st.pg_queue[st.pod_pg[bound]], weights=st.pod_req[bound, R_GPU] / 1000,
                         minlength=st.n_queues)
    over = q_used > st.q_deserved[:, 0] + 1e-9
    assert over.any()
    waiting = set(st.pg_queue[st.pod_pg[pending]].tolist())
    assert any(q_used[q] < st.q_deserved[q, 0] for q in waiting)
    assert st.node_used[:, R_GPU].sum() >= 0.9 * st.node_alloc[:, R_GPU].sum()


def test_scale_small(tmp_path: Path) -> None:
    objs = scale(200, 2_000, 200, seed=3, n_queues=150)
    assert objs == scale(200, 2_000, 200, seed=3, n_queues=150)
    st = build_state(as_snapshot(objs))
    check_consistent(st)
    assert st.n_nodes == 200 and (st.pod_status == PodStatus.BOUND).sum() == 2_000
    assert (st.pod_status == PodStatus.PENDING).sum() == 200
    path = write_json(objs, tmp_path / "scale.json")
    again = build_state(load_snapshot(path))
    assert again.n_pods == st.n_pods and np.array_equal(again.node_used, st.node_used)
    assert np.array_equal(again.dev_used, st.dev_used) and not again.warnings


@pytest.mark.slow
@pytest.mark.parametrize(("name", "seed"), CASES)
def test_family_cycle(name: str, seed: int) -> None:
    """The greedy engine plans every family (the plan checker runs inside run_cycle)."""
    plan, _ = run_cycle(state(name, seed), Config(engine=Engine.greedy))
    assert plan.placements or plan.pending
