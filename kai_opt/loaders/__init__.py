"""One entry point for every snapshot format, chosen by content:

(a) Kubernetes objects as kubectl writes them: a `List`, multi-document YAML, JSON, or a directory of such files;
(b) KAI-Scheduler's snapshot ZIP (`snapshot.json` with `rawObjects`);
(c) kai-opt's native scenario YAML (`kind: Scenario`), written by hand;
(d) a KAI-Scheduler behaviour case (the schema of ../shared/scenarios/kai), used by `kai-opt conformance`.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from kai_opt.errors import InputError
from kai_opt.gcpause import FREEZE_MIN_OBJECTS, gc_paused
from kai_opt.limits import ceiling, check_counts
from kai_opt.loaders.documents import read_documents
from kai_opt.loaders.kubeobjects import objects_from_documents
from kai_opt.snapshot import Snapshot

_CASE_SNAPSHOT_FAILED = "snapshot: "  # kaicase.build_case's reason when the case's objects do not load


def load_snapshot(path: str | Path, *, scheduler_names: tuple[str, ...] | None = None,
                  now: float | None = None) -> Snapshot:
    """Read any supported snapshot file or directory into a validated `Snapshot` (strict: errors raise).

    The cyclic GC is paused while the file is read and parsed, and a big snapshot is frozen out of its reach
    afterwards (kai_opt.gcpause): collections during a large load find nothing to free."""
    with gc_paused(freeze_above=FREEZE_MIN_OBJECTS):
        snap = _load(Path(path), scheduler_names, now)
    # the state allocates a slot per GPU device: bounded before it is built
    check_counts({"GPU devices": sum(n.gpus for n in snap.nodes)}, source=snap.source or str(path))
    return snap


def _load(p: Path, scheduler_names: tuple[str, ...] | None, now: float | None) -> Snapshot:
    if not p.exists():
        raise InputError("no such file or directory", source=str(p))
    if p.is_file() and zipfile.is_zipfile(p):
        from kai_opt.loaders.kaizip import load_kai_zip

        return load_kai_zip(p, scheduler_names=scheduler_names, now=now)
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in (".yaml", ".yml", ".json")) \
        if p.is_dir() else [p]
    if p.is_dir() and not files:
        raise InputError("directory holds no .yaml, .yml or .json files", source=str(p))
    if p.is_dir():
        total, limit = sum(f.stat().st_size for f in files), ceiling("MAX_INPUT_BYTES")
        if total > limit:  # each file is bounded when read; a directory is bounded as a whole, before reading
            raise InputError(f"directory holds {total:,} bytes of .yaml/.yml/.json files, above the limit of "
                             f"{limit:,} (set KAI_OPT_MAX_INPUT_BYTES to raise it)", source=str(p))
    docs = [d for f in files for d in read_documents(f)]
    if not docs:  # an empty file, comments only, /dev/null: a mistake, never an empty cluster
        raise InputError("holds no objects (empty, or comments only)", source=str(p))
    scenario_docs = [d for d in docs if isinstance(d.data, dict) and d.data.get("kind") == "Scenario"]
    if scenario_docs and (len(files) > 1 or len(docs) > 1):
        where = scenario_docs[0]
        raise InputError("a Scenario must be the only document of its file, and a snapshot directory cannot "
                         "hold one", source=where.source, line=where.line, obj="Scenario")
    if len(files) == 1 and docs:
        first = docs[0].data
        if isinstance(first, dict) and first.get("kind") == "Scenario":
            from kai_opt.loaders.scenario import snapshot_from_scenario

            return snapshot_from_scenario(docs[0], scheduler_names=scheduler_names, now=now)
        if isinstance(first, dict) and "expected" in first and "jobs" in first and "nodes" in first:
            from kai_opt.loaders.kaicase import load_case

            case = load_case(p)
            broken = next((r for r in case.unsupported if r.startswith(_CASE_SNAPSHOT_FAILED)), None)
            if broken is not None:  # conformance skips such a case; as a snapshot it would be an empty cluster
                raise InputError(broken.removeprefix(_CASE_SNAPSHOT_FAILED))
            return case.snapshot
    objects = list(objects_from_documents(docs))
    if not objects:
        raise InputError("holds no objects (an empty list)", source=str(p))
    kinds: dict[str, int] = {}
    for o in objects:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    check_counts(kinds, source=str(p))  # before any object is parsed
    return Snapshot.from_objects(objects, scheduler_names=scheduler_names, now=now, source=str(p))
