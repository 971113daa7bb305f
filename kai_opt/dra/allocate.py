"""Which devices a claim gets on its node, and claims after a plan (what the apiserver holds once it landed).

Rule: a claim's request takes `count` devices of its column's kind on the node, the first by (slice, name)
order that no allocated claim holds and no claim allocated earlier in the same pass took, and whose counter sets
(every one it consumes from) have room. A request on shared devices (allowMultipleAllocations) takes one share on
each of `count` distinct devices (`All`: on every one of the column's devices on the node): the j-th share on the
node's j-th device by free capacity (the one the j-th capacity columns measure; the designated device first) when
that has room, else on the first with room the request has no share of yet; what it consumes is recorded with
each result.
A pod leaving its node (evicted, deleted) leaves every claim's reservedFor; a claim no one reserves any more is
deallocated (as the resourceclaim controller does), so its devices are free again.
"""

from __future__ import annotations

from collections.abc import Collection

from kai_opt.api.dra import AllocationResult, ConsumerRef, ResourceClaim
from kai_opt.dra.prepare import ClaimPlan, DeviceKey, DraState

Used = dict[DeviceKey, dict[str, int]]  # shared device -> capacity consumed


def free_devices(dra: DraState, node: str, taken: set[tuple[str, str, str]]) -> dict[str, list[int]]:
    """Per column: devices of the node no claim holds, in order."""
    out: dict[str, list[int]] = {}
    for d in dra.node_devices(node):
        dev = dra.devices[d]
        if dra.device_kind[d] < 0 or d in dra.out_of_play:
            continue
        if (dev.driver, dev.pool, dev.name) in taken:
            continue
        out.setdefault(dra.kind_column[dra.device_kind[d]], []).append(d)
    return out


def shares_on(dra: DraState, node: str, col: str) -> list[int]:
    """The node's shared devices of a column by rank: most free first, its designated one first."""
    return list(dra.ranked.get((node, col), []))


def take_share(dra: DraState, node: str, col: str, want: dict[str, int], used: Used,
               among: Collection[int] | None = None, skip: Collection[int] = (), rank: int = 0) -> int | None:
    """The device one share of `want` goes to on `node` (its consumption added to `used`), None: no room: the
    `rank`-th device when it has room (and is `among`, not in `skip`), else the first that has."""
    ranked = shares_on(dra, node, col)
    for d in ranked[rank:rank + 1] + ranked[:rank] + ranked[rank + 1:]:
        if (among is not None and d not in among) or d in skip:
            continue
        free = dra.free_capacity(d, used)
        if all(free.get(k, 0) >= v for k, v in want.items()):
            mine = used.setdefault(dra.key(d), {})
            for k, v in want.items():
                mine[k] = mine.get(k, 0) + v
            return d
    return None


def choose(dra: DraState, cp: ClaimPlan, node: str, taken: set[tuple[str, str, str]],
           used: Used | None = None) -> tuple[AllocationResult, ...] | None:
    """Devices for an unallocated claim on `node` (marked in `taken`, shares added to `used`: by default the
    state's own record), or None when the node lacks them."""
    used = {k: dict(v) for k, v in dra.consumed.items()} if used is None else used
    before = {k: dict(v) for k, v in used.items()}  # given back when the node lacks devices
    got = _choose(dra, cp, node, taken, used)
    if got is None:
        used.clear()
        used.update(before)
    return got


def _choose(dra: DraState, cp: ClaimPlan, node: str, taken: set[tuple[str, str, str]],
            used: Used) -> tuple[AllocationResult, ...] | None:
    free = free_devices(dra, node, taken)
    out: list[AllocationResult] = []
    for request, alt, col in cp.requests:
        share = dra.column_share.get(col)
        if share is not None and not alt.admin_access:
            ranked = shares_on(dra, node, col)
            want = dra.specs[ranked[0]].consumption(alt.capacity, dra.devices[ranked[0]].driver) if ranked \
                else None  # the node's devices of the column are of one kind: what its rule gives
            if want is None:
                return None
            mine: set[int] = set()  # distinct devices: one share of the request each
            for j in range(len(ranked) if alt.mode == "All" else alt.count):
                d = take_share(dra, node, col, want, used, skip=mine, rank=j)
                if d is None:
                    return None
                mine.add(d)
                dev = dra.devices[d]
                out.append(AllocationResult(request=request, driver=dev.driver, pool=dev.pool, device=dev.name,
                                            consumed=want))
            continue
        pool = free.get(col, [])
        n = len(pool) if alt.mode == "All" else alt.count
        picked: list[int] = []
        for d in pool:  # devices whose shared counters have room (all of them without counters)
            if len(picked) == n:
                break
            if alt.admin_access or dra.counters_fit(d, used):
                picked.append(d)
                if not alt.admin_access:
                    dra.take_counters(d, used)
        if len(picked) < n:
            return None
        if not alt.admin_access:
            pool[:] = [d for d in pool if d not in picked]
        for d in picked:
            dev = dra.devices[d]
            out.append(AllocationResult(request=request, driver=dev.driver, pool=dev.pool, device=dev.name,
                                        admin_access=alt.admin_access))
    for r in out:
        if not r.admin_access and not r.consumed:
            taken.add((r.driver, r.pool, r.device))
    return tuple(out)


def claims_after(claims: list[ResourceClaim], dra: DraState, bound: dict[str, tuple[str, str | None]],
                 left: set[str]) -> list[ResourceClaim]:
    """Claims once the plan landed. `bound`: pod key -> (node, uid) of pods bound by the plan; `left`: pod keys
    that left their node."""
    by_key = {c.key: c for c in claims}
    taken = {(r.driver, r.pool, r.device) for c in claims for r in (c.allocation or ())
             if not r.admin_access and not r.consumed}
    used: Used = {k: dict(v) for k, v in dra.consumed.items()}
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
                    di = dra.index_of((r.driver, r.pool, r.device))
                    if di is not None and not r.admin_access:
                        dra.take_counters(di, used, -1)
                    mine = used.get((r.driver, r.pool, r.device), {})
                    for k, v in r.consumed.items():
                        mine[k] = mine.get(k, 0) - v
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
                picked = choose(dra, cp, node, taken, used)
                if picked is None:
                    continue
                update["allocation"] = picked
            if all(r.name != name for r in c.reserved_for):
                update["reserved_for"] = (*c.reserved_for, ConsumerRef(name=name, uid=uid))
            by_key[cp.key] = c.model_copy(update=update)
    return list(by_key.values())
