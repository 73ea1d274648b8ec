"""The Helm chart end to end: `helm install` passes the same smoke test as `slurmk8s up` (SSH, a
2-node job from zero workers), `helm upgrade` with a changed pool leaves a running job alone, and
`helm uninstall` leaves the volumes as `slurmk8s down` does.

Own namespace (slurm-helm) and own static volumes, so it runs next to the `slurmk8s up` cluster of
the other e2e files; everything it creates is removed at the end. Tests run in file order.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import asyncssh
import pytest
import yaml

from helpers import (LOCAL_KUBECONFIG, MADE_BY, ROOT, SUSPEND_TIME, TOOLCHAIN_BIN, Login, NotOurs, apply_storage_class,
                     e2e_spec, job_state, kjson, kubeconfig, kubectl, refuse_foreign, submit,
                     two_node_job_from_zero_workers, wait_for, wait_job)

pytestmark = pytest.mark.e2e

NAMESPACE = "slurm-helm"  # the release namespace is the cluster's namespace; the conftest hook reads it
RELEASE = "slurm"
CHART = ROOT / "charts" / "slurmk8s"
VOLUMES = "/var/lib/slurmk8s/volumes/helm"  # hostPath of this test's static volumes
PVS = ("slurmk8s-helm-home", "slurmk8s-helm-slurmctld-state", "slurmk8s-helm-accounting-db")


def helm(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    exe = str(Path(TOOLCHAIN_BIN) / "helm") if (Path(TOOLCHAIN_BIN) / "helm").exists() else (shutil.which("helm") or "helm")
    return subprocess.run([exe, "--kubeconfig", kubeconfig(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _pv(name: str, claim: str, mode: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"slurmk8s.io/volume": f"helm-{claim}"}},
        "spec": {"storageClassName": "slurmk8s-local", "capacity": {"storage": "1Gi"}, "accessModes": [mode],
                 "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": NAMESPACE, "name": claim},
                 "hostPath": {"path": f"{VOLUMES}/{claim}", "type": "DirectoryOrCreate"}},
    }


def _apply(obj: dict[str, Any]) -> None:
    subprocess.run([kubectl_path(), "--kubeconfig", kubeconfig(), "apply", "-f", "-"], input=json.dumps(obj),
                   capture_output=True, text=True, check=True, timeout=60)


def kubectl_path() -> str:
    built = Path(TOOLCHAIN_BIN) / "kubectl"
    return str(built) if built.exists() else (shutil.which("kubectl") or "kubectl")


FEATURE_LABEL = "slurmk8s.io/e2e-helm-feature"


def _clean() -> None:
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", timeout=180)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s", check=False, timeout=200)
    kubectl("delete", "pv", *PVS, "--ignore-not-found", check=False)
    kubectl("delete", "clusterrole,clusterrolebinding", f"slurmk8s-{NAMESPACE}-read-nodes", "--ignore-not-found",
            check=False)
    kubectl("delete", "validatingadmissionpolicy,validatingadmissionpolicybinding", f"slurmk8s-{NAMESPACE}-worker-pods",
            "--ignore-not-found", check=False)
    if kubeconfig() == LOCAL_KUBECONFIG:
        shutil.rmtree(VOLUMES, ignore_errors=True)


class Release:
    def __init__(self, work: Path, key: asyncssh.SSHKey, values: dict[str, Any]) -> None:
        self.work, self.key, self.values = work, key, values

    def values_file(self) -> Path:
        path = self.work / "values.yaml"
        path.write_text(yaml.safe_dump(self.values))
        return path

    def login(self) -> Login:
        svc = kjson("get", "service", "-n", NAMESPACE, "login")
        return Login(svc["spec"]["clusterIP"], 22, "alice", self.key)


def worker_pods() -> dict[str, dict[str, Any]]:
    pods = kjson("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=worker")["items"]
    return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


@pytest.fixture(scope="module")
def release(cluster_reachable, tmp_path_factory) -> Iterator[Release]:
    from provisioner import manifests as m
    from provisioner.config import parse_spec

    work = tmp_path_factory.mktemp("helm")
    key = asyncssh.generate_private_key("ssh-ed25519")
    values = e2e_spec(key.export_public_key().decode().strip() + " e2e-helm")
    values["name"] = "helm"  # namespace slurm-helm
    # plus a pool pinned to the local node: slurmctld's start reads the Nodes (chart ClusterRole)
    values["pools"].append({"name": "pin", "node_selector": {"kubernetes.io/os": "linux"}, "reserve_cpu": "1",
                            "reserve_memory": "16Gi", "partition": "pinned", "feature_labels": [FEATURE_LABEL]})
    values["chart"] = {}
    try:  # never over a slurm-helm namespace the suite did not make
        refuse_foreign(NAMESPACE, "e2e")
    except NotOurs as err:
        pytest.fail(str(err), pytrace=False)
    _clean()  # from nothing: a release left by an earlier run goes first
    apply_storage_class()
    for pv in (_pv(PVS[0], "home", "ReadWriteMany"), _pv(PVS[1], "slurmctld-state", "ReadWriteOnce"),
               _pv(PVS[2], "accounting-db", "ReadWriteOnce")):
        _apply(pv)
    # the namespace as `slurmk8s up` makes it (Pod Security labels), from the same builder
    ns = m.namespace(parse_spec({k: v for k, v in values.items() if k != "chart"}))
    ns["metadata"]["labels"][MADE_BY] = "e2e"
    _apply(ns)
    rel = Release(work, key, values)
    t0 = time.monotonic()
    out = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--values", str(rel.values_file()),
               "--wait", "--timeout", "5m")
    if out.returncode != 0:
        pods = kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        logs = kubectl("logs", "-n", NAMESPACE, "slurmctld-0", "--all-containers", "--tail=40", check=False)
        events = kubectl("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp", check=False).stdout
        _clean()
        pytest.fail(f"helm install failed:\n{out.stdout}\n{out.stderr}\n--- pods:\n{pods}\n"
                    f"--- slurmctld-0:\n{logs.stdout}{logs.stderr}\n--- events:\n{events[-3000:]}")
    print(f"helm install --wait: {time.monotonic() - t0:.1f} s")
    # --wait ends when the login pod is Ready; kube-proxy routes its Service a moment later (until then
    # a connect is refused), as a user who runs ssh right after the install may see
    from provisioner.controltier.activity import port_open

    host = rel.login().host
    wait_for("the login Service to accept connections on port 22", lambda: port_open(host, 22, timeout=2), 30,
             interval=0.2)
    print(f"login accepts SSH connections {time.monotonic() - t0:.1f} s after the install started")
    yield rel
    _clean()


def test_install_login_answers_ssh(release: Release):
    login = release.login()
    assert login.run("id -un").stdout.strip() == "alice"
    init = kubectl("logs", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld").stdout  # its entrypoint renders
    assert "wrote inventory.json, slurm.conf" in init, init
    assert "Kubernetes nodes read" in init and "(0 Kubernetes nodes read)" not in init, init
    nodes = login.run("sinfo -h -N -o %N").stdout.split()
    assert any(n.startswith("pin-") for n in nodes), f"no Slurm node of the pinned pool: {nodes}"


def test_a_node_label_reaches_slurm_live_without_a_restart(release: Release):
    """The chart's slurmctld pod follows the Kubernetes nodes like `up`'s: a label the pinned pool
    reads as a feature appears on the Slurm node within a reconcile period (render, `scontrol
    reconfigure`), with the same slurmctld pod and no helm upgrade; removed, it goes again."""
    login = release.login()
    node = next(n for n in login.run("sinfo -h -N -o %N").stdout.split() if n.startswith("pin-"))
    k8s_node = kjson("get", "nodes")["items"][0]["metadata"]["name"]
    ctld = kjson("get", "pod", "-n", NAMESPACE, "slurmctld-0")["metadata"]

    def features() -> str:
        return login.run(f"sinfo -h -n {node} -o %f").stdout.strip()

    kubectl("label", "node", k8s_node, f"{FEATURE_LABEL}=e2efast", "--overwrite")
    try:
        t0 = time.monotonic()
        wait_for(f"feature e2efast on {node}", lambda: "e2efast" in features(), 60, interval=1)
        print(f"helm: node label -> Slurm feature {time.monotonic() - t0:.1f} s")
    finally:
        kubectl("label", "node", k8s_node, f"{FEATURE_LABEL}-")
    wait_for(f"feature e2efast gone from {node}", lambda: "e2efast" not in features(), 60, interval=1)
    now = kjson("get", "pod", "-n", NAMESPACE, "slurmctld-0")
    assert now["metadata"]["uid"] == ctld["uid"], "the slurmctld pod was replaced"
    assert all(c["restartCount"] == 0 for c in now["status"]["containerStatuses"]), now["status"]["containerStatuses"]


def test_two_node_job_from_zero_workers(release: Release):
    assert worker_pods() == {}, "worker pods exist before any job"
    two_node_job_from_zero_workers(release.login(), "helm")


def test_upgrade_with_a_changed_pool_leaves_the_running_job_alone(release: Release):
    login = release.login()
    hold = 45
    job = submit(login, f"#!/bin/bash\n#SBATCH -N1 -o busy-%j.out\nhostname; sleep {hold}; echo done")
    running = wait_for("job running", lambda: (s := job_state(login, job)) and "RUNNING" in s["job_state"] and s, 120)
    node = running["nodes"]
    uid = worker_pods()[node]["metadata"]["uid"]
    ctld_uid = kjson("get", "pod", "-n", NAMESPACE, "slurmctld-0")["metadata"]["uid"]

    release.values["pools"][0]["domains"][0]["count"] = 4  # one more slot in the pool
    t0 = time.monotonic()
    out = helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--values", str(release.values_file()),
               "--wait", "--timeout", "4m")
    assert out.returncode == 0, out.stdout + out.stderr
    print(f"helm upgrade --wait (pool changed, slurmctld re-rendered): {time.monotonic() - t0:.1f} s")
    assert kjson("get", "pod", "-n", NAMESPACE, "slurmctld-0")["metadata"]["uid"] != ctld_uid, \
        "a changed spec must roll slurmctld (its start renders the new slurm.conf)"
    pod = worker_pods().get(node)
    assert pod is not None and pod["metadata"]["uid"] == uid, f"the upgrade touched busy worker {node}"
    final = wait_job(login, job, hold + 120)
    assert final["job_state"] == ["COMPLETED"], final
    assert login.run(f"tail -n1 ~/busy-{job}.out").stdout.strip() == "done"
    assert worker_pods().get(node, {}).get("metadata", {}).get("uid") in (uid, None)
    nodes = login.run("sinfo -h -N -o %N").stdout.split()
    assert len({n for n in nodes if n.startswith("cpu-")}) == 4, f"the new slot is not in Slurm: {nodes}"


def test_idle_workers_go_to_zero(release: Release):
    wait_for("every worker pod to be gone", lambda: worker_pods() == {}, SUSPEND_TIME + 90, interval=2)


def test_uninstall_leaves_the_volumes(release: Release):
    # a busy worker at uninstall: the pre-delete hook removes it (Helm does not own worker pods)
    login = release.login()
    job = submit(login, "#!/bin/bash\n#SBATCH -N1\nsleep 600")
    wait_for("a worker pod", lambda: worker_pods() or None, 90)
    out = helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kept due to the resource policy" in out.stdout, out.stdout
    assert job and worker_pods() == {}, "a worker pod outlived `helm uninstall`"
    wait_for("the cluster's pods to terminate", lambda: not kjson("get", "pods", "-n", NAMESPACE)["items"], 60, 1.0)
    for kind in ("services", "roles", "rolebindings", "configmaps", "statefulsets",
                 "deployments", "serviceaccounts", "networkpolicies", "poddisruptionbudgets"):
        items = [i["metadata"]["name"] for i in kjson("get", kind, "-n", NAMESPACE)["items"]
                 if not (kind == "configmaps" and i["metadata"]["name"] == "kube-root-ca.crt")
                 and not (kind == "serviceaccounts" and i["metadata"]["name"] == "default")]
        assert items == [], f"`helm uninstall` left {kind}: {items}"
    assert kubectl("get", "clusterrole", f"slurmk8s-{NAMESPACE}-read-nodes", check=False).returncode != 0
    for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding"):
        assert kubectl("get", kind, f"slurmk8s-{NAMESPACE}-worker-pods", check=False).returncode != 0, \
            f"`helm uninstall` left {kind}"
    pvcs = sorted(i["metadata"]["name"] for i in kjson("get", "pvc", "-n", NAMESPACE)["items"])
    assert pvcs == ["accounting-db", "home", "slurmctld-state"], \
        f"`helm uninstall` must keep the volumes, as `down` does: {pvcs}"
    # the generated keys stay too, so a reinstall keeps the host keys (as the Pulumi stack keeps them)
    secrets = sorted(i["metadata"]["name"] for i in kjson("get", "secrets", "-n", NAMESPACE)["items"])
    assert secrets == ["accounting-db", "slurm-auth", "slurm-jwt", "ssh-host-keys"], secrets  # slurm-jwt: rest.enabled
