"""One description of a Kubernetes object, two renderers: `resolve` evaluates it in Python for the chart values
(`kai-opt manifests`), `helm_template` writes it as a Helm template (scripts/gen-chart writes the chart). So the
chart and `kai-opt manifests` cannot drift apart: both come from the same object descriptions.

A description is plain JSON-like data in which three markers may stand:
- `Val(go, py)`: a value computed from the chart values; Go: `{{ <go> | toJson }}` (JSON is YAML, so any value
  -- scalar, list or mapping -- fits in place), Python: `py(ctx)`;
- `When(cond, value)` as a mapping's value or a list's item: present only when `cond` holds; Go: the entry is
  wrapped in `{{- if <cond.go> }}` ... `{{- end }}`;
- `Cond(go, py)`: a condition (Go template truthiness equals Python's for the booleans, strings and numbers used).

A `Doc` with `each` (a values path of a list) is one object per item of that list; its markers see the item as
`$item` in Go (`item(key)`), `ctx.item` in Python. Go: `{{- range $item := .Values.<each> }}{{- with $ }}` around the
object (so `.` is the root again inside), a `---` before each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Context:
    """What a template sees: `.Values` and `.Release.Namespace`."""

    values: Mapping[str, Any]
    namespace: str
    item: Mapping[str, Any] | None = None  # the list item a `Doc.each` object is rendered for

    def get(self, path: str) -> Any:
        node: Any = self.values
        for part in path.split("."):
            node = node[part]
        return node


@dataclass(frozen=True)
class Val:
    go: str
    py: Callable[[Context], Any]


@dataclass(frozen=True)
class Cond:
    go: str
    py: Callable[[Context], bool]


@dataclass(frozen=True)
class When:
    cond: Cond
    value: Any


@dataclass(frozen=True)
class Doc:
    """One object of the chart: its template file name, the condition it is rendered under, its description."""

    file: str
    body: dict[str, Any]
    cond: Cond | None = None
    each: str | None = None  # a values path of a list: one object per item (`item`)


def value(path: str) -> Val:
    """`.Values.<path>`."""
    return Val(f".Values.{path}", lambda c: c.get(path))


def flag(path: str) -> Cond:
    """True when `.Values.<path>` is."""
    return Cond(f".Values.{path}", lambda c: bool(c.get(path)))


def all_of(*conds: Cond) -> Cond:
    return Cond("and " + " ".join(f"({c.go})" for c in conds), lambda c: all(x.py(c) for x in conds))


def any_of(*conds: Cond) -> Cond:
    return Cond("or " + " ".join(f"({c.go})" for c in conds), lambda c: any(x.py(c) for x in conds))


def negate(cond: Cond) -> Cond:
    return Cond(f"not ({cond.go})", lambda c: not cond.py(c))


def item(key: str) -> Val:
    """`<key>` of the list item a `Doc.each` object is rendered for."""
    return Val(f"$item.{key}", lambda c: (c.item or {})[key])


NAMESPACE = Val(".Release.Namespace", lambda c: c.namespace)


# -- Python ----------------------------------------------------------------------------------------------------------
def resolve(node: Any, ctx: Context) -> Any:
    """The description evaluated: markers replaced by their values, absent `When` entries left out."""
    if isinstance(node, Val):
        return node.py(ctx)
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, item in node.items():
            if isinstance(item, When):
                if not item.cond.py(ctx):
                    continue
                item = item.value
            out[key] = resolve(item, ctx)
        return out
    if isinstance(node, list):
        return [resolve(i.value if isinstance(i, When) else i, ctx) for i in node
                if not isinstance(i, When) or i.cond.py(ctx)]
    if isinstance(node, When | Cond):
        raise TypeError("When stands only as a mapping value or a list item")
    return node


def render(docs: list[Doc], ctx: Context) -> list[dict[str, Any]]:
    """The objects whose condition holds, in order (a `Doc.each` one per item of its list)."""
    out = []
    for d in docs:
        for c in ([Context(ctx.values, ctx.namespace, i) for i in ctx.get(d.each) or []] if d.each else [ctx]):
            if d.cond is None or d.cond.py(c):
                out.append(resolve(d.body, c))
    return out


# -- Helm ------------------------------------------------------------------------------------------------------------
_SENTINEL = re.compile(r"KAIOPT([VBLE])(\d+)Z")  # value, mapping entry begins, list item begins, ends


class _Writer:
    def __init__(self) -> None:
        self.table: list[str] = []

    def mark(self, go: str) -> int:
        self.table.append(go)
        return len(self.table) - 1

    def plain(self, node: Any) -> Any:
        """The description with markers replaced by sentinel scalars (rewritten in the text afterwards)."""
        if isinstance(node, Val):
            return f"KAIOPTV{self.mark(node.go)}Z"
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for key, item in node.items():
                if isinstance(item, When):
                    n = self.mark(item.cond.go)
                    out[f"KAIOPTB{n}Z"] = None
                    out[key] = self.plain(item.value)
                    out[f"KAIOPTE{n}Z"] = None
                else:
                    out[key] = self.plain(item)
            return out
        if isinstance(node, list):
            items: list[Any] = []
            for item in node:
                if isinstance(item, When):
                    n = self.mark(item.cond.go)
                    items += [f"KAIOPTL{n}Z", self.plain(item.value), f"KAIOPTE{n}Z"]
                else:
                    items.append(self.plain(item))
            return items
        return node

    def text(self, body: dict[str, Any]) -> str:
        raw = yaml.safe_dump(self.plain(body), sort_keys=False, width=10_000, allow_unicode=True)
        lines: list[str] = []
        for line in raw.splitlines():
            bare = line.strip().removeprefix("- ").removesuffix(": null")
            m = _SENTINEL.fullmatch(bare)
            if m and m.group(1) == "B" and line.lstrip().startswith("- "):
                # the `if` line would swallow the item's "- ": the first entry of a list item stays unconditional
                raise ValueError(f"a list item's first entry cannot be conditional: {line.strip()}")
            if m and m.group(1) in "BL":
                lines.append(f"{{{{- if {self.table[int(m.group(2))]} }}}}")
            elif m and m.group(1) == "E":
                lines.append("{{- end }}")
            else:
                lines.append(_SENTINEL.sub(lambda v: f"{{{{ {self.table[int(v.group(2))]} | toJson }}}}", line))
        return "\n".join(lines) + "\n"


def helm_template(doc: Doc) -> str:
    """`doc` as the text of a Helm template file."""
    body = _Writer().text(doc.body)
    body = f"{{{{- if {doc.cond.go} }}}}\n{body}{{{{- end }}}}\n" if doc.cond else body
    if doc.each:
        body = (f"{{{{- range $item := .Values.{doc.each} }}}}\n{{{{- with $ }}}}\n---\n{body}"
                "{{- end }}\n{{- end }}\n")
    return body
