"""The cycle's queue metrics (kai_opt.k8s.queue_metrics): only changed queues are set again, the scrape shows what a
publisher that sets every queue each cycle shows, and a queue that left the state leaves the scrape."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import builders as b
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from kai_opt.fairshare import compute_fair_share
from kai_opt.k8s.metrics import SchedulerMetrics
from kai_opt.k8s.queue_metrics import QueueMetrics
from kai_opt.state import build_state


def _scrape(m: SchedulerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = m.exposition(None)[0].decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if "queue_name" in s.labels}


class Counting:
    """A metrics sink that counts the calls and forwards them."""

    def __init__(self, inner: SchedulerMetrics) -> None:
        self.inner, self.calls = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            self.calls[name] += 1
            return getattr(self.inner, name)(*a, **k)
        return call


def _state(extra_queue: bool, more_running: bool) -> Any:
    objs = [b.node("n1", gpus=8), b.queue("top"), b.queue("qa", parent="top"), b.queue("qb", parent="top"),
            b.podgroup("ra", "qa", 1), b.pod("ra-0", group="ra", gpus=2, node_name="n1"),
            b.podgroup("pb", "qb", 1), b.pod("pb-0", group="pb", gpus=1)]
    if extra_queue:
        objs.append(b.queue("qc", parent="top"))
    if more_running:
        objs += [b.podgroup("rb", "qb", 1), b.pod("rb-0", group="rb", gpus=3, node_name="n1")]
    st = build_state(b.snapshot(objs))
    return st, compute_fair_share(st)


def test_only_changed_queues_are_set_and_the_scrape_equals_setting_every_queue() -> None:
    kept, fresh_cycles = Counting(SchedulerMetrics()), []
    publisher = QueueMetrics(kept)
    for extra, more in [(True, False), (True, False), (True, True), (False, True), (False, True)]:
        st, fs = _state(extra, more)
        kept.calls.clear()
        publisher.publish(st, fs)
        fresh = SchedulerMetrics()  # what a publisher without memory shows for the same cycle
        QueueMetrics(fresh).publish(st, fs)
        assert _scrape(kept.inner) == _scrape(fresh), (extra, more)
        fresh_cycles.append(dict(kept.calls))
    assert fresh_cycles[0]["queue"] == 4, "the first cycle sets every queue"
    assert not fresh_cycles[1], "nothing changed: nothing set"
    assert 0 < fresh_cycles[2]["queue"] < 4, "a job of qb runs: qb and its ancestors set again, not qa"
    assert fresh_cycles[3].get("remove_queue") == 1, "qc left the state: its series go"
    assert not fresh_cycles[4]


def test_time_based_usage_is_published_and_compared_too() -> None:
    st, fs = _state(False, False)
    kept = Counting(SchedulerMetrics())
    publisher = QueueMetrics(kept)
    usage = np.zeros_like(np.asarray(fs.allocated, dtype=np.float64))
    publisher.publish(st, dataclasses.replace(fs, usage=usage))
    kept.calls.clear()
    publisher.publish(st, dataclasses.replace(fs, usage=usage + 0.5))
    assert kept.calls["queue_usage"] == len(st.q_names)
    fresh = SchedulerMetrics()
    QueueMetrics(fresh).publish(st, dataclasses.replace(fs, usage=usage + 0.5))
    assert _scrape(kept.inner) == _scrape(fresh)
