"""`openb`: a family shaped like Alibaba's openb GPU trace (cluster-trace-gpu-v2023, USENIX ATC '23 FGD paper).

The numbers below were computed once from ../shared/data/openb (never read at generation time):
- NODE_MODELS: `openb_node_list_gpu_node.csv` (1213 GPU nodes), rows counted by (model, gpu, cpu_milli,
  memory_mib); CPU in cores, memory in GiB (every value is a whole number of GiB).
- POD_CLASSES: `openb_pod_list_default.csv` (8152 pods) split as in its README: 1088 CPU-only, 3078 sharing
  (num_gpu 1, gpu_milli 50-999), 3911 with one whole GPU, 75 multi-GPU (16 x 2, 15 x 4, 44 x 8).
- ARCHETYPES: per class, the most frequent joint (gpu_milli or num_gpu, cpu_milli, memory_mib) rows with their
  counts (`collections.Counter(...).most_common(16)`; 12 for multi-GPU). They cover 99.1% of the CPU-only pods,
  90.2% of the sharing pods, 89.3% of the one-GPU pods and 98.7% of the multi-GPU pods; sampling is by count
  among the listed rows only.
- NON_PREEMPTIBLE: per class, the share of pods with qos LS or Guaranteed (mapped to priority class `build`;
  BE and Burstable to `train`): 637/1088, 759/3078, 3206/3911, 52/75.
- PODS_PER_NODE: 8152 pods / 1213 nodes; the trace asks for 98.0% of the GPUs in total.
The trace has no gangs: every pod is its own PodGroup (minMember 1).
"""

from __future__ import annotations

import numpy as np

from kai_opt.snapshot import RawObject
from models.generators.cluster import ClusterBuilder, PodShape
from models.generators.objects import without_gc

# (model, GPUs, CPU cores, memory GiB, nodes in the trace)
NODE_MODELS = (
    ("G2", 8, 96, 384, 549), ("T4", 2, 104, 512, 387), ("P100", 2, 16, 120, 107), ("G3", 8, 128, 768, 39),
    ("V100M16", 4, 32, 128, 28), ("P100", 2, 64, 256, 22), ("V100M32", 8, 96, 768, 21), ("V100M16", 1, 8, 32, 19),
    ("T4", 4, 96, 384, 17), ("V100M32", 4, 48, 368, 9), ("V100M16", 8, 64, 256, 7), ("P100", 1, 8, 60, 3),
    ("P100", 2, 8, 60, 2), ("A10", 1, 128, 1024, 2), ("V100M16", 8, 82, 336, 1),
)
# product label and MiB per device; G2/G3 are undisclosed internal models: 80 GB assumed
GPU_MODELS = {"G2": ("G2", 81920), "G3": ("G3", 81920), "T4": ("Tesla-T4", 16384),
              "P100": ("Tesla-P100-PCIE-16GB", 16384), "V100M16": ("Tesla-V100-SXM2-16GB", 16384),
              "V100M32": ("Tesla-V100-SXM2-32GB", 32768), "A10": ("NVIDIA-A10", 24576)}

POD_CLASSES = {"cpu": 1088, "share": 3078, "one": 3911, "multi": 75}
NON_PREEMPTIBLE = {"cpu": 637 / 1088, "share": 759 / 3078, "one": 3206 / 3911, "multi": 52 / 75}
PODS_PER_NODE = 8152 / 1213
# class -> rows of (gpu_milli | num_gpu | -, cpu_milli, memory_mib, count)
ARCHETYPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "cpu": ((0, 12500, 57344, 364), (0, 32000, 49152, 284), (0, 8000, 30517, 163), (0, 15400, 51200, 120),
            (0, 16500, 51200, 95), (0, 11400, 57344, 11), (0, 8000, 15625, 11), (0, 16000, 31250, 8),
            (0, 8000, 31250, 5), (0, 12000, 24576, 4), (0, 32000, 62500, 3), (0, 20000, 65536, 2),
            (0, 12500, 65536, 2), (0, 8000, 16384, 2), (0, 32000, 32768, 2), (0, 8000, 8192, 2)),
    "share": ((810, 3152, 5600, 1047), (470, 11908, 47104, 388), (470, 8000, 30517, 360),
              (650, 11908, 47104, 237), (320, 4000, 22888, 111), (230, 4000, 30517, 84), (320, 4000, 15258, 78),
              (590, 3152, 5600, 75), (320, 8000, 30517, 72), (550, 4152, 10600, 72), (160, 4000, 15258, 53),
              (460, 6000, 6144, 51), (370, 4152, 10600, 45), (320, 4000, 30517, 43), (810, 4152, 10600, 31),
              (460, 6000, 12288, 29)),
    "one": ((1, 11300, 49152, 857), (1, 11400, 48128, 534), (1, 3152, 5600, 470), (1, 18708, 64512, 255),
            (1, 9810, 41560, 195), (1, 12000, 24576, 158), (1, 15700, 58368, 158), (1, 11908, 47104, 153),
            (1, 16000, 32768, 108), (1, 8000, 16384, 104), (1, 4000, 24576, 104), (1, 12000, 16384, 99),
            (1, 14200, 58368, 93), (1, 24200, 93184, 84), (1, 11400, 77824, 65), (1, 8000, 32768, 55)),
    "multi": ((8, 88000, 327680, 18), (8, 64200, 263168, 18), (4, 32200, 132096, 9), (2, 16200, 66560, 7),
              (8, 120000, 737280, 3), (2, 6000, 65536, 3), (8, 64000, 262144, 3), (4, 32000, 131072, 3),
              (2, 30200, 160768, 3), (4, 60200, 320512, 3), (2, 17400, 43008, 2), (8, 120200, 640000, 2)),
}


