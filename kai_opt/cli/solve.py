"""`kai-opt solve SNAPSHOT`: one scheduling cycle on a snapshot; prints the plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kai_opt.cli.app import app
from kai_opt.cli.render import console, emit, fmt_num, in_namespace, status_line, warn_skipped
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
from kai_opt.config import Engine

if TYPE_CHECKING:
    from kai_opt.config import Config
    from kai_opt.plan import Plan
    from kai_opt.snapshot import Snapshot
    from kai_opt.state import ClusterState


SHARD_HELP = ("only the scheduling shard of this partition label value ('' = the nodes, queues and PodGroups "
              "without the label; the label is config shard.partition_label); default: the config's shard section")


def of_shard(snap: Snapshot, cfg: Config, shard: str | None) -> Snapshot:
    """`snap`, or its part of one scheduling shard (`--shard`, or the config's shard section)."""
    if shard is None and not cfg.shard.name:
        return snap
    from kai_opt.k8s.shard import snapshot_of_shard  # the Kubernetes client only when sharding

    return snapshot_of_shard(snap, cfg, shard)


@app.command()
def solve(
    snapshot: str | None = snapshot_argument(),
    engine: Engine | None = typer.Option(None, "--engine", "-e", help="greedy or cpsat (default: from config)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    output: Format = output_option(Format.table),
    usage: Path | None = typer.Option(None, "--usage", help="Usage file: past usage per queue for time-based "
                                      "fair share (k_value from the config)"),
    kubeconfig: Path | None = kubeconfig_option(),
    context: str | None = context_option(),
    namespace: str | None = namespace_option(),
    all_namespaces: bool = all_namespaces_option(),
    shard: str | None = typer.Option(None, "--shard", help=SHARD_HELP),
) -> None:
    """Run one scheduling cycle on SNAPSHOT and print binds, pipelines, evictions and pending reasons."""
    from kai_opt.config import load_config
    from kai_opt.loaders.usage_file import load_usage_file

    cfg = load_config(config)
    history = load_usage_file(usage).history() if usage is not None else None
    with status_line("loading the snapshot") as say:  # a 10,000-node cycle takes tens of seconds
        # live cluster: a dry run, the plan is printed and nothing is applied
        snap = load(snapshot, kubeconfig=kubeconfig, context=context)
        snap = of_shard(snap, cfg, shard)
        warn_skipped(snap.warnings)
        # the engine (OR-Tools, the heuristics) and the cluster state are imported only once the inputs are read
        from kai_opt.engine import run_cycle
        from kai_opt.state import build_state
        from kai_opt.validation import plan_summary

        say(f"building the cluster state ({len(snap.nodes)} nodes, {len(snap.pods)} pods)")
        state = build_state(snap, default_queue=cfg.default_queue)
        plan, _fs = run_cycle(state, cfg, engine=engine, progress=lambda what: say(f"planning: {what}"),
                              history=history)
    data = plan.to_dict(state)
    data["summary"] = plan_summary(state, plan)
    ns = namespace_filter(namespace, all_namespaces)
    if ns is not None:  # the summary counts stay the whole cycle's; the lists show the namespace
        for kind, key in (("binds", "pod"), ("pipelines", "pod"), ("evictions", "pod"), ("moves", "pod"),
                          ("pending", "podgroup")):
            if kind in data:
                data[kind] = [e for e in data[kind] if in_namespace(e.get(key), ns)]

    def names() -> list[str]:
        return [f"pod/{b['pod']}" for kind in ("binds", "pipelines") for b in data[kind]]

    emit(data, output, names=names, table=lambda wide: render(state, plan, data, wide=wide))


def render(state: ClusterState, plan: Plan, data: dict[str, Any], *, wide: bool = False) -> None:
    """The plan as tables (`wide` prints the same columns: a plan entry has no more fields)."""
    from rich.markup import escape
    from rich.table import Table

    c = console()
    s = data["summary"]
    solver = data["solver"]
    gap = f"  gap {solver['gap']:.2%}" if solver.get("gap") is not None else ""
    c.print(f"[bold]engine[/] {plan.engine}  status {solver['status']}{gap}  {solver.get('wall_s', 0):.3f}s")
    if solver.get("note"):  # why the CP-SAT engine returned what it did (chosen, kept, fallback)
        c.print(f"[dim]{escape(solver['note'])}[/]")
    c.print(f"GPUs allocated {fmt_num(s['gpus_allocated_before'])} -> {fmt_num(s['gpus_allocated_after'])} "
            f"of {fmt_num(s['gpus_total'])}; fragmentation {fmt_num(s['fragmentation_before'])} -> "
            f"{fmt_num(s['fragmentation_after'])}")
    c.print(f"binds {s['binds']}, pipelines {s['pipelines']}, evictions {s['evictions']}, "
            f"podgroups placed {s['podgroups_placed']}, pending {s['podgroups_pending']}")
    if data["binds"] or data["pipelines"]:
        t = Table(title="Placements", title_justify="left")
        for col in ("pod", "podgroup", "node", "gpus", "how"):
            t.add_column(col)
        for kind in ("binds", "pipelines"):
            for b in data[kind]:
                t.add_row(b["pod"], b["podgroup"] or "", b["node"], ",".join(map(str, b["gpu_devices"])),
                          "bind" if kind == "binds" else "pipeline")
        c.print(t)
    if data["evictions"]:
        t = Table(title="Evictions", title_justify="left")
        moves = {m["pod"]: m for m in data.get("moves", [])}  # consolidation: where the evicted pod goes
        cols = ("pod", "podgroup", "node", "reason", "beneficiary") + (("moves to",) if moves else ())
        for col in cols:
            t.add_column(col)
        for e in data["evictions"]:
            row = [e["pod"], e["podgroup"] or "", e["node"] or "", e["reason"], e["beneficiary"] or ""]
            if moves:
                m = moves.get(e["pod"])
                row.append(f"{m['node']} ({','.join(map(str, m['gpu_devices']))})" if m and m["gpu_devices"]
                           else (m["node"] if m else ""))
            t.add_row(*row)
        c.print(t)
    if data["pending"]:
        t = Table(title="Pending", title_justify="left")
        t.add_column("podgroup")
        t.add_column("reason")
        for p in data["pending"]:
            t.add_row(p["podgroup"], "\n".join(f"{r['code']}: {r['message']}" for r in p["reasons"]))
        c.print(t)

