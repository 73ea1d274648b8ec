"""Kubernetes objects of one slurmk8s cluster, as plain dicts (pure builders, no I/O).

Every builder takes the validated :class:`~provisioner.config.ClusterSpec` (plus, where needed, the
generated files or the Slurm node) and returns the object exactly as it would be sent to the API
server. The Pulumi program (``provisioner.deploy``) turns them into resources one to one; the
Kubernetes node backend (``provisioner.kube``) sends :func:`worker_pod` to the API server when Slurm
resumes a node. Nothing here reads the clock, the environment or the network.

Values that are secret (the Slurm auth key, SSH host keys) are passed in by the caller; they may
be plain strings (tests) or Pulumi outputs (the program): the builders only place them.

Field ownership (Server-Side Apply): the builders leave out every field that something in the
cluster owns at run time, so that a later ``slurmk8s up`` never fights it:

- ``replicas`` of the slurmctld StatefulSet and the login Deployment (the API server defaults it
  to 1 on creation; the idle teardown of the control tier scales it to 0 and back);
- ``clusterIP`` and unfixed ``nodePort`` of Services, ``volumeName`` of PVCs (allocated);
- worker pods are not part of the deployed set at all: the resume / suspend programs own them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .config import ClusterSpec, Pool, mib
from .errors import Issue, Problem
from .inventory import Inventory, SlurmNode

# ---------------------------------------------------------------- names and labels

L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_PART_OF = "app.kubernetes.io/part-of"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
L_CLUSTER = "slurmk8s.io/cluster"
L_POOL = "slurmk8s.io/pool"
L_NODE = "slurmk8s.io/node"
L_SUBDOMAIN = "slurmk8s.io/subdomain"
L_TIER = "slurmk8s.io/tier"  # "control" on the workloads the idle teardown scales (provisioner.controltier)
TIER_CONTROL = "control"
A_SPEC_HASH = "slurmk8s.io/spec-hash"
A_K8S_NODE = "slurmk8s.io/k8s-node"
A_CONFIG_HASH = "slurmk8s.io/config-hash"
A_USERS_HASH = "slurmk8s.io/users-hash"
A_MULTUS = "k8s.v1.cni.cncf.io/networks"

CONTROLLER = "slurmctld"  # StatefulSet, its headless Service, ServiceAccount
CONTROLLER_POD = "slurmctld-0"  # = SlurmctldHost
CONTROLLER_STATE_PVC = "slurmctld-state"
LOGIN = "login"  # Deployment and the SSH Service
# The login pod's hostname, under the workers' subdomain. Not "login": inside the namespace a bare
# "login" resolves to the SSH Service (port 22 only) first, while jobs that call back to the login
# pod (salloc, interactive frameworks) use its hostname and arbitrary ports.
LOGIN_HOST = "login-0"
WORKERS = "workers"  # headless Service: the subdomain of worker pods (and of the login pod)
HOME_PVC = "home"
AUTH_SECRET = "slurm-auth"
SSH_HOST_KEYS_SECRET = "ssh-host-keys"
AUTHORIZED_KEYS_SECRET = "authorized-keys"
SLURM_CONFIG = "slurm-config"
USERS_CONFIG = "slurm-users"
SPEC_CONFIG = "slurmk8s-spec"
WORKER_ROLE = "slurmk8s-worker-pods"
TEMPLATE_PREFIX = "worker-template-"
TIER_ROLE = "slurmk8s-control-tier"  # the reconcile loop: sleep / record / wake the control tier
LOGIN_AGENT = "login-agent"  # ServiceAccount, Role and container of the login pod's wake agent
# accounting (spec.accounting): slurmdbd and the internal database
SLURMDBD = "slurmdbd"  # Deployment, Service, pod hostname (= DbdHost), AccountingStorageHost
MARIADB = "mariadb"  # StatefulSet and Service of the internal database
DATABASE_PVC = "accounting-db"
DB_SECRET = "accounting-db"  # generated password of the internal database (key "password")
DB_SECRET_KEY = "password"
SLURMDBD_CONF_SECRET = "slurmdbd-conf"  # slurmdbd.conf without StoragePass; only the slurmdbd pod mounts it
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
MYSQL_PORT = 3306
SSH_PORT = 22

# Where the images expect things (images/README.md, "contract").
MUNGE_DIR = "/etc/slurmk8s/secret"
USERS_DIR = "/etc/slurmk8s/users"
AUTHORIZED_KEYS_DIR = "/etc/slurmk8s/authorized_keys"
HOST_KEYS_DIR = "/etc/slurmk8s/ssh-host-keys"
DB_PASSWORD_DIR = "/etc/slurmk8s/db"  # the entrypoints read <dir>/password
SLURMDBD_CONF_DIR = "/etc/slurmk8s/slurmdbd"
SPEC_DIR = "/etc/slurmk8s/spec"
ELASTIC_ENV = "/etc/slurmk8s/elastic.env"  # read by the resume/suspend programs (provisioner.elastic)
ELASTIC_ENV_KEY = "elastic.env"
SLURM_CONF_DIR = "/etc/slurm"
STATE_DIR = "/var/spool/slurmctld"
SSH_HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")

# Files of render_all() that go to the slurmctld config directory (the rest are users' files).
SLURM_FILES = ("slurm.conf", "topology.conf", "gres.conf", "inventory.json")
USER_FILES = ("passwd", "group")

# Capabilities the entrypoints need as root: chown/chmod of state and home dirs, munged and
# slurmstepd dropping to users (setuid/setgid), signalling users' processes (kill). sshd also
# chroots its pre-auth child and binds port 22. Everything else (NET_RAW, MKNOD, ...) is dropped.
BASE_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
LOGIN_CAPS = BASE_CAPS + ("SYS_CHROOT", "NET_BIND_SERVICE", "AUDIT_WRITE")

WORKER_GRACE_SECONDS = 15
SLURM_UID = 64030  # SlurmUser in every image (images/Dockerfile)
MYSQL_UID = 64031  # the mysql user of the mariadb image (images/Dockerfile)
MUNGE_SOCKET_DIR = "/run/munge"
SLURMK8S_LOG_DIR = "/var/log/slurmk8s"
BIN_DIR = "/opt/slurmk8s/bin"
RECONCILE_PERIOD = 10
METRICS_PORT = 9410
ACTIVITY_PORT = 9411  # the login agent's /activity (SSH sessions), read by the reconcile loop
WAKE_PORT = 9412  # the login agent's wake requests, on the login pod's loopback only
ACTIVITY_DIR = "/run/slurmk8s/activity"  # the login container writes its session count here
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
AGENT_UID = 65532  # the login agent runs as this unprivileged user (no user of the cluster has it)
CONTROLLER_GRACE_SECONDS = 60  # slurmctld saves state; a sleeping loop then stops slurmdbd and the database


@dataclass(frozen=True)
class K8sSite:
    """Facts about the Kubernetes cluster that the spec does not hold."""

    cluster_domain: str = "cluster.local"
    # Node addresses from which host-network workers reach slurmctld and login (NetworkPolicy).
    host_network_sources: tuple[str, ...] = ()


def base_labels(spec: ClusterSpec, component: str) -> dict[str, str]:
    return {
        L_NAME: "slurmk8s",
        L_INSTANCE: spec.name,
        L_PART_OF: "slurmk8s",
        L_COMPONENT: component,
        L_CLUSTER: spec.name,
    }


def selector(spec: ClusterSpec, component: str) -> dict[str, str]:
    """The minimal, never-changing labels that select a component's pods."""
    return {L_CLUSTER: spec.name, L_COMPONENT: component}


