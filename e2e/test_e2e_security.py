"""Security by default, attacked on the real cluster: every test here tries to get in and must be refused.

Each attack is paired with a control that shows the refusal comes from the protection under test
(the same pod without the forbidden field is admitted, the same sbatch with the cluster's own key is
accepted, alice's key logs alice in), so removing the protection makes the test fail.

They reuse the session's cluster (e2e/conftest.py). The scan of every log the e2e run produced runs
last in the session (marker ``e2e_last``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import secrets as pysecrets
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import asyncssh
import pytest

from provisioner import manifests as m
from provisioner.config import load_spec
from provisioner.deploy.keys import public_key

from helpers import (ISSUED_TOKENS, NAMESPACE, Cluster, can_i, kjson, kubectl, slurmk8s, submit, wait_for, wait_job,
                     worker_pods)

pytestmark = pytest.mark.e2e

INTRUDER_NS = "slurmk8s-e2e-intruder"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# prints the number of token mounts and whether the token file exists: "0 absent" where none is
TOKEN_PROBE = (f"grep -c -e serviceaccount -e kube-api-access /proc/self/mountinfo; "
               f"test -e {TOKEN_DIR}/token && echo present || echo absent")
# Secrets the user-facing login container may mount, each root-only (0400) inside it.
LOGIN_SECRETS = {m.AUTH_SECRET, m.SSH_HOST_KEYS_SECRET, m.AUTHORIZED_KEYS_SECRET}
# Public keys: not secret, and they legitimately appear in the spec ConfigMap and the Pulumi state.
# Secrets whose values are not secret: public keys, and slurmdbd.conf without StoragePass (the
# slurmdbd entrypoint adds the password from Secret accounting-db, which is scanned)
PUBLIC_SECRETS = {m.AUTHORIZED_KEYS_SECRET, m.SLURMDBD_CONF_SECRET}


def _spec(cluster: Cluster):
    return load_spec(cluster.spec_path)


def _login_pod() -> dict[str, Any]:
    pods = [p for p in kjson("get", "pods", "-n", NAMESPACE, "-l", f"{m.L_COMPONENT}={m.LOGIN}")["items"]
            if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _exec(pod: str, container: str, script: str, *, ns: str = NAMESPACE, input: str | None = None,
          check: bool = True, timeout: float = 60):
    return kubectl("exec", "-i" if input is not None else "-q", "-n", ns, pod, "-c", container, "--",
                   "bash", "-c", script, input=input, check=check, timeout=timeout)


def _secret_values(name: str) -> dict[str, bytes]:
    obj = kjson("get", "secret", "-n", NAMESPACE, name)
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


# ---------------------------------------------------------------- Pod Security Admission


def _attack_pod(name: str, image: str, pod_extra: dict[str, Any] | None = None,
                container_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    container = {"name": "c", "image": image, "imagePullPolicy": "Never", "command": ["sleep", "60"],
                 **(container_extra or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"automountServiceAccountToken": False, "containers": [container], **(pod_extra or {})}}


def test_pod_security_admission_refuses_host_and_privileged_pods(cluster: Cluster):
    image = _spec(cluster).images.login
    attacks = {
        "privileged": _attack_pod("attack-privileged", image, container_extra={"securityContext": {"privileged": True}}),
        "hostPath": _attack_pod("attack-hostpath", image,
                                pod_extra={"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
                                container_extra={"volumeMounts": [{"name": "host", "mountPath": "/host"}]}),
        "hostPID": _attack_pod("attack-hostpid", image, pod_extra={"hostPID": True}),
        "hostIPC": _attack_pod("attack-hostipc", image, pod_extra={"hostIPC": True}),
        "hostNetwork": _attack_pod("attack-hostnetwork", image, pod_extra={"hostNetwork": True}),
        "SYS_ADMIN": _attack_pod("attack-sysadmin", image,
                                 container_extra={"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
    }
    admitted = []
    for what, pod in attacks.items():
        proc = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        if proc.returncode == 0 or "violates PodSecurity" not in proc.stderr:
            admitted.append(f"{what}: exit {proc.returncode} {proc.stdout.strip()} {proc.stderr.strip()}")
    assert admitted == [], "the apiserver admitted pods that Pod Security 'baseline' forbids:\n" + "\n".join(admitted)
    # control: the same pod without the forbidden field is admitted (the refusals above are PSA's)
    plain = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(_attack_pod("plain", image)), check=False)
    assert plain.returncode == 0, plain.stderr
    labels = kjson("get", "namespace", NAMESPACE)["metadata"]["labels"]
    assert labels.get("pod-security.kubernetes.io/enforce") == "baseline", labels


# ---------------------------------------------------------------- SSH


def _ssh_attempt(host: str, user: str, **kwargs) -> bool:
    """True when the server let `user` in."""

    async def go() -> bool:
        try:
            async with asyncssh.connect(host, username=user, known_hosts=None, connect_timeout=15, **kwargs):
                return True
        except asyncssh.PermissionDenied:
            return False

    return asyncio.run(go())


def test_sshd_offers_public_keys_only(cluster: Cluster):
    host = cluster.login().host
    for user in ("alice", "root"):
        offered = asyncio.run(asyncssh.get_server_auth_methods(host, username=user))
        assert offered == ["publickey"], f"sshd offers {offered} to {user}"


def test_password_login_refused_even_with_a_real_password(cluster: Cluster):
    """Give alice a real password inside the login pod: sshd must still refuse it (password and
    keyboard-interactive); the account is put back as it was."""
    pod = _login_pod()["metadata"]["name"]
    host = cluster.login().host
    password = "E2e-" + pysecrets.token_urlsafe(12)
    _exec(pod, m.LOGIN, "cp -p /etc/shadow /run/shadow.e2e && chpasswd", input=f"alice:{password}\n")
    try:
        assert _ssh_attempt(host, "alice", password=password, client_keys=None, agent_path=None,
                            preferred_auth="password") is False, "password login accepted"
        assert _ssh_attempt(host, "alice", password=password, client_keys=None, agent_path=None,
                            preferred_auth="keyboard-interactive") is False, "keyboard-interactive login accepted"
    finally:
        _exec(pod, m.LOGIN, "cat /run/shadow.e2e >/etc/shadow && rm -f /run/shadow.e2e")
    assert cluster.login().run("id -un").stdout.strip() == "alice"  # control: alice's key still logs her in


def test_root_login_refused_even_with_an_authorized_key(cluster: Cluster):
    """Install the test's key for root inside the login pod: sshd must still refuse root."""
    pod = _login_pod()["metadata"]["name"]
    public = cluster.key.export_public_key().decode()
    _exec(pod, m.LOGIN, "install -o root -g root -m 0644 /dev/stdin /etc/ssh/authorized_keys/root", input=public)
    try:
        assert _ssh_attempt(cluster.login().host, "root", client_keys=[cluster.key], agent_path=None) is False, \
            "root logged in with a key"
    finally:
        _exec(pod, m.LOGIN, "rm -f /etc/ssh/authorized_keys/root")
    assert _ssh_attempt(cluster.login().host, "alice", client_keys=[cluster.key], agent_path=None) is True


