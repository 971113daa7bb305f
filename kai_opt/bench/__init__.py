"""Benchmarks: replaying public cluster traces against kai-opt's engines and published baselines, and comparing
engines, peer baselines and an LP upper bound on generated instances (`kai-opt bench run`)."""

from kai_opt.bench import batch as _batch  # noqa: F401  (wires greedy and cpsat into the trace replay)
