"""kai-opt: an optimization-based Kubernetes scheduler for AI/GPU clusters."""

__version__ = "0.1.0"
