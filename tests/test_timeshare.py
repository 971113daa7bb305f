"""Time-based fair share as KAI-Scheduler documents it: exponential decay by half-life, usage normalised to the
window's cluster capacity, the share weight max(0, W' + k (W' - U')) in the over-quota rounds only (deserved quota
and queue priority first), and no change at all without usage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import node, pod, podgroup, queue, state
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import clusters

from kai_opt.config import parse_config
from kai_opt.errors import ConfigError
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.history import HistoricalUsage, decay, normalize, share_weight
from kai_opt.fairshare.usage_ledger import UsageLedger, UsageWindow, window_start
from kai_opt.snapshot import Snapshot
from kai_opt.state import build_state

HOUR = 3600.0
GPU = np.array([1.0, 0.0, 0.0])


# -- KAI's documented examples ---------------------------------------------------------------------------------------
def test_decay_half_life_of_one_hour_halves_an_hour_old_gpu_second() -> None:
    # docs/time-based-fairshare: with a half-life of one hour, a GPU-second an hour ago counts half a fresh one
    assert decay(HOUR, HOUR) == 0.5
    assert decay(2 * HOUR, HOUR) == 0.25
    assert decay(0.0, HOUR) == 1.0
    assert decay(5 * HOUR, None) == 1.0 and decay(5 * HOUR, 0.0) == 1.0  # no half-life: no decay


@pytest.mark.parametrize(("gpus", "hours"), [(8, 3), (12, 2)])
def test_24_gpu_hours_in_a_10_gpu_cluster_over_10_hours_is_0_24(gpus: int, hours: int) -> None:
    # docs/time-based-fairshare "Normalization to cluster capacity": 24 GPU-hours of a possible 100 -> 0.24
    ledger = UsageLedger(bucket_s=HOUR)
    for h in range(10):
        used = {"q": GPU * gpus} if h < hours else {}
        ledger.add(h * HOUR + 1, used, GPU * 10, HOUR)
    usage = ledger.usage(UsageWindow(window_size_s=10 * HOUR), now=10 * HOUR)
    assert usage.queues["q"][0] == pytest.approx(0.24)
    assert normalize({"q": GPU * 24 * HOUR}, GPU * 100 * HOUR).queues["q"][0] == pytest.approx(0.24)


def test_capacity_is_decayed_like_usage() -> None:
    """KAI sums decayed capacity samples too: a queue holding the whole cluster all window scores 1 whatever the
    decay; one holding it only in the older of two hours scores w_old / (w_old + w_new)."""
    ledger = UsageLedger(bucket_s=HOUR)
    ledger.add(0.5 * HOUR, {"all": GPU * 10, "old": GPU * 10}, GPU * 10, HOUR)
    ledger.add(1.5 * HOUR, {"all": GPU * 10}, GPU * 10, HOUR)
    usage = ledger.usage(UsageWindow(window_size_s=10 * HOUR, half_life_s=HOUR), now=2 * HOUR)
    assert usage.queues["all"][0] == pytest.approx(1.0)
    w_old, w_new = 0.5 ** 1.5, 0.5 ** 0.5  # bucket middles 1.5 h and 0.5 h ago
    assert usage.queues["old"][0] == pytest.approx(w_old / (w_old + w_new))


def test_share_weight_is_kais_formula() -> None:
    assert share_weight(0.5, 0.0, 1.0) == 1.0  # W' + k (W' - 0)
    assert share_weight(0.5, 1.0, 1.0) == 0.0  # floored at 0
    assert share_weight(0.5, 0.24, 0.5) == pytest.approx(0.5 + 0.5 * 0.26)
    assert share_weight(0.5, 0.9, 0.0) == 0.5  # kValue 0: the plain weight


def _two_queues(deserved: float = 0, priority_b: int | None = None) -> Snapshot:
    from builders import snapshot

    objs = [node("n1", gpus=8), node("n2", gpus=8), queue("a", gpu=(deserved, 1, -1)),
            queue("b", gpu=(deserved, 1, -1), created_min=1, priority=priority_b)]
    for q in ("a", "b"):
        objs += [podgroup(f"{q}-job", q, min_member=16), *[pod(f"{q}-{i}", f"{q}-job", gpus=1) for i in range(16)]]
    return snapshot(objs)


def _gpu_share(snap: Snapshot, usage: dict[str, float] | None, k: float = 1.0) -> dict[str, float]:
    st_ = build_state(snap)
    hist = None if usage is None else HistoricalUsage({n: (u, 0.0, 0.0) for n, u in usage.items()})
    fs = compute_fair_share(st_, history=hist, k_value=k)
    return {n: float(fs.fair_share[st_.q_index[n], 0]) for n in ("a", "b")}


def test_usage_moves_the_over_quota_split_as_kai_computes_it() -> None:
    snap = _two_queues()
    assert _gpu_share(snap, None) == {"a": 8, "b": 8}
    assert _gpu_share(snap, {"a": 1.0}) == {"a": 0, "b": 16}  # a's weight max(0, .5 + (.5 - 1)) = 0
    # weights .5 and 1: shares 5.33 and 10.67 -> whole units 5 and 10, the leftover unit to the larger fraction (b)
    assert _gpu_share(snap, {"a": 0.5}) == {"a": 5, "b": 11}
    assert _gpu_share(snap, {"a": 0.5}, k=0.0) == {"a": 8, "b": 8}  # kValue 0: usage has no weight


def test_deserved_quota_is_untouched_by_usage() -> None:
    snap = _two_queues(deserved=4)
    assert _gpu_share(snap, {"a": 1.0}) == {"a": 4, "b": 12}  # a keeps its deserved 4, b gets all 8 over quota
    assert _gpu_share(snap, {"a": 0.5, "b": 0.5}) == {"a": 8, "b": 8}  # equal usage: the plain split
    # every unsatisfied weight floored at 0 (usage above 1 + 1/k each): KAI's rounds stop and the over-quota
    # stays undivided; kai-opt does the same (siblings' usages of one cluster cannot sum above 1 in practice)
    assert _gpu_share(snap, {"a": 2.0, "b": 2.0}) == {"a": 4, "b": 4}


def test_queue_priority_comes_before_usage() -> None:
    snap = _two_queues(priority_b=200)  # b first for over-quota, even with the most usage
    assert _gpu_share(snap, {"b": 1.0}) == {"a": 0, "b": 16}


def test_a_parents_children_divide_with_their_own_usage() -> None:
    objs = [node("n1", gpus=8), node("n2", gpus=8), queue("dept"),
            queue("a", parent="dept"), queue("b", parent="dept", created_min=1), queue("other")]
    for q in ("a", "b", "other"):
        objs += [podgroup(f"{q}-job", q, min_member=16), *[pod(f"{q}-{i}", f"{q}-job", gpus=1) for i in range(16)]]
    st_ = state(objs)
    hist = HistoricalUsage({"dept": (0.5, 0, 0), "a": (0.5, 0, 0)})
    fs = compute_fair_share(st_, history=hist)
    share = {n: float(fs.fair_share[st_.q_index[n], 0]) for n in ("dept", "other", "a", "b")}
    assert share["dept"] + share["other"] == 16 and share["dept"] < share["other"]
    assert share["a"] + share["b"] == share["dept"] and share["a"] < share["b"]


# -- no usage: exactly today's division ------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(objs=clusters(), usage=st.floats(0, 2), k=st.floats(0, 5))
def test_no_or_zero_usage_or_zero_k_divides_exactly_as_without(objs: list, usage: float, k: float) -> None:
    st_ = state(objs)
    plain = compute_fair_share(st_).fair_share
    zero = HistoricalUsage({n: (0.0, 0.0, 0.0) for n in st_.q_names})
    assert np.array_equal(compute_fair_share(st_, history=zero, k_value=k).fair_share, plain)
    some = HistoricalUsage({n: (usage, usage, usage) for n in st_.q_names})
    assert np.array_equal(compute_fair_share(st_, history=some, k_value=0.0).fair_share, plain)
    fs = compute_fair_share(st_, history=some, k_value=k)
    guaranteed = np.minimum(st_.q_deserved, fs.requested)  # deserved quota holds whatever the usage
    guaranteed = np.where(st_.q_limit != -1, np.minimum(guaranteed, st_.q_limit), guaranteed)
    known = st_.q_deserved != -1
    assert (fs.fair_share[known] >= guaranteed[known] - 1e-9).all()


# -- decay and ledger properties -------------------------------------------------------------------------------------
@given(a=st.floats(0, 1e7), b=st.floats(0, 1e7), h=st.floats(1, 1e7))
def test_decay_composes_and_falls(a: float, b: float, h: float) -> None:
    assert decay(a + b, h) == pytest.approx(decay(a, h) * decay(b, h), rel=1e-9, abs=1e-300)
    assert 0 <= decay(a + b, h) <= decay(a, h) <= 1


@settings(max_examples=60, deadline=None)
@given(records=st.lists(st.tuples(st.floats(1, 4 * HOUR), st.lists(st.floats(0, 1), min_size=3, max_size=3)),
                        min_size=1, max_size=30),
       half_life=st.one_of(st.none(), st.floats(60, 10 * HOUR)))
def test_ledger_usage_is_a_fraction_of_capacity_and_survives_json(records: list, half_life: float | None) -> None:
    """Queues never holding more than the cluster together score at most 1 together; the JSON round trip keeps
    every number."""
    ledger = UsageLedger(bucket_s=HOUR, last=0.0)
    t = 0.0
    cap = np.array([16.0, 64000.0, 2.0 ** 40])
    for dt, fractions in records:
        t += dt
        total = sum(fractions) or 1.0
        held = {f"q{i}": cap * (f / max(total, 1.0)) for i, f in enumerate(fractions)}
        ledger.record(t, held, cap, max_gap_s=math.inf)
    window = UsageWindow(window_size_s=24 * HOUR, half_life_s=half_life)
    usage = ledger.usage(window, t)
    sums = np.sum([np.array(v) for v in usage.queues.values()], axis=0) if usage.queues else np.zeros(3)
    assert (sums <= 1 + 1e-9).all()
    again = UsageLedger.from_json(ledger.to_json(), bucket_s=HOUR).usage(window, t)
    assert again.queues == usage.queues


def test_sliding_window_forgets_and_tumbling_window_resets() -> None:
    ledger = UsageLedger(bucket_s=HOUR)
    ledger.add(0.5 * HOUR, {"q": GPU * 10}, GPU * 10, HOUR)  # hour 0: q holds all
    ledger.add(5.5 * HOUR, {}, GPU * 10, HOUR)  # hour 5: nobody
    sliding = UsageWindow(window_size_s=4 * HOUR)
    assert "q" not in ledger.usage(sliding, 6 * HOUR).queues  # hour 0 is more than 4 hours ago
    assert ledger.usage(UsageWindow(window_size_s=8 * HOUR), 6 * HOUR).queues["q"][0] == pytest.approx(0.5)
    tumbling = UsageWindow(window_size_s=5 * HOUR, tumbling_start=0.0)  # resets at 0 h, 5 h, 10 h
    assert ledger.usage(tumbling, 4.9 * HOUR).queues["q"][0] == pytest.approx(1.0)
    assert "q" not in ledger.usage(tumbling, 6 * HOUR).queues  # reset at 5 h
    # KAI's boundary rule (getLatestUsageResetTime_TumblingWindow): exactly at a boundary the window that just
    # ended still counts; just past it the new one starts
    assert window_start(tumbling, 5 * HOUR) == 0.0
    assert window_start(tumbling, 5 * HOUR + 1) == 5 * HOUR
    assert window_start(tumbling, 10 * HOUR) == 5 * HOUR
    assert window_start(tumbling, 0.5 * HOUR) == 0.0
    ledger.prune(tumbling, 6 * HOUR)
    assert [b.start for b in ledger.buckets] == [5 * HOUR]


def test_cron_window_resets_at_the_last_occurrence_before_now() -> None:
    """KAI's cron window: usage since the last occurrence of cronString strictly before now (at an occurrence,
    the one before), with the ledger's buckets as for tumbling; window_size is not used."""
    day = 24 * HOUR
    params = parse_config({"usage_db": {"usage_params": {"window_type": "cron", "cron_string": "0 0 * * *",
                                                         "window_size": "1h"}}}).usage_db.usage_params
    window = UsageWindow.of(params)
    assert window_start(window, 10 * day + 5 * HOUR) == 10 * day
    assert window_start(window, 10 * day) == 9 * day  # exactly at midnight: the previous midnight (KAI's rule)
    ledger = UsageLedger(bucket_s=HOUR, last=10 * day)
    for h in range(1, 31):  # one GPU of two held from day 10 00:00 to 12:00, then none up to day 11 06:00
        ledger.record(10 * day + h * HOUR, {"q": GPU * (h <= 12)}, GPU * 2, max_gap_s=HOUR)
    assert ledger.usage(window, 10 * day + 23 * HOUR).queues["q"][0] == pytest.approx(12 / 46)  # of day 10's 23 h
    assert "q" not in ledger.usage(window, 11 * day + 6 * HOUR).queues  # reset at day 11 00:00
    ledger.prune(window, 11 * day + 6 * HOUR)
    assert [b.start for b in ledger.buckets] == [11 * day + h * HOUR for h in range(7)]  # day 10's buckets left
    future = UsageWindow.of(parse_config({"usage_db": {"usage_params": {
        "window_type": "cron", "cron_string": "0 0 1 1 * 2099"}}}).usage_db.usage_params)
    assert window_start(future, 11 * day) == 11 * day  # no reset before now yet: an empty window, as tumbling's


