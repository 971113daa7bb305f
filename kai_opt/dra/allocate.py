"""Which devices a claim gets on its node, and claims after a plan (what the apiserver holds once it landed).

Rule: a claim's request takes `count` devices of its column's kind on the node, the first by (slice, name)
order that no allocated claim holds and no claim allocated earlier in the same pass took. A pod leaving its node
(evicted, deleted) leaves every claim's reservedFor; a claim no one reserves any more is deallocated (as the
resourceclaim controller does), so its devices are free again.
"""

from __future__ import annotations

from kai_opt.api.dra import AllocationResult, ConsumerRef, ResourceClaim
from kai_opt.dra.prepare import ClaimPlan, DraState


def free_devices(dra: DraState, node: str, taken: set[tuple[str, str, str]]) -> dict[str, list[int]]:
    """Per column: devices of the node no claim holds, in order."""
    out: dict[str, list[int]] = {}
    for d, dev in enumerate(dra.devices):
        if dev.node != node or dra.device_kind[d] < 0:
            continue
        if (dev.driver, dev.pool, dev.name) in taken:
            continue
        out.setdefault(dra.kind_column[dra.device_kind[d]], []).append(d)
    return out


def choose(dra: DraState, cp: ClaimPlan, node: str, taken: set[tuple[str, str, str]]) -> tuple[
        AllocationResult, ...] | None:
    """Devices for an unallocated claim on `node` (marked in `taken`), or None when the node lacks them."""
    free = free_devices(dra, node, taken)
    out: list[AllocationResult] = []
    for request, alt, col in cp.requests:
        pool = free.get(col, [])
        n = len(pool) if alt.mode == "All" else alt.count
        if len(pool) < n:
            return None
        picked = pool[:n]
        if not alt.admin_access:
            del pool[:n]
        for d in picked:
            dev = dra.devices[d]
            out.append(AllocationResult(request=request, driver=dev.driver, pool=dev.pool, device=dev.name,
                                        admin_access=alt.admin_access))
    for r in out:
        if not r.admin_access:
            taken.add((r.driver, r.pool, r.device))
    return tuple(out)


def claims_after(claims: list[ResourceClaim], dra: DraState, bound: dict[str, tuple[str, str | None]],
                 left: set[str]) -> list[ResourceClaim]:
    """Claims once the plan landed. `bound`: pod key -> (node, uid) of pods bound by the plan; `left`: pod keys
    that left their node."""
    by_key = {c.key: c for c in claims}
    taken = {(r.driver, r.pool, r.device) for c in claims for r in (c.allocation or ()) if not r.admin_access}
    for pod_key in left:  # releases first, so the devices are free for this plan's binds
        name = pod_key.split("/", 1)[1]
        for i in dra.pod_claims.get(pod_key, []):
            c = by_key.get(dra.claims[i].key)
            if c is None:
                continue
            rest = tuple(r for r in c.reserved_for if r.name != name)
            if not rest and c.allocation is not None:
                for r in c.allocation:
                    taken.discard((r.driver, r.pool, r.device))
                by_key[c.key] = c.model_copy(update={"reserved_for": rest, "allocation": None,
                                                     "allocation_nodes": ()})
            else:
                by_key[c.key] = c.model_copy(update={"reserved_for": rest})
    for pod_key, (node, uid) in bound.items():
        name = pod_key.split("/", 1)[1]
        for i in dra.pod_claims.get(pod_key, []):
            cp = dra.claims[i]
            c = by_key.get(cp.key)
            if c is None:  # made from a template: the claim's own object comes with the binder (kai_opt.k8s)
                continue
            update: dict[str, object] = {}
            if c.allocation is None:
                picked = choose(dra, cp, node, taken)
                if picked is None:
                    continue
                update["allocation"] = picked
            if all(r.name != name for r in c.reserved_for):
                update["reserved_for"] = (*c.reserved_for, ConsumerRef(name=name, uid=uid))
            by_key[cp.key] = c.model_copy(update=update)
    return list(by_key.values())