def _meta(spec: ClusterSpec, name: str, component: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": spec.namespace_name, "labels": base_labels(spec, component)}
    meta.update(extra)
    return meta


def service_fqdn(spec: ClusterSpec, service: str, site: K8sSite) -> str:
    return f"{service}.{spec.namespace_name}.svc.{site.cluster_domain}"


def controller_address(spec: ClusterSpec, site: K8sSite) -> str:
    """host:port of slurmctld as worker and login pods are told (SLURMK8S_CONTROLLER)."""
    return f"{CONTROLLER_POD}.{service_fqdn(spec, CONTROLLER, site)}:{SLURMCTLD_PORT}"


def dns_searches(spec: ClusterSpec, site: K8sSite) -> list[str]:
    """Search domains under which bare Slurm node names and `slurmctld-0` resolve from any pod."""
    return [service_fqdn(spec, WORKERS, site), service_fqdn(spec, CONTROLLER, site)]


def content_hash(value: Any) -> str:
    """A short stable hash of JSON-able data (for rollout annotations)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _container_security(caps: Iterable[str]) -> dict[str, Any]:
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": list(caps)},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security() -> dict[str, Any]:
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def _secret_volume(name: str, secret: str, mode: int = 0o400, items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    src: dict[str, Any] = {"secretName": secret, "defaultMode": mode}
    if items:
        src["items"] = items
    return {"name": name, "secret": src}


def _config_volume(name: str, config_map: str, mode: int = 0o444) -> dict[str, Any]:
    return {"name": name, "configMap": {"name": config_map, "defaultMode": mode}}


def _pvc_volume(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


# ---------------------------------------------------------------- namespace, secrets, config


def uses_host_network(spec: ClusterSpec) -> bool:
    return any(p.network.host_network for p in spec.pools)


def namespace(spec: ClusterSpec) -> dict[str, Any]:
    """The cluster's namespace. Pod Security 'baseline' is enforced unless a pool needs hostNetwork
    (baseline forbids it); every container here also meets it (no privilege, default capabilities only)."""
    labels = {L_NAME: "slurmk8s", L_INSTANCE: spec.name, L_PART_OF: "slurmk8s", L_CLUSTER: spec.name}
    level = "privileged" if uses_host_network(spec) else "baseline"
    labels["pod-security.kubernetes.io/enforce"] = level
    labels["pod-security.kubernetes.io/warn"] = "baseline"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace_name, "labels": labels}}


def auth_secret(spec: ClusterSpec, munge_key_b64: Any) -> dict[str, Any]:
    """The per-cluster Slurm auth (munge) key, base64 of its raw bytes."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(spec, AUTH_SECRET, "auth"),
        "data": {"munge.key": munge_key_b64},
    }


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


def slurm_config_map(spec: ClusterSpec, files: Mapping[str, str]) -> dict[str, Any]:
    """slurm.conf, topology.conf, gres.conf and inventory.json, mounted at /etc/slurm on slurmctld."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(spec, SLURM_CONFIG, CONTROLLER),
        "data": {name: files[name] for name in SLURM_FILES if name in files},
    }


def users_config_map(spec: ClusterSpec, files: Mapping[str, str]) -> dict[str, Any]:
    """passwd and group fragments (identical UIDs on every pod)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(spec, USERS_CONFIG, "users"),
        "data": {name: files[name] for name in USER_FILES},
    }


def spec_document(spec: ClusterSpec, site: K8sSite) -> dict[str, Any]:
    """What the in-cluster programs need to rebuild any worker pod: the spec and the site."""
    return {
        "spec": spec.model_dump(mode="json"),
        "site": {"cluster_domain": site.cluster_domain,
                 "host_network_sources": list(site.host_network_sources)},
    }


def elastic_env(spec: ClusterSpec) -> dict[str, str]:
    """Settings of the resume / suspend programs. Slurm starts them with a minimal environment (not
    the container's), so they read these from /etc/slurmk8s/elastic.env as well."""
    return {
        "SLURMK8S_BACKEND": "kubernetes",
        "SLURMK8S_INVENTORY": f"{SLURM_CONF_DIR}/inventory.json",
        "SLURMK8S_SPEC": f"{SPEC_DIR}/spec.json",
        "SLURMK8S_SITE": f"{SPEC_DIR}/site.json",
        "SLURMK8S_NAMESPACE": spec.namespace_name,
    }


