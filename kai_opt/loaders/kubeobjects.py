"""Kubernetes objects as `kubectl get ... -o yaml|json` writes them: single objects, `List`s, `*List`s."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kai_opt.errors import InputError
from kai_opt.loaders.documents import Document
from kai_opt.snapshot import RawObject

# kubectl List kinds map to the item kind when items lack apiVersion/kind (typed lists from the API)
_LIST_SUFFIX = "List"


_MAX_LIST_NESTING = 4  # a List inside a list inside a document; deeper is not something kubectl writes


def objects_from_documents(docs: Iterable[Document]) -> Iterator[RawObject]:
    for doc in docs:
        yield from _objects(doc.data, doc.source, doc.line, item_kind=None)


def _objects(data: object, source: str, line: int | None, item_kind: str | None,
             nesting: int = 0) -> Iterator[RawObject]:
    if nesting > _MAX_LIST_NESTING:
        raise InputError(f"lists nested more than {_MAX_LIST_NESTING} deep", source=source, line=line)
    if isinstance(data, list):
        for item in data:
            yield from _objects(item, source, line, item_kind, nesting + 1)
        return
    if not isinstance(data, dict):
        raise InputError(f"expected a Kubernetes object or list, got {type(data).__name__}", source=source,
                         line=line)
    kind = data.get("kind") or item_kind
    if kind is None:
        raise InputError("object has no kind", source=source, line=line)
    if not isinstance(kind, str):
        raise InputError(f"kind must be a string, got {kind!r}", source=source, line=line)
    if kind.endswith(_LIST_SUFFIX) and "items" in data:
        items = data.get("items") or []
        if not isinstance(items, list):
            raise InputError("items must be a list", source=source, line=line, obj=kind, field="items")
        inner = kind[: -len(_LIST_SUFFIX)] or None
        for item in items:
            yield from _objects(item, source, line, inner, nesting + 1)
        return
    yield RawObject(kind, data, source, line)