# ---------------------------------------------------------------- what a user can read on the login pod


def _secret_refs(pod_spec: dict[str, Any], container: dict[str, Any]) -> tuple[set[str], list[str]]:
    """(names of Secrets one container can see, mount paths of its Secret volumes)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    names: set[str] = set()
    paths: list[str] = []
    for mount in container.get("volumeMounts", []):
        vol = volumes.get(mount["name"], {})
        found = []
        if "secret" in vol:
            found.append(vol["secret"]["secretName"])
        for src in (vol.get("projected") or {}).get("sources", []):
            if "secret" in src:
                found.append(src["secret"]["name"])
        if found:
            names.update(found)
            paths.append(mount["mountPath"])
    for env in container.get("env", []):
        ref = (env.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            names.add(ref["name"])
    for env_from in container.get("envFrom", []):
        if "secretRef" in env_from:
            names.add(env_from["secretRef"]["name"])
    return names, paths


def test_user_cannot_read_another_home_or_any_secret_on_the_login_pod(cluster: Cluster):
    alice, bob = cluster.login("alice"), cluster.login("bob")
    alice.run("umask 022 && echo alice-only > ~/private.txt")
    got = bob.run("cat /home/alice/private.txt; ls /home/alice", check=False)
    assert got.exit_status != 0 and "alice-only" not in got.stdout and "private.txt" not in got.stdout, got.stdout
    assert bob.run("stat -c %a /home/alice").stdout.strip() == "700"
    # /home itself is root's, 0755 (issue 40 item 12): nobody can plant another user's home there
    assert bob.run("stat -c '%u:%g %a' /home").stdout.strip() == "0:0 755"
    planted = bob.run("mkdir /home/carol", check=False)
    assert planted.exit_status != 0 and "Permission denied" in planted.stderr, (planted.exit_status, planted.stderr)

    pod = _login_pod()
    pspec = pod["spec"]
    assert not pspec.get("shareProcessNamespace"), "the login pod shares its process namespace between containers"
    login = next(c for c in pspec["containers"] if c["name"] == m.LOGIN)
    names, paths = _secret_refs(pspec, login)
    assert names <= LOGIN_SECRETS, (f"the user-facing login container sees Secrets {sorted(names - LOGIN_SECRETS)} "
                                    "(only the auth key, host keys and authorized keys may be mounted, root-only)")
    # every file of every Secret mounted there, and the copies the entrypoint installs
    pod_name = pod["metadata"]["name"]
    files = kubectl("exec", "-n", NAMESPACE, pod_name, "-c", m.LOGIN, "--", "find", *paths,
                    "-mindepth", "1", "-maxdepth", "1", "-not", "-name", "..*").stdout.split()
    files += ["/etc/munge/munge.key"]
    files += kubectl("exec", "-n", NAMESPACE, pod_name, "-c", m.LOGIN, "--", "sh", "-c",
                     "ls /etc/ssh/ssh_host_*_key").stdout.split()
    assert any(f.endswith("munge.key") for f in files) and any("ssh_host_ed25519_key" in f for f in files), files
    files += ["/proc/1/environ", "/proc/1/root/etc/shadow", "/etc/shadow"]
    for user in (alice, bob):  # /etc/passwd: the control, readable by all
        readable = user.run("for f in /etc/passwd " + " ".join(files)
                            + '; do head -c1 "$f" >/dev/null 2>&1 && echo "$f"; done; true').stdout.split()
        assert readable == ["/etc/passwd"], f"{user.user} can read {readable[1:]}"


def test_no_api_token_in_login_or_worker_containers(cluster: Cluster, log_archive: Path):
    """No Kubernetes API token where users run code: the login container and every worker container
    (checked per container, from the pod spec and from inside), and a user's job on two workers
    can read neither the auth key nor a token."""
    pod = _login_pod()
    login = next(c for c in pod["spec"]["containers"] if c["name"] == m.LOGIN)
    _assert_no_token(pod, [login])
    inside = _exec(pod["metadata"]["name"], m.LOGIN, TOKEN_PROBE).stdout
    assert inside.split() == ["0", "absent"], f"login container: {inside}"
    seen = cluster.login().run(TOKEN_PROBE).stdout  # and as the user sees it
    assert seen.split() == ["0", "absent"], f"alice on the login pod: {seen}"

    alice = cluster.login()
    check = ('h=$(hostname); for f in /etc/munge/munge.key /etc/slurmk8s/secret/munge.key; do '
             'head -c1 "$f" >/dev/null 2>&1 && echo "$h READABLE $f"; done; '
             'grep -q -e serviceaccount -e kube-api-access /proc/self/mountinfo && echo "$h TOKEN-MOUNT"; '
             f'ls {TOKEN_DIR} >/dev/null 2>&1 && echo "$h TOKEN-DIR"; echo "$h checked"; sleep 5')
    job = submit(alice, f"#!/bin/bash\n#SBATCH -N2 -o sec-%j.out\nsrun bash -c '{check}'")
    # RUNNING without CONFIGURING: the nodes booted (PrologSlurmctld waits for that), containers run
    running = wait_for(f"job {job} running on two workers",
                       lambda: len(worker_pods()) >= 2 and "CONFIGURING" not in (st := _job(alice, job)["job_state"])
                       and set(st) & {"RUNNING", "COMPLETED"}, 180)
    assert running
    owner = kjson("get", "statefulset", m.CONTROLLER, "-n", NAMESPACE)["metadata"]["uid"]
    for name, wpod in worker_pods().items():
        _assert_no_token(wpod, wpod["spec"]["containers"])
        # owned by the slurmctld StatefulSet: none outlives the cluster (garbage collector)
        refs = [(r["kind"], r["name"], r["uid"]) for r in wpod["metadata"].get("ownerReferences") or ()]
        assert refs == [("StatefulSet", m.CONTROLLER, owner)], f"{name}: ownerReferences {refs}"
        for container in wpod["spec"]["containers"]:
            def probe(pod=name, c=container["name"]):
                proc = _exec(pod, c, TOKEN_PROBE, check=False)
                return proc if proc.returncode == 0 else None

            out = wait_for(f"kubectl exec into {name}/{container['name']}", probe, 60, interval=1).stdout
            assert out.split() == ["0", "absent"], f"{name}/{container['name']}: {out}"
    final = wait_job(alice, job, 180)
    out = alice.run(f"cat ~/sec-{job}.out").stdout
    assert final["job_state"] == ["COMPLETED"], out
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(line.endswith(" checked") for line in lines) and len(lines) == 2, out
    _archive_logs(log_archive, worker_pods())  # the scan at the end wants these; they are suspended soon


def _job(login, job_id: str) -> dict:
    return login.json(f"scontrol show job {job_id} --json")["jobs"][0]


def _assert_no_token(pod: dict[str, Any], containers: Iterable[dict[str, Any]]) -> None:
    spec = pod["spec"]
    name = pod["metadata"]["name"]
    assert spec.get("automountServiceAccountToken") is False, f"{name}: automountServiceAccountToken is not false"
    token_volumes = {v["name"] for v in spec.get("volumes", [])
                     if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", []))}
    for c in containers:
        bad = [vm["mountPath"] for vm in c.get("volumeMounts", [])
               if vm["name"] in token_volumes or vm["mountPath"].startswith("/var/run/secrets/kubernetes.io")]
        assert bad == [], f"{name}/{c['name']} mounts an API token at {bad}"


def _archive_logs(directory: Path, pods: dict[str, dict[str, Any]]) -> None:
    for name, pod in pods.items():
        for c in pod["spec"]["containers"]:
            logs = kubectl("logs", "-n", NAMESPACE, name, "-c", c["name"], check=False)
            (directory / f"{name}.{c['name']}.log").write_text(logs.stdout + logs.stderr)


# ---------------------------------------------------------------- RBAC


def _can_i(sa: str, verb: str, resource: str, namespace: str | None) -> bool:
    """`kubectl auth can-i` as a ServiceAccount of the namespace; resource may be 'pods/exec'."""
    return can_i(f"{NAMESPACE}:{sa}", verb, resource, namespace)


def test_rbac_controller_manages_pods_in_its_own_namespace_only(cluster: Cluster):
    sa = m.CONTROLLER
    must = [(v, "pods", NAMESPACE) for v in ("create", "delete", "get", "list", "watch")]
    missing = [f"{v} {r} -n {ns}" for v, r, ns in must if not _can_i(sa, v, r, ns)]
    assert missing == [], f"{sa} cannot {missing} (the resume/suspend programs need it)"
    # nothing outside its namespace, no Secret but its own pod's (below), nothing that writes nodes or escalates
    never = [
        ("create", "pods", "default"), ("delete", "pods", "kube-system"), ("list", "pods", None),
        ("get", "secrets", NAMESPACE), ("list", "secrets", NAMESPACE), ("get", "secrets", "kube-system"),
        ("list", "secrets", None), ("create", "pods/exec", NAMESPACE), ("create", "serviceaccounts/token", NAMESPACE),
        ("create", "nodes", None), ("patch", "nodes", None), ("delete", "nodes", None), ("update", "nodes/status", None),
        ("create", "namespaces", None), ("delete", "namespaces", None), ("delete", "persistentvolumes", None),
        ("create", "roles", NAMESPACE), ("create", "rolebindings", NAMESPACE), ("escalate", "roles", NAMESPACE),
        ("bind", "clusterroles", None), ("create", "clusterrolebindings", None), ("impersonate", "users", None),
        ("*", "*", NAMESPACE),
    ]
    granted = [f"{v} {r} " + (f"-n {ns}" if ns else "cluster-wide") for v, r, ns in never if _can_i(sa, v, r, ns)]
    assert granted == [], f"{sa} may {granted}"
    # its pod reads its own spec, users and keys at its start (provisioner.podfiles): those, by name
    files = {(f"{kind}s", name) for kind, name, _ in m.pod_files(load_spec(cluster.spec_path))}
    others = {("secrets", m.DB_SECRET), ("secrets", m.SSH_HOST_KEYS_SECRET), ("configmaps", m.SLURM_CONFIG)}
    assert {f"{r}/{n}" for r, n in files | others if can_i(f"{NAMESPACE}:{sa}", "get", r, NAMESPACE, n)} == {
        f"{r}/{n}" for r, n in files}
    assert not {r for r, _ in files if _can_i(sa, "list", r, NAMESPACE)}, "a list would show every object's content"


# ---------------------------------------------------------------- the controller's pods: the pool templates only


PROBE_NODE = "vap-probe-0"  # a made-up Slurm node name: the pods below are dry runs, never scheduled


def _controller_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that authenticates with a fresh token of slurmctld's ServiceAccount and nothing
    else (the admin kubeconfig's client certificate would win over a --token given beside it)."""
    token = kubectl("create", "token", m.CONTROLLER, "-n", NAMESPACE, "--duration=10m").stdout.strip()
    admin = kjson("config", "view", "--minify", "--raw", "--flatten")
    (cluster,) = admin["clusters"]
    doc = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
           "users": [{"name": "slurmctld", "user": {"token": token}}],
           "contexts": [{"name": "slurmctld", "context": {"cluster": cluster["name"], "user": "slurmctld",
                                                         "namespace": NAMESPACE}}],
           "current-context": "slurmctld"}
    path = tmp_path / "slurmctld.kubeconfig"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def _dry_create(pod: dict[str, Any], kubeconfig: Path | None = None):
    """`kubectl create --dry-run=server` of the pod: every admission check runs, nothing is stored."""
    import subprocess

    from helpers import kubeconfig as admin_kubeconfig, kubectl_exe

    return subprocess.run([kubectl_exe(), "--kubeconfig", str(kubeconfig or admin_kubeconfig()), "create",
                           "--dry-run=server", "-o", "name", "-f", "-"], input=json.dumps(pod), capture_output=True,
                          text=True, timeout=60)


