"""The engine's array form of one snapshot (DESIGN section 2): numpy arrays over nodes, devices, pods, groups,
queues. Built once per cycle by `build_state`; engines never touch per-pod Python objects in hot loops."""

from kai_opt.state.build import build_state
from kai_opt.state.cluster import ClusterState, PodStatus
from kai_opt.state.resources import QR, R_CPU, R_GPU, R_MEM, R_PODS

__all__ = ["QR", "R_CPU", "R_GPU", "R_MEM", "R_PODS", "ClusterState", "PodStatus", "build_state"]