def spec_config_map(spec: ClusterSpec, site: K8sSite) -> dict[str, Any]:
    doc = spec_document(spec, site)
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(spec, SPEC_CONFIG, CONTROLLER),
        "data": {
            "spec.json": json.dumps(doc["spec"], indent=1, sort_keys=True) + "\n",
            "site.json": json.dumps(doc["site"], indent=1, sort_keys=True) + "\n",
            ELASTIC_ENV_KEY: "".join(f"{k}={v}\n" for k, v in elastic_env(spec).items()),
        },
    }


# ---------------------------------------------------------------- RBAC for the resume/suspend programs


def controller_service_account(spec: ClusterSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, CONTROLLER, CONTROLLER)}


def worker_role(spec: ClusterSpec) -> dict[str, Any]:
    """Pods only, in this namespace only: what ResumeProgram / SuspendProgram need."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": _meta(spec, WORKER_ROLE, CONTROLLER),
        "rules": [{"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["create", "get", "list", "watch", "delete"]}],
    }


def worker_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _meta(spec, WORKER_ROLE, CONTROLLER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WORKER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": spec.namespace_name}],
    }


# ---------------------------------------------------------------- RBAC and labels for the idle teardown


def sleeps(spec: ClusterSpec) -> bool:
    """The control tier may sleep (``elasticity.idle_teardown`` is set)."""
    return spec.elasticity.idle_teardown is not None


def login_sleeps(spec: ClusterSpec) -> bool:
    return spec.login.enabled and spec.login.sleeps_with_control_tier


def control_tier_workloads(spec: ClusterSpec) -> list[tuple[str, str]]:
    """(kind, name) of every workload labelled ``slurmk8s.io/tier=control``, in sleep order. The
    scale rights of the Roles below name exactly these."""
    out = [("StatefulSet", CONTROLLER)]
    if spec.accounting.enabled:
        out.append(("Deployment", SLURMDBD))
        if spec.accounting.external_database is None:
            out.append(("StatefulSet", MARIADB))
    if login_sleeps(spec):
        out.insert(0, ("Deployment", LOGIN))
    return out


def tier_labels(spec: ClusterSpec, component: str) -> dict[str, str]:
    return {**base_labels(spec, component), L_TIER: TIER_CONTROL}


def _tier_rules(spec: ClusterSpec, controller: bool) -> list[dict[str, Any]]:
    """Read the tier's workloads, scale exactly those, emit Events; the reconcile loop also writes
    the state annotations of its own StatefulSet and reads the wake requests (Events)."""
    names = control_tier_workloads(spec)
    rules: list[dict[str, Any]] = [
        {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": ["get", "list"]}]
    for kind, resource in (("StatefulSet", "statefulsets/scale"), ("Deployment", "deployments/scale")):
        named = [n for k, n in names if k == kind]
        if named:
            rules.append({"apiGroups": ["apps"], "resources": [resource], "resourceNames": named,
                          "verbs": ["get", "patch", "update"]})
    rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"] if controller else ["create"]})
    if controller:
        rules.append({"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": [CONTROLLER],
                      "verbs": ["patch"]})
    return rules


def _role(spec: ClusterSpec, name: str, component: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(spec, name, component), "rules": rules}


def _binding(spec: ClusterSpec, name: str, component: str, account: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _meta(spec, name, component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": spec.namespace_name}],
    }


def control_tier_role(spec: ClusterSpec) -> dict[str, Any]:
    """The reconcile loop's rights to sleep the tier and record its state (slurmctld's account)."""
    return _role(spec, TIER_ROLE, CONTROLLER, _tier_rules(spec, controller=True))


def control_tier_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return _binding(spec, TIER_ROLE, CONTROLLER, CONTROLLER)


def login_agent_service_account(spec: ClusterSpec) -> dict[str, Any]:
    """The login pod's account. Its token reaches only the wake agent's container (projected
    volume); the login container itself has none."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, LOGIN_AGENT, LOGIN),
            "automountServiceAccountToken": False}


def login_agent_role(spec: ClusterSpec) -> dict[str, Any]:
    """Wake only: read the tier's workloads, scale exactly those, leave a WakeRequested Event."""
    return _role(spec, LOGIN_AGENT, LOGIN, _tier_rules(spec, controller=False))


def login_agent_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return _binding(spec, LOGIN_AGENT, LOGIN, LOGIN_AGENT)


def control_tier_objects(spec: ClusterSpec) -> list[dict[str, Any]]:
    """The RBAC of the idle teardown (none without ``idle_teardown``)."""
    if not sleeps(spec):
        return []
    objs = [control_tier_role(spec), control_tier_role_binding(spec)]
    if spec.login.enabled:
        objs += [login_agent_service_account(spec), login_agent_role(spec), login_agent_role_binding(spec)]
    return objs


# ---------------------------------------------------------------- storage


def _pvc(spec: ClusterSpec, name: str, component: str, volume) -> dict[str, Any]:
    pvc_spec: dict[str, Any] = {
        "accessModes": [volume.access_mode],
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class:
        pvc_spec["storageClassName"] = volume.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(spec, name, component), "spec": pvc_spec}


def home_pvc(spec: ClusterSpec) -> dict[str, Any]:
    """Shared /home for login and workers (ReadWriteMany by default)."""
    return _pvc(spec, HOME_PVC, "storage", spec.storage.home)


def controller_state_pvc(spec: ClusterSpec) -> dict[str, Any]:
    return _pvc(spec, CONTROLLER_STATE_PVC, CONTROLLER, spec.storage.controller_state)


# ---------------------------------------------------------------- slurmctld


