"""KAI-Scheduler's snapshot ZIP: `snapshot.json` = {config, schedulerParams, rawObjects: {pods, nodes, ...}}."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from kai_opt.errors import InputError
from kai_opt.snapshot import RawObject, Snapshot

SNAPSHOT_FILE = "snapshot.json"
# rawObjects key -> kind (objects inside carry no TypeMeta when marshalled from listers)
RAW_KINDS = {
    "pods": "Pod",
    "nodes": "Node",
    "queues": "Queue",
    "podGroups": "PodGroup",
    "priorityClasses": "PriorityClass",
    "topologies": "Topology",
}
KAI_DEFAULT_SCHEDULER = "kai-scheduler"


def load_kai_zip(path: Path, *, scheduler_names: tuple[str, ...] | None = None,
                 now: float | None = None) -> Snapshot:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            member = SNAPSHOT_FILE if SNAPSHOT_FILE in names else next(
                (n for n in names if n.endswith("/" + SNAPSHOT_FILE)), None)
            if member is None:
                raise InputError(f"zip holds no {SNAPSHOT_FILE}", source=str(path))
            data = json.loads(zf.read(member))
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"cannot read zip: {exc}", source=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON in {SNAPSHOT_FILE}: {exc.msg}", source=f"{path}!{SNAPSHOT_FILE}",
                         line=exc.lineno) from exc
    raw = data.get("rawObjects") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise InputError("snapshot.json has no rawObjects", source=f"{path}!{SNAPSHOT_FILE}")
    source = f"{path}!{SNAPSHOT_FILE}"
    objects = [RawObject(kind, obj, source, None)
               for key, kind in RAW_KINDS.items() for obj in (raw.get(key) or [])]
    params = data.get("schedulerParams") or {}
    names = scheduler_names or (str(params.get("SchedulerName") or params.get("schedulerName")
                                    or KAI_DEFAULT_SCHEDULER),)
    return Snapshot.from_objects(objects, scheduler_names=names, now=now, source=source)
