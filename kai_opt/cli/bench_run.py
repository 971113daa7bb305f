"""`kai-opt bench run`: kai-opt's engines and the peer baselines side by side on generated instances, each result
against the instance's LP upper bound, with timing, memory, a report and plots."""

from __future__ import annotations

import os
import platform
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kai_opt.bench import instances as inst
from kai_opt.bench import plots, report, runner
from kai_opt.cli.bench import bench_app
from kai_opt.cli.render import print_json
from kai_opt.config import Config, load_config
from kai_opt.errors import InputError

DEFAULT_REPEATS, QUICK_REPEATS = 3, 1


class RunOutput(StrEnum):
    table = "table"
    json = "json"
    markdown = "markdown"


def parse_engines(text: str | None) -> list[str]:
    if not text:
        return list(runner.DEFAULT_ENGINES)
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if not names:
        raise InputError("no engine given", field="--engines")
    for n in names:
        if n not in runner.ALL_ENGINES:
            raise InputError(f"unknown engine {n!r} (known: {', '.join(runner.ALL_ENGINES)})", field="--engines")
    return names


def _config(path: Path | None, deterministic: bool | None, time_budget: float | None) -> Config:
    config = load_config(path)
    solver: dict[str, Any] = {}
    if deterministic is not None:
        solver["deterministic"] = deterministic
    if time_budget is not None:
        if not 0 < time_budget <= 3600:
            raise InputError(f"{time_budget:g} is out of range (0, 3600]", field="--time-budget")
        solver["time_budget_s"] = time_budget
    return config.model_copy(update={"solver": config.solver.model_copy(update=solver)}) if solver else config


@bench_app.command("run")
def run_cmd(
    families: str | None = typer.Option(None, "--families", help="Comma-separated families (default: all)"),
    sizes: str | None = typer.Option(None, "--sizes", help="Comma-separated node counts, 10..10000 "
                                     f"(default: {','.join(map(str, inst.DEFAULT_SIZES))})"),
    seeds: int = typer.Option(1, "--seeds", help="Instances per family and size (seeds 0..N-1)"),
    engines: str | None = typer.Option(None, "--engines", help="Comma-separated engines (default: "
                                       f"{','.join(runner.DEFAULT_ENGINES)}; also: random)"),
    output: RunOutput = typer.Option(RunOutput.table, "--output", "-o", help="table, json or markdown"),
    plot: Path | None = typer.Option(None, "--plot", help="Directory for the PNG plots"),
    quick: bool = typer.Option(False, "--quick", help=f"One {inst.QUICK_SIZE}-node instance per family, one "
                               "repeat (CI, reviewers)"),
    config: Path | None = typer.Option(None, "--config", help="kai-opt config (solver budget, actions, ...)"),
    repeats: int | None = typer.Option(None, "--repeats", help=f"Cycles per engine and instance for the "
                                       f"timing percentiles (default {DEFAULT_REPEATS}, --quick {QUICK_REPEATS})"),
    deterministic: bool | None = typer.Option(None, "--deterministic/--wall-time", help="CP-SAT with a "
                                              "deterministic time limit and one worker (default: the config's)"),
    time_budget: float | None = typer.Option(None, "--time-budget", help="CP-SAT time budget per cycle, s "
                                             "(default: the config's)"),
) -> None:
    """Run kai-opt's engines and the peer baselines on seeded instances of the benchmark families; report GPUs
    allocated against the LP upper bound, fragmentation, fairness, cycle time and memory."""
    if plot is not None:
        plots.pyplot()  # matplotlib (the bench extra) is there, before the run
    fams = inst.parse_families(families)
    size_list = inst.parse_sizes(sizes if sizes is not None or not quick else str(inst.QUICK_SIZE))
    names = parse_engines(engines)
    reps = repeats if repeats is not None else (QUICK_REPEATS if quick else DEFAULT_REPEATS)
    if reps < 1:
        raise InputError(f"repeats must be at least 1, got {reps}", field="--repeats")
    cfg = _config(config, deterministic, time_budget)
    todo = inst.instances(fams, size_list, 1 if quick else seeds)
    infos, rows = _run(todo, names, cfg, reps)
    settings = {"families": fams, "sizes": size_list, "seeds": 1 if quick else seeds, "engines": names,
                "repeats": reps, "quick": quick,
                "solver": {"time_budget_s": cfg.solver.time_budget_s, "deterministic": cfg.solver.deterministic,
                           "workers": cfg.solver.workers},
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}}
    notes = [*report.SUMMARY_NOTES,
             f"{len(todo)} instances x {len(names)} engines, {reps} repeat(s) each; CP-SAT budget "
             f"{cfg.solver.time_budget_s:g}s{' (deterministic)' if cfg.solver.deterministic else ''}; "
             f"{os.cpu_count()} CPUs"]
    if plot is not None:
        written = plots.write_all(rows, plot)
        notes.append("plots: " + ", ".join(str(p) for p in written))
    if output == RunOutput.json:
        print_json(report.document(rows, infos, notes, settings))
    elif output == RunOutput.markdown:
        print(report.markdown(rows, notes))
    else:
        report.print_tables(rows, notes)
    failed = [r for r in rows if r.get("error")]
    if failed:
        Console(stderr=True).print(f"[red]{len(failed)} engine run(s) failed or failed the checker: "
                                   + "; ".join(f"{r['instance']}/{r['engine']}: {r['error']}" for r in failed[:3]),
                                   highlight=False)
        raise typer.Exit(1)


def _run(todo: list[inst.Instance], names: list[str], cfg: Config,
         reps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    err = Console(stderr=True)
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    infos: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("bench", total=len(todo) * (len(names) + 1))

        def tick(what: str, n: int) -> None:
            if what:
                progress.update(task, description=what[:40])
            if n:
                progress.advance(task, n)

        for instance in todo:
            info, got = runner.run_instance(instance, names, cfg, reps, tick)
            infos.append(info)
            rows += got
    return infos, rows
