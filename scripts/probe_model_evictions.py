#!/usr/bin/env python
"""Probe (issue 16, item 3): can a CP-SAT model decide the 10,000-node cycle's evictions itself, over a bounded
candidate set, instead of waiting for the greedy victim search (~17 s of the ~20 s cycle)?

Not product code: measurements of two simplified formulations, kept so their numbers (docs/DESIGN-NOTES.md,
"Model-decided evictions: what a probe measured") can be reproduced. On bench_greedy's scale instance (its cached
state, built when absent) it runs allocate and consolidate on a session, then models the pending groups the reclaim
rule admits (`can_reclaim`) and prints the model's size, build and solve times and what its best solution places
and evicts, beside the greedy engine's own reclaim and preempt gains on the same state.

`--form counts`: x[shape, node] pods of a pending shape on one of the shape's `--candidates` nodes with the most
GPUs free or held by candidate victims (any active, preemptible, unprotected group of ours), y[group] placed whole,
e[victim group] evicted; per node and resource placed <= free + what evicted pods there hold; per shape its pods ==
its placed groups' tasks; each reclaiming leaf queue within its fair share; the victim side (`--victim-rule`): the
GPUs evicted under a queue within its allocation above its allocatable share at every level of the victim's path
(`every`: stricter than KAI), at its leaf or top-level queue only (`leaf`, `top`: neither is KAI's rule), or not at
all (`none`); objective GPUs placed (x1000) less GPUs evicted.

`--form bundles` (the default): per class of pending groups (leaf queue, pod shape; with `--preempt` also the groups
the reclaim rule refuses, by priority, against their own queue's lower-priority work) and node, one precomputed
bundle: the fewest victims there (single-node victim groups, with `--spread` every group by its part on the node,
costing its whole GPUs; fewest GPUs first; for reclaim only those whose queue, at the level where its path leaves
the reclaimer's, is above its allocatable share) that let the most of the class's pods fit; the `--candidates` best
bundles per class (most pods, fewest GPUs evicted). z[bundle], y[group]; at most one bundle per node, a class's
bundles hold its placed groups' pods, the reclaiming leaf queue within its fair share, and KAI's reclaim rule in its
end state (GPUs): where a victim is compared at a sibling queue, that queue's allocation after every eviction under
it stays above its allocatable share, and the reclaimer's side at that level stays within its fair share or strictly
less saturated (times the multiplier) than the sibling. The solution is then checked group by group with KAI's own
predicates (`can_reclaim`, `reclaimable`) on a ledger that follows the decisions.

`--form shared`: no model. In KAI's job order (`--order queue`) each admitted group's pods are placed one by one on
room already free or being released, else on the node where evicting the fewest GPUs of eligible victims (fewest
GPUs first) makes room, nodes shared between groups. Eligible: another queue's unprotected work whose queue, at the
level its path leaves the reclaimer's, is above its allocatable share, and (`--rule turn`) against which the
reclaimer's side is not already too saturated, both as the ledger stands at the group's turn; the group is kept if
KAI's predicates (`--rule turn`) or the bundle model's end-state rows (`--rule end`) hold; with `--preempt`, KAI's
preempt then runs the same way for every group still pending (victims: its queue's lower-priority work). The
decisions are then replayed on the session: victims evicted, KAI's scenario simulation run for reclaims (victims
whose jobs would be allocated first go back), the pods placed by the engine's gang placer, the plan through
`check_plan`, and the reclaims as made through KAI's predicates.

  scripts/probe_model_evictions.py --budget 2 --candidates 100                  # bundles, reclaim only
  scripts/probe_model_evictions.py --form counts --candidates 500 --victim-rule none --budget 1
  scripts/probe_model_evictions.py --form shared --order queue --rule turn --spread --preempt
"""

from __future__ import annotations

import argparse
import gc
import pickle
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RULES = ("every", "leaf", "top", "none")


