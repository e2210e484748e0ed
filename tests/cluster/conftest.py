"""Fixtures for tests that need a real `ray start` cluster with token authentication."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from troupe.cluster.local import LocalCluster


@pytest.fixture(scope="session")
def _session_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(num_cpus=2)
    yield cluster
    cluster.stop()


@pytest.fixture()
def local_cluster(_session_cluster: LocalCluster) -> LocalCluster:
    """One `LocalCluster` head for the whole session (starting one takes 10-30 s on a shared
    machine), started on first use and again after a test that stopped it.

    Submit to it with ``connect(local_cluster.address, env=local_cluster.client_env())``, or run
    ``ray job submit`` with ``env=local_cluster.subprocess_env()``.
    """
    if not _session_cluster.running:
        _session_cluster.start()
    return _session_cluster
