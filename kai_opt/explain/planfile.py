"""A plan read back from its JSON form (`kai-opt solve -o json`), so `explain --plan` explains a cycle that was
already computed (by the scheduler, or by an earlier run) instead of running one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kai_opt.errors import InputError
from kai_opt.plan import Eviction, Placement, Plan, Reason, SolverInfo
from kai_opt.state import ClusterState


def load_plan(path: str | Path, state: ClusterState) -> Plan:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read plan: {exc}", source=str(p)) from exc
    try:
        return plan_from_dict(data, state)
    except KeyError as exc:
        raise InputError(f"the plan names {exc.args[0]!r}, which the snapshot does not have", source=str(p)) from exc


def plan_from_dict(data: dict[str, Any], state: ClusterState) -> Plan:
    pods, nodes, groups = state.pod_index, state.node_index, state.pg_index

    def placement(e: dict[str, Any], pipelined: bool, moved: bool = False) -> Placement:
        return Placement(pods[e["pod"]], nodes[e["node"]], tuple(e.get("gpu_devices", ())), pipelined, moved)

    placements = [placement(e, False) for e in data.get("binds", [])]
    placements += [placement(e, True) for e in data.get("pipelines", [])]
    placements += [placement(e, True, True) for e in data.get("moves", [])]
    evictions = [Eviction(pods[e["pod"]], e["reason"], groups[e["beneficiary"]] if e.get("beneficiary") else -1)
                 for e in data.get("evictions", [])]
    pending = {groups[e["podgroup"]]: [Reason(r["code"], r["message"], r.get("details") or {})
                                       for r in e.get("reasons", [])] for e in data.get("pending", [])}
    solver = data.get("solver") or {}
    info = SolverInfo(**{k: v for k, v in solver.items() if k in SolverInfo.__dataclass_fields__})
    return Plan(engine=data.get("engine", "greedy"), placements=sorted(placements, key=lambda x: (x.moved, x.pod)),
                evictions=sorted(evictions, key=lambda e: e.pod), pending=pending, solver=info)
