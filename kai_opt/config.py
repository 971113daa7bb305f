"""kai-opt configuration: one validated YAML file for `solve`, `simulate`, `bench`, `conformance` and `run`.

Every field has a default, so an empty file (or no file) is a valid configuration. Unknown keys are errors.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AliasChoices,
    AliasGenerator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kai_opt import __version__, cron
from kai_opt.actions import ACTIONS
from kai_opt.errors import ConfigError
from kai_opt.limits import INT32_MAX, MAX_DURATION_S
from kai_opt.textfile import check_yaml_aliases, check_yaml_depth, read_text


class Strategy(StrEnum):
    """Node (and GPU device) choice among equally good nodes: binpack (fewest free), spread (most free) or fgd
    (least growth of FGD's expected GPU fragmentation against the cycle's pod shapes, ATC '23)."""

    binpack = "binpack"
    spread = "spread"
    fgd = "fgd"


class Engine(StrEnum):
    greedy = "greedy"
    cpsat = "cpsat"


class VictimSearch(StrEnum):
    """How reclaim and preempt choose victims: KAI's search (victims in KAI's victim order until the job fits),
    scenarios over the cheapest victims (kai_opt/heuristics/cheapest_victims.py), or auto: KAI's search on clusters
    below `victim_search_auto_nodes` nodes, the cheapest victims from there on."""

    auto = "auto"
    kai = "kai"
    cheapest = "cheapest"


class BinderKind(StrEnum):
    """Who binds kai-opt's placements: kai-opt itself (pods/binding), or KAI-Scheduler's binder (kai-opt writes
    BindRequests), so a cluster running KAI keeps one binder."""

    kai_opt = "kai-opt"
    kai = "kai"


class QueueStatus(StrEnum):
    """Whether `kai-opt run` writes Queue status: always, never, or auto: only while KAI-Scheduler is not
    installed (its queue controller writes Queue status then)."""

    auto = "auto"
    always = "always"
    never = "never"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, allow_inf_nan=False)


# Which decisions a cycle may take: one flag per action of kai_opt.actions.ACTIONS, in cycle order (derived, so a
# new action gets its flag from its entry there)
class _ActionFlags(_Model):
    def on(self, name: str) -> bool:
        """The flag of action `name` (an entry of kai_opt.actions.ACTIONS)."""
        return bool(getattr(self, name))


Actions: type[_ActionFlags] = create_model(  # type: ignore[call-overload]  # (fields made from ACTIONS)
    "Actions", __base__=_ActionFlags, __doc__="Which decisions a cycle may take (KAI's actions, in the order a cycle "
    "runs them).", **{a.name: (bool, Field(True, description=a.description)) for a in ACTIONS})


class Placement(_Model):
    gpu: Strategy = Field(Strategy.binpack, description="node and device placement of GPU pods: binpack (fewest "
                          "free GPUs; KAI's default), spread (most free) or fgd (least growth of GPU fragmentation "
                          "against the cycle's pod shapes, FGD ATC '23, plus half the growth of the node's CPU/GPU "
                          "imbalance; a GPU share first goes where the share left on its device can still be "
                          "filled by the workload's common share sizes; ties go to the node whose free CPU stays in "
                          "proportion to its free GPUs; pair it with cpu: fgd, or CPU-only pods bin-packed by CPU "
                          "strand GPUs). Choose fgd for shared clusters of many GPU shapes and shares, where it "
                          "leaves fewer GPUs unallocated; keep binpack where KAI's placement must be reproduced")
    cpu: Strategy = Field(Strategy.binpack, description="node placement of CPU-only pods: binpack (fewest free "
                          "CPUs), spread (most free) or fgd (least growth of GPU fragmentation: keeps CPU where GPU "
                          "pods need it; ties go to the node with the fewest free GPUs)")


class Objective(_Model):
    """Weights of the CP-SAT objective (bounded integers), highest tier first."""

    mode: str = Field("lexicographic", description="lexicographic (solve tier by tier) or weighted (one sum)")
    placement_weight: int = Field(1_000_000, ge=1, le=10**9, description="per priority-weighted GPU placed")
    eviction_weight: int = Field(1_000, ge=0, le=10**9, description="per eviction (scaled by victim priority)")
    packing_weight: int = Field(1, ge=0, le=10**6, description="per node/device left whole (bin-packing)")
    lexicographic_tolerance: float = Field(0.0, ge=0, le=0.5, description="relative slack when fixing a tier")

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if v not in ("lexicographic", "weighted"):
            raise ValueError("must be lexicographic or weighted")
        return v