def _state(cache_dir: str, n: int, seed: int) -> object:
    from kai_opt.state import build_state
    from models.generators import as_snapshot, scale

    path = Path(cache_dir) / f"kai-opt-greedy-{n}-{10 * n}-{n}-{seed}.pkl"  # bench_greedy.py's cache
    if path.exists():
        with path.open("rb") as f:
            return pickle.load(f)
    state = build_state(as_snapshot(scale(n, 10 * n, n, seed)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    return state


def greedy_gains(st: object, fs: object) -> None:
    """What the greedy engine's reclaim and preempt place and evict on the same state (GPUs, from pod requests)."""
    from kai_opt.config import Config
    from kai_opt.heuristics.cycle import greedy_plan
    from kai_opt.heuristics.session import Session
    from kai_opt.state.resources import R_GPU

    before = [0, 0.0, 0, 0.0]

    def after(name: str, sess: Session) -> None:
        placed = [p for p in sess.placements if p not in sess.evictions]
        evicted = [p for p in sess.evictions if p not in sess.placements]
        now = [len(placed), float(sess.state.pod_req[placed, R_GPU].sum()) / 1000, len(evicted),
               float(sess.state.pod_req[evicted, R_GPU].sum()) / 1000]
        if name in ("reclaim", "preempt"):
            print(f"greedy {name}: +{now[0] - before[0]} pods, +{now[1] - before[1]:.1f} GPUs placed; "
                  f"+{now[2] - before[2]} pods, +{now[3] - before[3]:.1f} GPUs evicted")
        before[:] = now

    t = time.perf_counter()
    greedy_plan(st, fs, Config(), after=after)  # type: ignore[arg-type]
    print(f"greedy cycle {time.perf_counter() - t:.2f} s")


def probe_counts(st: object, fs: object, candidates: int, rule: str, budget: float) -> None:
    """`--form counts` (see the module docstring)."""
    from ortools.sat.python import cp_model

    from kai_opt.config import Config
    from kai_opt.fairshare.reclaim import can_reclaim
    from kai_opt.heuristics.actions import REGISTRY, ActionContext
    from kai_opt.heuristics.session import IS_ACTIVE, Session
    from kai_opt.heuristics.tasks import tasks_to_allocate
    from kai_opt.heuristics.victims import active_group_mask, protected_mask
    from kai_opt.state.resources import R_CPU, R_GPU, R_MEM

    cols = [R_GPU, R_CPU, R_MEM]
    t0 = time.perf_counter()
    sess = Session(st, fs, Config())  # type: ignore[arg-type]
    ctx = ActionContext(sess)
    for action in REGISTRY:
        if action.name in ("allocate", "consolidate"):
            action.run(ctx)
    s = sess.state
    t1 = time.perf_counter()
    groups: list[tuple[int, list[int]]] = []
    pending = ctx.pending_groups()
    for g in pending:
        tasks = tasks_to_allocate(sess, g)
        if tasks and can_reclaim(sess.fs, sess.ledger, int(s.pg_queue[g]), sess.queue_request(tasks).sum(axis=0),
                                 preemptible=bool(s.pg_preemptible[g])):
            groups.append((g, tasks))
    shape_index: dict[tuple[int, tuple[int, ...]], int] = {}
    group_shape = []
    for _, tasks in groups:
        key = (int(s.pod_sig[tasks[0]]), tuple(s.pod_req[tasks[0], cols].tolist()))
        group_shape.append(shape_index.setdefault(key, len(shape_index)))
    shapes = list(shape_index)
    victims = np.flatnonzero(active_group_mask(sess) & s.pg_preemptible.astype(bool)
                             & ~protected_mask(sess, "reclaim") & (s.pg_queue >= 0))
    vpods = [p[IS_ACTIVE[sess.status[p]] & (sess.node[p] >= 0)] for p in (s.group_pods(int(v)) for v in victims)]
    pod = np.concatenate(vpods)
    owner = np.repeat(np.arange(len(victims)), [len(p) for p in vpods])
    node, req = sess.node[pod], s.pod_req[pod][:, cols]
    free = (sess.alloc - sess.held)[:, cols].astype(np.int64)
    releasable = free.copy()
    np.add.at(releasable, node, req)
    print(f"allocate+consolidate {t1 - t0:.2f} s; pending groups {len(pending)}, admitted by the reclaim rule "
          f"{len(groups)} ({sum(len(t) for _, t in groups)} pods, {len(shapes)} shapes); candidate victims "
          f"{len(victims)} groups, {len(pod)} pods")

    t2 = time.perf_counter()
    m = cp_model.CpModel()
    cand = {}
    for k, (sig, r) in enumerate(shapes):
        ok = ctx.placer.static_mask(sig) & (releasable >= np.array(r)).all(axis=1) & (releasable[:, 0] > free[:, 0])
        idx = np.flatnonzero(ok)
        cand[k] = idx[np.argsort(-releasable[idx, 0], kind="stable")[:candidates]]
    x = {(k, int(n)): m.new_int_var(0, 64, "") for k in cand for n in cand[k]}
    y = [m.new_bool_var("") for _ in groups]
    in_model = np.zeros(len(s.node_names), dtype=bool)
    in_model[[n for _, n in x]] = True
    near = in_model[node]
    e = {int(v): m.new_bool_var("") for v in np.unique(owner[near])}
    held_on: dict[int, dict[int, np.ndarray]] = defaultdict(lambda: defaultdict(lambda: np.zeros(3, np.int64)))
    for i in np.flatnonzero(near).tolist():
        held_on[int(node[i])][int(owner[i])] += req[i]
    on_node: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    for (k, n), var in x.items():
        on_node[n].append((k, var))
    for n, placed in on_node.items():
        for r in range(3):
            terms = [(var, shapes[k][1][r]) for k, var in placed if shapes[k][1][r]]
            if terms:
                freed = [(e[v], int(a[r])) for v, a in held_on[n].items() if a[r]]
                m.add(sum(c * v for v, c in terms) <= int(free[n, r]) + sum(c * v for v, c in freed))
    for k in cand:
        m.add(sum(x[(k, int(n))] for n in cand[k]) == sum(len(groups[i][1]) * y[i] for i in range(len(groups))
                                                          if group_shape[i] == k))
    ledger = sess.ledger
    gpus = [round(float(sess.queue_request(t).sum(axis=0)[0]) * 1000) for _, t in groups]
    by_queue: dict[int, list[int]] = defaultdict(list)
    for i, (g, _) in enumerate(groups):
        by_queue[int(s.pg_queue[g])].append(i)
    for q, idx in by_queue.items():
        m.add(sum(gpus[i] * y[i] for i in idx) <= int((fs.fair_share[q, 0] - ledger.allocated[q, 0]) * 1000))  # type: ignore[attr-defined]
    evicted_gpu = {v: int(req[owner == v, 0].sum()) for v in e}
    under: dict[int, list[int]] = defaultdict(list)
    for v in e:
        path = ledger.ancestors[int(s.pg_queue[victims[v]])]
        for a in {"every": path, "leaf": path[:1], "top": path[-1:], "none": []}[rule]:
            under[a].append(v)
    share = fs.allocatable_share  # type: ignore[attr-defined]
    for a, vs in under.items():
        m.add(sum(evicted_gpu[v] * e[v] for v in vs) <= int(max(0.0, ledger.allocated[a, 0] - share[a, 0]) * 1000))
    m.maximize(sum(1000 * gpus[i] * y[i] for i in range(len(groups))) - sum(evicted_gpu[v] * e[v] for v in e))
    t3 = time.perf_counter()
    print(f"model: {len(x)} x, {len(y)} y, {len(e)} e over {int(in_model.sum())} nodes; built in {t3 - t2:.2f} s "
          "(per-term Python)")
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = budget
    solver.parameters.num_workers = 2
    status = solver.solve(m)
    t4 = time.perf_counter()
    placed_i = [i for i in range(len(groups)) if solver.value(y[i])] if status in (cp_model.OPTIMAL,
                                                                                  cp_model.FEASIBLE) else []
    gone = [v for v in e if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and solver.value(e[v])]
    print(f"solve {t4 - t3:.2f} s ({solver.status_name(status)}): {len(placed_i)} groups, "
          f"{sum(len(groups[i][1]) for i in placed_i)} pods, {sum(gpus[i] for i in placed_i) / 1000:.1f} GPUs placed; "
          f"{len(gone)} groups, {sum(evicted_gpu[v] for v in gone) / 1000:.1f} GPUs evicted; "
          f"bound {solver.best_objective_bound / 1e6:.1f} GPUs placed")


def _setup(st: object, fs: object, *, preempt: bool, spread: bool) -> SimpleNamespace:
    """What both search forms start from: a session after allocate and consolidate, the pending groups
    modelled and their classes, the victim units sorted by node, queue paths, and each queue's GPUs above its
    allocatable share."""
    from kai_opt.config import Config
    from kai_opt.fairshare.reclaim import can_reclaim, queue_paths
    from kai_opt.heuristics.actions import REGISTRY, ActionContext
    from kai_opt.heuristics.session import IS_ACTIVE, Session
    from kai_opt.heuristics.tasks import tasks_to_allocate
    from kai_opt.heuristics.victims import active_group_mask, protected_mask
    from kai_opt.state.resources import R_CPU, R_GPU, R_MEM

    cols = [R_GPU, R_CPU, R_MEM]
    cfg = Config()
    mult = cfg.reclaim_saturation_multiplier
    t0 = time.perf_counter()
    sess = Session(st, fs, cfg)  # type: ignore[arg-type]
    ctx = ActionContext(sess)
    for action in REGISTRY:
        if action.name in ("allocate", "consolidate"):
            action.run(ctx)
    s, led = sess.state, sess.ledger
    share, allocatable = sess.fs.fair_share, sess.fs.allocatable_share
    t1 = time.perf_counter()
    # pending groups: those the reclaim rule admits (kind 0), with --preempt the others too (kind 1)
    groups: list[tuple[int, list[int], int]] = []
    for g in ctx.pending_groups():
        tasks = tasks_to_allocate(sess, g)
        if not tasks:
            continue
        q = int(s.pg_queue[g])
        if can_reclaim(sess.fs, led, q, sess.queue_request(tasks).sum(axis=0), preemptible=bool(s.pg_preemptible[g])):
            groups.append((g, tasks, 0))
        elif preempt:
            groups.append((g, tasks, 1))
    # classes: (kind, leaf queue, priority for preempt, scheduling signature, pod request)
    class_index: dict[tuple[int, int, int, int, tuple[int, ...]], int] = {}
    group_class = []
    for g, tasks, kind in groups:
        key = (kind, int(s.pg_queue[g]), int(s.pg_priority[g]) if kind else 0, int(s.pod_sig[tasks[0]]),
               tuple(s.pod_req[tasks[0], cols].tolist()))
        group_class.append(class_index.setdefault(key, len(class_index)))
    classes = list(class_index)
    class_pods = np.zeros(len(classes), dtype=np.int64)
    class_groups: dict[int, list[int]] = defaultdict(list)
    for i, (_, tasks, _) in enumerate(groups):
        class_pods[group_class[i]] += len(tasks)
        class_groups[group_class[i]].append(i)
    # victim units: an active preemptible group of ours on one node (with `spread`, one unit per node it runs on: the
    # unit frees what its pods there hold, and evicting it evicts the whole group, whose GPUs it costs), sorted by
    # node, then by the group's GPUs
    start, members = s.pg_pod_start, s.pg_pods
    keep, where, held, whole = [], [], [], []
    for v in np.flatnonzero(active_group_mask(sess) & s.pg_preemptible.astype(bool) & (s.pg_queue >= 0)).tolist():
        pods = members[start[v]:start[v + 1]]
        pods = pods[IS_ACTIVE[sess.status[pods]] & (sess.node[pods] >= 0)]
        nodes = np.unique(sess.node[pods])
        if not len(pods) or (len(nodes) > 1 and not spread):
            continue
        total = int(s.pod_req[pods, R_GPU].sum())
        for n in nodes.tolist():
            on = pods[sess.node[pods] == n]
            keep.append(v)
            where.append(n)
            held.append(s.pod_req[on][:, cols].sum(axis=0))
            whole.append(total)
    vgroup, vnode, vreq, vtotal = np.array(keep), np.array(where), np.array(held, dtype=np.int64), np.array(whole)
    order = np.lexsort((np.arange(len(vgroup)), vtotal, vnode))
    vgroup, vnode, vreq, vtotal = vgroup[order], vnode[order], vreq[order], vtotal[order]
    vqueue, vprio = s.pg_queue[vgroup].astype(np.int64), s.pg_priority[vgroup]
    protected_r, protected_p = protected_mask(sess, "reclaim")[vgroup], protected_mask(sess, "preempt")[vgroup]
    seg = np.r_[0, np.flatnonzero(np.diff(vnode)) + 1]  # each node's victims: vgroup[seg[i]:seg[i + 1]]
    seg_node = vnode[seg]
    seg_of = np.repeat(np.arange(len(seg)), np.diff(np.r_[seg, len(vgroup)]))
    free = (sess.alloc - sess.held)[:, cols].astype(np.int64)
    path = queue_paths(led.ancestors)  # queue -> its path from the top
    excess = np.maximum(0.0, led.allocated[:, 0] - allocatable[:, 0]) * 1000  # milli-GPU above allocatable
    return SimpleNamespace(led0=led.copy(), mult=mult, t0=t0, sess=sess, ctx=ctx, s=s, led=led, share=share,
                           t1=t1, groups=groups,
                           group_class=group_class, classes=classes, class_pods=class_pods,
                           class_groups=class_groups, start=start, members=members, vgroup=vgroup, vnode=vnode,
                           vreq=vreq, vtotal=vtotal, vqueue=vqueue, vprio=vprio, protected_r=protected_r,
                           protected_p=protected_p, seg=seg, seg_node=seg_node, seg_of=seg_of, free=free, path=path,
                           excess=excess)


def probe_bundles(st: object, fs: object, per_class: int, budget: float, *, preempt: bool, hint: bool,
                  spread: bool = False, hint_order: str = "gpus") -> dict[str, int]:
    """`--form bundles` (see the module docstring). Returns KAI's verdicts on the placed reclaimers ("allowed" or
    the rule broken) and the groups placed per kind."""
    from ortools.sat.python import cp_model

    from kai_opt.fairshare.share import UNLIMITED

    base = _setup(st, fs, preempt=preempt, spread=spread)
    (mult, t0, sess, ctx, s, led, share, t1, groups, group_class, classes, class_pods, class_groups, vgroup, vnode,
     vreq, vtotal, vqueue, vprio, protected_r, protected_p, seg, seg_node, seg_of, free, path, excess) = (
        base.mult, base.t0, base.sess, base.ctx, base.s, base.led, base.share, base.t1, base.groups,
        base.group_class, base.classes, base.class_pods, base.class_groups, base.vgroup, base.vnode, base.vreq,
        base.vtotal, base.vqueue, base.vprio, base.protected_r, base.protected_p, base.seg, base.seg_node,
        base.seg_of, base.free, base.path, base.excess)
    t2 = time.perf_counter()
    # bundles: per class and node, the fewest victims (fewest GPUs first) that let the most of the class's pods fit;
    # a bundle is (class, node, pods) with its victims as entries (bundle, victim position, sibling compared at)
    big = 1 << 40
    vpath = path[vqueue]
    zero_row = np.zeros((1, 3), dtype=np.int64)
    b_class_l, b_node_l, b_pods_l, e_bundle_l, e_pos_l, e_sib_l = [], [], [], [], [], []
    n_bundles = 0
    for c, (kind, q, prio, sig, request) in enumerate(classes):
        r = np.array(request, dtype=np.int64)
        need = r > 0
        static = ctx.placer.static_mask(sig)
        if kind == 0:  # another queue's victim, compared at the sibling where the paths diverge
            diff = vpath != path[q]
            sibling = vpath[np.arange(len(vqueue)), np.argmax(diff, axis=1)]
            ok = diff.any(axis=1) & ~protected_r & (excess[np.maximum(sibling, 0)] > 0)
        else:  # the same queue's lower-priority work
            sibling = np.full(len(vqueue), -1)
            ok = (vqueue == q) & (vprio < prio) & ~protected_p
        ok &= static[vnode]
        if not ok.any():
            continue
        freed = np.where(ok[:, None], vreq, 0)
        cum = np.cumsum(freed, axis=0)
        before = np.vstack([zero_row, cum])[seg]  # what the node's earlier victims freed, per node
        cum_cost = np.cumsum(np.where(ok, vtotal, 0))
        before_cost = np.r_[0, cum_cost][seg]
        room = free[vnode] + cum - before[seg_of]
        fit = np.min(np.where(need, room // np.where(need, r, 1), big), axis=1)
        fit_free = np.min(np.where(need, free[seg_node] // np.where(need, r, 1), big), axis=1)
        target = np.minimum(np.maximum.reduceat(np.where(ok, fit, -1), seg), class_pods[c])
        good = (target > fit_free) & (target > 0) & static[seg_node]
        hit = ok & (fit >= target[seg_of]) & good[seg_of]
        first = np.minimum.reduceat(np.where(hit, np.arange(len(vgroup)), big), seg)
        cand = np.flatnonzero(good & (first < big))
        cost_c = cum_cost[first[cand]] - before_cost[cand]
        chosen = cand[np.lexsort((cost_c, -target[cand]))[:per_class]]
        bid = np.full(len(seg), -1)
        bid[chosen] = n_bundles + np.arange(len(chosen))
        pos = np.flatnonzero(ok & (bid[seg_of] >= 0) & (np.arange(len(vgroup)) <= first[seg_of]))
        b_class_l.append(np.full(len(chosen), c))
        b_node_l.append(seg_node[chosen])
        b_pods_l.append(target[chosen])
        e_bundle_l.append(bid[seg_of[pos]])
        e_pos_l.append(pos)
        e_sib_l.append(sibling[pos])
        n_bundles += len(chosen)
    b_class, b_node, b_pods = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64)
                               for x in (b_class_l, b_node_l, b_pods_l))
    e_bundle, e_pos, e_sib = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64)
                              for x in (e_bundle_l, e_pos_l, e_sib_l))
    order = np.lexsort((e_pos, e_bundle))  # entries by bundle, then victim order
    e_bundle, e_pos, e_sib = e_bundle[order], e_pos[order], e_sib[order]
    e_at = np.searchsorted(e_bundle, np.arange(n_bundles + 1))
    bundles = [(int(b_class[b]), int(b_node[b]), int(b_pods[b]), e_pos[e_at[b]:e_at[b + 1]],
                e_sib[e_at[b]:e_at[b + 1]]) for b in range(n_bundles)]  # (for the hint and the check)
    t3 = time.perf_counter()
    print(f"allocate+consolidate {t1 - t0:.2f} s; {len(groups)} pending groups modelled "
          f"({sum(1 for x in groups if x[2] == 0)} admitted by the reclaim rule), {len(classes)} classes; "
          f"{len(vgroup)} victim units of {len(np.unique(vgroup))} groups ({t2 - t1:.2f} s); {n_bundles} bundles "
          f"({t3 - t2:.2f} s, "
          "numpy per class)")

    lin = cp_model.LinearExpr
    m = cp_model.CpModel()
    z = [m.new_bool_var("") for _ in range(n_bundles)]
    y = [m.new_bool_var("") for _ in groups]
    request = [sess.queue_request(t).sum(axis=0) for _, t, _ in groups]
    gpus = [round(float(r[0]) * 1000) for r in request]
    e_gpu = vtotal[e_pos]  # a unit costs its whole group (counted again by every bundle holding it)
    cost_arr = np.bincount(e_bundle, weights=e_gpu, minlength=n_bundles).astype(np.int64)
    cost = cost_arr.tolist()

    def split(keys: np.ndarray, values: np.ndarray) -> dict[int, np.ndarray]:
        """values grouped by key (keys sorted first)."""
        o = np.argsort(keys, kind="stable")
        k, v = keys[o], values[o]
        cuts = np.flatnonzero(np.diff(k)) + 1
        return dict(zip(k[np.r_[0, cuts]].tolist(), np.split(v, cuts), strict=True)) if len(k) else {}

    of_class = {c: b.tolist() for c, b in split(b_class, np.arange(n_bundles)).items()}
    # victim-side siblings and (reclaimer side, sibling) pairs each bundle puts in use (reclaim bundles only)
    rec = e_sib >= 0
    lev_key = np.unique(e_sib[rec] * n_bundles + e_bundle[rec])
    leveled_at = {k: v.tolist() for k, v in split(lev_key // n_bundles, lev_key % n_bundles).items()}
    depth_of = np.array([len(a) - 1 for a in led.ancestors])
    mine_q = path[np.array([classes[c][1] for c in b_class[e_bundle[rec]]], dtype=np.int64), depth_of[e_sib[rec]]]
    nq = len(led.ancestors)
    pair_key = np.unique((mine_q * nq + e_sib[rec]) * n_bundles + e_bundle[rec])
    pairs = {(k // nq, k % nq): v.tolist()
             for k, v in split(pair_key // n_bundles, pair_key % n_bundles).items()}
    # GPUs evicted under each sibling by each bundle (every victim below it, whichever reclaimer it serves)
    sibs = np.array(sorted(leveled_at), dtype=np.int64)
    is_sib = np.zeros(nq, dtype=bool)
    is_sib[sibs] = True
    keys, amounts = [], []
    for d in range(path.shape[1]):
        anc = path[vqueue[e_pos], d]
        take = (anc >= 0) & is_sib[np.maximum(anc, 0)]
        keys.append(anc[take] * n_bundles + e_bundle[take])
        amounts.append(e_gpu[take])
    ukey, inv = np.unique(np.concatenate(keys), return_inverse=True)
    usum = np.bincount(inv, weights=np.concatenate(amounts)).astype(np.int64)
    under_b = split(ukey // n_bundles, ukey % n_bundles)
    under_a = split(ukey // n_bundles, usum)
    under = {q: list(zip(under_b[q].tolist(), under_a[q].tolist(), strict=True)) for q in under_b}

    for bs in split(b_node, np.arange(n_bundles)).values():
        if len(bs) > 1:
            m.add_at_most_one([z[b] for b in bs.tolist()])
    for c, idx in class_groups.items():
        bs = of_class.get(c, [])
        m.add(lin.weighted_sum([z[b] for b in bs], [bundles[b][2] for b in bs])
              >= lin.weighted_sum([y[i] for i in idx], [len(groups[i][1]) for i in idx]))
    # the reclaimer's leaf queue within its fair share (can_reclaim, over every group placed)
    by_leaf: dict[int, list[int]] = defaultdict(list)
    for i, (g, _, kind) in enumerate(groups):
        if kind == 0:
            by_leaf[int(s.pg_queue[g])].append(i)
    for q, idx in by_leaf.items():
        for r in range(3):
            coef = [round(float(request[i][r]) * 1000) for i in idx]
            if any(coef):
                room = max(0, int(np.floor((share[q, r] - led.allocated[q, r]) * 1000 + 1e-6)))
                m.add(lin.weighted_sum([y[i] for i in idx], coef) <= room)
    # the victim side: a sibling some victim is compared at keeps, after every eviction under it, its allocation
    # above its allocatable share (in GPUs; at the end, so at every earlier reclaim too)
    evicted_under = {q: lin.weighted_sum([z[b] for b in under_b[q].tolist()], under_a[q].tolist()) for q in under_b}
    sib_used = {}
    for sib, bs in leveled_at.items():
        used = sib_used[sib] = m.new_bool_var("")
        for b in bs:
            m.add_implication(z[b], used)
        m.add(evicted_under[sib] <= int(excess[sib])).only_enforce_if(used)
    # the reclaimer side: where victims are compared at sibling s, the reclaimer's side a stays within its fair share
    # or strictly less saturated than s (GPUs; a's placements all counted, s's evictions all taken: the end state)
    placed_under: dict[int, list[int]] = defaultdict(list)
    for i, (g, _, _) in enumerate(groups):
        for a in led.ancestors[int(s.pg_queue[g])]:
            placed_under[a].append(i)
    pair_vars = {}
    for (a, sib), bs in pairs.items():
        fa, fsib = share[a, 0], share[sib, 0]
        if fa == UNLIMITED or fsib <= 0 or fsib == UNLIMITED:
            continue
        used, within = pair_vars[(a, sib)] = m.new_bool_var(""), m.new_bool_var("")
        for b in bs:
            m.add_implication(z[b], used)
        mine = lin.weighted_sum([y[i] for i in placed_under[a]], [gpus[i] for i in placed_under[a]]) \
            + int(led.allocated[a, 0] * 1000)
        theirs = int(led.allocated[sib, 0] * 1000) - evicted_under[sib]
        m.add(mine <= int(fa * 1000)).only_enforce_if(within)
        m.add(round(mult * fsib * 1000) * mine + 1 <= round(fa * 1000) * theirs).only_enforce_if([used, ~within])
    m.maximize(lin.weighted_sum(y, [1000 * g for g in gpus]) - lin.weighted_sum(z, cost))
    built = time.perf_counter() - t3
    if hint:
        th = time.perf_counter()
        rows = _EndState(led, share, excess, mult, bundles, under, leveled_at, pairs, set(pair_vars))
        if hint_order == "queue":  # KAI's job order at the start of the search (JobQueue pops, nothing placed between)
            from kai_opt.heuristics.jobs import JobQueue

            jq = JobQueue(sess, [g for g, _, _ in groups])
            at = {g: i for i, (g, _, _) in enumerate(groups)}
            popped = []
            while (g := jq.pop()) is not None:
                popped.append(at[g])
            ranking = popped
        else:
            ranking = sorted(range(len(groups)), key=lambda i: (-gpus[i] / len(groups[i][1]), i))
        hz, hy = rows.greedy(groups, group_class, gpus, of_class, cost, request, s.pg_queue, ranking)
        for b in range(len(z)):
            m.add_hint(z[b], b in hz)
        for i in range(len(y)):
            m.add_hint(y[i], i in hy)
        for sib, used in sib_used.items():
            m.add_hint(used, sib in rows.sibs)
        for (a, sib), (used, within) in pair_vars.items():
            m.add_hint(used, (a, sib) in rows.pairs)
            m.add_hint(within, rows.mine(a) <= int(share[a, 0] * 1000))
        print(f"hint (a greedy over the bundles, every row checked): {len(hy)} groups, "
              f"{sum(gpus[i] for i in hy) / 1000:.1f} GPUs placed, {sum(cost[b] for b in hz) / 1000:.1f} GPUs evicted "
              f"in {time.perf_counter() - th:.2f} s")
    t4 = time.perf_counter()
    print(f"model: {len(z)} bundles, {len(y)} groups, {len(leveled_at)} victim-side and {len(pairs)} reclaimer-side "
          f"rows; built in {built:.2f} s")
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = budget
    solver.parameters.num_workers = 2
    solver.parameters.cp_model_probing_level = 0  # as the engine's solve (formulation/solve.py)
    solver.parameters.max_presolve_iterations = 1
    solver.parameters.symmetry_level = 0
    status = solver.solve(m)
    t5 = time.perf_counter()
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    print(f"solve {t5 - t4:.2f} s ({solver.status_name(status)}), bound {solver.best_objective_bound / 1e6:.1f} GPUs")
    verdicts: Counter[str] = Counter()
    if found:
        zs = {b for b in range(len(z)) if solver.value(z[b])}
        ys = {i for i in range(len(y)) if solver.value(y[i])}
    elif hint:  # no solution within the budget: the hint stands (a solution of the model by construction)
        zs, ys = hz, hy
        print("  no solution from CP-SAT: the hint stands")
    else:
        return dict(verdicts)
    for kind, name in ((0, "reclaim"), (1, "preempt")):
        placed = [i for i in range(len(groups)) if groups[i][2] == kind and i in ys]
        verdicts[f"{name} groups"] = len(placed)
        chosen = [b for b in range(len(z)) if classes[bundles[b][0]][0] == kind and b in zs]
        gone = {int(vgroup[p]): int(vtotal[p]) for b in chosen for p in bundles[b][3].tolist()}
        print(f"  {name}: {len(placed)} groups, {sum(len(groups[i][1]) for i in placed)} pods, "
              f"{sum(gpus[i] for i in placed) / 1000:.1f} GPUs placed; {len(gone)} victim groups, "
              f"{sum(gone.values()) / 1000:.1f} GPUs evicted")
    # a group takes its class's chosen bundles in order, and a bundle's victims count for the first group using it
    room_left = {b: bundles[b][2] for b in zs}
    decisions: list[tuple[int, list[int], str]] = []
    for c, idx in sorted(class_groups.items()):
        mine_b = [b for b in of_class.get(c, []) if b in room_left]
        for i in idx:
            if i not in ys:
                continue
            need, first_use = len(groups[i][1]), []
            for b in mine_b:
                take = min(need, room_left[b])
                if take:
                    if room_left[b] == bundles[b][2]:
                        first_use.append(b)
                    room_left[b] -= take
                    need -= take
            decisions.append((i, [int(vgroup[p]) for b in first_use for p in bundles[b][3]],
                              "reclaim" if groups[i][2] == 0 else "preempt"))
    verdicts.update(_kai_check(base, decisions, request))
    print(f"  KAI's reclaim predicates on the placed reclaimers, in turn: "
          f"{ {key: n for key, n in verdicts.items() if not key.endswith(' groups')} }")
    return dict(verdicts)


def probe_shared(st: object, fs: object, *, spread: bool, hint_order: str, rule: str = "end",
                 preempt: bool = False) -> dict[str, int]:
    """`--form shared`: no model; a greedy that places each admitted group's pods node by node (in KAI's job order, or
    by GPUs per pod), on room already free or released, else on the node where evicting the fewest GPUs of eligible
    victims (fewest GPUs first) makes room; nodes are shared between groups. The group is kept only if KAI's reclaim
    rule in its end state still holds (the bundle model's rows), then checked with KAI's own predicates in turn."""
    from kai_opt.fairshare.capacity import non_preemptible_over_quota
    from kai_opt.fairshare.reclaim import can_reclaim, reclaimable
    from kai_opt.fairshare.share import UNLIMITED
    from kai_opt.heuristics.jobs import JobQueue
    from kai_opt.state.resources import R_CPU, R_GPU, R_MEM

    cols = [R_GPU, R_CPU, R_MEM]
    base = _setup(st, fs, preempt=preempt, spread=spread)
    ledger = base.led.copy()  # rule "turn": the ledger following the decisions
    sess, s, led, share, groups = base.sess, base.s, base.led, base.share, base.groups
    vgroup, vnode, vreq, vtotal, vqueue = base.vgroup, base.vnode, base.vreq, base.vtotal, base.vqueue
    vprio = base.vprio
    seg, seg_node, seg_of, path, excess, mult = base.seg, base.seg_node, base.seg_of, base.path, base.excess, base.mult
    t2 = time.perf_counter()
    request = [sess.queue_request(t).sum(axis=0) for _, t, _ in groups]
    gpus = [round(float(r[0]) * 1000) for r in request]
    if hint_order == "queue":
        jq = JobQueue(sess, [g for g, _, _ in groups])
        at = {g: i for i, (g, _, _) in enumerate(groups)}
        ranking = []
        while (g := jq.pop()) is not None:
            ranking.append(at[g])
    else:
        ranking = sorted(range(len(groups)), key=lambda i: (-gpus[i] / len(groups[i][1]), i))
    units_of: dict[int, list[int]] = defaultdict(list)
    for u, v in enumerate(vgroup.tolist()):
        units_of[v].append(u)
    vpath = path[vqueue]
    room = (sess.alloc - sess.held)[:, cols].astype(np.int64)
    alive = np.ones(len(vgroup), dtype=bool)
    evicted_under: Counter[int] = Counter()
    placed_under: Counter[int] = Counter()
    sib_uses: Counter[int] = Counter()
    pair_uses: Counter[tuple[int, int]] = Counter()
    leaf: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(3))
    zero = np.zeros((1, 3), dtype=np.int64)
    big = 1 << 40

    def holds() -> bool:
        if any(n and evicted_under[sib] > int(excess[sib]) for sib, n in sib_uses.items()):
            return False
        for (a, sib), n in pair_uses.items():
            fa, fsib = share[a, 0], share[sib, 0]
            if not n or fa == UNLIMITED or fsib <= 0 or fsib == UNLIMITED:
                continue
            mine = int(led.allocated[a, 0] * 1000) + placed_under[a]
            theirs = int(led.allocated[sib, 0] * 1000) - evicted_under[sib]
            if mine > int(fa * 1000) and round(mult * fsib * 1000) * mine + 1 > round(fa * 1000) * theirs:
                return False
        return True

    decisions: list[tuple[int, list[int], str]] = []
    stats: Counter[str] = Counter()

    def attempt(i: int, mode: str) -> None:
        g, tasks, _ = groups[i]
        q = int(s.pg_queue[g])
        if mode == "preempt":  # the group's own queue's lower-priority work; no fair-share rule
            if not bool(s.pg_preemptible[g]) and non_preemptible_over_quota(sess.fs, ledger, q, request[i]) is not None:
                stats["preempt: over quota"] += 1  # (KAI's preempt admits non-preemptible work within its quota)
                return
            sibling = np.full(len(vqueue), -1)
            mine_at = sibling
            eligible = (vqueue == q) & (vprio < int(s.pg_priority[g])) & ~base.protected_p
        elif (leaf[q] + request[i] > share[q] - led.allocated[q] + 1e-9).any():
            stats["leaf"] += 1
            return
        else:
            sibling, mine_at, eligible = reclaim_victims(i, q)
        journal_room: list[tuple[int, np.ndarray]] = []
        gone: list[int] = []  # victim groups evicted for this group
        ok = True
        for t in tasks:
            r = s.pod_req[t, cols].astype(np.int64)
            need = r > 0
            static = base.ctx.placer.static_mask(int(s.pod_sig[t]))
            now = static & (room >= r).all(axis=1)
            if now.any():
                cand = np.flatnonzero(now)
                n = int(cand[np.argmin(room[cand, 0])])
            else:
                live = eligible & alive & static[vnode]
                freed = np.where(live[:, None], vreq, 0)
                cum = np.cumsum(freed, axis=0)
                after = room[vnode] + cum - np.vstack([zero, cum])[seg][seg_of]
                hit = live & np.where(need, after >= r, True).all(axis=1)
                first = np.minimum.reduceat(np.where(hit, np.arange(len(vgroup)), big), seg)
                cost_cum = np.cumsum(np.where(live, vtotal, 0))
                cost = np.where(first < big, cost_cum[np.minimum(first, len(vgroup) - 1)]
                                - np.r_[0, cost_cum][seg], big)
                best = int(np.argmin(cost))
                if cost[best] >= big:
                    ok = False
                    break
                n = int(seg_node[best])
                for u in np.flatnonzero(live[seg[best]:first[best] + 1]) + seg[best]:
                    v = int(vgroup[u])
                    if not alive[u]:
                        continue
                    gone.append(v)
                    for w in units_of[v]:
                        alive[w] = False
                        room[vnode[w]] += vreq[w]
                        journal_room.append((int(vnode[w]), -vreq[w]))
                    if mode == "reclaim":
                        for a in led.ancestors[int(s.pg_queue[v])]:
                            evicted_under[a] += int(vtotal[u])
                        sib = int(sibling[u])
                        sib_uses[sib] += 1
                        pair_uses[(int(mine_at[u]), sib)] += 1
            room[n] -= r
            journal_room.append((n, r))
        np_work = not bool(s.pg_preemptible[g])
        chunks = _chunks(base, dict.fromkeys(gone)) if ok else []
        if ok and mode == "preempt":
            pass
        elif ok and rule == "turn":  # KAI's predicates on the ledger as it stands at this group's turn
            ok = can_reclaim(sess.fs, ledger, q, request[i], preemptible=not np_work) and reclaimable(
                sess.fs, ledger, q, request[i], chunks, preemptible=not np_work, saturation_multiplier=mult) is None
            if not ok:
                stats["rule"] += 1
        elif ok:
            for a in led.ancestors[q]:
                placed_under[a] += gpus[i]
            ok = holds()
            if not ok:
                for a in led.ancestors[q]:
                    placed_under[a] -= gpus[i]
                stats["rows"] += 1
        else:
            stats[f"{mode}: no room"] += 1
        if not ok:  # undo: room, victims, rows
            for n, amount in reversed(journal_room):
                room[n] += amount
            for v in gone:
                u0 = units_of[v][0]
                for w in units_of[v]:
                    alive[w] = True
                if mode == "reclaim":
                    for a in led.ancestors[int(s.pg_queue[v])]:
                        evicted_under[a] -= int(vtotal[u0])
                    sib = int(sibling[u0])
                    sib_uses[sib] -= 1
                    pair_uses[(int(mine_at[u0]), sib)] -= 1
            return
        ledger.add(q, request[i], non_preemptible=np_work)
        for qv, ch in chunks:
            ledger.add(qv, -ch, non_preemptible=False)
        if mode == "reclaim":
            leaf[q] += request[i]
        decisions.append((i, gone, mode))
        placed.add(i)

    def reclaim_victims(i: int, q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per victim unit: the sibling it is compared at, q's side there, and whether it may go for q now."""
        diff = vpath != path[q]
        sibling = vpath[np.arange(len(vqueue)), np.argmax(diff, axis=1)]
        slack = excess if rule == "end" else np.maximum(  # rule "turn": the siblings' room as the ledger stands
            0.0, ledger.allocated[:, 0] - sess.fs.allocatable_share[:, 0]) * 1000
        eligible = diff.any(axis=1) & ~base.protected_r & (slack[np.maximum(sibling, 0)] > 0)
        mine_at = path[q][np.minimum(np.array([len(a) - 1 for a in led.ancestors])[np.maximum(sibling, 0)],
                                     path.shape[1] - 1)]  # q's side at each victim's sibling level
        if rule == "turn":  # and a sibling the reclaimer's side already fails against (GPUs, as the ledger stands)
            mine_now = ledger.allocated[mine_at, 0] + float(request[i][0])
            fa, fsib = share[mine_at, 0], share[np.maximum(sibling, 0), 0]
            theirs = ledger.allocated[np.maximum(sibling, 0), 0]
            over = (fa != UNLIMITED) & (mine_now > fa * (1 + 1e-9))
            comparable = (fsib > 0) & (fsib != UNLIMITED) & (fa != UNLIMITED)
            fails = over & comparable & (mult * mine_now * np.where(comparable, fsib, 1)
                                         >= theirs * np.where(comparable, fa, 1) * (1 - 1e-9))
            eligible &= ~fails
        return sibling, mine_at, eligible

    placed: set[int] = set()
    for i in ranking:
        if groups[i][2] == 0:
            attempt(i, "reclaim")
    if preempt:  # KAI's preempt runs after reclaim, for every group still pending
        for i in ranking:
            if i not in placed:
                attempt(i, "preempt")
    t3 = time.perf_counter()
    total = {int(vgroup[u]): int(vtotal[u]) for u in range(len(vgroup))}
    print(f"allocate+consolidate {base.t1 - base.t0:.2f} s; {len(groups)} pending groups "
          f"({sum(1 for x in groups if x[2] == 0)} admitted by the reclaim rule); {len(vgroup)} victim units of "
          f"{len(np.unique(vgroup))} groups ({t2 - base.t1:.2f} s); the greedy ({hint_order} order) {t3 - t2:.2f} s; "
          f"not placed: {dict(stats)}")
    for mode in ("reclaim", "preempt"):
        mine = [(i, vs) for i, vs, m_ in decisions if m_ == mode]
        gone_all = {v for _, vs in mine for v in vs}
        print(f"  {mode}: {len(mine)} groups, {sum(len(groups[i][1]) for i, _ in mine)} pods, "
              f"{sum(gpus[i] for i, _ in mine) / 1000:.1f} GPUs placed; {len(gone_all)} victim groups, "
              f"{sum(total[v] for v in gone_all) / 1000:.1f} GPUs evicted")
    t4 = time.perf_counter()
    real, made = _replay(base, decisions)
    print(f"  replayed on the session and checked (check_plan passed) in {time.perf_counter() - t4:.2f} s: "
          f"{real['groups']:.0f} groups, {real['GPUs']:.1f} GPUs placed ({real['failed']:.0f} could not be placed "
          f"by the gang placer); {real['evicted pods']:.0f} pods, {real['evicted GPUs']:.1f} GPUs evicted; KAI's "
          f"scenario simulation would re-allocate {real['ahead victims']:.0f} victim groups first, for "
          f"{real['ahead groups']:.0f} of the groups")
    verdicts = _kai_check(base, made, request)
    print(f"  KAI's reclaim predicates on the reclaims as made, in turn: {dict(verdicts)}")
    out = dict(verdicts)
    for mode in ("reclaim", "preempt"):
        mine = [i for i, _, m_ in made if m_ == mode]
        out[f"{mode} groups"] = len(mine)
        if mine:
            print(f"  as made, {mode}: {len(mine)} groups, {sum(gpus[i] for i in mine) / 1000:.1f} GPUs placed")
    return out


def _chunks(base: SimpleNamespace, victims: Any) -> list[tuple[int, np.ndarray]]:
    """KAI's victim chunks (leaf queue, resources) of whole victim groups."""
    from kai_opt.fairshare.reclaim import victim_chunks
    from kai_opt.heuristics.session import IS_ACTIVE

    sess, s = base.sess, base.s
    out: list[tuple[int, np.ndarray]] = []
    for v in victims:
        pods = base.members[base.start[v]:base.start[v + 1]]
        pods = pods[IS_ACTIVE[sess.status[pods]]]
        out += [(int(s.pg_queue[v]), ch) for ch in victim_chunks(sess.queue_request(pods), int(s.pg_min_member[v]))]
    return out


def _replay(base: SimpleNamespace, decisions: list[tuple[int, list[int], str]]
            ) -> tuple[dict[str, float], list[tuple[int, list[int], str]]]:
    """The decisions made real on the session, in turn: each group's victims evicted (reason reclaim), its pods placed
    by the greedy engine's gang placer (pipelined onto what is being released; devices chosen as in any cycle), all
    or nothing; then the plan through the independent checker (`check_plan`, raises on a violation)."""
    from kai_opt.actions import ACTION_BY_NAME
    from kai_opt.checker import check_plan
    from kai_opt.heuristics.cycle import plan_from_session
    from kai_opt.heuristics.session import IS_ACTIVE
    from kai_opt.heuristics.victims import _PendingOrder, _victims_ahead

    sess, s, ctx = base.sess, base.s, base.ctx
    placed_groups, placed_gpu, failed, ahead_groups, ahead_victims = 0, 0.0, 0, 0, 0
    gone: set[int] = set()
    made: list[tuple[int, list[int], str]] = []  # the decisions as made: group, victim groups that stay evicted
    for i, victims, mode in decisions:
        g, tasks, _ = base.groups[i]
        cp = sess.checkpoint()
        fresh = [v for v in dict.fromkeys(victims) if v not in gone]
        pods = [int(p) for v in fresh for p in base.members[base.start[v]:base.start[v + 1]]
                if IS_ACTIVE[sess.status[p]]]
        reason = ACTION_BY_NAME[mode].eviction_reason
        assert reason is not None
        if pods:
            order = _PendingOrder(sess)  # the allocation order of the state this group's evictions start from
            sess.evict_many(pods, reason, g)
            chunks = [[int(p) for p in base.members[base.start[v]:base.start[v + 1]] if int(p) in set(pods)]
                      for v in fresh]
            # KAI's scenario simulation (reclaim's): victims re-allocated first
            back = _victims_ahead(sess, g, chunks, order) if mode == "reclaim" else set()
            if back:  # (put back on the session: the placement below goes without them, as in KAI)
                ahead_groups += 1
                ahead_victims += len(back)
                fresh = [v for k, v in enumerate(fresh) if k not in back]
        attempt = ctx.gang.place(g, tasks, allow_pipeline=True)
        if not attempt.ok:
            sess.rollback(cp)
            failed += 1
            continue
        sess.convert_to_pipelined(attempt.placed)
        gone.update(fresh)
        made.append((i, fresh, mode))
        placed_groups += 1
        placed_gpu += float(s.pod_req[tasks, 2].sum()) / 1000
    plan = plan_from_session(sess, ctx.reasons, "probe")
    check_plan(s, plan, sess.fs, sess.cfg)
    evicted = [e.pod for e in plan.evictions]
    stats = {"groups": placed_groups, "GPUs": placed_gpu, "failed": failed, "evicted pods": len(evicted),
             "ahead groups": ahead_groups, "ahead victims": ahead_victims,
             "evicted GPUs": float(s.pod_req[evicted, 2].sum()) / 1000 if evicted else 0.0}
    return stats, made


def _kai_check(base: SimpleNamespace, decisions: list[tuple[int, list[int], str]],
               request: list[np.ndarray]) -> Counter[str]:
    """Each placed reclaimer in turn (`decisions`: group index, victim groups) against KAI's own predicates
    (`can_reclaim`, `reclaimable`) on a ledger that follows the decisions; a victim group goes once."""
    from kai_opt.fairshare.reclaim import can_reclaim, reclaimable

    sess, s = base.sess, base.s
    ledger = base.led0.copy()
    evicted: set[int] = set()
    verdicts: Counter[str] = Counter()
    for i, victims, mode in decisions:
        g = base.groups[i][0]
        q, np_work = int(s.pg_queue[g]), not bool(s.pg_preemptible[g])
        fresh = [v for v in dict.fromkeys(victims) if v not in evicted]
        evicted.update(fresh)
        chunks = _chunks(base, fresh)
        if mode == "reclaim":
            why = None if can_reclaim(sess.fs, ledger, q, request[i], preemptible=not np_work) else "can_reclaim"
            why = why or reclaimable(sess.fs, ledger, q, request[i], chunks, preemptible=not np_work,
                                     saturation_multiplier=base.mult)
            verdicts[why or "allowed"] += 1
        ledger.add(q, request[i], non_preemptible=np_work)
        for qv, ch in chunks:
            ledger.add(qv, -ch, non_preemptible=False)
    return verdicts


class _EndState:
    """The bundle model's rows in their end state, kept as bundles and groups are taken (the greedy hint): GPUs
    evicted and placed under each queue, and per victim-side sibling and (reclaimer side, sibling) pair how many
    taken bundles put it in use."""

    def __init__(self, led: Any, share: np.ndarray, excess: np.ndarray, mult: float, bundles: list[Any],
                 under: dict[int, list[tuple[int, int]]], leveled_at: dict[int, list[int]],
                 pairs: dict[tuple[int, int], list[int]], finite: set[tuple[int, int]]) -> None:
        self.led, self.share, self.excess, self.mult, self.bundles = led, share, excess, mult, bundles
        self.evicted: Counter[int] = Counter()
        self.placed: Counter[int] = Counter()
        self.sib_uses: Counter[int] = Counter()
        self.pair_uses: Counter[tuple[int, int]] = Counter()
        self.frees: dict[int, list[tuple[int, int]]] = defaultdict(list)  # bundle -> (queue, milli-GPUs)
        for q, lst in under.items():
            for b, amount in lst:
                self.frees[b].append((q, amount))
        self.levels: dict[int, list[int]] = defaultdict(list)
        for sib, bs in leveled_at.items():
            for b in bs:
                self.levels[b].append(sib)
        self.pairs_of: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for pair, bs in pairs.items():
            if pair in finite:
                for b in bs:
                    self.pairs_of[b].append(pair)

    @property
    def sibs(self) -> set[int]:
        return {sib for sib, n in self.sib_uses.items() if n}

    @property
    def pairs(self) -> set[tuple[int, int]]:
        return {pair for pair, n in self.pair_uses.items() if n}

    def mine(self, a: int) -> int:
        return int(self.led.allocated[a, 0] * 1000) + self.placed[a]

    def holds(self) -> bool:
        if any(n and self.evicted[sib] > int(self.excess[sib]) for sib, n in self.sib_uses.items()):
            return False
        for (a, sib), n in self.pair_uses.items():
            if not n:
                continue
            fa, fsib = self.share[a, 0], self.share[sib, 0]
            mine, theirs = self.mine(a), int(self.led.allocated[sib, 0] * 1000) - self.evicted[sib]
            if mine > int(fa * 1000) and round(self.mult * fsib * 1000) * mine + 1 > round(fa * 1000) * theirs:
                return False
        return True

    def _use(self, b: int, sign: int) -> None:
        for q, amount in self.frees[b]:
            self.evicted[q] += sign * amount
        for sib in self.levels[b]:
            self.sib_uses[sib] += sign
        for pair in self.pairs_of[b]:
            self.pair_uses[pair] += sign

    def _place(self, q: int, gpus: int) -> None:
        for a in self.led.ancestors[q]:
            self.placed[a] += gpus

    def greedy(self, groups: list[tuple[int, list[int], int]], group_class: list[int], gpus: list[int],
               of_class: dict[int, list[int]], cost: list[int], request: list[np.ndarray],
               queue_of: np.ndarray, ranking: list[int]) -> tuple[set[int], set[int]]:
        """Groups in `ranking` order; each takes its class's cheapest free bundles (GPUs evicted per pod) while every
        row in use holds, all or nothing."""
        taken: set[int] = set()
        nodes: set[int] = set()
        placed: set[int] = set()
        spare: Counter[int] = Counter()  # class -> pods of room left in its taken bundles
        leaf: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(3))
        by_cost = {c: sorted(bs, key=lambda b: (cost[b] / self.bundles[b][2], -self.bundles[b][2]))
                   for c, bs in of_class.items()}
        for i in ranking:
            g, tasks, kind = groups[i]
            q, c = int(queue_of[g]), group_class[i]
            if kind == 0 and (leaf[q] + request[i] > self.share[q] - self.led.allocated[q] + 1e-9).any():
                continue
            self._place(q, gpus[i])
            if not self.holds():
                self._place(q, -gpus[i])
                continue
            need, mine = len(tasks) - spare[c], []
            for b in by_cost.get(c, []):
                if need <= 0:
                    break
                if b in taken or self.bundles[b][1] in nodes:
                    continue
                self._use(b, 1)
                if self.holds():
                    mine.append(b)
                    taken.add(b)
                    nodes.add(self.bundles[b][1])
                    need -= self.bundles[b][2]
                else:
                    self._use(b, -1)
            if need > 0:
                for b in mine:
                    self._use(b, -1)
                    taken.discard(b)
                    nodes.discard(self.bundles[b][1])
                self._place(q, -gpus[i])
                continue
            spare[c] = -need
            placed.add(i)
            leaf[q] += request[i]
        return taken, placed

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default="/tmp")
    ap.add_argument("--candidates", type=int, default=500, help="candidate nodes per pending shape")
    ap.add_argument("--victim-rule", choices=RULES, default="every")
    ap.add_argument("--budget", type=float, default=1.0, help="CP-SAT time limit, s")
    ap.add_argument("--no-greedy", action="store_true", help="skip the greedy engine's cycle")
    ap.add_argument("--form", choices=("counts", "bundles", "shared"), default="bundles")
    ap.add_argument("--rule", choices=("end", "turn"), default="end", help="shared: KAI's reclaim rule in its end "
                    "state (the bundle model's rows) or KAI's predicates at each group's turn")
    ap.add_argument("--hint", action="store_true", help="bundles: start CP-SAT from a greedy over the bundles")
    ap.add_argument("--order", choices=("gpus", "queue"), default="gpus",
                    help="bundles hint and shared: groups by GPUs per pod (most first) or in KAI's job order "
                    "(JobQueue) at the start")
    ap.add_argument("--spread", action="store_true", help="bundles and shared: victim groups on several nodes too "
                    "(one unit per node; evicting one evicts the group)")
    ap.add_argument("--preempt", action="store_true", help="bundles and shared: preempt too (victims: running pods of "
                    "the group's queue with a lower priority)")
    args = ap.parse_args()
    from kai_opt.fairshare import compute_fair_share

    st = _state(args.cache_dir, args.nodes, args.seed)
    st = st[0] if isinstance(st, tuple) else st
    fs = compute_fair_share(st)  # type: ignore[arg-type]
    gc.disable()  # as run_cycle does
    if not args.no_greedy:
        greedy_gains(st, fs)
    if args.form == "counts":
        probe_counts(st, fs, args.candidates, args.victim_rule, args.budget)
    elif args.form == "shared":
        probe_shared(st, fs, spread=args.spread, hint_order=args.order, rule=args.rule, preempt=args.preempt)
    else:
        probe_bundles(st, fs, args.candidates, args.budget, preempt=args.preempt, hint=args.hint,
                      spread=args.spread, hint_order=args.order)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
