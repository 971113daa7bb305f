"""`kai-opt conformance DIR`: run KAI-Scheduler behaviour cases and compare with their expectations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress
from rich.table import Table

from kai_opt.cli.app import app
from kai_opt.cli.render import console, emit
from kai_opt.cli.source import Format, output_option
from kai_opt.config import Engine, load_config


@app.command()
def conformance(
    directory: Path = typer.Argument(..., help="Directory (or one file) of cases in the schema of "
                                     "../shared/scenarios/kai/README.md"),
    engine: Engine | None = typer.Option(None, "--engine", "-e", help="greedy or cpsat (default: from config)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    output: Format = output_option(Format.table),
    show: str = typer.Option("mismatch,error,better", "--show", help="results to list in the table"),
) -> None:
    """Result per case: match, better (more work placed or fewer evictions, every rule kept), mismatch (with the
    differences), skipped (unsupported features), error.

    Exits 1 when a case is a mismatch or an error (as a failed check), 0 otherwise."""
    from kai_opt.conformance import run_case, summarize_results
    from kai_opt.loaders.kaicase import load_cases

    cfg = load_config(config)
    eng = engine or cfg.engine
    cases = load_cases(directory)
    results = []
    with Progress(console=console(), transient=True, disable=output not in (Format.table, Format.wide)) as progress:
        task = progress.add_task("cases", total=len(cases))
        for case in cases:
            results.append(run_case(case, cfg, eng))
            progress.advance(task)
    summary = summarize_results(results)
    data = {"engine": eng.value, "summary": summary,
            "cases": [{"file": r.file, "result": r.result, "detail": r.detail,
                       **({"differences": r.differences} if r.differences else {})} for r in results]}
    wanted = set(show.split(","))
    emit(data, output, names=lambda: [f"case/{Path(r.file).name}" for r in results if r.result in wanted],
         table=lambda _wide: _render(results, summary, wanted, eng.value))
    if summary["mismatch"] or summary["error"]:
        raise typer.Exit(1)


def _render(results: list[Any], summary: dict[str, int], wanted: set[str], engine: str) -> None:
    t = Table(title=f"Conformance ({engine})", title_justify="left")
    t.add_column("case")
    t.add_column("result")
    t.add_column("detail")
    for r in results:
        if r.result in wanted:
            t.add_row(Path(r.file).name, r.result, r.detail)
    c = console()
    c.print(t)
    supported = summary["total"] - summary["skipped"]
    ok = summary["match"] + summary["better"]
    c.print(f"total {summary['total']}: match {summary['match']}, better {summary['better']}, "
            f"mismatch {summary['mismatch']}, error {summary['error']}, skipped {summary['skipped']}; "
            f"match-or-better {ok}/{supported} = {100 * ok / max(1, supported):.1f}% of supported cases")
