"""Test tiers: the default run needs no cluster and no Docker.

`pytest` runs the unit tests only; `pytest -m integration` runs the tests that start real Slurm
daemons and sshd in Docker containers; `pytest -m e2e` those against the Kubernetes cluster in
KUBECONFIG. `pytest --all-tiers tests e2e` runs everything (what .ci/run does).
SLURMK8S_INTEGRATION=1 / SLURMK8S_E2E=1 enable one tier without -m.
"""

from __future__ import annotations

import os

import pytest

TIERS = {"integration": "SLURMK8S_INTEGRATION", "e2e": "SLURMK8S_E2E"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all-tiers", action="store_true", help="also run the integration and e2e tiers")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = config.getoption("-m") or ""
    for tier, env in TIERS.items():
        if config.getoption("--all-tiers") or tier in markexpr or os.environ.get(env) == "1":
            continue
        skip = pytest.mark.skip(reason=f"{tier} tier: run with `pytest -m {tier}` (or {env}=1)")
        for item in items:
            if tier in item.keywords:
                item.add_marker(skip)
