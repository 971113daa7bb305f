"""`kai-opt explain`: why a pod, podgroup or queue ends a cycle the way it does. Pure: (state, config, plan) in,
a JSON-able dict out.

- placed (explain/placed.py): node, GPU devices, bind or pipeline and the evictions it waits for, the score terms
  that decided the node, the best alternatives;
- pending (explain/pending.py): the plan's Reasons verbatim, enriched with node-level counts, gang fit, queue
  limits, quota and fair share, victims' protection, topology, and a solver's minimal unblocking change;
- queue (explain/queue.py): fair share step by step, its pending work with the plan's reasons.

Reason messages and KAI-Scheduler: a gang that does not fit reads as KAI's ("Resources were found for N pods
while M are required for gang scheduling. ...") and a required topology that no domain satisfies exactly as KAI's
("Unable to schedule podgroup.\n<d>: node-group d can allocate only a of b required pods.\n...topology T,
requirement L couldn't be satisfied for job </j>."), without KAI's leading newline. The node-level part is
kube-scheduler's form ("0/N nodes are available: N Insufficient nvidia.com/gpu, ...") where KAI writes "N node(s)
didn't have enough resources: GPUs". A job larger than every domain of its level gets the per-domain lines too
(KAI: "...: not enough resources in the cluster to allocate the job"). tests/test_explain.py compares them.
"""

from __future__ import annotations

from typing import Any

from kai_opt.config import Config, Engine
from kai_opt.engine import run_cycle
from kai_opt.errors import KaiOptError
from kai_opt.explain.context import Context, find_pod, find_podgroup, find_queue
from kai_opt.explain.dra import claims_of_pods
from kai_opt.explain.dra import summary_lines as claim_lines
from kai_opt.explain.pending import explain_pending
from kai_opt.explain.placed import explain_placed
from kai_opt.explain.queue import explain_queue
from kai_opt.fairshare import FairShare, compute_fair_share
from kai_opt.formulation.second_hint import fgd_config, is_fgd_scored
from kai_opt.heuristics.positions import queue_positions
from kai_opt.plan import Plan
from kai_opt.state import ClusterState, PodStatus

STATUS = {PodStatus.PENDING: "pending", PodStatus.GATED: "gated", PodStatus.BOUND: "running",
          PodStatus.RELEASING: "releasing", PodStatus.IGNORED: "ignored", PodStatus.PIPELINED: "pipelined"}


def make_context(state: ClusterState, config: Config, *, plan: Plan | None = None, fs: FairShare | None = None,
                 engine: Engine | None = None, actions: tuple[str, ...] | None = None) -> Context:
    """The cycle to explain: the given plan, or one computed now with run_cycle (`actions`: a subset of the
    cycle's actions, as `run_cycle` takes them)."""
    if plan is None:
        plan, fs = run_cycle(state, config, engine=engine, actions=actions)
    if is_fgd_scored(plan):  # its nodes are ranked as that plan's placer ranked them
        config = fgd_config(config)
    return Context(state, config, plan, fs if fs is not None else compute_fair_share(state))


def explain(state: ClusterState, config: Config, *, pod: str | None = None, podgroup: str | None = None,
            queue: str | None = None, plan: Plan | None = None, fs: FairShare | None = None,
            engine: Engine | None = None, actions: tuple[str, ...] | None = None,
            solve: bool = True) -> dict[str, Any]:
    """Explain one target (exactly one of pod, podgroup, queue). Unknown names raise NotFoundError. `solve`:
    run the unblock model for a pending podgroup (off: only the reasons and the analyses)."""
    if sum(x is not None for x in (pod, podgroup, queue)) != 1:
        raise KaiOptError("explain needs exactly one of --pod, --podgroup, --queue")
    # resolve the name before any work, so an unknown one fails fast
    target = find_pod(state, pod) if pod is not None else find_podgroup(state, podgroup) if podgroup is not None \
        else find_queue(state, queue or "")
    ctx = make_context(state, config, plan=plan, fs=fs, engine=engine, actions=actions)
    head: dict[str, Any] = {"engine": ctx.plan.engine, "solver": ctx.plan.solver.as_dict()}
    if queue is not None:
        return {"target": {"kind": "queue", "name": queue}, **head, **explain_queue(ctx, target)}
    if pod is not None:
        return {"target": {"kind": "pod", "name": state.pods[target].key}, **head, **_pod(ctx, target, solve)}
    return {"target": {"kind": "podgroup", "name": state.pg_keys[target]}, **head, **_group(ctx, target, solve)}