def test_a_gap_counts_at_most_max_gap() -> None:
    ledger = UsageLedger(bucket_s=HOUR, last=0.0)
    assert ledger.record(10.0, {"q": GPU}, GPU * 2, max_gap_s=300) == 10.0
    assert ledger.record(10_000.0, {"q": GPU}, GPU * 2, max_gap_s=300) == 300  # no leader for hours: unknown
    assert sum(b.queues["q"][0] for b in ledger.buckets) == 310.0


# -- configuration ----------------------------------------------------------------------------------------------------
def test_config_takes_kais_fields_and_durations() -> None:
    cfg = parse_config({"k_value": 0.5, "usage_db": {"client_type": "prometheus",
                                                     "connection_string": "http://prom:9090",
                                                     "usage_params": {"half_life_period": "10m",
                                                                      "window_size": "1w", "window_type": "sliding"}}})
    p = cfg.usage_db.usage_params
    assert (cfg.k_value, p.half_life_period, p.window_size) == (0.5, 600.0, 604_800.0)
    default = parse_config({})
    assert default.k_value == 1.0 and default.usage_db.client_type == ""  # KAI: kValue 1, usage off
    assert default.usage_db.usage_params.window_size == 7 * 86400 and default.usage_db.usage_params.fetch_interval == 60
    t = parse_config({"usage_db": {"usage_params": {"window_type": "tumbling",
                                                    "tumbling_window_start_time": "2026-01-01T00:00:00Z"}}})
    assert t.usage_db.usage_params.tumbling_window_start_time == 1_767_225_600.0
    c = parse_config({"usageDBConfig": {"usageParams": {"windowType": "cron", "cronString": "0 0 * * 1"}}})
    assert (c.usage_db.usage_params.window_type, c.usage_db.usage_params.cron_string) == ("cron", "0 0 * * 1")
    # as KAI: cronString is read only for a cron window (a sliding one ignores even a bad one)
    s = parse_config({"usage_db": {"usage_params": {"window_type": "sliding", "cron_string": "invalid"}}})
    assert UsageWindow.of(s.usage_db.usage_params).cron is None


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"usage_db": {"client_type": "fake"}}, "usage_db.client_type", "prometheus or ledger"),
    ({"usage_db": {"client_type": "prometheus"}}, "usage_db", "connection_string"),
    ({"usage_db": {"usage_params": {"window_type": "tumbling"}}}, "usage_db.usage_params",
     "tumbling_window_start_time"),
    ({"usage_db": {"usage_params": {"window_type": "hopping"}}}, "usage_db.usage_params.window_type", "sliding"),
    ({"usage_db": {"usage_params": {"window_type": "cron"}}}, "usage_db.usage_params.cron_string",
     "window_type cron needs cron_string"),
    ({"usage_db": {"usage_params": {"window_type": "cron", "cron_string": "invalid"}}},
     "usage_db.usage_params.cron_string", "1 fields in 'invalid'"),
    ({"usageDBConfig": {"usageParams": {"windowType": "cron", "cronString": "0 25 * * *"}}},
     "usageDBConfig.usageParams.cronString", "hour field: 25 is out of range 0-23"),  # named as written
    ({"usage_db": {"usage_params": {"window_type": "cron", "cron_string": "0 0 30 2 *"}}},
     "usage_db.usage_params.cron_string", "never fires"),
    ({"usage_db": {"usage_params": {"half_life_period": "ten minutes"}}}, "usage_db.usage_params.half_life_period",
     "not a duration"),
    ({"k_value": -1}, "k_value", "greater than or equal to 0"),
])
def test_bad_time_based_fair_share_config_is_one_line_naming_the_field(data: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, source="cfg.yaml")
    text = str(err.value)
    assert "\n" not in text and f"field {field}" in text and words in text, text


