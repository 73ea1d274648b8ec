"""Labels, annotations, object names, ports, paths and other constants shared by the manifest
builders (provisioner.manifests) and the code that runs against their objects: the control tier's
wake and sleep (the CLI, the login agent, the reconcile loop), the live node sources, the deploy.

Light on purpose: it imports nothing of the builders (no jinja2, no spec model), so a command line or
a starting pod that needs a name does not pay their import (about 0.15 s on a 2-core machine, which
`slurmk8s submit` paid before its wake's first call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .accounts import AGENT_UID, REST_UID, SLURM_UID  # noqa: F401 (re-exported for the manifests)

if TYPE_CHECKING:
    from .config import ClusterSpec


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
# on a worker pod a resume kept (adopted) for its attempt: when, and a token (every adoption is a
# write, which changes the pod's resourceVersion: elastic.k8s_backend.KubernetesBackend.adopt)
A_ADOPTED = "slurmk8s.io/adopted"
A_K8S_NODE = "slurmk8s.io/k8s-node"
# a worker pod of a pool with node_start_timeout: seconds it may stay Unschedulable (reconcile/classify.py)
A_NODE_START = "slurmk8s.io/node-start-timeout"
# on a worker pod while a job runs on it (the reconcile loop writes and removes them): Karpenter
# and cluster-autoscaler do not consolidate its node away; an idle worker carries neither
A_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
A_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
BUSY_ANNOTATIONS = {A_DO_NOT_DISRUPT: "true", A_SAFE_TO_EVICT: "false"}
# and this label, which the workers' PodDisruptionBudget selects: a busy worker is never evicted
# (a drain waits for its job), an idle one may be at any time
L_BUSY = "slurmk8s.io/busy"
A_CONFIG_HASH = "slurmk8s.io/config-hash"
A_USERS_HASH = "slurmk8s.io/users-hash"
# The entrypoint contract's version (images/entrypoint/identify.sh INTERFACE, the Dockerfile's
# org.slurmk8s.interface label); recorded on each pool's worker template, so that `up` checks again
# the images of templates written by a slurmk8s of another interface (provisioner.deploy.imagecheck)
IMAGE_INTERFACE = 4
A_IMAGE_INTERFACE = "slurmk8s.io/image-interface"
A_MULTUS = "k8s.v1.cni.cncf.io/networks"

CONTROLLER = "slurmctld"  # StatefulSet, its headless Service, ServiceAccount
CONTROLLER_POD = "slurmctld-0"  # = SlurmctldHost
CONTROLLER_STATE_PVC = "slurmctld-state"
LOGIN = "login"  # Deployment and the SSH Service
# The login pod's hostname, under the workers' subdomain. Not "login": inside the namespace a bare
# "login" resolves to the SSH Service (port 22 only) first, while jobs that call back to the login
# pod (salloc, interactive frameworks) use its hostname and arbitrary ports.
LOGIN_HOST = "login-0"
WORKER = "worker"  # the component label of worker pods
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
# ConfigMap whose annotations hold the control tier's state (awake / asleep, why, since), written by
# the reconcile loop (patch by name): not the slurmctld StatefulSet, whose patch would rewrite its pod
TIER_STATE = "slurmk8s-tier-state"
LOGIN_AGENT = "login-agent"  # ServiceAccount, Role and container of the login pod's wake agent
# accounting (spec.accounting): slurmdbd and the internal database
SLURMDBD = "slurmdbd"  # Deployment, Service, pod hostname (= DbdHost), AccountingStorageHost
MARIADB = "mariadb"  # StatefulSet and Service of the internal database
DATABASE_PVC = "accounting-db"
DB_SECRET = "accounting-db"  # generated password of the internal database (key "password")
DB_SECRET_KEY = "password"
SLURMDBD_CONF_SECRET = "slurmdbd-conf"  # slurmdbd.conf without StoragePass; only the slurmdbd pod mounts it
# the REST API (spec.rest): slurmrestd and the JWT key slurmctld and slurmdbd sign and check tokens with
REST = "slurmrestd"  # Deployment, Service, component
REST_CONFIG = "slurmrestd-config"  # slurmrestd's client slurm.conf (no secret in it)
JWT_SECRET = "slurm-jwt"  # key "jwt_hs256.key": the raw HS256 key; mounted by slurmctld, slurmdbd and the REST front
JWT_KEY_FILE = "jwt_hs256.key"
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
MYSQL_PORT = 3306
SSH_PORT = 22
REST_PORT = 6820
REST_LOCAL_PORT = 6821  # slurmrestd's own port behind the waking front (with idle_teardown)
REST_FRONT = "rest-front"  # ServiceAccount, Role and container of slurmrestd's waking front

# Where the images expect things (images/README.md, "contract").
MUNGE_DIR = "/etc/slurmk8s/secret"
USERS_DIR = "/etc/slurmk8s/users"
AUTHORIZED_KEYS_DIR = "/etc/slurmk8s/authorized_keys"
HOST_KEYS_DIR = "/etc/slurmk8s/ssh-host-keys"
DB_PASSWORD_DIR = "/etc/slurmk8s/db"  # the entrypoints read <dir>/password
SLURMDBD_CONF_DIR = "/etc/slurmk8s/slurmdbd"
SPEC_DIR = "/etc/slurmk8s/spec"
JWT_DIR = "/etc/slurmk8s/jwt"  # the mounted Secret; the entrypoints install the key at JWT_KEY_PATH
# spec.rest: where slurmctld and slurmdbd read the JWT key (AuthAltParameters=jwt_key= of slurm.conf and
# slurmdbd.conf; their entrypoints install it there from the mounted Secret, SlurmUser-owned, mode
# 0400); clients (login, workers, slurmrestd) need no key
JWT_KEY_PATH = "/run/slurmk8s-jwt/jwt_hs256.key"
ELASTIC_ENV_KEY = "elastic.env"  # of the spec ConfigMap; also POD_FILES_DIR/elastic.env (provisioner.elastic)
# slurmctld's pod: an in-memory emptyDir that its entrypoint fills from the API with the spec, users
# and keys (spec/, users/, secret/, jwt/, elastic.env: provisioner.podfiles), no Secret or ConfigMap volumes
POD_FILES_DIR = "/etc/slurmk8s"
SLURM_CONF_DIR = "/etc/slurm"
STATE_DIR = "/var/spool/slurmctld"
SSH_HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")

# Files of render_all() that go to the slurmctld config directory (the rest are users' files).
SLURM_FILES = ("slurm.conf", "topology.conf", "gres.conf", "gres-slurmctld.conf", "oci.conf", "inventory.json")
GZIPPED_FILES = ("inventory.json",)  # in the ConfigMap as <name>.gz: it grows with the node count
USER_FILES = ("passwd", "group")

# Capabilities the entrypoints need as root: chown/chmod of state and home dirs, munged and
# slurmstepd dropping to users (setuid/setgid), signalling users' processes (kill). sshd also
# chroots its pre-auth child and binds port 22. Everything else (NET_RAW, MKNOD, ...) is dropped.
BASE_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
LOGIN_CAPS = BASE_CAPS + ("SYS_CHROOT", "NET_BIND_SERVICE", "AUDIT_WRITE")

WORKER_GRACE_SECONDS = 15
WORKER_STOP = "/usr/local/lib/slurmk8s/worker-stop"  # the worker's preStop hook (images/slurmd/worker-stop)
MYSQL_UID = 64031  # the mysql user of the mariadb image (images/Dockerfile)
MUNGE_SOCKET_DIR = "/run/munge"
SLURMK8S_LOG_DIR = "/var/log/slurmk8s"
PROGRAM_SOCKET_DIR = "/run/slurmk8s/programs"  # elastic/warm.py: the loop serves the power-saving programs here
BIN_DIR = "/opt/slurmk8s/bin"
CONFIG_INIT = "/usr/local/bin/slurmk8s-config-init"  # fills SLURM_CONF_DIR in the slurmctld container (images/entrypoint)
CONFIG_READY = ".ready"  # written last by CONFIG_INIT in SLURM_CONF_DIR; the pod's other containers wait for it
RECONCILE_PERIOD = 10
# The reconcile container's memory limit (its request stays 128Mi): the loop runs for weeks, so a
# leak ends in an OOM kill of this container alone (restarted in its pod; slurmctld untouched)
# instead of eating its Kubernetes node. Measured: 53-55 MiB RSS on the local cluster (idle and
# after resumes), flat over 10,000 passes (bench/reconcile_rss.py); the largest use is a loop
# start at 4,096 worker pods (the pod watch's first list: 205 MiB of Python memory traced for one
# such list, docs/benchmarks.md) with a resume of thousands of nodes run warm in its threads
# (elastic/warm.py). 1Gi leaves about 5x that. Not a spec field: the spec has no place for the
# controller's resources, and the loop itself does not read it.
RECONCILE_MEMORY_LIMIT = "1Gi"
METRICS_PORT = 9410
ACTIVITY_PORT = 9411  # the login agent's /activity (SSH sessions), read by the reconcile loop
BOOT_GATE_PORT = 9412  # the reconcile loop's boot gate (elastic/bootgate.py), asked by starting workers
WAKE_DIR = "/run/slurmk8s/wake"  # an emptyDir of the login pod: the agent's socket (read-only in login)
WAKE_SOCKET = f"{WAKE_DIR}/wake.sock"  # the login agent's wake requests (Unix socket; peers named by uid)
ACTIVITY_DIR = "/run/slurmk8s/activity"  # the login container writes its session count here
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # a pod's ServiceAccount files; the one definition
SA_TOKEN_DIR = SA_DIR  # where a container finds a ServiceAccount token mounted
CONTROLLER_GRACE_SECONDS = 60  # slurmctld saves state; a sleeping loop then stops slurmdbd and the database


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