def _probe_worker_pod(cluster: Cluster) -> dict[str, Any]:
    """The pod the Kubernetes backend would create for a Slurm node named PROBE_NODE of the first
    pool: the same builder (manifests.worker_pod) on the cluster's own spec and nodes."""
    import dataclasses

    from provisioner.generate import generate_for_kubernetes

    spec = _spec(cluster)
    gen = generate_for_kubernetes(spec, kjson("get", "nodes")["items"])
    first = next(n for n in gen.inventory.nodes if n.pool == spec.pools[0].name)
    return m.worker_pod(spec, dataclasses.replace(first, name=PROBE_NODE))


@contextlib.contextmanager
def _pod_security(level: str) -> Iterator[None]:
    """The namespace at Pod Security `level` for a while, as a host_network pool makes it
    ('privileged'); the label it had is put back."""
    key = "pod-security.kubernetes.io/enforce"
    before = kjson("get", "namespace", NAMESPACE)["metadata"]["labels"].get(key)
    kubectl("label", "namespace", NAMESPACE, f"{key}={level}", "--overwrite")
    try:
        yield
    finally:
        kubectl("label", "namespace", NAMESPACE, f"{key}={before}" if before else f"{key}-", "--overwrite")


def test_the_controller_account_creates_a_worker_pod_of_the_templates(cluster: Cluster, tmp_path: Path):
    """Control for the two below: slurmctld's token may create exactly the pod the backend builds."""
    spec = _spec(cluster)
    name = m.policy_name(spec)
    assert kjson("get", "validatingadmissionpolicy", name)["metadata"]["labels"][m.L_CLUSTER] == spec.name
    binding = kjson("get", "validatingadmissionpolicybinding", name)
    assert binding["spec"]["validationActions"] == ["Deny"]
    ok = _dry_create(_probe_worker_pod(cluster), _controller_kubeconfig(tmp_path))
    assert ok.returncode == 0, f"the controller's own worker pod was refused: {ok.stderr}"


