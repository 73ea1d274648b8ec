"""Last in the session, with the purge test: ./quickstart.sh, `slurmk8s down --purge --yes`, then
./quickstart.sh again, as a new user would (issue #20). The purge leaves the cluster's three static
local volumes Released, still holding the deleted claims; the second `up` gives them back (their old
data deleted) and its claims bind, so the second quickstart runs its first job as the first did.

Its own cluster and namespace (QUICKSTART_NAME, default `quickstart`: namespace slurm-quickstart,
volumes slurmk8s-quickstart-*), its own HOME (SSH key, spec, Pulumi state); images, toolchain and
the local cluster are the session's (QUICKSTART_PREBUILT=1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import LOCAL_KUBECONFIG, ROOT, SLURMK8S, TOOLCHAIN_BIN, kjson, kubeconfig, kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_destroys]

NAME = os.environ.get("SLURMK8S_E2E_QUICKSTART_NAME", "quickstart")
NAMESPACE = f"slurm-{NAME}"  # the failure report collects this namespace's pod logs
VOLUMES = Path("/var/lib/slurmk8s/volumes") / NAME
QUICKSTART_TIMEOUT = 900


def run(args: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(args)}\n")
        fh.flush()
        proc = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout,
                              check=False, cwd=ROOT)
    return proc, time.monotonic() - t0


def last_run(log: Path) -> str:
    return log.read_text().rsplit("\n$ ", 1)[-1]


def volumes_of_this_cluster() -> list[dict]:
    return [pv for pv in kjson("get", "pv")["items"]
            if (pv["spec"].get("claimRef") or {}).get("namespace") == NAMESPACE]


def forget() -> None:
    """Nothing of an earlier run: its namespace, its volumes and their data."""
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=200)
    for pv in volumes_of_this_cluster():
        kubectl("delete", "pv", pv["metadata"]["name"], "--wait=true", timeout=60)
    if kubeconfig() == LOCAL_KUBECONFIG:
        shutil.rmtree(VOLUMES, ignore_errors=True)


def test_quickstart_twice_with_a_purge_in_between(cluster_reachable, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "quickstart.log"
    env = dict(os.environ, HOME=str(home), QUICKSTART_NAME=NAME, QUICKSTART_PREBUILT="1",
               QUICKSTART_VENV=sys.prefix, KUBECONFIG=kubeconfig(),
               PATH=f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}")
    spec = home / ".slurmk8s" / f"quickstart-{NAME}.yaml"
    forget()
    try:
        first, t_first = run(["bash", "quickstart.sh"], env, log, QUICKSTART_TIMEOUT)
        said = last_run(log)
        assert first.returncode == 0, said[-6000:]
        assert "JobState=COMPLETED" in said, said[-3000:]
        bound = {pv["metadata"]["name"]: pv["status"]["phase"] for pv in volumes_of_this_cluster()}
        assert bound == {f"slurmk8s-{NAME}-{c}": "Bound" for c in ("home", "slurmctld-state", "accounting-db")}
        marker = VOLUMES / "home" / "left-by-the-first-run"
        if kubeconfig() == LOCAL_KUBECONFIG:  # the volumes' data on this host: the purge must delete it
            marker.write_text("x")

        purge, t_purge = run([SLURMK8S, "down", "--spec", str(spec), "--purge", "--yes"], env, log, 300)
        assert purge.returncode == 0, last_run(log)[-3000:]

        second, t_second = run(["bash", "quickstart.sh"], env, log, QUICKSTART_TIMEOUT)
        said = last_run(log)
        assert second.returncode == 0, said[-6000:]
        assert "JobState=COMPLETED" in said, said[-3000:]
        for claim in ("home", "slurmctld-state", "accounting-db"):
            assert (f"volume slurmk8s-{NAME}-{claim}: its claim {NAMESPACE}/{claim} was deleted; old data deleted"
                    in said), said[-6000:]
        assert "job 1: JobState=COMPLETED" in said, said[-3000:]  # slurmctld's state is new: job ids start again
        assert not marker.exists()
        print(f"quickstart {t_first:.1f}s, down --purge {t_purge:.1f}s, quickstart again {t_second:.1f}s")
    finally:
        run([SLURMK8S, "down", "--spec", str(spec), "--purge", "--yes"], env, log, 300)
        forget()
