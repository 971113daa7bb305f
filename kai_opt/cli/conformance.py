"""`kai-opt conformance DIR`: run KAI-Scheduler behaviour cases and compare with their expectations."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import Progress
from rich.table import Table

from kai_opt.cli.app import Output, app
from kai_opt.cli.render import console, print_json
from kai_opt.config import Engine, load_config
from kai_opt.conformance import run_case, summarize_results
from kai_opt.loaders.kaicase import load_cases


@app.command()
def conformance(
    directory: Path = typer.Argument(..., help="Directory (or one file) of cases in the schema of "
                                     "../shared/scenarios/kai/README.md"),
    engine: Engine | None = typer.Option(None, "--engine", "-e", help="greedy or cpsat (default: from config)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    output: Output = typer.Option(Output.table, "--output", "-o", help="table or json"),
    show: str = typer.Option("mismatch,error,better", "--show", help="results to list in the table"),
) -> None:
    """Result per case: match, better (more work placed or fewer evictions, every rule kept), mismatch (with the
    differences), skipped (unsupported features), error."""
    cfg = load_config(config)
    eng = engine or cfg.engine
    cases = load_cases(directory)
    results = []
    with Progress(console=console(), transient=True, disable=output == Output.json) as progress:
        task = progress.add_task("cases", total=len(cases))
        for case in cases:
            results.append(run_case(case, cfg, eng))
            progress.advance(task)
    summary = summarize_results(results)
    if output == Output.json:
        print_json({"engine": eng.value, "summary": summary,
                    "cases": [{"file": r.file, "result": r.result, "detail": r.detail,
                               **({"differences": r.differences} if r.differences else {})} for r in results]})
        return
    wanted = set(show.split(","))
    t = Table(title=f"Conformance ({eng.value})", title_justify="left")
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
