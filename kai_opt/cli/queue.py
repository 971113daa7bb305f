"""`kai-opt queue [QUEUE] [SNAPSHOT]`: pending PodGroups in the order the next greedy cycle takes them up (Kueue's
visibility API as the anchor), with position overall and within the queue, requested resources, the queue's
fair-share deficit and what the cycle does with each (the plan's pending reasons)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kai_opt.cli.app import OutputWithYaml, app
from kai_opt.cli.solve import SHARD_HELP, of_shard
from kai_opt.cli.source import STDIN, context_option, kubeconfig_option, load

if TYPE_CHECKING:
    from kai_opt.config import Config
    from kai_opt.fairshare import FairShare
    from kai_opt.plan import Plan
    from kai_opt.state import ClusterState


@app.command()
def queue(
    args: list[str] | None = typer.Argument(None, metavar="[QUEUE] [SNAPSHOT]", help="an optional queue name "
                                            "(its subtree's PodGroups only) and the snapshot file or directory "
                                            "(`-`: stdin; none: the live cluster), in either order: the argument "
                                            "that is `-` or an existing path is the snapshot"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    engine: str | None = typer.Option(None, "--engine", "-e", help="greedy or cpsat: the engine whose plan gives "
                                      "the blocking reasons (default: from config)"),
    output: OutputWithYaml = typer.Option(OutputWithYaml.table, "--output", "-o", help="table, json or yaml"),
    kubeconfig: Path | None = kubeconfig_option(),
    context: str | None = context_option(),
    shard: str | None = typer.Option(None, "--shard", help=SHARD_HELP),
) -> None:
    """Pending PodGroups in the order the next cycle considers them: position overall and in their queue,
    requested resources, the queue's fair-share deficit (fair share - allocated) and why each stays pending."""
    from kai_opt.config import Engine, load_config
    from kai_opt.errors import KaiOptError

    name, snapshot = queue_and_snapshot(list(args or []))
    try:
        eng = Engine(engine) if engine is not None else None
    except ValueError:
        raise KaiOptError(f"unknown engine {engine!r} (greedy or cpsat)") from None
    cfg = load_config(config)
    snap = of_shard(load(snapshot, kubeconfig=kubeconfig, context=context), cfg, shard)
    from kai_opt.engine import run_cycle
    from kai_opt.state import build_state

    state = build_state(snap, default_queue=cfg.default_queue)
    plan, fs = run_cycle(state, cfg, engine=eng)
    data = queue_report(state, cfg, plan, fs, name)
    if output == OutputWithYaml.json:
        from kai_opt.cli.render import print_json

        print_json(data)
    elif output == OutputWithYaml.yaml:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        render(data)


def queue_and_snapshot(args: list[str]) -> tuple[str | None, str | None]:
    """(queue name, snapshot) from up to two arguments in either order: `-` or an existing path is the snapshot."""
    from kai_opt.errors import KaiOptError

    if len(args) > 2:
        raise KaiOptError(f"queue takes [QUEUE] [SNAPSHOT], got {len(args)} arguments")
    snaps = [a for a in args if a == STDIN or Path(a).exists()]
    names = [a for a in args if a not in snaps]
    if len(snaps) > 1 or len(names) > 1:
        raise KaiOptError(f"queue takes one queue name and one snapshot, got {args}")
    return (names[0] if names else None), (snaps[0] if snaps else None)


def queue_report(state: ClusterState, config: Config, plan: Plan, fs: FairShare,
                 name: str | None = None) -> dict[str, Any]:
    """The rows `kai-opt queue` prints (JSON-able): one per positioned group of `name`'s subtree (all when None),
    in position order, then the pending groups the cycle never takes up (no position)."""
    from kai_opt.explain.context import find_queue
    from kai_opt.explain.pending import reason_dict
    from kai_opt.heuristics.positions import queue_positions
    from kai_opt.state.resources import QR

    within: set[int] | None = None
    if name is not None:
        top = find_queue(state, name)
        within = {q for q in range(state.n_queues) if top in state_ancestors(state, q)}
    pos = queue_positions(state, fs, config)
    placed: dict[int, list[int]] = {}
    for pl in plan.placements:
        g = int(state.pod_pg[pl.pod])
        if g >= 0 and not pl.moved:
            placed.setdefault(g, [0, 0])[1 if pl.pipelined else 0] += 1
    rows: list[dict[str, Any]] = []
    pending = sorted(plan.pending, key=lambda g: (g not in pos, pos[g].overall if g in pos else 0,
                                                  state.pg_keys[g]))
    groups = sorted(pos, key=lambda g: pos[g].overall) + [g for g in pending if g not in pos]
    for g in groups:
        q = int(state.pg_queue[g])
        if within is not None and q not in within:
            continue
        p = pos.get(g)
        row: dict[str, Any] = {
            "podgroup": state.pg_keys[g], "queue": state.q_names[q] if q >= 0 else None,
            "position": p.overall if p else None, "position_in_queue": p.in_queue if p else None,
            "priority": int(state.pg_priority[g]),
            "requested": {res: p.request[r] for r, res in enumerate(QR)} if p else None,
            "fair_share_deficit": ({res: float(fs.fair_share[q, r] - fs.allocated[q, r])
                                    for r, res in enumerate(QR)} if q >= 0 else None),
        }
        if g in placed:
            row["cycle"] = f"placed: {placed[g][0]} bind, {placed[g][1]} pipeline"
        if g in plan.pending:
            row["cycle"] = "pending" + (f" (also placed: {placed[g][0]} bind, {placed[g][1]} pipeline)"
                                        if g in placed else "")
            row["reasons"] = [reason_dict(r) for r in plan.pending[g]]
        rows.append(row)
    return {"queue": name, "engine": plan.engine, "podgroups": rows}


def state_ancestors(state: ClusterState, q: int) -> list[int]:
    """q and its ancestors."""
    out = []
    while q >= 0:
        out.append(q)
        q = int(state.q_parent[q])
    return out


def render(data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kai_opt.cli.render import console, fmt_num
    from kai_opt.units import format_quantity

    def res(d: dict[str, float] | None) -> str:
        if d is None:
            return "-"
        return (f"gpu {fmt_num(d['gpu'])}, cpu {format_quantity('cpu', d['cpu'])}, "
                f"mem {format_quantity('memory', d['memory'])}")

    c = console()
    title = f"Pending PodGroups{' of queue ' + data['queue'] if data['queue'] else ''} in the order the next " \
            f"cycle considers them (engine {data['engine']})"
    t = Table(title=title, title_justify="left")
    for col in ("#", "in queue", "podgroup", "queue", "prio", "requested", "queue deficit", "this cycle"):
        t.add_column(col)
    for r in data["podgroups"]:
        why = "; ".join(x["message"] for x in r.get("reasons", []))
        cycle = r.get("cycle", "")
        t.add_row(str(r["position"] or "-"), str(r["position_in_queue"] or "-"), r["podgroup"], r["queue"] or "-",
                  str(r["priority"]), res(r["requested"]), res(r["fair_share_deficit"]),
                  escape(cycle + (f": {why}" if why else "")))
    c.print(t)
    if not data["podgroups"]:
        c.print("no pending PodGroups")
