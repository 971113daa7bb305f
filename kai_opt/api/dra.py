"""Dynamic Resource Allocation objects, `resource.k8s.io/v1`: DeviceClass, ResourceSlice, ResourceClaim(Template).

Only what scheduling reads is kept: a class's CEL selectors; a slice's driver, pool (name, generation, slice
count), where its devices are (nodeName, nodeSelector or allNodes) and per device its attributes and capacities; a
claim's requests (exactly / firstAvailable, count or All, class, CEL selectors, admin access), its
`matchAttribute` constraints and its status (allocation results, node selector, reservedFor). Attribute names are
kept qualified (`<domain>/<name>`; an unqualified name gets the slice's driver as domain, as Kubernetes does).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from kai_opt.api.meta import (
    MODEL,
    NodeSelectorTerm,
    ObjectMeta,
    Toleration,
    as_dict,
    as_list,
    ident,
    parse_requirements,
)
from kai_opt.errors import InputError
from kai_opt.units import QuantityError, parse_quantity

API_VERSION = "resource.k8s.io/v1"
AttrValue = bool | int | str  # int, bool, string and version (kept as its string) attributes
MAX_CLAIM_CONSUMERS = 256  # ResourceClaimReservedForMaxSize: pods that may share one claim


def _exprs(raw: Any, *, who: str, field: str) -> tuple[str, ...]:
    out = []
    for i, s in enumerate(as_list(raw, obj=who, field=field)):
        cel = as_dict(as_dict(s, obj=who, field=f"{field}[{i}]").get("cel"), obj=who, field=f"{field}[{i}].cel")
        expr = cel.get("expression")
        if not isinstance(expr, str) or not expr.strip():
            raise InputError("a CEL expression is required", obj=who, field=f"{field}[{i}].cel.expression")
        out.append(expr)
    return tuple(out)


def _node_terms(raw: Any, who: str, field: str) -> tuple[NodeSelectorTerm, ...]:
    """A NodeSelector's terms (ORed)."""
    out = []
    for i, t in enumerate(as_list(as_dict(raw, obj=who, field=field).get("nodeSelectorTerms"), obj=who,
                                  field=f"{field}.nodeSelectorTerms")):
        f = f"{field}.nodeSelectorTerms[{i}]"
        t = as_dict(t, obj=who, field=f)
        out.append(NodeSelectorTerm(
            match_expressions=parse_requirements(t.get("matchExpressions"), obj=who, field=f"{f}.matchExpressions"),
            match_fields=parse_requirements(t.get("matchFields"), obj=who, field=f"{f}.matchFields")))
    return tuple(out)


def _quantity(raw: Any, who: str, field: str) -> int:
    try:
        return int(parse_quantity(raw))
    except (QuantityError, TypeError) as exc:
        raise InputError(f"invalid quantity {raw!r}", obj=who, field=field) from exc


def _policy(raw: Any, who: str, field: str) -> CapacityPolicy:
    raw = as_dict(raw, obj=who, field=field)
    rng = as_dict(raw.get("validRange"), obj=who, field=f"{field}.validRange")
    opt = {k: _quantity(rng[k], who, f"{field}.validRange.{k}") for k in ("min", "max", "step")
           if rng.get(k) is not None}
    values = tuple(_quantity(x, who, f"{field}.validValues[{i}]")
                   for i, x in enumerate(as_list(raw.get("validValues"), obj=who, field=f"{field}.validValues")))
    default = _quantity(raw["default"], who, f"{field}.default") if raw.get("default") is not None else None
    return CapacityPolicy(default=default, values=tuple(sorted(values)), **opt)


def qualify(name: str, driver: str) -> str:
    """An attribute or capacity name with its domain (`<driver>/<name>` when it has none)."""
    return name if "/" in name else f"{driver}/{name}"


