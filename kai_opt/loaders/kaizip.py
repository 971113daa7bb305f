"""KAI-Scheduler's snapshot ZIP: `snapshot.json` = {config, schedulerParams, rawObjects: {pods, nodes, ...}}.

The member is judged before it is read: stored or deflate only, not encrypted, a declared size within
MAX_INPUT_BYTES and a compression ratio within MAX_ZIP_RATIO; while streaming, it may not grow past its declared
size. Member names are only compared with `snapshot.json`, never used as paths.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from kai_opt.errors import InputError
from kai_opt.limits import ceiling, check_counts
from kai_opt.loaders.documents import parse_json
from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.textfile import decode

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
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_CHUNK = 1 << 20


def load_kai_zip(path: Path, *, scheduler_names: tuple[str, ...] | None = None,
                 now: float | None = None) -> Snapshot:
    source = f"{path}!{SNAPSHOT_FILE}"
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            info = next((i for i in infos if i.filename == SNAPSHOT_FILE), None) or next(
                (i for i in infos if i.filename.endswith("/" + SNAPSHOT_FILE)), None)
            if info is None:
                raise InputError(f"zip holds no {SNAPSHOT_FILE}", source=str(path))
            raw_bytes = _read_member(zf, info, path.stat().st_size, source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise InputError(f"cannot read zip: {exc}", source=str(path)) from exc
    except (NotImplementedError, RuntimeError) as exc:  # an unsupported method or encryption we did not see
        raise InputError(f"cannot read zip member: {exc}", source=source) from exc
    data = parse_json(decode(raw_bytes, source), source)
    raw = data.get("rawObjects") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise InputError("snapshot.json has no rawObjects", source=source)
    lists = {kind: _list(raw.get(key), source, key) for key, kind in RAW_KINDS.items()}
    check_counts({kind: len(items) for kind, items in lists.items()}, source=source)
    objects = [RawObject(kind, obj, source, None) for kind, items in lists.items() for obj in items]
    if not objects:
        raise InputError("rawObjects holds no objects", source=source)
    params = data.get("schedulerParams") or {}
    if not isinstance(params, dict):
        params = {}
    names = scheduler_names or (str(params.get("SchedulerName") or params.get("schedulerName")
                                    or KAI_DEFAULT_SCHEDULER),)
    return Snapshot.from_objects(objects, scheduler_names=names, now=now, source=source)


def _list(value: Any, source: str, key: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"expected a list, got {type(value).__name__}", source=source,
                         field=f"rawObjects.{key}")
    return value


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, archive_size: int, source: str) -> bytearray:
    """The member's bytes, refused before reading when its method, encryption or sizes are not acceptable, and
    while reading when it grows past its declared size (a header that lies)."""
    if info.flag_bits & 0x1:
        raise InputError("member is encrypted; kai-opt reads unencrypted snapshots only", source=source)
    if info.compress_type not in _METHODS:
        raise InputError(f"member uses compression method {info.compress_type}; kai-opt reads stored or deflate "
                         "only", source=source)
    limit = ceiling("MAX_INPUT_BYTES")
    if info.file_size > limit:
        raise InputError(f"member declares {info.file_size:,} bytes, above the limit of {limit:,} (set "
                         "KAI_OPT_MAX_INPUT_BYTES to raise it)", source=source)
    if info.compress_size > archive_size:
        raise InputError("member declares more compressed bytes than the archive holds", source=source)
    ratio = ceiling("MAX_ZIP_RATIO")
    if info.file_size > _CHUNK and info.file_size > ratio * max(1, info.compress_size):
        raise InputError(f"member would expand {info.file_size / max(1, info.compress_size):,.0f}-fold, above "
                         f"the limit of {ratio} (a ZIP bomb? set KAI_OPT_MAX_ZIP_RATIO to raise it)", source=source)
    out = bytearray()
    try:
        _stream(zf, info, out, source)
    except (zipfile.BadZipFile, EOFError, OSError) as exc:  # e.g. a CRC that fails: the data is not what the
        # header declares (size or content)
        raise InputError(f"member does not match its header: {exc}", source=source) from exc
    return out


def _stream(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out: bytearray, source: str) -> None:
    with zf.open(info) as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            out += chunk
            if len(out) > info.file_size:
                raise InputError(f"member is larger than the {info.file_size:,} bytes its header declares",
                                 source=source)
