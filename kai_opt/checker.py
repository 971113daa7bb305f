"""The independent checker of a plan's invariants (DESIGN section 5). Every plan passes it before it is applied
or printed; a violation is a bug in an engine and is raised loudly (PlanViolation), never silently dropped.

It recomputes everything from the ClusterState and the plan alone (it shares no code with the engines; which rules
an eviction reason is held to is read from the actions' declaration, kai_opt.actions, and checked here):
- capacity: binds fit now (evicted pods still hold their resources); after every eviction finishes and every
  bind/pipeline/move lands, no node resource and no GPU device is over its capacity;
- gangs: a group (and each leaf sub-group) that receives placements ends with at least its minimum active;
- queues: no queue or ancestor ends above a limit the plan pushed it over; new non-preemptible placements keep
  the queue's non-preemptible usage within its deserved quota;
- evictions: a known reason; a beneficiary placed in the same plan (except stale-gang; or placed in this cycle and
  then taken back by a later victim search for a group so served, which its pending reason says); a victim gang
  keeps at least its minimum or goes whole; victims preemptible, not younger than their min runtime, and for
  preempt of lower priority in the same queue; consolidated pods re-placed in the same plan (another node, or
  other devices of the same node);
- placements only for our pending, ungated pods; evictions only for our running pods; no pod twice;
- a gpu-memory pod only on a node with a GPU-memory label whose devices hold its request (KAI's rule).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from kai_opt.actions import EVICTION_RULES, BeneficiaryQueue, EvictionRules, MinRuntime
from kai_opt.config import Config
from kai_opt.dra.allocate import shares_on, take_share
from kai_opt.dra.prepare import query_of
from kai_opt.fairshare.share import FairShare
from kai_opt.plan import WITHDRAWN, Plan, Reason
from kai_opt.state import R_GPU, ClusterState, PodStatus
from kai_opt.state.segments import concat_ranges

EPS = 1e-6
DEV = 1000


class PlanViolation(AssertionError):
    def __init__(self, problems: list[str], nodes: Collection[int] = ()) -> None:
        self.problems = problems
        self.nodes = frozenset(nodes)  # the nodes a capacity problem names (resources or devices over capacity)
        super().__init__(f"plan violates {len(problems)} invariant(s): " + "; ".join(problems[:10]))


@dataclass
class _Decisions:
    """The plan's decisions by pod (the last one wins where a pod appears twice, which is itself a problem) and
    as arrays in plan order, for the vectorised checks."""

    placed: dict[int, tuple[int, tuple[int, ...], bool]]  # pod -> (node, devices, pipelined)
    moved: dict[int, tuple[int, tuple[int, ...]]]  # pod -> (node, devices): consolidation re-placements
    evicted: dict[int, tuple[str, int]]  # pod -> (reason, beneficiary)

    def arrays(self, which: dict[int, tuple[Any, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """(pods, nodes) of `placed` or `moved`."""
        pods = np.fromiter(which.keys(), dtype=np.int64, count=len(which))
        nodes = np.fromiter((v[0] for v in which.values()), dtype=np.int64, count=len(which))
        return pods, nodes


def held_amounts(state: ClusterState, pods: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node resources, milli-GPU per device) that pods hold on nodes: gpu-memory converted with the node's GPU
    memory (rounded up, at most a device), shares at their fraction, whole GPUs a device each."""
    req = state.pod_req[pods].copy()
    per = np.where(state.pod_gpu_whole[pods] > 0, DEV, 0).astype(np.int64)
    frac = state.pod_gpu_frac[pods].astype(np.int64)
    per = np.where(frac > 0, frac, per)
    mem = state.pod_gpu_mem[pods].astype(np.int64)
    if mem.any():
        node_mem = np.maximum(state.node_gpu_mem_mib[nodes].astype(np.int64), 1)
        conv = np.minimum(DEV, -(-mem * DEV // node_mem))
        per = np.where((frac == 0) & (mem > 0), conv, per)
        is_mem = mem > 0
        req[is_mem, R_GPU] = per[is_mem] * state.pod_gpu_ndev[pods][is_mem]
    return req, per


def check_plan(state: ClusterState, plan: Plan, fs: FairShare, config: Config) -> None:
    problems: list[str] = []
    names = _PodNames(state)  # only messages use them
    dec = _decisions(state, plan, names, problems)
    overfilled: set[int] = set()
    problems += _capacity_problems(state, dec, names, overfilled)
    active_after = (state.pod_status == PodStatus.BOUND) | (state.pod_status == PodStatus.PIPELINED)
    active_after[list(dec.evicted)] = False
    active_after[list(dec.placed)] = True
    active_after[list(dec.moved)] = True  # a consolidated pod ends on its new node
    problems += _gang_problems(state, dec, active_after)
    problems += _queue_problems(state, fs, dec, names)
    problems += _eviction_problems(state, config, dec, active_after, names, plan.pending)
    if state.dra is not None:
        problems += _dra_problems(state, dec, active_after, names)
    if problems:
        raise PlanViolation(problems, overfilled)


def _decisions(state: ClusterState, plan: Plan, names: _PodNames, problems: list[str]) -> _Decisions:
    """Index the plan by pod; a pod placed, re-placed or evicted twice, a placement of a pod that is not one of
    our pending ungated pods or onto an unschedulable node, an eviction of a pod that is not one of our running
    pods, a gpu-memory pod where KAI's rule refuses it."""
    st = state.pod_status
    placed: dict[int, tuple[int, tuple[int, ...], bool]] = {}
    moved: dict[int, tuple[int, tuple[int, ...]]] = {}
    for pl in plan.placements:
        if pl.moved:
            if pl.pod in moved:
                problems.append(f"pod {names[pl.pod]} re-placed twice")
            moved[pl.pod] = (pl.node, pl.devices)
            continue
        if pl.pod in placed:
            problems.append(f"pod {names[pl.pod]} placed twice")
        placed[pl.pod] = (pl.node, pl.devices, pl.pipelined)
    if plan.placements:
        pods = np.fromiter((pl.pod for pl in plan.placements), dtype=np.int64, count=len(plan.placements))
        nodes = np.fromiter((pl.node for pl in plan.placements), dtype=np.int64, count=len(plan.placements))
        is_moved = np.fromiter((pl.moved for pl in plan.placements), dtype=bool, count=len(plan.placements))
        for i in np.nonzero(state.pod_gpu_mem[pods] > 0)[0].tolist():
            why = _gpu_memory_problem(state, int(pods[i]), int(nodes[i]))
            if why:
                problems.append(f"pod {names[int(pods[i])]} {'re-' if is_moved[i] else ''}placed on "
                                f"{state.node_names[int(nodes[i])]}: {why}")
        fresh = ~is_moved
        bad = fresh & ((st[pods] != PodStatus.PENDING) | ~state.pod_ours[pods].astype(bool))
        unschedulable = fresh & ~state.node_ok[nodes].astype(bool)
        for i in np.nonzero(bad | unschedulable)[0].tolist():
            if bad[i]:
                problems.append(f"pod {names[int(pods[i])]} is not one of our pending, ungated pods")
            if unschedulable[i]:
                problems.append(f"pod {names[int(pods[i])]} placed on unschedulable node "
                                f"{state.node_names[int(nodes[i])]}")
    evicted: dict[int, tuple[str, int]] = {}
    for e in plan.evictions:
        if e.pod in evicted:
            problems.append(f"pod {names[e.pod]} evicted twice")
        evicted[e.pod] = (e.reason, e.beneficiary)
    if plan.evictions:
        ev = np.fromiter((e.pod for e in plan.evictions), dtype=np.int64, count=len(plan.evictions))
        for p in ev[(st[ev] != PodStatus.BOUND) | ~state.pod_ours[ev].astype(bool)].tolist():
            problems.append(f"pod {names[p]} evicted but it is not one of our running pods")
    return _Decisions(placed, moved, evicted)


def flat_devices(state: ClusterState, pods: np.ndarray, nodes: np.ndarray, devices: list[tuple[int, ...]],
                  per: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(which decision, global device, milli-GPU, valid) per device of each decision; `devices` are indexes
    within the node, valid where the node has that device."""
    counts = np.fromiter((len(d) for d in devices), dtype=np.int64, count=len(devices))
    local = np.fromiter((d for ds in devices for d in ds), dtype=np.int64, count=int(counts.sum()))
    owner = np.repeat(np.arange(len(devices)), counts)
    base = state.dev_start[nodes][owner]
    valid = (local >= 0) & (local < state.dev_start[nodes + 1][owner] - base)
    return owner, base + local, per[owner], valid


def _capacity_problems(state: ClusterState, dec: _Decisions, names: _PodNames, overfilled: set[int]) -> list[str]:
    """Binds fit now (evicted pods still hold their resources); once every eviction and release finishes and every
    bind, pipelined pod and move lands, no node resource and no GPU device is over capacity; each pod gets the
    devices it needs, on its node. The nodes over capacity go into `overfilled`."""
    problems: list[str] = []
    now_used = state.node_used.copy()
    final = state.node_used - state.node_releasing + state.node_pipelined  # releasing pods will be gone
    dev_now = state.dev_used.copy()
    dev_final = state.dev_used - state.dev_releasing + state.dev_pipelined
    if dec.evicted:
        ev = np.fromiter(dec.evicted.keys(), dtype=np.int64, count=len(dec.evicted))
        ev_nodes = state.pod_node[ev].astype(np.int64)
        amount, per = held_amounts(state, ev, ev_nodes)
        np.subtract.at(final, ev_nodes, amount)
        counts = state.pod_dev_start[ev + 1] - state.pod_dev_start[ev]
        devs = state.pod_dev[concat_ranges(state.pod_dev_start[ev], counts)[0]]
        np.subtract.at(dev_final, devs, np.repeat(per, counts))
    if dec.placed:
        pods, nodes = dec.arrays(dec.placed)
        piped = np.fromiter((v[2] for v in dec.placed.values()), dtype=bool, count=len(pods))
        devices = [v[1] for v in dec.placed.values()]
        amount, per = held_amounts(state, pods, nodes)
        np.add.at(final, nodes, amount)
        np.add.at(now_used, nodes[~piped], amount[~piped])
        got = np.fromiter((len(d) for d in devices), dtype=np.int64, count=len(devices))
        needed = _devices_needed(state, pods)
        owner, glob, milli, valid = flat_devices(state, pods, nodes, devices, per)
        for i in np.nonzero(got != needed)[0].tolist():
            problems.append(f"pod {names[int(pods[i])]} got {int(got[i])} GPU devices, needs {int(needed[i])}")
        for k in np.nonzero(~valid)[0].tolist():
            i = int(owner[k])
            problems.append(f"pod {names[int(pods[i])]}: device {int(glob[k] - state.dev_start[nodes[i]])} does "
                            f"not exist on {state.node_names[int(nodes[i])]}")
        np.add.at(dev_final, glob[valid], milli[valid])
        now = valid & ~piped[owner]
        np.add.at(dev_now, glob[now], milli[now])
    if dec.moved:
        pods, nodes = dec.arrays(dec.moved)
        for p in pods.tolist():
            if p not in dec.evicted:
                problems.append(f"pod {names[p]} re-placed without being evicted")
        amount, per = held_amounts(state, pods, nodes)
        np.add.at(final, nodes, amount)
        _owner, glob, milli, _valid = flat_devices(state, pods, nodes, [v[1] for v in dec.moved.values()], per)
        np.add.at(dev_final, glob, milli)
    final_before = state.node_used - state.node_releasing + state.node_pipelined
    dev_final_before = state.dev_used - state.dev_releasing + state.dev_pipelined
    for label, used, before in (("now", now_used, state.node_used), ("after the plan", final, final_before)):
        over = np.argwhere(used > state.node_alloc)
        for n, r in over[:20].tolist():
            if before[n, r] > state.node_alloc[n, r] and (label == "now" or used[n, r] <= before[n, r]):
                continue  # was already over before the plan (inconsistent snapshot), not the plan's doing
            overfilled.add(n)
            problems.append(f"node {state.node_names[n]} over capacity {label} in {state.resources[r]}: "
                            f"{int(used[n, r])} > {int(state.node_alloc[n, r])}")
    for label, used, before in (("now", dev_now, state.dev_used), ("after the plan", dev_final, dev_final_before)):
        for d in np.nonzero(used > DEV)[0][:20].tolist():
            if before[d] > DEV and (label == "now" or used[d] <= before[d]):
                continue  # as for nodes
            n = int(np.searchsorted(state.dev_start, d, side="right") - 1)
            overfilled.add(n)
            problems.append(f"GPU device {d - int(state.dev_start[n])} of {state.node_names[n]} over capacity "
                            f"{label}: {int(used[d])} milli-GPU")
    return problems


def _gang_problems(state: ClusterState, dec: _Decisions, active_after: np.ndarray) -> list[str]:
    """A group (and each leaf sub-group holding pods) that receives placements ends with at least its minimum
    active; a group that is placed or moved stays inside one domain of each required topology level."""
    problems: list[str] = []
    if not dec.placed and not dec.moved:
        return problems
    with_placements = np.unique(state.pod_pg[list(dec.placed)]) if dec.placed else np.zeros(0, dtype=np.int64)
    with_moves = np.unique(state.pod_pg[list(dec.moved)]) if dec.moved else np.zeros(0, dtype=np.int64)
    grouped = state.pod_pg >= 0
    have = np.bincount(state.pod_pg[active_after & grouped], minlength=state.n_groups)
    # leaf sub-groups (no child sub-group) that hold pods of a group with placements
    is_parent = np.zeros(len(state.sg_pg), dtype=bool)
    is_parent[state.sg_parent[state.sg_parent >= 0]] = True
    in_sg = state.pod_sg >= 0
    sg_have = np.bincount(state.pod_sg[active_after & in_sg], minlength=len(state.sg_pg))
    touched = np.zeros(state.n_groups, dtype=bool)
    touched[with_placements] = True
    sg_with_pods = np.zeros(len(state.sg_pg), dtype=bool)
    sg_with_pods[state.pod_sg[in_sg & grouped & touched[np.maximum(state.pod_pg, 0)]]] = True
    short_sg = np.nonzero(sg_with_pods & ~is_parent & (sg_have < state.sg_min_member))[0]
    short_by_group: dict[int, list[int]] = defaultdict(list)
    for s in short_sg.tolist():
        short_by_group[int(state.sg_pg[s])].append(s)
    topo = _topology_groups(state)
    for g in np.setdiff1d(with_moves, with_placements).tolist():  # a move keeps the count; check the domain
        if topo[g]:
            problems += _topology_problems(state, g, state.group_pods(g), active_after, dec.placed, dec.moved)
    for g in with_placements.tolist():
        if int(have[g]) < int(state.pg_min_member[g]):
            problems.append(f"podgroup {state.pg_keys[g]} gets placements but ends with {int(have[g])} pods, "
                            f"minMember {int(state.pg_min_member[g])}")
        for s in short_by_group.get(g, ()):
            problems.append(f"podgroup {state.pg_keys[g]} subgroup {state.sg_names[s]} ends with {int(sg_have[s])} "
                            f"pods, minMember {int(state.sg_min_member[s])}")
        if topo[g]:
            problems += _topology_problems(state, g, state.group_pods(g), active_after, dec.placed, dec.moved)
    return problems


def _topology_groups(state: ClusterState) -> np.ndarray:
    """Per podgroup: it, or one of its sub-groups, requires a topology domain."""
    out = (state.pg_topology >= 0) & (state.pg_required_level >= 0)
    req = (state.sg_topology >= 0) & (state.sg_required_level >= 0)
    out = out.copy()
    out[state.sg_pg[req]] = True
    return out


def _queue_problems(state: ClusterState, fs: FairShare, dec: _Decisions, names: _PodNames) -> list[str]:
    """No queue or ancestor ends above a limit the plan pushed it over; new non-preemptible placements keep the
    queue's non-preemptible usage within its deserved quota."""
    problems: list[str] = []
    delta = np.zeros((state.n_queues, 3))
    delta_np = np.zeros((state.n_queues, 3))
    ancestors = state.q_ancestors
    # (row, amount index, sign) in the order the plan adds them: placements, then evictions
    parts = []
    if dec.placed:
        pods, nodes = dec.arrays(dec.placed)
        parts.append((pods, nodes, 1.0))
    if dec.evicted:
        ev = np.fromiter(dec.evicted.keys(), dtype=np.int64, count=len(dec.evicted))
        parts.append((ev, state.pod_node[ev].astype(np.int64), -1.0))
    for pods, nodes, sign in parts:
        groups = state.pod_pg[pods]
        queues = np.where(groups >= 0, state.pg_queue[np.maximum(groups, 0)], -1)
        amounts = state.pod_queue_request(pods, nodes) * sign
        rows, which, rows_np, which_np = [], [], [], []
        for k, (q, g) in enumerate(zip(queues.tolist(), groups.tolist(), strict=True)):
            if q < 0:
                if sign > 0:
                    problems.append(f"pod {names[int(pods[k])]} placed although its podgroup has no queue")
                continue
            rows.extend(ancestors[q])
            which.extend([k] * len(ancestors[q]))
            if not state.pg_preemptible[g]:
                rows_np.extend(ancestors[q])
                which_np.extend([k] * len(ancestors[q]))
        np.add.at(delta, np.array(rows, dtype=np.int64), amounts[np.array(which, dtype=np.int64)])
        np.add.at(delta_np, np.array(rows_np, dtype=np.int64), amounts[np.array(which_np, dtype=np.int64)])
    after = fs.allocated + delta
    after_np = fs.allocated_np + delta_np
    over_limit = (fs.limit != -1) & (delta > EPS) & (after > fs.limit + EPS)
    over_quota = (fs.deserved != -1) & (delta_np > EPS) & (after_np > fs.deserved + EPS)
    for q, r in np.argwhere(over_limit | over_quota).tolist():
        res = ("gpu", "cpu", "memory")[r]
        if over_limit[q, r]:
            problems.append(f"queue {state.q_names[q]} exceeds its {res} limit {fs.limit[q, r]:g}: {after[q, r]:g}")
        if over_quota[q, r]:
            problems.append(f"queue {state.q_names[q]} non-preemptible {res} {after_np[q, r]:g} exceeds "
                            f"its quota {fs.deserved[q, r]:g}")
    return problems


def _served(state: ClusterState, pending: dict[int, list[Reason]], placed: set[int]) -> set[int]:
    """The groups an eviction may name as its beneficiary: the placed ones, and a group placed in this cycle whose
    placement a later victim search took back (KAI's victims include pods placed in the same session; its pending
    reason names the group it was taken for) when that group is itself served: the room evicted for the first went
    to the second."""
    withdrawn = [(g, str((r.details or {}).get("for", ""))) for g, rs in pending.items() for r in rs
                 if r.code == WITHDRAWN]
    index = {k: i for i, k in enumerate(state.pg_keys)} if withdrawn else {}
    taken = {g: index.get(by) for g, by in withdrawn}
    out = set(placed)
    grew = True
    while grew:
        grew = False
        for g, by in taken.items():
            if g not in out and by is not None and by in out:
                out.add(g)
                grew = True
    return out


def _eviction_problems(state: ClusterState, config: Config, dec: _Decisions, active_after: np.ndarray,
                       names: _PodNames, pending: dict[int, list[Reason]]) -> list[str]:
    """A known reason; a beneficiary placed in the same plan (except stale-gang); a victim gang keeps at least its
    minimum or goes whole; victims preemptible, not younger than their min runtime, and for preempt of lower
    priority in the same queue; consolidated pods re-placed in the same plan."""
    problems: list[str] = []
    evicted, moved = dec.evicted, dec.moved
    victim_groups = {int(state.pod_pg[p]) for p in evicted if p not in moved}
    for g in sorted(victim_groups):
        pods = state.group_pods(g)
        left = int(active_after[pods].sum())
        if 0 < left < int(state.pg_min_member[g]) and not any(_for_no_one(evicted[p][0]) for p in pods.tolist()
                                                              if p in evicted):
            problems.append(f"podgroup {state.pg_keys[g]} is left with {left} pods after evictions, below its "
                            f"minMember {int(state.pg_min_member[g])} (a victim gang goes whole)")
    placed_groups = _served(state, pending, {int(state.pod_pg[p]) for p in dec.placed})
    runtimes: dict[int, float] = {}
    for p, (reason, b) in evicted.items():
        rules = EVICTION_RULES.get(reason)
        if rules is None:
            problems.append(f"pod {names[p]} evicted with unknown reason {reason!r}")
            continue
        problems += _victim_problems(state, config, rules, p, b, placed_groups, moved, runtimes, names)
    return problems


def _for_no_one(reason: str) -> bool:
    """An eviction of an action that evicts for no beneficiary (stale-gang): its gang may go below its minimum."""
    rules = EVICTION_RULES.get(reason)
    return rules is not None and not rules.beneficiary


def _victim_problems(state: ClusterState, config: Config, rules: EvictionRules, p: int, b: int,
                     placed_groups: set[int], moved: dict[int, tuple[int, tuple[int, ...]]], runtimes: dict[int, float],
                     names: _PodNames) -> list[str]:
    """Pod p's eviction (for beneficiary b) against the rules of the action that wrote it."""
    if not rules.beneficiary:
        return []
    problems: list[str] = []
    g = int(state.pod_pg[p])
    reason = rules.reason
    if b < 0 or b not in placed_groups:
        problems.append(f"pod {names[p]} evicted ({reason}) without a beneficiary placed in the plan")
    if not state.pg_preemptible[g]:
        problems.append(f"pod {names[p]} evicted ({reason}) but its podgroup is non-preemptible")
    if rules.moved and p not in moved:
        problems.append(f"pod {names[p]} {rules.verb} but not re-placed")
    if rules.min_runtime is not None:
        q = int(state.pg_queue[g])
        preempt = rules.min_runtime == MinRuntime.preempt
        runtime_limit = (state.q_preempt_min_runtime if preempt else state.q_reclaim_min_runtime)[q]
        if math.isnan(runtime_limit):
            runtime_limit = config.preempt_min_runtime_s if preempt else config.reclaim_min_runtime_s
        if runtime_limit > 0:
            if g not in runtimes:
                runtimes[g] = _runtime(state, g)
            if runtimes[g] < runtime_limit:
                problems.append(f"pod {names[p]} evicted ({reason}) before its min runtime {runtime_limit:g}s")
    if b >= 0:
        same_queue = int(state.pg_queue[b]) == int(state.pg_queue[g])
        if rules.beneficiary_queue == BeneficiaryQueue.same and not same_queue:
            problems.append(f"pod {names[p]} {rules.verb} for a podgroup of another queue")
        if rules.lower_priority and int(state.pg_priority[g]) >= int(state.pg_priority[b]):
            problems.append(f"pod {names[p]} {rules.verb} by equal or lower priority")
        if rules.beneficiary_queue == BeneficiaryQueue.other and same_queue:
            problems.append(f"pod {names[p]} {rules.verb} for a podgroup of its own queue")
    return problems


def _gpu_memory_problem(state: ClusterState, p: int, n: int) -> str | None:
    """Why gpu-memory pod p may not go onto node n: the node's GPU memory is not labelled, or one device has less
    memory than the pod asks per device."""
    if not state.node_gpu_mem_known[n]:
        return "a gpu-memory request on a node without a GPU-memory label"
    if int(state.pod_gpu_mem[p]) > int(state.node_gpu_mem_mib[n]):
        return (f"gpu-memory {int(state.pod_gpu_mem[p])} MiB per device, more than one device's "
                f"{int(state.node_gpu_mem_mib[n])} MiB")
    return None


def _devices_needed(state: ClusterState, pods: np.ndarray) -> np.ndarray:
    """GPU devices each pod needs: its whole GPUs, or the devices of its share."""
    whole = state.pod_gpu_whole[pods].astype(np.int64)
    share = (state.pod_gpu_frac[pods] > 0) | (state.pod_gpu_mem[pods] > 0)
    return np.where(whole > 0, whole, np.where(share, state.pod_gpu_ndev[pods].astype(np.int64), 0))


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
        doms: defaultdict[int, int] = defaultdict(int)
        for p in members.tolist():
            if active[p] and node_of[p] >= 0:
                doms[int(state.topologies[t].domain[lvl][node_of[p]])] += 1
        if len(doms) > 1 or -1 in doms:
            out.append(f"podgroup {state.pg_keys[g]} {what} spans {len(doms)} domains of required level "
                       f"{state.topologies[t].levels[lvl]}")
    return out


def _dra_problems(state: ClusterState, dec: _Decisions, active_after: np.ndarray, names: _PodNames) -> list[str]:
    """DRA claims after the plan: the users of a claim on one node, an allocated claim's users on its node, and
    per node the claims held there fit its free devices with every selector satisfied (devices of the node,
    re-evaluated here, are handed to the claims request by request; none is handed out twice)."""
    dra = state.dra
    assert dra is not None
    problems: list[str] = []
    where: dict[int, int] = {}
    for p in np.nonzero(active_after)[0].tolist():
        if p in dec.moved:
            where[p] = dec.moved[p][0]
        elif p in dec.placed:
            where[p] = dec.placed[p][0]
        elif state.pod_node[p] >= 0:
            where[p] = int(state.pod_node[p])
    per_node: dict[int, list[int]] = {}
    for ci, cp in enumerate(dra.claims):
        nodes = {where[u] for u in cp.users if u in where}
        if len(nodes) > 1:
            problems.append(f"claim {cp.key}: its pods are on {len(nodes)} nodes")
        fresh = [u for u in cp.users if u in dec.placed or u in dec.moved]
        if cp.nodes is not None and fresh and any(state.node_names[where[u]] not in cp.nodes for u in fresh):
            problems.append(f"claim {cp.key}: pod {names[fresh[0]]} placed off the claim's nodes")
        if cp.problem is not None and fresh:
            problems.append(f"claim {cp.key}: pod {names[fresh[0]]} placed though {cp.problem}")
        if not cp.fixed and cp.requests and nodes and (cp.claim is None or cp.claim.allocation is None):
            per_node.setdefault(next(iter(nodes)), []).append(ci)
    held: set[tuple[str, str, str]] = set()  # devices of allocated claims still held after the plan
    used: dict[tuple[str, str, str], dict[str, int]] = {}  # shares of shared devices still held after the plan
    for cp in dra.claims:
        if cp.claim is not None and cp.claim.allocation is not None and (
                cp.fixed or not cp.users or any(u in where for u in cp.users)):
            for r in cp.claim.allocation:
                if r.admin_access:
                    continue
                if r.consumed:
                    at = used.setdefault((r.driver, r.pool, r.device), {})
                    for k, v in r.consumed.items():
                        at[k] = at.get(k, 0) + v
                else:
                    held.add((r.driver, r.pool, r.device))
                    di = dra.index_of((r.driver, r.pool, r.device))
                    if di is not None:
                        dra.take_counters(di, used)
    for dev, amounts in used.items():
        d = dra.index_of(dev)
        if d is not None and any(v > dra.specs[d].capacity.get(k, 0) for k, v in amounts.items()):
            problems.append(f"shared device {'/'.join(dev)}: consumed {amounts} over its capacity")
    for n, claims in per_node.items():
        name = state.node_names[n]
        free = [d for d, dev in enumerate(dra.devices) if dev.node == name
                and (dev.driver, dev.pool, dev.name) not in held]
        taken: set[int] = set()
        for ci in claims:
            cp = dra.claims[ci]
            for request, alt, col in cp.requests:
                q = query_of(alt)
                share = dra.column_share.get(col)
                if share is not None and not alt.admin_access:  # a share on each of `count` distinct matching
                    matching = [d for d in shares_on(dra, name, col) if dra.query_matches(q, d)]  # devices
                    want = dra.specs[matching[0]].consumption(alt.capacity, dra.devices[matching[0]].driver) \
                        if matching else None  # by the rule of the node's kind (a column's kinds: one per node)
                    mine: set[int] = set()
                    for j in range(len(matching) if alt.mode == "All" else alt.count):
                        d = None if want is None else take_share(
                            dra, name, col, want, used, among=matching, skip=mine, rank=j)
                        if d is None:
                            problems.append(f"claim {cp.key} request {request}: share {j + 1} has no distinct "
                                            f"shared device on {name} with room for {want}")
                            break
                        mine.add(d)
                    if alt.mode == "All" and not matching:
                        problems.append(f"claim {cp.key} request {request}: no shared device on {name} for All")
                    continue
                fits = [d for d in free if d not in taken and dra.query_matches(q, d)]
                if not alt.admin_access and col in dra.column_counters:  # devices whose counters have room
                    fits.sort(key=lambda d: d in dra.out_of_play)
                    room = []
                    for d in fits:
                        if dra.counters_fit(d, used):
                            dra.take_counters(d, used)
                            room.append(d)
                        if alt.mode != "All" and len(room) == alt.count:
                            break
                    fits = room
                want_n = len(fits) if alt.mode == "All" else alt.count
                if len(fits) < want_n:
                    problems.append(f"claim {cp.key} request {request}: {len(fits)} free matching devices on "
                                    f"{name}, needs {want_n}")
                elif not alt.admin_access:
                    taken.update(fits[:want_n])
    for key, values in dra.counter_sets.items():
        over = {c: used[key][c] for c in values if used.get(key, {}).get(c, 0) > values[c]}
        if over:
            problems.append(f"counter set {'/'.join(key)}: consumed {over} over {values}")
    return problems
