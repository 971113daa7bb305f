"""`kai-opt explain [SNAPSHOT] KIND/NAME` (or `--pod NS/NAME | --podgroup NS/NAME | --queue NAME`): why it ends the
cycle the way it does (kai_opt/explain). Table for people, JSON/YAML for tools. Without SNAPSHOT it reads the live
cluster: `kubectl kai-opt explain -n team-a pod/foo`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from kai_opt.cli.app import app
from kai_opt.cli.render import console, emit, fmt_num
from kai_opt.cli.solve import SHARD_HELP, of_shard
from kai_opt.cli.source import FormatNoName, context_option, kubeconfig_option, load, output_option
from kai_opt.config import Engine
from kai_opt.errors import KaiOptError

# kubectl's kinds and short names of a KIND/NAME target
_KINDS = {"pod": "pod", "pods": "pod", "po": "pod", "podgroup": "podgroup", "podgroups": "podgroup",
          "pg": "podgroup", "queue": "queue", "queues": "queue", "q": "queue"}
_TARGET = re.compile(r"^(?P<kind>[a-z]+)/(?P<name>[^/\s]+(?:/[^/\s]+)?)$")


def split_args(args: list[str], namespace: str | None) -> tuple[str | None, dict[str, str]]:
    """(snapshot, {kind: name}) of the positional arguments `[SNAPSHOT] [KIND/NAME]`. KIND/NAME is recognised by
    its kind (pod, po, podgroup, pg, queue, q and plurals); NAME is `name` (namespace from -n, else default) or
    `ns/name`. A snapshot path that looks like a target is written `./pod/...`."""
    snapshot: str | None = None
    target: dict[str, str] = {}
    for arg in args:
        m = _TARGET.match(arg)
        if m and m["kind"] in _KINDS and not target:
            kind, name = _KINDS[m["kind"]], m["name"]
            if kind == "queue":
                if "/" in name:
                    raise KaiOptError(f"{arg}: a queue has no namespace (queue/NAME)")
            elif "/" not in name:
                name = f"{namespace or 'default'}/{name}"
            elif namespace is not None and name.split("/", 1)[0] != namespace:
                raise KaiOptError(f"{arg}: its namespace differs from -n {namespace}")
            target[kind] = name
        elif snapshot is None and not target:
            snapshot = arg
        else:
            raise KaiOptError(f"unexpected argument {arg!r} (arguments: [SNAPSHOT] [KIND/NAME])")
    return snapshot, target


@app.command()
def explain(
    args: list[str] | None = typer.Argument(None, metavar="[SNAPSHOT] [KIND/NAME]", help="Snapshot file or "
                                            "directory (`-`: stdin; none: the live cluster), then what to explain: "
                                            "pod/NAME, podgroup/NAME (pg/), queue/NAME (q/); NAME may be NS/NAME"),
    pod: str | None = typer.Option(None, "--pod", help="NS/NAME of a pod"),
    podgroup: str | None = typer.Option(None, "--podgroup", help="NS/NAME of a podgroup"),
    queue: str | None = typer.Option(None, "--queue", help="name of a queue"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    engine: Engine | None = typer.Option(None, "--engine", "-e", help="greedy or cpsat (default: from config)"),
    plan: Path | None = typer.Option(None, "--plan", help="explain this plan (`kai-opt solve -o json`) instead of "
                                     "computing one"),
    output: FormatNoName = output_option(FormatNoName.table),
    kubeconfig: Path | None = kubeconfig_option(),
    context: str | None = context_option(),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="namespace of a pod/NAME or "
                                         "podgroup/NAME target (default: default)"),
    shard: str | None = typer.Option(None, "--shard", help=SHARD_HELP),
) -> None:
    """Explain a pod, podgroup or queue: where and why it was placed, why it stays pending and what would
    unblock it, or how its queue's fair share was computed."""
    snapshot, target = split_args(list(args or []), namespace)
    given = {"pod": pod, "podgroup": podgroup, "queue": queue}
    for kind, name in target.items():
        if given[kind] is not None:
            raise KaiOptError(f"give exactly one of KIND/NAME, --pod, --podgroup, --queue (both {kind}/"
                              f"{name.split('/')[-1]} and --{kind})")
        given[kind] = name
    if sum(v is not None for v in given.values()) != 1:
        raise KaiOptError("give exactly one of --pod, --podgroup, --queue")
    pod, podgroup, queue = given["pod"], given["podgroup"], given["queue"]
    from kai_opt.config import load_config
    from kai_opt.explain import explain as run_explain
    from kai_opt.explain.planfile import load_plan
    from kai_opt.state import build_state

    cfg = load_config(config)
    state = build_state(of_shard(load(snapshot, kubeconfig=kubeconfig, context=context, scheduler_names=None),
                                 cfg, shard),
                        default_queue=cfg.default_queue)
    the_plan = load_plan(plan, state) if plan is not None else None
    data = run_explain(state, cfg, pod=pod, podgroup=podgroup, queue=queue, plan=the_plan, engine=engine)
    emit(data, output, table=lambda _wide: render_queue(data) if queue is not None else render_group(data))


def qty(res: str, x: float) -> str:
    from kai_opt.explain.context import qty as explain_qty

    return explain_qty(res, x)


