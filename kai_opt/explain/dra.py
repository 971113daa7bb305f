"""A pod's DRA claims in an explanation: the devices each claim has or gets, or, when its pod waits, per request
what keeps the cluster's devices from it.

Rule: a device is counted under the first of these that fails for the request (so every device is counted
once): the device class's selectors (`class selector <expr>`), the request's selectors (`selector <expr>`), its
`capacity.requests` (`capacity`), a NoSchedule/NoExecute taint it does not tolerate (`taint <taint>`), taken
(`allocated to another claim`, its shared counter set used up, a counter set other than the one the node's new
claims take this cycle, or a shared device without the share's room: `no capacity left`); the rest are
`free`. The best node is the one with the most free matching devices. The devices of a placed pod's claim are
the allocation it has, else the ones the binder takes first on the plan's node (`kai_opt.dra.allocate.choose`).
A request whose matching devices on different nodes take different amounts (shares, shared counters) is counted
at the most of them on every node: the entry says so (`counted`), as the engines may refuse a node whose devices
would take less.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kai_opt.api.dra import DeviceRequest
from kai_opt.dra.allocate import choose
from kai_opt.dra.prepare import ClaimPlan, DraState, query_of
from kai_opt.explain.context import Context

MAX_PODS = 5  # pods of a group whose claims are listed


def claims_of_pods(ctx: Context, pods: list[int], node_of: dict[int, int]) -> list[dict[str, Any]]:
    """Per pod with claims (at most MAX_PODS): its claims, with devices (placed or running) or blockers."""
    st = ctx.state
    dra = st.dra
    if dra is None:
        return []
    out = []
    for p in pods:
        idx = dra.pod_claims.get(st.pods[p].key, [])
        if not idx:
            continue
        n = node_of.get(p, int(st.pod_node[p]))
        node = st.node_names[n] if n >= 0 else None
        out.append({"pod": st.pods[p].key, "claims": [claim_entry(dra, dra.claims[i], node) for i in idx]})
        if len(out) == MAX_PODS:
            break
    return out


def claim_entry(dra: DraState, cp: ClaimPlan, node: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"claim": cp.key}
    if cp.problem:
        out["problem"] = cp.problem
    if cp.larger:
        out["counted"] = list(cp.larger)
    alloc = cp.claim.allocation if cp.claim is not None else None
    if alloc is not None:
        out["devices"] = [f"{r.driver}/{r.pool}/{r.device}" for r in alloc]
        out["allocated"] = True
        return out
    if node is not None and cp.requests:
        got = choose(dra, cp, node, set(dra.allocated))
        if got is not None:
            out["devices"] = [f"{r.driver}/{r.pool}/{r.device}" + (f" (share {r.consumed})" if r.consumed else "")
                              for r in got]
            out["node"] = node
            return out
    spec = cp.claim.spec if cp.claim is not None else None
    requests = spec.requests if spec is not None else _template_requests(dra, cp)
    out["requests"] = [request_entry(dra, r) for r in requests]
    return out


def _template_requests(dra: DraState, cp: ClaimPlan) -> tuple[DeviceRequest, ...]:
    """The requests of a claim still to be made from its template (the chosen alternative of each)."""
    return tuple(DeviceRequest(name=name, alternatives=(alt,)) for name, alt, _col in cp.requests)


def request_entry(dra: DraState, r: DeviceRequest) -> dict[str, Any]:
    """Per alternative of the request: how many devices each rule keeps from it, and its best node."""
    alts = []
    for alt in r.alternatives:
        why: Counter[str] = Counter()
        free_on: Counter[str] = Counter()
        q = query_of(alt)
        share = None
        for d, dev in enumerate(dra.devices):
            reason = _blocker(dra, q, d)
            if reason is None and (dev.driver, dev.pool, dev.name) in dra.allocated:
                reason = "allocated to another claim"
            blocked = None if reason is not None or alt.admin_access else dra.blocked_set(d, dra.consumed)
            if blocked is not None:
                reason = f"shared counters of {blocked[2].removeprefix('counterSet:')} used up"
            if reason is None and d in dra.out_of_play:
                reason = "not on the node's counter set of this cycle"
            if reason is None and dra.specs[d].multiple_allocations and not alt.admin_access:
                share = dra.specs[d].consumption(alt.capacity, dev.driver)
                free = dra.free_capacity(d, dra.consumed)
                if share is None or any(free.get(k, 0) < v for k, v in share.items()):
                    reason = "no capacity left"
            why[reason or "free"] += 1
            if reason is None:
                free_on[dev.node] += 1
        need = alt.count if alt.mode == "ExactCount" else "All"
        entry: dict[str, Any] = {"request": alt.name, "device_class": alt.device_class, "count": need,
                                 "free": why.pop("free", 0), "blocked": dict(why.most_common())}
        if free_on:
            best, k = max(free_on.items(), key=lambda x: (x[1], x[0]))
            entry["best_node"] = {"node": best, "free": k}
        if share:
            entry["share"] = share
        alts.append(entry)
    return {"request": r.name, "alternatives": alts}


def _blocker(dra: DraState, q: Any, d: int) -> str | None:
    cls, sel, cap, tol = q
    if cls not in dra.class_selectors:
        return f"device class {cls} does not exist"
    for expr in dra.class_selectors[cls]:
        if not dra.selectors.matches(expr, d):
            return f"class selector {expr}"
    for expr in sel:
        if not dra.selectors.matches(expr, d):
            return f"selector {expr}"
    if cap and not dra.capacity_fits(dict(cap), d):
        return f"capacity {dict(cap)}"
    taint = dra.specs[d].untolerated(tol)
    if taint is not None:
        return f"taint {taint}"
    return None


def summary_lines(claims: list[dict[str, Any]]) -> list[str]:
    lines = []
    for pod in claims:
        for c in pod["claims"]:
            if c.get("devices"):
                how = "allocated" if c.get("allocated") else f"on {c['node']}"
                lines.append(f"claim {c['claim']} ({pod['pod']}): devices {', '.join(c['devices'])} ({how})")
                continue
            if c.get("problem"):
                lines.append(f"claim {c['claim']} ({pod['pod']}): {c['problem']}")
            lines += [f"claim {c['claim']} ({pod['pod']}): {note}" for note in c.get("counted", [])]
            for r in c.get("requests", []):
                for a in r["alternatives"]:
                    blocked = ", ".join(f"{n} {why}" for why, n in a["blocked"].items())
                    best = a.get("best_node")
                    where = f"; best node {best['node']} has {best['free']}" if best else ""
                    many = " distinct devices with room for a share each" if a.get("share") and a["count"] != 1 else ""
                    lines.append(f"claim {c['claim']} request {a['request']}: {a['free']} free matching devices, "
                                 f"needs {a['count']}{many}{where}" + (f" (blocked: {blocked})" if blocked else ""))
    return lines
