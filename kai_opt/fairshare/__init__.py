"""Hierarchical fair share with KAI-Scheduler's proportion semantics, queue order, quota and reclaim rules."""

from kai_opt.fairshare.share import FairShare, compute_fair_share

__all__ = ["FairShare", "compute_fair_share"]
