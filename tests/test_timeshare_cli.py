"""Time-based fair share offline: `solve`/`simulate`/`fairshare --usage FILE`, the usage file's validation, the
50-cycle simulation where the starved queue reclaims first, `--plot`, and KAI's Prometheus queries (a fake server)."""

from __future__ import annotations

import itertools
import json
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from builders import node, pod, podgroup, queue, run_cli

from kai_opt.config import parse_config
from kai_opt.k8s.client import ClusterError
from kai_opt.k8s.prometheus import PrometheusUsage

API_VERSION = {"Queue": "scheduling.run.ai/v2", "PodGroup": "scheduling.run.ai/v2alpha2"}
DAY_16_GPUS = 16 * 86400  # GPU-seconds of a 16-GPU cluster in one day


def _write(path: Path, objs: list[Any]) -> Path:
    docs = [{"apiVersion": API_VERSION.get(o.kind, "v1"), "kind": o.kind, **o.obj} for o in objs]
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """16 GPUs; team-a and team-b with equal quota (4) and weight; team-a runs 16 one-GPU jobs, team-b waits with
    16 of its own."""
    objs = [node("n1", gpus=8), node("n2", gpus=8), queue("team-a", gpu=(4, 1, -1)),
            queue("team-b", gpu=(4, 1, -1), created_min=1)]
    for i in range(16):
        objs += [podgroup(f"a-{i}", "team-a"), pod(f"a-{i}-0", f"a-{i}", gpus=1, node_name="n1" if i < 8 else "n2")]
        objs += [podgroup(f"b-{i}", "team-b"), pod(f"b-{i}-0", f"b-{i}", gpus=1)]
    return _write(tmp_path / "cluster.yaml", objs)


@pytest.fixture
def usage(tmp_path: Path) -> Path:
    """team-a used the whole cluster alone for a day."""
    path = tmp_path / "usage.yaml"
    path.write_text(yaml.safe_dump({"window_capacity": {"gpu": DAY_16_GPUS},
                                    "queues": {"team-a": {"gpu": DAY_16_GPUS}}}))
    return path


def _config(tmp_path: Path, **extra: Any) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"engine": "greedy", **extra}))
    return path


