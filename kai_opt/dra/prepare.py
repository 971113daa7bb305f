"""DRA devices as resource columns: a Snapshot with ResourceSlices and claims -> nodes and pods the engines read.

Rule: devices are grouped into kinds, a kind being the set of device queries (a request's device class with its
CEL selectors) a device satisfies. Every kind is one extended resource column (`dra:<class>`, `#<k>` when a class
has several kinds) whose allocatable on a node is its devices there, less the devices held by claims that no
single pod of the snapshot carries. A claim is carried by one pod (its holder), which requests the claim's devices
in their columns: the greedy placer, the victim search (evicting the holder frees them), the checker and the
CP-SAT model all see DRA devices as counts per kind and node. Further:
- an allocated claim pins its users to the node of its devices (or its allocation's node selector);
- a claim used by several pods is held once: allocated, its devices leave the node's allocatable and every user
  is pinned there; not yet allocated, the first user holds it and the others are bound by a required pod affinity
  to the holder's node;
- a request is satisfiable only when its query's kinds are in one column: kinds no node has two of and that are
  counted alike (`apart`) share one, so the request takes whichever each node has, asking the most any of them
  consumes of shares and counters (firstAvailable: the first alternative that is, and that some node has enough
  devices for); `All` takes every matching device of the node, and is pinned to the
  nodes where that count is the same as the column's request;
- matchAttribute constraints restrict the holder to nodes where the constrained devices share the attribute;
- shared devices (consumable capacity) and shared counters are columns of their own, measured on each node's
  designated device / counter set (`read_consumption`, `read_counters`); a request of `count` N (or `All`) shares
  takes one on each of N distinct devices, the j-th share in the columns of the node's j-th device by free
  capacity; a device on several counter sets is in play only on the designated set with room on the others for
  every such device at once; tolerations are part of the query; a network-attached device is counted on one node
  it reaches (`_Reach`);
- a claim that cannot be resolved (missing claim or template, unknown class, a query over several columns, the
  256-consumer limit) keeps its pending pods off every node, with a warning.
Without DRA objects and claims the snapshot is returned unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from kai_opt.api import Node, Pod
from kai_opt.api.dra import (
    MAX_CLAIM_CONSUMERS,
    ClaimSpec,
    Device,
    DeviceRequest,
    DeviceSubRequest,
    ResourceClaim,
    ResourceSlice,
    qualify,
)
from kai_opt.api.meta import LabelSelector, PodAffinityTerm, Toleration
from kai_opt.dra.cel import SelectorCache, device_context

NODE_LABEL = "kai-opt.dra/node"  # synthetic: every node's own name (the shared-claim affinity's topology key)
HOLDER_LABEL = "kai-opt.dra/holder-"  # + claim index: marks the pod that holds a shared, unallocated claim
# (device class, selectors, capacity.requests, tolerations)
Query = tuple[str, tuple[str, ...], tuple[tuple[str, int], ...], tuple[Toleration, ...]]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)


def counter_key(driver: str, pool: str, counter_set: str) -> DeviceKey:
    """A counter set's key in `DraState.consumed` (a device name never contains ':')."""
    return (driver, pool, f"counterSet:{counter_set}")


def counter_column(driver: str, counter: str, elsewhere: bool = False) -> str:
    """The column of a shared counter: on each node, what its designated counter set of the driver has free
    (`~`: what pods' claims consume of its other sets)."""
    return f"dra:counter:{driver}/{counter}" + ("~" if elsewhere else "")


def query_of(alt: DeviceSubRequest) -> Query:
    return (alt.device_class, alt.selectors, tuple(sorted(alt.capacity.items())), alt.tolerations)


def cap_column(col: str, cap: str, elsewhere: bool = False, rank: int = 0) -> str:
    """The column of a capacity of shared devices: on each node, what the node's designated device of the kind
    has free (`rank` j > 0: its j-th device by free capacity, for requests of several shares; `~`: what pods'
    claims consume on its other devices, so evicting them frees only that)."""
    return f"{col}[{cap}]" + ("~" if elsewhere else f"@{rank}" if rank else "")


def is_gpu_class(name: str) -> bool:
    """KAI counts a claim's devices as GPUs when its device class name contains "gpu"."""
    return "gpu" in name.lower()


@dataclass(frozen=True)
class DevRef:
    driver: str
    pool: str
    name: str
    node: str
    slice_name: str
    generation: int


@dataclass
class ClaimPlan:
    """One claim as the engines see it."""

    key: str
    claim: ResourceClaim | None  # None: made from a template (not created yet)
    template: str | None
    users: list[int]  # pod indexes of the snapshot
    holder: int | None = None
    demand: dict[str, int] = field(default_factory=dict)  # column -> devices its holder requests
    requests: list[tuple[str, DeviceSubRequest, str]] = field(default_factory=list)  # (request, chosen, column)
    nodes: set[str] | None = None  # pinned to these nodes (None: anywhere)
    fixed: bool = False  # devices held outside any pod (allocated and shared)
    problem: str | None = None
    gpus: int = 0  # devices of GPU classes (queue accounting)
    larger: list[str] = field(default_factory=list)  # requests asking more than some of their devices take (the
    # most of their kinds on different nodes), for explain