class Solver(_Model):
    time_budget_s: float = Field(1.0, gt=0, le=3600, description="wall-clock budget of one cycle's solve")
    workers: int = Field(2, ge=1, le=64, description="CP-SAT search workers")
    deterministic: bool = Field(False, description="deterministic time limit, fixed seed, one worker (tests)")
    seed: int = Field(0, ge=0, le=INT32_MAX, description="random seed of the solver")
    max_model_pods: int = Field(20_000, ge=1, le=INT32_MAX,
                                description="pending pods in one model (the pods the greedy evicted for a group count "
                                "several times); larger cycles use a window")
    keep_greedy_groups: bool = Field(True, description="every group the greedy placed stays placed (KAI's queue "
                                     "order decides who goes first); false lets the model trade some for more "
                                     "priority-weighted GPUs")
    fgd_hint: bool = Field(True, description="cpsat: also compute the greedy plan with FGD scoring (placement gpu "
                           "and cpu: fgd), in a process beside the cycle (wall time; deterministic mode: before the "
                           "model), and use it when it keeps every group the KAI-scored plan places, evicts no more "
                           "and scores higher (or as high, with less fragmented GPU share left): as the model's start "
                           "when ready in time, else as the plan if it beats the model's by the deadline. With GPU "
                           "bin-packing, a cycle of 10,000 or more pending groups x nodes whose pending pods ask for "
                           "at most half the free room computes it first, and keeps it without the KAI-scored plan "
                           "when it places every placeable pod without evictions")
    pattern_hint: bool = Field(True, description="cpsat: a small model over node classes and the patterns of "
                               "pending shapes that fit them chooses which pending whole-GPU and CPU-only groups to "
                               "place and on which class's nodes; its plan becomes the model's start when it keeps "
                               "every group the starting plan places, evicts no more and scores higher (skipped "
                               "beyond 16 pending shapes; the model then runs only if at most 40% of "
                               "solver.time_budget_s is gone)")
    objective: Objective = Objective()


class LeaderElection(_Model):
    """One active replica of `kai-opt run`: a coordination.k8s.io/v1 Lease (defaults as client-go)."""

    lease_name: str = Field("kai-opt", min_length=1, description="name of the Lease object")
    lease_namespace: str = Field("", description="namespace of the Lease ('' = the pod's own namespace when "
                                 "running in a cluster, else default)")
    lease_duration_s: float = Field(15.0, gt=0, le=3600, description="a standby takes over this long after the "
                                    "leader's last renewal")
    renew_deadline_s: float = Field(10.0, gt=0, le=3600, description="the leader stops scheduling when it could "
                                    "not renew for this long")
    retry_period_s: float = Field(2.0, gt=0, le=3600, description="seconds between acquire/renew attempts")

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElection:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("must have retry_period_s < renew_deadline_s < lease_duration_s")
        return self


_DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Kubernetes' DNS-1123 subdomain (IsDNS1123Subdomain): dot-separated DNS labels, at most 253 characters in all
_DNS_SUBDOMAIN_BODY = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS_SUBDOMAIN_RE = rf"^{_DNS_SUBDOMAIN_BODY}$"
DnsSubdomain = Annotated[str, StringConstraints(max_length=253, pattern=_DNS_SUBDOMAIN_RE)]
# the same, or '' (none); both alternatives anchored
OptionalDnsSubdomain = Annotated[str, StringConstraints(max_length=253, pattern=rf"^({_DNS_SUBDOMAIN_BODY})?$")]


