"""The chart is generated from the manifests' descriptions (one source): the committed chart is what scripts/gen-chart
writes, the template renderer keeps its rules, and the values behave as documented. (`helm template` equal to
`kai-opt manifests` on a real helm: tests/e2e/test_helm_chart.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kai_opt.config import Config, parse_config
from kai_opt.errors import InputError
from kai_opt.k8s.chart import CHART_DIR, chart_files
from kai_opt.k8s.chart_values import merge
from kai_opt.k8s.manifests import build_manifests, image_values, render_manifests
from kai_opt.k8s.tmpl import Context, Doc, Val, When, flag, helm_template, render, resolve, value
from kai_opt.k8s.webhook import webhook_configuration

REPO = Path(__file__).resolve().parents[1]


def test_committed_chart_is_what_gen_chart_writes() -> None:
    root = REPO / CHART_DIR
    want = chart_files()
    have = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file()}
    assert sorted(have) == sorted(want), "run scripts/gen-chart"
    stale = [name for name in want if have[name] != want[name]]
    assert stale == [], f"run scripts/gen-chart: {stale}"


@pytest.mark.parametrize("values", [{}, {"schedulerNames": ["a", "b"]},
                                    {"gpuSharing": {"reservationNamespace": "resv"}}])
def test_the_charts_webhook_configuration_is_the_runtimes(values: dict) -> None:
    [mwc] = [o for o in render_manifests(values, "sched") if o["kind"] == "MutatingWebhookConfiguration"]
    full = merge({"schedulerNames": ["kai-opt"], "gpuSharing": {"reservationNamespace": "kai-resource-reservation"}},
                 values)
    assert mwc == webhook_configuration("sched", full["schedulerNames"],
                                        reservation_namespace=full["gpuSharing"]["reservationNamespace"])


def test_when_and_val_resolve_and_template() -> None:
    doc = Doc("x.yaml", {"kind": "X", "n": value("n"), "opt": When(flag("on"), value("n")),
                         "items": ["a", When(flag("on"), "b")]}, flag("show"))
    ctx = Context({"n": 3, "on": False, "show": True}, "ns")
    assert render([doc], ctx) == [{"kind": "X", "n": 3, "items": ["a"]}]
    assert render([doc], Context({"n": 3, "on": True, "show": False}, "ns")) == []
    assert resolve(doc.body, Context({"n": 1, "on": True, "show": True}, "ns")) == {
        "kind": "X", "n": 1, "opt": 1, "items": ["a", "b"]}
    text = helm_template(doc)
    assert text.splitlines() == ["{{- if .Values.show }}", "kind: X", "n: {{ .Values.n | toJson }}",
                                 "{{- if .Values.on }}", "opt: {{ .Values.n | toJson }}", "{{- end }}", "items:",
                                 "- a", "{{- if .Values.on }}", "- b", "{{- end }}", "{{- end }}"]


def test_a_list_items_first_entry_cannot_be_conditional() -> None:
    doc = Doc("x.yaml", {"items": [{"a": When(flag("on"), 1), "b": 2}]})
    with pytest.raises(ValueError, match="first entry"):
        helm_template(doc)
    assert resolve(doc.body, Context({"on": False}, "ns")) == {"items": [{"b": 2}]}
    assert Val(".Release.Namespace", lambda c: c.namespace).py(Context({}, "ns")) == "ns"


def test_values_merge_like_helm() -> None:
    assert merge({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "d": None}) == {"a": {"b": 1, "c": [2]}}


def test_the_configmap_holds_the_given_config() -> None:
    cfg = parse_config({"engine": "greedy", "schedule_period_s": 0.5, "scheduler_names": ["x", "y"],
                        "default_queue": "q0", "runtime": {"client_qps": 50, "gpu_sharing": {
                            "enabled": False, "reservation_namespace": "resv"}}})
    [cm] = [o for o in build_manifests("sched", "img:1", config=cfg) if o["kind"] == "ConfigMap"]
    assert parse_config(yaml.safe_load(cm["data"]["config.yaml"])) == cfg.model_copy(update={
        "runtime": cfg.runtime.model_copy(update={"gpu_sharing": cfg.runtime.gpu_sharing.model_copy(
            update={"reservation_image": "img:1"})})})
    [dep] = [o for o in build_manifests("sched", "img:1", config=cfg) if o["kind"] == "Deployment"]
    assert "--webhook-port" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    default = next(o for o in build_manifests() if o["kind"] == "ConfigMap")["data"]["config.yaml"]
    assert parse_config(yaml.safe_load(default)) == Config()


def test_top_level_values_override_the_config_value() -> None:
    [cm] = [o for o in render_manifests({"engine": "greedy", "config": {"engine": "cpsat", "schedule_period_s": 2}},
                                        "ns") if o["kind"] == "ConfigMap"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["engine"] == "greedy" and cfg["schedule_period_s"] == 2


@pytest.mark.parametrize(("image", "values"), [("img:1", {"repository": "img", "tag": "1"}),
                                                ("reg:5000/kai-opt", {"repository": "reg:5000/kai-opt", "tag": ""}),
                                                ("reg:5000/kai-opt:2", {"repository": "reg:5000/kai-opt", "tag": "2"})])
def test_image_round_trips(image: str, values: dict) -> None:
    assert image_values(image) == values
    [dep] = [o for o in build_manifests(image=image) if o["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == image


@pytest.mark.parametrize(("values", "field"), [({"replica": 2}, "replica"), ({"metrics": {"port": 0}}, "metrics.port"),
                                               ({"gpuSharing": {"enable": True}}, "gpuSharing.enable"),
                                               ({"config": []}, "config")])
def test_bad_values_are_input_errors(values: dict, field: str) -> None:
    with pytest.raises(InputError) as err:
        render_manifests(values)
    assert err.value.field == field


def test_cli_values_file_then_explicit_options(tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text("replicas: 3\ncreateNamespace: false\npodDisruptionBudget: {enabled: false}\n")
    proc = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "-n", "x", "-f", str(f),
                           "--replicas", "1"], capture_output=True, text=True, check=True)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert docs == render_manifests({"replicas": 1, "podDisruptionBudget": {"enabled": False}}, "x")
    assert "Namespace" not in [d["kind"] for d in docs if d["metadata"]["name"] == "x"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    proc = subprocess.run([sys.executable, "-m", "kai_opt.cli.main", "manifests", "-f", str(bad)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "mapping" in proc.stderr


SHARDS = [{"name": "pool-a", "partitionValue": "pool-a",
           "config": {"engine": "greedy", "placement": {"gpu": "spread"}, "solver": {"time_budget_s": 2.5}}},
          {"name": "default", "replicas": 1}]


def test_one_deployment_and_config_per_shard() -> None:
    """`shards`: a Deployment, ConfigMap and PodDisruptionBudget per item instead of the single ones; each
    config is the release's with the item's laid over it and the shard named; selectors keep the shards apart."""
    objs = render_manifests({"replicas": 3, "config": {"schedule_period_s": 0.5}, "shards": SHARDS}, "ns")
    deps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    cms = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    pdbs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodDisruptionBudget"}
    assert sorted(deps) == sorted(pdbs) == ["kai-opt-default", "kai-opt-pool-a"]
    assert sorted(cms) == ["kai-opt-default-config", "kai-opt-pool-a-config"]
    assert deps["kai-opt-pool-a"]["spec"]["replicas"] == 3 and deps["kai-opt-default"]["spec"]["replicas"] == 1
    for name, dep in deps.items():
        shard = name.removeprefix("kai-opt-")
        selector = dep["spec"]["selector"]["matchLabels"]
        assert selector == {"app.kubernetes.io/name": "kai-opt", "kai-opt.io/shard": shard}
        assert selector == pdbs[name]["spec"]["selector"]["matchLabels"]
        tmpl = dep["spec"]["template"]
        assert selector.items() <= tmpl["metadata"]["labels"].items()
        assert tmpl["spec"]["volumes"][0]["configMap"]["name"] == f"{name}-config"
    a = parse_config(yaml.safe_load(cms["kai-opt-pool-a-config"]["data"]["config.yaml"]))
    d = parse_config(yaml.safe_load(cms["kai-opt-default-config"]["data"]["config.yaml"]))
    assert (a.shard.name, a.shard.partition_value, d.shard.name, d.shard.partition_value) == (
        "pool-a", "pool-a", "default", "")
    assert a.engine.value == "greedy" and a.placement.gpu.value == "spread" and a.solver.time_budget_s == 2.5
    assert d.engine.value == "cpsat" and a.schedule_period_s == d.schedule_period_s == 0.5
    unsharded = render_manifests({}, "ns")
    assert [o["metadata"]["name"] for o in unsharded if o["kind"] == "Deployment"] == ["kai-opt"]


def test_each_shards_ledger_configmap_is_in_the_ledger_role() -> None:
    objs = render_manifests({"config": {"usage_db": {"client_type": "ledger"}}, "shards": SHARDS}, "ns")
    [role] = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "kai-opt-usage-ledger"]
    names = role["rules"][0]["resourceNames"]
    assert names == ["kai-opt-usage-pool-a", "kai-opt-usage-default"]
    from kai_opt.k8s.shard import shard_config

    for cm in (o for o in objs if o["kind"] == "ConfigMap"):
        cfg = shard_config(parse_config(yaml.safe_load(cm["data"]["config.yaml"])))
        assert cfg.usage_db.ledger.config_map_name in names


def test_each_renders_per_item_and_templates_a_range() -> None:
    from kai_opt.k8s.tmpl import item

    doc = Doc("x.yaml", {"kind": "X", "name": item("name"), "n": value("n")}, flag("show"), each="things")
    ctx = Context({"n": 1, "show": True, "things": [{"name": "a"}, {"name": "b"}]}, "ns")
    assert render([doc], ctx) == [{"kind": "X", "name": "a", "n": 1}, {"kind": "X", "name": "b", "n": 1}]
    assert render([doc], Context({"n": 1, "show": True, "things": []}, "ns")) == []
    assert helm_template(doc).splitlines() == [
        "{{- range $item := .Values.things }}", "{{- with $ }}", "---", "{{- if .Values.show }}", "kind: X",
        "name: {{ $item.name | toJson }}", "n: {{ .Values.n | toJson }}", "{{- end }}", "{{- end }}", "{{- end }}"]


@pytest.mark.parametrize(("shards", "field"), [
    ({"name": "a"}, "shards"),
    ([{"name": "Pool_A"}], "shards[0].name"),
    ([{"name": "a"}, {"name": "a"}], "shards[1].name"),
    ([{"name": "a", "zone": "x"}], "shards[0].zone"),
    ([{"name": "a", "partitionValue": "x y"}], "shards[0].partitionValue"),
    ([{"name": "a", "replicas": 0}], "shards[0].replicas"),
    ([{"name": "a", "config": {"usage_db": {"client_type": "ledger"}}}], "shards[0].config.usage_db"),
    ([{"name": "a", "config": {"runtime": {"binder": "kai"}}}], "shards[0].config.runtime.binder"),
])
def test_bad_shards_are_input_errors(shards: object, field: str) -> None:
    with pytest.raises(InputError) as err:
        render_manifests({"shards": shards})
    assert err.value.field == field


def test_a_bad_shard_config_is_a_config_error() -> None:
    from kai_opt.errors import ConfigError

    with pytest.raises(ConfigError, match="shard pool-a"):
        render_manifests({"shards": [{"name": "pool-a", "config": {"engine": "quantum"}}]})