@dataclass
class DraState:
    """What the engines' DRA view was made from: devices with their kind, claims, the selector cache."""

    devices: list[DevRef]
    device_kind: list[int]  # per device: kind index (-1: no query selects it)
    kind_column: list[str]
    kind_queries: list[frozenset[Query]]
    claims: list[ClaimPlan]
    pod_claims: dict[str, list[int]]  # pod key -> indexes into claims
    selectors: SelectorCache
    class_selectors: dict[str, tuple[str, ...]]
    allocated: set[tuple[str, str, str]]  # (driver, pool, device) held by allocated claims
    specs: list[Device] = field(default_factory=list)  # per device: as the slice gives it
    column_share: dict[str, Device] = field(default_factory=dict)  # column of shared devices -> one of them
    # (its capacity names; what a share consumes is each device's own: a node has one kind of a column)
    consumed: dict[DeviceKey, dict[str, int]] = field(default_factory=dict)  # shared device -> taken by claims
    designated: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, shared column) -> device
    ranked: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (node, shared column) -> devices,
    # most free first (the designated one first): the j-th share of a request goes to the j-th
    share_ranks: dict[str, int] = field(default_factory=dict)  # shared column -> devices with columns of their
    # own (1, the designated one, unless a request takes several shares)
    counter_sets: dict[DeviceKey, dict[str, int]] = field(default_factory=dict)  # counter_key -> values
    column_counters: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # column -> per device
    out_of_play: set[int] = field(default_factory=set)  # devices on a counter set other than the designated one

    def counters_of(self, d: int) -> tuple[tuple[DeviceKey, tuple[tuple[str, int], ...]], ...]:
        """The counter sets a device consumes from and how much of each (empty: none), entries of one set added."""
        spec, dev = self.specs[d], self.devices[d]
        if not spec.consumes:
            return ()
        out: dict[DeviceKey, dict[str, int]] = {}
        for cs, amounts in spec.consumes:
            mine = out.setdefault(counter_key(dev.driver, dev.pool, cs), {})
            for c, v in amounts:
                mine[c] = mine.get(c, 0) + v
        return tuple((k, tuple(sorted(v.items()))) for k, v in out.items())

    def blocked_set(self, d: int, used: dict[DeviceKey, dict[str, int]]) -> DeviceKey | None:
        """The first counter set the device consumes from that lacks room for it (None: every one has room)."""
        for key, amounts in self.counters_of(d):
            have, taken = self.counter_sets.get(key, {}), used.get(key, {})
            if any(have.get(c, 0) - taken.get(c, 0) < v for c, v in amounts):
                return key
        return None

    def counters_fit(self, d: int, used: dict[DeviceKey, dict[str, int]]) -> bool:
        """Every counter set the device consumes from has room for it."""
        return self.blocked_set(d, used) is None

    def take_counters(self, d: int, used: dict[DeviceKey, dict[str, int]], sign: int = 1) -> None:
        for key, amounts in self.counters_of(d):
            mine = used.setdefault(key, {})
            for c, v in amounts:
                mine[c] = mine.get(c, 0) + sign * v

    def share_column(self, d: int, cap: str) -> str:
        """The capacity column a share on shared device `d` is counted in: its rank's on its node, or `~`."""
        col = self.kind_column[self.device_kind[d]]
        ranked = self.ranked.get((self.devices[d].node, col), [])
        rank = ranked.index(d) if d in ranked else len(ranked)
        if rank < self.share_ranks.get(col, 1):
            return cap_column(col, cap, rank=rank)
        return cap_column(col, cap, True)

    def key(self, d: int) -> DeviceKey:
        dev = self.devices[d]
        return (dev.driver, dev.pool, dev.name)

    def index_of(self, key: DeviceKey) -> int | None:
        if not hasattr(self, "_index"):
            self._index = {self.key(d): d for d in range(len(self.devices))}
        return self._index.get(key)

    def free_capacity(self, d: int, used: dict[DeviceKey, dict[str, int]]) -> dict[str, int]:
        taken = used.get(self.key(d), {})
        return {k: v - taken.get(k, 0) for k, v in self.specs[d].capacity.items()}

    def node_devices(self, node: str) -> list[int]:
        """The node's devices in slice order (indexed once)."""
        if not hasattr(self, "_by_node"):
            self._by_node: dict[str, list[int]] = defaultdict(list)
            for i, d in enumerate(self.devices):
                self._by_node[d.node].append(i)
        return self._by_node.get(node, [])

    def query_matches(self, q: Query, device: int) -> bool:
        """The class's and the request's selectors hold, the requested capacities fit the device (a shared
        device: its request policies accept them; another: it has at least that much) and the request tolerates
        its NoSchedule/NoExecute taints."""
        cls, sel, cap, tol = q
        if cls not in self.class_selectors:
            return False
        if cap and not self.capacity_fits(dict(cap), device):
            return False
        if self.specs[device].taints and self.specs[device].untolerated(tol) is not None:
            return False
        return self.selectors.all_match(self.class_selectors[cls], device) and self.selectors.all_match(sel, device)

    def capacity_fits(self, cap: dict[str, int], device: int) -> bool:
        spec, driver = self.specs[device], self.devices[device].driver
        if spec.multiple_allocations:
            return spec.consumption(cap, driver) is not None
        have = {k: v for k, v in spec.capacity.items()}
        return all(have.get(qualify(k, driver), -1) >= v for k, v in cap.items())


_CLAIMS = attrgetter("resource_claims")