def _shape(cls: str, row: tuple[int, ...]) -> PodShape:
    x, cpu, mem = row[0], row[1], row[2]
    if cls == "share":
        return PodShape(cpu_m=cpu, memory_mi=mem, fraction=x / 1000)
    return PodShape(cpu_m=cpu, memory_mi=mem, gpus=x)


def node_counts(n_nodes: int) -> list[int]:
    """Nodes per NODE_MODELS row for a cluster of n_nodes, proportional to the trace (largest remainder)."""
    w = np.array([m[4] for m in NODE_MODELS], dtype=np.float64)
    share = w / w.sum() * n_nodes
    base = np.floor(share).astype(np.int64)
    base[np.argsort(base - share, kind="stable")[: n_nodes - int(base.sum())]] += 1
    return base.tolist()


def sample_pods(rng: np.random.Generator, n: int) -> list[tuple[PodShape, str]]:
    """n trace-like pods: (shape, priority class)."""
    classes = list(POD_CLASSES)
    pc = np.array([POD_CLASSES[c] for c in classes], dtype=np.float64)
    out = []
    for ci in rng.choice(len(classes), size=n, p=pc / pc.sum()).tolist():
        cls = classes[ci]
        rows = ARCHETYPES[cls]
        w = np.array([r[3] for r in rows], dtype=np.float64)
        row = rows[int(rng.choice(len(rows), p=w / w.sum()))]
        prio = "build" if rng.random() < NON_PREEMPTIBLE[cls] else "train"
        out.append((_shape(cls, row), prio))
    return out


@without_gc
def openb(n_nodes: int, seed: int) -> list[RawObject]:
    """Alibaba openb trace mix: node models (G2/T4/P100/...), CPU-only, GPU-sharing (gpu_milli 50-999), 1-GPU
    and a few multi-GPU pods; 70-85% of the GPUs run, 20-35% more is pending."""
    rng = np.random.default_rng(seed)
    b = ClusterBuilder(rng)
    i = 0
    for (model, gpus, cpu, mem, _), k in zip(NODE_MODELS, node_counts(n_nodes), strict=True):
        product, gpu_mem = GPU_MODELS[model]
        for _ in range(k):
            b.add_node(f"openb-node-{i:05d}", gpus=gpus, cpu=cpu, memory_gi=mem, product=product,
                       gpu_memory_mib=gpu_mem, labels={"openb.io/model": model})
            i += 1
    b.add_queues()
    total = b.total_gpus
    running, fails = 0.0, 0
    target = total * rng.uniform(0.7, 0.85)
    batch = max(64, int(PODS_PER_NODE * n_nodes))
    while running < target and fails < 200:
        for shape, prio in sample_pods(rng, batch):
            if running >= target or fails >= 200:
                break
            if b.run_gang([shape], policy="random", priority_class=prio, prefix="openb") is None:
                fails += 1
            else:
                running += shape.gpu_total
    pending, want = 0.0, total * rng.uniform(0.2, 0.35)
    while pending < want:
        for shape, prio in sample_pods(rng, 64):
            b.pend_gang([shape], priority_class=prio, prefix="openb")
            pending += shape.gpu_total
            if pending >= want:
                break
    return b.objects
