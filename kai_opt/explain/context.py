"""What every explanation starts from: the cycle's inputs and plan, name lookups, and the cluster as the plan
leaves it (a greedy Session with the plan's evictions, moves and placements applied)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kai_opt.config import Config
from kai_opt.errors import NotFoundError
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import Session
from kai_opt.plan import Placement, Plan
from kai_opt.state import ClusterState


@dataclass
class Context:
    state: ClusterState
    config: Config
    plan: Plan
    fs: FairShare
    _after: Session | None = field(default=None, repr=False)
    _placer: Placer | None = field(default=None, repr=False)
    _by_group: dict[int, list[Placement]] | None = field(default=None, repr=False)

    # -- the cluster after the plan ------------------------------------------------------------------------------
    @property
    def after(self) -> Session:
        """A session with the whole plan applied (built once)."""
        if self._after is None:
            self._after = Session(self.state, self.fs, self.config)
            apply_plan(self._after, self.plan)
        return self._after

    @property
    def placer(self) -> Placer:
        """The greedy engine's filter and scores over `after`."""
        if self._placer is None:
            self._placer = Placer(self.after)
        return self._placer

    def placements_of(self, g: int) -> list[Placement]:
        """The plan's placements (not consolidation moves) of podgroup g, in pod order."""
        if self._by_group is None:
            self._by_group = {}
            for pl in sorted(self.plan.placements, key=lambda x: x.pod):
                if not pl.moved:
                    self._by_group.setdefault(int(self.state.pod_pg[pl.pod]), []).append(pl)
        return self._by_group.get(g, [])

    # -- names ---------------------------------------------------------------------------------------------------
    def pod(self, key: str) -> int:
        return find_pod(self.state, key)

    def podgroup(self, key: str) -> int:
        return find_podgroup(self.state, key)

    def queue(self, name: str) -> int:
        return find_queue(self.state, name)


def find_pod(state: ClusterState, key: str) -> int:
    p = state.pod_index.get(_with_namespace(key))
    if p is None:
        raise NotFoundError(f"pod {key!r} not found in the snapshot")
    return p


def find_podgroup(state: ClusterState, key: str) -> int:
    g = state.pg_index.get(_with_namespace(key))
    if g is None:
        raise NotFoundError(f"podgroup {key!r} not found in the snapshot")
    return g


def find_queue(state: ClusterState, name: str) -> int:
    q = state.q_index.get(name)
    if q is None:
        raise NotFoundError(f"queue {name!r} not found in the snapshot")
    return q


def _with_namespace(key: str) -> str:
    """NS/NAME as given; a bare NAME means the default namespace."""
    return key if "/" in key else f"default/{key}"


def apply_plan(sess: Session, plan: Plan, *, skip: set[int] | frozenset[int] = frozenset()) -> None:
    """Replay a plan on a fresh session: evictions, then consolidation moves, then placements (pods in `skip`
    are left out). Pipelined placements claim what the evictions release, as they did when planned."""
    st = sess.state
    for e in plan.evictions:
        sess.evict(e.pod, e.reason, e.beneficiary)
    for pl in plan.placements:
        if pl.pod in skip:
            continue
        devices = tuple(int(st.dev_start[pl.node]) + d for d in pl.devices)
        sess.place(pl.pod, pl.node, devices, pipelined=pl.pipelined or pl.moved, moved=pl.moved)


def node_domain(state: ClusterState, topo: int, level: int, n: int) -> str | None:
    """Name of node n's domain at `level` of topology `topo` (None: not labelled)."""
    d = int(state.topologies[topo].domain[level][n])
    return state.topologies[topo].domain_names[level][d] if d >= 0 else None


def qty(resource: str, value: float) -> str:
    """A queue quantity (KAI units: GPUs, millicores, bytes) for people; -1 is unlimited."""
    if value == -1:
        return "unlimited"
    if resource == "gpu":
        return f"{value:g} GPU{'' if value == 1 else 's'}"
    if resource == "cpu":
        return f"{value / 1000:g} CPU cores"
    return f"{value / 2**30:.4g} GiB"
