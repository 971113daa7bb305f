"""Consolidation's victim search, as KAI's job solver runs it for consolidation (read in KAI's source:
actions/consolidation/consolidation.go, actions/common/solvers/{job_solver,pod_scenario_builder,by_pod_solver}.go,
solvers/scenario/by_node_scenario.go, actions/common/action.go, framework/statement.go).

- **One more task at a time.** The pending job's tasks 1..i are solved for i = 1, 2, ...: each from the session's
  state, with the victims the solution for 1..i-1 moved (KAI's recorded victims) evicted again; the last
  solution is kept.
- **Scenarios.** Victim chunks accumulate in victim order (a chunk holding a recorded pod is skipped). A scenario
  is simulated only when the accumulated victims could free enough GPUs (KAI's accumulated idle-GPUs filter), and
  then once per node of the latest victim job, evicting the recorded victims and the accumulated chunks of the
  jobs with a chunk on that node, not every accumulated victim (KAI's by-node scenario). A scenario with no
  victim at all is not simulated.
- **Simulation.** The evicted victims' jobs, the pending job and the session's pending jobs are popped from one
  allocation-order queue (JobQueue, KAI's GetJobsToAllocate): a pending job that is neither is skipped; a victim
  job is allocated again (its evicted pods, as many as its gang needs, all or nothing, inside its queue's
  capacity) on the feasible nodes; the pending job's tasks are placed when it pops. A victim allocated on its own
  node is un-evicted (KAI's Statement.Pipeline of a pod already on the node; whole GPUs count, so it keeps its
  devices and what the simulation put there takes others; a GPU share keeps running only on its own device),
  elsewhere it moves (pipelined). Only the session's pending jobs of the victims' and the pending job's queues
  (and their ancestors) take part: a skipped job elsewhere heads no queue on their paths, and skipping it changes
  no allocation, so it cannot change the order in which they pop.
- **Validation** (KAI's allPodsReallocated): no victim left evicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kai_opt.fairshare.capacity import capacity_violation
from kai_opt.heuristics.gang import Attempt
from kai_opt.heuristics.jobs import JobQueue
from kai_opt.heuristics.session import DEV, Session
from kai_opt.heuristics.tasks import tasks_to_allocate
from kai_opt.heuristics.victims import Outcome, victim_chunk_order
from kai_opt.state import R_GPU, PodStatus

if TYPE_CHECKING:
    from kai_opt.heuristics.actions.context import ActionContext


def consolidate(ctx: ActionContext, g: int, tasks: list[int], candidates: np.ndarray, reason: str, *,
                max_victim_jobs: int = -1) -> Outcome:
    """Move victims (every one re-placed) so that group g's `tasks` fit, as KAI's consolidation does. The
    session is unchanged unless it succeeds; then g's placed pods are pipelined."""
    return _Solver(ctx, g, tasks, candidates, reason, max_victim_jobs).solve()


@dataclass
class _Step:
    """One pod placed by a simulation: where, and whether it is a victim (moved) that is back on its own node."""

    pod: int
    node: int
    devices: tuple[int, ...]  # global device indexes
    victim: bool
    home: bool = False


@dataclass
class _Run:
    """What one simulation did, in order."""

    steps: list[_Step] = field(default_factory=list)
    placed: list[int] = field(default_factory=list)  # the pending job's pods


