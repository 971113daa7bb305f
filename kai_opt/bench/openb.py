"""Readers for the openb GPU-cluster trace (Alibaba, USENIX ATC '23 FGD paper) into numpy arrays.

The trace is not shipped with kai-opt. It lives in alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv:
node lists (`sn,cpu_milli,memory_mib,gpu,model`) and pod lists, which have 11 columns
(`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`)
except the `multigpu*` files, which have the first 5. Only CPU, memory, GPU count, per-GPU milli share and the
allowed GPU models (`gpu_spec`, `|`-separated, empty = any) are used; the time columns are ignored, as in the
paper's simulator.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kai_opt.errors import InputError

MILLI = 1000
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
               "creation_time", "deletion_time", "scheduled_time")
POD_COLUMNS_SHORT = POD_COLUMNS[:5]

DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"


@dataclass(frozen=True)
class NodeList:
    """Cluster nodes, one array entry per CSV row."""

    source: str
    names: tuple[str, ...]
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    gpus: np.ndarray  # int64, number of physical GPUs
    model: tuple[str, ...]  # GPU model, "" for CPU-only nodes

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * MILLI


@dataclass(frozen=True)
class PodList:
    """Pods (tasks), one array entry per CSV row, in file order."""

    source: str
    names: tuple[str, ...]
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    num_gpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64, share of each requested GPU (1000 = whole)
    gpu_spec: tuple[str, ...]  # allowed models joined by "|", "" = any

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_milli(self) -> np.ndarray:
        """Each pod's whole GPU request in milli-GPUs."""
        return self.num_gpu * self.gpu_milli


def default_trace_dir(repo_root: Path | None = None) -> Path | None:
    """`../shared/data/openb` beside the repository checkout, if it holds the default files."""
    root = repo_root or Path(__file__).resolve().parents[2]
    d = root.parent / "shared" / "data" / "openb"
    return d if (d / DEFAULT_NODES).is_file() and (d / DEFAULT_PODS).is_file() else None


def _rows(path: Path, allowed: tuple[tuple[str, ...], ...]) -> Iterator[tuple[int, list[str], tuple[str, ...]]]:
    """(line number, fields, header) for each non-blank data row; checks the header and the column count."""
    src = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src) from None
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", source=src) from None
    reader = csv.reader(text.splitlines())
    header: tuple[str, ...] | None = None
    for lineno, fields in enumerate(reader, start=1):
        if not fields or all(not f.strip() for f in fields):
            continue
        if header is None:
            got = tuple(f.strip() for f in fields)
            if got not in allowed:
                want = " or ".join(",".join(h) for h in allowed)
                raise InputError(f"unexpected header {','.join(got)!r}; expected {want}", source=src, line=lineno)
            header = got
            continue
        if len(fields) != len(header):
            raise InputError(f"expected {len(header)} columns, got {len(fields)}", source=src, line=lineno)
        yield lineno, fields, header
    if header is None:
        raise InputError("empty file (no header)", source=src)


def _int(value: str, *, src: str, line: int, column: str, lo: int = 0, hi: int | None = None) -> int:
    try:
        v = int(value.strip())
    except ValueError:
        raise InputError(f"not an integer: {value!r}", source=src, line=line, field=column) from None
    if v < lo or (hi is not None and v > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise InputError(f"{v} out of range (must be {bound})", source=src, line=line, field=column)
    return v


def read_nodes(path: str | Path) -> NodeList:
    """Read an openb node list (`sn,cpu_milli,memory_mib,gpu,model`)."""
    p = Path(path)
    src = str(p)
    names: list[str] = []
    cols: list[list[int]] = [[], [], []]
    models: list[str] = []
    for line, f, _ in _rows(p, (NODE_COLUMNS,)):
        name = f[0].strip()
        if not name:
            raise InputError("empty node name", source=src, line=line, field="sn")
        for j, col in enumerate(("cpu_milli", "memory_mib", "gpu")):
            cols[j].append(_int(f[j + 1], src=src, line=line, column=col))
        model = f[4].strip()
        if cols[2][-1] > 0 and not model:
            raise InputError("a node with GPUs needs a GPU model", source=src, line=line, field="model")
        names.append(name)
        models.append(model)
    if not names:
        raise InputError("no nodes", source=src)
    cpu, mem, gpus = (np.asarray(c, dtype=np.int64) for c in cols)
    return NodeList(src, tuple(names), cpu, mem, gpus, tuple(models))


def read_pods(path: str | Path) -> PodList:
    """Read an openb pod list (11 columns, or the 5 of the `multigpu*` files)."""
    p = Path(path)
    src = str(p)
    names: list[str] = []
    cols: list[list[int]] = [[], [], [], []]
    specs: list[str] = []
    for line, f, _header in _rows(p, (POD_COLUMNS, POD_COLUMNS_SHORT)):
        name = f[0].strip()
        if not name:
            raise InputError("empty pod name", source=src, line=line, field="name")
        cpu = _int(f[1], src=src, line=line, column="cpu_milli")
        mem = _int(f[2], src=src, line=line, column="memory_mib")
        num = _int(f[3], src=src, line=line, column="num_gpu")
        milli = _int(f[4], src=src, line=line, column="gpu_milli", hi=MILLI)
        if (num == 0) != (milli == 0):
            raise InputError(f"num_gpu {num} with gpu_milli {milli}: both must be 0 or both positive",
                             source=src, line=line, field="gpu_milli")
        if num > 1 and milli != MILLI:
            raise InputError(f"a pod with {num} GPUs must request whole GPUs (gpu_milli 1000), got {milli}",
                             source=src, line=line, field="gpu_milli")
        spec = "|".join(s.strip() for s in f[5].split("|") if s.strip()) if len(f) > 5 else ""
        names.append(name)
        for j, v in enumerate((cpu, mem, num, milli)):
            cols[j].append(v)
        specs.append(spec)
    if not names:
        raise InputError("no pods", source=src)
    cpu_a, mem_a, num_a, milli_a = (np.asarray(c, dtype=np.int64) for c in cols)
    return PodList(src, tuple(names), cpu_a, mem_a, num_a, milli_a, tuple(specs))
