"""Last in the session (file order): `slurmk8s down --purge` asks first, and with the answer yes (or
--yes) deletes every volume of the cluster (/home, slurmctld's state, the accounting database) and
the namespace."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import NAMESPACE, SLURMK8S, TOOLCHAIN_BIN, Cluster, kjson, kubeconfig, kubectl, slurmk8s, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_destroys]


def test_down_purge_asks_then_deletes_every_volume(cluster: Cluster):
    claims = {p["metadata"]["name"]: p["spec"].get("volumeName") for p in kjson("get", "pvc", "-n", NAMESPACE)["items"]}
    assert set(claims) == {"home", "slurmctld-state", "accounting-db"}, claims
    env = dict(os.environ, KUBECONFIG=kubeconfig(), PATH=f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}")
    said_no = subprocess.run([SLURMK8S, "down", "--spec", str(cluster.spec_path), "--state", str(cluster.state),
                              "--purge"], input="n\n", capture_output=True, text=True, env=env, timeout=120)
    assert said_no.returncode != 0, said_no.stdout
    assert "--purge deletes the volumes home, slurmctld-state, accounting-db" in said_no.stdout, said_no.stdout
    assert len(kjson("get", "pvc", "-n", NAMESPACE)["items"]) == 3, "answering no must keep everything"
    assert kjson("get", "statefulset", "slurmctld", "-n", NAMESPACE)["metadata"]["name"] == "slurmctld"

    proc = slurmk8s("down", "--spec", str(cluster.spec_path), "--state", str(cluster.state), "--purge", "--yes",
                    log=cluster.log)
    said = cluster.log.read_text().rsplit("$ slurmk8s down", 1)[-1]
    assert proc.returncode == 0, said[-3000:]
    for claim in ("home", "slurmctld-state", "accounting-db"):
        assert f"deleted PersistentVolumeClaim {NAMESPACE}/{claim}" in said, said[-3000:]
    assert kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0, "the namespace must be gone"
    # the worker pods' admission policy is cluster-scoped: `down` deletes it with the rest
    policy = f"slurmk8s-{NAMESPACE}-worker-pods"
    for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding"):
        assert kubectl("get", kind, policy, check=False).returncode != 0, f"{kind} {policy} outlived `down`"
    for pv in filter(None, claims.values()):  # the local volumes' reclaim policy is Retain: released, not bound
        # the PV controller marks a volume Released once it sees its claim gone, on its own time
        wait_for(f"volume {pv} Released", lambda pv=pv: kjson("get", "pv", pv)["status"].get("phase"), 30, interval=1,
                 until=lambda phase: phase == "Released")
