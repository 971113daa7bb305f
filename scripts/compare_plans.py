#!/usr/bin/env python
"""Compare the greedy (or, --engine cpsat, the CP-SAT) engine's plans of two source trees: binds, pipelines,
evictions, pending reasons (details included), instance by instance. For changes meant to leave plans
byte-identical (speed-ups). The cpu column is the comparing process's own (with cpsat, not the forked solver's).

A side is a git revision (checked out into a temporary worktree, removed afterwards) or a directory holding a
source tree ("." for this working tree). Each side runs in its own child process with that tree first on
sys.path; instances are built in the child from their generator, so both sides see the same input.

Instances: the scale instance models.generators.scale(N, 10 N, N, 0) at N = 1000 (--scale N,M,... for other
sizes, --no-scale to leave it out) and every kai_opt.bench.instances family x seeds 0-2 x 30 and 200 nodes
(--no-families to leave them out).

  scripts/compare_plans.py HEAD .               # before (HEAD) vs the working tree
  scripts/compare_plans.py 8cac8d3 /tmp/mytree --no-scale
  scripts/compare_plans.py 0d997a7 . --scale 10000 --no-families   # the 10,000-node digest only
  scripts/compare_plans.py HEAD . --placement fgd   # the greedy engine with FGD scoring (placement gpu/cpu fgd)
  scripts/compare_plans.py HEAD . --engine cpsat    # the CP-SAT engine, deterministic solver (model changes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # appended: in a child, the side's tree (inserted first) must stay first
    sys.path.append(str(ROOT))


def _instances(scale_sizes: list[int], families: bool = True) -> list[str]:
    names = [f"scale-{n}" for n in scale_sizes]
    from models.generators import FAMILIES

    for fam in FAMILIES if families else ():
        for nodes in (30, 200):
            for seed in (0, 1, 2):
                names.append(f"{fam}:{nodes}:{seed}")
    return names


def child(names: list[str]) -> None:
    import kai_opt
    from kai_opt.config import Config, Engine
    from kai_opt.engine import run_cycle
    from kai_opt.state import build_state
    from models.generators import FAMILIES, as_snapshot, scale

    placement = os.environ.get("KAI_OPT_CMP_PLACEMENT")
    engine = Engine(os.environ.get("KAI_OPT_CMP_ENGINE", "greedy"))
    config = Config.model_validate({**({"placement": {"gpu": placement, "cpu": placement}} if placement else {}),
                                    **({"solver": {"deterministic": True}} if engine == Engine.cpsat else {})})
    tree = Path(sys.path[0]).resolve()
    if not Path(kai_opt.__file__).resolve().is_relative_to(tree):
        sys.exit(f"kai_opt imported from {kai_opt.__file__}, not from {tree}")
    out: dict[str, Any] = {}
    for name in names:
        if name.startswith("scale-"):
            n = int(name.removeprefix("scale-"))
            objs = scale(n, 10 * n, n, 0)
        else:
            fam, nodes, seed = name.split(":")
            objs = FAMILIES[fam].generate(int(nodes), int(seed))
        state = build_state(as_snapshot(objs))
        t = time.process_time()
        plan, _fs = run_cycle(state, config, engine=engine)
        cpu = time.process_time() - t
        out[name] = {
            "binds": sorted([p.pod, p.node, list(p.devices), p.moved] for p in plan.placements if not p.pipelined),
            "pipelines": sorted([p.pod, p.node, list(p.devices), p.moved] for p in plan.placements if p.pipelined),
            "evictions": [[e.pod, e.reason, e.beneficiary] for e in plan.evictions],
            "pending": {str(g): [[r.code, r.message, r.details] for r in rs] for g, rs in sorted(plan.pending.items())},
            "cpu": cpu,
        }
    json.dump(out, sys.stdout, sort_keys=True, default=str)


def _run(tree: Path, names: list[str]) -> dict[str, Any]:
    code = (f"import sys; sys.path.insert(0, {str(tree)!r}); sys.argv = ['x'] + {names!r}; "
            "import importlib.util as u; s = u.spec_from_file_location('cmp', "
            f"{str(ROOT / 'scripts' / 'compare_plans.py')!r}); m = u.module_from_spec(s); s.loader.exec_module(m); "
            "m.child(sys.argv[1:])")
    res = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=False)
    if res.returncode:
        sys.exit(f"child for {tree} failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout)


@contextmanager
def trees(specs: Sequence[str], prog: str) -> Iterator[list[Path]]:
    """The source tree of each side: a directory as it is, a git revision checked out into a temporary worktree
    (removed on exit). A side that is neither: one line on stderr naming it (`prog`: the script), exit 2."""
    with tempfile.TemporaryDirectory(prefix="kai-opt-cmp-") as d:
        made: list[Path] = []
        try:
            sides = []
            for spec in specs:
                path = Path(spec)
                if path.is_dir():
                    sides.append(path.resolve())
                    continue
                wt = Path(d) / f"wt-{spec.replace('/', '_')}"
                try:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), spec],
                                   check=True, capture_output=True)
                except subprocess.CalledProcessError:
                    print(f"{prog}: {spec!r} is neither a directory nor a git revision", file=sys.stderr)
                    raise SystemExit(2) from None
                made.append(wt)
                sides.append(wt)
            yield sides
        finally:
            for wt in made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], check=False,
                               capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="git revision or source tree (before)")
    ap.add_argument("new", nargs="?", default=".", help="git revision or source tree (after); default: .")
    ap.add_argument("--no-scale", action="store_true", help="leave out the scale instance")
    ap.add_argument("--scale", default="1000", help="node counts of the scale instances, comma-separated")
    ap.add_argument("--no-families", action="store_true", help="leave out the family instances")
    ap.add_argument("--placement", choices=("binpack", "spread", "fgd"),
                    help="the greedy engine's placement strategy for GPUs and CPUs (default: the config's)")
    ap.add_argument("--engine", choices=("greedy", "cpsat"), default="greedy",
                    help="the engine whose plans are compared; cpsat runs the deterministic solver (fixed seed, "
                    "one worker, a deterministic time limit), so its plans repeat (default: greedy)")
    args = ap.parse_args()
    sizes = [] if args.no_scale else [int(x) for x in args.scale.split(",") if x]
    names = _instances(sizes, not args.no_families)
    if args.placement:
        os.environ["KAI_OPT_CMP_PLACEMENT"] = args.placement
    os.environ["KAI_OPT_CMP_ENGINE"] = args.engine
    with trees((args.base, args.new), "compare_plans") as sides:
        a, b = _run(sides[0], names), _run(sides[1], names)
    diffs = 0
    for name in names:
        ra, rb = a[name], b[name]
        bad = [k for k in ("binds", "pipelines", "evictions", "pending")
               if json.dumps(ra[k], sort_keys=True, default=str) != json.dumps(rb[k], sort_keys=True, default=str)]
        diffs += bool(bad)
        print(f"{name:28s} binds {len(ra['binds']):5d} pipelines {len(ra['pipelines']):5d} "
              f"evictions {len(ra['evictions']):5d} pending {len(ra['pending']):4d}  cpu {ra['cpu']:7.2f} -> "
              f"{rb['cpu']:7.2f}  {'DIFFERENT: ' + ', '.join(bad) if bad else 'same'}")
    print(f"{len(names)} instances, {diffs} different")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
