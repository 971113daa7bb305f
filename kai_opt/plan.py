"""The plan of one cycle: binds, pipelines, evictions (with reason and beneficiary) and pending reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kai_opt.actions import EVICTION_REASONS as EVICTION_REASONS  # re-exported: derived from the actions
from kai_opt.state import ClusterState

# An optional stage of a cycle that failed, and how: the cycle goes on with the verified greedy plan, the failure
# counted in SolverInfo.failures (kai_opt_solver_failures_total{stage,kind} in a cluster) and named in the note.
FAILURE_STAGES = ("cpsat", "decode", "second_hint", "greedy", "pattern_hint")  # the CP-SAT worker (scope, model,
# hint, solve, the check of its plan) and its solver sub-worker; decoding the solution; the FGD-scored greedy plan
# computed beside; the greedy plan itself, planned again without the nodes its checker violation named
# (engine._verified_greedy); the greedy plan guided by the pattern model (formulation/pattern_plan.py)
FAILURE_KINDS = ("exception", "crash", "timeout", "violation")  # raised; died without a message (signal, out of
# memory, broken pipe); killed by a hard watchdog; its plan failed the checker


def failure_note(stage: str, kind: str, detail: str) -> str:
    """The words a plan's note uses for a failed stage: the stage and kind first, then what happened."""
    return f"{stage} {kind}: {detail}"


@dataclass(frozen=True)
class Placement:
    pod: int
    node: int
    devices: tuple[int, ...] = ()  # device indexes within the node (0-based)
    pipelined: bool = False  # waits for resources that evictions are releasing
    moved: bool = False  # a running pod re-placed by consolidation (it is also evicted)


@dataclass(frozen=True)
class Eviction:
    pod: int
    reason: str  # one of EVICTION_REASONS
    beneficiary: int = -1  # podgroup index the eviction makes room for (-1: none, stale-gang)


# a pending reason: the group was placed in this cycle, then a later victim search took the placement back (KAI's
# victims include pods placed in the same session); its evictions' beneficiaries may be such groups (the checker)
WITHDRAWN = "PlacementWithdrawn"


@dataclass(frozen=True)
class Reason:
    """Why a podgroup stays pending: a machine-readable code, a message, optional details."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class SolverInfo:
    status: str = "HEURISTIC"  # OPTIMAL | FEASIBLE | FALLBACK_GREEDY | HEURISTIC | ...
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    wall_s: float = 0.0
    build_s: float = 0.0
    solve_s: float = 0.0
    decode_s: float = 0.0
    note: str | None = None
    hint: str | None = None  # CP-SAT: the greedy plan it started from or kept, kai (KAI-scored), fgd (FGD-scored) or
    # pattern (guided by the pattern model: formulation/pattern_plan.py)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (stage, kind) of each optional stage that
    # failed this cycle (FAILURE_STAGES, FAILURE_KINDS); the note says what happened

    def add_failure(self, stage: str, kind: str, detail: str) -> None:
        """Count a failed optional stage and name it at the end of the note (the plan itself stays)."""
        self.failures.append((stage, kind))
        said = failure_note(stage, kind, detail)
        self.note = f"{self.note}; {said}" if self.note else said

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != []}


@dataclass
class Plan:
    engine: str
    placements: list[Placement] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    pending: dict[int, list[Reason]] = field(default_factory=dict)  # podgroup -> reasons
    solver: SolverInfo = field(default_factory=SolverInfo)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    turns: list[int] = field(default_factory=list)  # podgroups in the order the engine first placed a pod of
    # theirs (its decision order; empty when not known)

    @property
    def binds(self) -> list[Placement]:
        return [p for p in self.placements if not p.pipelined and not p.moved]

    @property
    def pipelines(self) -> list[Placement]:
        return [p for p in self.placements if p.pipelined and not p.moved]

    @property
    def moves(self) -> list[Placement]:
        return [p for p in self.placements if p.moved]

    def placed_pods(self) -> set[int]:
        return {p.pod for p in self.placements if not p.moved}

    def to_dict(self, state: ClusterState) -> dict[str, Any]:
        """JSON form (`kai-opt solve -o json`)."""

        def pod_entry(p: Placement) -> dict[str, Any]:
            g = int(state.pod_pg[p.pod])
            return {"pod": state.pods[p.pod].key, "podgroup": state.pg_keys[g] if g >= 0 else None,
                    "node": state.node_names[p.node], "gpu_devices": list(p.devices)}

        evicted_for = {e.pod: e for e in self.evictions}
        out_evictions = []
        for e in self.evictions:
            g = int(state.pod_pg[e.pod])
            node = int(state.pod_node[e.pod])
            out_evictions.append({
                "pod": state.pods[e.pod].key,
                "podgroup": state.pg_keys[g] if g >= 0 else None,
                "node": state.node_names[node] if node >= 0 else None,
                "reason": e.reason,
                "beneficiary": state.pg_keys[e.beneficiary] if e.beneficiary >= 0 else None,
            })
        pipelines = []
        for p in self.pipelines:
            entry = pod_entry(p)
            entry["waits_for"] = sorted(state.pods[v].key for v, e in evicted_for.items()
                                        if int(state.pod_node[v]) == p.node)
            pipelines.append(entry)
        return {
            "engine": self.engine,
            "solver": self.solver.as_dict(),
            "binds": [pod_entry(p) for p in self.binds],
            "pipelines": pipelines,
            "moves": [pod_entry(p) for p in self.moves],
            "evictions": out_evictions,
            "pending": [{"podgroup": state.pg_keys[g],
                         "reasons": [{"code": r.code, "message": r.message, **({"details": r.details}
                                                                               if r.details else {})}
                                     for r in reasons]}
                        for g, reasons in sorted(self.pending.items())],
            "phases": {k: round(v, 6) for k, v in self.phases.items()},
        }
