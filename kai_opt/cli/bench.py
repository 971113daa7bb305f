"""The `kai-opt bench` command group: `bench run` (engines, baselines and the LP bound on generated instances)
and `bench trace` (the openb trace replay)."""

from __future__ import annotations

import typer

from kai_opt.cli.app import app

bench_app = typer.Typer(help="Benchmarks: engine comparisons on generated instances and trace replays.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