def controller_service(spec: ClusterSpec) -> dict[str, Any]:
    """Headless: gives the StatefulSet pod its DNS name slurmctld-0.slurmctld.<ns>.svc; published
    before readiness so slurmctld resolves its own SlurmctldHost at start."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, CONTROLLER, CONTROLLER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(spec, CONTROLLER),
            "ports": [{"name": "slurmctld", "port": SLURMCTLD_PORT, "targetPort": SLURMCTLD_PORT, "protocol": "TCP"}],
        },
    }


def controller_statefulset(spec: ClusterSpec, files: Mapping[str, str], site: K8sSite = K8sSite()) -> dict[str, Any]:
    """slurmctld: one pod (hostname slurmctld-0), state on a PVC, the resume/suspend programs inside.

    ``replicas`` is left out on purpose (see the module docstring). A change of the rendered
    configuration or the users rolls the pod (annotations), so a new inventory takes effect.
    """
    labels = {**base_labels(spec, CONTROLLER)}
    annotations = {
        A_CONFIG_HASH: content_hash({n: files.get(n) for n in SLURM_FILES}),
        A_USERS_HASH: content_hash({n: files[n] for n in USER_FILES}),
        A_SPEC_HASH: content_hash(spec_document(spec, site)),
    }
    container = {
        "name": "slurmctld",
        "image": spec.images.controller,
        "imagePullPolicy": spec.images.pull_policy,
        # for commands run in the container (kubectl exec); the programs Slurm starts read elastic.env
        "env": [{"name": k, "value": v} for k, v in elastic_env(spec).items()],
        "ports": [{"name": "slurmctld", "containerPort": SLURMCTLD_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": SLURMCTLD_PORT}, "periodSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {"tcpSocket": {"port": SLURMCTLD_PORT}, "initialDelaySeconds": 60,
                          "periodSeconds": 20, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
        "securityContext": _container_security(BASE_CAPS),
        "volumeMounts": [
            {"name": "slurm-config", "mountPath": SLURM_CONF_DIR, "readOnly": True},
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "spec", "mountPath": ELASTIC_ENV, "subPath": ELASTIC_ENV_KEY, "readOnly": True},
            {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
            {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "munge-socket", "mountPath": MUNGE_SOCKET_DIR},
            {"name": "slurmk8s-log", "mountPath": SLURMK8S_LOG_DIR},
        ],
    }
    # The reconcile loop (orphans, stuck and vanished workers, pool backoff) and the metrics
    # endpoint: a second container, so a crash restarts it alone. It talks to slurmctld like any
    # client, through the munge socket of the slurmctld container (a shared in-memory volume).
    reconcile = {
        "name": "reconcile",
        "image": spec.images.controller,
        "imagePullPolicy": spec.images.pull_policy,
        "command": [f"{BIN_DIR}/slurmk8s-reconcile", "--period", str(RECONCILE_PERIOD),
                    "--metrics-port", str(METRICS_PORT)],
        "env": [{"name": k, "value": v} for k, v in elastic_env(spec).items()],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/metrics", "port": METRICS_PORT}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "securityContext": {**_container_security(()), "runAsUser": SLURM_UID, "runAsGroup": SLURM_UID,
                            "runAsNonRoot": True},
        "volumeMounts": [
            {"name": "slurm-config", "mountPath": SLURM_CONF_DIR, "readOnly": True},
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "spec", "mountPath": ELASTIC_ENV, "subPath": ELASTIC_ENV_KEY, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "munge-socket", "mountPath": MUNGE_SOCKET_DIR},
            {"name": "slurmk8s-log", "mountPath": SLURMK8S_LOG_DIR},
        ],
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {**_meta(spec, CONTROLLER, CONTROLLER), "labels": tier_labels(spec, CONTROLLER)},
        "spec": {
            "serviceName": CONTROLLER,
            "selector": {"matchLabels": selector(spec, CONTROLLER)},
            "podManagementPolicy": "Parallel",
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "serviceAccountName": CONTROLLER,
                    "automountServiceAccountToken": True,  # the resume/suspend programs call the API
                    "enableServiceLinks": False,
                    "dnsConfig": {"searches": dns_searches(spec, site)},
                    "securityContext": _pod_security(),
                    # slurmctld saves its state on SIGTERM; when the idle teardown stops it, the
                    # reconcile container then scales slurmdbd and the database down in order
                    "terminationGracePeriodSeconds": CONTROLLER_GRACE_SECONDS,
                    "containers": [container, reconcile] + (
                        [accounting_container(spec)] if spec.accounting.enabled else []),
                    "volumes": [
                        _config_volume("slurm-config", SLURM_CONFIG),
                        _config_volume("spec", SPEC_CONFIG),
                        _config_volume("users", USERS_CONFIG),
                        _secret_volume("munge-key", AUTH_SECRET),
                        _pvc_volume("state", CONTROLLER_STATE_PVC),
                        {"name": "munge-socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                        {"name": "slurmk8s-log", "emptyDir": {"sizeLimit": "256Mi"}},
                    ],
                },
            },
        },
    }


# ---------------------------------------------------------------- login


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
        "env": [{"name": "SLURMK8S_CONTROLLER", "value": controller_address(spec, site)}],
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
      the pod's loopback (127.0.0.1:WAKE_PORT) to wake a sleeping control tier, and waits.
    - It serves the login container's SSH session count (written to a shared emptyDir every few
      seconds) on ACTIVITY_PORT for the reconcile loop's idle check.
    - Only this container gets the pod's ServiceAccount token (a projected volume; the pod does not
      automount one), and that account may only scale the tier's named workloads.
    """
    login["volumeMounts"].append({"name": "activity", "mountPath": ACTIVITY_DIR})
    agent = {
        "name": LOGIN_AGENT,
        "image": spec.images.controller,
        "imagePullPolicy": spec.images.pull_policy,
        # tini: python as PID 1 would ignore SIGTERM (the pod would take its whole grace period)
        "command": ["/usr/bin/tini", "--", f"{BIN_DIR}/python", "-m", "provisioner.controltier", "--namespace", spec.namespace_name,
                    "--wake-port", str(WAKE_PORT), "--activity-port", str(ACTIVITY_PORT),
                    "--activity-file", f"{ACTIVITY_DIR}/sessions"],
        "ports": [{"name": "activity", "containerPort": ACTIVITY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": ACTIVITY_PORT}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
        "securityContext": {**_container_security(()), "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID,
                            "runAsNonRoot": True, "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "activity", "mountPath": ACTIVITY_DIR, "readOnly": True},
            {"name": "agent-token", "mountPath": SA_TOKEN_DIR, "readOnly": True},
        ],
    }
    pod_spec["serviceAccountName"] = LOGIN_AGENT
    pod_spec["containers"].append(agent)
    pod_spec["volumes"] += [
        {"name": "activity", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "agent-token", "projected": {"defaultMode": 0o444, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ]}},
    ]


# ---------------------------------------------------------------- workers


def workers_service(spec: ClusterSpec) -> dict[str, Any]:
    """Headless, published before readiness: `<slurm node>.workers.<ns>.svc` resolves as soon as a
    worker pod has an IP (slurmd registers, and MPI peers look each other up, before it is Ready)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, WORKERS, "worker"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {L_CLUSTER: spec.name, L_SUBDOMAIN: WORKERS},
            "ports": [{"name": "slurmd", "port": SLURMD_PORT, "targetPort": SLURMD_PORT, "protocol": "TCP"}],
        },
    }


def workers_pdb(spec: ClusterSpec) -> dict[str, Any]:
    """No voluntary eviction of a worker pod: a worker exists only while Slurm keeps its node
    powered up (busy, or idle for less than SuspendTime), so a drain waits for Slurm to suspend it.
    Unhealthy (not Ready) workers may always be evicted."""
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": _meta(spec, WORKERS, "worker"),
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": selector(spec, "worker")},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _shm_size(pool: Pool, node: SlurmNode) -> str:
    if pool.shm_size is not None:
        return str(pool.shm_size)
    return f"{max(64, node.real_memory // 2)}Mi"


def worker_pod_template(spec: ClusterSpec, pool: Pool, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """Everything of a pool's worker pod that does not depend on the Slurm node.

    :func:`worker_pod` fills in the node's name, placement and size. Stored per pool in a ConfigMap
    so operators can see what a resume will create.
    """
    net = pool.network
    env = [{"name": "SLURMK8S_CONTROLLER", "value": controller_address(spec, site)},
           {"name": "SLURMK8S_POOL", "value": pool.name}]
    env += [{"name": k, "value": v} for k, v in sorted(net.nccl_env.items())]
    container = {
        "name": "slurmd",
        "image": pool.image or spec.images.worker,
        "imagePullPolicy": spec.images.pull_policy,
        "env": env,
        "ports": [{"name": "slurmd", "containerPort": SLURMD_PORT, "protocol": "TCP"}],
        # no probe: slurmd logs an error for every bare TCP connection, and nothing waits for a
        # worker pod's readiness (Slurm tracks the node's registration itself)
        "securityContext": _container_security(BASE_CAPS),
        "volumeMounts": [
            {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
            {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
            {"name": "home", "mountPath": "/home"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    pod_spec: dict[str, Any] = {
        "subdomain": WORKERS,
        # Always: a crashed slurmd comes back in the same pod within seconds; slurmd -b makes it
        # count as a fresh boot and ReturnToService=2 returns the node to service.
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": WORKER_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsPolicy": "ClusterFirstWithHostNet" if net.host_network else "ClusterFirst",
        "dnsConfig": {"searches": dns_searches(spec, site)},
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [
            _secret_volume("munge-key", AUTH_SECRET),
            _config_volume("users", USERS_CONFIG),
            _pvc_volume("home", HOME_PVC),
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if net.host_network:
        pod_spec["hostNetwork"] = True
    if home_on_one_node(spec) and spec.login.enabled:
        # single-node fallback: a ReadWriteOnce /home mounts on one node only, the login pod's
        pod_spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": selector(spec, LOGIN)}, "topologyKey": "kubernetes.io/hostname"}]}}
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(pool.node_selector.items()))
    if pool.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in pool.tolerations]
    metadata: dict[str, Any] = {
        "namespace": spec.namespace_name,
        "labels": {**base_labels(spec, "worker"), L_POOL: pool.name, L_SUBDOMAIN: WORKERS,
                   L_MANAGED_BY: "slurmk8s"},
    }
    if net.multus_networks:
        metadata["annotations"] = {A_MULTUS: ",".join(net.multus_networks)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def worker_resources(spec: ClusterSpec, node: SlurmNode) -> dict[str, Any]:
    """requests = limits (Guaranteed QoS): the CPUs and memory slurm.conf gives the node, its GPUs
    and the pool's extra devices (RDMA, EFA, ...). A pool may lower the CPU / memory requests on
    purpose (pod_cpu_request / pod_memory_request, overcommit for development); extended resources
    always request what they limit (Kubernetes requires it)."""
    pool = spec.pool(node.pool)
    limits: dict[str, Any] = {"cpu": str(node.cpus), "memory": f"{node.real_memory}Mi"}
    if node.gpus:
        limits[pool.gpu_resource] = str(node.gpus)
    for name, count in sorted(pool.extra_resources.items()):
        limits[name] = str(count)
    requests = dict(limits)
    if pool.pod_cpu_request is not None:
        requests["cpu"] = str(pool.pod_cpu_request)
    if pool.pod_memory_request is not None:
        requests["memory"] = str(pool.pod_memory_request)
    return {"requests": requests, "limits": limits}


def _placement(pool: Pool, node: SlurmNode) -> dict[str, Any] | None:
    if node.k8s_node is not None:
        # matchFields on the Node's name (not the hostname label, which may differ from it):
        # exactly the Kubernetes node the inventory derived this Slurm node from.
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.k8s_node]}]}
    elif pool.domain_label and node.domain is not None:
        term = {"matchExpressions": [{"key": pool.domain_label, "operator": "In", "values": [node.domain]}]}
    else:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def worker_pod(spec: ClusterSpec, node: SlurmNode, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """The pod that runs slurmd for exactly one Slurm node (pod name = hostname = node name)."""
    pool = spec.pool(node.pool)
    pod = worker_pod_template(spec, pool, site)
    meta = pod["metadata"]
    meta["name"] = node.name
    meta["labels"][L_NODE] = node.name
    annotations = meta.setdefault("annotations", {})
    if node.k8s_node:
        annotations[A_K8S_NODE] = node.k8s_node
    pspec = pod["spec"]
    pspec["hostname"] = node.name
    placement = _placement(pool, node)
    if placement:
        pspec["affinity"] = {**pspec.get("affinity", {}), **placement}
    container = pspec["containers"][0]
    container["env"].insert(1, {"name": "SLURMK8S_NODENAME", "value": node.name})
    container["resources"] = worker_resources(spec, node)
    for vol in pspec["volumes"]:
        if vol["name"] == "dshm":
            vol["emptyDir"]["sizeLimit"] = _shm_size(pool, node)
    # Last: a hash of everything above, so a resume can tell a pod built from an older spec.
    annotations[A_SPEC_HASH] = content_hash(pod)
    return pod


def worker_template_config_map(spec: ClusterSpec, pool: Pool, site: K8sSite = K8sSite()) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {**_meta(spec, TEMPLATE_PREFIX + pool.name, "worker"),
                     "labels": {**base_labels(spec, "worker"), L_POOL: pool.name}},
        "data": {"pod.json": json.dumps(worker_pod_template(spec, pool, site), indent=1, sort_keys=True) + "\n"},
    }


# ---------------------------------------------------------------- accounting: slurmdbd and its database


def db_password_ref(spec: ClusterSpec) -> tuple[str, str]:
    """(Secret, key) holding the database password: generated for the internal database, the
    operator's own for an external one."""
    ext = spec.accounting.external_database
    return (ext.password_secret.name, ext.password_secret.key) if ext else (DB_SECRET, DB_SECRET_KEY)


def db_endpoint(spec: ClusterSpec, site: K8sSite = K8sSite()) -> tuple[str, int, str, str]:
    """(host, port, user, database) that slurmdbd uses. Service names are fully qualified: a bare name
    that does not resolve yet (Service still being created) falls through to the node's own search
    domains, where it may reach something else entirely (seen on the local cluster)."""
    ext = spec.accounting.external_database
    if ext:
        return ext.host, ext.port, ext.user, ext.database
    return service_fqdn(spec, MARIADB, site), MYSQL_PORT, DB_USER, DB_NAME


def slurmdbd_host(spec: ClusterSpec, site: K8sSite = K8sSite()) -> str:
    """AccountingStorageHost in slurm.conf (fully qualified, see db_endpoint)."""
    return service_fqdn(spec, SLURMDBD, site)


def db_password_secret(spec: ClusterSpec, password: Any) -> dict[str, Any]:
    """The internal database's generated password (a Pulumi secret in the program; never in a ConfigMap)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(spec, DB_SECRET, MARIADB),
        "stringData": {DB_SECRET_KEY: password},
    }


def slurmdbd_conf(spec: ClusterSpec, site: K8sSite = K8sSite()) -> str:
    """slurmdbd.conf without StoragePass: the slurmdbd entrypoint appends it from the password Secret and
    installs the file as SlurmUser, mode 0600."""
    host, port, user, database = db_endpoint(spec, site)
    return (
        f"# slurmdbd.conf for cluster {spec.slurm_cluster_name} -- generated by slurmk8s; StoragePass is added "
        "in the pod\n"
        "AuthType=auth/munge\n"
        f"DbdHost={SLURMDBD}\n"
        f"DbdPort={SLURMDBD_PORT}\n"
        "SlurmUser=slurm\n"
        "PidFile=/run/slurmdbd/slurmdbd.pid\n"
        "StorageType=accounting_storage/mysql\n"
        f"StorageHost={host}\n"
        f"StoragePort={port}\n"
        f"StorageUser={user}\n"
        f"StorageLoc={database}\n"
    )


def slurmdbd_conf_secret(spec: ClusterSpec, site: K8sSite = K8sSite()) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(spec, SLURMDBD_CONF_SECRET, SLURMDBD),
        "stringData": {"slurmdbd.conf": slurmdbd_conf(spec, site)},
    }


def database_pvc(spec: ClusterSpec) -> dict[str, Any]:
    return _pvc(spec, DATABASE_PVC, MARIADB, spec.storage.database)


def _control_meta(spec: ClusterSpec, name: str, component: str) -> dict[str, Any]:
    meta = _meta(spec, name, component)
    meta["labels"][L_TIER] = TIER_CONTROL
    return meta


def mariadb_service(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, MARIADB, MARIADB),
        "spec": {"selector": selector(spec, MARIADB),
                 "ports": [{"name": "mysql", "port": MYSQL_PORT, "targetPort": MYSQL_PORT, "protocol": "TCP"}]},
    }


def mariadb_statefulset(spec: ClusterSpec) -> dict[str, Any]:
    """The internal accounting database: one MariaDB pod, data on the `accounting-db` claim (kept by
    `down`). The entrypoint ensures the database, the slurmdbd account and its password at every start."""
    buffer = mib(spec.accounting.database_buffer_pool)
    container = {
        "name": "mariadb",
        "image": spec.images.database,
        "imagePullPolicy": spec.images.pull_policy,
        "env": [{"name": "SLURMK8S_DB_NAME", "value": DB_NAME}, {"name": "SLURMK8S_DB_USER", "value": DB_USER},
                {"name": "SLURMK8S_DB_BUFFER_POOL", "value": f"{buffer}M"}],
        "ports": [{"name": "mysql", "containerPort": MYSQL_PORT, "protocol": "TCP"}],
        # over the socket as root (unix_socket auth): no password in the probe, no log line per probe
        "readinessProbe": {"exec": {"command": ["mariadb-admin", "--protocol=socket", "-u", "root", "ping"]},
                           "periodSeconds": 3, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": f"{buffer + 256}Mi"}},
        "securityContext": _container_security(BASE_CAPS),
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/mysql"},
            {"name": "password", "mountPath": DB_PASSWORD_DIR, "readOnly": True},
        ],
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _control_meta(spec, MARIADB, MARIADB),
        "spec": {
            "serviceName": MARIADB,
            "selector": {"matchLabels": selector(spec, MARIADB)},
            "template": {
                "metadata": {"labels": {**base_labels(spec, MARIADB), L_TIER: TIER_CONTROL}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    "terminationGracePeriodSeconds": 60,  # InnoDB flushes on SIGTERM
                    "containers": [container],
                    "volumes": [
                        _pvc_volume("data", DATABASE_PVC),
                        _secret_volume("password", DB_SECRET, items=[{"key": DB_SECRET_KEY, "path": "password"}]),
                    ],
                },
            },
        },
    }


def slurmdbd_service(spec: ClusterSpec) -> dict[str, Any]:
    """slurmctld and the clients on the login pod (sacct, sacctmgr, sshare) reach slurmdbd here."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, SLURMDBD, SLURMDBD),
        "spec": {"selector": selector(spec, SLURMDBD),
                 "ports": [{"name": "slurmdbd", "port": SLURMDBD_PORT, "targetPort": SLURMDBD_PORT,
                            "protocol": "TCP"}]},
    }


