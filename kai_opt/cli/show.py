"""`kai-opt show [SNAPSHOT]`: cluster totals, the queue tree and pending podgroups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kai_opt.cli.app import app
from kai_opt.cli.render import console, emit, fmt_num, human, in_namespace
from kai_opt.cli.source import (
    Format,
    all_namespaces_option,
    context_option,
    kubeconfig_option,
    load,
    namespace_filter,
    namespace_option,
    output_option,
    snapshot_argument,
)


@app.command()
def show(
    snapshot: str | None = snapshot_argument(),
    output: Format = output_option(Format.table),
    kubeconfig: Path | None = kubeconfig_option(),
    context: str | None = context_option(),
    namespace: str | None = namespace_option("Only pending podgroups of this namespace"),
    all_namespaces: bool = all_namespaces_option(),
) -> None:
    """Cluster totals, the queue tree with quota/limit/allocated/requested, and pending podgroups."""
    from kai_opt.state import build_state
    from kai_opt.summary import summarize

    state = build_state(load(snapshot, kubeconfig=kubeconfig, context=context))
    data = summarize(state)
    ns = namespace_filter(namespace, all_namespaces)
    data["pending_podgroups"] = [pg for pg in data["pending_podgroups"] if in_namespace(pg["podgroup"], ns)]
    emit(data, output, names=lambda: [f"podgroup/{pg['podgroup']}" for pg in data["pending_podgroups"]],
         table=lambda wide: render_summary(data, wide=wide))


def _res(entry: dict[str, Any], res: str) -> str:
    r = entry[res]
    return (f"{human(res, r['allocated'])}/{human(res, r['requested'])} "
            f"(q {human(res, r['quota'])}, lim {human(res, r['limit'])})")


def render_summary(data: dict[str, Any], *, wide: bool = False) -> None:
    c = console()
    g = data["gpus"]
    c.print(f"[bold]Nodes[/] {data['nodes']} ({data['nodes_schedulable']} schedulable)   "
            f"[bold]GPUs[/] total {fmt_num(g['total'])}, used {fmt_num(g['used'])}, free {fmt_num(g['free'])} "
            f"(whole free devices {g['free_devices']}; fragmented free {fmt_num(g['fragmentation'])})")
    p = data["pods"]
    c.print(f"[bold]Pods[/] running {p['running']}, releasing {p['releasing']}, pending {p['pending']}, "
            f"gated {p['gated']}")
    if data["queues"]:
        from rich.tree import Tree

        tree = Tree("[bold]Queues[/]  gpu / cpu / memory: allocated/requested (quota, limit)")
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
        from rich.table import Table

        t = Table(title="Pending podgroups", title_justify="left")
        extra = ("preemptible",) if wide else ()
        for col in ("podgroup", "queue", "pending", "running", "minMember", "gpus", "priority", *extra, "problem"):
            t.add_column(col)
        for pg in data["pending_podgroups"]:
            t.add_row(pg["podgroup"], pg["queue"] or "-", str(pg["pending_pods"]), str(pg["running_pods"]),
                      str(pg["min_member"]), fmt_num(pg["gpus"]), str(pg["priority"]),
                      *(str(pg[k]).lower() for k in extra), pg["problem"] or "")
        c.print(t)
    for w in data["warnings"]:
        c.print(f"[yellow]warning:[/] {w}", highlight=False)
