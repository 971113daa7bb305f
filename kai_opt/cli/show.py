"""`kai-opt show SNAPSHOT`: cluster totals, the queue tree and pending podgroups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.tree import Tree

from kai_opt.cli.app import Output, app
from kai_opt.cli.render import console, fmt_num, print_json
from kai_opt.loaders import load_snapshot
from kai_opt.state import build_state
from kai_opt.summary import summarize


@app.command()
def show(
    snapshot: Path = typer.Argument(..., help="Snapshot: kubectl YAML/JSON (file or directory), KAI zip, scenario"),
    output: Output = typer.Option(Output.table, "--output", "-o", help="table or json"),
) -> None:
    """Cluster totals, the queue tree with quota/limit/allocated/requested, and pending podgroups."""
    state = build_state(load_snapshot(snapshot))
    data = summarize(state)
    if output == Output.json:
        print_json(data)
        return
    render_summary(data)


def _res(entry: dict[str, Any], res: str) -> str:
    r = entry[res]
    return (f"{fmt_num(r['allocated'])}/{fmt_num(r['requested'])} "
            f"(q {fmt_num(r['quota'])}, lim {fmt_num(r['limit'])})")


def render_summary(data: dict[str, Any]) -> None:
    c = console()
    g = data["gpus"]
    c.print(f"[bold]Nodes[/] {data['nodes']} ({data['nodes_schedulable']} schedulable)   "
            f"[bold]GPUs[/] total {fmt_num(g['total'])}, used {fmt_num(g['used'])}, free {fmt_num(g['free'])} "
            f"(whole free devices {g['free_devices']}; fragmented free {fmt_num(g['fragmentation'])})")
    p = data["pods"]
    c.print(f"[bold]Pods[/] running {p['running']}, releasing {p['releasing']}, pending {p['pending']}, "
            f"gated {p['gated']}")
    if data["queues"]:
        tree = Tree("[bold]Queues[/]  gpu / cpu(m) / memory: allocated/requested (quota, limit)")
        nodes: dict[str | None, Any] = {None: tree}
        remaining = list(data["queues"])
        while remaining:
            progressed = False
            for q in list(remaining):
                if q["parent"] in nodes:
                    label = (f"{q['name']} [dim]prio {q['priority']}[/]  gpu {_res(q, 'gpu')}  "
                             f"cpu {_res(q, 'cpu')}  mem {_res(q, 'memory')}")
                    nodes[q["name"]] = nodes[q["parent"]].add(label)
                    remaining.remove(q)
                    progressed = True
            if not progressed:
                break
        c.print(tree)
    if data["pending_podgroups"]:
        t = Table(title="Pending podgroups", title_justify="left")
        for col in ("podgroup", "queue", "pending", "running", "minMember", "gpus", "priority", "problem"):
            t.add_column(col)
        for pg in data["pending_podgroups"]:
            t.add_row(pg["podgroup"], pg["queue"] or "-", str(pg["pending_pods"]), str(pg["running_pods"]),
                      str(pg["min_member"]), fmt_num(pg["gpus"]), str(pg["priority"]), pg["problem"] or "")
        c.print(t)
    for w in data["warnings"]:
        c.print(f"[yellow]warning:[/] {w}", highlight=False)
