"""Test tiers: the default run needs no cluster and no Docker.

`pytest` runs the unit tests only; `pytest -m integration` runs the tests that start real Slurm
daemons and sshd in Docker containers; `pytest -m e2e` those against the Kubernetes cluster in
KUBECONFIG. `pytest --all-tiers tests e2e` runs everything (what .ci/run does).
SLURMK8S_INTEGRATION=1 / SLURMK8S_E2E=1 enable one tier without -m.
"""

from __future__ import annotations

import os
from typing import Mapping

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


# ---------------------------------------------------------------- time per tier

_TIER_SECONDS: dict[str, list[float]] = {}
_MODULE_SECONDS: dict[str, float] = {}
SLOWEST_MODULES = 12


def tier_of(keywords: Mapping[str, object]) -> str:
    """integration | e2e | unit, by a test's keywords (its markers among them)."""
    return next((tier for tier in TIERS if tier in keywords), "unit")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sum setup + call + teardown per tier (module fixtures, e.g. a test bed, count where they run)."""
    if report.outcome == "skipped" and report.when != "setup":
        return
    counts = _TIER_SECONDS.setdefault(tier_of(report.keywords), [0.0, 0])
    counts[0] += report.duration
    module = report.nodeid.split("::")[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.when == "call":
        counts[1] += 1


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    """One line per tier that ran: tests and seconds (what CI's time budget is made of); then the
    slowest test modules (their fixtures included), where a cut would count."""
    ran = {tier: v for tier, v in _TIER_SECONDS.items() if v[1]}
    if not ran:
        return
    terminalreporter.section("time per tier")
    for tier in ("unit", "integration", "e2e"):
        if tier in ran:
            seconds, count = ran[tier]
            terminalreporter.write_line(f"{tier:12s} {count:4d} tests {seconds:8.0f} s")
    slowest = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:SLOWEST_MODULES]
    if len(ran) > 1 or len(_MODULE_SECONDS) > SLOWEST_MODULES:
        terminalreporter.section(f"slowest {len(slowest)} test modules")
        for module, seconds in slowest:
            terminalreporter.write_line(f"{seconds:8.0f} s  {module}")