class GpuSharing(_Model):
    """KAI's GPU-sharing contract at bind time (kai_opt/k8s/sharing.py): for pods with `gpu-fraction` or
    `gpu-memory`, a GPU group label, one reservation pod per shared device and the pod's shared-GPU ConfigMaps."""

    enabled: bool = Field(True, description="carry out KAI's GPU-sharing contract when binding shared-GPU pods "
                          "(false: bind them with kai-opt's device record only)")
    reservation_namespace: str = Field("kai-resource-reservation", pattern=_DNS_LABEL_RE,
                                       description="namespace of the GPU reservation pods")
    reservation_image: str = Field(f"kai-opt:{__version__}", min_length=1, pattern=r"^\S+$",
                                   description="image of the reservation pods (kai-opt's image: its "
                                   "`python -m kai_opt.reservation` reports the GPU the pod was given)")
    reservation_service_account: DnsSubdomain = Field("kai-opt-reservation", description="service account of the "
                                                      "reservation pods (may get and patch pods in "
                                                      "reservation_namespace)")
    runtime_class_name: OptionalDnsSubdomain = Field("nvidia", description="runtimeClassName of the reservation "
                                                     "pods ('' = none)")
    reservation_app_label: str = Field("kai-resource-reservation", min_length=1, max_length=63,
                                       pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                                       description="value of the reservation pods' `app` label: pods with it hold "
                                       "no GPU in the snapshot (the shared pods account for the device), as in KAI")
    reservation_timeout_s: float = Field(40.0, gt=0, le=3600, description="a reservation pod that has not "
                                         "reported its GPU this long after its creation is deleted, and the pods "
                                         "waiting for it go back to pending (a FailedBinding Event)")
    cdi_device_names: bool = Field(False, description="write the reserved GPUs into NVIDIA_VISIBLE_DEVICES as CDI "
                                   "names (k8s.device-plugin.nvidia.com/gpu=ID), for a device plugin using CDI")


class KaiBinder(_Model):
    """`binder: kai`: the BindRequests (scheduling.run.ai/v1alpha2) kai-opt hands to KAI-Scheduler's binder."""

    backoff_limit: int = Field(3, ge=0, le=100, description="the BindRequest's backoffLimit: KAI's binder tries "
                               "again while failedAttempts is below it (its first try of a shared pod can fail on "
                               "its own cache); a BindRequest is failed (the pod placed again next cycle) once its "
                               "phase is Failed with failedAttempts >= backoffLimit. KAI's binder (72de64f) counts "
                               "only the first failed attempt, so above 1 a bind that keeps failing ends at "
                               "bind_timeout_s")
    bind_timeout_s: float = Field(120.0, gt=0, le=3600, description="a BindRequest neither bound nor failed this "
                                  "long after kai-opt wrote it (KAI's binder not running, or retrying) is deleted "
                                  "and the bind failed (reason bind-request-timeout)")


