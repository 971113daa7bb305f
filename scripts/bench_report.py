#!/usr/bin/env python
"""Run kai-opt's benchmarks and write their results into README.md's "Benchmarks" section (one command).

Each part runs one benchmark command as a subprocess and stores what it printed, with the command, the date and
the machine's load, in docs/bench/<part>.md (plots next to it in docs/bench/); README.md's section between the
`<!-- BENCHMARKS:start -->` and `<!-- BENCHMARKS:end -->` markers is then rebuilt from every stored part, so a
part can be rerun alone without losing the others; but not once that section was edited by hand since the script
last wrote it (later reruns recorded there with their commands and dates; the digest of what it wrote is kept in
docs/bench/readme-section.sha256): those would be lost, so the script then leaves README.md as it is and says so
(`--force` rebuilds it anyway).

  scripts/bench_report.py                       # every part (about an hour on the 2-core machine)
  scripts/bench_report.py --only quality,trace  # just these parts
  scripts/bench_report.py --readme-only         # rebuild the README section from the stored parts
  scripts/bench_report.py --list                # the parts and their commands
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
README = ROOT / "README.md"
START, END = "<!-- BENCHMARKS:start -->", "<!-- BENCHMARKS:end -->"
DIGEST_FILE = "readme-section.sha256"  # in OUT: the section as this script last wrote it


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    about: str
    command: tuple[str, ...]
    markdown: bool = False  # the command prints markdown (else its output is shown as preformatted text)


PY = "python"
PARTS: tuple[Part, ...] = (
    Part("quality", "Placement quality: kai-opt, peer baselines and the LP bound",
         "Every benchmark family (generators in `models/`), seeded, partially occupied clusters of 8-GPU nodes; "
         "each engine plans one cycle on the same instance; GPUs allocated against the LP upper bound. CP-SAT "
         "budget 5 s of wall time. One timed cycle per engine and instance (the cycle-time percentiles at scale "
         "are in the greedy part).",
         ("kai-opt", "bench", "run", "--sizes", "100,1000", "--seeds", "2", "--repeats", "1", "--time-budget", "5",
          "-o", "markdown",
          "--plot", "docs/bench/quality"), markdown=True),
    Part("trace", "Trace replay (FGD protocol, openb default trace)",
         "The ATC'23 FGD paper's protocol on its openb trace: pods arrive one by one until 130% of the GPU "
         "capacity was requested; unallocated GPU % when 100% has arrived, mean over 10 seeds, beside the "
         "published numbers. Validates our FGD reimplementation (within 0.5 points of the paper). kai-opt's greedy "
         "engine gets 50 arriving pods per cycle and does not move running pods.",
         ("kai-opt", "bench", "trace", "--seeds", "10", "--engines",
          "fgd,bestfit,dotprod,gpupacking,random,leastallocated,mostallocated,greedy", "--batch", "50",
          "--consolidation", "off", "-o", "markdown", "--plot", "docs/bench/trace.png"),
         markdown=True),
    Part("greedy", "Greedy cycle at scale",
         "One full greedy cycle (allocate, consolidate, reclaim, preempt, stale-gang) on the scale instance: "
         "nodes x 8 GPUs, 10 running pods per node, 10% pending pods in gangs, a 4-level queue tree.",
         (PY, "scripts/bench_greedy.py", "--cycles", "1")),
    Part("cpsat_scale", "CP-SAT at scale",
         "The CP-SAT engine (the default) on the 1,000-, 5,000- and 10,000-node scale instances, 20 cycles each "
         "with the default 1 s budget: cycle p50/p95 (the greedy plan it starts from included), how many cycles "
         "the model decided and its gap, solver notes, and the peak memory of the process tree (worker and second "
         "hint included).",
         (PY, "scripts/bench_greedy.py", "--sizes", "1000,5000,10000", "--cycles", "20", "--engine", "cpsat",
          "--time-budget", "1")),
    Part("state", "Snapshot to cluster state",
         "ClusterState of 10,000 nodes and 110,000 pods, from parsed objects and from a kubectl-style JSON file.",
         (PY, "scripts/bench_state.py")),
    Part("fairshare", "Fair-share division",
         "Hierarchical fair share (KAI proportion semantics) of ~10,000 queues in a 4-level tree, 3 resources.",
         (PY, "scripts/bench_fairshare.py")),
    Part("explain", "explain at 10,000 nodes",
         "`kai-opt explain` answers for several kinds of targets on the scale instance (plan computed once).",
         (PY, "scripts/bench_explain.py", "--cache", "/tmp/kai-opt-explain-10k.pkl")),
    Part("throughput", "Scheduling throughput on a real apiserver",
         "kube-scheduler and `kai-opt run` side by side on the same kube-apiserver + etcd (no kubelet): pods/s "
         "from the first create to the last pod bound.",
         (PY, "scripts/bench_throughput.py")),
    Part("kai", "Beside KAI-Scheduler itself: the same snapshots, KAI's own actions and kai-opt's default engine",
         "KAI-Scheduler's actions (built from its source, run through its snapshot tool with timing added, "
         "../shared/peers/kai) and `kai-opt solve` (engine cpsat, 1 s budget) on the same ZIPs, interleaved; both "
         "plans counted the same way.",
         (PY, "scripts/bench_kai.py"), markdown=True),
    Part("coexist", "Sharing nodes with kube-scheduler: overcommits with and without the pre-bind re-check",
         "kube-scheduler and `kai-opt run` binding onto the same 500 nodes at once (no kubelet): nodes whose bound "
         "requests exceed allocatable, and whose bind took them there.",
         (PY, "scripts/bench_coexist.py"), markdown=True),
)
BY_NAME = {p.name: p for p in PARTS}


def run_part(part: Part) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(shlex.quote(c) for c in part.command)
    print(f"[bench-report] {part.name}: {cmd}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(part.command, cwd=ROOT, text=True, stdout=subprocess.PIPE, check=False)
    wall = time.perf_counter() - t
    body = proc.stdout.strip()
    if not part.markdown:
        body = f"```\n{body}\n```"
    status = "" if proc.returncode == 0 else f" (exit code {proc.returncode}: a target was missed or it failed)"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"### {part.title}\n\n{part.about}\n\n`{cmd}`: measured {when}, {wall:.0f} s, load average "
            f"{load:.2f} on {os.cpu_count()} CPUs at the start{status}.\n\n{body}\n")
    plots = sorted(p for p in OUT.glob(f"{part.name}*/*.png")) + sorted(OUT.glob(f"{part.name}*.png"))
    for png in plots:
        text += f"\n![{png.stem}]({png.relative_to(ROOT).as_posix()})\n"
    (OUT / f"{part.name}.md").write_text(text)
    print(f"[bench-report] {part.name}: {wall:.0f} s, exit code {proc.returncode}", file=sys.stderr, flush=True)


def _for_readme(name: str, text: str) -> str:
    """A part as README shows it: long per-instance tables stay in docs/bench/<part>.md, linked."""
    lines, out, skipping = text.splitlines(), [], False
    for line in lines:
        if line.startswith("**Per instance"):
            skipping = True
            out.append(f"Per instance and engine: [docs/bench/{name}.md](docs/bench/{name}.md).")
            continue
        if skipping:
            if line.startswith("|") or not line.strip():
                continue
            skipping = False
            out.append("")
        out.append(line)
    return "\n".join(out)


def stored_section() -> str:
    """README's Benchmarks section as the stored parts (docs/bench/<part>.md) give it."""
    parts = [_for_readme(p.name, (OUT / f"{p.name}.md").read_text().strip()) for p in PARTS
             if (OUT / f"{p.name}.md").exists()]
    return "\n\n".join(parts) if parts else "(no benchmark has been run yet)"


