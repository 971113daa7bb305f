"""kai-opt: an optimization-based Kubernetes scheduler for AI/GPU clusters."""

__version__ = "0.1.0"  # the one source: pyproject reads it (dynamic version), so do the chart and the image tag
