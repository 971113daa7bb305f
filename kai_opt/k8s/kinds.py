"""The API kinds kai-opt reads or writes (its CRDs, the pod grouper's owner kinds, KAI's BindRequest) and the CRD
manifests, without the Kubernetes client: rendering manifests (`kai-opt manifests`, the chart) needs none of it,
and importing the client costs a third of a second."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from kai_opt.errors import KaiOptError


@dataclass(frozen=True)
class CRD:
    """A custom resource kai-opt reads or writes."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def name(self) -> str:
        """The CustomResourceDefinition's name."""
        return f"{self.plural}.{self.group}"


SCHEDULING_GROUP = "scheduling.run.ai"
KAI_GROUP = "kai.scheduler"
QUEUE = CRD(SCHEDULING_GROUP, "v2", "queues", "Queue", namespaced=False)
PODGROUP = CRD(SCHEDULING_GROUP, "v2alpha2", "podgroups", "PodGroup", namespaced=True)
TOPOLOGY = CRD(KAI_GROUP, "v1alpha1", "topologies", "Topology", namespaced=False)
CRDS = (QUEUE, PODGROUP, TOPOLOGY)

# KAI-Scheduler's BindRequest (kai_opt/k8s/kaibind.py: kai-opt writes them when `runtime.binder: kai`)
BINDREQUEST_API_VERSION = "scheduling.run.ai/v1alpha2"
BINDREQUEST_KIND = "BindRequest"
BINDREQUEST_PLURAL = "bindrequests"

# (api_version, kind, plural) of the owners the cache must watch (the pod grouper, kai_opt/k8s/grouper.py); a kind
# whose CRD is absent is skipped by it.
OWNER_KINDS: list[tuple[str, str, str]] = [
    ("batch/v1", "Job", "jobs"),
    ("apps/v1", "ReplicaSet", "replicasets"),
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
    ("kubeflow.org/v1", "TFJob", "tfjobs"),
    ("kubeflow.org/v1", "MPIJob", "mpijobs"),
    ("kubeflow.org/v2beta1", "MPIJob", "mpijobs"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets"),
    ("ray.io/v1", "RayCluster", "rayclusters"),
]

# libyaml's loader when PyYAML has it (the CRDs are 35 kB: 0.1 s in the pure-Python one), the same safe schema
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def crd_manifests() -> str:
    """kai-opt's CustomResourceDefinitions (package data) as YAML text."""
    return resources.files("kai_opt.k8s").joinpath("manifests/crds.yaml").read_text(encoding="utf-8")


def parse_yaml(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a multi-document YAML text; `List` kinds are flattened."""
    out: list[dict[str, Any]] = []
    for doc in yaml.load_all(text, Loader=_SafeLoader):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise KaiOptError(f"not a Kubernetes object (needs apiVersion and kind): {str(doc)[:60]!r}")
        if doc["kind"].endswith("List") and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out
