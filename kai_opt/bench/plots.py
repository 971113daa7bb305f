"""PNG plots of `kai-opt bench run` (matplotlib, Agg): ratio to the LP bound per family, cycle time vs size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kai_opt.errors import InputError, MissingExtraError

RATIO_PNG = "ratio_by_family.png"
TIME_PNG = "cycle_time_vs_size.png"


def pyplot(feature: str = "--plot") -> Any:
    """matplotlib.pyplot on the Agg backend; matplotlib is the `bench` extra: without it a MissingExtraError
    (one line, exit code 2). Commands call it before their work so a run never ends on it."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(feature, "matplotlib", "bench") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Write the figure (a typed InputError when the path cannot be written) and close it."""
    plt = pyplot()
    try:
        fig.tight_layout()
        fig.savefig(path)
    except OSError as exc:
        raise InputError(f"cannot write plot: {exc.strerror or exc}", source=str(path)) from None
    finally:
        plt.close(fig)
    return path


def ratio_by_family(rows: Sequence[dict[str, Any]], path: Path, key: str = "ratio") -> Path:
    """Grouped bars: per family, each engine's mean ratio to the bound (whiskers: min and max over instances)."""
    plt = pyplot()
    fams = list(dict.fromkeys(r["family"] for r in rows))
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(fams) + 2), 4.5), dpi=120)
    width = 0.8 / max(len(engines), 1)
    x = np.arange(len(fams))
    lows = []
    for j, e in enumerate(engines):
        means, lo, hi = [], [], []
        for f in fams:
            vals = [float(r[key]) for r in rows if r["engine"] == e and r["family"] == f and r.get(key) is not None]
            m = float(np.mean(vals)) if vals else np.nan
            means.append(m)
            lo.append(m - min(vals) if vals else 0.0)
            hi.append(max(vals) - m if vals else 0.0)
            lows += vals
        ax.bar(x + (j - (len(engines) - 1) / 2) * width, means, width, yerr=[lo, hi], capsize=2, label=e)
    floor = min(lows) if lows else 0.0
    ax.set_ylim(max(0.0, floor - 0.05 * (1.0 - floor) - 0.02), 1.005)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(x, fams)
    ax.set_ylabel("GPUs allocated / LP bound" if key == "ratio" else key)
    ax.set_title("Ratio to the LP upper bound per family (mean; whiskers: min-max)")
    ax.legend(fontsize=8, ncol=min(4, len(engines)), loc="lower right")
    ax.grid(axis="y", linestyle="-.", alpha=0.5)
    return save_figure(fig, path)


def cycle_time_vs_size(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Per engine: median cycle wall time over the instances of each size (p95 as a shaded band)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for e in dict.fromkeys(r["engine"] for r in rows):
        sizes = sorted({int(r["nodes"]) for r in rows if r["engine"] == e and r.get("wall_s") is not None})
        if not sizes:
            continue
        med = [float(np.median([r["wall_s"] for r in rows if r["engine"] == e and int(r["nodes"]) == n
                                and r.get("wall_s") is not None])) for n in sizes]
        p95 = [float(np.max([r["wall_p95_s"] for r in rows if r["engine"] == e and int(r["nodes"]) == n
                             and r.get("wall_p95_s") is not None])) for n in sizes]
        (line,) = ax.plot(sizes, med, marker="o", label=e)
        ax.fill_between(sizes, med, p95, color=line.get_color(), alpha=0.12)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cluster size (nodes of 8 GPUs)")
    ax.set_ylabel("cycle wall time (s)")
    ax.set_title("Cycle time vs cluster size (median over families; band up to the largest p95)")
    ax.grid(which="both", linestyle="-.", alpha=0.4)
    ax.legend(fontsize=8, ncol=2)
    return save_figure(fig, path)


def write_all(rows: Sequence[dict[str, Any]], directory: Path) -> list[Path]:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the plot directory: {exc.strerror or exc}", source=str(directory)) from None
    return [ratio_by_family(rows, directory / RATIO_PNG), cycle_time_vs_size(rows, directory / TIME_PNG)]
