"""Fixtures for end-to-end tests: one test cluster per session (CRDs installed), a clean slate per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .testcluster import LocalCluster, find_testbin, reset_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """A running kube-apiserver + etcd with kai-opt's CRDs Established; stopped at session end."""
    c = LocalCluster(find_testbin())
    c.start()
    try:
        c.install_crds()
        yield c
    finally:
        c.stop()


@pytest.fixture
def clean_cluster(cluster: LocalCluster) -> LocalCluster:
    """The session cluster with every object a test may have left removed (nodes, pods, podgroups, queues,
    topologies, non-system priority classes, test namespaces' contents)."""
    reset_cluster(cluster)
    return cluster
