"""The login pod: its secrets (SSH host keys, authorized keys), SSH Service and Deployment, and the
wake agent beside sshd."""

from __future__ import annotations

from typing import Any, Mapping

from .. import settings
from ..config import ClusterSpec
from .common import (K8sSite, _config_volume, _container_security, _meta, _pod_security, _pvc_volume,
                     _secret_volume, content_hash, controller_address, dns_searches, login_sleeps, sleeps,
                     service_account_token_volume, tier_labels)
from ..names import (A_USERS_HASH, ACTIVITY_DIR, ACTIVITY_PORT, AGENT_UID, AUTH_SECRET, AUTHORIZED_KEYS_DIR,
                    AUTHORIZED_KEYS_SECRET, BIN_DIR, HOME_PVC, HOST_KEYS_DIR, L_SUBDOMAIN, LOGIN, LOGIN_AGENT,
                    LOGIN_CAPS, LOGIN_HOST, MUNGE_DIR, SA_TOKEN_DIR, SSH_HOST_KEY_TYPES, SSH_HOST_KEYS_SECRET,
                    SSH_PORT, USER_FILES, USERS_CONFIG, USERS_DIR, WAKE_DIR, WAKE_SOCKET, WORKERS, base_labels,
                    selector)


# ---------------------------------------------------------------- secrets


def ssh_host_keys_secret(spec: ClusterSpec, host_keys: Mapping[str, Any]) -> dict[str, Any]:
    """SSH host keys of the login pod: {'ed25519': private key (OpenSSH PEM), ...}; kept across restarts."""
    missing = [t for t in SSH_HOST_KEY_TYPES if t not in host_keys]
    if missing:
        raise ValueError(f"ssh host keys missing for {missing}")
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(spec, SSH_HOST_KEYS_SECRET, LOGIN),
        "stringData": {f"ssh_host_{t}_key": host_keys[t] for t in SSH_HOST_KEY_TYPES},
    }


def authorized_keys(spec: ClusterSpec) -> dict[str, str]:
    """user -> authorized_keys file content (public keys; users without keys are left out)."""
    return {u.name: "".join(f"{k}\n" for k in u.ssh_keys) for u in spec.users if u.ssh_keys}


def authorized_keys_secret(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(spec, AUTHORIZED_KEYS_SECRET, LOGIN),
        "stringData": authorized_keys(spec),
    }


# ---------------------------------------------------------------- Service and Deployment


def login_service(spec: ClusterSpec) -> dict[str, Any]:
    port: dict[str, Any] = {"name": "ssh", "port": SSH_PORT, "targetPort": SSH_PORT, "protocol": "TCP"}
    if spec.login.node_port is not None:
        port["nodePort"] = spec.login.node_port
    svc_spec: dict[str, Any] = {"type": spec.login.service_type, "selector": selector(spec, LOGIN), "ports": [port]}
    if spec.login.service_type != "ClusterIP":
        svc_spec["externalTrafficPolicy"] = "Local"  # keep the client's address in sshd's log
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec, LOGIN, LOGIN), "spec": svc_spec}


