"""The typer application, its lazy command registry, and shared option types.

Start-up cost rule: a command's module is imported only when that command runs (or its help is shown), so
`kai-opt --version`, `config`, `schema` and `manifests` never import the engine, OR-Tools, SciPy or the loaders.
`kai-opt --help` lists the commands from `COMMANDS` below without importing any of them.

Adding a command is one line in `COMMANDS`: its name, the one-line help shown in `kai-opt --help` (a test keeps
it equal to the first line of the command's docstring) and the module(s) that register it on `app` when imported
(`@app.command()`, or `app.add_typer(...)` for a group). For example:

    "queue": Lazy("Pending podgroups of a queue in the order the next cycle considers them.", "kai_opt.cli.queue"),

The start-up also skips the pydantic coercer typer builds for options that were not given (below).

A command module imports what only its command needs inside the command function, not at module level, when the
import is heavy and other commands of the same module do not need it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import typer
import typer.core
import typer.main
from typer.core import TyperGroup


@dataclass(frozen=True)
class Lazy:
    """One lazily imported command: its help line and the modules that register it on `app`."""

    help: str
    modules: tuple[str, ...]

    def __init__(self, help: str, *modules: str) -> None:
        object.__setattr__(self, "help", help)
        object.__setattr__(self, "modules", modules)


COMMANDS: dict[str, Lazy] = {
    "bench": Lazy("Benchmarks: engine comparisons on generated instances and trace replays.",
                  "kai_opt.cli.bench", "kai_opt.cli.bench_run", "kai_opt.cli.bench_trace"),
    "config": Lazy("Print the default configuration, or check a configuration file (one-line error naming the "
                   "field).", "kai_opt.cli.config_cmd"),
    "conformance": Lazy("Result per case: match, better (more work placed or fewer evictions, every rule kept), "
                        "mismatch (with the differences), skipped (unsupported features), error.",
                        "kai_opt.cli.conformance"),
    "dump": Lazy("Nodes, Pods, PodGroups, Queues, PriorityClasses and Topologies as one YAML List (managedFields "
                 "removed).", "kai_opt.cli.dump"),
    "explain": Lazy("Explain a pod, podgroup or queue: where and why it was placed, why it stays pending and what "
                    "would unblock it, or how its queue's fair share was computed.", "kai_opt.cli.explain"),
    "fairshare": Lazy("The queue tree with deserved, limit, over-quota weight, fair share, allocatable share, "
                      "allocated, requested and the DRF (dominant resource) share per resource; with --usage, each "
                      "queue's past usage (the time-based fair share term, normalised to the window's capacity) "
                      "too.", "kai_opt.cli.fairshare"),
    "manifests": Lazy("Print everything needed to run kai-opt in a cluster as multi-document YAML (`| kubectl "
                      "apply -f -`): what `helm template --include-crds -n NAMESPACE -f VALUES deploy/helm/kai-opt` "
                      "renders, or apply it (--apply).", "kai_opt.cli.manifests"),
    "queue": Lazy("Pending PodGroups in the order the next cycle considers them: position overall and in their "
                  "queue, requested resources, the queue's fair-share deficit (fair share - allocated) and why each "
                  "stays pending.", "kai_opt.cli.queue"),
    "run": Lazy("Schedule the cluster's pods (schedulerName in config scheduler_names) every schedule_period_s.",
                "kai_opt.cli.run"),
    "schema": Lazy("Print the JSON Schema of the scenario format (`kind: Scenario`), for editors and validation.",
                   "kai_opt.cli.schema"),
    "show": Lazy("Cluster totals, the queue tree with quota/limit/allocated/requested, and pending podgroups.",
                 "kai_opt.cli.show"),
    "simulate": Lazy("Run up to N cycles, applying each plan in memory (binds run, pipelined pods wait for their "
                     "victims, evicted pods return to pending), then report every cycle and whether the last one "
                     "changed nothing (stable). The run stops early once the cluster has settled: a cycle changed "
                     "nothing and no later cycle could (not with --usage: the usage term changes every cycle).",
                     "kai_opt.cli.simulate"),
    "solve": Lazy("Run one scheduling cycle on SNAPSHOT and print binds, pipelines, evictions and pending reasons.",
                  "kai_opt.cli.solve"),
}


# -- no pydantic import for options that were not given -------------------------------------------------------------
# Typer 0.29 coerces an option's value through a pydantic `TypeAdapter` it builds on first use, and it builds one for
# every option of the command line, given or not (`--help`, `--install-completion`, `--show-completion` and each
# absent option arrive as None), so every command paid the pydantic import (0.15 s) before doing anything. A None
# value needs no coercer: typer's `RuntimeParam.coerce` returns None (or `()` for a multi-value option) for it
# without calling one. So a None value is processed with a coercer that builds nothing; every given value goes
# through typer's own adapter as before (same conversions, same error messages). With a typer that has no such hook
# nothing changes but the speed (tests/test_cli_startup.py then finds pydantic in the light commands).
_Param: Any = getattr(typer.core, "_TyperParameter", None)


def _skip_coercing_none() -> None:
    """Process None values of typer's parameters without building their pydantic coercer (once per process)."""
    try:
        from typer._coercion import PassThroughRuntimeParam
    except ImportError:
        return
    process = getattr(_Param, "process_value", None)
    if process is None or not hasattr(_Param, "get_runtime_param") or getattr(process, "_kai_opt", False):
        return

    def process_value(self: Any, ctx: Any, value: Any) -> Any:
        if value is not None or getattr(self, "_runtime_param", True) is not None:
            return process(self, ctx, value)
        desc = self.type_descriptor
        self._runtime_param = PassThroughRuntimeParam(annotation=desc.annotation, parameter_info=desc.parameter_info)
        try:  # RuntimeParam.coerce answers None itself: this coercer's own conversion is never called
            return process(self, ctx, value)
        finally:
            self._runtime_param = None  # a value given later builds typer's adapter as usual

    process_value._kai_opt = True  # type: ignore[attr-defined]
    _Param.process_value = process_value


