"""Benchmarks: replaying public cluster traces against kai-opt's engines and published baselines."""
