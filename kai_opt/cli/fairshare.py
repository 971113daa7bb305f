"""`kai-opt fairshare SNAPSHOT`: every queue's deserved, limit, weight, fair share, allocated, requested, DRF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from kai_opt.cli.app import app
from kai_opt.cli.render import console, emit, fmt_num, human
from kai_opt.cli.solve import SHARD_HELP, of_shard
from kai_opt.cli.source import Format, context_option, kubeconfig_option, load, output_option, snapshot_argument


@app.command()
def fairshare(
    snapshot: str | None = snapshot_argument(),
    output: Format = output_option(Format.table),
    steps: bool = typer.Option(False, "--steps", help="Include the division steps of each queue"),
    usage: Path | None = typer.Option(None, "--usage", help="Usage file: past usage per queue (time-based fair "
                                      "share); adds each queue's usage term"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML (k_value)"),
    kubeconfig: Path | None = kubeconfig_option(),
    context: str | None = context_option(),
    shard: str | None = typer.Option(None, "--shard", help=SHARD_HELP),
) -> None:
    """The queue tree with deserved, limit, over-quota weight, fair share, allocatable share, allocated,
    requested and the DRF (dominant resource) share per resource; with --usage, each queue's past usage (the
    time-based fair share term, normalised to the window's capacity) too."""
    from kai_opt.config import load_config
    from kai_opt.fairshare import compute_fair_share
    from kai_opt.fairshare.report import fair_share_table
    from kai_opt.loaders.usage_file import load_usage_file
    from kai_opt.state import build_state
    from kai_opt.state.resources import QR
    cfg = load_config(config)
    history = load_usage_file(usage).history() if usage is not None else None
    state = build_state(of_shard(load(snapshot, kubeconfig=kubeconfig, context=context), cfg, shard),
                        default_queue=cfg.default_queue)
    fs = compute_fair_share(state, trace=steps, history=history, k_value=cfg.k_value)
    rows = fair_share_table(state, fs)
    data: dict[str, Any] = {"total": {res: float(fs.total[r]) for r, res in enumerate(QR)}, "queues": rows}
    if history is not None:
        data["k_value"] = cfg.k_value
    emit(data, output, names=lambda: [f"queue/{row['name']}" for row in rows],
         table=lambda _wide: render(rows, fs.total.tolist(), k_value=cfg.k_value if history is not None else None))


def _value(res: str, x: float) -> str:
    if x == -1:
        return "∞"
    return human(res, x)


def render(rows: list[dict[str, Any]], total: list[float], k_value: float | None = None) -> None:
    from rich.markup import escape
    from rich.tree import Tree

    from kai_opt.state.resources import QR

    c = console()
    head = ", ".join(f"{res} {_value(res, t)}" for res, t in zip(QR, total, strict=True))
    legend = escape("(per resource: allocated/fair share [deserved, limit, weight"
                    + (", usage" if k_value is not None else "") + "])")
    if k_value is not None:
        legend += escape(f"  time-based fair share: k_value {k_value:g}, usage = past usage / window capacity")
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
                used = f", u{e['usage']:.3g}" if "usage" in e else ""
                parts.append(f"{res} {_value(res, e['allocated'])}/{_value(res, e['fair_share'])} "
                             "[dim]" + escape(f"[{_value(res, e['deserved'])}, {_value(res, e['limit'])}, "
                                              f"w{fmt_num(e['over_quota_weight'])}{used}]") + "[/]")
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
