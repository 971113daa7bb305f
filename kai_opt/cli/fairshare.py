"""`kai-opt fairshare SNAPSHOT`: every queue's deserved, limit, weight, fair share, allocated, requested, DRF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.tree import Tree

from kai_opt.cli.app import Output, app
from kai_opt.cli.render import console, fmt_num, print_json
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.report import fair_share_table
from kai_opt.loaders import load_snapshot
from kai_opt.state import build_state
from kai_opt.state.resources import QR
from kai_opt.units import format_quantity


@app.command()
def fairshare(
    snapshot: Path = typer.Argument(..., help="Snapshot file or directory"),
    output: Output = typer.Option(Output.table, "--output", "-o", help="table or json"),
    steps: bool = typer.Option(False, "--steps", help="Include the division steps of each queue"),
) -> None:
    """The queue tree with deserved, limit, over-quota weight, fair share, allocatable share, allocated,
    requested and the DRF (dominant resource) share per resource."""
    state = build_state(load_snapshot(snapshot))
    fs = compute_fair_share(state, trace=steps)
    rows = fair_share_table(state, fs)
    if output == Output.json:
        print_json({"total": {res: float(fs.total[r]) for r, res in enumerate(QR)}, "queues": rows})
        return
    render(rows, fs.total.tolist())


def _value(res: str, x: float) -> str:
    if x == -1:
        return "∞"
    if res == "gpu":
        return fmt_num(x)
    if res == "cpu":
        return format_quantity("cpu", x)
    return format_quantity("memory", x)


def render(rows: list[dict[str, Any]], total: list[float]) -> None:
    c = console()
    head = ", ".join(f"{res} {_value(res, t)}" for res, t in zip(QR, total, strict=True))
    legend = escape("(per resource: allocated/fair share [deserved, limit, weight])")
    tree = Tree(f"[bold]Cluster[/] {head}   {legend}")
    nodes: dict[str | None, Any] = {None: tree}
    remaining = list(rows)
    while remaining:
        progressed = False
        for row in list(remaining):
            if row["parent"] not in nodes:
                continue
            parts = []
            for res in QR:
                e = row[res]
                parts.append(f"{res} {_value(res, e['allocated'])}/{_value(res, e['fair_share'])} "
                             "[dim]" + escape(f"[{_value(res, e['deserved'])}, {_value(res, e['limit'])}, "
                                              f"w{fmt_num(e['over_quota_weight'])}]") + "[/]")
            label = f"[bold]{row['name']}[/] prio {row['priority']} drf {row['drf_share']:.2f}  " + "  ".join(parts)
            node = nodes[row["parent"]].add(label)
            nodes[row["name"]] = node
            for res in QR:
                for step in row[res].get("steps", []):
                    node.add(f"[dim]{res}: {step}[/]")
            remaining.remove(row)
            progressed = True
        if not progressed:
            break
    c.print(tree)
