"""Turn a CP-SAT solution into a plan: evictions first, then pods onto their nodes and devices, bind when the
pod fits now and pipeline when it waits for releases (a gang waits together), then the greedy allocate pass
fills what the model left (work outside the window, leftover room)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.formulation.model import Built, is_share, share_size
from kai_opt.formulation.scope import Scope
from kai_opt.heuristics.actions import Actions
from kai_opt.heuristics.session import DEV, Session


class DecodeError(RuntimeError):
    pass


def decode(sess: Session, acts: Actions, scope: Scope, built: Built, values: list[int]) -> None:
    """Apply the solution to `sess` (a fresh session of the same cycle). Raises DecodeError if it does not fit."""
    st = sess.state

    def val(v: cp_model.IntVar) -> int:
        return int(values[v.index])

    placed_groups = {i for i, g in enumerate(built.gang) if val(g)}
    pool_nodes: dict[int, dict[int, int]] = defaultdict(dict)  # pool -> node -> pods
    for (k, n), v in built.place.items():
        if val(v):
            pool_nodes[k][n] = val(v)
    # the pods each pool places: a lone shape's pods in order, a pool's shapes each as many as placed[s] says
    queues: dict[int, list[int]] = defaultdict(list)
    for s, shape in enumerate(scope.shapes):  # (a shape alone in its pool places what its pool does)
        take = val(built.placed[s]) if s in built.placed else sum(pool_nodes[built.pool_of[s]].values())
        queues[built.pool_of[s]].extend(shape.pods[:take])
    # (share size, node) -> device of that node -> share pods of that size on it
    share_devs: dict[tuple[tuple[int, int], int], dict[int, int]] = defaultdict(dict)
    for (size, d), u in built.on_device.items():
        if val(u):
            share_devs[(size, _node_of(sess, d))][d] = val(u)
    # node -> the devices the model hands whole to whole-GPU pods there (device-level nodes only)
    whole_devs: dict[int, list[int]] = defaultdict(list)
    for d, w in built.whole_dev.items():
        if val(w):
            whole_devs[_node_of(sess, d)].append(d)
    moving = _moves(sess, scope, built, val, pool_nodes, share_devs, whole_devs)

    def overlap(j: int, where: set[int]) -> int:
        return -sum(1 for s in scope.groups[j].shapes for n in pool_nodes[built.pool_of[s]] if n in where)

    def nearest(js: list[int], where: set[int]) -> int:
        """The beneficiary among js with the most placements on the nodes `where` (then the lowest index)."""
        return min(js, key=lambda j: (overlap(j, where), j))

    # evictions, each with a beneficiary that is placed and allowed to take it
    for vi, victim in enumerate(scope.victims):
        pre, rec = val(built.evict_pre[vi]), val(built.evict_rec[vi])
        if not (pre or rec):
            continue
        reason = "preempt" if pre else "reclaim"
        bens = [j for j in victim.beneficiaries if victim.reason_for[j] == reason and j in placed_groups]
        if rec:  # the reclaimers that take it (the boundary rule was judged for them)
            takes, take_of = built.reclaim_rows.takes, built.reclaim_rows.take_of
            bens = [j for j in bens if (vi, j) in take_of and val(takes[(j, take_of[(vi, j)])])] or bens
        if not bens:
            raise DecodeError(f"eviction of {st.pods[victim.pods[0]].key} has no placed beneficiary")
        b = nearest(bens, {int(sess.node[p]) for p in victim.pods})
        for p in victim.pods:
            sess.evict(p, reason, scope.groups[b].group)
    served = [j for j in scope.move_for if j in placed_groups]
    for pods in moving.values():
        if not served:
            raise DecodeError(f"{st.pods[pods[0]].key} moved without a placed group consolidation serves")
        for p in pods:
            b = nearest(served, {int(sess.node[p])})
            sess.evict(p, "consolidate", scope.groups[b].group)
    # placements: per node whole-GPU pods first (on the devices the model handed them), then shares; a pool's
    # moved pods take nodes other than their own first, its pending pods the rest
    placer = acts.placer
    order = sorted(pool_nodes, key=lambda k: 0 if st.pod_gpu_whole[scope.pools[k].pod] else 1)
    for k in order:
        slots = [n for n, c in sorted(pool_nodes[k].items()) for _ in range(c)]
        assigned: list[tuple[int, int, bool]] = []  # (pod, node, moved)
        movers = moving.get(k, [])
        targets = move_targets([int(sess.node[p]) for p in movers], slots)
        if targets is None:
            raise DecodeError(f"{st.pods[movers[0]].key} and the other pods its pool moves have no node to move to "
                              "but their own")
        for p, n in zip(movers, targets, strict=True):
            slots.remove(n)
            assigned.append((p, n, True))
        if len(slots) != len(queues[k]):
            raise DecodeError(f"pool of {st.pods[scope.pools[k].pod].key}: {len(slots)} places for "
                              f"{len(queues[k])} pods")
        assigned += [(p, n, False) for p, n in zip(queues[k], slots, strict=True)]
        for p, n, moved in sorted(assigned, key=lambda a: a[1]):
            now_ok, future_ok = placer.fit(p, np.array([n]))
            if is_share(st, p):
                pool = share_devs[(share_size(st, p, n), n)]
                ndev = int(st.pod_gpu_ndev[p])
                # the devices with the most of this size left first: with no device above the pods left, each
                # pod gets distinct devices
                own = sess.pod_devices(p) if moved else ()
                free = sorted((d for d, c in pool.items() if c > 0 and d not in own), key=lambda d: (-pool[d], d))
                if len(free) < ndev:
                    raise DecodeError(f"no device chosen for {st.pods[p].key} on {st.node_names[n]}")
                devs = tuple(sorted(free[:ndev]))
                per = sess.gpu_per_device(p, n)
                pipelined = not bool(now_ok[0])
                for d in devs:
                    pool[d] -= 1
                    if DEV - int(sess.dev_held[d]) < per:
                        raise DecodeError(f"device {d} of {st.node_names[n]} has no room for {st.pods[p].key}")
                    pipelined |= DEV - int(sess.dev_held[d]) - int(sess.dev_rel[d]) < per
                sess.place(p, n, devs, pipelined=pipelined or moved, moved=moved)
                continue
            if not bool(future_ok[0]):
                raise DecodeError(f"{st.pods[p].key} does not fit on {st.node_names[n]}")
            pipelined = not bool(now_ok[0])
            devices = placer.devices_for(p, n, pipelined)
            gpus = int(st.pod_gpu_whole[p])
            if whole_devs.get(n) and gpus:
                allowed = [d for d in whole_devs[n] if int(sess.dev_held[d]) == 0]
                idle = [d for d in allowed if int(sess.dev_rel[d]) == 0]
                pick = (idle + [d for d in allowed if d not in idle])[:gpus]
                if len(pick) < gpus:
                    raise DecodeError(f"not enough whole devices on {st.node_names[n]}")
                devices = tuple(pick)
                pipelined = any(int(sess.dev_rel[d]) > 0 for d in devices) or pipelined
            sess.place(p, n, devices, pipelined=pipelined or moved, moved=moved)
    # a gang that waits for anything waits together
    for i in placed_groups:
        g = scope.groups[i].group
        pods = [int(p) for p in st.group_pods(g) if int(p) in sess.placements]
        if any(sess.placements[p].pipelined for p in pods):
            sess.convert_to_pipelined(pods)


def move_targets(own: list[int], slots: list[int]) -> list[int] | None:
    """For moved pods on nodes `own`, a node each among `slots` (a multiset of nodes, each taken once), never its
    own node; None when there is no such choice. Each pod in turn takes the first slot on another node; if that
    strands a later pod, they are placed by pressure instead: the node with the most pods still to move plus
    slots left moves a pod first, into the other node with the most of both. (A choice exists iff no node's pods
    to move outnumber the slots on other nodes; the pressure rule keeps that true at every step.)"""
    left = list(slots)
    first: list[int] = []
    for o in own:
        i = next((i for i, n in enumerate(left) if n != o), None)
        if i is None:
            break
        first.append(left.pop(i))
    else:
        return first
    need = Counter(own)
    free = Counter(slots)
    out: dict[int, list[int]] = defaultdict(list)  # own node -> the nodes its pods move to
    for _ in range(len(own)):
        o = max((c for c in need if need[c] > 0), key=lambda c: (need[c] + free[c], -c))
        to = [c for c in free if free[c] > 0 and c != o]
        if not to:
            return None
        n = max(to, key=lambda c: (free[c] + need[c], -c))
        need[o] -= 1
        free[n] -= 1
        out[o].append(n)
    return [out[o].pop() for o in own]


def _moves(sess: Session, scope: Scope, built: Built, val: Callable[[cp_model.IntVar], int],
           pool_nodes: dict[int, dict[int, int]], share_devs: dict[tuple[tuple[int, int], int], dict[int, int]],
           whole_devs: dict[int, list[int]]) -> dict[int, list[int]]:
    """Pool -> the running pods that move. A pod the solution sends back onto its own node stays where it is
    instead, and one place of its pool there is dropped: for a share, one of its size on each of its devices; for
    whole GPUs on a node decided device by device, only when the model hands its own devices whole again (they
    are then its own), since the model may have put other pods on the devices it left."""
    st = sess.state
    out: dict[int, list[int]] = defaultdict(list)
    for c, mv in enumerate(scope.movers):
        for p in mv.pods[: val(built.move[c])]:
            here = pool_nodes[mv.pool]
            if here.get(mv.node, 0) > 0:
                if not is_share(st, p):
                    own = sess.pod_devices(p)
                    chosen = whole_devs.get(mv.node, [])
                    by_device = any(d in built.whole_dev for d in own)
                    if not by_device or all(d in chosen for d in own):
                        for d in own if by_device else ():
                            chosen.remove(d)
                        here[mv.node] -= 1
                        continue
                    out[mv.pool].append(p)
                    continue
                pool = share_devs[(share_size(st, p, mv.node), mv.node)]
                own = sess.pod_devices(p)
                if all(pool.get(d, 0) > 0 for d in own):
                    for d in own:
                        pool[d] -= 1
                    here[mv.node] -= 1
                    continue
            out[mv.pool].append(p)
    return out


def _node_of(sess: Session, d: int) -> int:
    return int(np.searchsorted(sess.dev_start, d, side="right") - 1)