def test_the_controller_account_cannot_create_a_privileged_pod(cluster: Cluster, tmp_path: Path):
    """With the namespace 'privileged' (as a host_network pool makes it), a privileged pod with the
    worker labels and the pool image: the deployer may create it, slurmctld's token may not."""
    name = m.policy_name(_spec(cluster))
    pod = _probe_worker_pod(cluster)
    pod["spec"]["containers"][0]["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
    token = _controller_kubeconfig(tmp_path)
    with _pod_security("privileged"):
        admin = _dry_create(pod)
        refused = _dry_create(pod, token)
    assert admin.returncode == 0, f"control: the deployer's dry run was refused too: {admin.stderr}"
    assert refused.returncode != 0, "slurmctld's token created a privileged pod"
    assert f"ValidatingAdmissionPolicy '{name}'" in refused.stderr, refused.stderr
    assert "the controller may only create worker pods from the pool templates: container slurmd is privileged" \
        in refused.stderr, refused.stderr


def test_the_controller_account_cannot_create_a_pod_of_a_foreign_image(cluster: Cluster, tmp_path: Path):
    """Pod Security 'baseline' admits this pod (the deployer's dry run shows it); the policy does not."""
    spec = _spec(cluster)
    pod = _probe_worker_pod(cluster)
    pod["spec"]["containers"][0]["image"] = spec.images.login  # an image of the cluster, not a pool's
    admin = _dry_create(pod)
    assert admin.returncode == 0, f"control: the deployer's dry run was refused too: {admin.stderr}"
    refused = _dry_create(pod, _controller_kubeconfig(tmp_path))
    assert refused.returncode != 0, "slurmctld's token created a pod of a foreign image"
    assert f"ValidatingAdmissionPolicy '{m.policy_name(spec)}'" in refused.stderr, refused.stderr
    assert f"container slurmd runs image {spec.images.login}, not the image of pool {spec.pools[0].name}" \
        in refused.stderr, refused.stderr


PROBE_RUNTIME_CLASS = "slurmk8s-e2e-probe"  # a RuntimeClass the test makes (the admission plugin refuses an unknown one)


def _container0(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


# One field each that the old field-by-field policy let through (issue 40 item 9): the mutation,
# and the start of what the policy says. Pod Security 'baseline' admits every one of them.
OFF_TEMPLATE: dict[str, tuple[Any, str]] = {
    "env-secretKeyRef": (lambda p: _container0(p)["env"].append(
        {"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": m.SSH_HOST_KEYS_SECRET, "key": "ssh_host_ed25519_key"}}}),
        "container slurmd sets env STOLEN other than the template of pool "),
    "envFrom-secretRef": (lambda p: _container0(p).update(envFrom=[{"secretRef": {"name": m.SSH_HOST_KEYS_SECRET}}]),
                          "container slurmd sets envFrom other than the template of pool "),
    "nodeName": (lambda p: p["spec"].update(nodeName="localk8s"), "the pod sets nodeName localk8s"),
    "tolerations": (lambda p: p["spec"].setdefault("tolerations", []).append({"operator": "Exists"}),
                    "the pod tolerates every taint other than the template of pool "),
    "priorityClassName": (lambda p: p["spec"].update(priorityClassName="system-node-critical"),
                          "the pod sets priorityClassName other than the template of pool "),
    "runtimeClassName": (lambda p: p["spec"].update(runtimeClassName=PROBE_RUNTIME_CLASS),
                         "the pod sets runtimeClassName other than the template of pool "),
    "hostname": (lambda p: p["spec"].update(hostname="slurmctld-0"),
                 f"the hostname and the label {m.L_NODE} of pod {PROBE_NODE} must be its name"),
}


