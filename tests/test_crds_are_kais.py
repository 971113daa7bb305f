"""kai-opt's CRDs are KAI-Scheduler's, for the same versions and with no field KAI lacks: compared with the CRDs
in KAI's source archive (shared/peers/kai beside the repository, or $KAI_PEER_ARCHIVE)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import yaml

from kai_opt.k8s.client import crd_manifests, parse_yaml

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = Path(os.environ.get("KAI_PEER_ARCHIVE")
               or REPO.parent / "shared" / "peers" / "kai" / "kai-scheduler-72de64f.tar.gz")
CRD_DIR = "kai-scheduler/deployments/kai-scheduler/crds/"


def _kai_crds() -> dict[str, dict[str, Any]]:
    assert ARCHIVE.is_file(), f"KAI's source archive not found at {ARCHIVE} (set KAI_PEER_ARCHIVE)"
    out: dict[str, dict[str, Any]] = {}
    with tarfile.open(ARCHIVE) as tar:
        for member in tar.getmembers():
            if member.name.startswith(CRD_DIR) and member.name.endswith(".yaml"):
                data = tar.extractfile(member)
                assert data is not None
                for doc in yaml.safe_load_all(data.read()):
                    if doc and doc.get("kind") == "CustomResourceDefinition":
                        out[doc["metadata"]["name"]] = doc
    return out


def test_every_crd_equals_kais() -> None:
    kai = _kai_crds()
    ours = parse_yaml(crd_manifests())
    assert [c["metadata"]["name"] for c in ours] == ["queues.scheduling.run.ai", "podgroups.scheduling.run.ai",
                                                     "topologies.kai.scheduler"]
    for crd in ours:
        assert crd == kai[crd["metadata"]["name"]], crd["metadata"]["name"]


def test_chart_ships_the_same_crds() -> None:
    chart = [doc for f in sorted((REPO / "deploy" / "helm" / "kai-opt" / "crds").glob("*.yaml"))
             for doc in parse_yaml(f.read_text(encoding="utf-8"))]
    assert sorted(chart, key=lambda c: c["metadata"]["name"]) == sorted(
        parse_yaml(crd_manifests()), key=lambda c: c["metadata"]["name"])


def test_queue_status_writes_only_fields_of_kais_schema() -> None:
    """A field the CRD prunes would differ from the live status every cycle (a write per queue per cycle)."""
    from types import SimpleNamespace

    import numpy as np

    from kai_opt.k8s.status import queue_status

    [queue_crd] = [c for c in parse_yaml(crd_manifests()) if c["metadata"]["name"] == "queues.scheduling.run.ai"]
    schema = queue_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    row = np.array([[1.0, 1000.0, 1e9]])
    fs = SimpleNamespace(allocated=row, allocated_np=row, requested=row, fair_share=row)
    out = queue_status({"metadata": {"name": "q"}, "status": {"conditions": [{"type": "Valid", "status": "False"}]}},
                       fs, 0, ["child"], None, "t")  # type: ignore[arg-type]
    assert {"allocated", "requested", "childQueues", "conditions"} <= set(out)
    assert set(out) <= set(schema)