def slurmdbd_deployment(spec: ClusterSpec, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """slurmdbd: stateless (everything is in the database), hostname = DbdHost. slurmdbd.conf comes
    from its own Secret that no other pod mounts."""
    pw_secret, pw_key = db_password_ref(spec)
    container = {
        "name": "slurmdbd",
        "image": spec.images.slurmdbd,
        "imagePullPolicy": spec.images.pull_policy,
        "ports": [{"name": "slurmdbd", "containerPort": SLURMDBD_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": SLURMDBD_PORT}, "periodSeconds": 3, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "securityContext": _container_security(BASE_CAPS),
        "volumeMounts": [
            {"name": "munge-key", "mountPath": MUNGE_DIR, "readOnly": True},
            {"name": "slurmdbd-conf", "mountPath": SLURMDBD_CONF_DIR, "readOnly": True},
            {"name": "password", "mountPath": DB_PASSWORD_DIR, "readOnly": True},
        ],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _control_meta(spec, SLURMDBD, SLURMDBD),
        "spec": {
            "selector": {"matchLabels": selector(spec, SLURMDBD)},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": {**base_labels(spec, SLURMDBD), L_TIER: TIER_CONTROL},
                             "annotations": {A_CONFIG_HASH: content_hash(slurmdbd_conf(spec, site))}},
                "spec": {
                    "hostname": SLURMDBD,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [
                        _secret_volume("munge-key", AUTH_SECRET),
                        _secret_volume("slurmdbd-conf", SLURMDBD_CONF_SECRET),
                        _secret_volume("password", pw_secret, items=[{"key": pw_key, "path": "password"}]),
                    ],
                },
            },
        },
    }


def accounting_container(spec: ClusterSpec) -> dict[str, Any]:
    """The slurmctld pod's `accounting` container: keeps cluster, accounts and users in the database
    in step with the spec (provisioner.accounting), as SlurmUser through slurmctld's munge socket."""
    return {
        "name": "accounting",
        "image": spec.images.controller,
        "imagePullPolicy": spec.images.pull_policy,
        # under tini, not PID 1 (which the kernel shields from SIGTERM): a pod deletion stops it at
        # once instead of after the pod's whole termination grace period
        "command": ["/usr/bin/tini", "--", f"{BIN_DIR}/slurmk8s-accounting", "--spec", f"{SPEC_DIR}/spec.json",
                    "--period", "30"],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
        "securityContext": {**_container_security(()), "runAsUser": SLURM_UID, "runAsGroup": SLURM_UID,
                            "runAsNonRoot": True},
        "volumeMounts": [
            {"name": "slurm-config", "mountPath": SLURM_CONF_DIR, "readOnly": True},
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "munge-socket", "mountPath": MUNGE_SOCKET_DIR},
        ],
    }


