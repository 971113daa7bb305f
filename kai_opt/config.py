"""kai-opt configuration: one validated YAML file for `solve`, `simulate`, `bench`, `conformance` and `run`.

Every field has a default, so an empty file (or no file) is a valid configuration. Unknown keys are errors.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kai_opt.errors import ConfigError


class Strategy(StrEnum):
    binpack = "binpack"
    spread = "spread"


class Engine(StrEnum):
    greedy = "greedy"
    cpsat = "cpsat"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class Actions(_Model):
    """Which decisions a cycle may take (KAI's actions, in the order a cycle runs them)."""

    allocate: bool = Field(True, description="place pending work on free (or releasing) resources")
    consolidate: bool = Field(True, description="move preemptible running pods so pending work fits")
    reclaim: bool = Field(True, description="take resources back from queues above their fair share")
    preempt: bool = Field(True, description="evict lower-priority preemptible work of the same queue")
    stale_gang: bool = Field(True, description="evict running gangs that stayed below minMember")


class Placement(_Model):
    gpu: Strategy = Field(Strategy.binpack, description="node and device placement of GPU pods")
    cpu: Strategy = Field(Strategy.binpack, description="node placement of CPU-only pods")


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
    seed: int = Field(0, ge=0, description="random seed of the solver")
    max_model_pods: int = Field(20_000, ge=1, description="pending pods in one model; larger cycles use a window")
    objective: Objective = Objective()


class Config(_Model):
    engine: Engine = Field(Engine.greedy, description="greedy (KAI-like heuristics) or cpsat (optimization)")
    scheduler_names: tuple[str, ...] = Field(("kai-opt",), min_length=1, description="pods with these "
                                             "schedulerNames are scheduled by kai-opt")
    default_queue: str = Field("default-queue", description="queue of workloads that name none")
    actions: Actions = Actions()
    placement: Placement = Placement()
    max_consolidation_preemptees: int = Field(-1, ge=-1, description="victim jobs a consolidation may move "
                                              "(-1 = unlimited, 0 = consolidation off)")
    preempt_min_runtime_s: float = Field(0.0, ge=0, description="default when no queue in the tree sets "
                                         "preemptMinRuntime")
    reclaim_min_runtime_s: float = Field(0.0, ge=0, description="default when no queue sets reclaimMinRuntime")
    stale_gang_grace_s: float = Field(60.0, ge=0, description="how long a running gang may stay below "
                                      "minMember before it is evicted")
    reclaim_saturation_multiplier: float = Field(1.0, ge=1.0, description="reclaimer allocated x this must stay "
                                                 "within fair share (larger = more conservative)")
    schedule_period_s: float = Field(1.0, gt=0, le=3600, description="in-cluster: seconds between cycles")
    solver: Solver = Solver()


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror or exc}", source=str(p)) from exc
    try:
        data = yaml.safe_load(text) or {}
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
