"""The independent checker of a plan's invariants (DESIGN section 5). Every plan passes it before it is applied
or printed; a violation is a bug in an engine and is raised loudly (PlanViolation), never silently dropped.

It recomputes everything from the ClusterState and the plan alone (it shares no code with the engines):
- capacity: binds fit now (evicted pods still hold their resources); after every eviction finishes and every
  bind/pipeline/move lands, no node resource and no GPU device is over its capacity;
- gangs: a group (and each leaf sub-group) that receives placements ends with at least its minimum active;
- queues: no queue or ancestor ends above a limit the plan pushed it over; new non-preemptible placements keep
  the queue's non-preemptible usage within its deserved quota;
- evictions: a known reason; a beneficiary placed in the same plan (except stale-gang); a victim gang keeps at
  least its minimum or goes whole; victims preemptible,
  not younger than their min runtime, and for preempt of lower priority in the same queue; consolidated pods
  re-placed in the same plan (another node, or other devices of the same node);
- placements only for our pending, ungated pods; evictions only for our running pods; no pod twice;
- a gpu-memory pod only on a node with a GPU-memory label whose devices hold its request (KAI's rule).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from kai_opt.config import Config
from kai_opt.fairshare.share import FairShare
from kai_opt.plan import EVICTION_REASONS, Plan
from kai_opt.state import R_GPU, ClusterState, PodStatus

EPS = 1e-6
DEV = 1000


class PlanViolation(AssertionError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"plan violates {len(problems)} invariant(s): " + "; ".join(problems[:10]))


def _amount(state: ClusterState, p: int, n: int) -> np.ndarray:
    a = state.pod_req[p].copy()
    if state.pod_gpu_mem[p]:
        a[R_GPU] = state.pod_gpu_per_device(p, n) * int(state.pod_gpu_ndev[p])
    return a


def check_plan(state: ClusterState, plan: Plan, fs: FairShare, config: Config) -> None:
    problems: list[str] = []
    names = _PodNames(state)  # only messages use them
    st = state.pod_status
    placed: dict[int, tuple[int, tuple[int, ...], bool]] = {}
    moved: dict[int, tuple[int, tuple[int, ...]]] = {}
    for pl in plan.placements:
        if state.pod_gpu_mem[pl.pod]:
            why = _gpu_memory_problem(state, pl.pod, pl.node)
            if why:
                problems.append(f"pod {names[pl.pod]} {'re-' if pl.moved else ''}placed on "
                                f"{state.node_names[pl.node]}: {why}")
        if pl.moved:
            if pl.pod in moved:
                problems.append(f"pod {names[pl.pod]} re-placed twice")
            moved[pl.pod] = (pl.node, pl.devices)
            continue
        if pl.pod in placed:
            problems.append(f"pod {names[pl.pod]} placed twice")
        placed[pl.pod] = (pl.node, pl.devices, pl.pipelined)
        if st[pl.pod] != PodStatus.PENDING or not state.pod_ours[pl.pod]:
            problems.append(f"pod {names[pl.pod]} is not one of our pending, ungated pods")
        if not state.node_ok[pl.node]:
            problems.append(f"pod {names[pl.pod]} placed on unschedulable node {state.node_names[pl.node]}")
    evicted: dict[int, tuple[str, int]] = {}
    for e in plan.evictions:
        if e.pod in evicted:
            problems.append(f"pod {names[e.pod]} evicted twice")
        evicted[e.pod] = (e.reason, e.beneficiary)
        if st[e.pod] != PodStatus.BOUND or not state.pod_ours[e.pod]:
            problems.append(f"pod {names[e.pod]} evicted but it is not one of our running pods")

    # -- capacity -------------------------------------------------------------------------------------------
    now_used = state.node_used.copy()
    final = state.node_used - state.node_releasing + state.node_pipelined  # releasing pods will be gone
    dev_now = state.dev_used.copy()
    dev_final = state.dev_used - state.dev_releasing + state.dev_pipelined
    for p, (_reason, _b) in evicted.items():
        n = int(state.pod_node[p])
        final[n] -= _amount(state, p, n)
        per = state.pod_gpu_per_device(p, n)
        for d in state.pod_devices(p):
            dev_final[d] -= per
    for p, (n, devs, pipelined) in placed.items():
        a = _amount(state, p, n)
        final[n] += a
        per = state.pod_gpu_per_device(p, n)
        base = int(state.dev_start[n])
        if len(devs) != _devices_needed(state, p):
            problems.append(f"pod {names[p]} got {len(devs)} GPU devices, needs {_devices_needed(state, p)}")
        for d in devs:
            if not 0 <= d < int(state.dev_start[n + 1]) - base:
                problems.append(f"pod {names[p]}: device {d} does not exist on {state.node_names[n]}")
                continue
            dev_final[base + d] += per
            if not pipelined:
                dev_now[base + d] += per
        if not pipelined:
            now_used[n] += a
    for p, (n, devs) in moved.items():
        if p not in evicted:
            problems.append(f"pod {names[p]} re-placed without being evicted")
        final[n] += _amount(state, p, n)
        per = state.pod_gpu_per_device(p, n)
        for d in devs:
            dev_final[int(state.dev_start[n]) + d] += per
    final_before = state.node_used - state.node_releasing + state.node_pipelined
    dev_final_before = state.dev_used - state.dev_releasing + state.dev_pipelined
    for label, used, before in (("now", now_used, state.node_used), ("after the plan", final, final_before)):
        over = np.argwhere(used > state.node_alloc)
        for n, r in over[:20].tolist():
            if before[n, r] > state.node_alloc[n, r] and (label == "now" or used[n, r] <= before[n, r]):
                continue  # was already over before the plan (inconsistent snapshot), not the plan's doing
            problems.append(f"node {state.node_names[n]} over capacity {label} in {state.resources[r]}: "
                            f"{int(used[n, r])} > {int(state.node_alloc[n, r])}")
    for label, used, before in (("now", dev_now, state.dev_used), ("after the plan", dev_final, dev_final_before)):
        for d in np.nonzero(used > DEV)[0][:20].tolist():
            if before[d] > DEV and (label == "now" or used[d] <= before[d]):
                continue  # as for nodes
            n = int(np.searchsorted(state.dev_start, d, side="right") - 1)
            problems.append(f"GPU device {d - int(state.dev_start[n])} of {state.node_names[n]} over capacity "
                            f"{label}: {int(used[d])} milli-GPU")

    # -- gangs ----------------------------------------------------------------------------------------------
    groups_with_placements = {int(state.pod_pg[p]) for p in placed}
    active_after = (st == PodStatus.BOUND) | (st == PodStatus.PIPELINED)
    active_after = active_after.copy()
    for p in evicted:
        active_after[p] = False
    for p in placed:
        active_after[p] = True
    for p in moved:  # a consolidated pod ends on its new node
        active_after[p] = True
    groups_with_moves = {int(state.pod_pg[p]) for p in moved}
    for g in sorted(groups_with_moves - groups_with_placements):  # a move keeps the count; check the domain
        problems += _topology_problems(state, g, state.group_pods(g), active_after, placed, moved)
    for g in sorted(groups_with_placements):
        pods = state.group_pods(g)
        have = int(active_after[pods].sum())
        if have < int(state.pg_min_member[g]):
            problems.append(f"podgroup {state.pg_keys[g]} gets placements but ends with {have} pods, "
                            f"minMember {int(state.pg_min_member[g])}")
        sgs = state.pod_sg[pods]
        parents = set(int(x) for x in state.sg_parent[state.sg_pg == g] if x >= 0)
        for s in sorted(set(int(x) for x in sgs if x >= 0) - parents):
            n_s = int(active_after[pods[sgs == s]].sum())
            if n_s < int(state.sg_min_member[s]):
                problems.append(f"podgroup {state.pg_keys[g]} subgroup {state.sg_names[s]} ends with {n_s} pods, "
                                f"minMember {int(state.sg_min_member[s])}")
        problems += _topology_problems(state, g, pods, active_after, placed, moved)

    # -- queues ---------------------------------------------------------------------------------------------
    delta = np.zeros((state.n_queues, 3))
    delta_np = np.zeros((state.n_queues, 3))
    ancestors = state.q_ancestors
    for p, (n, _d, _pipe) in placed.items():
        g = int(state.pod_pg[p])
        q = int(state.pg_queue[g])
        if q < 0:
            problems.append(f"pod {names[p]} placed although its podgroup has no queue")
            continue
        a = state.pod_queue_request(np.array([p]), np.array([n]))[0]
        delta[ancestors[q]] += a
        if not state.pg_preemptible[g]:
            delta_np[ancestors[q]] += a
    for p in evicted:
        g = int(state.pod_pg[p])
        q = int(state.pg_queue[g])
        if q >= 0:
            a = state.pod_queue_request(np.array([p]), np.array([int(state.pod_node[p])]))[0]
            delta[ancestors[q]] -= a
            if not state.pg_preemptible[g]:
                delta_np[ancestors[q]] -= a
    after = fs.allocated + delta
    after_np = fs.allocated_np + delta_np
    for q in range(state.n_queues):
        for r, res in enumerate(("gpu", "cpu", "memory")):
            lim = fs.limit[q, r]
            if lim != -1 and delta[q, r] > EPS and after[q, r] > lim + EPS:
                problems.append(f"queue {state.q_names[q]} exceeds its {res} limit {lim:g}: {after[q, r]:g}")
            des = fs.deserved[q, r]
            if des != -1 and delta_np[q, r] > EPS and after_np[q, r] > des + EPS:
                problems.append(f"queue {state.q_names[q]} non-preemptible {res} {after_np[q, r]:g} exceeds "
                                f"its quota {des:g}")

    # -- evictions ------------------------------------------------------------------------------------------
    victim_groups = {int(state.pod_pg[p]) for p in evicted if p not in moved}
    for g in sorted(victim_groups):
        pods = state.group_pods(g)
        left = int(active_after[pods].sum())
        if 0 < left < int(state.pg_min_member[g]) and not any(evicted[p][0] == "stale-gang" for p in pods
                                                              if p in evicted):
            problems.append(f"podgroup {state.pg_keys[g]} is left with {left} pods after evictions, below its "
                            f"minMember {int(state.pg_min_member[g])} (a victim gang goes whole)")
    placed_groups = {int(state.pod_pg[p]) for p in placed}
    for p, (reason, b) in evicted.items():
        g = int(state.pod_pg[p])
        if reason not in EVICTION_REASONS:
            problems.append(f"pod {names[p]} evicted with unknown reason {reason!r}")
            continue
        if reason == "stale-gang":
            continue
        if b < 0 or b not in placed_groups:
            problems.append(f"pod {names[p]} evicted ({reason}) without a beneficiary placed in the plan")
        if not state.pg_preemptible[g]:
            problems.append(f"pod {names[p]} evicted ({reason}) but its podgroup is non-preemptible")
        if reason == "consolidate" and p not in moved:
            problems.append(f"pod {names[p]} consolidated but not re-placed")
        if reason in ("reclaim", "preempt"):
            q = int(state.pg_queue[g])
            runtime_limit = (state.q_preempt_min_runtime if reason == "preempt" else state.q_reclaim_min_runtime)[q]
            if math.isnan(runtime_limit):
                runtime_limit = config.preempt_min_runtime_s if reason == "preempt" else config.reclaim_min_runtime_s
            if runtime_limit > 0 and _runtime(state, g) < runtime_limit:
                problems.append(f"pod {names[p]} evicted ({reason}) before its min runtime {runtime_limit:g}s")
        if reason == "preempt" and b >= 0:
            if int(state.pg_queue[b]) != int(state.pg_queue[g]):
                problems.append(f"pod {names[p]} preempted for a podgroup of another queue")
            if int(state.pg_priority[g]) >= int(state.pg_priority[b]):
                problems.append(f"pod {names[p]} preempted by equal or lower priority")
        if reason == "reclaim" and b >= 0 and int(state.pg_queue[b]) == int(state.pg_queue[g]):
            problems.append(f"pod {names[p]} reclaimed for a podgroup of its own queue")
    if problems:
        raise PlanViolation(problems)


def _gpu_memory_problem(state: ClusterState, p: int, n: int) -> str | None:
    """Why gpu-memory pod p may not go onto node n: the node's GPU memory is not labelled, or one device has less
    memory than the pod asks per device."""
    if not state.node_gpu_mem_known[n]:
        return "a gpu-memory request on a node without a GPU-memory label"
    if int(state.pod_gpu_mem[p]) > int(state.node_gpu_mem_mib[n]):
        return (f"gpu-memory {int(state.pod_gpu_mem[p])} MiB per device, more than one device's "
                f"{int(state.node_gpu_mem_mib[n])} MiB")
    return None


def _devices_needed(state: ClusterState, p: int) -> int:
    if state.pod_gpu_whole[p]:
        return int(state.pod_gpu_whole[p])
    if state.pod_gpu_frac[p] or state.pod_gpu_mem[p]:
        return int(state.pod_gpu_ndev[p])
    return 0


def _runtime(state: ClusterState, g: int) -> float:
    if not math.isnan(state.pg_last_start[g]):
        return state.now - float(state.pg_last_start[g])
    pods = state.group_pods(g)
    starts = state.pod_start[pods]
    starts = starts[(state.pod_status[pods] == PodStatus.BOUND) & ~np.isnan(starts)]
    return state.now - float(starts.min()) if len(starts) else math.inf


class _PodNames:
    """ns/name of pod i, made when a message needs it."""

    def __init__(self, state: ClusterState) -> None:
        self._pods = state.pods

    def __getitem__(self, i: int) -> str:
        return self._pods[i].key


def _topology_problems(state: ClusterState, g: int, pods: np.ndarray, active: np.ndarray,
                       placed: dict[int, tuple[int, tuple[int, ...], bool]],
                       moved: dict[int, tuple[int, tuple[int, ...]]]) -> list[str]:
    out: list[str] = []
    checks: list[tuple[int, int, np.ndarray, str]] = []
    if state.pg_topology[g] >= 0 and state.pg_required_level[g] >= 0:
        checks.append((int(state.pg_topology[g]), int(state.pg_required_level[g]), pods, "podgroup"))
    sgs = state.pod_sg[pods]
    for s in sorted(set(int(x) for x in sgs if x >= 0)):
        t, lvl = int(state.sg_topology[s]), int(state.sg_required_level[s])
        if t >= 0 and lvl >= 0:
            checks.append((t, lvl, pods[sgs == s], f"subgroup {state.sg_names[s]}"))
    if not checks:
        return out
    # where each of the group's pods ends up: a move wins over a placement, a placement over where it runs now
    node_of: dict[int, int] = {}
    for p in pods.tolist():
        if p in moved:
            node_of[p] = moved[p][0]
        elif p in placed:
            node_of[p] = placed[p][0]
        else:
            node_of[p] = int(state.pod_node[p])
    for t, lvl, members, what in checks:
        doms = defaultdict(int)
        for p in members.tolist():
            if active[p] and node_of[p] >= 0:
                doms[int(state.topologies[t].domain[lvl][node_of[p]])] += 1
        if len(doms) > 1 or -1 in doms:
            out.append(f"podgroup {state.pg_keys[g]} {what} spans {len(doms)} domains of required level "
                       f"{state.topologies[t].levels[lvl]}")
    return out
