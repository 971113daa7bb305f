"""Nodes aggregated into classes for one pending podgroup: nodes that look alike to its pod shapes (same static
fit, same capacity per shape now and with the node's GPUs all free, same free resources clipped at what the group
could ever use, same topology domains) are one class with a count, so the unblock model's size follows the
number of distinct situations, not the number of nodes. Nodes holding candidate victims stay on their own.

Capacities are per node and per shape ("how many pods like this fit on one such node"), which keeps a class
exact for one shape (then the capacities alone decide the class); several shapes in one class share its
aggregated free resources (a relaxation), so for them the free resources are part of the key too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_opt.explain.shapes import Need
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import DEV
from kai_opt.state import R_CPU, R_GPU

BIG = 1_000_000
DOMAINS_KEPT = 16  # per topology level: the most promising domains keep their identity, the rest become OTHER
OTHER = -2  # a domain outside the kept ones (cannot be chosen at that level; counts when the level is relaxed)


@dataclass
class NodeClasses:
    rep: np.ndarray  # int[K] a representative node of each class
    count: np.ndarray  # int[K] nodes in the class
    static: np.ndarray  # bool[S, K] the shape's signature allows the class (selector, affinity, taints)
    cap_now: np.ndarray  # int[S, K] pods of the shape one node holds now (releases in the plan counted)
    cap_max: np.ndarray  # int[S, K] ... with all its GPUs free (CPU-only shapes: all its CPU free)
    rem: np.ndarray  # int[S, K] whole-GPU shapes: free whole devices not used by cap_now pods
    free: np.ndarray  # int[K, R] free resources per node (GPU column: whole free devices)
    share_free: np.ndarray  # int[K] milli-GPU free on its devices (sum)
    gpus: np.ndarray  # int[K] devices per node
    domains: dict[tuple[int, int], np.ndarray]  # (topology, level) -> int[K] domain id
    victim_node: np.ndarray  # int[K] the node itself for a victim host (count 1), else -1


def shape_capacities(placer: Placer, need: Need) -> tuple[np.ndarray, ...]:
    """Per shape and node: (static fit, pods now, pods with every GPU free, leftover whole devices)."""
    sess, st = placer.sess, placer.sess.state
    n = st.n_nodes
    future = sess.alloc - sess.held
    gpus = st.node_gpus
    dev_node = st.dev_node
    S = len(need.shapes)
    static = np.zeros((S, n), dtype=bool)
    now = np.zeros((S, n), dtype=np.int64)
    most = np.zeros((S, n), dtype=np.int64)
    rem = np.zeros((S, n), dtype=np.int64)
    for i, s in enumerate(need.shapes):
        p = s.pod
        static[i] = placer.static_mask(int(st.pod_sig[p]))
        req = st.pod_req[p]
        cols = [c for c in range(len(req)) if c != R_GPU and req[c] > 0]
        other = np.full(n, BIG, dtype=np.int64)
        for c in cols:
            other = np.minimum(other, future[:, c] // req[c])
        other = np.maximum(other, 0)
        if s.kind == "whole":
            w = s.whole
            now[i] = np.minimum(other, sess.whole_future // w)
            most[i] = np.minimum(other, gpus // w)
            rem[i] = np.where(now[i] == sess.whole_future // w, sess.whole_future % w, 0)
        elif s.kind == "share":
            per = np.maximum(placer.per_device(p, np.arange(n)), 1)
            ndev = int(st.pod_gpu_ndev[p])
            free_dev = DEV - sess.dev_held
            if ndev == 1:
                slots = free_dev // per[dev_node] if len(dev_node) else np.zeros(0, dtype=np.int64)
                now[i] = np.minimum(other, np.bincount(dev_node, weights=slots, minlength=n).astype(np.int64))
                most[i] = np.minimum(other, gpus * (DEV // per))
            else:
                ok = (free_dev >= per[dev_node]) if len(dev_node) else np.zeros(0, dtype=bool)
                now[i] = np.minimum(other, np.bincount(dev_node, weights=ok, minlength=n).astype(np.int64) // ndev)
                most[i] = np.minimum(other, gpus // ndev)
        else:
            now[i] = other
            full = np.full(n, BIG, dtype=np.int64)
            for c in cols:
                full = np.minimum(full, (sess.alloc[:, c] if c == R_CPU else future[:, c]) // req[c])
            most[i] = np.maximum(full, now[i])
    return static, now, most, rem


def _promising(dom: np.ndarray, now: np.ndarray, most: np.ndarray, keep: set[int]) -> np.ndarray:
    """The domain column with only the DOMAINS_KEPT best domains (pods they hold now, then with their GPUs free)
    and those in `keep` named; the others become OTHER (unlabelled nodes stay -1)."""
    ok = dom >= 0
    if not ok.any():
        return dom
    n_dom = int(dom[ok].max()) + 1
    if n_dom <= DOMAINS_KEPT:
        return dom
    by_now = np.bincount(dom[ok], weights=now[ok], minlength=n_dom)
    by_most = np.bincount(dom[ok], weights=most[ok], minlength=n_dom)
    best = np.lexsort((np.arange(n_dom), -by_most, -by_now))[:DOMAINS_KEPT]
    named = np.zeros(n_dom, dtype=bool)
    named[best] = True
    named[[d for d in keep if 0 <= d < n_dom]] = True
    out = dom.copy()
    out[ok & ~named[np.maximum(dom, 0)]] = OTHER
    return out


def build_classes(placer: Placer, need: Need, levels: list[tuple[int, int]], victim_nodes: set[int],
                  keep_domains: dict[tuple[int, int], set[int]] | None = None) -> NodeClasses:
    """`levels`: the (topology, level) pairs whose domains matter; `keep_domains`: domains to keep named."""
    sess, st = placer.sess, placer.sess.state
    static, now, most, rem = shape_capacities(placer, need)
    future = sess.alloc - sess.held
    total = np.zeros(future.shape[1], dtype=np.int64)
    for s in need.shapes:
        total += st.pod_req[s.pod] * len(s.pods)
    clip = np.minimum(np.maximum(future, 0), np.maximum(total, 1))
    clip[:, R_GPU] = sess.whole_future
    share_free = np.zeros(st.n_nodes, dtype=np.int64)
    if any(s.kind == "share" for s in need.shapes) and len(sess.dev_held):
        share_free = np.bincount(st.dev_node, weights=DEV - sess.dev_held, minlength=st.n_nodes).astype(np.int64)
    vnode = np.full(st.n_nodes, -1, dtype=np.int64)
    for n in victim_nodes:
        vnode[n] = n
    keep = st.node_ok & ((most.max(axis=0) > 0) | (vnode >= 0)) if len(need.shapes) else st.node_ok
    score_now = (static * now).sum(axis=0) if len(need.shapes) else np.zeros(st.n_nodes)
    score_most = (static * most).sum(axis=0) if len(need.shapes) else np.zeros(st.n_nodes)
    dom_cols = [_promising(st.topologies[t].domain[lv].astype(np.int64), score_now * keep, score_most * keep,
                           (keep_domains or {}).get((t, lv), set())) for t, lv in levels]
    cols = [static.T.astype(np.int64), now.T, most.T, rem.T, vnode[:, None]] + [d[:, None] for d in dom_cols]
    if len(need.shapes) > 1:  # shapes share a node's resources: what is free matters, not only the capacities
        cols += [clip, share_free[:, None], st.node_gpus[:, None]]
    key = np.concatenate(cols, axis=1)[keep]
    idx = np.flatnonzero(keep)
    if len(idx) == 0:
        empty = np.zeros(0, dtype=np.int64)
        S = len(need.shapes)
        z = np.zeros((S, 0), dtype=np.int64)
        return NodeClasses(empty, empty, z.astype(bool), z, z, z, np.zeros((0, future.shape[1]), dtype=np.int64),
                           empty, empty, {lv: empty for lv in levels}, empty)
    _, first, count = np.unique(key, axis=0, return_index=True, return_counts=True)
    rep = idx[first]
    order = np.argsort(rep, kind="stable")  # classes in node order (deterministic, readable)
    rep, count = rep[order], count[order]
    return NodeClasses(rep=rep, count=count.astype(np.int64), static=static[:, rep], cap_now=now[:, rep],
                       cap_max=most[:, rep], rem=rem[:, rep], free=clip[rep], share_free=share_free[rep],
                       gpus=st.node_gpus[rep], domains={lv: d[rep] for lv, d in zip(levels, dom_cols, strict=True)},
                       victim_node=vnode[rep])
