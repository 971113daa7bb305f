"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

A candidate tries every `retry_period_s` to take the Lease: it may when the Lease does not exist, has no holder
(released), or its record (holder, renewTime, resourceVersion) has not changed for `lease_duration_s` as measured
on the candidate's own clock (no clock comparison between machines). Updates carry the resourceVersion, so of two
candidates only one wins. The leader renews every `retry_period_s`; when it could not renew for
`renew_deadline_s` (< lease_duration_s) it stops being the leader — before any standby can take over, so two
replicas never write at once. `is_leader()` is the fence every write checks. `release()` (graceful shutdown) clears
the holder and sets leaseDurationSeconds=1 so a standby takes over at once.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import object_path, request

log = logging.getLogger(__name__)

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEASE_API = "coordination.k8s.io/v1"


def default_identity() -> str:
    """hostname_<random> (client-go's convention): unique per process, readable in the Lease."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace(configured: str = "") -> str:
    """The configured namespace, else the pod's own (in a cluster), else `default`."""
    if configured:
        return configured
    try:
        return SA_NAMESPACE_FILE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return os.environ.get("POD_NAMESPACE") or "default"


def lease_name(base: str, shard: str = "") -> str:
    """The Lease of a scheduler: `base`, and `base-<shard>` for a scheduling shard, so each shard elects its own
    leader (a shard's standby never waits on another shard's leader)."""
    return f"{base}-{shard}" if shard else base


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: client.ApiClient, *, namespace: str, name: str, identity: str,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")
        self.api = api
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock = clock
        self._leader = False
        self._last_renew = -math.inf
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = -math.inf
        self._lock = threading.Lock()
        self._op_lock = threading.Lock()  # one Lease request sequence at a time (renew vs release)
        self._closed = False  # released: never acquire again
        self.transitions = 0

    @property
    def path(self) -> str:
        return object_path(LEASE_API, "leases", self.namespace, self.name)

    def is_leader(self) -> bool:
        """True while this replica holds the Lease and renewed it within `renew_deadline_s`."""
        with self._lock:
            return self._leader and self.clock() - self._last_renew < self.renew_deadline_s

    # -- loops ---------------------------------------------------------------------------------------------------
    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica leads (True) or `stop` is set (False)."""
        logged = False
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
                return True
            if not logged:
                holder = self._observed[0] if self._observed else None
                log.info("leader election: standby; %s holds Lease %s/%s", holder or "nobody", self.namespace,
                         self.name)
                logged = True
            stop.wait(self.retry_period_s)
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew every `retry_period_s` until `stop`; call `on_lost` (once) when the renew deadline passes."""
        while not stop.wait(self.retry_period_s):
            ok = self.try_acquire_or_renew()
            with self._lock:
                lost = not ok and self.clock() - self._last_renew >= self.renew_deadline_s
                if lost:
                    self._leader = False
            if lost:
                log.error("leader election: could not renew Lease %s/%s for %.1fs; leadership lost",
                          self.namespace, self.name, self.renew_deadline_s)
                on_lost()
                return

    def run_in_background(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        t = threading.Thread(target=self.keep, args=(stop, on_lost), name="leader-renew", daemon=True)
        t.start()
        return t

    # -- one attempt ---------------------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        with self._op_lock:
            if self._closed:
                return False
            return self._try_acquire_or_renew()

    def _try_acquire_or_renew(self) -> bool:
        now = _micro_time()
        started = self.clock()
        try:
            lease = request(self.api, "GET", self.path, timeout=(2.0, max(self.retry_period_s, 1.0)))
        except ApiException as exc:
            if exc.status != 404:
                log.warning("leader election: read Lease: %s %s", exc.status, exc.reason)
                return False
            return self._create(now, started)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("leader election: read Lease: %s", " ".join(str(exc).split())[:200])
            return False
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"), meta.get("resourceVersion"))
        with self._lock:
            if record != self._observed:
                self._observed, self._observed_at = record, self.clock()
            observed_at = self._observed_at
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            if self.clock() < observed_at + duration:
                with self._lock:
                    self._leader = False
                return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        body = {**lease, "spec": {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration_s)),
            "acquireTime": spec.get("acquireTime") if holder == self.identity and spec.get("acquireTime") else now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }}
        try:
            request(self.api, "PUT", self.path, body=body, timeout=(2.0, max(self.retry_period_s, 1.0)))
        except ApiException as exc:
            if exc.status != 409:  # 409: another candidate updated it first
                log.warning("leader election: update Lease: %s %s", exc.status, exc.reason)
            return False
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("leader election: update Lease: %s", " ".join(str(exc).split())[:200])
            return False
        if holder != self.identity:
            self.transitions = transitions
        self._renewed(started)
        return True

    def _create(self, now: str, started: float) -> bool:
        body = {"apiVersion": LEASE_API, "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, math.ceil(
                    self.lease_duration_s)), "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
        try:
            request(self.api, "POST", object_path(LEASE_API, "leases", self.namespace), body=body,
                    timeout=(2.0, max(self.retry_period_s, 1.0)))
        except ApiException as exc:
            if exc.status != 409:
                log.warning("leader election: create Lease: %s %s", exc.status, exc.reason)
            return False
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("leader election: create Lease: %s", " ".join(str(exc).split())[:200])
            return False
        self._renewed(started)
        return True

    def _renewed(self, started: float) -> None:
        with self._lock:
            self._leader = True
            self._last_renew = started  # measured from before the request: conservative

    def release(self) -> bool:
        """Give the Lease up (graceful shutdown): holder cleared, leaseDurationSeconds 1. True when released."""
        with self._op_lock:  # waits for a renewal in flight
            self._closed = True
            with self._lock:
                was_leader = self._leader
                self._leader = False
            if not was_leader:
                return False
            for _attempt in range(3):
                try:
                    lease = request(self.api, "GET", self.path, timeout=(2.0, 5.0))
                    spec = lease.get("spec") or {}
                    if spec.get("holderIdentity") != self.identity:
                        return False
                    now = _micro_time()
                    body = {**lease, "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now,
                                              "renewTime": now,
                                              "leaseTransitions": spec.get("leaseTransitions") or 0}}
                    request(self.api, "PUT", self.path, body=body, timeout=(2.0, 5.0))
                    log.info("leader election: released Lease %s/%s", self.namespace, self.name)
                    return True
                except ApiException as exc:
                    if exc.status == 409:
                        continue  # changed meanwhile: read it again
                    log.warning("leader election: release Lease: %s %s", exc.status, exc.reason)
                    return False
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    log.warning("leader election: release Lease: %s", " ".join(str(exc).split())[:200])
                    return False
            return False
