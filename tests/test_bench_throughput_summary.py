"""scripts/bench_throughput.py --rounds: each round's ratio is against kube-scheduler of the same round, and the
summary gives the median of those ratios (the machine drifts between rounds)."""

from __future__ import annotations

import argparse

from script_module import load_script


def test_ratios_are_per_round_and_the_summary_takes_their_median() -> None:
    bt = load_script("bench_throughput")

    def res(run: str, rnd: int, rate: float) -> object:
        return bt.Result(run, "single", "stream", 10, 100, ok=True, e2e_pods_per_s=rate, bind_pods_per_s=rate,
                         bound=100, round=rnd, extra={"scheduler_cpu_s": 0.3, "apiserver_cpu_s": 0.4,
                                                      "etcd_cpu_s": 0.1})

    # kai-opt is slower than kube-scheduler's round-1 rate in round 2, yet faster within every round
    results = [res("kube-scheduler", 1, 300.0), res("kai-opt-cpsat", 1, 330.0),
               res("kube-scheduler", 2, 200.0), res("kai-opt-cpsat", 2, 240.0),
               res("kube-scheduler", 3, 250.0), res("kai-opt-cpsat", 3, 250.0)]
    text = bt.table(results, argparse.Namespace())
    rows = {tuple(line.split()[:2]): line.split() for line in text.splitlines()[1:7]}
    assert rows[("2", "kai-opt-cpsat")][12] == "1.20", text  # 240 / 200, not 240 / 300
    summary = {line.split()[0]: line.split() for line in text.split("\n\n")[1].splitlines()[1:]}
    assert summary["kai-opt-cpsat"][1:6] == ["3", "250", "1.10", "1.00-1.20", "3.0"], text
    assert summary["kai-opt-cpsat"][6] == "5.0" and summary["kube-scheduler"][3] == "1.00"
