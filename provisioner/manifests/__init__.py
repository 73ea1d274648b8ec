"""Kubernetes objects of one slurmk8s cluster, as plain dicts (pure builders, no I/O).

Every builder takes the validated :class:`~provisioner.config.ClusterSpec` (plus, where needed, the
generated files or the Slurm node) and returns the object exactly as it would be sent to the API
server. The Pulumi program (``provisioner.deploy``) turns them into resources one to one; the
Kubernetes node backend (``provisioner.elastic.k8s_backend``) sends :func:`worker_pod` to the API server when Slurm
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

from .accounting import accounting_objects, db_check_pod, db_endpoint, slurmdbd_conf, slurmdbd_host
from .admission import (admission_objects, controller_user, policy_name, worker_pod_policy,
                        worker_pod_policy_binding)
from .cluster import (all_objects, auth_secret, check_home_access, check_names, home_pvc, kept_claims, namespace,
                      users_config_map)
from .common import ClusterSecrets, K8sSite, controller_address, dns_searches, login_sleeps, service_fqdn, sleeps
from .login import authorized_keys_secret, login_deployment, login_service, ssh_host_keys_secret
from ..names import (ACTIVITY_DIR, ACTIVITY_PORT, AUTHORIZED_KEYS_SECRET, AUTH_SECRET, A_CONFIG_HASH, A_MULTUS, CONFIG_INIT,
                    CONFIG_READY, A_SPEC_HASH, A_USERS_HASH, BASE_CAPS, BIN_DIR, CONTROLLER, CONTROLLER_GRACE_SECONDS,
                    CONTROLLER_POD, CONTROLLER_STATE_PVC, DATABASE_PVC, DB_SECRET, HOME_PVC, LOGIN, LOGIN_AGENT,
                    LOGIN_HOST, L_BUSY, L_CLUSTER, L_COMPONENT, L_NODE, L_POOL, L_SUBDOMAIN, L_TIER, MUNGE_DIR, SA_TOKEN_DIR,
                    JWT_DIR, JWT_KEY_FILE, JWT_KEY_PATH, JWT_SECRET, REST, REST_CONFIG, REST_FRONT, REST_LOCAL_PORT,
                    REST_PORT, REST_UID,
                    SLURMCTLD_PORT, SLURMDBD_CONF_SECRET, SLURMDBD_PORT, SLURMK8S_LOG_DIR, SLURM_CONFIG,
                    SLURM_CONF_DIR, SLURM_UID, SPEC_CONFIG, SPEC_DIR, SSH_HOST_KEYS_SECRET, SSH_HOST_KEY_TYPES,
                    SSH_PORT, TEMPLATE_PREFIX, TIER_CONTROL, TIER_ROLE, TIER_STATE, USERS_DIR, WAKE_DIR, WAKE_SOCKET, WORKERS,
                    WORKER_GRACE_SECONDS, WORKER_ROLE)
from .network import network_policies
from .rest import (jwt_objects, jwt_secret, rest_conf, rest_config_map, rest_deployment, rest_objects, rest_openapi_plugins,
                   rest_service)
from .rbac import (control_tier_role, control_tier_role_binding, control_tier_workloads, controller_service_account,
                   login_agent_role, login_agent_role_binding, login_agent_service_account, pinned, reads_nodes,
                   read_nodes_cluster_role, read_nodes_cluster_role_binding, read_nodes_objects, rest_front_role,
                   rest_front_role_binding, rest_front_service_account, tier_state_config_map, worker_role,
                   worker_role_binding)
from .slurmctld import (accounting_container, config_map_files, controller_service, controller_state_pvc,
                        controller_statefulset, pod_files, slurm_config_map, spec_config_map)
from .workers import (task_prolog_env, worker_pod, worker_pod_template, worker_template_config_map, workers_pdb,
                      workers_service)

__all__ = [
    "JWT_DIR", "JWT_KEY_FILE", "JWT_KEY_PATH", "JWT_SECRET", "REST", "REST_CONFIG", "REST_FRONT", "REST_LOCAL_PORT",
    "REST_PORT", "REST_UID",
    "jwt_objects", "jwt_secret", "rest_conf", "rest_config_map", "rest_deployment", "rest_objects", "rest_openapi_plugins",
    "rest_service",
    "ACTIVITY_DIR", "ACTIVITY_PORT", "AUTHORIZED_KEYS_SECRET", "AUTH_SECRET", "A_CONFIG_HASH", "A_MULTUS",
    "A_SPEC_HASH", "A_USERS_HASH", "BASE_CAPS", "BIN_DIR", "CONFIG_INIT", "CONFIG_READY", "CONTROLLER", "CONTROLLER_GRACE_SECONDS", "CONTROLLER_POD",
    "CONTROLLER_STATE_PVC", "ClusterSecrets", "DATABASE_PVC", "DB_SECRET", "HOME_PVC", "K8sSite", "LOGIN",
    "LOGIN_AGENT", "LOGIN_HOST", "L_BUSY", "L_CLUSTER", "L_COMPONENT", "L_NODE", "L_POOL", "L_SUBDOMAIN", "L_TIER", "MUNGE_DIR",
    "SA_TOKEN_DIR", "SLURMCTLD_PORT", "SLURMDBD_CONF_SECRET", "SLURMDBD_PORT", "SLURMK8S_LOG_DIR", "SLURM_CONFIG",
    "SLURM_CONF_DIR", "SLURM_UID", "SPEC_CONFIG", "SPEC_DIR", "SSH_HOST_KEYS_SECRET", "SSH_HOST_KEY_TYPES",
    "SSH_PORT", "TEMPLATE_PREFIX", "TIER_CONTROL", "TIER_ROLE", "TIER_STATE", "USERS_DIR", "WAKE_DIR", "WAKE_SOCKET", "WORKERS",
    "WORKER_GRACE_SECONDS", "WORKER_ROLE", "accounting_container", "accounting_objects", "admission_objects",
    "all_objects", "auth_secret",
    "authorized_keys_secret", "check_home_access", "check_names", "config_map_files", "control_tier_role", "control_tier_role_binding",
    "control_tier_workloads", "controller_address", "controller_user", "controller_service", "controller_service_account",
    "controller_state_pvc", "controller_statefulset", "db_check_pod", "db_endpoint", "dns_searches", "home_pvc",
    "kept_claims", "login_agent_role", "login_agent_role_binding", "login_agent_service_account", "login_deployment",
    "pinned", "pod_files", "reads_nodes", "read_nodes_cluster_role", "read_nodes_cluster_role_binding", "read_nodes_objects",
    "rest_front_role", "rest_front_role_binding", "rest_front_service_account", "tier_state_config_map",
    "login_service", "login_sleeps", "namespace", "network_policies", "policy_name", "service_fqdn", "sleeps", "slurm_config_map",
    "slurmdbd_conf", "slurmdbd_host", "spec_config_map", "ssh_host_keys_secret", "task_prolog_env", "users_config_map",
    "worker_pod", "worker_pod_policy", "worker_pod_policy_binding",
    "worker_pod_template", "worker_role", "worker_role_binding", "worker_template_config_map", "workers_pdb",
    "workers_service",
]
