"""`kai-opt manifests`: the CRDs, RBAC, ConfigMap, Deployment, default PriorityClasses and Queue for
`kubectl apply -f -`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kai_opt.cli.app import app


@app.command()
def manifests(
    namespace: str = typer.Option("kai-opt", "--namespace", "-n", help="namespace of the scheduler's Deployment, "
                                  "ServiceAccount and leader-election Lease"),
    image: str | None = typer.Option(None, "--image", help="container image (default: kai-opt:<version>, built "
                                     "from the repository's Dockerfile)"),
    replicas: int = typer.Option(2, "--replicas", help="scheduler replicas (one leads, the others stand by)"),
    config: Path | None = typer.Option(None, "--config", help="kai-opt config file to ship in the ConfigMap "
                                       "(default: the default configuration)"),
    existing_kai: bool = typer.Option(False, "--existing-kai", help="the cluster already runs KAI-Scheduler: "
                                      "leave out the CRDs, default PriorityClasses and default Queue (KAI's stay)"),
) -> None:
    """Print everything needed to run kai-opt in a cluster as multi-document YAML (`| kubectl apply -f -`)."""
    from kai_opt.cli.dump import write_yaml
    from kai_opt.config import load_config
    from kai_opt.k8s.manifests import DEFAULT_IMAGE, build_manifests

    objs = build_manifests(namespace, image or DEFAULT_IMAGE, replicas=replicas,
                           config=load_config(config) if config else None, existing_kai=existing_kai)
    for obj in objs:
        sys.stdout.write("---\n")
        write_yaml(obj, sys.stdout)
