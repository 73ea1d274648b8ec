"""One cluster, one owner (issue #16 item 9), on the session cluster.

A second state directory deploying the same spec (a benchmark, a second engineer, a CI job) used to
co-own the running cluster's objects and, on `down`, delete its slurmctld Service, RBAC and worker
pods. Now the namespace records its owner stack: `up`, `preview` and `down --purge` from a second
state directory are refused, naming the owner, before anything is applied or deleted (the objects'
resourceVersions, the busy worker pod and its job are unchanged). Then objects deleted or changed
behind the owner's back (the slurmctld Service deleted, a ConfigMap label overwritten) are restored
by the owner's next plain `up` (it refreshes first). The cluster is left as it was.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers import NAMESPACE, Cluster, job_state, kjson, kubectl, slurmk8s, submit, wait_for, worker_pods

pytestmark = pytest.mark.e2e

KINDS = ("services,secrets,configmaps,serviceaccounts,roles,rolebindings,statefulsets,deployments,"
         "networkpolicies,poddisruptionbudgets,persistentvolumeclaims")


# kinds whose status moves on its own (worker pods come and go under the PDB, rollouts): their spec
# generation and metadata stand for them; every other object by its resourceVersion
STATUS_MOVES = ("StatefulSet", "Deployment", "PodDisruptionBudget")


def versions() -> dict[str, object]:
    """The namespace and every object in it that `up` / `down` would touch, as a comparable version."""
    objs = kjson("get", KINDS, "-n", NAMESPACE)["items"]
    out: dict[str, object] = {}
    for o in objs:
        meta = o["metadata"]
        out[f"{o['kind']}/{meta['name']}"] = (
            (meta.get("generation"), meta.get("labels"), meta.get("annotations")) if o["kind"] in STATUS_MOVES
            else meta["resourceVersion"])
    out["Namespace"] = kjson("get", "namespace", NAMESPACE)["metadata"]["resourceVersion"]
    return out


def said(log: Path, command: str) -> str:
    return log.read_text().rsplit(f"$ slurmk8s {command}", 1)[-1]


def test_a_second_state_directory_is_refused_and_the_owner_restores_what_was_deleted(cluster: Cluster, tmp_path):
    t0 = time.monotonic()
    ns = kjson("get", "namespace", NAMESPACE)["metadata"].get("annotations") or {}
    owner_state = str(cluster.state.resolve())
    assert ns.get("slurmk8s.io/owner"), f"the session cluster's namespace records no owner: {ns}"
    assert ns.get("slurmk8s.io/owner-description", "").endswith(f":{owner_state} (stack local)"), ns

    # a busy worker pod: the second state directory's `down` must not touch it
    login = cluster.login()
    job = submit(login, "#!/bin/bash\n#SBATCH -N1 -o /dev/null\nsleep 300")
    try:
        running = wait_for("the job running", lambda: (s := job_state(login, job)) and "RUNNING" in s["job_state"]
                           and s, 120)
        node = running["nodes"]
        pod = wait_for(f"the worker pod of {node}", lambda: worker_pods().get(node), 60)
        before = versions()

        other = tmp_path / "other-state"
        log = tmp_path / "other.log"
        for command in (("up",), ("preview",), ("down", "--purge", "--yes")):
            proc = slurmk8s(*command, "--spec", str(cluster.spec_path), "--state", str(other), log=log)
            out = said(log, command[0])
            assert proc.returncode != 0, f"`slurmk8s {' '.join(command)}` from a second state directory: {out[-3000:]}"
            assert f"namespace {NAMESPACE} belongs to another slurmk8s stack: " in out, out[-3000:]
            assert f":{owner_state} (stack local)" in out and "nothing was changed" in out, out[-3000:]
            assert "--take-over" in out and "Fix: " in out, out[-3000:]
            print(f"`slurmk8s {' '.join(command)}` refused:", out.strip().splitlines()[-1][:400])

        assert versions() == before, "a refused command must not change any object of the running cluster"
        still = worker_pods().get(node)
        assert still and still["metadata"]["uid"] == pod["metadata"]["uid"], "the busy worker pod must stay"
        assert "RUNNING" in job_state(login, job)["job_state"]
    finally:
        login.run(f"scancel {job}", check=False)

    # behind the owner's back: its slurmctld Service deleted, a label of a ConfigMap it owns overwritten
    kubectl("delete", "service", "-n", NAMESPACE, "slurmctld", "--wait=true")
    kubectl("label", "configmap", "-n", NAMESPACE, "slurm-users", "app.kubernetes.io/part-of=someone-else",
            "--overwrite")
    proc = slurmk8s("up", "--spec", str(cluster.spec_path), "--state", str(cluster.state), log=cluster.log)
    out = said(cluster.log, "up")
    assert proc.returncode == 0, out[-4000:]
    report = [line for line in out.splitlines() if line.startswith("up: ")]
    print("the owner's `up`:", report)
    svc = kubectl("get", "service", "-n", NAMESPACE, "slurmctld", "-o", "name", check=False)
    assert svc.returncode == 0, f"the deleted slurmctld Service was not restored by `up`:\n{out[-4000:]}"
    labels = kjson("get", "configmap", "-n", NAMESPACE, "slurm-users")["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "slurmk8s", f"the changed label was not restored: {labels}"

    # as it was: the controller answers the login pod again through the restored Service
    wait_for("slurmctld to answer from the login pod",
             lambda: "UP" in login.run("scontrol ping", check=False).stdout, 90, interval=2)
    print(f"owner test: {time.monotonic() - t0:.0f} s")
