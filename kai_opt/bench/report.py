"""Rendering `kai-opt bench run` results: summary and detail tables (rich or markdown) and the JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SUMMARY_NOTES = (
    "GPUs allocated = GPUs held by all pods once the cycle's plan has landed; weighted = our pods' GPUs x "
    "priority/100; ratio = allocated / LP bound (1.0 = the bound).",
    "LP bound: the relaxation of one cycle (fractional pods and gangs, nodes aggregated into classes, per-device "
    "packing reduced to two device rows, topology, sub-group minimums and KAI's eviction and quota rules "
    "dropped; preemptible running pods may move or go); see kai_opt/bench/bound.py. The placement-only bound "
    "keeps every running pod where it is: it bounds runs that evict and move nothing (every baseline).",
    "Baselines place pending pods only (no evictions), gangs all-or-nothing, queue limits honoured; they do not "
    "apply KAI's non-preemptible-within-quota rule, which kai-opt's engines obey.",
)

DETAIL = (  # (header, row key, format)
    ("instance", "instance", "{}"), ("engine", "engine", "{}"), ("GPUs alloc.", "gpus_allocated", "{:.1f}"),
    ("LP bound", "lp_bound", "{:.1f}"), ("ratio", "ratio", "{:.3f}"), ("w. ratio", "ratio_weighted", "{:.3f}"),
    ("place-only ratio", "ratio_place_only", "{:.3f}"),
    ("unalloc. %", "unallocated_pct", "{:.2f}"), ("frag. % free", "fragmentation_pct", "{:.1f}"),
    ("pods", "pods_placed", "{}"), ("gangs", "gangs_placed", "{}"), ("evict.", "evictions", "{}"),
    ("moves", "moves", "{}"), ("fair dev %", "fairness_max_dev_pct", "{:.2f}"), ("p50 s", "wall_s", "{:.3f}"),
    ("p95 s", "wall_p95_s", "{:.3f}"), ("peak MB", "peak_rss_mb", "{:.0f}"),
)


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "—"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def detail_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = [h for h, _, _ in DETAIL]
    out = []
    for r in rows:
        if r.get("error") and r.get("gpus_allocated") is None:
            out.append([r["instance"], r["engine"], f"error: {r['error']}"] + [""] * (len(DETAIL) - 3))
            continue
        cells = [_fmt(f, r.get(k)) for _, k, f in DETAIL]
        if r.get("checked") is False:
            cells[1] += " (FAILED CHECK)"
        out.append(cells)
    return headers, out


def _ordered(rows: Sequence[dict[str, Any]], key: str) -> list[Any]:
    return list(dict.fromkeys(r[key] for r in rows))


def summary_rows(rows: Sequence[dict[str, Any]], key: str, fmt: str = "{:.3f}") -> tuple[list[str], list[list[str]]]:
    """Engines x families: the mean of `key` over the family's instances, and the mean over all instances."""
    fams = _ordered(rows, "family")
    headers = ["engine", *fams, "all"]
    out = []
    for e in _ordered(rows, "engine"):
        cells = [e]
        for f in [*fams, None]:
            vals = [float(r[key]) for r in rows if r["engine"] == e and (f is None or r["family"] == f)
                    and r.get(key) is not None]
            cells.append(fmt.format(float(np.mean(vals))) if vals else "—")
        out.append(cells)
    return headers, out


def time_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Engines x cluster sizes: the median cycle wall time (s) over the instances of that size."""
    sizes = sorted(set(int(r["nodes"]) for r in rows))
    headers = ["engine", *(f"{n} nodes" for n in sizes)]
    out = []
    for e in _ordered(rows, "engine"):
        cells = [e]
        for n in sizes:
            vals = [float(r["wall_s"]) for r in rows if r["engine"] == e and int(r["nodes"]) == n
                    and r.get("wall_s") is not None]
            cells.append(f"{float(np.median(vals)):.3f}" if vals else "—")
        out.append(cells)
    return headers, out


def tables(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) of every table of the report, in order."""
    return [
        ("Ratio to the LP bound, GPUs allocated (mean over instances)", *summary_rows(rows, "ratio")),
        ("Ratio to the LP bound, priority-weighted GPUs", *summary_rows(rows, "ratio_weighted")),
        ("Ratio to the placement-only LP bound (running pods fixed), GPUs; only runs that evicted and moved "
         "nothing", *summary_rows(rows, "ratio_place_only")),
        ("Cycle wall time p50 (s, median over instances)", *time_rows(rows)),
        ("Per instance and engine", *detail_rows(rows)),
    ]


def markdown(rows: Sequence[dict[str, Any]], notes: Sequence[str]) -> str:
    parts = []
    for title, headers, body in tables(rows):
        parts.append(f"**{title}**\n")
        parts.append("| " + " | ".join(headers) + " |")
        parts.append("|" + "|".join(["---"] * min(2, len(headers)) + ["---:"] * (len(headers) - 2)) + "|"
                     if title.startswith("Per instance") else
                     "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|")
        parts += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body]
        parts.append("")
    parts += [f"- {n}" for n in notes]
    return "\n".join(parts)


def print_tables(rows: Sequence[dict[str, Any]], notes: Sequence[str]) -> None:
    from rich.table import Table

    from kai_opt.cli.render import console

    c = console()
    for title, headers, body in tables(rows):
        c.print(f"[bold]{title}[/]", highlight=False)
        t = Table()
        for i, h in enumerate(headers):
            t.add_column(h, justify="left" if i == 0 or (title.startswith("Per instance") and i < 2) else "right")
        for r in body:
            t.add_row(*r)
        c.print(t)
    for n in notes:
        c.print(f"[dim]{n}[/]", highlight=False)


def document(rows: Sequence[dict[str, Any]], instances: Sequence[dict[str, Any]], notes: Sequence[str],
             settings: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: {"results": [...], "instances": [...], "summary": [...], "settings": {...}, "notes"}."""
    summary = []
    for e in _ordered(rows, "engine"):
        for f in _ordered(rows, "family"):
            mine = [r for r in rows if r["engine"] == e and r["family"] == f and r.get("ratio") is not None]
            if mine:
                summary.append({"engine": e, "family": f, "instances": len(mine),
                                "ratio_mean": round(float(np.mean([r["ratio"] for r in mine])), 6),
                                "ratio_weighted_mean": round(float(np.mean([r["ratio_weighted"] for r in mine
                                                                            if r["ratio_weighted"] is not None]
                                                                           or [np.nan])), 6),
                                "wall_s_median": round(float(np.median([r["wall_s"] for r in mine])), 6)})
    return {"results": list(rows), "instances": list(instances), "summary": summary, "settings": settings,
            "notes": list(notes)}