@contextlib.contextmanager
def _probe_runtime_class() -> Iterator[None]:
    """A RuntimeClass for the dry runs (cluster-scoped, deleted after): the RuntimeClass admission
    plugin refuses a pod naming an unknown one before any policy sees it."""
    obj = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "runc",
           "metadata": {"name": PROBE_RUNTIME_CLASS, "labels": {"app.kubernetes.io/managed-by": "slurmk8s-e2e"}}}
    kubectl("apply", "-f", "-", input=json.dumps(obj))
    try:
        yield
    finally:
        kubectl("delete", "runtimeclass", PROBE_RUNTIME_CLASS, "--ignore-not-found")


@pytest.mark.parametrize("field", sorted(OFF_TEMPLATE))
def test_the_controller_account_cannot_create_a_pod_off_its_template(cluster: Cluster, tmp_path: Path, field: str):
    """The whole pod must be its pool's template but for what a resume sets per node: a worker pod
    with one field more (a Secret in its environment, a node or taint of its choosing, a priority or
    runtime class, another hostname) is refused to slurmctld's token; the deployer's dry run of the
    same pod, and slurmctld's of the pod as the backend builds it, are admitted (controls)."""
    spec = _spec(cluster)
    token = _controller_kubeconfig(tmp_path)
    real = _dry_create(_probe_worker_pod(cluster), token)
    assert real.returncode == 0, f"control: the controller's own worker pod was refused: {real.stderr}"
    mutate, message = OFF_TEMPLATE[field]
    pod = _probe_worker_pod(cluster)
    mutate(pod)
    with _probe_runtime_class() if field == "runtimeClassName" else contextlib.nullcontext():
        admin = _dry_create(pod)
        refused = _dry_create(pod, token)
    assert admin.returncode == 0, f"control: the deployer's dry run was refused too: {admin.stderr}"
    assert refused.returncode != 0, f"slurmctld's token created a worker pod with {field} of its own"
    assert f"ValidatingAdmissionPolicy '{m.policy_name(spec)}'" in refused.stderr, refused.stderr
    assert "the controller may only create worker pods from the pool templates: " + message in refused.stderr, \
        refused.stderr


