"""`kai-opt simulate SNAPSHOT --cycles N`: apply each cycle's plan in memory and report the end state."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from kai_opt.cli.app import Output, app
from kai_opt.cli.render import console, fmt_num, print_json, status_line
from kai_opt.config import load_config
from kai_opt.loaders import load_snapshot
from kai_opt.simulate import MAX_CYCLES
from kai_opt.simulate import simulate as run_simulation
from kai_opt.state import build_state
from kai_opt.summary import summarize


@app.command()
def simulate(
    snapshot: Path = typer.Argument(..., help="Snapshot file or directory"),
    cycles: int = typer.Option(5, "--cycles", "-n", min=1, max=MAX_CYCLES,
                               help="Cycles to run at most (the run stops once the cluster has settled)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    output: Output = typer.Option(Output.table, "--output", "-o", help="table or json"),
) -> None:
    """Run up to N cycles, applying each plan in memory (binds run, pipelined pods wait for their victims, evicted
    pods return to pending), then report every cycle and whether the last one changed nothing (stable). The run
    stops early once the cluster has settled: a cycle changed nothing and no later cycle could."""
    cfg = load_config(config)
    with status_line("loading the snapshot") as say:
        snap = load_snapshot(snapshot)
        result = run_simulation(snap, cfg, cycles, progress=say)
    assert result.final is not None
    end = summarize(build_state(result.final, default_queue=cfg.default_queue))
    data = {"cycles": [{"cycle": c.cycle, "wall_s": round(c.wall_s, 4), **c.summary} for c in result.cycles],
            "stable": result.stable, "settled_after": result.settled_after,
            "end": {k: end[k] for k in ("nodes", "gpus", "pods", "pending_podgroups")}}
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