def readme_section() -> str:
    """README's Benchmarks section as it is (between the markers)."""
    m = re.search(re.escape(START) + "\n(.*?)\n" + re.escape(END), README.read_text(), flags=re.S)
    if m is None:
        raise SystemExit(f"README.md lacks the {START} / {END} markers")
    return m.group(1)


def _digest(section: str) -> str:
    return hashlib.sha256(section.encode()).hexdigest()


def edited_by_hand() -> bool:
    """Whether README's section differs from what this script last wrote there (its digest, kept in
    docs/bench/readme-section.sha256): results recorded in it by hand, which a rebuild would drop."""
    digest = OUT / DIGEST_FILE
    return not digest.exists() or digest.read_text().strip() != _digest(readme_section())


def rebuild_readme() -> None:
    section = stored_section()
    readme = README.read_text()
    readme_section()  # the markers are there
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{section}\n{END}", readme,
                 flags=re.S)
    README.write_text(new)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / DIGEST_FILE).write_text(_digest(section) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated parts (default: all)")
    ap.add_argument("--readme-only", action="store_true", help="only rebuild the README section")
    ap.add_argument("--list", action="store_true", help="print the parts and their commands")
    ap.add_argument("--force", action="store_true",
                    help="rebuild README's section from docs/bench/ even when it holds results added by hand")
    args = ap.parse_args(argv)
    if args.list:
        for p in PARTS:
            print(f"{p.name:<11} {' '.join(p.command)}")
        return 0
    names = [n.strip() for n in args.only.split(",")] if args.only else [p.name for p in PARTS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"bench_report: error: unknown part(s) {', '.join(unknown)}; parts: {', '.join(BY_NAME)}",
              file=sys.stderr)
        return 2
    # README's section is rebuilt only while it is what this script last wrote: results recorded in it by hand
    # would be lost (--force rebuilds anyway)
    edited = edited_by_hand() and not args.force
    if args.readme_only and edited:
        print("bench_report: error: README.md's Benchmarks section was edited by hand since this script last wrote "
              "it; not rebuilt (--force rebuilds it from docs/bench/ anyway)", file=sys.stderr)
        return 2
    if not args.readme_only:
        for n in names:
            run_part(BY_NAME[n])
    if edited:
        print("bench_report: README.md not rebuilt: its Benchmarks section was edited by hand since this script "
              f"last wrote it; the new results are in {OUT.relative_to(ROOT)}/<part>.md (--force rebuilds the "
              "section from them)", file=sys.stderr)
        return 0
    rebuild_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