def test_rbac_other_service_accounts_of_the_namespace_get_nothing_dangerous(cluster: Cluster):
    accounts = [a["metadata"]["name"] for a in kjson("get", "serviceaccounts", "-n", NAMESPACE)["items"]]
    assert "default" in accounts
    bad = []
    for sa in accounts:
        checks = [("get", "secrets", NAMESPACE), ("list", "secrets", None), ("create", "pods", "default"),
                  ("patch", "nodes", None), ("create", "rolebindings", NAMESPACE), ("create", "pods/exec", NAMESPACE)]
        if sa != m.CONTROLLER:
            checks.append(("create", "pods", NAMESPACE))
        bad += [f"{sa}: {v} {r} " + (f"-n {ns}" if ns else "cluster-wide") for v, r, ns in checks if _can_i(sa, v, r, ns)]
    assert bad == [], bad


# ---------------------------------------------------------------- another namespace


@pytest.fixture
def intruder_ns() -> Iterator[str]:
    kubectl("delete", "namespace", INTRUDER_NS, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kubectl("create", "namespace", INTRUDER_NS)
    kubectl("label", "namespace", INTRUDER_NS, "pod-security.kubernetes.io/enforce=baseline")
    yield INTRUDER_NS
    kubectl("delete", "namespace", INTRUDER_NS, "--wait=false", check=False)


def _intruder_objects(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    spec = _spec(cluster)
    site = m.K8sSite()
    conf = kjson("get", "configmap", "-n", NAMESPACE, m.SLURM_CONFIG)["data"]
    real_key = kjson("get", "secret", "-n", NAMESPACE, m.AUTH_SECRET)["data"]["munge.key"]
    forged_key = base64.b64encode(os.urandom(1024)).decode()
    # the attacker's pods carry the cluster's labels: a NetworkPolicy must not trust labels across namespaces
    labels = {m.L_CLUSTER: spec.name, m.L_COMPONENT: "worker", m.L_SUBDOMAIN: m.WORKERS}
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": list(m.BASE_CAPS)},
                "seccompProfile": {"type": "RuntimeDefault"}}

    def secret(name: str, key_b64: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": INTRUDER_NS},
                "data": {"munge.key": key_b64}}

    def client(name: str, key: str) -> dict[str, Any]:
        return {"name": name, "image": spec.images.login, "imagePullPolicy": spec.images.pull_policy,
                "command": ["bash", "-c", ". /usr/local/lib/slurmk8s/lib.sh; start_munge; exec sleep 900"],
                "securityContext": security,
                "volumeMounts": [{"name": key, "mountPath": m.MUNGE_DIR, "readOnly": True},
                                 {"name": "conf", "mountPath": m.SLURM_CONF_DIR, "readOnly": True}]}

    common = {"automountServiceAccountToken": False, "enableServiceLinks": False, "restartPolicy": "Never",
              "dnsConfig": {"searches": m.dns_searches(spec, site)}}
    client_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": INTRUDER_NS, "labels": labels},
        "spec": {**common, "containers": [client("forged", "forged-key"), client("control", "cluster-key")],
                 "volumes": [{"name": "forged-key", "secret": {"secretName": "forged-key", "defaultMode": 0o400}},
                             {"name": "cluster-key", "secret": {"secretName": "cluster-key", "defaultMode": 0o400}},
                             {"name": "conf", "configMap": {"name": "slurm-conf"}}]},
    }
    # a clone of a worker pod for `node`, with a key of its own: tries to register that node
    fake_worker = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "fake-worker", "namespace": INTRUDER_NS, "labels": labels},
        "spec": {**common, "hostname": node, "containers": [{
            "name": "slurmd", "image": spec.images.worker, "imagePullPolicy": spec.images.pull_policy,
            "env": [{"name": "SLURMK8S_CONTROLLER", "value": m.controller_address(spec, site)},
                    {"name": "SLURMK8S_NODENAME", "value": node},
                    {"name": "SLURMK8S_CONTROLLER_WAIT", "value": "30"}],
            "securityContext": security,
            "volumeMounts": [{"name": "forged-key", "mountPath": m.MUNGE_DIR, "readOnly": True}]}],
            "volumes": [{"name": "forged-key", "secret": {"secretName": "forged-key", "defaultMode": 0o400}}]},
    }
    conf_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slurm-conf", "namespace": INTRUDER_NS},
                "data": {k: v for k, v in conf.items() if k.endswith(".conf")}}
    return [secret("forged-key", forged_key), secret("cluster-key", real_key), conf_map, client_pod, fake_worker]


