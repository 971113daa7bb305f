"""Time-based fair share with kai-opt's own usage ledger on a real apiserver: the ConfigMap round trip and its
write guard, past usage steering a live cycle, and the record carried over a restart and over a leader change."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.config import parse_config
from kai_opt.fairshare.usage_ledger import UsageLedger
from kai_opt.k8s.client import object_path, request
from kai_opt.k8s.usage_store import ConfigMapLedger

from .schedharness import (
    FAST_RUNTIME,
    NS,
    SchedulerProcess,
    bound,
    create,
    fresh,
    node,
    pod,
    queue,
    scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["fresh"]  # the fixture

CM = "kai-opt-usage"
DAY = 86400.0


def _config(**usage_params: Any) -> dict[str, Any]:
    return {"engine": "greedy", "schedule_period_s": 0.2, "runtime": FAST_RUNTIME,
            "usage_db": {"client_type": "ledger", "ledger": {"config_map_namespace": NS, "config_map_name": CM},
                         "usage_params": {"fetch_interval": 0.2, **usage_params}}}


def _drop_ledger(api: ApiClient) -> None:
    with contextlib.suppress(ApiException):
        request(api, "DELETE", object_path("v1", "configmaps", NS, CM))


def _stored(api: ApiClient) -> UsageLedger | None:
    try:
        cm = request(api, "GET", object_path("v1", "configmaps", NS, CM))
    except ApiException:
        return None
    return UsageLedger.from_json(cm["data"]["ledger.json"], bucket_s=3600)


def _gpu_seconds(ledger: UsageLedger | None, q: str) -> float:
    return 0.0 if ledger is None else float(sum(b.queues[q][0] for b in ledger.buckets if q in b.queues))


def test_configmap_round_trip_and_a_stale_writer_loses(fresh: Any) -> None:
    with fresh.api_client() as api:
        _drop_ledger(api)
        one = ConfigMapLedger(api, NS, CM, 3600)
        ledger = one.load()
        assert ledger.buckets == [] and one.resource_version is None  # none yet
        ledger.add(time.time(), {"team-a": np.array([2.0, 0, 0])}, np.array([8.0, 0, 0]), 60)
        assert one.save(ledger)
        two = ConfigMapLedger(api, NS, CM, 3600)
        again = two.load()
        assert again.to_json() == ledger.to_json()
        ledger.add(time.time(), {"team-a": np.array([2.0, 0, 0])}, np.array([8.0, 0, 0]), 60)
        assert one.save(ledger)  # one wrote after two read:
        assert not two.save(again)  # two's write is refused (409), nothing lost
        assert _gpu_seconds(_stored(api), "team-a") == 240.0


def test_past_usage_steers_the_cycle_and_the_ledger_survives_a_restart(fresh: Any) -> None:
    """team-a used the 8-GPU cluster alone for a day (seeded ledger): of 8 pending one-GPU pods per queue, team-b's
    go first (its fair share is all 8). The runner adds what is held each cycle; a restarted runner continues the
    same record."""
    with fresh.api_client() as api:
        _drop_ledger(api)
        now = time.time()
        seed = UsageLedger.seeded({"team-a": np.array([8 * DAY, 0, 0])}, np.array([8 * DAY, 0, 0]), at=now,
                                  bucket_s=3600)
        assert ConfigMapLedger(api, NS, CM, 3600).save(seed)
        create(api, [node("n1", 8), queue("team-a", 0), queue("team-b", 0)])
        create(api, [pod(f"a-{i}", gpus=1, queue_name="team-a") for i in range(8)]
               + [pod(f"b-{i}", gpus=1, queue_name="team-b") for i in range(8)])
        with scheduler(fresh, parse_config(_config())):
            wait_for("8 pods bound", lambda: len(bound(api)) == 8, timeout=30)
            assert sorted(bound(api)) == [f"b-{i}" for i in range(8)]  # the starved queue first
            wait_for("team-b's usage recorded", lambda: _gpu_seconds(_stored(api), "team-b") > 0, timeout=20)
        after_first = _stored(api)
        assert after_first is not None
        assert _gpu_seconds(after_first, "team-a") == 8 * DAY  # the seeded day is kept, team-a held nothing since
        b_first = _gpu_seconds(after_first, "team-b")
        time.sleep(1.0)  # the gap while nobody leads counts too (up to staleness_period)
        with scheduler(fresh, parse_config(_config())):
            wait_for("the restarted runner adds to the record",
                     lambda: _gpu_seconds(_stored(api), "team-b") > b_first + 8 * 1.0, timeout=20)
        final = _stored(api)
        assert final is not None and _gpu_seconds(final, "team-a") == 8 * DAY
        assert final.last is not None and final.last > (after_first.last or 0)


def test_a_new_leader_continues_the_ledger(fresh: Any, tmp_path: Path) -> None:
    """Replica a leads and records, is killed (SIGKILL: no last write); replica b takes the Lease and continues
    from the ConfigMap: the record never goes back."""
    config = _config()
    config["runtime"] = {**FAST_RUNTIME}
    with fresh.api_client() as api:
        _drop_ledger(api)
        create(api, [node("n1", 8), queue("team-a", 0)])
        create(api, [pod(f"a-{i}", gpus=1, queue_name="team-a") for i in range(4)])
        a = SchedulerProcess(fresh, tmp_path, config, identity="replica-a", leader_elect=True)
        b = None
        try:
            wait_for("replica-a records usage", lambda: _gpu_seconds(_stored(api), "team-a") > 4 * 1.0, timeout=40)
            b = SchedulerProcess(fresh, tmp_path, config, identity="replica-b", leader_elect=True)
            wait_for("replica-b is standing by", lambda: "standby" in b.output(), timeout=30)
            a.kill()
            before = _gpu_seconds(_stored(api), "team-a")
            wait_for("replica-b leads and adds to a's record",
                     lambda: _gpu_seconds(_stored(api), "team-a") > before + 4 * 1.0, timeout=40)
            assert "usage ledger sched/kai-opt-usage" in b.output()
        finally:
            a.kill()
            if b is not None:
                b.kill()