class Runtime(_Model):
    """The in-cluster scheduler (`kai-opt run`): watch cache, binder, evictor, status writer."""

    client_qps: float = Field(50.0, gt=0, le=100_000, description="API writes per second (one token bucket for "
                              "binds, evictions and status)")
    client_burst: int = Field(100, ge=1, le=100_000, description="writes allowed at once above client_qps")
    bind_workers: int = Field(16, ge=1, le=256, description="binds (and evictions) in flight at once")
    status_workers: int = Field(4, ge=1, le=64, description="status and event writes in flight at once")
    retries: int = Field(3, ge=0, le=20, description="retries of a bind or eviction after a transient error")
    retry_backoff_s: float = Field(0.2, gt=0, le=60, description="first retry delay (doubles per retry)")
    request_timeout_s: float = Field(10.0, gt=0, le=600, description="timeout of one write request")
    assume_ttl_s: float = Field(30.0, gt=0, le=3600, description="a bound pod the watch has not shown bound yet "
                                "counts as bound this long")
    nominate_pipelined: bool = Field(True, description="write status.nominatedNodeName on pipelined pods "
                                     "(informational; they are placed again each cycle)")
    blocked_eviction_retry_s: float = Field(5.0, ge=0, le=3600, description="a victim whose eviction a "
                                            "PodDisruptionBudget refused is not tried again for this long")
    event_qps: float = Field(10.0, gt=0, le=10_000, description="Events per second (the rest is dropped)")
    event_burst: int = Field(100, ge=1, le=100_000, description="Events allowed at once above event_qps")
    event_repeat_s: float = Field(60.0, ge=0, le=86_400, description="the same Event on the same object is not "
                                  "sent again within this time")
    sync_timeout_s: float = Field(60.0, gt=0, le=3600, description="longest wait for the cache's first lists")
    watch_timeout_s: float = Field(60.0, ge=1, le=3600, description="server-side timeout of one watch request "
                                   "(it is then resumed)")
    backoff_max_s: float = Field(30.0, gt=0, le=3600, description="longest reconnect delay of a failing watch")
    absent_kind_recheck_s: float = Field(30.0, gt=0, le=3600, description="how often a kind whose CRD is not "
                                         "installed is looked for again")
    queue_status: QueueStatus = Field(QueueStatus.auto, description="Queue status writes: always, never, or auto "
                                      "= only while KAI-Scheduler is not installed (detected by its BindRequest "
                                      "CRD, bindrequests.scheduling.run.ai, looked for every "
                                      "absent_kind_recheck_s); KAI's queue controller owns Queue status then")
    podgroup_counts: bool = Field(False, description="write PodGroup status.phase and the pod counts (running, "
                                  "pending, succeeded, failed): kai-opt's own, KAI-Scheduler leaves them unset; one "
                                  "more PodGroup write per group start and end (off: cleared where written before)")
    queue_position: bool = Field(True, description="annotate each pending PodGroup with its queue position "
                                 "(kai-opt.io/queue-position, -in-queue); a position change is a write per group")
    prebind_recheck: bool = Field(True, description="right before each bind, check the pod still fits its node in "
                                  "the newest cache (pods other schedulers bound since the cycle's snapshot, and our "
                                  "own binds in flight); a bind that no longer fits is dropped and the pod placed "
                                  "again next cycle")
    leader_election: LeaderElection = Field(LeaderElection(), description="leader election (kai-opt run "
                                            "--leader-elect)")
    gpu_sharing: GpuSharing = Field(GpuSharing(), description="KAI's GPU-sharing contract when binding")
    binder: BinderKind = Field(BinderKind.kai_opt, description="kai-opt: kai-opt binds (pods/binding, and carries "
                               "out gpu_sharing itself); kai: kai-opt writes KAI-Scheduler's BindRequests and "
                               "KAI's binder binds (reservation pods and shared-GPU ConfigMaps too); the default of "
                               "`kai-opt manifests --existing-kai`")
    kai_binder: KaiBinder = Field(KaiBinder(), description="BindRequests for KAI's binder (binder: kai)")


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(v: Any) -> Any:
    """Seconds from a number or a duration as KAI writes them ("10m", "1h30m", "1w"; d and w as in its docs)."""
    if not isinstance(v, str):
        return v
    text = v.strip()
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"not a duration: {v!r} (seconds, or like 10m, 1h30m, 1w)") from None
    return total