def _client(container: str, script: str, check: bool = False):
    wait_munge = "for i in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.2; done; "
    return _exec("client", container, wait_munge + script, ns=INTRUDER_NS, check=check, timeout=90)


def test_pod_in_another_namespace_cannot_submit_or_register_a_node(cluster: Cluster, intruder_ns: str):
    spec = _spec(cluster)
    alice = cluster.login()
    nodes = alice.run("sinfo -h -N -o %N").stdout.split()
    free = [n for n in nodes if n not in worker_pods()]
    assert free, nodes
    node = free[0]
    before = alice.json(f"scontrol show node {node} --json")["nodes"][0]["state"]
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": _intruder_objects(cluster, node)}))
    kubectl("wait", "-n", intruder_ns, "--for=condition=Ready", "pod/client", "--timeout=120s", timeout=150)

    ctld = m.service_fqdn(spec, m.CONTROLLER, m.K8sSite())
    ctld_host = f"{m.CONTROLLER_POD}.{ctld}"
    login_svc = m.service_fqdn(spec, m.LOGIN, m.K8sSite())
    probe = "timeout 5 bash -c 'exec 3<>/dev/tcp/$0/$1' {} {} && echo open || echo closed"
    ctld_open = _client("forged", probe.format(ctld_host, m.SLURMCTLD_PORT)).stdout.strip().endswith("open")
    ssh_open = _client("forged", probe.format(login_svc, m.SSH_PORT)).stdout.strip().endswith("open")
    assert ssh_open, "SSH to the login Service must stay reachable from anywhere"
    enforced = not ctld_open
    print(f"NetworkPolicy enforced by this cluster's CNI: {enforced} "
          f"(slurmctld port from another namespace: {'open' if ctld_open else 'closed'})")

    # the attack: the cluster's own slurm.conf, a munge key of the attacker's
    forged = _client("forged", "sbatch --hold --parsable -J intruder-forged --wrap true; echo rc=$?")
    assert not re.search(r"^\d+", forged.stdout, re.M) and "rc=0" not in forged.stdout, forged.stdout + forged.stderr
    queue = _client("forged", "squeue -h -o %i; echo rc=$?")
    assert "rc=0" not in queue.stdout, f"squeue answered a forged key: {queue.stdout}"
    if not enforced:
        assert re.search(r"authentication", forged.stdout + forged.stderr, re.I), forged.stdout + forged.stderr
        # control: the same pod, config and command with the cluster's key is accepted
        ok = _client("control", "sbatch --hold --parsable -J intruder-control --wrap true")
        assert re.fullmatch(r"\d+", ok.stdout.strip()), f"control submission failed: {ok.stdout} {ok.stderr}"
        _client("control", f"scancel {ok.stdout.strip()}", check=True)
    assert alice.run("squeue -h --states=all -n intruder-forged -o %i").stdout.strip() == ""

    # the fake worker: its slurmd must be refused and the node must stay unregistered
    def refused() -> str | None:
        logs = kubectl("logs", "-n", intruder_ns, "fake-worker", check=False).stdout
        return logs if re.search(r"authentication|Invalid credential|not reachable", logs, re.I) else None

    logs = wait_for("the fake worker's slurmd to be refused", refused, 90, interval=2)
    print("forged sbatch:", " | ".join((forged.stderr + forged.stdout).strip().splitlines()))
    print("fake worker:", next(line for line in logs.splitlines()
                               if re.search(r"authentication|Invalid credential|not reachable", line, re.I)))
    if not enforced:
        assert re.search(r"authentication|Invalid credential", logs, re.I), logs[-3000:]
    time.sleep(2)
    after = alice.json(f"scontrol show node {node} --json")["nodes"][0]["state"]
    assert "POWERED_DOWN" in after, f"node {node} went from {before} to {after} after the fake worker"
    assert node not in worker_pods()


# ---------------------------------------------------------------- secrets never printed (runs last)