def db_check_pod(spec: ClusterSpec, name: str) -> dict[str, Any]:
    """A short-lived pod that tests the external database's address and credentials (`slurmk8s up`
    runs it before applying anything): prints 'ok: ...' or 'error <kind>: ...'."""
    host, port, user, database = db_endpoint(spec)
    pw_secret, pw_key = db_password_ref(spec)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": spec.namespace_name,
                     "labels": {**base_labels(spec, "db-check"), L_MANAGED_BY: "slurmk8s"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {**_pod_security(), "runAsUser": SLURM_UID, "runAsGroup": SLURM_UID,
                                "runAsNonRoot": True, "fsGroup": SLURM_UID},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "check",
                "image": spec.images.slurmdbd,
                "imagePullPolicy": spec.images.pull_policy,
                "args": ["check-db"],
                "env": [{"name": "SLURMK8S_DB_HOST", "value": host}, {"name": "SLURMK8S_DB_PORT", "value": str(port)},
                        {"name": "SLURMK8S_DB_USER", "value": user}, {"name": "SLURMK8S_DB_NAME", "value": database}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "securityContext": _container_security(()),
                "volumeMounts": [{"name": "password", "mountPath": DB_PASSWORD_DIR, "readOnly": True}],
            }],
            "volumes": [_secret_volume("password", pw_secret, 0o440, items=[{"key": pw_key, "path": "password"}])],
        },
    }


