"""Turn a CP-SAT solution into a plan: evictions first, then pods onto their nodes and devices, bind when the
pod fits now and pipeline when it waits for releases (a gang waits together), then the greedy allocate pass
fills what the model left (work outside the window, leftover room)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from kai_opt.formulation.model import Built, share_size
from kai_opt.formulation.scope import Scope
from kai_opt.heuristics.actions import Actions
from kai_opt.heuristics.session import DEV, Session


class DecodeError(RuntimeError):
    pass


def decode(sess: Session, acts: Actions, scope: Scope, built: Built, values: list[int]) -> None:
    """Apply the solution to `sess` (a fresh session of the same cycle). Raises DecodeError if it does not fit."""
    st = sess.state

    def val(v) -> int:
        return int(values[v.index])

    placed_groups = {i for i, g in enumerate(built.gang) if val(g)}
    shape_nodes: dict[int, dict[int, int]] = defaultdict(dict)  # pool (its first shape) -> node -> pods
    for (s, n), v in built.place.items():
        k = val(v)
        if k:
            shape_nodes[s][n] = k
    # the pods each pool places: a lone shape's pods in order, a pool's shapes each as many as placed[s] says
    queues: dict[int, list[int]] = defaultdict(list)
    for s, shape in enumerate(scope.shapes):
        take = val(built.placed[s]) if s in built.placed else len(shape.pods)
        queues[built.pool_of[s]].extend(shape.pods[:take])
    # evictions, each with a beneficiary that is placed and allowed to take it
    for vi, v in enumerate(scope.victims):
        pre, rec = val(built.evict_pre[vi]), val(built.evict_rec[vi])
        if not (pre or rec):
            continue
        reason = "preempt" if pre else "reclaim"
        bens = [j for j in v.beneficiaries if v.reason_for[j] == reason and j in placed_groups]
        if not bens:
            raise DecodeError(f"eviction of {st.pods[v.pods[0]].key} has no placed beneficiary")
        victim_nodes = {int(sess.node[p]) for p in v.pods}

        def overlap(j: int, where: set[int] = victim_nodes) -> int:
            return -sum(1 for s in scope.groups[j].shapes for n in shape_nodes[built.pool_of[s]] if n in where)

        b = min(bens, key=lambda j: (overlap(j), j))
        for p in v.pods:
            sess.evict(p, reason, scope.groups[b].group)
    # placements: per node whole-GPU pods first (on the devices the model handed them), then shares
    whole_devs: dict[int, list[int]] = defaultdict(list)
    for d, w in built.whole_dev.items():
        if val(w):
            n = int(np.searchsorted(sess.dev_start, d, side="right") - 1)
            whole_devs[n].append(d)
    share_devs: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)  # share size -> device -> count
    for (size, d), u in built.on_device.items():
        if val(u):
            share_devs[size][d] = val(u)
    placer = acts.placer
    order = sorted(shape_nodes, key=lambda s: 0 if scope.shapes[s].kind == "whole" else 1)
    for s in order:
        shape = scope.shapes[s]
        for n, k in sorted(shape_nodes[s].items()):
            for _ in range(k):
                p = queues[s].pop(0)
                now_ok, future_ok = placer.fit(p, np.array([n]))
                if shape.kind == "share":
                    pool = share_devs[share_size(st, p, n)]
                    d = next((d for d, c in pool.items() if c > 0 and _node_of(sess, d) == n), None)
                    if d is None:
                        raise DecodeError(f"no device chosen for {st.pods[p].key} on {st.node_names[n]}")
                    pool[d] -= 1
                    per = sess.gpu_per_device(p, n)
                    if DEV - int(sess.dev_held[d]) < per:
                        raise DecodeError(f"device {d} of {st.node_names[n]} has no room for {st.pods[p].key}")
                    pipelined = DEV - int(sess.dev_held[d]) - int(sess.dev_rel[d]) < per or not bool(now_ok[0])
                    sess.place(p, n, (d,), pipelined=pipelined)
                    continue
                if not bool(future_ok[0]):
                    raise DecodeError(f"{st.pods[p].key} does not fit on {st.node_names[n]}")
                pipelined = not bool(now_ok[0])
                devices = placer.devices_for(p, n, pipelined)
                if whole_devs.get(n):
                    allowed = [d for d in whole_devs[n] if int(sess.dev_held[d]) == 0]
                    idle = [d for d in allowed if int(sess.dev_rel[d]) == 0]
                    pick = (idle + [d for d in allowed if d not in idle])[: shape.gpus]
                    if len(pick) < shape.gpus:
                        raise DecodeError(f"not enough whole devices on {st.node_names[n]}")
                    devices = tuple(pick)
                    pipelined = any(int(sess.dev_rel[d]) > 0 for d in devices) or pipelined
                sess.place(p, n, devices, pipelined=pipelined)
    # a gang that waits for anything waits together
    for i in placed_groups:
        g = scope.groups[i].group
        pods = [int(p) for p in st.group_pods(g) if int(p) in sess.placements]
        if any(sess.placements[p].pipelined for p in pods):
            sess.convert_to_pipelined(pods)


def _node_of(sess: Session, d: int) -> int:
    return int(np.searchsorted(sess.dev_start, d, side="right") - 1)