def parse_time(v: Any) -> Any:
    """Unix seconds from a number or an RFC 3339 timestamp (KAI's metav1.Time)."""
    if not isinstance(v, str):
        return v
    try:
        t = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {v!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


Duration = Annotated[float, BeforeValidator(parse_duration)]


class WindowType(StrEnum):
    """KAI's windowType: sliding (the last windowSize), tumbling (reset every windowSize from
    tumblingWindowStartTime) or cron (reset at every occurrence of cronString, in UTC; windowSize unused)."""

    sliding = "sliding"
    tumbling = "tumbling"
    cron = "cron"


class _KaiModel(_Model):
    """A section mirroring a KAI-Scheduler one: its fields are also read by KAI's camelCase names, so KAI's
    SchedulingShard usageDBConfig block can be pasted as it is."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, allow_inf_nan=False,
                              alias_generator=AliasGenerator(validation_alias=lambda n: AliasChoices(n, to_camel(n))),
                              populate_by_name=True)


class ExtraParams(_KaiModel):
    """KAI's usageParams.extraParams of its Prometheus client (same names, snake_case)."""

    gpu_allocation_metric: str = Field("kai_queue_allocated_gpus", min_length=1, description="PromQL of each "
                                       "queue's allocated GPUs (label queue_name; KAI's gpuAllocationMetric)")
    cpu_allocation_metric: str = Field("kai_queue_allocated_cpu_cores", min_length=1,
                                       description="PromQL of each queue's allocated CPU cores")
    memory_allocation_metric: str = Field("kai_queue_allocated_memory_bytes", min_length=1,
                                          description="PromQL of each queue's allocated memory bytes")
    gpu_capacity_metric: str = Field('sum(kube_node_status_capacity{resource="nvidia_com_gpu"})', min_length=1,
                                     description="PromQL of the cluster's GPU capacity")
    cpu_capacity_metric: str = Field('sum(kube_node_status_capacity{resource="cpu"})', min_length=1,
                                     description="PromQL of the cluster's CPU capacity (cores)")
    memory_capacity_metric: str = Field('sum(kube_node_status_capacity{resource="memory"})', min_length=1,
                                        description="PromQL of the cluster's memory capacity (bytes)")
    usage_query_timeout: Duration = Field(10.0, gt=0, le=3600, description="timeout of one round of usage "
                                          "queries, seconds (KAI's usageQueryTimeout)")
    query_resolution: Duration = Field(60.0, gt=0, le=86_400, description="step between the samples summed over "
                                       "the window, seconds (KAI's queryResolution)")


class UsageParams(_KaiModel):
    """KAI's usageDBConfig.usageParams: which past usage counts and how much. Durations: seconds, or KAI's
    strings (10m, 1h30m, 1w)."""

    half_life_period: Duration | None = Field(None, ge=0, le=MAX_DURATION_S, description="a sample this old "
                                              "counts half (exponential decay); null or 0 = no decay (KAI's "
                                              "halfLifePeriod)")
    window_size: Duration = Field(604_800.0, gt=0, le=MAX_DURATION_S, description="the period of past usage "
                                  "considered, seconds (KAI's windowSize, 1 week)")
    window_type: WindowType = Field(WindowType.sliding, description="sliding, tumbling or cron (KAI's windowType)")
    tumbling_window_start_time: Annotated[float, BeforeValidator(parse_time)] | None = Field(
        None, description="tumbling windows start here and every window_size after (unix seconds or RFC 3339; "
        "required for tumbling, KAI's tumblingWindowStartTime)")
    cron_string: str = Field("", validate_default=True, description="cron windows reset at every occurrence of "
                             "this expression, in UTC: 5 fields (minute hour day-of-month month day-of-week), 6 with "
                             "a year, 7 with seconds first, or @daily/@weekly/@monthly/...; required for cron, "
                             "KAI's cronString, read as its cron library does")
    fetch_interval: Duration = Field(60.0, gt=0, le=86_400, description="Prometheus: seconds between usage "
                                     "queries (KAI's fetchInterval); ledger: seconds between ConfigMap writes")
    staleness_period: Duration = Field(300.0, gt=0, le=MAX_DURATION_S, description="usage older than this is "
                                       "stale (a warning; it is still used, as KAI); ledger: the longest gap "
                                       "between two records that counts (KAI's stalenessPeriod)")
    wait_timeout: Duration = Field(60.0, gt=0, le=3600, description="longest wait for the first usage at start "
                                   "(KAI's waitTimeout)")
    extra_params: ExtraParams = Field(ExtraParams(), description="Prometheus metrics and query settings")

    @field_validator("cron_string")
    @classmethod
    def _cron(cls, v: str, info: ValidationInfo) -> str:
        # checked only for a cron window, as KAI (which ignores cronString otherwise)
        if info.data.get("window_type") == WindowType.cron:
            if not v.strip():
                raise ValueError("window_type cron needs cron_string (e.g. '0 0 * * 1': Mondays at 00:00 UTC)")
            try:
                cron.parse(v)
            except cron.CronError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _tumbling(self) -> UsageParams:
        if self.window_type == WindowType.tumbling and self.tumbling_window_start_time is None:
            raise ValueError("window_type tumbling needs tumbling_window_start_time")
        return self


class UsageLedgerConfig(_KaiModel):
    """kai-opt's own usage record (client_type: ledger): per-queue resource-seconds kept in a ConfigMap."""

    config_map_name: DnsSubdomain = Field("kai-opt-usage", description="name of the ConfigMap holding the ledger")
    config_map_namespace: str = Field("", description="its namespace ('' = the pod's own namespace in a "
                                      "cluster, else default)")
    bucket: Duration = Field(3600.0, gt=0, le=MAX_DURATION_S, description="seconds of usage summed into one "
                             "bucket (the ledger's resolution: window_size / bucket buckets per queue)")


class UsageDB(_KaiModel):
    """Time-based fair share: where past usage comes from (KAI's usageDBConfig). Off unless client_type is set."""

    client_type: str = Field("", description="'' (off), prometheus (KAI's queries over its queue metrics) or "
                             "ledger (kai-opt records what is allocated into a ConfigMap)")
    connection_string: str = Field("", description="Prometheus base URL, e.g. http://prometheus:9090 (KAI's "
                                   "connectionString)")
    connection_string_env_var: str = Field("", description="environment variable holding the URL instead "
                                           "(KAI's connectionStringEnvVar)")
    usage_params: UsageParams = Field(UsageParams(), description="window, decay and fetching")
    ledger: UsageLedgerConfig = Field(UsageLedgerConfig(), description="the ConfigMap ledger (client_type: "
                                      "ledger)")

    @field_validator("client_type")
    @classmethod
    def _client(cls, v: str) -> str:
        if v not in ("", "prometheus", "ledger"):
            raise ValueError("must be '', prometheus or ledger")
        return v

    @model_validator(mode="after")
    def _connection(self) -> UsageDB:
        if self.client_type == "prometheus":
            if self.connection_string and self.connection_string_env_var:
                raise ValueError("set connection_string or connection_string_env_var, not both")
            if not self.connection_string and not self.connection_string_env_var:
                raise ValueError("client_type prometheus needs connection_string or connection_string_env_var")
        return self


_LABEL_KEY_RE = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_LABEL_VALUE_RE = r"^$|^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


class Shard(_Model):
    """A scheduling shard (KAI's SchedulingShard): this scheduler sees only the nodes, queues and PodGroups whose
    partition label has the shard's value (kai_opt/k8s/shard.py). Off while name is ''."""

    name: str = Field("", pattern=r"^$|" + _DNS_LABEL_RE, max_length=40, description="the shard's name ('' = "
                      "no sharding: the whole cluster); in a cluster its SchedulingShard object of this name is "
                      "read when present, and its Lease and usage ledger ConfigMap carry the name")
    partition_label: str = Field("kai.scheduler/node-pool", pattern=_LABEL_KEY_RE, description="label key of "
                                 "the partition on nodes, queues and PodGroups (KAI's global nodePoolLabelKey)")
    partition_value: str = Field("", pattern=_LABEL_VALUE_RE, description="the shard's value of the label ('' = "
                                 "the objects without the label, KAI's default shard); a SchedulingShard's "
                                 "partitionLabelValue replaces it")
    read_scheduling_shard: bool = Field(True, description="in a cluster, read SchedulingShard <name> "
                                        "(kai.scheduler/v1) when present: its partitionLabelValue, and its "
                                        "placementStrategy, minRuntime, kValue and actions where this file does "
                                        "not set them")
class Autoscaler(_Model):
    """Autoscaler support (kai_opt/k8s/scaleadjust.py; KAI's node-scale-adjuster): for pending GPU pods that fit no
    node, placeholder pods requesting whole `nvidia.com/gpu` with the pods' constraints, which cluster-autoscaler
    and Karpenter see (GPU-sharing requests are annotations they cannot read)."""

    enabled: bool = Field(False, description="create placeholder pods for pending GPU pods that fit no node")
    namespace: str = Field("kai-opt-scaling", pattern=_DNS_LABEL_RE, description="namespace of the placeholder "
                           "pods (kai-opt may create and delete pods there)")
    scheduler_name: str = Field("default-scheduler", min_length=1, max_length=253, description="schedulerName of "
                                "the placeholders: never one of kai-opt's (kai-opt never places them; the "
                                "autoscaler sees them unschedulable)")
    priority_class_name: DnsSubdomain = Field("kai-opt-scaling-placeholder", description="PriorityClass of the "
                                              "placeholders (negative value: they never hold capacity real work "
                                              "needs)")
    priority_value: int = Field(-100, ge=-(2**31), le=-1, description="value of that PriorityClass when the "
                                "chart creates it (create_priority_class)")
    create_priority_class: bool = Field(True, description="the chart creates the PriorityClass")
    create_namespace: bool = Field(True, description="the chart creates the namespace")
    image: str = Field("registry.k8s.io/pause:3.10", min_length=1, pattern=r"^\S+$",
                       description="image of the placeholders (they only sleep)")
    gpu_memory_to_fraction_ratio: float = Field(0.1, gt=0, le=1, description="a gpu-memory pod counts as this "
                                                "fraction of a GPU (KAI's gpuMemoryToFractionRatio)")
    whole_gpu_pods: bool = Field(True, description="placeholders for whole-GPU pods too (kai-opt does not mark its "
                                 "pending pods PodScheduled=False, so autoscalers see none of them)")
    cool_down_s: float = Field(60.0, ge=0, le=3600, description="after a placeholder is deleted, none is created "
                               "for this long (KAI's cool-down: the autoscaler's new nodes get a cycle first)")
    max_placeholders: int = Field(1000, ge=1, le=100_000, description="at most this many placeholders at once "
                                  "(the first pending groups in queue order get them, a group's all or none)")


class Config(_Model):
    engine: Engine = Field(Engine.cpsat, description="cpsat (optimization, hinted by and falling back to the greedy "
                           "plan) or greedy (KAI-like heuristics only)")
    scheduler_names: tuple[str, ...] = Field(("kai-opt",), min_length=1, description="pods with these "
                                             "schedulerNames are scheduled by kai-opt")
    default_queue: str = Field("default-queue", description="queue of workloads that name none")
    actions: Actions = Actions()
    placement: Placement = Placement()
    max_consolidation_preemptees: int = Field(-1, ge=-1, le=INT32_MAX,
                                              description="victim jobs a consolidation may move "
                                              "(-1 = unlimited, 0 = consolidation off)")
    max_victim_scenarios: int = Field(8, ge=1, le=INT32_MAX,
                                      description="victim scenarios (evict the next victims, then try "
                                      "to place) simulated per pending job and action")
    victim_search: VictimSearch = Field(VictimSearch.auto, description="reclaim and preempt: kai takes victims in "
                                        "KAI's victim order until the job fits (KAI's plans); cheapest first picks, "
                                        "per pod, the node where evicting the fewest GPUs makes room, and tries those "
                                        "victims (KAI's rules and scenario simulation still judge them): faster on "
                                        "large clusters, other victims than KAI's; auto is kai on clusters below "
                                        "victim_search_auto_nodes nodes and cheapest from there on")
    victim_search_auto_nodes: int = Field(2000, ge=1, le=INT32_MAX,
                                          description="victim_search auto: the cluster size (nodes) from which "
                                          "reclaim and preempt take the cheapest victims instead of KAI's search")
    max_victim_chunks: int = Field(500, ge=-1, le=INT32_MAX,
                                   description="victim chunks (a gang's core, or one elastic pod) one "
                                   "search may evict before it gives up (-1 = unlimited); bounds a cycle's time")
    use_scheduling_signatures: bool = Field(True, description="in one run of reclaim, preempt or consolidate, "
                                            "skip a pending job that is no easier to place than a failed one "
                                            "with the same constraints (KAI's useSchedulingSignatures, on in "
                                            "KAI's scheduler binary, off in its test sessions)")
    preempt_min_runtime_s: float = Field(0.0, ge=0, le=MAX_DURATION_S,
                                         description="default when no queue in the tree sets "
                                         "preemptMinRuntime")
    reclaim_min_runtime_s: float = Field(0.0, ge=0, le=MAX_DURATION_S,
                                         description="default when no queue sets reclaimMinRuntime")
    stale_gang_grace_s: float = Field(60.0, ge=0, le=MAX_DURATION_S,
                                      description="how long a running gang may stay below "
                                      "minMember before it is evicted")
    reclaim_saturation_multiplier: float = Field(1.0, ge=1.0, le=1e6,
                                                 description="reclaimer allocated x this must stay "
                                                 "within fair share (larger = more conservative)")
    k_value: float = Field(1.0, ge=0, le=1e6, validation_alias=AliasChoices("k_value", "kValue"),
                           description="time-based fair share: how much past usage lowers a queue's over-quota "
                           "share, max(0, w + k_value * (w - usage)) (KAI's kValue)")
    usage_db: UsageDB = Field(UsageDB(), validation_alias=AliasChoices("usage_db", "usageDBConfig"),
                              description="time-based fair share: the source of past usage (KAI's usageDBConfig)")
    schedule_period_s: float = Field(1.0, gt=0, le=3600, description="in-cluster: seconds between cycles")
    solver: Solver = Solver()
    runtime: Runtime = Field(Runtime(), description="in-cluster scheduler (kai-opt run)")
    shard: Shard = Field(Shard(), description="scheduling shard: the partition of the cluster this scheduler "
                         "schedules (KAI's SchedulingShard)")
    autoscaler: Autoscaler = Field(Autoscaler(), description="in-cluster: placeholder pods for cluster-autoscaler "
                                   "and Karpenter (off by default)")

    @model_validator(mode="after")
    def _placeholders_not_ours(self) -> Config:
        if self.autoscaler.scheduler_name in self.scheduler_names:
            raise ValueError(f"autoscaler.scheduler_name {self.autoscaler.scheduler_name!r} is one of "
                             "scheduler_names: kai-opt would schedule its own placeholders")
        return self

    def victim_search_for(self, n_nodes: int) -> VictimSearch:
        """The victim search a cycle over n_nodes nodes uses (auto resolved by cluster size)."""
        if self.victim_search != VictimSearch.auto:
            return self.victim_search
        return VictimSearch.cheapest if n_nodes >= self.victim_search_auto_nodes else VictimSearch.kai


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    p = Path(path)
    text = read_text(p, error=ConfigError, what="config")
    check_yaml_depth(text, str(p), error=ConfigError)
    try:
        data = yaml.safe_load(text) or {}
        check_yaml_aliases(text, data, str(p), error=ConfigError)
    except (ValueError, RecursionError) as exc:  # a constructor's: e.g. an integer of more than 4300 digits
        raise ConfigError(f"invalid YAML: {exc}", source=str(p)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=str(p),
                          line=mark.line + 1 if mark else None) from exc
    if not isinstance(data, dict):
        raise ConfigError("a config must be a mapping", source=str(p))
    return parse_config(data, source=str(p))


def parse_config(data: dict[str, Any], source: str | None = None) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise ConfigError(msg, source=source, obj="Config", field=field) from exc


def default_config_yaml() -> str:
    """The default configuration as commented YAML (`kai-opt config --print-default`)."""
    lines = ["# kai-opt configuration (all fields optional; these are the defaults)"]
    _emit(Config(), Config, lines, 0)
    return "\n".join(lines) + "\n"


def reference_table() -> str:
    """Every setting as a markdown table (field path, default, meaning): `kai-opt config --reference`, and the
    README's configuration reference (a test keeps the two equal)."""
    rows = ["| field | default | meaning |", "|---|---|---|"]

    def walk(value: BaseModel, prefix: str) -> None:
        for name, field in type(value).model_fields.items():
            v = getattr(value, name)
            if isinstance(v, BaseModel):
                walk(v, f"{prefix}{name}.")
                continue
            if isinstance(v, StrEnum):
                shown = v.value
            elif isinstance(v, bool):
                shown = str(v).lower()
            elif isinstance(v, (list, tuple)):
                shown = "[" + ", ".join(map(str, v)) + "]"
            else:
                shown = str(v) if v != "" else "''"
            meaning = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{prefix}{name}` | `{shown}` | {meaning} |")

    walk(Config(), "")
    return "\n".join(rows) + "\n"


def _emit(value: BaseModel, model: type[BaseModel], lines: list[str], indent: int) -> None:
    pad = "  " * indent
    for name, field in model.model_fields.items():
        v = getattr(value, name)
        if field.description:
            lines.append(f"{pad}# {field.description}")
        if isinstance(v, BaseModel):
            lines.append(f"{pad}{name}:")
            _emit(v, type(v), lines, indent + 1)
        else:
            dumped = yaml.safe_dump({name: list(v) if isinstance(v, tuple) else
                                     (v.value if isinstance(v, StrEnum) else v)}, default_flow_style=True)
            lines.append(pad + dumped.strip().strip("{}"))
