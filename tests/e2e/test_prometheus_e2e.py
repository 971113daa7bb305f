"""kai-opt's Prometheus usage source against a real Prometheus (scripts/build-testbin prometheus): Prometheus
scrapes a loopback exporter serving the series KAI's queries read (kai_queue_allocated_gpus{queue_name},
kube_node_status_capacity{resource}), and the usage kai-opt computes from them is checked for a sliding and a
cron window. Skipped when the optional binary is not built."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kai_opt.config import parse_config
from kai_opt.k8s.prometheus import PrometheusUsage

from .schedharness import wait_for
from .testcluster import REPO, free_port

pytestmark = pytest.mark.e2e

NODES = {"n1": 4, "n2": 4}  # GPUs: capacity 8


def prometheus_version() -> str:
    """The default PROMETHEUS_VERSION of scripts/build-testbin (the one place it is written)."""
    m = re.search(r'^PROMETHEUS_VERSION="\$\{PROMETHEUS_VERSION:-([^}]+)\}"',
                  (REPO / "scripts" / "build-testbin").read_text(encoding="utf-8"), re.M)
    assert m, "PROMETHEUS_VERSION not found in scripts/build-testbin"
    return m.group(1)


def find_prometheus() -> Path:
    """$KAI_OPT_PROMETHEUS, else build-testbin's prometheus-<version>/prometheus beside the cluster binaries, built
    when missing (as helm: a cold build takes ~16 minutes on 2 cores; scripts/test builds it before the suite)."""
    env = os.environ.get("KAI_OPT_PROMETHEUS")
    if env and os.access(env, os.X_OK):
        return Path(env)
    root = Path(os.environ.get("KAI_OPT_TESTBIN", Path.home() / ".cache" / "kai-opt-testbin" / "x")).parent
    path = root / f"prometheus-{prometheus_version()}" / "prometheus"
    if not os.access(path, os.X_OK):
        proc = subprocess.run([str(REPO / "scripts" / "build-testbin"), "prometheus"], capture_output=True,
                              text=True, check=False, env={**os.environ, "KAI_OPT_TESTBIN": str(root)})
        assert proc.returncode == 0 and os.access(path, os.X_OK), \
            f"scripts/build-testbin prometheus failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return path


class _Exporter(BaseHTTPRequestHandler):
    """KAI's metric names: the queue allocations kai-opt (or KAI) exports and kube-state-metrics' capacity."""

    gpus: ClassVar[dict[str, float]] = {}

    def do_GET(self) -> None:
        lines = [f'kai_queue_allocated_gpus{{queue_name="{q}"}} {v}' for q, v in type(self).gpus.items()]
        lines += [f'kai_queue_allocated_cpu_cores{{queue_name="{q}"}} {v * 16}' for q, v in type(self).gpus.items()]
        for n, g in NODES.items():
            lines += [f'kube_node_status_capacity{{node="{n}",resource="nvidia_com_gpu"}} {g}',
                      f'kube_node_status_capacity{{node="{n}",resource="cpu"}} {g * 16}',
                      f'kube_node_status_capacity{{node="{n}",resource="memory"}} {g * 2**34}']
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    binary = find_prometheus()
    exporter = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"- job_name: kai\n  static_configs: [{{targets: ['127.0.0.1:{exporter.server_address[1]}']}}]\n",
        encoding="utf-8")
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([str(binary), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("Prometheus ready", lambda: _get(f"{url}/-/ready") is not None, timeout=60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        exporter.shutdown()
        exporter.server_close()


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bytes(resp.read())
    except OSError:
        return None


def _instant(url: str, promql: str) -> dict[str, float]:
    """queue_name (or '') -> value of an instant query now."""
    body = _get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    result = json.loads(body or b"{}").get("data", {}).get("result", [])
    return {r["metric"].get("queue_name", ""): float(r["value"][1]) for r in result}


def _usage(url: str, **usage_params: Any) -> dict[str, tuple[float, float, float]]:
    cfg = parse_config({"usage_db": {"client_type": "prometheus", "connection_string": url, "usage_params": {
        **usage_params, "extra_params": {"query_resolution": "1s"}}}})
    return PrometheusUsage(url, cfg.usage_db.usage_params).fetch(now=time.time()).queues


def test_usage_from_a_real_prometheus_sliding_and_cron(prometheus: str) -> None:
    _Exporter.gpus = {"team-a": 4.0, "team-b": 0.0}
    wait_for("three scrapes", lambda: _instant(prometheus, "count_over_time(kai_queue_allocated_gpus[1m])")
             .get("team-a", 0) >= 3, timeout=60)
    # team-a held half the GPUs (and half the CPUs) all along: 0.5 in any window
    usage = _usage(prometheus, window_size="1h")
    assert usage["team-a"][0] == pytest.approx(0.5) and usage["team-a"][1] == pytest.approx(0.5)
    assert usage["team-b"] == (0.0, 0.0, 0.0)
    decayed = _usage(prometheus, window_size="1h", half_life_period="2s")  # decay weighs both sides alike
    assert decayed["team-a"][0] == pytest.approx(0.5)

    _Exporter.gpus = {"team-a": 0.0, "team-b": 2.0}
    wait_for("the new values scraped", lambda: _instant(prometheus, "kai_queue_allocated_gpus").get("team-b") == 2)
    seen = time.time()
    # a cron window resetting every 5 s (seconds field first): once a reset has passed after the new values were
    # scraped, the window holds only them; the sliding hour still holds team-a's past
    boundary = (seen // 5 + 1) * 5
    wait_for("the next 5 s reset", lambda: time.time() > boundary + 1, timeout=10)
    cron = _usage(prometheus, window_type="cron", cron_string="*/5 * * * * * *")
    assert cron["team-a"][0] == 0.0
    assert cron["team-b"][0] == pytest.approx(0.25)
    sliding = _usage(prometheus, window_size="1h")
    assert 0 < sliding["team-a"][0] < 0.5 and 0 < sliding["team-b"][0] < 0.25
    assert sliding["team-a"][0] * 2 + sliding["team-b"][0] * 4 == pytest.approx(1.0)  # every sample: 4 of 8, or 2
