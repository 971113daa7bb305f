"""The in-cluster scheduler loop (`kai-opt run`): watch cache -> (pod grouper) -> snapshot -> state -> plan ->
evictor + binder -> status, every `schedule_period_s`, on the leader replica only.

A cycle never stops because of one bad object (the snapshot is lenient; bad objects get Events) and never crashes
the loop: an unexpected error is logged and the next cycle starts afresh from the cache. An optional stage that
fails (the CP-SAT worker, decoder or second hint: SolverInfo.failures) costs nothing but itself: the verified greedy
plan is applied and the failures counted (kai_opt_solver_failures_total{stage,kind}); only a greedy plan that fails
the checker stops a cycle, which then applies nothing and is reported as failed. Binds, evictions and
status writes are asynchronous; the cache's assumptions make the next cycle see them at once. The cycle's status
(PodGroup and Queue status, stale-gang and last-start annotations, Events, queue metrics) is worked out after the
cycle on a worker of its own from the cycle's snapshot, state and plan (immutable), the latest cycle's winning when
it falls behind: the next cycle does not wait for it.

A cycle runs with Python's cyclic garbage collector paused (kai_opt.gcpause): its collections would otherwise walk
the whole watch cache and parsed models again and again while the engine allocates (measured: docs/DESIGN-NOTES.md);
what the cycle leaves behind is collected after it as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from kai_opt.actions import ACTION_BY_NAME
from kai_opt.api.dra import API_VERSION as DRA_API_VERSION
from kai_opt.config import BinderKind, Config
from kai_opt.engine import run_cycle
from kai_opt.fairshare import FairShare
from kai_opt.gcpause import gc_paused
from kai_opt.heuristics.positions import queue_positions
from kai_opt.k8s import grouper, kaibind
from kai_opt.k8s.binder import Binder, BindRequest, BindResult
from kai_opt.k8s.cache import SCHEDULING_KINDS, ClusterCache, Resource, watch_kinds_of
from kai_opt.k8s.client import ClusterError
from kai_opt.k8s.coexist import KaiDetector, kubelet_rejection, pod_is_ours, writes_queue_status
from kai_opt.k8s.dra import ClaimDevices, ClaimWrite
from kai_opt.k8s.dra import release as release_claims
from kai_opt.k8s.events import NORMAL, WARNING, EventRecorder, pod_ref
from kai_opt.k8s.evictor import Evictor, EvictRequest, EvictResult
from kai_opt.k8s.leader import LeaderElector, lease_name
from kai_opt.k8s.live_grouping import LiveGrouping, PodGroupSync
from kai_opt.k8s.metrics import OPEN_SESSION_PHASES
from kai_opt.k8s.metrics import SchedulerMetrics as SchedulerMetrics  # re-exported: kai_opt/cli/run.py takes it here
from kai_opt.k8s.queue_metrics import QueueMetrics
from kai_opt.k8s.recheck import PreBindCheck
from kai_opt.k8s.scaleadjust import ScaleAdjuster
from kai_opt.k8s.shard import grouping_in_shard, resolve_shard_config, shard_config, shard_filter
from kai_opt.k8s.status import DEFAULT_NODE_POOL, StatusWriter
from kai_opt.k8s.usage_store import UsageSource
from kai_opt.k8s.workqueue import TokenBucket, WorkPool
from kai_opt.plan import Plan
from kai_opt.snapshot import Snapshot
from kai_opt.state import ClusterState, PodStatus, build_state

log = logging.getLogger("kai_opt.run")

REQUIRED_KINDS = ("nodes.v1", "pods.v1")


# A status write waits at most this long while binds or evictions are queued or in flight (they go first).
STATUS_DEFER_MAX_S = 5.0
# With nothing to place, a cycle (status refresh, stale-gang timing) runs this often (see Runner._idle).
IDLE_CYCLE_S = 5.0


class NullMetrics:
    """Metrics sink when the Runner is given none (tests, embedding)."""

    ready = False

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@dataclass
class CycleReport:
    """What one cycle did (also the log line)."""

    number: int
    pods: int = 0
    pending_pods: int = 0
    nodes: int = 0
    binds: int = 0
    pipelined: int = 0
    evictions: int = 0
    pending_groups: int = 0
    rejected: int = 0
    solver: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (stage, kind): optional stages that failed
    error: str | None = None

    def line(self) -> str:
        if self.error:
            return f"cycle {self.number}: failed: {self.error}"
        ms = " ".join(f"{k} {v * 1000:.0f}ms" for k, v in self.phases.items())
        extra = f", {self.rejected} rejected objects" if self.rejected else ""
        return (f"cycle {self.number}: {self.pods} pods ({self.pending_pods} pending) on {self.nodes} nodes{extra}"
                f" | bind {self.binds}, pipeline {self.pipelined}, evict {self.evictions}, pending groups "
                f"{self.pending_groups} | {ms} | {self.solver}"
                + "".join(f", {stage} {kind}" for stage, kind in self.failures))


class Runner:
    """One scheduler process. `run()` blocks until `stop()` (or leadership is lost, or `once`)."""

    def __init__(self, api: client.ApiClient, config: Config, *, identity: str, leader_elect: bool = True,
                 lease_namespace: str = "default", metrics: Any = None, once: bool = False) -> None:
        config = shard_config(resolve_shard_config(api, config))  # a scheduling shard: its SchedulingShard, names
        self.shard = shard_filter(config)  # None: the whole cluster
        rt = config.runtime
        self.api = api
        self.config = config
        self.identity = identity
        self.once = once
        self.metrics = metrics if metrics is not None else NullMetrics()
        self.queue_metrics = QueueMetrics(self.metrics)
        self._stop = threading.Event()
        self.lost_leadership = False
        self.cycles = 0
        self.skipped = 0  # cycles skipped as idle
        kinds = [*SCHEDULING_KINDS, *watch_kinds_of(grouper.OWNER_KINDS)]
        kai_binds = rt.binder == BinderKind.kai
        if kai_binds:  # binder: kai: our BindRequests, followed to their outcome
            kinds.append(Resource(kaibind.API_VERSION, kaibind.KIND, kaibind.PLURAL, True))
        self.cache = ClusterCache(api, kinds=kinds, watch_timeout_s=rt.watch_timeout_s,
                                  backoff_max_s=rt.backoff_max_s, absent_recheck_s=rt.absent_kind_recheck_s,
                                  assume_ttl_s=rt.assume_ttl_s,
                                  reservation_app=rt.gpu_sharing.reservation_app_label)
        le = rt.leader_election
        self.elector = LeaderElector(api, namespace=lease_namespace, name=lease_name(le.lease_name, config.shard.name),
                                     identity=identity,
                                     lease_duration_s=le.lease_duration_s, renew_deadline_s=le.renew_deadline_s,
                                     retry_period_s=le.retry_period_s) if leader_elect else None
        fence = self.elector.is_leader if self.elector is not None else (lambda: True)
        self.limiter = TokenBucket(rt.client_qps, rt.client_burst)
        self.status_pool = WorkPool("status", rt.status_workers)
        self.recorder = EventRecorder(api, self.status_pool, qps=rt.event_qps, burst=rt.event_burst,
                                      repeat_s=rt.event_repeat_s, instance=identity, client_limiter=self.limiter,
                                      fence=fence)
        common = {"workers": rt.bind_workers, "retries": rt.retries, "backoff_s": rt.retry_backoff_s,
                  "timeout_s": rt.request_timeout_s, "fence": fence}
        self.prebind = PreBindCheck(self.cache) if rt.prebind_recheck else None
        self.claim_devices = ClaimDevices()  # DRA devices chosen for binds in flight
        self.binder = Binder(api, self.cache, self.limiter, on_result=self._bound,
                             recheck=self._recheck if self.prebind is not None else None,
                             sharing=None if kai_binds else rt.gpu_sharing, kai=rt.kai_binder if kai_binds else None,
                             **common)
        self.bindrequest_pool = WorkPool("bindrequests", 1)  # follows our BindRequests (binder: kai)
        if self.binder.kai is not None:
            self.binder.kai.shard = self.shard  # its BindRequests carry the partition label, as KAI's
        self.sharing_pool = WorkPool("gpu-sharing", 1)  # deletes reservation pods nobody shares any more
        self.evictor = Evictor(api, self.cache, self.limiter, on_result=self._evicted,
                               blocked_retry_s=rt.blocked_eviction_retry_s, **common)
        self.status = StatusWriter(api, self.cache, self.status_pool, self.limiter, self.recorder, fence=fence,
                                   busy=lambda: self.binder.pending() > 0 or self.evictor.pending() > 0,
                                   defer_max_s=STATUS_DEFER_MAX_S, write_queues=self._writes_queues,
                                   counts=rt.podgroup_counts)
        self.kai = KaiDetector(api, rt.absent_kind_recheck_s)
        self.grouping = LiveGrouping(config.default_queue)  # the grouper's result, redone for what changed
        self.podgroup_sync = PodGroupSync()  # the PodGroups made to match it, compared where something changed
        self.status_compute = WorkPool("status-compute", 1)  # one cycle's status at a time, the latest wins
        usage = UsageSource(api, config)  # time-based fair share (usage_db); None when off
        self.usage: UsageSource | None = usage if usage.enabled else None
        self.scale = ScaleAdjuster(api, self.cache, self.limiter, config.autoscaler, fence=fence) \
            if config.autoscaler.enabled else None  # placeholder pods for autoscalers (kai_opt/k8s/scaleadjust.py)

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """0 after `stop()` or `once`; 1 when leadership was lost (the process should exit and restart)."""
        self.cache.start()
        try:
            self._wait_synced()
            # ready = able to schedule: the cache is synced. A standby is ready too (it takes over at once when the
            # Lease frees up, and `kubectl rollout status` waits for every replica); leadership is kai_opt_leader.
            self.metrics.ready = not self._stop.is_set()
            if self.elector is not None:
                if not self.elector.acquire(self._stop):
                    return 0
                self.metrics.leader(True)
                self.elector.run_in_background(self._stop, self._lost)
            if self.usage is not None:
                self.usage.start()
            self._loop()
        finally:
            self._shutdown()
        return 1 if self.lost_leadership else 0

    def _wait_synced(self) -> None:
        timeout = self.config.runtime.sync_timeout_s
        if not self.cache.wait_synced(timeout):
            if self._stop.is_set():
                return
            waiting = [k for k, s in self.cache.status().items() if not s["synced"]]
            raise ClusterError(f"the watch cache did not sync within {timeout:g}s (still listing: "
                               f"{', '.join(waiting)})")
        missing = [k for k in self.cache.absent_kinds() if k.split(" ")[0] in REQUIRED_KINDS]
        if missing:
            raise ClusterError(f"cannot read {', '.join(missing)}: kai-opt needs list/watch on nodes and pods")
        log.info("cache synced: %s", ", ".join(f"{k} {s['objects']}" for k, s in self.cache.status().items()
                                               if not s["absent"]))
        if self.binder.kai is not None and f"{kaibind.PLURAL}.{kaibind.API_VERSION}" in " ".join(
                self.cache.absent_kinds()):
            log.warning("binder: kai, but BindRequests (%s) are not served: is KAI-Scheduler installed? Binds fail "
                        "until they are", kaibind.API_VERSION)
        if self.cache.absent_kinds():
            log.info("not served (skipped, looked for again later): %s", ", ".join(self.cache.absent_kinds()))

    def _lost(self) -> None:
        self.lost_leadership = True
        self.metrics.leader(False)
        self._stop.set()

    def _loop(self) -> None:
        period = self.config.schedule_period_s
        last: CycleReport | None = None
        last_start = 0.0
        while not self._stop.is_set():
            start = time.monotonic()
            self._kubelet_rejections()
            if self.binder.kai is not None:  # every turn, idle or not: binds in KAI's hands end meanwhile
                self.bindrequest_pool.submit("sync", self.binder.kai.sync, replace=True)
            if self._idle(last, start - last_start):
                self.skipped += 1
            else:
                last, last_start = self.cycle(), start
                (log.error if last.error else log.info)(last.line())
                if self.once:
                    self.drain(timeout=max(30.0, 3 * self.config.runtime.request_timeout_s))
                    return
            self._stop.wait(max(0.0, period - (time.monotonic() - start)))

    def _idle(self, last: CycleReport | None, since_last: float) -> bool:
        """Skip this cycle: the last one had nothing to do (no pending pod, no action), no eviction is under way,
        no pod of ours waits for a placement, and it ran less than IDLE_CYCLE_S ago. A cycle with nothing to place
        only refreshes status (and times stale gangs), so it runs every IDLE_CYCLE_S; skipping the others leaves
        the CPU to binds in flight (a 10,000-pod snapshot costs a second of it)."""
        if last is None or last.error or since_last >= max(IDLE_CYCLE_S, self.config.schedule_period_s):
            return False
        if last.pending_pods or last.binds or last.pipelined or last.evictions or self.evictor.pending():
            return False
        return not self.cache.has_unscheduled(tuple(self.config.scheduler_names), self.shard)

    def drain(self, timeout: float) -> bool:
        """Wait until queued binds, evictions and status writes are done."""
        deadline = time.monotonic() + timeout
        ok = True
        for pool in (self.evictor, self.binder, self.status_compute, self.status_pool):
            ok = pool.wait_idle(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def _shutdown(self) -> None:
        self.metrics.ready = False
        if self.usage is not None:  # a lost leader does not write the ledger: the new leader owns it
            self.usage.stop(flush=not self.lost_leadership)
        self.binder.stop()
        self.evictor.stop()
        self.sharing_pool.stop()
        self.bindrequest_pool.stop()
        if self.scale is not None:
            self.scale.stop()
        self.binder.wait_idle(2.0)
        self.evictor.wait_idle(2.0)
        for pool in (self.status_compute, self.status_pool):  # status can wait for the next leader
            dropped = pool.drain(2.0)
            if dropped:
                log.warning("shutdown: %d queued %s jobs dropped (not done within 2s)", dropped, pool.name)
        if self.elector is not None and not self.lost_leadership:
            self.elector.release()
            self.metrics.leader(False)
        self.cache.stop()

    # -- one cycle -----------------------------------------------------------------------------------------------
    def cycle(self) -> CycleReport:
        with gc_paused():
            return self._cycle()

    def _cycle(self) -> CycleReport:
        self.cycles += 1
        report = CycleReport(self.cycles)
        phases = report.phases
        t0 = time.perf_counter()
        try:
            names = tuple(self.config.scheduler_names)
            groups, hold = self._group(names)
            tg = time.perf_counter()
            phases["group"] = tg - t0
            if self.cache.list("ResourceClaim", DRA_API_VERSION):
                release_claims(self.api, self.cache)  # claims of pods that are gone free their devices
            snap = self.cache.snapshot(scheduler_names=names, pod_groups=groups, hold=hold, shard=self.shard)
            state = build_state(snap, now=snap.now, default_queue=self.config.default_queue)
            t1 = time.perf_counter()
            phases["snapshot"] = t1 - tg
            history = self.usage.for_cycle(state) if self.usage is not None else None
            plan, fs = run_cycle(state, self.config, history=history)
            t2 = time.perf_counter()
            phases["fair_share"] = plan.phases.get("fair_share", 0.0)
            phases["solve"] = max(0.0, t2 - t1 - phases["fair_share"])
            self._apply(state, plan)
            if self.scale is not None:  # after the plan is applied; adds WaitingForScaleUp reasons to the plan
                self.scale.cycle(state, plan, fs, self.config)
            if self.binder.sharing is not None:
                self.sharing_pool.submit("sync", self.binder.sharing.sync, replace=True)
            self.status_compute.submit("status", lambda: self._write_status(snap, state, plan, fs), replace=True)
            t3 = time.perf_counter()
            phases["apply"] = t3 - t2
            phases["total"] = t3 - t0
            report.pods = int((state.pod_ours).sum())
            report.pending_pods = int(((state.pod_status == PodStatus.PENDING) & state.pod_ours).sum())
            report.nodes = state.n_nodes
            report.binds, report.pipelined = len(plan.binds), len(plan.pipelines)
            report.evictions, report.pending_groups = len(plan.evictions), len(plan.pending)
            report.rejected = len(snap.rejected)
            report.solver = plan.solver.status + (f" gap {plan.solver.gap:.3g}" if plan.solver.gap else "")
            report.failures = list(plan.solver.failures)
            for name, seconds in phases.items():
                self.metrics.cycle_phase(name, seconds)
            self.metrics.open_session(sum(phases.get(p, 0.0) for p in OPEN_SESSION_PHASES))
            for name, seconds in plan.phases.items():  # the greedy cycle times each action
                if name in ACTION_BY_NAME:
                    self.metrics.action(name, seconds)
            self.metrics.solver(plan.solver.status, plan.solver.gap)
            for stage, kind in plan.solver.failures:  # optional stages that failed; the plan was applied anyway
                self.metrics.solver_failure(stage, kind)
        except Exception as exc:  # the loop goes on; the next cycle starts from the cache again
            log.exception("cycle %d failed", self.cycles)
            report.error = " ".join(str(exc).split())[:300] or type(exc).__name__
        return report

    def _group(self, names: tuple[str, ...]) -> tuple[dict[str, str], set[str]]:
        """Run the pod grouper: create/patch PodGroups, annotate pods. Returns the groups of
        pods not annotated yet (the snapshot assumes them) and the unbound pods to hold back this cycle (owner
        not known yet, or no valid group: scheduling them alone could split a gang)."""
        grouping = self.grouping.update(self.cache, names)
        # (the cluster's PodGroups are read only to split them by shard)
        existing = self.cache.list("PodGroup", "scheduling.run.ai/v2alpha2") if self.shard is not None else []
        desired, assigned = grouping_in_shard(self.shard, grouping.podgroups, grouping.assignments, existing)
        self.podgroup_sync.sync(self.api, desired, self.cache)
        # a pod whose group is not written on it yet is assumed in it; an unbound pod without a group is held back
        unannotated = [k for k, g in assigned.items() if grouping.annotated.get(k) != g]
        hold = {key for key, annotated in grouping.unbound if key not in assigned and not annotated}
        if unannotated:  # (skipped when idle: its typed client is slow)
            pods = [p for p in (self.cache.pod(*k.split("/", 1)) for k in unannotated) if p is not None]
            grouper.annotate_pods(self.api, pods, assigned)
        return dict(assigned), hold

    def _apply(self, state: ClusterState, plan: Plan) -> None:
        def group_of(p: int) -> str | None:
            g = int(state.pod_pg[p])
            return state.pg_keys[g] if g >= 0 else None

        evictions = []
        for e in plan.evictions:
            pod = state.pods[e.pod]
            node = int(state.pod_node[e.pod])
            evictions.append(EvictRequest(
                pod.namespace, pod.name, pod.meta.uid or "", e.reason,
                node=state.node_names[node] if node >= 0 else None, podgroup=group_of(e.pod),
                beneficiary=state.pg_keys[e.beneficiary] if e.beneficiary >= 0 else None))
        self.evictor.submit(evictions)
        binds = []
        now = time.time()
        if state.dra is not None:
            self.claim_devices.seen(state.dra)  # every cycle: writes the watch shows stop counting as in flight
        for p in plan.binds:
            pod = state.pods[p.pod]
            if not pod.meta.uid:
                continue
            if pod.meta.creation_timestamp is not None:  # KAI: from the pod's creation to the bind attempt
                self.metrics.task_scheduling_latency(now - pod.meta.creation_timestamp)
            claims: tuple[ClaimWrite, ...] = ()
            if state.dra is not None and pod.key in state.dra.pod_claims:
                chosen = self.claim_devices.for_bind(state.dra, pod.key, state.node_names[p.node])
                if chosen is None:  # its devices are taken by a write in flight: placed again next cycle
                    log.info("bind %s: no free devices for its claims on %s yet", pod.key, state.node_names[p.node])
                    continue
                claims = chosen
            binds.append(BindRequest(pod.namespace, pod.name, pod.meta.uid, state.node_names[p.node],
                                     tuple(p.devices), podgroup=group_of(p.pod), claims=claims))
        self.binder.submit(binds)
        if self.config.runtime.nominate_pipelined:
            self.binder.nominate((state.pods[p.pod].namespace, state.pods[p.pod].name, state.node_names[p.node])
                                 for p in plan.pipelines)

    def _write_status(self, snap: Snapshot, state: ClusterState, plan: Plan, fs: FairShare) -> None:
        """The cycle's status writes, events and queue metrics (on the status-compute worker)."""
        positions = queue_positions(state, fs, self.config, among=set(plan.pending)) \
            if self.config.runtime.queue_position else None
        counts = self.status.update(snap, state, plan, fs, positions)
        self._queue_metrics(state, fs)
        log.debug("status writes: %s", counts)

    def _queue_metrics(self, state: ClusterState, fs: FairShare) -> None:
        self.queue_metrics.publish(state, fs)

    def _writes_queues(self) -> bool:
        return writes_queue_status(self.config.runtime.queue_status.value, self.kai)

    def _kubelet_rejections(self) -> None:
        """Count our pods the kubelet rejected at admission since the last look, with an Event on each."""
        names = tuple(self.config.scheduler_names)
        for pod in self.cache.take_kubelet_rejections():
            reason = kubelet_rejection(pod)
            if reason is None or not pod_is_ours(pod, names):
                continue
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            self.metrics.kubelet_rejected(reason)
            detail = " ".join(str(status.get("message") or "").split())[:300]
            log.warning("pod %s/%s: rejected by the kubelet of %s (%s)%s", meta.get("namespace"), meta.get("name"),
                        node, reason, f": {detail}" if detail else "")
            self.recorder.emit(pod_ref(meta.get("namespace") or "default", meta.get("name") or "",
                                       meta.get("uid") or ""), WARNING, "RejectedByKubelet",
                               f"the kubelet of {node} rejected the pod kai-opt bound there ({reason})"
                               + (f": {detail}" if detail else ""))

    # -- results of binds and evictions (worker threads) -------------------------------------------------------------
    def _recheck(self, req: BindRequest) -> str | None:
        """The pre-bind re-check (kai_opt.k8s.recheck): None when the pod still fits; a drop is counted."""
        assert self.prebind is not None
        try:
            misfit = self.prebind.check(req.namespace, req.name, req.uid, req.node, req.devices)
        except Exception:  # the re-check never stops a bind the plan verified
            log.exception("pre-bind re-check of %s failed; binding as planned", req.key)
            return None
        if misfit is None:
            return None
        self.metrics.bind_dropped(misfit.resource)
        return f"the pod no longer fits {req.node} ({misfit.message})"

    def _bound(self, result: BindResult) -> None:
        req = result.request
        if not result.ok and req.claims:
            self.claim_devices.forget(req.claims, req.key)
        if result.reason == "no-fit":
            self.recorder.emit(pod_ref(req.namespace, req.name, req.uid), WARNING, "FailedBinding",
                               f"binding to {req.node} dropped: {result.message}; it is placed again next cycle")
        elif result.ok:
            self.metrics.bound(1)
            self.metrics.bind_latency(result.latency_s)
            self.recorder.emit(pod_ref(req.namespace, req.name, req.uid), NORMAL, "Scheduled",
                               f"Successfully assigned {req.namespace}/{req.name} to {req.node}")
        elif result.reason != "dropped":
            self.metrics.bind_latency(result.latency_s)  # KAI times every bind attempt, failed ones too
            self.metrics.bind_failure(result.reason)
            self.recorder.emit(pod_ref(req.namespace, req.name, req.uid), WARNING, "FailedBinding",
                               f"binding to {req.node} failed ({result.reason}): {result.message}")

    def _count_eviction(self, req: EvictRequest) -> None:
        """kai_pod_group_evicted_pods_total as KAI labels it: the victim's pod group (name, namespace, uid), its
        node pool (the shard's partition label, kai.scheduler/node-pool by default, else "default") and the
        action."""
        ns, _, name = (req.podgroup or "").partition("/")
        obj = self.cache.get("scheduling.run.ai/v2alpha2", "PodGroup", ns, name) if name else None
        meta = (obj or {}).get("metadata") or {}
        pool = (meta.get("labels") or {}).get(self.config.shard.partition_label) or DEFAULT_NODE_POOL
        self.metrics.evicted(req.reason, name, ns or req.namespace, meta.get("uid") or "", pool)

    def _evicted(self, result: EvictResult) -> None:
        req = result.request
        ref = pod_ref(req.namespace, req.name, req.uid)
        if result.ok and result.reason != "gone":
            self._count_eviction(req)
            why = (f"to make room for podgroup {req.beneficiary}" if req.beneficiary
                   else "its gang stayed below minMember")
            self.recorder.emit(ref, NORMAL, "Evicted", f"Evicted by kai-opt ({req.reason}) {why}")
        elif result.blocked:
            self.recorder.emit(ref, WARNING, "EvictionBlocked", f"eviction ({req.reason}) for podgroup "
                               f"{req.beneficiary} refused: {result.message}")