_skip_coercing_none()


class LazyGroup(TyperGroup):
    """The root click group: commands of `COMMANDS` are imported and built on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands[cmd_name] = load_command(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list of `kai-opt --help` from the registry's help lines (nothing imported)."""
        limit = formatter.width - 6 - max((len(n) for n in self.list_commands(ctx)), default=0)
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name)
            if cmd is not None:
                if cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(limit)))
            else:
                rows.append((name, _short(COMMANDS[name].help, limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _short(text: str, limit: int) -> str:
    """The first sentence of a help text if it fits in `limit` characters, else as many whole words as fit with
    "..." (click's rule for a command's short help; typer vendors click, so it is not imported here)."""
    words = text.split()
    kept: list[str] = []
    length = 0
    for word in words:
        length += len(word) + (1 if kept else 0)
        if length > limit:
            break
        kept.append(word)
        if word.endswith("."):
            return " ".join(kept)
    else:
        return " ".join(kept)
    while kept and len(" ".join(kept)) + 3 > limit:
        kept.pop()
    return " ".join(kept) + "..."


app = typer.Typer(
    name="kai-opt",
    help="Optimization-based Kubernetes scheduler for AI/GPU clusters (KAI-Scheduler compatible).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=LazyGroup,
)


def load_command(name: str) -> Any:
    """Import the modules of command `name` and build its click command from what they registered on `app`."""
    for module in COMMANDS[name].modules:
        importlib.import_module(module)
    for info in app.registered_commands:
        if (info.name or typer.main.get_command_name(info.callback.__name__)) == name:  # type: ignore[union-attr]
            return typer.main.get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                                    rich_markup_mode=app.rich_markup_mode)
    for group in app.registered_groups:
        if group.name == name:
            return typer.main.get_group_from_info(group, pretty_exceptions_short=app.pretty_exceptions_short,
                                                  suggest_commands=app.suggest_commands,
                                                  rich_markup_mode=app.rich_markup_mode)
    raise LookupError(f"modules {COMMANDS[name].modules} registered no command {name!r}")


def load_all() -> None:
    """Import every command module (tests and documentation walk the whole command tree)."""
    for lazy in COMMANDS.values():
        for module in lazy.modules:
            importlib.import_module(module)


class Output(StrEnum):
    table = "table"
    json = "json"


class OutputWithYaml(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def _version(value: bool) -> None:
    if value:
        from kai_opt import __version__

        typer.echo(f"kai-opt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Optimization-based Kubernetes scheduler for AI/GPU clusters (KAI-Scheduler compatible)."""