class _Solver:
    def __init__(self, ctx: ActionContext, g: int, tasks: list[int], candidates: np.ndarray, reason: str,
                 max_victim_jobs: int) -> None:
        self.ctx, self.sess = ctx, ctx.sess
        self.g, self.tasks, self.reason = g, tasks, reason
        self.candidates = np.asarray(candidates, dtype=np.int64)
        self.max_victim_jobs = max_victim_jobs
        self.why = "no eligible victims"
        sess, st = self.sess, self.sess.state
        # KAI's feasible nodes of the job: every node if a pod of it needs no GPU, else those with GPUs idle or
        # being released
        pods = st.group_pods(g)
        needs_gpu = (st.pod_gpu_whole[pods] > 0) | (st.pod_gpu_frac[pods] > 0) | (st.pod_gpu_mem[pods] > 0)
        self.feasible = np.ones(st.n_nodes, dtype=bool) if not needs_gpu.all() \
            else (sess.alloc[:, R_GPU] - sess.held[:, R_GPU]) > 0
        # where the pending job's pods may go at all (their scheduling signatures): other nodes' victims cannot help
        sigs = {int(st.pod_sig[p]) for p in tasks}
        self.usable = np.zeros(st.n_nodes, dtype=bool)
        for s in sigs:
            self.usable |= ctx.placer.static_mask(s)
        self.pending = _pending_by_queue(sess)  # (evictions leave them pending: made from the search's start)

    def solve(self) -> Outcome:
        sess = self.sess
        cp0 = sess.checkpoint()
        recorded: list[list[int]] = []
        for i in range(1, len(self.tasks) + 1):
            moved = self._solve_partial(self.tasks[:i], recorded)
            if moved is None:
                sess.rollback(cp0)
                sess.commit(cp0)
                return Outcome(False, [], self.why)
            recorded = moved
            if i < len(self.tasks):
                sess.rollback(cp0)  # KAI discards a partial solution and keeps only its victims
        sess.commit(cp0)
        placed = [p for p in self.tasks if p in sess.placements]
        return Outcome(True, [], None, Attempt(True, [], placed, any_pipelined=True))

    # -- scenarios -------------------------------------------------------------------------------------------
    def _solve_partial(self, partial: list[int], recorded: list[list[int]]) -> list[list[int]] | None:
        """Solve the pending job's tasks `partial` with the recorded victims: the chunks the solution moved (the
        session is left in it), or None (session unchanged)."""
        sess, cfg = self.sess, self.sess.cfg
        idle = _IdleGpus(sess, partial)
        for c in recorded:
            idle.add(c)
        feasible = self.feasible.copy()
        feasible[[int(sess.node[p]) for c in recorded for p in c]] = True
        tried: set[frozenset[int]] = set()
        sims = 0
        if recorded and idle.ok():
            sims += 1
            tried.add(frozenset(p for c in recorded for p in c))
            moved = self._simulate(partial, recorded, feasible)
            if moved is not None:
                return moved
        rec = {p for c in recorded for p in c}
        chunks_of: dict[int, list[list[int]]] = {}  # potential victim job -> its accumulated chunks
        on_node: dict[int, list[int]] = {}  # node -> the potential victim jobs with a chunk pod on it
        taken = 0
        for v, chunk in victim_chunk_order(sess, self.candidates):
            if any(p in rec for p in chunk):
                continue
            if v not in chunks_of and 0 <= self.max_victim_jobs <= len(chunks_of):
                continue
            if 0 <= cfg.max_victim_chunks <= taken:
                self.why = f"gave up after {taken} victim chunks (max_victim_chunks)"
                return None
            taken += 1
            chunks_of.setdefault(v, []).append(chunk)
            for p in chunk:
                jobs = on_node.setdefault(int(sess.node[p]), [])
                if v not in jobs:
                    jobs.append(v)
            idle.add(chunk)
            if not idle.ok():
                continue
            for n in self._nodes_of(v):
                victims = recorded + [c for j in on_node.get(n, []) for c in chunks_of[j]]
                key = frozenset(p for c in victims for p in c)
                if key in tried:
                    continue  # the same scenario again: the same outcome
                if sims >= cfg.max_victim_scenarios:
                    self.why = f"gave up after {sims} victim scenarios (max_victim_scenarios)"
                    return None
                sims += 1
                tried.add(key)
                where = feasible.copy()
                where[[int(sess.node[p]) for p in key]] = True
                moved = self._simulate(partial, victims, where)
                if moved is not None:
                    return moved
        self.why = "no victims whose moves make room" if taken else "no eligible victims"
        return None

    def _nodes_of(self, v: int) -> list[int]:
        """The nodes of victim job v's pods (KAI tries a by-node scenario per node of the latest victim job), those
        the pending job may use."""
        sess = self.sess
        nodes = sess.node[sess.state.group_pods(v)]
        nodes = np.unique(nodes[nodes >= 0])
        return nodes[self.usable[nodes]].tolist()

    # -- one simulation --------------------------------------------------------------------------------------
    def _simulate(self, partial: list[int], victims: list[list[int]], where: np.ndarray) -> list[list[int]] | None:
        """Evict `victims`, then allocate their jobs and the pending job's `partial` tasks in allocation order
        on the `where` nodes. Every victim re-placed: the session is left so (victims back home un-evicted, the
        pending job's pods pipelined) and the chunks moved elsewhere are returned; else None, session unchanged."""
        sess = self.sess
        cp = sess.checkpoint()
        pods = [p for c in victims for p in c]
        sess.evict_many(pods, self.reason, self.g)
        cp_sim = sess.checkpoint()
        if not self._room_for(partial):
            sess.rollback(cp)
            sess.commit(cp)
            return None
        with self.ctx.placer.releasing_free():  # KAI's node order: resources being released count as free
            run = self._run(partial, pods, where)
            done = run is not None and (not any(s.home for s in run.steps) or self._replay(run, cp_sim))
        if run is None or not done:
            sess.rollback(cp)
            sess.commit(cp)
            return None
        sess.convert_to_pipelined(run.placed)
        sess.commit(cp_sim)
        sess.commit(cp)
        return [c for c in victims if any(p in sess.moves for p in c)]

    def _room_for(self, partial: list[int]) -> bool:
        """A necessary condition of the simulation (checked first, it is cheap): the pending job's whole-GPU pods
        fit by count on the devices of its nodes free once releases finish (what the simulation places before
        it only takes room)."""
        st = self.sess.state
        sizes = [int(st.pod_gpu_whole[p]) for p in partial if st.pod_gpu_whole[p] > 0]
        if not sizes:
            return True
        free = self.sess.whole_future[self.usable]
        return all(int((free // s).sum()) >= sum(1 for w in sizes if w >= s) for s in set(sizes))

    def _run(self, partial: list[int], evicted: list[int], where: np.ndarray) -> _Run | None:
        """The allocation-order pops of one simulation (victims evicted already); None when the pending job or a
        victim finds no room."""
        sess, st, g = self.sess, self.sess.state, self.g
        gone = set(evicted)
        jobs = list(dict.fromkeys(int(st.pod_pg[p]) for p in evicted))
        tasks: dict[int, list[int]] = {}
        requests: dict[int, np.ndarray] = {g: sess.queue_request(partial).sum(axis=0)}
        for v in jobs:
            tasks[v] = tasks_to_allocate(sess, v, also={p for p in st.group_pods(v).tolist() if p in gone})
            requests[v] = sess.queue_request(tasks[v]).sum(axis=0) if tasks[v] else np.zeros(3)
        pending = self.pending
        taking = set(jobs) | {g}
        queues = {a for j in taking for a in sess.ledger.ancestors[int(st.pg_queue[j])]}
        others = [x for q in sorted(queues) for x in pending.get(q, ()) if x not in taking]
        jq = _SimQueue(sess, [*jobs, g, *others], requests, g)
        left = set(taking)
        run = _Run()
        while left:
            x = jq.pop()
            if x is None:
                return None
            if x not in left:
                continue  # a pending job that is neither victim nor the pending job
            left.discard(x)
            if x == g:
                a = self.ctx.gang.place(g, partial, allow_pipeline=True)
                if not a.ok:
                    return None
                run.placed = a.placed
                run.steps += [_Step(p, *self._where(p), victim=False) for p in a.placed]
            elif not self._reallocate(x, tasks[x], gone, where, run):
                return None
        if any(p not in sess.moves for p in evicted):
            return None  # a victim left evicted (KAI's consolidation validator)
        return run

    def _reallocate(self, v: int, tasks: list[int], gone: set[int], where: np.ndarray, run: _Run) -> bool:
        """Allocate victim job v's `tasks` again (KAI's AllocateJob, pipeline only): moved, all or nothing; each
        one back on its own node is marked home (un-evicted by _replay)."""
        sess, st = self.sess, self.sess.state
        if not tasks or any(p not in gone for p in tasks):
            return False  # nothing of it to place, or its pending pods come first: its evicted pods stay evicted
        if capacity_violation(sess.fs, sess.ledger, int(st.pg_queue[v]), sess.queue_request(tasks).sum(axis=0),
                              preemptible=bool(st.pg_preemptible[v])) is not None:
            return False
        if not self.ctx.gang.move_unit(tasks, home=True, within=where):
            return False
        for p in tasks:
            n, devices = self._where(p)
            own = sess.eviction_ops[p]
            shares = bool(st.pod_gpu_frac[p] or st.pod_gpu_mem[p])
            home = n == own.node and (not shares or set(devices) == set(own.devices))
            run.steps.append(_Step(p, n, devices, victim=True, home=home))
        return True

    def _where(self, p: int) -> tuple[int, tuple[int, ...]]:
        sess = self.sess
        pl = sess.moves.get(p) or sess.placements[p]
        base = int(sess.dev_start[pl.node])
        return pl.node, tuple(base + d for d in pl.devices)

    def _replay(self, run: _Run, cp_sim: int) -> bool:
        """Redo a successful simulation with its victims back home un-evicted first (keeping their own devices),
        then every other placement on the node the simulation chose, on the same devices where they are free,
        else on others of that node."""
        sess, st = self.sess, self.sess.state
        sess.rollback(cp_sim)
        sess.unevict_many([s.pod for s in run.steps if s.home])
        for s in run.steps:
            if s.home:
                continue
            devices = s.devices
            per = sess.gpu_per_device(s.pod, s.node) if devices else 0
            if any(DEV - int(sess.dev_held[d]) < per for d in devices):
                only = np.zeros(st.n_nodes, dtype=bool)
                only[s.node] = True
                choice = self.ctx.placer.choose(s.pod, only, allow_pipeline=True)
                if choice is None:
                    return False
                devices = choice.devices
            sess.place(s.pod, s.node, devices, pipelined=True, moved=s.victim)
        return True


class _SimQueue(JobQueue):
    """The simulation's allocation queue: victim jobs request what they are to allocate again, and the pending
    job its partial tasks, as a job below its minimum (KAI pops a representative holding only those tasks)."""

    def __init__(self, sess: Session, jobs: list[int], requests: dict[int, np.ndarray], g: int) -> None:
        self.fixed, self.partial = requests, g
        super().__init__(sess, jobs)

    def request(self, g: int) -> np.ndarray:
        r = self.fixed.get(g)
        return r if r is not None else super().request(g)

    def job_key(self, g: int) -> tuple[Any, ...]:
        k = super().job_key(g)
        return (k[0], 0, *k[2:]) if g == self.partial else k


def _pending_by_queue(sess: Session) -> dict[int, list[int]]:
    """Queue -> its pending jobs (KAI's GetAllPendingJobs), once per session state."""
    def make() -> dict[int, list[int]]:
        st = sess.state
        pods = np.flatnonzero((sess.status == PodStatus.PENDING) & (st.pod_pg >= 0))
        out: dict[int, list[int]] = {}
        for x in np.unique(st.pod_pg[pods]).tolist():
            if st.pg_problem[x] is None:
                out.setdefault(int(st.pg_queue[x]), []).append(int(x))
        return out
    return sess.memo("consolidation_pending", make)


class _IdleGpus:
    """KAI's accumulated idle-GPUs scenario filter: the pending tasks' GPUs, largest first, must each fit on one
    of the len(tasks) nodes with the most GPUs idle or releasing once the accumulated victims are gone (greedy).
    Victims only add GPUs, so the top nodes are kept up to date per victim."""

    def __init__(self, sess: Session, tasks: list[int]) -> None:
        st = sess.state
        self.sess = sess
        self.need = sorted((int(st.pod_req[p, R_GPU]) for p in tasks), reverse=True)
        self.k = len(tasks)
        cap = sess.alloc[:, R_GPU] - sess.held[:, R_GPU]
        self.cap: dict[int, int] = {}
        k = min(self.k, len(cap))
        top = np.argpartition(-cap, k - 1)[:k] if k else np.zeros(0, dtype=np.int64)
        self.base = cap
        self.top = sorted(top.tolist(), key=lambda n: (-int(cap[n]), n))

    def _cap(self, n: int) -> int:
        c = self.cap.get(n)
        return int(self.base[n]) if c is None else c

    def add(self, chunk: list[int]) -> None:
        sess = self.sess
        for p in chunk:
            n = int(sess.node[p])
            self.cap[n] = self._cap(n) + int(sess.pod_node_amount(p, n)[R_GPU])
            if n not in self.top:
                if len(self.top) >= self.k and self._cap(self.top[-1]) >= self.cap[n]:
                    continue
                self.top.append(n)
            self.top.sort(key=lambda m: -self._cap(m))
            del self.top[self.k:]

    def ok(self) -> bool:
        used: dict[int, int] = {}
        for need in self.need:
            if need == 0:
                return True
            for n in self.top:
                c = self._cap(n)
                if c < need:
                    return False  # the top nodes come largest first
                if c - used.get(n, 0) >= need:
                    used[n] = used.get(n, 0) + need
                    break
            else:
                return False
        return True
