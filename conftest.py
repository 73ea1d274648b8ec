"""Test tiers: the default run needs no cluster and no Docker.

`pytest` runs the unit tests only; `pytest -m integration` runs the tests that start real Slurm
daemons and sshd in Docker containers; `pytest -m e2e` those against the Kubernetes cluster in
KUBECONFIG. `pytest --all-tiers tests e2e` runs everything (what .ci/run does).
SLURMK8S_INTEGRATION=1 / SLURMK8S_E2E=1 enable one tier without -m.

Run groups, for `pytest -n 2 --dist loadgroup` (pytest-xdist; what CI runs): each test is in one of
three groups. `host`: the unit and integration tiers; `slurm-local`: the e2e modules on the
session's cluster (the `cluster` fixture: one per worker that asks, so they must share one); `side`:
the e2e modules that deploy clusters of their own (SIDE_E2E_MODULES). A worker runs a whole
scheduling unit, its tests in their order: host and slurm-local are a unit each; each side module
is one (those that must not run side by side together: SIDE_SHARED), handed to the first worker
nearly done, so that the side modules even out the two workers' time. Every e2e test holds the Kubernetes cluster shared while it runs, and
one marked `e2e_alone` (it stops the API server) holds it alone (e2e/kubeshare.py).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

import pytest

TIERS = {"integration": "SLURMK8S_INTEGRATION", "e2e": "SLURMK8S_E2E"}
E2E_DIR = "e2e/"
# e2e modules that never use the session's cluster; any other e2e module runs in group slurm-local
SIDE_E2E_MODULES = frozenset(f"{E2E_DIR}test_e2e_{name}.py" for name in
                             ("embed", "helm", "kueue", "kueue_lab", "mount_retry", "sleep", "sleep_login",
                              "topology", "zz_quickstart"))
# side modules that must not run side by side: one scheduling unit, in collection order. The two
# sleep modules deploy into one namespace (slurm-sleepy); helm labels a real Kubernetes node and
# topology relabels and cordons nodes, and the Slurm configuration of both follows the node labels.
# The Kueue modules share the one Kueue (kueue_lab's outage stops it), and go one after the other.
SIDE_SHARED = {f"{E2E_DIR}test_e2e_sleep_login.py": f"{E2E_DIR}test_e2e_sleep.py",
               f"{E2E_DIR}test_e2e_kueue_lab.py": f"{E2E_DIR}test_e2e_kueue.py",
               f"{E2E_DIR}test_e2e_topology.py": f"{E2E_DIR}test_e2e_helm.py"}
SESSION_CLUSTER_FIXTURE = "cluster"  # e2e/conftest.py
# the e2e tests of this machine's pytest sessions and workers share the Kubernetes cluster under this lock
SHARE_LOCK = Path(os.environ.get("SLURMK8S_E2E_SHARE_LOCK")
                  or Path(tempfile.gettempdir()) / f"slurmk8s-e2e-{os.getuid()}.lock")


def run_group(nodeid: str) -> str:
    """host | slurm-local | side: the run group of the test `nodeid` (see the module's docstring)."""
    module = nodeid.split("::")[0]
    if not module.startswith(E2E_DIR):
        return "host"
    return "side" if module in SIDE_E2E_MODULES else "slurm-local"


def schedule_unit(nodeid: str) -> str:
    """What one worker runs whole: host, slurm-local, or `side:` and a side module (SIDE_SHARED's
    modules together)."""
    group = run_group(nodeid)
    if group != "side":
        return group
    module = nodeid.split("::")[0]
    return f"side:{SIDE_SHARED.get(module, module)}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """`--dist loadgroup` schedules by our units (schedule_unit; not by xdist_group marks: pytest-xdist
    3.8 finds those by rewriting node ids, which pytest 9.2 no longer lets it do). The units go out in
    the order they are collected: `tests e2e` gives host and slurm-local a worker each, and each side
    module to the first worker with at most two tests left to run."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # pytest-xdist is there: it calls this hook

    class RunGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return schedule_unit(nodeid)

    config.option.loadscopereorder = False  # by collection order, not by a group's number of tests
    return RunGroupScheduling(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all-tiers", action="store_true", help="also run the integration and e2e tiers")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e_alone: stops the Kubernetes cluster itself (its API server, its kubelet): "
                                       "no other e2e test runs meanwhile, in this session's other workers "
                                       "(pytest -n) or in another session on this machine")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """An e2e test, with its fixtures' setup and teardown, runs holding the Kubernetes cluster shared,
    or alone (marker e2e_alone)."""
    if "e2e" not in item.keywords or item.get_closest_marker("skip"):
        yield
        return
    with _kubeshare().kubernetes_share(SHARE_LOCK, alone=item.get_closest_marker("e2e_alone") is not None):
        yield


@functools.cache
def _kubeshare():  # noqa: ANN202
    """e2e/kubeshare.py (e2e/ is on the import path only once its conftest is loaded)."""
    spec = importlib.util.spec_from_file_location("kubeshare", Path(__file__).parent / E2E_DIR / "kubeshare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # a wrong group would deploy the session's cluster twice, into one namespace
        if run_group(item.nodeid) == "side" and SESSION_CLUSTER_FIXTURE in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} uses the session's cluster: take its module out of "
                                    "SIDE_E2E_MODULES (conftest.py)")
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
_GROUP_SECONDS: dict[str, float] = {}
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
    group = run_group(report.nodeid)
    _GROUP_SECONDS[group] = _GROUP_SECONDS.get(group, 0.0) + report.duration
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
    if config.getoption("dist", "no") == "loadgroup" and config.getoption("numprocesses", None):
        terminalreporter.section("time per run group (side by side, one worker each)")
        for group, seconds in sorted(_GROUP_SECONDS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{group:12s} {seconds:8.0f} s")
    slowest = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:SLOWEST_MODULES]
    if len(ran) > 1 or len(_MODULE_SECONDS) > SLOWEST_MODULES:
        terminalreporter.section(f"slowest {len(slowest)} test modules")
        for module, seconds in slowest:
            terminalreporter.write_line(f"{seconds:8.0f} s  {module}")
