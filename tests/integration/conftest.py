"""Fixtures for the integration tier: a Slurm cluster in Docker containers (see testbed.py).

One cluster per test session (module `test_elastic_cluster.py` and friends share it): slurmctld and
login start once, workers come and go with the queue. Skipped with the reason when Docker or the
images are missing.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from testbed import Testbed, unavailable_reason


@pytest.fixture(scope="session")
def testbed_available() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def cluster(testbed_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    bed = Testbed(tmp_path_factory.mktemp("cluster"), node_count=4, suspend_time=15, resume_timeout=60,
                  suspend_timeout=5)
    yield from bed.running()


@pytest.fixture
def clean_overrides(cluster: Testbed) -> Iterator[Testbed]:
    cluster.set_overrides({})
    try:
        yield cluster
    finally:
        cluster.set_overrides({})

