"""`kai-opt simulate SNAPSHOT --cycles N`: apply each cycle's plan in memory and report the end state."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from kai_opt.bench.plots import pyplot
from kai_opt.cli.app import Output, app
from kai_opt.cli.render import console, fmt_num, print_json, status_line
from kai_opt.cli.simulate_plot import plot_queues
from kai_opt.cli.solve import SHARD_HELP, of_shard
from kai_opt.config import load_config
from kai_opt.loaders import load_snapshot
from kai_opt.loaders.usage_file import load_usage_file
from kai_opt.simulate import MAX_CYCLES
from kai_opt.simulate import simulate as run_simulation
from kai_opt.state import build_state
from kai_opt.summary import summarize

MAX_PERIOD_S = 30 * 86400.0  # --period above this is a usage error


@app.command()
def simulate(
    snapshot: Path = typer.Argument(..., help="Snapshot file or directory"),
    cycles: int = typer.Option(5, "--cycles", "-n", min=1, max=MAX_CYCLES,
                               help="Cycles to run at most (the run stops once the cluster has settled)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    output: Output = typer.Option(Output.table, "--output", "-o", help="table or json"),
    usage: Path | None = typer.Option(None, "--usage", help="Usage file: past usage per queue as of the first "
                                      "cycle (time-based fair share); the run adds what queues hold as it goes"),
    period: float | None = typer.Option(None, "--period", min=0.001, max=MAX_PERIOD_S,
                                        help="Seconds between cycles (default: schedule_period_s)"),
    plot: Path | None = typer.Option(None, "--plot", help="Write a PNG: GPUs allocated and fair share per leaf "
                                     "queue over the cycles (and the usage term with --usage)"),
    shard: str | None = typer.Option(None, "--shard", help=SHARD_HELP),
) -> None:
    """Run up to N cycles, applying each plan in memory (binds run, pipelined pods wait for their victims, evicted
    pods return to pending), then report every cycle and whether the last one changed nothing (stable). The run
    stops early once the cluster has settled: a cycle changed nothing and no later cycle could (not with --usage:
    the usage term changes every cycle)."""
    if plot is not None:
        pyplot()  # matplotlib (the bench extra) is there, before the simulation
    cfg = load_config(config)
    past = load_usage_file(usage) if usage is not None else None
    with status_line("loading the snapshot") as say:
        snap = of_shard(load_snapshot(snapshot), cfg, shard)
        result = run_simulation(snap, cfg, cycles, progress=say, usage=past, period_s=period,
                                queue_stats=plot is not None)
    assert result.final is not None
    end_state = build_state(result.final, default_queue=cfg.default_queue)
    end = summarize(end_state)
    data = {"cycles": [{"cycle": c.cycle, "wall_s": round(c.wall_s, 4), **c.summary,
                        **({"queues": c.queues} if past is not None else {})} for c in result.cycles],
            "stable": result.stable, "settled_after": result.settled_after,
            "end": {k: end[k] for k in ("nodes", "gpus", "pods", "pending_podgroups")}}
    if plot is not None:
        plot_queues(result, plot, [n for q, n in enumerate(end_state.q_names) if end_state.q_is_leaf[q]])
    if output == Output.json:
        print_json(data)
        return
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
