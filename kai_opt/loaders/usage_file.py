"""A usage file (`kai-opt solve|simulate|fairshare --usage FILE`): past usage for time-based fair share, offline.

    # resource-seconds: gpu in GPU-seconds, cpu in core-seconds, memory in byte-seconds
    window_capacity: {gpu: 1382400}     # what the cluster could have given in the window (16 GPUs x 1 day)
    queues:
      team-a: {gpu: 1382400}            # what each queue (a parent: its subtree) used in the window
      team-b: {gpu: 0}

Both sides are taken as already decayed (as KAI's range queries return them); a queue's usage is its amount over
the window capacity of the same resource. YAML or JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kai_opt.errors import InputError
from kai_opt.fairshare.history import HistoricalUsage, normalize
from kai_opt.textfile import check_yaml_aliases, check_yaml_depth, read_text

CPU_MILLI = 1000.0  # core-seconds in the file, millicore-seconds in kai-opt's queue units


class _Amounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    gpu: float = Field(0.0, ge=0)
    cpu: float = Field(0.0, ge=0)
    memory: float = Field(0.0, ge=0)

    def vector(self) -> np.ndarray:
        """kai-opt queue units (gpu, cpu millicores, memory bytes) times seconds."""
        return np.array([self.gpu, self.cpu * CPU_MILLI, self.memory])


class _UsageFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    window_capacity: _Amounts
    queues: dict[str, _Amounts] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _capacity(self) -> _UsageFile:
        cap = self.window_capacity
        for name, used in self.queues.items():
            for res in ("gpu", "cpu", "memory"):
                if getattr(used, res) > 0 and getattr(cap, res) <= 0:
                    raise ValueError(f"queue {name!r} used {res} but window_capacity.{res} is 0")
        return self


@dataclass(frozen=True)
class UsageFile:
    """Raw amounts (kai-opt queue units x seconds) and their normalised form."""

    capacity: np.ndarray  # float64[3]
    used: dict[str, np.ndarray]

    def history(self) -> HistoricalUsage:
        return normalize(self.used, self.capacity)


def load_usage_file(path: Path) -> UsageFile:
    text = read_text(path, what="usage file")
    source = str(path)
    check_yaml_depth(text, source)
    try:
        data = yaml.safe_load(text)
        check_yaml_aliases(text, data, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source,
                         line=mark.line + 1 if mark else None) from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"invalid YAML: {exc}", source=source) from None
    if not isinstance(data, dict):
        raise InputError("a usage file must be a mapping with window_capacity and queues", source=source)
    try:
        parsed = _UsageFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or None
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise InputError(msg, source=source, obj="usage", field=field) from None
    return UsageFile(parsed.window_capacity.vector(), {k: v.vector() for k, v in parsed.queues.items()})