def _needles(cluster: Cluster) -> dict[str, bytes]:
    """name -> bytes that must appear nowhere. Named so a failure never prints the value itself."""
    out: dict[str, bytes] = {}
    for sec in kjson("get", "secrets", "-n", NAMESPACE)["items"]:
        name = sec["metadata"]["name"]
        if sec.get("type") == "kubernetes.io/service-account-token" or name in PUBLIC_SECRETS:
            continue
        for key, b64 in (sec.get("data") or {}).items():
            raw = base64.b64decode(b64)
            if len(raw) < 8:
                continue
            label = f"Secret {name}/{key}"
            out[f"{label} (base64)"] = b64.encode()
            if b"PRIVATE KEY-----" in raw:  # PEM: each body line on its own (a log may wrap or cut it)
                # lines that fall wholly inside the public half are public (the outputs show it)
                public = public_key(raw.decode()).encode()
                body = [l.strip() for l in raw.splitlines() if l.strip() and b"-----" not in l]
                out.update({f"{label} line {i}": l for i, l in enumerate(body) if len(l) >= 16 and l not in public})
            elif raw.isascii() and raw.strip().decode().isprintable():  # a password
                out[label] = raw.strip()
            else:  # binary (the munge key): raw, hex and base64 pieces
                out[f"{label} (raw)"] = raw[:32]
                out[f"{label} (hex)"] = raw[:32].hex().encode()
                # (a short key, the 64-byte JWT key, has only the first piece)
                out.update({f"{label} (base64 at {i})": b64.encode()[i:i + 40] for i in (0, 400, 1000)
                            if len(b64) >= i + 40})
    passphrase = cluster.state / "passphrase"
    if passphrase.exists():
        out["Pulumi secrets passphrase"] = passphrase.read_bytes().strip()
    # the REST API's tokens that e2e/test_e2e_rest.py was given (`slurmk8s token`): in no log either
    out.update({f"the JWT issued to {who} ({i})": tok.encode() for i, (who, tok) in enumerate(ISSUED_TOKENS)})
    body = cluster.key.export_private_key().splitlines()
    public = cluster.key.export_public_key()
    out.update({f"the e2e user's private key line {i}": l for i, l in enumerate(body)
                if len(l) >= 16 and b"-----" not in l and l not in public})
    return out


MARKER = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


def _collect(cluster: Cluster, log_archive: Path, where: Path) -> dict[str, bytes]:
    """Everything the run produced that a person could read: name -> content."""
    texts: dict[str, bytes] = {}
    texts["CLI log (slurmk8s up/down/...)"] = cluster.log.read_bytes()
    outputs = slurmk8s("outputs", "--state", str(cluster.state), "--spec", str(cluster.spec_path), "--json",
                       log=where / "outputs.log")
    texts["slurmk8s outputs --json"] = (where / "outputs.log").read_bytes()
    assert outputs.returncode == 0, texts["slurmk8s outputs --json"][-2000:]
    preview = slurmk8s("preview", "--diff", "--state", str(cluster.state), "--spec", str(cluster.spec_path),
                       log=where / "preview.log")
    texts["slurmk8s preview --diff"] = (where / "preview.log").read_bytes()
    assert preview.returncode == 0, texts["slurmk8s preview --diff"][-2000:]
    for path in sorted(cluster.state.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.name == "passphrase" or path.stat().st_size > 64 << 20:
            continue
        texts[f"state file {path.relative_to(cluster.state)}"] = path.read_bytes()
    for path in sorted(log_archive.glob("*.log")):
        texts[f"logs of gone pod {path.stem}"] = path.read_bytes()
    for pod in kjson("get", "pods", "-n", NAMESPACE)["items"]:
        name = pod["metadata"]["name"]
        statuses = {s["name"]: s for s in pod["status"].get("containerStatuses", [])}
        for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            texts[f"kubectl logs {name} -c {c['name']}"] = kubectl(
                "logs", "-n", NAMESPACE, name, "-c", c["name"], check=False).stdout.encode()
            if statuses.get(c["name"], {}).get("restartCount"):
                texts[f"kubectl logs --previous {name} -c {c['name']}"] = kubectl(
                    "logs", "--previous", "-n", NAMESPACE, name, "-c", c["name"], check=False).stdout.encode()
    texts["slurmk8s programs' logs in slurmctld-0"] = kubectl(
        "exec", "-n", NAMESPACE, m.CONTROLLER_POD, "-c", m.CONTROLLER, "--", "sh", "-c",
        f"cat {m.SLURMK8S_LOG_DIR}/*.log", check=False).stdout.encode()
    texts["events"] = kubectl("get", "events", "-n", NAMESPACE, "-o", "json").stdout.encode()
    for kind in ("configmaps", "pods", "statefulsets", "deployments", "services"):
        texts[f"kubectl get {kind} -o json"] = kubectl("get", kind, "-n", NAMESPACE, "-o", "json").stdout.encode()
    return texts


@pytest.mark.e2e_last
def test_no_secret_in_any_log_state_output_or_config_map(cluster: Cluster, log_archive: Path, tmp_path: Path):
    """The munge key and the JWT key (raw, hex, base64), the SSH host keys and any other Secret value,
    the REST tokens the session was given, the e2e user's private key and the Pulumi passphrase: in no CLI log or output, no Pulumi state file, no
    ConfigMap or pod spec, no container log. Runs after every other test of the session."""
    needles = _needles(cluster)
    assert any("slurm-auth/munge.key" in n for n in needles) and any("ssh_host_ed25519_key" in n for n in needles)
    assert any("slurm-jwt/jwt_hs256.key" in n for n in needles), "the JWT key (rest.enabled) is not scanned for"
    texts = _collect(cluster, log_archive, tmp_path)
    assert any(n.startswith("state file ") for n in texts), "no Pulumi state file found to scan"
    leaks = [f"{what} in {where}" for where, text in texts.items() for what, needle in needles.items()
             if needle in text]
    leaks += [f"a PEM private key block in {where}" for where, text in texts.items() if MARKER.search(text)]
    print(f"scanned {len(texts)} logs / files ({sum(len(t) for t in texts.values()) >> 10} KiB) "
          f"for {len(needles)} secret values")
    assert leaks == [], "secrets found:\n" + "\n".join(leaks)
