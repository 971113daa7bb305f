"""`kai-opt manifests`: the objects of the Helm chart deploy/helm/kai-opt (same descriptions, same values), printed
for `kubectl apply -f -` or applied with server-side apply (`--apply`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from kai_opt.cli.app import app


@app.command()
def manifests(
    namespace: str = typer.Option("kai-opt", "--namespace", "-n", help="namespace of the scheduler's Deployment, "
                                  "ServiceAccount and leader-election Lease (helm's release namespace)"),
    values_files: list[Path] = typer.Option([], "--values", "-f", help="chart values file (as `helm -f`; "
                                            "repeatable, later files win)"),
    image: str | None = typer.Option(None, "--image", help="container image (default: kai-opt:<version>, built "
                                     "from the repository's Dockerfile)"),
    replicas: int | None = typer.Option(None, "--replicas", help="scheduler replicas (one leads, the others "
                                        "stand by; default 2)"),
    config: Path | None = typer.Option(None, "--config", help="kai-opt config file to ship in the ConfigMap "
                                       "(default: the default configuration)"),
    existing_kai: bool | None = typer.Option(None, "--existing-kai/--no-existing-kai", help="the cluster already "
                                             "runs KAI-Scheduler: leave out the CRDs, default PriorityClasses and "
                                             "default Queue (KAI's stay)"),
    create_namespace: bool | None = typer.Option(None, "--create-namespace/--no-create-namespace", help="include "
                                                 "the Namespace object (the chart's createNamespace; default: "
                                                 "included unless a values file says otherwise)"),
    apply: bool = typer.Option(False, "--apply", help="apply to the cluster with server-side apply (field "
                               "manager kai-opt) instead of printing"),
    force_conflicts: bool = typer.Option(False, "--force-conflicts", help="with --apply: take over fields another "
                                         "field manager owns (otherwise such a conflict is an error)"),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="with --apply: kubeconfig file (default: "
                                           "$KUBECONFIG, ~/.kube/config, in-cluster)"),
    context: str | None = typer.Option(None, "--context", help="with --apply: kubeconfig context"),
) -> None:
    """Print everything needed to run kai-opt in a cluster as multi-document YAML (`| kubectl apply -f -`): what
    `helm template --include-crds -n NAMESPACE -f VALUES deploy/helm/kai-opt` renders, or apply it (--apply)."""
    from kai_opt.cli.dump import write_yaml
    from kai_opt.config import load_config
    from kai_opt.k8s.chart_values import load_values_file, merge
    from kai_opt.k8s.manifests import image_values, render_manifests, values_from_config

    # precedence: the chart's defaults < this command's createNamespace (true) < values files < explicit options
    values: dict[str, Any] = {"createNamespace": True}
    for path in values_files:
        values = merge(values, load_values_file(path))
    if config is not None:
        values = merge(values, values_from_config(load_config(config)))
    if image is not None:
        values = merge(values, {"image": image_values(image)})
    if replicas is not None:
        values["replicas"] = replicas
    if existing_kai is not None:
        values["existingKai"] = existing_kai
    if create_namespace is not None:
        values["createNamespace"] = create_namespace
    objs = render_manifests(values, namespace)
    if not apply:
        for obj in objs:
            sys.stdout.write("---\n")
            write_yaml(obj, sys.stdout)
        return
    from kai_opt.k8s.client import make_api_client
    from kai_opt.k8s.ssa import server_side_apply

    with make_api_client(kubeconfig=kubeconfig, context=context) as api:
        for line in server_side_apply(api, objs, force=force_conflicts):
            typer.echo(line)
