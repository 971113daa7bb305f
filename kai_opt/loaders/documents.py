"""Read YAML (multi-document) or JSON files into documents that remember where they came from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kai_opt.errors import InputError
from kai_opt.limits import ceiling
from kai_opt.textfile import check_yaml_aliases, check_yaml_depth, read_text

try:  # the C loader is ~10x faster on large dumps
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


@dataclass(frozen=True)
class Document:
    data: Any
    source: str
    line: int | None = None  # 1-based line where the document starts


def read_documents(path: Path) -> list[Document]:
    return parse_documents(read_text(path), str(path))


def parse_json(text: str | bytes, source: str) -> Any:
    """JSON with its errors as one line: syntax, nesting beyond the decoder's recursion limit, numbers with more
    digits than Python converts."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", source=source, line=exc.lineno) from exc
    except RecursionError:
        raise InputError("invalid JSON: nested too deeply", source=source) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise InputError(f"invalid JSON: {exc}", source=source) from None


def parse_documents(text: str, source: str) -> list[Document]:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        return [Document(parse_json(text, source), source, 1)]
    check_yaml_depth(text, source)
    max_docs = ceiling("MAX_DOCUMENTS")
    docs: list[Document] = []
    seen = 0
    try:
        loader = _Loader(text)
        try:
            while loader.check_node():
                node = loader.get_node()
                seen += 1
                if seen > max_docs:
                    raise InputError(f"more than {max_docs:,} YAML documents (set KAI_OPT_MAX_DOCUMENTS to raise "
                                     "it)", source=source, line=node.start_mark.line + 1 if node else None)
                if node is None:
                    continue
                docs.append(Document(loader.construct_document(node), source, node.start_mark.line + 1))
        finally:
            loader.dispose()
        for d in docs:
            check_yaml_aliases(text, d.data, d.source, line=d.line)
    except (ValueError, RecursionError) as exc:  # a constructor's: e.g. an integer of more than 4300 digits
        raise InputError(f"invalid YAML: {exc}", source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"invalid YAML: {problem}", source=source,
                         line=mark.line + 1 if mark is not None else None) from exc
    return [d for d in docs if d.data is not None]
