"""Reading an input file as text: bounded in size, UTF-8 only (with or without BOM), nesting bounded before parsing.

Snapshots, scenarios, behaviour cases and `-c` configs all come through here, so every one of them refuses the
same hostile inputs with the same one line.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Any

import yaml

from kai_opt.errors import InputError
from kai_opt.limits import ceiling

_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))


def read_bytes(path: Path, *, error: type[InputError] = InputError, what: str = "file") -> bytes:
    """The file's bytes; refused before reading when larger than MAX_INPUT_BYTES (and while reading, for
    devices and pipes whose size is not known up front)."""
    limit = ceiling("MAX_INPUT_BYTES")
    try:
        size = path.stat().st_size
        if size > limit:
            raise error(_too_large(size, limit), source=str(path))
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except IsADirectoryError as exc:
        raise error(f"cannot read {what}: is a directory", source=str(path)) from exc
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}", source=str(path)) from exc
    if len(data) > limit:
        raise error(_too_large(len(data), limit, at_least=True), source=str(path))
    return data


def _too_large(size: int, limit: int, at_least: bool = False) -> str:
    more = "more than " if at_least else ""
    return f"input is {more}{size:,} bytes, above the limit of {limit:,} (set KAI_OPT_MAX_INPUT_BYTES to raise it)"


def decode(data: bytes | bytearray, source: str, *, error: type[InputError] = InputError) -> str:
    """UTF-8 text without its BOM; any other encoding is one error saying so."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise error(f"file is {name} encoded; kai-opt reads UTF-8 only (convert it, e.g. with iconv -t UTF-8)",
                        source=source)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        hint = " (looks like UTF-16)" if b"\x00" in data[:64] else ""
        raise error(f"not valid UTF-8 at byte {exc.start}{hint}; kai-opt reads UTF-8 only", source=source,
                    line=line) from None
    if "\x00" in text[:64]:  # UTF-16 without a BOM decodes as UTF-8 with NULs between the characters
        raise error("file holds NUL characters (UTF-16 without a BOM?); kai-opt reads UTF-8 only", source=source)
    return text


def read_text(path: Path, *, error: type[InputError] = InputError, what: str = "file") -> str:
    return decode(read_bytes(path, error=error, what=what), str(path), error=error)


# -- nesting depth of YAML, before the C parser sees it (it recurses without a limit and crashes the process) -----
_TWO_DASHES = re.compile(r"-[ \t]+-[ \t]")
_DASH_RUN = r"(?:-[ \t]+){%d,}"
_INDICATOR_RUN = r"(?:[-?:][ \t]+){%d,}"


def _deep_block(text: str, indent: int, runs: int) -> bool:
    """Whether some line may nest `indent` levels by indentation (YAML indents with spaces only) or `runs` levels
    by compact indicators (`- - - x`; `? ` for complex keys is rare, so only then is the slower pattern used)."""
    if text.startswith(" " * indent) or "\n" + " " * indent in text:
        return True
    if _TWO_DASHES.search(text) and re.search(_DASH_RUN % runs, text):  # the first is 40x faster, and rare
        return True
    return ("? " in text or "?\t" in text) and re.search(_INDICATOR_RUN % runs, text) is not None


def check_yaml_depth(text: str, source: str, *, error: type[InputError] = InputError) -> None:
    """Refuse YAML nested deeper than MAX_DEPTH. A cheap upper bound decides most files: a flow collection that
    is not empty starts with `[` or `{` not directly closed, so their count bounds flow nesting; block nesting
    needs indentation or a run of `- `/`? `/`: ` indicators on one line. Only when that bound is too high are the
    parser's events counted (exact, and iterative inside libyaml)."""
    limit = ceiling("MAX_DEPTH")
    flow = text.count("[") + text.count("{") - text.count("[]") - text.count("{}")
    budget = limit - flow - 1
    runs = budget // 4  # depth <= flow + 1 + 2 * (indent + 1) + indicators on a line
    indent = (budget - runs) // 2 - 1
    if runs >= 1 and indent >= 1 and not _deep_block(text, indent, runs):
        return
    depth = deepest = 0
    loader = yaml.CSafeLoader(text) if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader(text)
    starts, ends = (yaml.MappingStartEvent, yaml.SequenceStartEvent), (yaml.MappingEndEvent, yaml.SequenceEndEvent)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, starts):
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if deepest > limit:
                        mark = event.start_mark
                        raise error(f"nested deeper than {limit} levels (set KAI_OPT_MAX_DEPTH to raise it)",
                                    source=source, line=mark.line + 1 if mark is not None else None)
            elif isinstance(event, ends):
                depth -= 1
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own bound (PyYAML >= 6.0.4), above ours: stopped before we could
            mark = getattr(exc, "problem_mark", None)
            raise error(f"nested deeper than {limit} levels (set KAI_OPT_MAX_DEPTH to raise it)", source=source,
                        line=mark.line + 1 if mark is not None else None) from None
        return  # the parser reports it with its line
    finally:
        loader.dispose()


# -- aliases: the loader shares an aliased object, but every reader walks it once per reference --------------------
_STAR = re.compile(r"\*[^\s,\]}]")  # starts with a literal: fast; the character before is checked in Python


def _has_alias(text: str) -> bool:
    """Whether the text may hold a YAML alias (`*name` after a space, `[`, `{`, `,` or at a line start)."""
    return "*" in text and any(m.start() == 0 or text[m.start() - 1] in " \t\n[{,-" for m in _STAR.finditer(text))


def check_yaml_aliases(text: str, data: Any, source: str, *, line: int | None = None,
                       error: type[InputError] = InputError) -> None:
    """Refuse a document whose aliases expand it more than MAX_ALIAS_RATIO-fold (47 KB of aliases were a
    billion objects: a "billion laughs")."""
    if not _has_alias(text):
        return
    ratio = ceiling("MAX_ALIAS_RATIO")
    expanded: dict[int, int] = {}
    unique = 0

    def size(o: Any) -> int:
        nonlocal unique
        if not isinstance(o, dict | list):
            return 1
        known = expanded.get(id(o))
        if known is not None:
            return known
        items = list(o.values()) if isinstance(o, dict) else o
        unique += 1 + len(items)
        n = 1 + sum(size(v) for v in items)  # depth is bounded (check_yaml_depth), so is this recursion
        expanded[id(o)] = n
        return n

    total = size(data)
    if total > ratio * max(unique, 1) + 10_000:
        raise error(f"YAML aliases expand the document {total / max(unique, 1):,.0f}-fold, above the limit of "
                    f"{ratio} (set KAI_OPT_MAX_ALIAS_RATIO to raise it)", source=source, line=line)