def has_dra(pods: list[Pod], slices: list[ResourceSlice], any_pod_claims: bool | None = None) -> bool:
    """Whether the snapshot holds DRA devices or claims; `any_pod_claims`: whether some pod has claims, if known."""
    return bool(slices) or (any(map(_CLAIMS, pods)) if any_pod_claims is None else any_pod_claims)


def _newest(slices: list[ResourceSlice]) -> list[ResourceSlice]:
    """The slices of each (driver, pool)'s newest generation."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), s.generation), s.generation)
    return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]


def _current_slices(slices: list[ResourceSlice], warnings: list[str]) -> list[ResourceSlice]:
    """Per (driver, pool) only the slices of the newest generation (older ones are being replaced)."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        k = (s.driver, s.pool)
        newest[k] = max(newest.get(k, s.generation), s.generation)
    return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]


class _Reach:
    """The node a device is counted on. A node-local device: its node. A network-attached one (the slice's
    nodeSelector or allNodes, or the device's own with perDeviceNodeSelection), reachable from several nodes: an
    allocated one on the node of a running pod that reserves its claim, else the first node it reaches; the free
    ones of a slice (of a device's own selection) together on the reachable node with the fewest such devices so
    far (names break ties), so a device is given from one node per cycle."""

    def __init__(self, nodes: list[Node], pods: list[Pod], claims: list[ResourceClaim]) -> None:
        self.nodes = sorted(nodes, key=lambda n: n.name)
        where = {p.key: p.node_name for p in pods if p.node_name is not None and not p.finished}
        self.held: dict[DeviceKey, str] = {}
        for c in claims:
            on = [where[f"{c.meta.namespace}/{r.name}"] for r in c.reserved_for
                  if f"{c.meta.namespace}/{r.name}" in where]
            for r in c.allocation or ():
                if on:
                    self.held[(r.driver, r.pool, r.device)] = on[0]
        self.load: dict[str, int] = defaultdict(int)
        self.group_node: dict[Any, str] = {}

    def node_of(self, s: ResourceSlice, dv: Device) -> str | None:
        if s.node_name is not None:
            return s.node_name
        src: Any = (dv.node_name, dv.all_nodes, dv.node_selector) if s.per_device else (None, s.all_nodes,
                                                                                          s.node_selector)
        if src[0] is not None:
            return str(src[0])
        reach = [n.name for n in self.nodes if src[1] or any(t.matches(n.labels, n.name) for t in src[2])]
        if not reach:
            return None
        held = self.held.get((s.driver, s.pool, dv.name))
        if held in reach:
            return held
        group = (s.name, src if s.per_device else None)
        node = self.group_node.get(group)
        if node is None:
            node = self.group_node[group] = min(reach, key=lambda n: (self.load[n], n))
        self.load[node] += 1
        return node


def prepare(nodes: list[Node], pods: list[Pod], snapshot: object, warnings: list[str]) -> tuple[
        list[Node], list[Pod], DraState]:
    """Nodes and pods with DRA devices as columns and claims as requests, pins and affinities."""
    from kai_opt.snapshot import Snapshot
    assert isinstance(snapshot, Snapshot)
    b = _Builder(nodes, pods, snapshot, warnings)
    b.read_devices()
    b.resolve_claims()
    b.make_kinds()
    b.read_consumption()
    for cp in b.plans.values():
        b.plan_claim(cp)
    return b.node_objects(), b.pod_objects(), b.state


