"""The unblock model (explain/unblock.py runs it): one small CP-SAT model for one pending podgroup alone, on the
cluster as the plan leaves it, over node classes (explain/classes.py): integer pods per (shape, class), the
gang's minimum (and each sub-group's), node capacity, required topology domains, queue limits and, for
non-preemptible work, deserved quota. Each kind of change is a relaxation behind a literal (`fam`) that a solve
assumes on or off:

  evict     evict specific victims that preempt or reclaim may take (their resources free on their nodes)
  capacity  more GPUs (CPU for CPU-only pods) free on nodes that match
  limit     raise a queue limit (the queue or an ancestor)
  quota     raise deserved quota for non-preemptible work
  topology  a wider required level (rack -> block -> ...), or none
  minmember a smaller minMember (of the group or a sub-group)
  affinity  nodes its node selector, affinity or tolerations exclude

The hard parts (gang, each limit, each quota, each topology requirement) are assumption literals too (`core`),
so an infeasible base solve names the constraints that block together. Per node, a class is exact for one pod
shape: extra pods beyond what fits now cost the GPUs that must be freed on those nodes (the first one on a node
completing its partly free devices). Pod (anti-)affinity is not modelled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.explain.classes import build_classes
from kai_opt.explain.shapes import Need
from kai_opt.explain.victims import Unit
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import DEV, Session
from kai_opt.state import R_CPU, R_GPU

UNLIMITED = -1.0
QSCALE = (1000.0, 1.0, 1e-6)  # queue resources as integers: milli-GPU, millicores, MB (as the CP-SAT engine)
FAMILIES = ("evict", "capacity", "limit", "quota", "topology", "minmember", "affinity")
WEIGHT = {"evict": 2, "capacity": 3, "limit": 2, "quota": 2, "topology": 5_000, "minmember": 3_000,
          "affinity": 10_000}  # combined solve: per unit of each family's cost (GPU-ish units)
SOLVE_SECONDS = 0.3


@dataclass
class Option:
    family: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Topo:
    """One required topology constraint: the group's, or a sub-group's."""

    name: str
    shapes: list[int]
    topo: int
    level: int
    fixed: int  # domain its active pods sit in (-1 free, -2 already spread)


class UnblockModel:
    def __init__(self, sess: Session, placer: Placer, need: Need, units: list[Unit]) -> None:
        self.sess, self.st, self.need, self.units = sess, sess.state, need, units
        self.m = cp_model.CpModel()
        self.core: dict[str, cp_model.IntVar] = {}  # hard parts, assumed true in the base solve
        self.fam: dict[str, cp_model.IntVar] = {f: self.m.new_bool_var(f"relax[{f}]") for f in FAMILIES}
        self.cost: dict[str, list[cp_model.LinearExpr]] = defaultdict(list)
        self.lev: dict[int, list[cp_model.IntVar]] = {}  # topology constraint -> literal per level (0 = top)
        self.dom: dict[tuple[int, int, int], cp_model.IntVar] = {}
        self.relax_vars: dict[str, list[tuple[Any, cp_model.IntVar]]] = defaultdict(list)
        self.topos = self._topologies()
        levels = sorted({(t.topo, lv) for t in self.topos for lv in range(t.level + 1)})
        victim_nodes = {int(sess.node[p]) for u in units for p in u.pods}
        fixed = {(t.topo, t.level): {t.fixed} for t in self.topos if t.fixed >= 0}
        self.cls = build_classes(placer, need, levels, victim_nodes, fixed)
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}  # pods of shape si on class k
        self.ub: dict[tuple[int, int], int] = {}
        self.e: list[cp_model.IntVar] = []  # victim unit evicted
        self.freed: dict[int, list[tuple[cp_model.IntVar, int]]] = defaultdict(list)  # node -> (e, pod)
        self.cap_terms: dict[int, tuple[Any, Any, Any]] = {}  # class -> extra (whole devices, milli, millicores)
        self.total_of: dict[int, Any] = {}  # shape -> pods placed
        self.sub_total: dict[int, Any] = {}  # leaf sub-group -> pods placed
        self.placed: Any = 0
        self._build()

    # -- model -------------------------------------------------------------------------------------------------
    def _topologies(self) -> list[Topo]:
        st, need, sess = self.st, self.need, self.sess
        g = need.group
        out = []
        all_shapes = list(range(len(need.shapes)))
        topo, lvl = int(st.pg_topology[g]), int(st.pg_required_level[g])
        pods = st.group_pods(g)
        if topo >= 0 and lvl >= 0:
            out.append(Topo(st.pg_keys[g], all_shapes, topo, lvl, _fixed(sess, pods, topo, lvl)))
        for sg in sorted({s.subgroup for s in need.shapes if s.subgroup >= 0}):
            cur = sg
            while cur >= 0:
                t, lv = int(st.sg_topology[cur]), int(st.sg_required_level[cur])
                if t >= 0 and lv >= 0 and all(o.name != f"subgroup {st.sg_names[cur]}" for o in out):
                    members = [i for i, s in enumerate(need.shapes) if _under(st, s.subgroup, cur)]
                    sub_pods = pods[np.array([_under(st, int(x), cur) for x in st.pod_sg[pods]], dtype=bool)]
                    out.append(Topo(f"subgroup {st.sg_names[cur]}", members, t, lv, _fixed(sess, sub_pods, t, lv)))
                cur = int(st.sg_parent[cur])
        return out

    def _build(self) -> None:
        m, st, need, cls = self.m, self.st, self.need, self.cls
        K = len(cls.rep)
        shapes = need.shapes
        cap_whole: dict[int, list] = defaultdict(list)  # class -> extra whole devices freed
        cap_share: dict[int, list] = defaultdict(list)  # class -> extra milli-GPU
        cap_cpu: dict[int, list] = defaultdict(list)  # class -> extra millicores
        fam_cap, fam_aff = self.fam["capacity"], self.fam["affinity"]
        for si, s in enumerate(shapes):
            avail = len(s.pods)
            req_cpu = int(st.pod_req[s.pod, R_CPU])
            for k in range(K):
                cnt = int(cls.count[k])
                victim_host = cls.victim_node[k] >= 0
                ub = avail if victim_host else min(avail, cnt * int(cls.cap_max[si, k]))
                if ub <= 0:
                    continue
                x = m.new_int_var(0, ub, f"x[{si},{k}]")
                self.x[(si, k)] = x
                self.ub[(si, k)] = ub
                if not cls.static[si, k]:
                    m.add(x <= ub * fam_aff)
                if victim_host:
                    continue  # capacity through the class constraints below (one node, victims counted)
                base = cnt * int(cls.cap_now[si, k])
                d = int(cls.cap_max[si, k]) - int(cls.cap_now[si, k])
                if d <= 0 or (s.kind == "none" and req_cpu == 0):
                    m.add(x <= base)
                    continue
                first = 1 if (s.kind == "whole" and cls.rem[si, k] > 0) else 0
                u = m.new_int_var(0, cnt * first, f"up1[{si},{k}]")
                v = m.new_int_var(0, cnt * (d - first), f"up[{si},{k}]")
                m.add(u + v <= cnt * d * fam_cap)
                m.add(x <= base + u + v)
                if s.kind == "whole":
                    cap_whole[k].append(u * (s.whole - int(cls.rem[si, k])) + v * s.whole)
                elif s.kind == "share":
                    cap_share[k].append(v * s.gpu_milli)
                else:
                    cap_cpu[k].append(v * req_cpu)
        self._victims()
        self._classes(cap_whole, cap_share, cap_cpu)
        self._gang()
        self._queues()
        self._topology()

    def _victims(self) -> None:
        m, st = self.m, self.st
        for i, u in enumerate(self.units):
            e = m.new_bool_var(f"evict[{i}]")
            m.add(e <= self.fam["evict"])
            self.e.append(e)
            gpu = int(st.pod_req[u.pods, R_GPU].sum())
            penalty = 1 if u.protected is None else 3  # what a rule protects is a bigger ask
            self.cost["evict"].append(e * penalty * (10_000 * len(u.pods) + gpu))
            for p in u.pods:
                self.freed[int(self.sess.node[p])].append((e, p))
        # a victim queue keeps its share: what reclaim takes from it is bounded as the CP-SAT engine does it
        by_queue: dict[int, list[int]] = defaultdict(list)
        for i, u in enumerate(self.units):
            if u.action == "reclaim" and u.protected is None:
                by_queue[int(st.pg_queue[u.group])].append(i)
        alloc = self.sess.ledger.allocated
        share = self.sess.fs.allocatable_share
        for vq, idx in by_queue.items():
            floor = share[vq, 0] if share[vq, 0] != UNLIMITED else self.sess.fs.total[0]
            amounts = [int(st.pod_req[self.units[i].pods, R_GPU].sum()) for i in idx]
            room = max(0, round((alloc[vq, 0] - floor) * 1000)) + max(amounts)
            m.add(sum(self.e[i] * a for i, a in zip(idx, amounts, strict=True)) <= room)

    def _classes(self, cap_whole: dict, cap_share: dict, cap_cpu: dict) -> None:
        m, st, cls, shapes = self.m, self.st, self.cls, self.need.shapes
        fam_cap = self.fam["capacity"]
        cols = [c for c in range(st.pod_req.shape[1]) if c != R_GPU
                and any(st.pod_req[s.pod, c] > 0 for s in shapes)]
        for k in range(len(cls.rep)):
            cnt = int(cls.count[k])
            items = [(si, self.x[(si, k)]) for si in range(len(shapes)) if (si, k) in self.x]
            if not items:
                continue
            node = int(cls.victim_node[k])
            if node < 0 and len(shapes) == 1:
                continue  # one shape: its per-node capacities (and their relaxations) are the class's constraints
            freed = self.freed.get(node, []) if node >= 0 else []
            for c in cols:
                use = sum(x * int(st.pod_req[shapes[si].pod, c]) for si, x in items)
                room = cnt * int(cls.free[k, c]) if node < 0 else int(self.sess.alloc[node, c]
                                                                       - self.sess.held[node, c])
                gain = sum(e * int(st.pod_req[p, c]) for e, p in freed)
                extra = sum(cap_cpu.get(k, [])) if c == R_CPU else 0
                m.add(use <= room + gain + extra)
            whole = [(si, x) for si, x in items if shapes[si].kind == "whole"]
            if whole:
                use = sum(x * shapes[si].whole for si, x in whole)
                gain = sum(e * int(st.pod_gpu_whole[p]) for e, p in freed)
                extra: Any = sum(cap_whole.get(k, []))
                if node >= 0:  # one node: any of its other devices may be freed
                    free_devs = int(self.sess.whole_future[node])
                    ew = m.new_int_var(0, max(0, int(cls.gpus[k]) - free_devs), f"free_whole[{k}]")
                    m.add(ew <= int(cls.gpus[k]) * fam_cap)
                    m.add(free_devs + gain + ew <= int(cls.gpus[k]))
                    cap_whole[k].append(ew)
                    extra = sum(cap_whole[k])
                m.add(use <= cnt * int(cls.free[k, R_GPU]) + gain + extra)
            share = [(si, x) for si, x in items if shapes[si].kind == "share"]
            if share:
                use = sum(x * shapes[si].gpu_milli for si, x in share)
                gain = sum(e * _gpu_milli_held(self.sess, p) for e, p in freed)
                extra = sum(cap_share.get(k, []))
                if node >= 0:
                    es = m.new_int_var(0, int(cls.gpus[k]) * DEV, f"free_share[{k}]")
                    m.add(es <= int(cls.gpus[k]) * DEV * fam_cap)
                    cap_share[k].append(es)
                    extra = sum(cap_share[k])
                m.add(use <= cnt * int(cls.share_free[k]) + gain + extra)
        self.cap_terms = {k: (sum(cap_whole.get(k, [])), sum(cap_share.get(k, [])), sum(cap_cpu.get(k, [])))
                          for k in set(cap_whole) | set(cap_share) | set(cap_cpu)}
        for terms in cap_whole.values():
            self.cost["capacity"].append(sum(terms) * DEV)
        for terms in list(cap_share.values()) + list(cap_cpu.values()):
            self.cost["capacity"].append(sum(terms))

    def _gang(self) -> None:
        m, need, st = self.m, self.need, self.st
        a = self.core["gang"] = m.new_bool_var("gang")
        fam = self.fam["minmember"]
        for si, s in enumerate(need.shapes):
            xs = [x for (i, _k), x in self.x.items() if i == si]
            self.total_of[si] = sum(xs) if xs else 0
            if xs:
                m.add(sum(xs) <= len(s.pods))
        self.placed = sum(self.total_of.values()) if self.total_of else 0
        r = m.new_int_var(0, max(0, need.need - 1), "fewer[group]")
        m.add(r <= max(0, need.need - 1) * fam)
        m.add(self.placed + r >= need.need).only_enforce_if(a)
        self.relax_vars["minmember"].append((None, r))
        self.cost["minmember"].append(r)
        for sg, k in sorted(need.sub_need.items()):
            if k <= 0:
                continue
            members = [si for si, s in enumerate(need.shapes) if s.subgroup == sg]
            tot = sum(self.total_of[si] for si in members) if members else 0
            self.sub_total[sg] = tot
            rj = m.new_int_var(0, max(0, k - 1), f"fewer[{st.sg_names[sg]}]")
            m.add(rj <= max(0, k - 1) * fam)
            m.add(tot + rj >= k).only_enforce_if(a)
            self.relax_vars["minmember"].append((sg, rj))
            self.cost["minmember"].append(rj)

    def _queues(self) -> None:
        m, st, sess, need = self.m, self.st, self.sess, self.need
        g = need.group
        q = int(st.pg_queue[g])
        if q < 0:
            return
        fs, ledger = sess.fs, sess.ledger
        scale = np.array(QSCALE)
        qreq = [np.ceil(sess.queue_request([s.pod])[0] * scale).astype(np.int64) for s in need.shapes]
        vreq = [np.ceil(sess.queue_request(u.pods, sess.node[np.array(u.pods)]).sum(axis=0) * scale).astype(np.int64)
                for u in self.units]
        alloc = np.round(ledger.allocated * scale).astype(np.int64)
        alloc_np = np.round(ledger.allocated_np * scale).astype(np.int64)
        most = sum(int(qr.max()) * len(s.pods) for qr, s in zip(qreq, need.shapes, strict=True)) + 1
        for a in ledger.ancestors[q]:
            for r in range(3):
                if not any(qr[r] for qr in qreq):
                    continue
                use = sum(self.total_of[si] * int(qreq[si][r]) for si in range(len(need.shapes)))
                lim = fs.limit[a, r]
                if lim != UNLIMITED:
                    freed = sum(self.e[i] * int(vreq[i][r]) for i, u in enumerate(self.units)
                                if a in ledger.ancestors[int(st.pg_queue[u.group])])
                    lit = self.core[f"limit:{st.q_names[a]}:{r}"] = m.new_bool_var(f"limit[{a},{r}]")
                    extra = m.new_int_var(0, most, f"limit_up[{a},{r}]")
                    m.add(extra <= most * self.fam["limit"])
                    m.add(int(alloc[a, r]) + use - freed <= int(np.floor(lim * scale[r])) + extra).only_enforce_if(lit)
                    self.relax_vars["limit"].append(((a, r), extra))
                    self.cost["limit"].append(extra)
                des = fs.deserved[a, r]
                if not st.pg_preemptible[g] and des != UNLIMITED:
                    lit = self.core[f"quota:{st.q_names[a]}:{r}"] = m.new_bool_var(f"quota[{a},{r}]")
                    extra = m.new_int_var(0, most, f"quota_up[{a},{r}]")
                    m.add(extra <= most * self.fam["quota"])
                    m.add(int(alloc_np[a, r]) + use <= int(np.floor(des * scale[r])) + extra).only_enforce_if(lit)
                    self.relax_vars["quota"].append(((a, r), extra))
                    self.cost["quota"].append(extra)

    def _topology(self) -> None:
        m, cls = self.m, self.cls
        for ci, t in enumerate(self.topos):
            levs = [m.new_bool_var(f"level[{ci},{lv}]") for lv in range(t.level + 1)]
            self.lev[ci] = levs
            self.core[f"topology:{ci}"] = levs[t.level]
            m.add(sum(levs) <= 1)
            for lv, lit in enumerate(levs):
                dom = cls.domains[(t.topo, lv)]
                present = sorted({int(d) for d in dom.tolist() if d >= 0})
                o = {}
                for d in present:
                    o[d] = self.dom[(ci, lv, d)] = m.new_bool_var(f"domain[{ci},{lv},{d}]")
                if present:
                    m.add(sum(o.values()) == 1).only_enforce_if(lit)
                else:
                    m.add_bool_or([lit.Not()])
                if lv == t.level and t.fixed >= 0:
                    for d, od in o.items():
                        if d != t.fixed:
                            m.add(od == 0).only_enforce_if(lit)
                for si in t.shapes:
                    for k in range(len(cls.rep)):
                        x = self.x.get((si, k))
                        if x is None:
                            continue
                        d = int(dom[k])
                        if d < 0 or (lv == t.level and t.fixed == -2):
                            m.add(x == 0).only_enforce_if(lit)
                        else:
                            m.add(x <= self.ub[(si, k)] * o[d]).only_enforce_if(lit)

    # -- solving -----------------------------------------------------------------------------------------------
    def solve(self, true: list[Any], false: list[Any], objective: Any = None,
              maximize: bool = False) -> tuple[int, cp_model.CpSolver]:
        m = self.m
        m.clear_assumptions()
        m.add_assumptions(list(true) + [lit.Not() for lit in false])
        m.clear_objective()
        if objective is not None:
            (m.maximize if maximize else m.minimize)(objective)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
        solver.parameters.max_time_in_seconds = SOLVE_SECONDS
        status = solver.solve(m)
        return status, solver

    def default_levels(self, relax: dict[int, int | None] | None = None) -> tuple[list, list]:
        """Assumptions for the topology levels: each constraint at its own level, or `relax[ci]` (None: off)."""
        true, false = [], []
        for ci, t in enumerate(self.topos):
            want = t.level if relax is None or ci not in relax else relax[ci]
            for lv, lit in enumerate(self.lev[ci]):
                (true if lv == want else false).append(lit)
        return true, false


def _gpu_milli_held(sess: Session, p: int) -> int:
    st = sess.state
    if st.pod_gpu_whole[p]:
        return int(st.pod_gpu_whole[p]) * DEV
    return st.pod_gpu_per_device(p, int(sess.node[p])) * int(st.pod_gpu_ndev[p]) if (
        st.pod_gpu_frac[p] or st.pod_gpu_mem[p]) else 0


def _fixed(sess: Session, pods: np.ndarray, topo: int, level: int) -> int:
    from kai_opt.heuristics.tasks import active_mask

    active = pods[active_mask(sess, pods)]
    if len(active) == 0:
        return -1
    dom = sess.state.topologies[topo].domain[level]
    doms = {int(dom[int(sess.node[p])]) for p in active.tolist()}
    return doms.pop() if len(doms) == 1 and -1 not in doms else -2


def _under(st: Any, s: int, root: int) -> bool:
    while s >= 0:
        if s == root:
            return True
        s = int(st.sg_parent[s])
    return False