# ---------------------------------------------------------------- network policy


def network_policies(spec: ClusterSpec, site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    """Any traffic among the cluster's own pods (MPI, NCCL, srun and jobs that call back to the
    login pod use arbitrary ports); from elsewhere only SSH to the login pod.

    Host-network workers send from their node's address, which no pod selector matches: their
    nodes' addresses (``site.host_network_sources``) are admitted to the cluster's pods too.
    """
    own = {"matchLabels": {L_CLUSTER: spec.name}}
    peers: list[dict[str, Any]] = [{"podSelector": own}]
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in site.host_network_sources]
    # the internal database is not among them: only slurmdbd reaches it (policy below)
    targets = {"matchLabels": {L_CLUSTER: spec.name},
               "matchExpressions": [{"key": L_COMPONENT, "operator": "NotIn", "values": [MARIADB]}]}
    intra = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(spec, "intra-cluster", "network"),
        "spec": {"podSelector": targets, "policyTypes": ["Ingress"], "ingress": [{"from": peers}]},
    }
    policies = [intra, _open_port(spec, "login-ssh", LOGIN, SSH_PORT),
                _open_port(spec, "controller-metrics", CONTROLLER, METRICS_PORT)]
    if spec.accounting.enabled and spec.accounting.external_database is None:
        policies.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(spec, "database-from-slurmdbd", "network"),
            "spec": {
                "podSelector": {"matchLabels": selector(spec, MARIADB)},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": selector(spec, SLURMDBD)}}],
                             "ports": [{"protocol": "TCP", "port": MYSQL_PORT}]}],
            },
        })
    return policies


