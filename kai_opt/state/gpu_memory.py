"""Where a gpu-memory request may go, as KAI-Scheduler decides it, and a warning for each pod no node can take.

KAI places a request by GPU memory (`gpu-memory` MiB per device) only on a node whose GPU-memory label is set (its
memory is "not synced" otherwise; kai-opt's default memory for such nodes is for accounting only), and never on a
device with less memory than the request: a share is at most one whole device.
"""

from __future__ import annotations

import numpy as np

from kai_opt.api.node import GPU_MEMORY_LABEL

MAX_NAMED = 20  # pods named one by one in the warnings; the rest are counted


def gpu_memory_fits(known: np.ndarray, mem_mib: np.ndarray, request_mib: int) -> np.ndarray:
    """bool per node (of `known`, `mem_mib`): the node may take a gpu-memory request of `request_mib` per device."""
    return known & (mem_mib >= request_mib)


def gpu_memory_warnings(pod_keys: list[str], request_mib: np.ndarray, known: np.ndarray,
                        mem_mib: np.ndarray) -> list[str]:
    """One warning per pending gpu-memory pod (its key and MiB per device given) that no node can take by these
    rules, up to MAX_NAMED of them and a count of the others."""
    if not len(pod_keys):
        return []
    if known.any():
        largest = int(mem_mib[known].max())
        too_big = np.flatnonzero(request_mib > largest)
        why = [f"gpu-memory {int(request_mib[i])} MiB per device is more than any GPU's memory ({largest} MiB at "
               "most); it stays pending, as in KAI-Scheduler" for i in too_big.tolist()]
        named = too_big.tolist()
    else:
        named = list(range(len(pod_keys)))
        why = [f"gpu-memory request, but no GPU node has the {GPU_MEMORY_LABEL} label; it stays pending, as in "
               "KAI-Scheduler" for _ in named]
    out = [f"Pod {pod_keys[i]}: {w}" for i, w in zip(named[:MAX_NAMED], why, strict=False)]
    if len(named) > MAX_NAMED:
        out.append(f"{len(named) - MAX_NAMED} more gpu-memory pods cannot be placed on any node for the same reason")
    return out