def login_deployment(spec: ClusterSpec, files: Mapping[str, str], site: K8sSite = K8sSite()) -> dict[str, Any]:
    """sshd + Slurm clients (configless through sackd). Hostname 'login-0' under the workers'
    subdomain, so jobs can reach back to it by name (salloc, interactive frameworks)."""
    labels = {**base_labels(spec, LOGIN), L_SUBDOMAIN: WORKERS}
    annotations = {
        A_USERS_HASH: content_hash({n: files[n] for n in USER_FILES}),
        "slurmk8s.io/authorized-keys-hash": content_hash(authorized_keys(spec)),
    }
    container = {
        "name": "login",
        "image": spec.images.login,
        "imagePullPolicy": spec.images.pull_policy,
        "env": [{"name": settings.CONTROLLER, "value": controller_address(spec, site)}],
        "ports": [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}],
        # not a TCP probe: sshd logs every probe connection. The entrypoint execs sshd last, after
        # munge, users and the Slurm client config are in place: sshd running means ready.
        "readinessProbe": {"exec": {"command": ["pgrep", "-x", "sshd"]}, "periodSeconds": 2, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "securityContext": _container_security(LOGIN_CAPS),
        "volumeMounts": [
            {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
            {"name": "authorized-keys", "mountPath": AUTHORIZED_KEYS_DIR, "readOnly": True},
            {"name": "ssh-host-keys", "mountPath": HOST_KEYS_DIR, "readOnly": True},
            {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
            {"name": "home", "mountPath": "/home"},
        ],
    }
    pod_spec: dict[str, Any] = {
        "hostname": LOGIN_HOST,
        "subdomain": WORKERS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsConfig": {"searches": dns_searches(spec, site)},
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": 10,
        "containers": [container],
        "volumes": [
            _config_volume("users", USERS_CONFIG),
            _secret_volume("authorized-keys", AUTHORIZED_KEYS_SECRET),  # root copies them for sshd
            _secret_volume("ssh-host-keys", SSH_HOST_KEYS_SECRET),
            _secret_volume("munge-key", AUTH_SECRET),
            _pvc_volume("home", HOME_PVC),
        ],
    }
    if sleeps(spec):
        _add_login_agent(spec, pod_spec, container)
    meta = _meta(spec, LOGIN, LOGIN)
    if login_sleeps(spec):
        meta["labels"] = tier_labels(spec, LOGIN)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector(spec, LOGIN)},
            "strategy": {"type": "Recreate"},  # one sshd with the cluster's host keys at a time
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
        },
    }


def _add_login_agent(spec: ClusterSpec, pod_spec: dict[str, Any], login: dict[str, Any]) -> None:
    """The wake agent beside sshd (``python -m provisioner.controltier``, slurmctld image).

    - A plain ``sbatch`` (any Slurm command, and each SSH login) in the login container asks it on
      a Unix socket (WAKE_SOCKET, on an emptyDir that the login container mounts read-only) to wake a
      sleeping control tier, and waits. The agent names the caller by its kernel uid (SO_PEERCRED),
      mapped to a name through the cluster's passwd (the users ConfigMap, mounted read-only here too).
    - It serves the login container's SSH session count (written to a shared emptyDir every few
      seconds) on ACTIVITY_PORT for the reconcile loop's idle check.
    - Only this container gets the pod's ServiceAccount token (a projected volume; the pod does not
      automount one), and that account may only scale the tier's named workloads.
    """
    login["volumeMounts"] += [{"name": "activity", "mountPath": ACTIVITY_DIR},
                              {"name": "wake", "mountPath": WAKE_DIR, "readOnly": True}]
    agent = {
        "name": LOGIN_AGENT,
        "image": spec.images.controller,
        "imagePullPolicy": spec.images.pull_policy,
        # tini: python as PID 1 would ignore SIGTERM (the pod would take its whole grace period)
        "command": ["/usr/bin/tini", "--", f"{BIN_DIR}/python", "-m", "provisioner.controltier", "--namespace", spec.namespace_name,
                    "--wake-socket", WAKE_SOCKET, "--activity-port", str(ACTIVITY_PORT),
                    "--activity-file", f"{ACTIVITY_DIR}/sessions", "--users-file", f"{USERS_DIR}/passwd"],
        "ports": [{"name": "activity", "containerPort": ACTIVITY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": ACTIVITY_PORT}, "periodSeconds": 1},  # a wake waits for it
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
        "securityContext": {**_container_security(()), "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID,
                            "runAsNonRoot": True, "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "activity", "mountPath": ACTIVITY_DIR, "readOnly": True},
            {"name": "wake", "mountPath": WAKE_DIR},
            {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
            {"name": "agent-token", "mountPath": SA_TOKEN_DIR, "readOnly": True},
        ],
    }
    pod_spec["serviceAccountName"] = LOGIN_AGENT
    pod_spec["containers"].append(agent)
    pod_spec["volumes"] += [
        {"name": "activity", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "wake", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        service_account_token_volume("agent-token"),
    ]
