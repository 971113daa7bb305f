"""`kai-opt simulate --plot FILE`: a PNG of each leaf queue's GPUs over the cycles (allocated after the cycle's plan,
solid; fair share, dashed) and, with past usage, each queue's usage term below."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kai_opt.bench.plots import pyplot, save_figure
from kai_opt.simulate import SimulationResult


def plot_queues(result: SimulationResult, path: Path, leaves: list[str]) -> Path:
    plt = pyplot()
    cycles = [c.cycle for c in result.cycles]
    with_usage = any("gpu_usage" in row for c in result.cycles for row in c.queues.values())
    fig, axes = plt.subplots(2 if with_usage else 1, 1, figsize=(9, 6 if with_usage else 4), sharex=True,
                             squeeze=False)
    top: Any = axes[0][0]
    for name in leaves:
        color = None
        for key, style in (("gpu_allocated_after", "-"), ("gpu_fair_share", "--")):
            ys = [c.queues.get(name, {}).get(key, 0.0) for c in result.cycles]
            line = top.plot(cycles, ys, style, color=color,
                            label=f"{name} {'allocated' if style == '-' else 'fair share'}")
            color = line[0].get_color()
        if with_usage:
            axes[1][0].plot(cycles, [c.queues.get(name, {}).get("gpu_usage", 0.0) for c in result.cycles], "-",
                            color=color, label=name)
    top.set_ylabel("GPUs")
    top.set_title("GPUs per queue over the cycles")
    top.legend(fontsize="small")
    if with_usage:
        axes[1][0].set_ylabel("GPU usage (of window capacity)")
        axes[1][0].legend(fontsize="small")
    axes[-1][0].set_xlabel("cycle")
    return save_figure(fig, path)
