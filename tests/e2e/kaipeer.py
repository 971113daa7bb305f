"""KAI-Scheduler's own binder for end-to-end tests: built from the KAI-Scheduler source archive by the peer's
`build.sh` (cached outside the repository, a no-op once built), its BindRequest CRD from the same source, and the
binder run against the test apiserver."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.client import apply_objects, parse_yaml, request

from .schedharness import served
from .testcluster import REPO, LocalCluster, Process, free_port

# the peer directory (build.sh and the source archive): $KAI_PEER_DIR, else ../shared/peers/kai beside the checkout
PEER_DIR = Path(os.environ.get("KAI_PEER_DIR") or REPO.parent / "shared" / "peers" / "kai")
CRD_FILE = "deployments/kai-scheduler/crds/scheduling.run.ai_bindrequests.yaml"
CRD_NAME = "bindrequests.scheduling.run.ai"
BUILD_TIMEOUT_S = 3600  # cold: the harness and the binder from the Go module proxy, 15-20 minutes on 2 cores


class KaiBuildError(RuntimeError):
    """KAI's binder could not be built (message carries build.sh's output tail)."""


@dataclass(frozen=True)
class KaiPeer:
    binder: Path  # the binder binary
    source: Path  # KAI-Scheduler's extracted source

    @property
    def crd(self) -> Path:
        return self.source / CRD_FILE


def build_binder() -> KaiPeer:
    """KAI's binder, built when missing (`build.sh binder`: it prints its bin directory on its last line)."""
    script = PEER_DIR / "build.sh"
    if not script.is_file():
        raise KaiBuildError(f"{script} not found: set KAI_PEER_DIR to the KAI peer directory (build.sh and the "
                            "KAI-Scheduler source archive)")
    proc = subprocess.run([str(script), "binder"], capture_output=True, text=True, check=False,
                          timeout=BUILD_TIMEOUT_S)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-30:])
        raise KaiBuildError(f"{script} binder failed ({proc.returncode}):\n{tail}")
    bin_dir = Path(lines[-1])
    peer = KaiPeer(bin_dir / "binder", bin_dir.parent / "src" / "kai-scheduler")
    if not os.access(peer.binder, os.X_OK) or not peer.crd.is_file():
        raise KaiBuildError(f"build.sh left no binder at {peer.binder} or no CRD at {peer.crd}")
    return peer


@contextlib.contextmanager
def bindrequest_crd(api: ApiClient, peer: KaiPeer) -> Iterator[None]:
    """KAI's BindRequest CRD installed (its own schema); removed afterwards, with every BindRequest (other tests
    of the session expect a cluster without KAI)."""
    apply_objects(api, list(parse_yaml(peer.crd.read_text(encoding="utf-8"))), crd_timeout=60)
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            request(api, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        deadline = time.monotonic() + 60
        while served(api, "scheduling.run.ai/v1alpha2") and time.monotonic() < deadline:
            time.sleep(0.2)


@contextlib.contextmanager
def kai_binder(cluster: LocalCluster, peer: KaiPeer, *, scheduler_name: str = "kai-opt",
               reservation_namespace: str = "kai-resource-reservation",
               allocation_timeout_s: int = 40, log_name: str = "kai-binder") -> Iterator[Process]:
    """KAI's binder against the test apiserver as the admin: fractions on nodes without GPUs (`--fake-gpu-nodes`:
    its reservation pods sleep instead of running KAI's image), no leader election, metrics and probes on free
    loopback ports. Stopped on exit."""
    argv = [str(peer.binder), f"--kubeconfig={cluster.kubeconfig()}", "--fake-gpu-nodes",
            f"--scheduler-name={scheduler_name}", f"--resource-reservation-namespace={reservation_namespace}",
            f"--resource-reservation-allocation-timeout={allocation_timeout_s}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{free_port()}",
            "--rate-limiter-base-delay=1", "--rate-limiter-max-delay=2", "--zap-log-level=info"]
    log = cluster.workdir / f"{log_name}.log"
    proc = Process("kai-binder", argv, log)
    try:
        yield proc
    finally:
        proc.stop()