def _group(ctx: Context, g: int, solve: bool, only: set[int] | None = None) -> dict[str, Any]:
    st, plan = ctx.state, ctx.plan
    q = int(st.pg_queue[g])
    out: dict[str, Any] = {"podgroup": st.pg_keys[g], "queue": st.q_names[q] if q >= 0 else None,
                           "priority": int(st.pg_priority[g]), "preemptible": bool(st.pg_preemptible[g]),
                           "min_member": int(st.pg_min_member[g])}
    pods = st.group_pods(g)
    placed = ctx.placements_of(g)
    evicted = [e for e in plan.evictions if int(st.pod_pg[e.pod]) == g]
    status = []
    if placed:
        status.append(f"placed: {sum(not p.pipelined for p in placed)} bind, {sum(p.pipelined for p in placed)} "
                      "pipeline")
        out["placed"] = explain_placed(ctx, g, only=only)
    if evicted:
        status.append(f"evicted: {len(evicted)} pod(s)")
        out["evictions"] = [_eviction(ctx, e.pod) for e in evicted]
    if g in plan.pending:
        status.append("pending")
        out["pending"] = explain_pending(ctx, g, solve=solve)
        pos = queue_positions(st, ctx.fs, ctx.config).get(g)
        if pos is not None:  # the order the cycle took it up in (`kai-opt queue`)
            out["position"] = {"overall": pos.overall, "in_queue": pos.in_queue}
    node_of = {pl.pod: pl.node for pl in placed}
    claims = claims_of_pods(ctx, [p for p in pods.tolist() if only is None or p in only], node_of)
    if claims:
        out["claims"] = claims
    if not status:
        counts: dict[str, int] = {}
        for p in pods.tolist():
            s = STATUS.get(PodStatus(int(st.pod_status[p])), "?")
            counts[s] = counts.get(s, 0) + 1
        status.append("unchanged by this plan: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    out["status"] = status
    out["summary"] = _summary(ctx, out)
    return out


def _pod(ctx: Context, p: int, solve: bool) -> dict[str, Any]:
    st, plan = ctx.state, ctx.plan
    g = int(st.pod_pg[p])
    pod = st.pods[p]
    base: dict[str, Any] = {"pod": pod.key, "status_in_snapshot": STATUS.get(PodStatus(int(st.pod_status[p])), "?")}
    if not st.pod_ours[p]:
        n = int(st.pod_node[p])
        base["summary"] = [f"not scheduled by kai-opt (schedulerName {pod.scheduler_name!r})"
                           + (f"; it holds resources on {st.node_names[n]}" if n >= 0 else "")]
        return base
    moved = [pl for pl in plan.placements if pl.moved and pl.pod == p]
    if moved:
        base["moved"] = {"from": st.node_names[int(st.pod_node[p])], "to": st.node_names[moved[0].node],
                         "gpu_devices": list(moved[0].devices), **_eviction(ctx, p)}
    if int(st.pod_status[p]) == PodStatus.GATED:
        base["summary"] = ["has scheduling gates: never placed until they are removed"]
        return base
    if g < 0:
        return base
    out = {**base, **_group(ctx, g, solve, only={p})}
    if any(e.pod == p for e in plan.evictions) and not moved:
        out["eviction"] = _eviction(ctx, p)
    return out


def _eviction(ctx: Context, p: int) -> dict[str, Any]:
    st = ctx.state
    e = next(e for e in ctx.plan.evictions if e.pod == p)
    n = int(st.pod_node[p])
    return {"pod": st.pods[p].key, "node": st.node_names[n] if n >= 0 else None, "reason": e.reason,
            "beneficiary": st.pg_keys[e.beneficiary] if e.beneficiary >= 0 else None}


def _summary(ctx: Context, out: dict[str, Any]) -> list[str]:
    lines = [f"{out['podgroup']} (queue {out['queue']}, priority {out['priority']}"
             f"{', preemptible' if out['preemptible'] else ''}, minMember {out['min_member']}): "
             + "; ".join(out["status"])]
    for pod in (out.get("placed") or {}).get("pods", []):
        line = f"{pod['pod']} -> {pod['node']} devices {pod['gpu_devices']} ({pod['how']})"
        if pod.get("decided_by"):
            line += f": {pod['decided_by']}"
        if pod.get("waits_for"):
            line += f"; waits for {len(pod['waits_for'])} pod(s) to leave"
        lines.append(line)
    for e in out.get("evictions", []):
        lines.append(f"evicted {e['pod']} on {e['node']}: {e['reason']}"
                     + (f" for {e['beneficiary']}" if e["beneficiary"] else ""))
    lines += claim_lines(out.get("claims", []))
    pend = out.get("pending")
    if "position" in out:
        lines.append(f"queue position {out['position']['overall']} in the cycle's order "
                     f"({out['position']['in_queue']} in queue {out['queue']})")
    if pend:
        for r in pend["reasons"]:
            lines.append(f"reason {r['code']}: {' '.join(r['message'].split())}")
        lines += pend.get("summary", [])
    return lines