class _Builder:
    """The steps of `prepare`, sharing what they have found."""

    def __init__(self, nodes: list[Node], pods: list[Pod], snapshot: Any, warnings: list[str]) -> None:
        self.nodes, self.pods, self.snapshot, self.warnings = nodes, pods, snapshot, warnings
        self.class_selectors = {c.name: c.selectors for c in snapshot.device_classes}
        self.claims_by_key = {c.key: c for c in snapshot.resource_claims}
        self.templates = {t.key: t for t in snapshot.claim_templates}
        self.plans: dict[str, ClaimPlan] = {}
        self.pod_claims: dict[str, list[str]] = defaultdict(list)
        self.broken: dict[int, str] = {}
        self.per_node_col: dict[tuple[str, str], int] = defaultdict(int)  # (node, column) -> devices
        self.node_kinds: dict[str, set[int]] = defaultdict(set)  # node -> kinds of its devices
        self.fixed_held: dict[tuple[str, str], int] = defaultdict(int)  # (node, column) -> held by shared claims
        self._nodes_for: dict[tuple[str, frozenset[int]], tuple[set[str] | None, dict[str, int]]] = {}

    def read_devices(self) -> None:
        devices: list[DevRef] = []
        specs: list[Device] = []
        contexts = []
        counter_sets: dict[DeviceKey, dict[str, int]] = {}
        for s in _newest(self.snapshot.resource_slices):
            for name, values in s.shared_counters.items():
                counter_sets[counter_key(s.driver, s.pool, name)] = values
        place = _Reach(self.nodes, self.pods, self.snapshot.resource_claims)
        for s in _current_slices(self.snapshot.resource_slices, self.warnings):
            for dv in s.devices:
                node = place.node_of(s, dv)
                if node is None:
                    continue
                devices.append(DevRef(s.driver, s.pool, dv.name, node, s.name, s.generation))
                specs.append(dv)
                contexts.append(device_context(s.driver, dv))
        self.state = DraState(devices, [], [], [], [], {}, SelectorCache(contexts), self.class_selectors, set())
        self.state.specs = specs
        self.state.counter_sets = counter_sets
        for d, dv in enumerate(specs):
            unknown = [cs for cs, _ in dv.consumes if counter_key(devices[d].driver, devices[d].pool, cs)
                       not in counter_sets]
            if unknown:
                self.warnings.append(f"device {devices[d].pool}/{dv.name}: consumes counters of an unknown set "
                                     f"{unknown[0]}; it is not allocated")
                self.state.out_of_play.add(d)
        self.dev_index = {(d.driver, d.pool, d.name): i for i, d in enumerate(devices)}

    def resolve_claims(self) -> None:
        """Each pod's claims (by name, or the pod's own claim of a template) and every claim's users."""
        for i, p in enumerate(self.pods):
            if p.finished or not p.resource_claims:
                continue
            for pc in p.resource_claims:
                ns = p.namespace
                if pc.claim_name is not None:
                    key = f"{ns}/{pc.claim_name}"
                    claim = self.claims_by_key.get(key)
                    if claim is None:
                        self.broken[i] = f"resource claim {key} does not exist"
                        continue
                    cp = self.plans.setdefault(key, ClaimPlan(key, claim, None, []))
                else:
                    tkey = f"{ns}/{pc.template_name}"
                    if tkey not in self.templates:
                        self.broken[i] = f"resource claim template {tkey} does not exist"
                        continue
                    key = f"{ns}/{p.name}-{pc.name}"  # this pod's own claim, to be made from the template
                    cp = self.plans.setdefault(key, ClaimPlan(key, None, pc.template_name, []))
                cp.users.append(i)
                self.pod_claims[p.key].append(key)
        for key, rc in self.claims_by_key.items():  # allocated claims no pod uses still hold devices
            if key not in self.plans and rc.allocation is not None:
                self.plans[key] = ClaimPlan(key, rc, None, [])

    def spec_of(self, cp: ClaimPlan) -> ClaimSpec:
        if cp.claim is not None:
            return cp.claim.spec
        ns = cp.key.split("/", 1)[0]
        return self.templates[f"{ns}/{cp.template}"].spec

    def make_kinds(self) -> None:
        """Kinds (devices that every query treats alike), one column each, and their counts per node."""
        st = self.state
        queries: set[Query] = set()
        for cp in self.plans.values():
            for r in self.spec_of(cp).requests:
                for alt in r.alternatives:
                    queries.add(query_of(alt))
        for exprs in self.class_selectors.values():
            for e in exprs:
                st.selectors.compiled(e)
        ordered = sorted(queries, key=repr)
        sig_kind: dict[tuple[frozenset[Query], Any, str | None], int] = {}
        self.kind_share: list[Any] = []  # per kind: (shared devices' capacities and policies | None,
        # shared counters each device consumes | None)
        self.kind_device: list[int] = []  # per kind: its first device (a shared or counting kind has one driver)
        for d in range(len(st.devices)):
            sig = frozenset(q for q in ordered if st.query_matches(q, d))
            if not sig:
                st.device_kind.append(-1)
                continue
            spec = st.specs[d]
            share = (tuple(sorted(spec.capacity.items())), repr(sorted(spec.policies.items()))) \
                if spec.multiple_allocations else None
            ctr = st.counters_of(d)
            how = (share, tuple(sorted(a for _k, a in ctr)) if ctr else None)  # shared capacity, counters
            # per device (the amounts of each set it consumes from, whichever sets they are)
            at = (sig, how, st.devices[d].driver if how != (None, None) else None)  # (shared or counting
            # kinds: of one driver, so their columns' capacity and counter names are the driver's)
            k = sig_kind.get(at)
            if k is None:
                k = sig_kind[at] = len(st.kind_queries)
                st.kind_queries.append(sig)
                self.kind_share.append(how)
                self.kind_device.append(d)
            st.device_kind.append(k)
        for expr, why in st.selectors.errors.items():
            self.warnings.append(f"CEL selector {expr[:80]!r} does not compile ({why[:120]}); it selects no device")
        self.name_columns(ordered)
        for i, ref in enumerate(st.devices):
            if st.device_kind[i] >= 0:
                self.per_node_col[(ref.node, st.kind_column[st.device_kind[i]])] += 1
                self.node_kinds[ref.node].add(st.device_kind[i])

    def name_columns(self, queries: list[Query]) -> None:
        """One column per kind, except that the kinds a query spans share one column when no node has devices
        of two of them (nodes alike within: a query over a part of such a column is pinned to its nodes)."""
        st = self.state
        parent = list(range(len(st.kind_queries)))

        def root(k: int) -> int:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        on_node: dict[str, set[int]] = defaultdict(set)
        for i, ref in enumerate(st.devices):
            if st.device_kind[i] >= 0:
                on_node[ref.node].add(st.device_kind[i])
        for q in queries:
            ks = [k for k, sig in enumerate(st.kind_queries) if q in sig]
            for k in ks[1:]:
                a, b = root(ks[0]), root(k)
                if a == b:
                    continue
                merged = {x for x in range(len(parent)) if root(x) in (a, b)}
                if self.apart(ks[0], k) is None and all(len(kinds & merged) <= 1 for kinds in on_node.values()):
                    parent[b] = a
        groups: dict[int, list[int]] = defaultdict(list)
        for k in range(len(parent)):
            groups[root(k)].append(k)
        by_class: dict[str, list[list[int]]] = defaultdict(list)
        for g in groups.values():
            by_class[min(q[0] for k in g for q in st.kind_queries[k])].append(g)
        st.kind_column = [""] * len(st.kind_queries)
        for cls, gs in by_class.items():
            for j, g in enumerate(gs):
                for k in g:
                    st.kind_column[k] = f"dra:{cls}" if len(gs) == 1 else f"dra:{cls}#{j}"
        for d, k in enumerate(st.device_kind):
            if k >= 0 and self.kind_share[k][0] is not None:
                st.column_share.setdefault(st.kind_column[k], st.specs[d])
        for k, col in enumerate(st.kind_column):  # what one device takes of the designated set: the most any
            # kind of the column asks per counter (exact when the kinds' amounts are alike)
            if self.kind_share[k][1] is not None:
                st.column_counters[col] = self.most_counters([k], st.column_counters.get(col, ()))

    def apart(self, a: int, b: int) -> str | None:
        """Why kinds `a` and `b` cannot share a column even on different nodes (None: they can): a column
        has one rule: exclusive devices, or shared ones with the same capacities, and the same counters."""
        (sa, ca), (sb, cb) = self.kind_share[a], self.kind_share[b]
        if (sa is None) != (sb is None):
            return "shared and exclusive devices"
        drivers = {self.state.devices[self.kind_device[k]].driver for k in (a, b)}
        if (sa is not None or ca is not None or cb is not None) and len(drivers) > 1:
            return "devices of different drivers"
        if sa is not None and {c for c, _v in sa[0]} != {c for c, _v in sb[0]}:
            return "shared devices with different capacities"
        names = [None if c is None else {n for amounts in c for n, _v in amounts} for c in (ca, cb)]
        if names[0] != names[1]:
            return "devices consuming different shared counters"
        return None

    def most_counters(self, kinds: list[int], start: tuple[tuple[str, int], ...] = ()) -> tuple[tuple[str, int], ...]:
        """Per counter the most one device of these kinds takes of any one counter set (a device on several
        sets: the most any of them gives; kinds with different amounts: the largest, so never too little)."""
        most = dict(start)
        for k in kinds:
            for amounts in self.kind_share[k][1] or ():
                for c, v in amounts:
                    most[c] = max(most.get(c, 0), v)
        return tuple(sorted(most.items()))

    def read_consumption(self) -> None:
        """What allocated claims take of shared devices, and per node and shared column its designated device:
        the one with the most free (capacities by name), which the column measures and new shares go to first."""
        st = self.state
        for rc in self.snapshot.resource_claims:
            for r in rc.allocation or ():
                di = self.dev_index.get((r.driver, r.pool, r.device))
                if di is None or not st.specs[di].multiple_allocations or r.admin_access:
                    continue
                use = st.consumed.setdefault((r.driver, r.pool, r.device), {})
                for k, v in (r.consumed or st.specs[di].consumption({}, r.driver) or {}).items():
                    use[k] = use.get(k, 0) + v
        on: dict[tuple[str, str], list[tuple[tuple[tuple[int, ...], int], int]]] = defaultdict(list)
        for d, k in enumerate(st.device_kind):
            if k < 0 or self.kind_share[k][0] is None:
                continue
            free = st.free_capacity(d, st.consumed)
            on[(st.devices[d].node, st.kind_column[k])].append(((tuple(free[c] for c in sorted(free)), -d), d))
        st.ranked = {at: [d for _r, d in sorted(devs, reverse=True)] for at, devs in on.items()}
        st.designated = {at: devs[0] for at, devs in st.ranked.items()}
        for cp in self.plans.values():  # a request of several shares: each device of its column gets columns
            for r in self.spec_of(cp).requests:
                for alt in r.alternatives:
                    if alt.admin_access or (alt.mode == "ExactCount" and alt.count == 1):
                        continue
                    for k, sig in enumerate(st.kind_queries):
                        col = st.kind_column[k]
                        if query_of(alt) in sig and col in st.column_share and col not in st.share_ranks:
                            st.share_ranks[col] = max((len(v) for (_n, c), v in st.ranked.items() if c == col),
                                                      default=1)
        self.cap_back: dict[tuple[str, str], int] = defaultdict(int)  # (node, capacity column) -> pods' use
        self.read_counters()

    def read_counters(self) -> None:
        """What allocated devices take of shared counters, and per (node, driver) its designated counter set, the
        one with the most free (counters by name): new claims of the cycle take devices on it only (the others
        are out of play until a later cycle), so the counter columns are exact."""
        st = self.state
        allocated: set[DeviceKey] = set()
        for rc in self.snapshot.resource_claims:
            for r in rc.allocation or ():
                di = self.dev_index.get((r.driver, r.pool, r.device))
                if di is not None and not r.admin_access:
                    st.take_counters(di, st.consumed)
                    allocated.add((r.driver, r.pool, r.device))
        best: dict[tuple[str, str], tuple[tuple[tuple[int, ...], str], DeviceKey]] = {}
        for d, dev in enumerate(st.devices):
            if d in st.out_of_play:
                continue
            for key, _amounts in st.counters_of(d):
                have, taken = st.counter_sets[key], st.consumed.get(key, {})
                rank = (tuple(have[c] - taken.get(c, 0) for c in sorted(have)), "/".join(key))
                at = (dev.node, dev.driver)
                if at not in best or rank > best[at][0]:
                    best[at] = (rank, key)
        self.designated_set = {at: key for at, (_r, key) in best.items()}
        self.sets_on: dict[str, list[tuple[str, DeviceKey]]] = defaultdict(list)  # node -> (driver, set)
        for (n, drv), key in self.designated_set.items():
            self.sets_on[n].append((drv, key))
        self.out_free: dict[tuple[str, str], int] = defaultdict(int)  # (node, column) -> free devices out of play
        # a device on several sets is in play when one is the designated set and the others have room for all
        # such devices at once (their use is in no column): what those take of each other set so far
        others: dict[DeviceKey, dict[str, int]] = {}
        for d, dev in enumerate(st.devices):
            got = st.counters_of(d)
            if not got or st.key(d) in allocated:
                continue
            mine = self.designated_set.get((dev.node, dev.driver))
            rest = [(key, amounts) for key, amounts in got if key != mine]
            ok = d not in st.out_of_play and len(rest) < len(got)
            if ok and rest:
                after = {key: {c: others.get(key, {}).get(c, 0) + v for c, v in amounts} for key, amounts in rest}
                ok = all(st.counter_sets[key].get(c, 0) - st.consumed.get(key, {}).get(c, 0) >= v
                         for key, amounts in after.items() for c, v in amounts.items())
                if ok:
                    for key, amounts in after.items():
                        others.setdefault(key, {}).update(amounts)
            if not ok:
                st.out_of_play.add(d)
                if st.device_kind[d] >= 0:
                    self.out_free[(dev.node, st.kind_column[st.device_kind[d]])] += 1

    def plan_claim(self, cp: ClaimPlan) -> None:
        spec = self.spec_of(cp)
        for r in spec.requests:  # as KAI: `exactly` requests of a GPU class, All counting as one
            alt = r.alternatives[0]
            if len(r.alternatives) == 1 and is_gpu_class(alt.device_class):
                cp.gpus += alt.count if alt.mode == "ExactCount" else 1
        active = [u for u in cp.users if self.pods[u].node_name is not None or self.pods[u].nominated_node is not None]
        if cp.claim is not None and cp.claim.allocation is not None:
            self.plan_allocated(cp, cp.claim, active)
            return
        for r in spec.requests:
            if not self.plan_request(cp, r):
                break
        if cp.problem is None and spec.constraints:
            ok_nodes = _constraint_nodes(spec, cp, self.state, snapshot_nodes=[n.name for n in self.nodes])
            cp.nodes = ok_nodes if cp.nodes is None else cp.nodes & ok_nodes
        if cp.users:
            cp.holder = active[0] if active else cp.users[0]

    def plan_allocated(self, cp: ClaimPlan, claim: ResourceClaim, active: list[int]) -> None:
        """An allocated claim: pinned to its devices' node; held by its one user, else by the claim itself."""
        st = self.state
        nodes_of: set[str] = set()
        counts: dict[str, int] = defaultdict(int)
        shares: dict[tuple[str, str], int] = defaultdict(int)  # (node, capacity column) -> consumed
        for res in claim.allocation or ():
            di = self.dev_index.get((res.driver, res.pool, res.device))
            if di is None:
                continue
            nodes_of.add(st.devices[di].node)
            if st.specs[di].multiple_allocations:
                if st.device_kind[di] >= 0 and not res.admin_access:
                    for cap, v in (res.consumed or st.specs[di].consumption({}, res.driver) or {}).items():
                        shares[(st.devices[di].node, st.share_column(di, cap))] += v
                continue
            st.allocated.add((res.driver, res.pool, res.device))
            if st.device_kind[di] >= 0 and not res.admin_access:
                counts[st.kind_column[st.device_kind[di]]] += 1
                dev = st.devices[di]
                for key, amounts in st.counters_of(di):
                    other = self.designated_set.get((dev.node, dev.driver)) != key
                    for c, v in amounts:
                        shares[(dev.node, counter_column(dev.driver, c, other))] += v
        if not nodes_of and claim.allocation_nodes:
            nodes_of = {n.name for n in self.nodes if any(t.matches(n.labels, n.name) for t in claim.allocation_nodes)}
        cp.nodes = nodes_of if (nodes_of or claim.allocation) else None
        reservers = {ref.name for ref in claim.reserved_for}
        others = reservers - {self.pods[u].name for u in cp.users}
        if len(cp.users) == 1 and not others:
            cp.holder = cp.users[0]
            cp.demand = dict(counts)
            for (n, col), v in shares.items():  # the holder's consumption, given back to its node's column
                cp.demand[col] = cp.demand.get(col, 0) + v
                self.cap_back[(n, col)] += v
            return
        cp.fixed = True  # shared (or reserved by someone outside the snapshot): held by the claim itself
        for col, cnt in counts.items():
            for held_on in nodes_of:
                self.fixed_held[(held_on, col)] += cnt
                break
        pending = [u for u in cp.users if u not in active and self.pods[u].name not in reservers]
        if pending and len(reservers) >= MAX_CLAIM_CONSUMERS:
            cp.problem = f"claim {cp.key} is already reserved by {len(reservers)} consumers (the limit)"

    def plan_request(self, cp: ClaimPlan, r: DeviceRequest) -> bool:
        """Choose the request's alternative and add its devices to the claim's demand (False: unsatisfiable)."""
        st = self.state
        chosen: tuple[DeviceSubRequest, str, set[str] | None] | None = None
        fallback: tuple[DeviceSubRequest, str, set[str] | None] | None = None  # no node has enough of it
        why = f"request {r.name}: no device matches"
        for alt in r.alternatives:
            if alt.device_class not in self.class_selectors:
                why = f"request {r.name}: device class {alt.device_class} does not exist"
                continue
            q = query_of(alt)
            kinds = {k for k, sig in enumerate(st.kind_queries) if q in sig}
            cols = {st.kind_column[k] for k in kinds}
            if len(cols) > 1:
                why = f"request {r.name}: {self.why_split(kinds, len(cols))}"
                continue
            if not kinds:
                continue
            col = next(iter(cols))
            pin, have = self.nodes_for(col, frozenset(kinds))
            most = max(have.values(), default=0)
            if alt.mode == "ExactCount" and most < alt.count:
                fallback = fallback or (alt, col, pin)
                continue
            chosen = (alt, col, pin)
            break
        chosen = chosen or fallback  # too many devices: pending as short of them on every node
        if chosen is None:
            cp.problem = f"claim {cp.key}: {why}"
            return False
        alt, col, pin = chosen
        cp.requests.append((r.name, alt, col))
        if pin is not None:
            cp.nodes = pin if cp.nodes is None else cp.nodes & pin
        mine = [k for k, sig in enumerate(st.kind_queries) if query_of(alt) in sig]  # all in `col`
        have = self.nodes_for(col, frozenset(mine))[1]
        share = st.column_share.get(col)
        if share is not None and not alt.admin_access:  # a share on each of `n` distinct devices: the j-th on
            n = alt.count  # the node's j-th device by free capacity (its own columns)
            if alt.mode == "All":  # pinned to the nodes with the most, so every one of them gets a share
                n = max(have.values(), default=0)
                want = {nd for nd, c in have.items() if c == n}
                cp.nodes = want if cp.nodes is None else cp.nodes & want
            use: dict[str, int] = {}  # kinds of the column on different nodes: the most any of them takes
            takes = set()
            for k in mine:
                dev = self.kind_device[k]
                got = st.specs[dev].consumption(alt.capacity, st.devices[dev].driver) or {}
                takes.add(tuple(sorted(got.items())))
                for cap, v in got.items():
                    use[cap] = max(use.get(cap, 0), v)
            if len(takes) > 1:
                cp.larger.append(f"request {r.name}: each share counted as {use}, the most its devices on different "
                                 f"nodes take (some take less)")
            for j in range(n):
                for cap, v in use.items():
                    cp.demand[cap_column(col, cap, rank=j)] = cp.demand.get(cap_column(col, cap, rank=j), 0) + v
            return True
        per_device = self.most_counters(mine) if col in st.column_counters else ()
        if len({self.most_counters([k]) for k in mine}) > 1:
            cp.larger.append(f"request {r.name}: each device counted as {dict(per_device)} of its shared counters, "
                             f"the most its devices on different nodes take (some take less)")
        if alt.mode == "All":  # pinned to the nodes with the most, so the column request is exact
            top = max(have.values(), default=0)
            want = {n for n, c in have.items() if c == top}
            cp.nodes = want if cp.nodes is None else cp.nodes & want
            if not alt.admin_access:
                cp.demand[col] = cp.demand.get(col, 0) + top
                self.add_counters(cp, col, per_device, top)
        elif alt.admin_access:  # admin access sees devices without taking them
            want = {n for n, c in have.items() if c >= alt.count}
            cp.nodes = want if cp.nodes is None else cp.nodes & want
        else:
            cp.demand[col] = cp.demand.get(col, 0) + alt.count
            self.add_counters(cp, col, per_device, alt.count)
        return True

    def why_split(self, kinds: set[int], n: int) -> str:
        """Why a query over `kinds` (in `n` columns) is not placed: a node with devices of two of them, or
        kinds that cannot share a column."""
        two = sorted(nd for nd, ks in self.node_kinds.items() if len(ks & kinds) > 1)
        if two:
            return (f"its selectors match devices of {n} kinds and node {two[0]}"
                    + (f" (and {len(two) - 1} more)" if len(two) > 1 else "")
                    + " has devices of two of them (kai-opt places a request on devices of one kind per node)")
        ks = sorted(kinds)
        why = next((w for a in ks for b in ks if a < b and (w := self.apart(a, b)) is not None),
                   "some share a node with other kinds they would be counted with")
        return f"its selectors match devices of {n} kinds kai-opt counts apart ({why})"

    def add_counters(self, cp: ClaimPlan, col: str, per_device: tuple[tuple[str, int], ...], n: int) -> None:
        """The shared counters `n` devices of the column consume, in the counter columns of their driver."""
        if per_device:
            drv = self.driver_of(col)
            for c, v in per_device:
                cc = counter_column(drv, c)
                cp.demand[cc] = cp.demand.get(cc, 0) + n * v

    def driver_of(self, col: str) -> str:
        """The driver of a column's devices (a column's kinds come from one device class; the first device's)."""
        if not hasattr(self, "_driver"):
            st = self.state
            self._driver: dict[str, str] = {}
            for d, k in enumerate(st.device_kind):
                if k >= 0:
                    self._driver.setdefault(st.kind_column[k], st.devices[d].driver)
        return self._driver[col]

    def nodes_for(self, col: str, kinds: frozenset[int]) -> tuple[set[str] | None, dict[str, int]]:
        """(the nodes a query over `kinds` is pinned to, None: any; per node with such devices, how many), once
        per (column, kinds): the column's nodes whose devices are of these kinds, when it spans others too."""
        hit = self._nodes_for.get((col, kinds))
        if hit is None:
            st = self.state
            pin = None
            if any(c == col and k not in kinds for k, c in enumerate(st.kind_column)):
                pin = {n for n, ks in self.node_kinds.items() if ks & kinds}
            have = {n: c for (n, cc), c in self.per_node_col.items() if cc == col and c > 0
                    and (pin is None or n in pin)}
            hit = self._nodes_for[(col, kinds)] = (pin, have)
        return hit

    def node_objects(self) -> list[Node]:
        st = self.state
        out = []
        for node in self.nodes:
            extra = {col: max(0, self.per_node_col.get((node.name, col), 0) - self.fixed_held.get((node.name, col), 0)
                              - self.out_free.get((node.name, col), 0))
                     for col in st.kind_column if col not in st.column_share}
            n = node.name
            for drv, key in self.sets_on.get(n, []):
                taken = st.consumed.get(key, {})
                for c, v in st.counter_sets[key].items():
                    cc = counter_column(drv, c)
                    extra[cc] = max(0, v - taken.get(c, 0)) + self.cap_back.get((n, cc), 0)
                    extra[counter_column(drv, c, True)] = self.cap_back.get((n, counter_column(drv, c, True)), 0)
            for col, share in st.column_share.items():
                ranked = st.ranked.get((node.name, col), [])
                for j in range(st.share_ranks.get(col, 1)):
                    free = st.free_capacity(ranked[j], st.consumed) if j < len(ranked) else {}
                    for cap in share.capacity:
                        cc = cap_column(col, cap, rank=j)
                        extra[cc] = max(0, free.get(cap, 0)) + self.cap_back.get((node.name, cc), 0)
                for cap in share.capacity:
                    extra[cap_column(col, cap, True)] = self.cap_back.get((node.name, cap_column(col, cap, True)), 0)
            meta = node.meta.model_copy(update={"labels": {**node.labels, NODE_LABEL: node.name}})
            out.append(node.model_copy(update={"meta": meta, "allocatable": {**node.allocatable, **extra},
                                               "capacity": {**node.capacity, **extra}}))
        return out

    def pod_objects(self) -> list[Pod]:
        st = self.state
        claim_list = list(self.plans.values())
        index = {cp.key: i for i, cp in enumerate(claim_list)}
        st.claims = claim_list
        st.pod_claims = {k: [index[c] for c in v] for k, v in self.pod_claims.items()}
        out = list(self.pods)
        for i, p in enumerate(self.pods):
            keys = self.pod_claims.get(p.key)
            if keys or i in self.broken:
                out[i] = self.pod_object(i, p, keys or [], index)
        return out

    def pod_object(self, i: int, p: Pod, keys: list[str], index: dict[str, int]) -> Pod:
        """The pod with its held claims' devices as requests, its pins and its shared-claim affinities."""
        bound = p.node_name is not None
        req = dict(p.requests)
        pins: set[str] | None = None
        labels = dict(p.labels)
        affinity: list[PodAffinityTerm] = list(p.pod_affinity)
        problem = self.broken.get(i)
        gpus = 0
        for key in keys:
            cp = self.plans[key]
            gpus += cp.gpus
            if cp.problem and problem is None:
                problem = cp.problem
            if cp.holder == i:
                for col, cnt in cp.demand.items():
                    req[col] = req.get(col, 0) + cnt
            if cp.nodes is not None:
                pins = set(cp.nodes) if pins is None else pins & cp.nodes
            if not cp.fixed and len(cp.users) > 1:
                tag = f"{HOLDER_LABEL}{index[key]}"
                if cp.holder == i:
                    labels[tag] = "1"
                else:
                    affinity.append(PodAffinityTerm(selector=LabelSelector(match_labels={tag: "1"}),
                                                    topology_key=NODE_LABEL, namespaces=(p.namespace,)))
        if problem is not None and not bound:
            self.warnings.append(f"Pod {p.key}: {problem}; it is not scheduled")
            pins = set()
        update: dict[str, object] = {"requests": req, "dra_gpus": gpus}
        if labels != p.labels:
            update["meta"] = p.meta.model_copy(update={"labels": labels})
        if affinity != list(p.pod_affinity):
            update["pod_affinity"] = tuple(affinity)
        if pins is not None and (not bound or problem is None):  # a running pod is moved only where its
            update["dra_nodes"] = tuple(sorted(pins))  # claims' devices are (consolidation keeps it there)
        return p.model_copy(update=update)


def _constraint_nodes(spec: ClaimSpec, cp: ClaimPlan, state: DraState, snapshot_nodes: list[str]) -> set[str]:
    """Nodes where every matchAttribute constraint holds whichever devices of the chosen kinds are taken: the
    constrained requests' devices there share one value of the attribute."""
    ok: set[str] = set()
    col_of = {name: col for name, _, col in cp.requests}
    for n in snapshot_nodes:
        good = True
        for c in spec.constraints:
            cols = {col_of[r] for r in (c.requests or tuple(col_of)) if r in col_of}
            values = set()
            for d, dev in enumerate(state.devices):
                if dev.node != n or state.device_kind[d] < 0 or state.kind_column[state.device_kind[d]] not in cols:
                    continue
                attrs = state.selectors.contexts[d]["device"]["attributes"]
                domain, _, name = c.attribute.rpartition("/")
                values.add(repr(attrs.get(domain, {}).get(name)))
            if len(values) > 1 or "None" in values:
                good = False
                break
        if good:
            ok.add(n)
    return ok