# -- tables ----------------------------------------------------------------------------------------------------
def _head(data: dict[str, Any]) -> None:
    c = console()
    solver = data.get("solver", {})
    c.print(f"[bold]{data['target']['kind']} {escape(data['target']['name'])}[/]   engine {data['engine']} "
            f"({solver.get('status', '')})")


def render_group(data: dict[str, Any]) -> None:
    c = console()
    _head(data)
    for line in data.get("summary", []):
        c.print(f"  - {escape(line)}")
    placed = data.get("placed")
    if placed:
        t = Table(title="Placements", title_justify="left")
        for col in ("pod", "node", "gpus", "how", "rank", "decided by", "waits for"):
            t.add_column(col)
        for p in placed["pods"]:
            rank = p.get("chosen", {}).get("rank")
            t.add_row(p["pod"], p["node"], ",".join(map(str, p["gpu_devices"])), p["how"],
                      f"{rank}/{p['feasible_nodes']}" if rank else "-", escape(p.get("decided_by", "")),
                      ", ".join(w["pod"] for w in p.get("waits_for", [])))
        c.print(t)
        for p in placed["pods"][:1]:
            _alternatives(p)
    pend = data.get("pending")
    if pend:
        _pending(pend)


def _alternatives(p: dict[str, Any]) -> None:
    t = Table(title=f"Score terms for {p['pod']} (chosen first, then the best alternatives)", title_justify="left")
    for col in ("node", "rank", "fits", "tier", "terms", "packing", "GPUs left"):
        t.add_column(col)
    rows = [p["chosen"]] if "terms" in p.get("chosen", {}) else []
    for e in rows + p.get("alternatives", []):
        terms = ", ".join(f"{k} {v}" for k, v in e["terms"].items() if v)
        t.add_row(e["node"], str(e["rank"]), e["fits"], str(e["tier"]), terms or "-", escape(e["packing"]),
                  str(e.get("fragmentation", {}).get("gpus_left", "")))
    console().print(t)


def _pending(pend: dict[str, Any]) -> None:
    c = console()
    for n in pend.get("nodes", []):
        t = Table(title=f"Nodes for {n['pods']} pod(s) like {n['pod']}"
                  + (f" (subgroup {n['subgroup']})" if n.get("subgroup") else ""), title_justify="left")
        t.add_column("nodes")
        t.add_column("reason")
        for reason, count in n["reasons"].items():
            t.add_row(str(count), escape(reason))
        t.add_row(str(n["nodes_that_fit_one_pod"]), "can hold one pod")
        c.print(t)
    ub = pend.get("unblock") or {}
    if ub.get("options"):
        t = Table(title="What would unblock it (solver, smallest change of each kind)", title_justify="left")
        t.add_column("change")
        t.add_column("what")
        for o in ub["options"]:
            t.add_row(o["change"], escape(o["text"]))
        c.print(t)


def render_queue(data: dict[str, Any]) -> None:
    c = console()
    _head(data)
    c.print(f"path {' > '.join(data['path'])}; priority {data['priority']}; DRF share {data['drf_share']:.3f}"
            f"{'; over its fair share' if data['over_fair_share'] else ''}")
    if not data.get("consistent_with_cycle", True):
        c.print("[red]the traced division differs from the cycle's fair share[/]")
    for res, e in data["resources"].items():
        c.print(f"[bold]{res}[/]: fair share {qty(res, e['fair_share'])}; allocatable {escape(e['allocatable_rule'])}"
                f"; allocated {qty(res, e['allocated'])} (after plan {qty(res, e['allocated_after_plan'])}); "
                f"requested {qty(res, e['requested'])}")
        for lv in e["levels"]:
            unit = {"gpu": "GPUs", "cpu": "CPU cores", "memory": "GiB"}[res]
            t = Table(title=f"{res} ({unit}): {lv['divided_by']} divides {qty(res, lv['amount'])} "
                      f"(left undivided {qty(res, lv['left_undivided'])})", title_justify="left")
            for col in ("queue", "deserved", "limit", "weight", "priority", "request", "requestable", "fair share"):
                t.add_column(col)
            for s in lv["siblings"]:
                name = f"[bold]{s['queue']}[/]" if s["queue"] == lv["queue"] else s["queue"]
                t.add_row(name, _num(res, s["deserved"]), _num(res, s["limit"]), fmt_num(s["weight"]),
                          str(s["priority"]), _num(res, s["request"]), _num(res, s["requestable"]),
                          _num(res, s["fair_share"]))
            c.print(t)
            for step in lv["steps"]:
                c.print(f"    {lv['queue']}: {escape(step)}")
    work = data["work"]
    c.print(f"podgroups {work['podgroups']}: {len(work['placed'])} placed, {len(work['evicted'])} with evictions, "
            f"{len(work['pending'])} pending, {work['running_untouched']} running untouched")
    if work["pending"]:
        t = Table(title="Pending work", title_justify="left")
        t.add_column("podgroup")
        t.add_column("priority")
        t.add_column("reasons")
        for p in work["pending"]:
            t.add_row(p["podgroup"], str(p["priority"]), escape("\n".join(f"{r['code']}: {r['message']}"
                                                                          for r in p["reasons"])))
        c.print(t)


def _num(res: str, x: float) -> str:
    """A queue quantity without its unit (the table title names the resource): GPUs, CPU cores, GiB."""
    if x == -1:
        return "-1"
    return fmt_num(x if res == "gpu" else x / 1000 if res == "cpu" else round(x / 2**30, 3))
