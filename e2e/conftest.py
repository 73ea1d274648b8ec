"""End-to-end fixtures: a real `slurmk8s up` into the Kubernetes cluster KUBECONFIG names.

The suite deploys examples/local.yaml, changed only where a test needs it (the test's own SSH key,
a short SuspendTime, three small slot nodes so a 2-node job fits the single local node), then
drives it as a researcher would: SSH to the login pod, plain sbatch/squeue/sinfo.
On a failure, the pod logs of the cluster's namespace are attached to the report.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import asyncssh
import pytest
import yaml

import kueuelab
from helpers import (LOCAL_KUBECONFIG, LOCAL_VOLUMES, NAMESPACE, Cluster, NotOurs, apply_storage_class, clear_leftover,
                     e2e_spec, kjson, kubeconfig, kubectl, mark_made_by, programs_log, slurmk8s)

MADE_BY = "e2e"  # the label the suite puts on the namespaces it deploys (helpers.MADE_BY)


@pytest.fixture(scope="session")
def cluster_reachable() -> None:
    probe = kubectl("get", "nodes", "-o", "name", check=False, timeout=20)
    if probe.returncode != 0:
        pytest.fail(f"no Kubernetes cluster answers with KUBECONFIG={kubeconfig()}: {probe.stderr.strip()}\n"
                    "start one with `slurmk8s cluster up` (or point KUBECONFIG at yours)")


@pytest.fixture(scope="session")
def cluster(cluster_reachable, tmp_path_factory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("e2e")
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec_path = work / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(e2e_spec(key.export_public_key().decode().strip() + " e2e")))
    state = work / "state"
    log = work / "slurmk8s.log"
    # from nothing: a namespace left by an earlier run (its volumes, Slurm state, jobs) goes first; one the
    # suite did not make (the quickstart's cluster `local`, an engineer's) is never touched
    try:
        clear_leftover(NAMESPACE, MADE_BY)
    except NotOurs as err:
        pytest.fail(str(err), pytrace=False)
    if kubeconfig() == LOCAL_KUBECONFIG:  # the local cluster's static volumes keep their data on the host
        shutil.rmtree(LOCAL_VOLUMES, ignore_errors=True)
    # volumes left Released by an earlier `down --purge`: `slurmk8s up` gives the local cluster's back
    apply_storage_class()
    t0 = time.monotonic()
    try:
        proc = slurmk8s("up", "--spec", str(spec_path), "--state", str(state), log=log)
    finally:
        mark_made_by(NAMESPACE, MADE_BY)
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        pytest.fail(f"`slurmk8s up` failed (exit {proc.returncode}):\n{log.read_text()[-6000:]}")
    yield Cluster(spec_path, state, log, key, elapsed)
    slurmk8s("down", "--spec", str(spec_path), "--state", str(state), "--yes", log=log)


@pytest.fixture(scope="session")
def kueue(cluster_reachable) -> kueuelab.Kueue:
    """Real Kueue on the cluster (`slurmk8s cluster kueue up`, once per session worker; a second `up`
    finds it unchanged in seconds). Left up when the session ends: it manages only the namespaces
    labelled slurmk8s.io/kueue=managed, its webhooks too (e2e/kueuelab.py). A test that needs it
    running takes `kueue_steady`."""
    with kueuelab.kueue_alone():
        took = kueuelab.kueue_up()
    got = kueuelab.running_kueue()
    if got is None:
        pytest.fail("`slurmk8s cluster kueue up` succeeded but there is no Kueue manager Deployment")
    return dataclasses.replace(got, up_seconds=took)


@pytest.fixture
def kueue_steady(kueue) -> Iterator[kueuelab.Kueue]:
    """Kueue, held shared for the test: no other test stops it meanwhile (kueuelab.kueue_outage)."""
    with kueuelab.kueue_share():
        yield kueue


@pytest.fixture(scope="session")
def log_archive(tmp_path_factory) -> Path:
    """Logs of pods that are gone before the session ends (suspended workers), kept for the secret
    scan that runs last (e2e/test_e2e_security.py)."""
    return tmp_path_factory.mktemp("pod-logs")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e_last: runs after every other test of the session "
                                       "(the scan of all logs the e2e run produced)")
    config.addinivalue_line("markers", "e2e_destroys: removes a cluster for good (`down --purge`): the session's, or "
                                       "one of its own; runs after the e2e_last tests, which still need the "
                                       "session cluster's Secrets")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked e2e_last go to the end, whatever their file is called; those marked e2e_destroys
    (they delete the session cluster's Secrets and volumes) after them."""
    last = [item for item in items if item.get_closest_marker("e2e_last")]
    destroys = [item for item in items if item.get_closest_marker("e2e_destroys")]
    if last or destroys:
        rest = [item for item in items if item not in last and item not in destroys]
        items[:] = rest + last + destroys


# sshd's lines for each SSH session of a test (accepted, disconnected): noise in a failure report
SSH_SESSION = re.compile(r"^(Accepted publickey for|Received disconnect from|Disconnected from user) ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "e2e" in item.keywords:
        try:
            ns = getattr(item.module, "NAMESPACE", NAMESPACE)  # a test module with its own namespace names it
            # the controller first, the login pod last: a CI summary that shows only the head of a long
            # report should show slurmctld and the programs, not sshd's lines of every test's session
            pods = sorted(kjson("get", "pods", "-n", ns)["items"],
                          key=lambda p: {"slurmctld-0": 0}.get(p["metadata"]["name"],
                                                              2 if p["metadata"]["name"].startswith("login") else 1))
            sections = [f"--- slurmk8s programs (resume / suspend / reconcile):\n{programs_log(ns, 40)}"]
            for pod in pods:
                name = pod["metadata"]["name"]
                logs = kubectl("logs", "-n", ns, name, "--all-containers", "--tail=60", check=False)
                lines = logs.stdout.splitlines()
                kept = [ln for ln in lines if not SSH_SESSION.search(ln)]
                left_out = len(lines) - len(kept)
                dropped = f"({left_out} lines of SSH sessions left out)\n" if left_out else ""
                sections.append(f"--- pod {name} ({pod['status'].get('phase')}):\n{dropped}"
                                + "".join(ln + "\n" for ln in kept) + logs.stderr)
            events = kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False)
            sections.append(f"--- events:\n{events.stdout[-4000:]}")
            report.sections.append(("pod logs", "\n".join(sections)))
        except (subprocess.SubprocessError, OSError, ValueError) as err:
            report.sections.append(("pod logs", f"could not collect pod logs: {err}"))