def test_fairshare_shows_the_usage_term_per_queue(capsys: pytest.CaptureFixture[str], cluster: Path,
                                                  usage: Path) -> None:
    code, out, err = run_cli(capsys, "fairshare", str(cluster), "--usage", str(usage), "-o", "json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["queues"]}
    assert rows["team-a"]["gpu"]["usage"] == 1.0 and rows["team-b"]["gpu"]["usage"] == 0.0
    assert rows["team-a"]["gpu"]["fair_share"] == 4 and rows["team-b"]["gpu"]["fair_share"] == 12
    code, out, _ = run_cli(capsys, "fairshare", str(cluster), "--usage", str(usage))
    assert "u1" in out and "k_value 1" in out
    code, out, _ = run_cli(capsys, "fairshare", str(cluster), "-o", "json")  # no usage: no usage column
    assert "usage" not in json.loads(out)["queues"][0]["gpu"]


def test_solve_with_usage_reclaims_more_for_the_starved_queue(capsys: pytest.CaptureFixture[str], cluster: Path,
                                                             usage: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    code, out, err = run_cli(capsys, "solve", str(cluster), "-c", str(cfg), "-o", "json")
    assert code == 0, err
    plain = json.loads(out)["summary"]["evictions"]
    code, out, err = run_cli(capsys, "solve", str(cluster), "-c", str(cfg), "--usage", str(usage), "-o", "json")
    assert code == 0, err
    assert plain == 8 and json.loads(out)["summary"]["evictions"] == 12  # fair share of team-b: 8 -> 12


@pytest.mark.parametrize(("content", "words"), [
    ("queues: {}\n", "field window_capacity"),
    ("window_capacity: {gpu: 10}\nqueues: {a: {gpu: -1}}\n", "field queues.a.gpu"),
    ("window_capacity: {gpu: 10}\nqueues: {a: {gpus: 1}}\n", "unknown field"),
    ("window_capacity: {gpu: 10}\nqueues: {a: {cpu: 5}}\n", "window_capacity.cpu is 0"),
    ("- 1\n", "must be a mapping"),
    ("window_capacity: [\n", "invalid YAML"),
])
def test_a_bad_usage_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], cluster: Path, tmp_path: Path,
                                                content: str, words: str) -> None:
    bad = tmp_path / "bad-usage.yaml"
    bad.write_text(content)
    code, out, err = run_cli(capsys, "fairshare", str(cluster), "--usage", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "bad-usage.yaml" in err and words in err, err


def test_simulate_50_cycles_the_starved_queue_reclaims_first_and_the_split_moves_to_it(
        capsys: pytest.CaptureFixture[str], cluster: Path, usage: Path, tmp_path: Path) -> None:
    """Equal quotas; team-a used the cluster alone for a day. The first cycle reclaims for team-b (its fair share
    12 of 16, against 8 without usage); as team-b's usage grows and team-a's decays (half-life 2 h, a cycle every
    10 minutes), the over-quota split moves back toward team-a, one GPU at a time."""
    cfg = _config(tmp_path, usage_db={"usage_params": {"half_life_period": "2h", "window_size": "1w"}})
    png = tmp_path / "queues.png"
    code, out, err = run_cli(capsys, "simulate", str(cluster), "--cycles", "50", "-c", str(cfg), "--usage", str(usage),
                             "--period", "600", "--plot", str(png), "-o", "json")
    assert code == 0, err
    cycles = json.loads(out)["cycles"]
    assert len(cycles) == 50  # a run with usage never stops early: the usage term changes every cycle
    first = cycles[0]
    assert first["evictions"] == 12  # team-a's over-quota goes: team-b reclaims first
    assert first["queues"]["team-a"]["gpu_usage"] == 1.0 and first["queues"]["team-b"]["gpu_usage"] == 0.0
    assert first["queues"]["team-b"]["gpu_fair_share"] == 12
    b_after = [c["queues"]["team-b"]["gpu_allocated_after"] for c in cycles]
    a_usage = [c["queues"]["team-a"]["gpu_usage"] for c in cycles]
    b_usage = [c["queues"]["team-b"]["gpu_usage"] for c in cycles]
    assert max(b_after[:5]) == 12  # team-b got its fair share within a few cycles
    assert all(x >= y for x, y in itertools.pairwise(a_usage))  # team-a's usage decays
    assert all(x <= y for x, y in itertools.pairwise(b_usage))  # team-b's grows
    assert 8 < b_after[-1] < 12  # the split moved back toward team-a, without reaching the plain 8/8 yet
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without usage the run settles on the plain split at once
    code, out, err = run_cli(capsys, "simulate", str(cluster), "--cycles", "50", "-c", str(cfg), "-o", "json")
    plain = json.loads(out)
    assert plain["settled_after"] is not None and plain["cycles"][0]["evictions"] == 8
    assert "queues" not in plain["cycles"][0]


# -- Prometheus (KAI's queries against a fake server) ----------------------------------------------------------------
class _FakePrometheus(BaseHTTPRequestHandler):
    queries: ClassVar[list[str]] = []
    answer: ClassVar[dict[str, Any]] = {}

    def do_GET(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        type(self).queries.append(q)
        if "capacity" in q:
            result = [{"metric": {}, "value": [0, "100"]}]
        else:
            result = [{"metric": {"queue_name": name}, "value": [0, str(v)]}
                      for name, v in type(self).answer.items() if ("gpus" in q) == (name != "cpu-only")]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakePrometheus.queries = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_usage_is_kais_query_normalised_to_capacity(prometheus: str) -> None:
    cfg = parse_config({"usage_db": {"client_type": "prometheus", "connection_string": prometheus,
                                     "usage_params": {"half_life_period": "10m", "window_size": "1w"}}})
    _FakePrometheus.answer = {"team-a": 24, "cpu-only": 50}
    client = PrometheusUsage(prometheus, cfg.usage_db.usage_params)
    usage = client.fetch(now=1_767_225_600)
    assert usage.queues["team-a"][0] == pytest.approx(0.24)
    assert usage.queues["cpu-only"][1] == pytest.approx(0.5)
    # KAI's shape: the metric times 0.5^((now - time()) / halfLife), summed over the window at the resolution
    assert _FakePrometheus.queries[0] == ('sum_over_time((((sum(kube_node_status_capacity{resource="nvidia_com_gpu"}))'
                                          ' * (0.5^((1767225600 - time()) / 600.000000))))[604800s:60s])')
    assert "kai_queue_allocated_gpus" in _FakePrometheus.queries[1]
    assert len(_FakePrometheus.queries) == 6  # capacity and allocation for gpu, cpu and memory


def test_prometheus_cron_window_sums_from_the_last_reset(prometheus: str) -> None:
    """A cron window queries as a tumbling one does: the samples from the last occurrence of cronString before
    now (here Monday 2026-11-30 00:00 UTC, 2 days 3 h 29 min before now), at the resolution."""
    cfg = parse_config({"usageDBConfig": {"clientType": "prometheus", "connectionString": prometheus,
                                          "usageParams": {"windowType": "cron", "cronString": "0 0 * * MON",
                                                          "extraParams": {"queryResolution": "30s"}}}})
    _FakePrometheus.answer = {"team-a": 24}
    now = datetime(2026, 12, 2, 3, 29, 7, tzinfo=UTC).timestamp()
    usage = PrometheusUsage(prometheus, cfg.usage_db.usage_params).fetch(now=now)
    assert usage.queues["team-a"][0] == pytest.approx(0.24)
    span = int(now - datetime(2026, 11, 30, tzinfo=UTC).timestamp())
    assert span == 2 * 86400 + 3 * 3600 + 29 * 60 + 7
    assert _FakePrometheus.queries[1] == f"sum_over_time((kai_queue_allocated_gpus)[{span}s:30s])"


def test_prometheus_down_is_a_cluster_error() -> None:
    cfg = parse_config({"usage_db": {"client_type": "prometheus", "connection_string": "http://127.0.0.1:9",
                                     "usage_params": {"extra_params": {"usage_query_timeout": 1}}}})
    with pytest.raises(ClusterError, match="Prometheus query failed"):
        PrometheusUsage("http://127.0.0.1:9", cfg.usage_db.usage_params).fetch()
