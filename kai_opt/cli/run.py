"""`kai-opt run`: the in-cluster scheduler (watch cache, engine, binder, evictor, status, leader election)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import typer

from kai_opt.cli.app import app
from kai_opt.config import load_config
from kai_opt.gcpause import tune_for_service

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """One line per record on stderr: rich when it is a terminal, plain text (with timestamps) otherwise."""
    lvl = getattr(logging, level.upper(), None)
    if not isinstance(lvl, int):
        raise typer.BadParameter(f"unknown log level {level!r} (debug, info, warning, error)", param_hint="--log-level")
    root = logging.getLogger()
    root.handlers.clear()
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        root.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(lvl)
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def run(
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, "
                                           "~/.kube/config, or the in-cluster service account inside a pod)"),
    context: str | None = typer.Option(None, "--context", help="kubeconfig context (default: current)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="kai-opt config YAML"),
    leader_elect: bool = typer.Option(True, "--leader-elect/--no-leader-elect",
                                      help="only the replica holding the Lease schedules"),
    lease_namespace: str | None = typer.Option(None, "--lease-namespace", help="namespace of the Lease (default: "
                                               "config runtime.leader_election.lease_namespace, else the pod's)"),
    identity: str | None = typer.Option(None, "--identity", help="this replica's name in the Lease and in Events "
                                        "(default: $POD_NAME or the hostname, plus a random suffix)"),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535,
                                            help="serve /metrics, /healthz, /readyz on this port"),
    webhook_port: int | None = typer.Option(None, "--webhook-port", min=0, max=65535,
                                            help="serve the GPU-sharing admission webhook (HTTPS) on this port; its "
                                            "certificate is kept in Secret kai-opt-webhook-tls of the Lease's "
                                            "namespace and set as caBundle of MutatingWebhookConfiguration kai-opt"),
    once: bool = typer.Option(False, "--once", help="run one cycle, wait for its binds/evictions, exit"),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error"),
) -> None:
    """Schedule the cluster's pods (schedulerName in config scheduler_names) every schedule_period_s."""
    from kai_opt.compiled import compile_when_used
    from kai_opt.k8s.client import make_api_client
    from kai_opt.k8s.leader import default_identity, default_namespace
    from kai_opt.k8s.runner import Runner, SchedulerMetrics

    setup_logging(log_level)
    tune_for_service()
    compile_when_used()  # a long-lived process: the inner loops (kai_opt.compiled) compiled at their first use
    cfg = load_config(config)
    rt = cfg.runtime
    ident = identity or (f"{os.environ['POD_NAME']}_{default_identity().rsplit('_', 1)[-1]}"
                         if os.environ.get("POD_NAME") else default_identity())
    pool = rt.bind_workers + rt.status_workers + 32  # watches, binder, status, grouper
    api = make_api_client(kubeconfig=kubeconfig, context=context, pool_size=pool)
    metrics = SchedulerMetrics() if SchedulerMetrics is not None else None
    if metrics is not None and metrics_port is not None:
        port = metrics.serve(metrics_port)
        logging.getLogger("kai_opt.run").info("metrics on :%d (/metrics, /healthz, /readyz)", port)
    namespace = default_namespace(lease_namespace or rt.leader_election.lease_namespace)
    runner = Runner(api, cfg, identity=ident, leader_elect=leader_elect, lease_namespace=namespace,
                    metrics=metrics, once=once)
    webhook = None
    if webhook_port is not None and rt.gpu_sharing.enabled:
        from kai_opt.k8s.webhook_runtime import start_webhook

        webhook = start_webhook(api, namespace, webhook_port)

    def _stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("kai_opt.run").info("%s: stopping", signal.Signals(signum).name)
        runner.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    logging.getLogger("kai_opt.run").info("kai-opt run: %s, engine %s, schedulers %s, period %gs%s", ident,
                                          cfg.engine.value, ",".join(cfg.scheduler_names), cfg.schedule_period_s,
                                          ", leader election" if runner.elector is not None else "")
    try:
        code = runner.run()
    finally:
        if webhook is not None:
            webhook.stop()
        if metrics is not None:
            metrics.stop()
        api.close()
    if code:
        raise typer.Exit(code)