def _open_port(spec: ClusterSpec, name: str, component: str, port: int) -> dict[str, Any]:
    """Admit one TCP port of one component's pods from anywhere (SSH to login, metrics)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(spec, name, "network"),
        "spec": {
            "podSelector": {"matchLabels": selector(spec, component)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": port}]}],
        },
    }


# ---------------------------------------------------------------- checks and the whole set


def home_on_one_node(spec: ClusterSpec) -> bool:
    """/home is not ReadWriteMany: login and every worker must share the node the volume is attached to."""
    return spec.storage.home.access_mode != "ReadWriteMany"


def check_home_access(spec: ClusterSpec, inventory: Inventory) -> None:
    """A ReadWriteOnce /home cannot serve workers pinned to more than one Kubernetes node."""
    if not home_on_one_node(spec):
        return
    pinned = sorted({n.k8s_node for n in inventory.nodes if n.k8s_node})
    if len(pinned) > 1:
        raise Problem(Issue("storage.home.access_mode",
                            f"/home is {spec.storage.home.access_mode}, which mounts on one Kubernetes node only, but "
                            f"the pinned pools span {len(pinned)} nodes ({', '.join(pinned[:4])}"
                            f"{', ...' if len(pinned) > 4 else ''})",
                            "use a storage class that offers ReadWriteMany (NFS, CephFS, EFS, Filestore, ...), or "
                            "select a single node with the pools' node_selector"), title="invalid storage")


def check_names(spec: ClusterSpec, inventory: Inventory) -> None:
    """Slurm node names become pod names and hostnames next to the fixed ones used here."""
    reserved = {LOGIN, LOGIN_HOST, CONTROLLER_POD, CONTROLLER, WORKERS}
    issues = [
        Issue(f"pools[{next(i for i, p in enumerate(spec.pools) if p.name == n.pool)}].name_prefix",
              f"Slurm node name {n.name!r} clashes with the {n.name!r} pod/service of the cluster",
              "set a name_prefix for the pool")
        for n in inventory.nodes if n.name in reserved
    ]
    if issues:
        raise Problem(issues, title="invalid Slurm node names")


@dataclass(frozen=True)
class ClusterSecrets:
    """Generated once per cluster (see ``provisioner.deploy.secrets``); values may be Pulumi outputs."""

    munge_key_b64: Any
    ssh_host_keys: Mapping[str, Any]
    db_password: Any = None  # the internal accounting database's password


def kept_claims(spec: ClusterSpec) -> list[str]:
    """The PersistentVolumeClaims of the cluster (kept by `slurmk8s down`, deleted by `down --purge`)."""
    claims = [HOME_PVC, CONTROLLER_STATE_PVC]
    if spec.accounting.enabled and spec.accounting.external_database is None:
        claims.append(DATABASE_PVC)
    return claims


def accounting_objects(spec: ClusterSpec, secrets: ClusterSecrets, site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    """slurmdbd (and, unless an external database is named, MariaDB with its password and volume)."""
    if not spec.accounting.enabled:
        return []
    objs: list[dict[str, Any]] = []
    if spec.accounting.external_database is None:
        if secrets.db_password is None:
            raise ValueError("the internal accounting database needs ClusterSecrets.db_password")
        objs += [db_password_secret(spec, secrets.db_password), database_pvc(spec), mariadb_service(spec),
                 mariadb_statefulset(spec)]
    objs += [slurmdbd_conf_secret(spec, site), slurmdbd_service(spec), slurmdbd_deployment(spec, site)]
    return objs


def all_objects(spec: ClusterSpec, inventory: Inventory, files: Mapping[str, str], secrets: ClusterSecrets,
                site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    """Every object of the deployed set, in apply order (namespace first). Worker pods are not in it."""
    check_names(spec, inventory)
    check_home_access(spec, inventory)
    objs: list[dict[str, Any]] = [namespace(spec), home_pvc(spec)]
    objs += [
        auth_secret(spec, secrets.munge_key_b64), slurm_config_map(spec, files), users_config_map(spec, files),
        spec_config_map(spec, site), controller_service_account(spec), worker_role(spec),
        worker_role_binding(spec), *control_tier_objects(spec), controller_state_pvc(spec),
        controller_service(spec), controller_statefulset(spec, files, site),
    ]
    if spec.login.enabled:
        objs += [ssh_host_keys_secret(spec, secrets.ssh_host_keys), authorized_keys_secret(spec),
                 login_deployment(spec, files, site), login_service(spec)]
    objs += accounting_objects(spec, secrets, site)
    objs += [worker_template_config_map(spec, p, site) for p in spec.pools]
    objs += [workers_service(spec), workers_pdb(spec)]
    objs += network_policies(spec, site)
    return objs

