"""Where `kai-opt run` gets past usage for time-based fair share (config usage_db.client_type):

- ledger: kai-opt's own record (kai_opt/fairshare/usage_ledger.py) in a ConfigMap. The leader reads it when it
  starts leading, adds each cycle what every queue holds (subtree sums) since the last record, and writes it back
  at most every fetch_interval and when it stops; a write that lost a race (409) re-reads instead. A new leader
  (after a restart or a failover) continues from the ConfigMap; the gap since the last record counts up to
  staleness_period.
- prometheus: KAI's queries (kai_opt/k8s/prometheus.py), run every fetch_interval; the last answer is used
  (with a warning once older than staleness_period, as KAI does).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.config import Config
from kai_opt.fairshare.history import HistoricalUsage
from kai_opt.fairshare.usage_ledger import UsageLedger, UsageWindow, held
from kai_opt.k8s.client import ClusterError, cluster_error, object_path, request
from kai_opt.k8s.leader import default_namespace
from kai_opt.k8s.prometheus import PrometheusUsage
from kai_opt.state import ClusterState

log = logging.getLogger("kai_opt.usage")

LEDGER_KEY = "ledger.json"
MAX_CONFIGMAP_BYTES = 900_000  # below the apiserver's 1 MiB object limit, with room for metadata


class ConfigMapLedger:
    """The ledger's ConfigMap: read, create, and update guarded by resourceVersion."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, bucket_s: float) -> None:
        self.api, self.namespace, self.name, self.bucket_s = api, namespace, name, bucket_s
        self.resource_version: str | None = None

    def load(self) -> UsageLedger:
        """The stored ledger (an empty one when there is none or it cannot be read as one)."""
        try:
            cm = request(self.api, "GET", object_path("v1", "configmaps", self.namespace, self.name))
        except ApiException as exc:
            if exc.status == 404:
                self.resource_version = None
                return UsageLedger(bucket_s=self.bucket_s)
            raise cluster_error(exc, f"reading ConfigMap {self.namespace}/{self.name}", self.api) from None
        except Exception as exc:  # connection errors (urllib3)
            raise cluster_error(exc, f"reading ConfigMap {self.namespace}/{self.name}", self.api) from None
        self.resource_version = (cm.get("metadata") or {}).get("resourceVersion")
        text = (cm.get("data") or {}).get(LEDGER_KEY)
        if not text:
            return UsageLedger(bucket_s=self.bucket_s)
        try:
            return UsageLedger.from_json(text, bucket_s=self.bucket_s)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ConfigMap %s/%s: not a usage ledger (%s); starting a new one", self.namespace, self.name,
                        exc)
            return UsageLedger(bucket_s=self.bucket_s)

    def save(self, ledger: UsageLedger) -> bool:
        """Write the ledger; False when another writer changed the ConfigMap since it was read (re-load then)."""
        text = ledger.to_json()
        while len(text) > MAX_CONFIGMAP_BYTES and len(ledger.buckets) > 1:
            ledger.buckets.pop(0)  # rule: the oldest usage goes first when the record outgrows a ConfigMap
            text = ledger.to_json()
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": self.name, "namespace": self.namespace,
                                             "labels": {"app.kubernetes.io/name": "kai-opt",
                                                        "app.kubernetes.io/component": "usage-ledger"}},
                                "data": {LEDGER_KEY: text}}
        try:
            if self.resource_version is None:
                cm = request(self.api, "POST", object_path("v1", "configmaps", self.namespace), body=body)
            else:
                body["metadata"]["resourceVersion"] = self.resource_version
                cm = request(self.api, "PUT", object_path("v1", "configmaps", self.namespace, self.name), body=body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise cluster_error(exc, f"writing ConfigMap {self.namespace}/{self.name}", self.api) from None
        except Exception as exc:  # connection errors (urllib3)
            raise cluster_error(exc, f"writing ConfigMap {self.namespace}/{self.name}", self.api) from None
        self.resource_version = (cm.get("metadata") or {}).get("resourceVersion")
        return True


class UsageSource:
    """Past usage for each cycle of the leader, from the configured source; None when time-based fair share is
    off. Failures are logged and never stop a cycle (the last usage, or none, is used)."""

    def __init__(self, api: client.ApiClient, config: Config, *, clock: Any = time.time) -> None:
        db = config.usage_db
        self.kind = db.client_type
        self.params = db.usage_params
        self.window = UsageWindow.of(self.params)
        self.clock = clock
        self.store: ConfigMapLedger | None = None
        self.ledger: UsageLedger | None = None
        self.last_save = -float("inf")
        self.prometheus: PrometheusUsage | None = None
        self.last_usage: HistoricalUsage | None = None
        self.last_fetch: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.kind == "ledger":
            ns = db.ledger.config_map_namespace or default_namespace()
            self.store = ConfigMapLedger(api, ns, db.ledger.config_map_name, db.ledger.bucket)
        elif self.kind == "prometheus":
            url = db.connection_string or os.environ.get(db.connection_string_env_var, "")
            if not url:
                raise ClusterError(f"usage_db: environment variable {db.connection_string_env_var} is not set")
            self.prometheus = PrometheusUsage(url, self.params)

    @property
    def enabled(self) -> bool:
        return self.kind in ("ledger", "prometheus")

    # -- Prometheus: a background fetch every fetch_interval ----------------------------------------------------
    def start(self) -> None:
        if self.prometheus is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._fetch_loop, name="usage-fetch", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + float(self.params.wait_timeout)
        while self.last_fetch is None and time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(0.05)
        if self.last_fetch is None:
            log.warning("no usage from Prometheus within %gs; cycles run without it until it answers",
                        self.params.wait_timeout)

    def _fetch_loop(self) -> None:
        assert self.prometheus is not None
        while not self._stop.is_set():
            now = self.clock()
            try:
                self.last_usage = self.prometheus.fetch(now)
                self.last_fetch = now
            except ClusterError as exc:
                log.error("failed to fetch usage data: %s", exc)
            self._stop.wait(float(self.params.fetch_interval))

    # -- each cycle ------------------------------------------------------------------------------------------------
    def for_cycle(self, state: ClusterState) -> HistoricalUsage | None:
        if not self.enabled:
            return None
        now = self.clock()
        if self.prometheus is not None:
            if self.last_fetch is not None and now - self.last_fetch > float(self.params.staleness_period):
                log.warning("usage data is stale: last update %.0fs ago", now - self.last_fetch)
            return self.last_usage
        try:
            return self._ledger_cycle(state, now)
        except ClusterError as exc:
            log.error("usage ledger: %s", exc)
            return self.ledger.usage(self.window, now) if self.ledger is not None else None

    def _ledger_cycle(self, state: ClusterState, now: float) -> HistoricalUsage:
        assert self.store is not None
        if self.ledger is None:
            self.ledger = self.store.load()
            log.info("usage ledger %s/%s: %d buckets", self.store.namespace, self.store.name,
                     len(self.ledger.buckets))
        amounts, capacity = held(state)
        self.ledger.record(now, amounts, capacity, max_gap_s=float(self.params.staleness_period))
        self.ledger.prune(self.window, now)
        if now - self.last_save >= float(self.params.fetch_interval):
            self.flush(now)
        return self.ledger.usage(self.window, now)

    def flush(self, now: float | None = None) -> None:
        """Write the ledger now (also when the leader stops)."""
        if self.store is None or self.ledger is None:
            return
        if self.store.save(self.ledger):
            self.last_save = self.clock() if now is None else now
        else:  # another writer: continue from what it wrote (this cycle's record is lost, at most one period)
            log.warning("usage ledger %s/%s changed under us; reading it again", self.store.namespace,
                        self.store.name)
            self.ledger = self.store.load()

    def stop(self, *, flush: bool = True) -> None:
        self._stop.set()
        if self.store is not None and flush:
            try:
                self.flush()
            except ClusterError as exc:
                log.error("usage ledger: %s", exc)