class DeviceClass(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    selectors: tuple[str, ...] = ()  # CEL expressions, ANDed

    @property
    def name(self) -> str:
        return self.meta.name

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> DeviceClass:
        who = ident("DeviceClass", obj)
        meta = ObjectMeta.from_k8s("DeviceClass", obj, namespaced=False)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        return cls(meta=meta, selectors=_exprs(spec.get("selectors"), who=who, field="spec.selectors"))


class CapacityPolicy(BaseModel):
    """A capacity's requestPolicy: what one allocation of a shared device consumes of it."""

    model_config = MODEL
    default: int | None = None  # consumed when the request names no amount (None: the whole capacity)
    min: int | None = None  # validRange
    max: int | None = None
    step: int | None = None
    values: tuple[int, ...] = ()  # validValues, ascending

    def consumed(self, requested: int | None, capacity: int) -> int | None:
        """The amount an allocation takes for `requested` (None: not named by the request), rounded up as
        Kubernetes rounds it; None when the policy refuses it (the device cannot be allocated)."""
        amount = (self.default if self.default is not None else capacity) if requested is None else requested
        if self.values:
            up = [v for v in self.values if v >= amount]
            return up[0] if up else None
        if self.min is not None:
            if amount < self.min:
                amount = self.min
            if self.step:
                amount = self.min + -(-(amount - self.min) // self.step) * self.step
            if self.max is not None and amount > self.max:
                return None
        return amount


class DeviceTaint(BaseModel):
    model_config = MODEL
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule and NoExecute keep claims off (None: informational)

    @property
    def blocks(self) -> bool:
        return self.effect in ("NoSchedule", "NoExecute")

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _counters(raw: Any, who: str, field: str) -> dict[str, int]:
    return {str(k): _quantity(as_dict(v, obj=who, field=f"{field}.{k}").get("value"), who, f"{field}.{k}.value")
            for k, v in as_dict(raw, obj=who, field=field).items()}


def _counter_sets(raw: Any, who: str) -> dict[str, dict[str, int]]:
    out = {}
    for i, cs in enumerate(as_list(raw, obj=who, field="spec.sharedCounters")):
        cs = as_dict(cs, obj=who, field=f"spec.sharedCounters[{i}]")
        if not isinstance(cs.get("name"), str) or not cs["name"]:
            raise InputError("name is required", obj=who, field=f"spec.sharedCounters[{i}].name")
        out[cs["name"]] = _counters(cs.get("counters"), who, f"spec.sharedCounters[{i}].counters")
    return out


def _consumes(raw: Any, who: str, field: str) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    out = []
    for i, c in enumerate(as_list(raw, obj=who, field=field)):
        c = as_dict(c, obj=who, field=f"{field}[{i}]")
        if not isinstance(c.get("counterSet"), str) or not c["counterSet"]:
            raise InputError("counterSet is required", obj=who, field=f"{field}[{i}].counterSet")
        out.append((c["counterSet"], tuple(sorted(_counters(c.get("counters"), who, f"{field}[{i}].counters")
                                                  .items()))))
    return tuple(out)


def _taints(raw: Any, who: str, field: str) -> tuple[DeviceTaint, ...]:
    out = []
    for i, t in enumerate(as_list(raw, obj=who, field=field)):
        t = as_dict(t, obj=who, field=f"{field}[{i}]")
        if not isinstance(t.get("key"), str) or not t["key"]:
            raise InputError("key is required", obj=who, field=f"{field}[{i}].key")
        effect = t.get("effect")
        if effect not in TAINT_EFFECTS:
            raise InputError(f"unknown effect {effect!r}", obj=who, field=f"{field}[{i}].effect")
        out.append(DeviceTaint(key=t["key"], value=str(t.get("value") or ""), effect=effect))
    return tuple(out)


def _tolerations(raw: Any, who: str, field: str) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(as_list(raw, obj=who, field=field)):
        t = as_dict(t, obj=who, field=f"{field}[{i}]")
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise InputError(f"unknown operator {op!r}", obj=who, field=f"{field}[{i}].operator")
        out.append(Toleration(key=str(t.get("key") or ""), operator=op, value=str(t.get("value") or ""),
                              effect=str(t.get("effect") or "")))
    return tuple(out)


class Device(BaseModel):
    model_config = MODEL
    name: str
    attributes: dict[str, AttrValue] = {}  # qualified name -> value
    capacity: dict[str, int] = {}  # qualified name -> value (quantities as integers, e.g. bytes)
    multiple_allocations: bool = False  # allowMultipleAllocations: shared by claims up to its capacity
    policies: dict[str, CapacityPolicy] = {}  # qualified capacity name -> its requestPolicy (shared devices)
    taints: tuple[DeviceTaint, ...] = ()
    consumes: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()  # consumesCounters: (counter set, amounts)
    # where it is reachable from, when its slice says perDeviceNodeSelection
    node_name: str | None = None
    node_selector: tuple[NodeSelectorTerm, ...] = ()
    all_nodes: bool = False

    def untolerated(self, tolerations: tuple[Toleration, ...]) -> DeviceTaint | None:
        """The first NoSchedule/NoExecute taint none of `tolerations` tolerates (None: the device may be given)."""
        for t in self.taints:
            if t.blocks and not any(x.tolerates(t.key, t.value, t.effect) for x in tolerations):
                return t
        return None

    def consumption(self, requests: dict[str, int], driver: str) -> dict[str, int] | None:
        """What one allocation of this shared device takes of every capacity for a request's
        `capacity.requests` (names as the request gives them), None when a policy refuses an amount or the
        request names a capacity the device lacks."""
        want = {qualify(k, driver): v for k, v in requests.items()}
        if any(k not in self.capacity for k in want):
            return None
        out = {}
        for k, cap in self.capacity.items():
            got = self.policies.get(k, CapacityPolicy()).consumed(want.get(k), cap)
            if got is None or got > cap:
                return None
            out[k] = got
        return out


class ResourceSlice(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    driver: str
    pool: str
    generation: int = 0
    slice_count: int = 1
    node_name: str | None = None
    node_selector: tuple[NodeSelectorTerm, ...] = ()  # devices reachable from the nodes it selects
    all_nodes: bool = False
    devices: tuple[Device, ...] = ()
    per_device: bool = False  # perDeviceNodeSelection: each device says where it is reachable from
    shared_counters: dict[str, dict[str, int]] = {}  # sharedCounters: counter set -> counter -> value

    @property
    def name(self) -> str:
        return self.meta.name

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> ResourceSlice:
        who = ident("ResourceSlice", obj)
        meta = ObjectMeta.from_k8s("ResourceSlice", obj, namespaced=False)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        driver = spec.get("driver")
        if not isinstance(driver, str) or not driver:
            raise InputError("driver is required", obj=who, field="spec.driver")
        pool = as_dict(spec.get("pool"), obj=who, field="spec.pool")
        if not isinstance(pool.get("name"), str) or not pool.get("name"):
            raise InputError("pool name is required", obj=who, field="spec.pool.name")
        terms: tuple[NodeSelectorTerm, ...] = ()
        if spec.get("nodeSelector") is not None:
            terms = _node_terms(spec["nodeSelector"], who, "spec.nodeSelector")
        devices = []
        for i, d in enumerate(as_list(spec.get("devices"), obj=who, field="spec.devices")):
            f = f"spec.devices[{i}]"
            d = as_dict(d, obj=who, field=f)
            if not isinstance(d.get("name"), str) or not d["name"]:
                raise InputError("device name is required", obj=who, field=f"{f}.name")
            attrs: dict[str, AttrValue] = {}
            for k, v in as_dict(d.get("attributes"), obj=who, field=f"{f}.attributes").items():
                v = as_dict(v, obj=who, field=f"{f}.attributes.{k}")
                for typ in ("int", "bool", "string", "version"):
                    if typ in v:
                        attrs[qualify(str(k), driver)] = v[typ]
                        break
                else:
                    raise InputError("an attribute needs int, bool, string or version", obj=who,
                                     field=f"{f}.attributes.{k}")
            cap: dict[str, int] = {}
            policies: dict[str, CapacityPolicy] = {}
            for k, v in as_dict(d.get("capacity"), obj=who, field=f"{f}.capacity").items():
                v = as_dict(v, obj=who, field=f"{f}.capacity.{k}")
                cap[qualify(str(k), driver)] = _quantity(v.get("value"), who, f"{f}.capacity.{k}.value")
                if v.get("requestPolicy") is not None:
                    policies[qualify(str(k), driver)] = _policy(v["requestPolicy"], who,
                                                                f"{f}.capacity.{k}.requestPolicy")
            devices.append(Device(name=d["name"], attributes=attrs, capacity=cap, policies=policies,
                                  taints=_taints(d.get("taints"), who, f"{f}.taints"),
                                  consumes=_consumes(d.get("consumesCounters"), who, f"{f}.consumesCounters"),
                                  node_name=d.get("nodeName") or None, all_nodes=bool(d.get("allNodes", False)),
                                  node_selector=_node_terms(d["nodeSelector"], who, f"{f}.nodeSelector")
                                  if d.get("nodeSelector") is not None else (),
                                  multiple_allocations=bool(d.get("allowMultipleAllocations", False))))
        try:
            return cls(meta=meta, driver=driver, pool=pool["name"], generation=int(pool.get("generation", 0)),
                       slice_count=int(pool.get("resourceSliceCount", 1)), node_name=spec.get("nodeName") or None,
                       node_selector=terms, all_nodes=bool(spec.get("allNodes", False)), devices=tuple(devices),
                       shared_counters=_counter_sets(spec.get("sharedCounters"), who),
                       per_device=bool(spec.get("perDeviceNodeSelection", False)))
        except (TypeError, ValueError) as exc:
            raise InputError(f"bad pool fields: {exc}".splitlines()[0], obj=who, field="spec.pool") from None


class DeviceSubRequest(BaseModel):
    """One way to satisfy a request: `exactly`, or one of `firstAvailable` (tried in order)."""

    model_config = MODEL
    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    mode: Literal["ExactCount", "All"] = "ExactCount"
    count: int = 1
    admin_access: bool = False
    capacity: dict[str, int] = {}  # consumable capacity requested per device
    tolerations: tuple[Toleration, ...] = ()  # device taints it tolerates


class DeviceRequest(BaseModel):
    model_config = MODEL
    name: str
    alternatives: tuple[DeviceSubRequest, ...]  # one for `exactly`, several for `firstAvailable`


class MatchAttribute(BaseModel):
    model_config = MODEL
    requests: tuple[str, ...] = ()  # empty: every request of the claim
    attribute: str


class AllocationResult(BaseModel):
    model_config = MODEL
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    consumed: dict[str, int] = {}  # consumedCapacity of a shared device (qualified capacity names)
    share_id: str | None = None  # shareID: which share of a shared device


class ConsumerRef(BaseModel):
    model_config = MODEL
    resource: str = "pods"
    name: str
    uid: str | None = None


class ClaimSpec(BaseModel):
    model_config = MODEL
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[MatchAttribute, ...] = ()


def _sub(raw: dict[str, Any], name: str, *, who: str, field: str) -> DeviceSubRequest:
    cls_name = raw.get("deviceClassName")
    if not isinstance(cls_name, str) or not cls_name:
        raise InputError("deviceClassName is required", obj=who, field=f"{field}.deviceClassName")
    mode: Literal["ExactCount", "All"] = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise InputError(f"unknown allocationMode {mode!r}", obj=who, field=f"{field}.allocationMode")
    count = raw.get("count", 1)
    if type(count) is not int or count < 1:
        raise InputError(f"count must be a positive integer, got {count!r}", obj=who, field=f"{field}.count")
    cap: dict[str, int] = {}
    reqs = as_dict(as_dict(raw.get("capacity"), obj=who, field=f"{field}.capacity").get("requests"), obj=who,
                   field=f"{field}.capacity.requests")
    for k, v in reqs.items():
        cap[str(k)] = _quantity(v, who, f"{field}.capacity.requests.{k}")
    return DeviceSubRequest(name=name, device_class=cls_name,
                            selectors=_exprs(raw.get("selectors"), who=who, field=f"{field}.selectors"),
                            mode=mode, count=count, admin_access=bool(raw.get("adminAccess", False)), capacity=cap,
                            tolerations=_tolerations(raw.get("tolerations"), who, f"{field}.tolerations"))


def parse_claim_spec(spec: dict[str, Any], *, who: str, field: str) -> ClaimSpec:
    devices = as_dict(spec.get("devices"), obj=who, field=f"{field}.devices")
    requests = []
    for i, r in enumerate(as_list(devices.get("requests"), obj=who, field=f"{field}.devices.requests")):
        f = f"{field}.devices.requests[{i}]"
        r = as_dict(r, obj=who, field=f)
        name = r.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("request name is required", obj=who, field=f"{f}.name")
        alts: tuple[DeviceSubRequest, ...]
        if r.get("exactly") is not None:
            alts = (_sub(as_dict(r["exactly"], obj=who, field=f"{f}.exactly"), name, who=who, field=f"{f}.exactly"),)
        elif r.get("firstAvailable"):
            alts = tuple(_sub(as_dict(s, obj=who, field=f"{f}.firstAvailable[{j}]"),
                              f"{name}/{as_dict(s, obj=who, field=f).get('name', j)}", who=who,
                              field=f"{f}.firstAvailable[{j}]")
                         for j, s in enumerate(as_list(r["firstAvailable"], obj=who, field=f"{f}.firstAvailable")))
        else:
            raise InputError("a request needs exactly or firstAvailable", obj=who, field=f)
        requests.append(DeviceRequest(name=name, alternatives=alts))
    constraints = []
    for i, c in enumerate(as_list(devices.get("constraints"), obj=who, field=f"{field}.devices.constraints")):
        c = as_dict(c, obj=who, field=f"{field}.devices.constraints[{i}]")
        attr = c.get("matchAttribute")
        if not isinstance(attr, str) or not attr:
            raise InputError("matchAttribute is required", obj=who, field=f"{field}.devices.constraints[{i}]")
        reqs = tuple(str(x) for x in as_list(c.get("requests"), obj=who, field=f"{field}.devices.constraints[{i}]"))
        constraints.append(MatchAttribute(requests=reqs, attribute=attr))
    return ClaimSpec(requests=tuple(requests), constraints=tuple(constraints))


class ResourceClaim(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    resource_version: str | None = None
    spec: ClaimSpec
    allocation: tuple[AllocationResult, ...] | None = None  # None: not allocated
    allocation_nodes: tuple[NodeSelectorTerm, ...] = ()
    reserved_for: tuple[ConsumerRef, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.meta.namespace}/{self.meta.name}"

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> ResourceClaim:
        who = ident("ResourceClaim", obj)
        meta = ObjectMeta.from_k8s("ResourceClaim", obj, namespaced=True)
        spec = parse_claim_spec(as_dict(obj.get("spec"), obj=who, field="spec"), who=who, field="spec")
        status = as_dict(obj.get("status"), obj=who, field="status")
        allocation: tuple[AllocationResult, ...] | None = None
        terms: tuple[NodeSelectorTerm, ...] = ()
        if status.get("allocation") is not None:
            alloc = as_dict(status["allocation"], obj=who, field="status.allocation")
            results = as_list(as_dict(alloc.get("devices"), obj=who, field="status.allocation.devices")
                              .get("results"), obj=who, field="status.allocation.devices.results")
            out = []
            for i, r in enumerate(results):
                r = as_dict(r, obj=who, field=f"status.allocation.devices.results[{i}]")
                rf = f"status.allocation.devices.results[{i}]"
                used = {qualify(str(k), str(r.get("driver"))): _quantity(v, who, f"{rf}.consumedCapacity.{k}")
                        for k, v in as_dict(r.get("consumedCapacity"), obj=who, field=f"{rf}.consumedCapacity").items()}
                try:
                    out.append(AllocationResult(request=str(r["request"]), driver=str(r["driver"]),
                                                pool=str(r["pool"]), device=str(r["device"]),
                                                admin_access=bool(r.get("adminAccess") or False), consumed=used,
                                                share_id=str(r["shareID"]) if r.get("shareID") else None))
                except KeyError as exc:
                    raise InputError(f"{exc.args[0]} is required", obj=who,
                                     field=f"status.allocation.devices.results[{i}]") from None
            allocation = tuple(out)
            if alloc.get("nodeSelector") is not None:
                terms = _node_terms(alloc["nodeSelector"], who, "status.allocation.nodeSelector")
        reserved = []
        for i, r in enumerate(as_list(status.get("reservedFor"), obj=who, field="status.reservedFor")):
            r = as_dict(r, obj=who, field=f"status.reservedFor[{i}]")
            if not isinstance(r.get("name"), str):
                raise InputError("name is required", obj=who, field=f"status.reservedFor[{i}].name")
            reserved.append(ConsumerRef(resource=str(r.get("resource") or "pods"), name=r["name"],
                                        uid=r.get("uid") or None))
        rv = as_dict(obj.get("metadata"), obj=who, field="metadata").get("resourceVersion")
        return cls(meta=meta, resource_version=str(rv) if rv is not None else None, spec=spec,
                   allocation=allocation, allocation_nodes=terms, reserved_for=tuple(reserved))


class ResourceClaimTemplate(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    spec: ClaimSpec

    @property
    def key(self) -> str:
        return f"{self.meta.namespace}/{self.meta.name}"

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> ResourceClaimTemplate:
        who = ident("ResourceClaimTemplate", obj)
        meta = ObjectMeta.from_k8s("ResourceClaimTemplate", obj, namespaced=True)
        spec = as_dict(as_dict(obj.get("spec"), obj=who, field="spec").get("spec"), obj=who, field="spec.spec")
        return cls(meta=meta, spec=parse_claim_spec(spec, who=who, field="spec.spec"))


class PodClaim(BaseModel):
    """One entry of a pod's `spec.resourceClaims`, with the claim's name once known (`resourceClaimName`, or the
    name `status.resourceClaimStatuses` gives a template's claim)."""

    model_config = MODEL
    name: str
    claim_name: str | None = None
    template_name: str | None = None


def parse_pod_claims(spec: dict[str, Any], status: dict[str, Any], who: str) -> tuple[PodClaim, ...]:
    raw = spec.get("resourceClaims")
    if not raw:
        return ()
    made = {}
    for s in as_list(status.get("resourceClaimStatuses"), obj=who, field="status.resourceClaimStatuses"):
        s = as_dict(s, obj=who, field="status.resourceClaimStatuses")
        if isinstance(s.get("name"), str) and isinstance(s.get("resourceClaimName"), str):
            made[s["name"]] = s["resourceClaimName"]
    out = []
    for i, c in enumerate(as_list(raw, obj=who, field="spec.resourceClaims")):
        c = as_dict(c, obj=who, field=f"spec.resourceClaims[{i}]")
        name = c.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("name is required", obj=who, field=f"spec.resourceClaims[{i}].name")
        claim, template = c.get("resourceClaimName"), c.get("resourceClaimTemplateName")
        if bool(claim) == bool(template):
            raise InputError("exactly one of resourceClaimName and resourceClaimTemplateName is required",
                             obj=who, field=f"spec.resourceClaims[{i}]")
        out.append(PodClaim(name=name, claim_name=str(claim) if claim else made.get(name),
                            template_name=str(template) if template else None))
    return tuple(out)
