"""The CP-SAT engine's last tie-break between plans: what FGD scoring lowers (`FgdTarget.measure`: FGD's expected GPU
fragmentation against the target workload of the cycle's own pods, running and pending, plus the CPU/GPU balance
and the GPU shares' fill cost) once a plan has landed.

Why: when every pod of a cycle fits, the KAI-scored greedy plan and the FGD-scored second hint tie on the primary
objective (work placed, eviction cost), and the KAI-scored plan stayed, so the engine packed as KAI's bin-pack does
whatever the second hint found (docs/DESIGN-NOTES.md, "Where the trace replay loses GPUs against FGD"). Between plans
placing the same pods for the same eviction cost the one leaving less fragmented GPU share is taken; an equal
fragmentation keeps the KAI-scored plan, so a cycle where FGD scoring changes nothing for the workload stays KAI's.
"""

from __future__ import annotations

import numpy as np

from kai_opt.checker import flat_devices, held_amounts
from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.placer import Placer, cached_fgd_target, fgd_target
from kai_opt.heuristics.session import DEV, Session
from kai_opt.plan import Plan
from kai_opt.state import R_CPU, ClusterState
from kai_opt.state.segments import concat_ranges

MIN_GAIN = 1.0  # milli-GPU: a smaller difference in expected fragmentation is a tie (float noise)


def landed_usage(state: ClusterState, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(node usage [N, R], device usage [D] in milli-GPU) once the plan's evictions, releases, binds, pipelined
    pods and moves have all landed (the checker's 'after the plan')."""
    used = (state.node_used - state.node_releasing + state.node_pipelined).astype(np.int64)
    dev = (state.dev_used - state.dev_releasing + state.dev_pipelined).astype(np.int64)
    gone = [e.pod for e in plan.evictions]
    if gone:
        ev = np.asarray(gone, dtype=np.int64)
        nodes = state.pod_node[ev].astype(np.int64)
        amount, per = held_amounts(state, ev, nodes)
        np.subtract.at(used, nodes, amount.astype(np.int64))
        counts = state.pod_dev_start[ev + 1] - state.pod_dev_start[ev]
        idx, _ = concat_ranges(state.pod_dev_start[ev], counts)
        np.subtract.at(dev, state.pod_dev[idx], np.repeat(per, counts))
    if plan.placements:
        pods = np.asarray([p.pod for p in plan.placements], dtype=np.int64)
        nodes = np.asarray([p.node for p in plan.placements], dtype=np.int64)
        amount, per = held_amounts(state, pods, nodes)
        np.add.at(used, nodes, amount.astype(np.int64))
        _owner, glob, milli, valid = flat_devices(state, pods, nodes, [p.devices for p in plan.placements], per)
        np.add.at(dev, glob[valid], milli[valid])
    return used, dev


class PlanFragmentation:
    """FGD scoring's measure (milli-GPU, FgdTarget.measure) of plans of one cycle; the target workload and the node
    access of its shapes are built once, from the cycle start."""

    def __init__(self, state: ClusterState, fs: FairShare, config: Config) -> None:
        self.state = state
        self.target = cached_fgd_target(state) or fgd_target(Placer(Session(state, fs, config)))
        st = state
        self.owner = np.repeat(np.arange(st.n_nodes), np.diff(st.dev_start))

    def of(self, plan: Plan) -> float:
        st, target = self.state, self.target
        used, dev = landed_usage(st, plan)
        free_dev = np.maximum(DEV - dev, 0)
        cnt, below = target.model.device_levels(free_dev, self.owner, st.n_nodes)
        free = np.bincount(self.owner, weights=free_dev, minlength=st.n_nodes).astype(np.int64)[:st.n_nodes]
        cpu = (st.node_alloc[:, R_CPU] - used[:, R_CPU]).astype(np.int64)
        return target.measure(cpu, free, cnt, below, free_dev, st.node_gpus > 0)


def less_fragmented(state: ClusterState, fs: FairShare, config: Config, ours: Plan,
                    theirs: Plan) -> tuple[float, float] | None:
    """(ours, theirs) FGD scoring's measure in GPUs when `ours` leaves less by at least MIN_GAIN, else None."""
    pf = PlanFragmentation(state, fs, config)
    a, b = pf.of(ours), pf.of(theirs)
    return (a / DEV, b / DEV) if a < b - MIN_GAIN else None
