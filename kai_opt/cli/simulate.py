"""`kai-opt simulate SNAPSHOT --cycles N`: apply each cycle's plan in memory and report the end state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from kai_opt.bench.plots import pyplot
from kai_opt.cli.app import app
from kai_opt.cli.render import console, emit, fmt_num, in_namespace, status_line
from kai_opt.cli.solve import SHARD_HELP, of_shard
from kai_opt.cli.source import (
    FormatNoName,
    all_namespaces_option,
    context_option,
    kubeconfig_option,
    load,
    namespace_filter,
    namespace_option,
    output_option,
    snapshot_argument,
)
from kai_opt.config import load_config
from kai_opt.loaders.usage_file import load_usage_file
from kai_opt.simulate import MAX_CYCLES
from kai_opt.simulate import simulate as run_simulation
from kai_opt.state import build_state
from kai_opt.summary import summarize

MAX_PERIOD_S = 30 * 86400.0  # --period above this is a usage error


@app.command()
def simulate(
    snapshot: str | None = snapshot_argument(),
    cycles: int = typer.Option(5, "--cycles", min=1, max=MAX_CYCLES,
                               help="Cycles to run at most (the run stops once the cluster has settled)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    output: FormatNoName = output_option(FormatNoName.table),
    usage: Path | None = typer.Option(None, "--usage", help="Usage file: past usage per queue as of the first "
                                      "cycle (time-based fair share); the run adds what queues hold as it goes"),
    period: float | None = typer.Option(None, "--period", min=0.001, max=MAX_PERIOD_S,
                                        help="Seconds between cycles (default: schedule_period_s)"),
    plot: Path | None = typer.Option(None, "--plot", help="Write a PNG: GPUs allocated and fair share per leaf "
                                     "queue over the cycles (and the usage term with --usage)"),
    kubeconfig: Path | None = kubeconfig_option(),
    context: str | None = context_option(),
    namespace: str | None = namespace_option("Only pending podgroups of this namespace in the end state"),
    all_namespaces: bool = all_namespaces_option(),
    shard: str | None = typer.Option(None, "--shard", help=SHARD_HELP),
) -> None:
    """Run up to N cycles, applying each plan in memory (binds run, pipelined pods wait for their victims, evicted
    pods return to pending), then report every cycle and whether the last one changed nothing (stable). The run
    stops early once the cluster has settled: a cycle changed nothing and no later cycle could (not with --usage:
    the usage term changes every cycle)."""
    if plot is not None:
        pyplot()  # matplotlib (the bench extra) is there, before the simulation
    cfg = load_config(config)
    if cycles > 1:  # a long-lived run: the inner loops (kai_opt.compiled) compiled at their first use
        from kai_opt.compiled import compile_when_used

        compile_when_used()
    past = load_usage_file(usage) if usage is not None else None
    with status_line("loading the snapshot") as say:
        snap = of_shard(load(snapshot, kubeconfig=kubeconfig, context=context), cfg, shard)
        result = run_simulation(snap, cfg, cycles, progress=say, usage=past, period_s=period,
                                queue_stats=plot is not None)
    assert result.final is not None
    end_state = build_state(result.final, default_queue=cfg.default_queue)
    end = summarize(end_state)
    data: dict[str, Any] = {"cycles": [{"cycle": c.cycle, "wall_s": round(c.wall_s, 4), **c.summary,
                        **({"queues": c.queues} if past is not None else {})} for c in result.cycles],
            "stable": result.stable, "settled_after": result.settled_after,
            "end": {k: end[k] for k in ("nodes", "gpus", "pods", "pending_podgroups")}}
    ns = namespace_filter(namespace, all_namespaces)
    data["end"]["pending_podgroups"] = [pg for pg in data["end"]["pending_podgroups"]
                                        if in_namespace(pg["podgroup"], ns)]
    if plot is not None:
        from kai_opt.cli.simulate_plot import plot_queues

        plot_queues(result, plot, [n for q, n in enumerate(end_state.q_names) if end_state.q_is_leaf[q]])
    emit(data, output, table=lambda _wide: _render(data, result))


def _render(data: dict[str, Any], result: Any) -> None:
    t = Table(title="Cycles", title_justify="left")
    for col in ("cycle", "binds", "pipelines", "evictions", "GPUs after", "pending groups", "seconds"):
        t.add_column(col)
    for c in data["cycles"]:
        t.add_row(str(c["cycle"]), str(c["binds"]), str(c["pipelines"]), str(c["evictions"]),
                  fmt_num(c["gpus_allocated_after"]), str(c["podgroups_pending"]), f"{c['wall_s']:.3f}")
    con = console()
    con.print(t)
    g = data["end"]["gpus"]
    if result.settled_after is not None:
        con.print(f"settled after {result.settled_after} cycle{'s' if result.settled_after != 1 else ''}: the last "
                  f"changed nothing and no later cycle could")
    con.print(f"end: GPUs used {fmt_num(g['used'])}/{fmt_num(g['total'])}, pods {data['end']['pods']}, "
              f"{'stable' if result.stable else 'NOT stable (the last cycle still changed something)'}")