def test_kais_camel_case_block_can_be_pasted() -> None:
    """A SchedulingShard's kValue and usageDBConfig, as KAI spells them, read the same as kai-opt's names."""
    kai = parse_config({"kValue": 0.5, "usageDBConfig": {
        "clientType": "prometheus", "connectionString": "http://prometheus-operated:9090",
        "usageParams": {"windowSize": "1w", "windowType": "sliding", "halfLifePeriod": "10m",
                        "extraParams": {"gpuAllocationMetric": "my_gpus", "queryResolution": "30s"}}}})
    ours = parse_config({"k_value": 0.5, "usage_db": {
        "client_type": "prometheus", "connection_string": "http://prometheus-operated:9090",
        "usage_params": {"window_size": 604800, "window_type": "sliding", "half_life_period": 600,
                         "extra_params": {"gpu_allocation_metric": "my_gpus", "query_resolution": 30}}}})
    assert kai == ours


def test_manifests_grant_the_ledger_configmap_only_when_configured() -> None:
    from kai_opt.k8s.manifests import build_manifests

    def ledger_roles(cfg: object) -> list[dict]:
        objs = build_manifests("sched", "img:1", config=cfg)  # type: ignore[arg-type]
        return [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "kai-opt-usage-ledger"]

    assert ledger_roles(parse_config({})) == []
    roles = ledger_roles(parse_config({"usage_db": {"client_type": "ledger"}}))
    assert len(roles) == 1 and roles[0]["metadata"]["namespace"] == "sched"
    assert roles[0]["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kai-opt-usage"],
                                  "verbs": ["get", "update"]}]


def test_queue_usage_is_a_metric_and_goes_with_its_queue() -> None:
    from kai_opt.k8s.metrics import SchedulerMetrics

    m = SchedulerMetrics()
    m.queue_usage("team-a", {"gpu": 0.24, "cpu": 0.0, "memory": 0.0})
    assert 'kai_queue_gpu_usage{queue_name="team-a"} 0.24' in m.text()  # KAI's name and label
    m.remove_queue("team-a")
    assert "team-a" not in m.text()


def test_ledger_capacity_is_every_nodes_capacity_as_kai_sums_it() -> None:
    """KAI normalises by sum(kube_node_status_capacity): every node, ready or not, at its capacity (not its
    allocatable); the fair share's divisible total (ready nodes' allocatable) would give 7 here, not 16."""
    from kai_opt.fairshare.share import cluster_total
    from kai_opt.fairshare.usage_ledger import held

    ready, down = node("a", gpus=7), node("b", gpus=8, ready=False)
    ready.obj["status"]["capacity"] = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
    s = state([ready, down, queue("q")])
    _, capacity = held(s)
    assert capacity[0] == 16.0
    assert cluster_total(s)[0] == 7.0
