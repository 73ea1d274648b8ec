"""Cluster-wide objects (namespace, auth key, users, /home), the checks, and the whole deployed set."""

from __future__ import annotations

from typing import Any, Mapping

from ..config import ClusterSpec
from ..errors import Issue, Problem
from ..inventory import Inventory
from .accounting import accounting_objects
from .admission import admission_objects
from .common import ClusterSecrets, K8sSite, _meta, _pvc, home_on_one_node
from .login import authorized_keys_secret, login_deployment, login_service, ssh_host_keys_secret
from ..names import (AUTH_SECRET, CONTROLLER, CONTROLLER_POD, CONTROLLER_STATE_PVC, DATABASE_PVC, HOME_PVC,
                    L_CLUSTER, L_INSTANCE, L_NAME, L_PART_OF, LOGIN, LOGIN_HOST, REST, USER_FILES, USERS_CONFIG, WORKERS)
from .network import network_policies
from .rest import jwt_objects, rest_objects
from .rbac import control_tier_objects, controller_service_account, read_nodes_objects, worker_role, worker_role_binding
from .slurmctld import (controller_service, controller_state_pvc, controller_statefulset, slurm_config_map,
                        spec_config_map)
from .workers import worker_template_config_map, workers_pdb, workers_service


# ---------------------------------------------------------------- cluster-wide objects


def uses_host_network(spec: ClusterSpec) -> bool:
    return any(p.network.host_network for p in spec.pools)


def uses_unconfined_seccomp(spec: ClusterSpec) -> bool:
    """A pool runs container jobs with seccomp Unconfined (baseline forbids it; Localhost passes)."""
    return any(p.containers.enabled and p.containers.seccomp == "Unconfined" for p in spec.pools)


def pod_security_level(spec: ClusterSpec) -> str:
    """The Pod Security level the namespace enforces: 'privileged' when a pool needs hostNetwork or
    seccomp Unconfined (container jobs), both of which baseline forbids; else 'baseline'."""
    return "privileged" if uses_host_network(spec) or uses_unconfined_seccomp(spec) else "baseline"


def namespace(spec: ClusterSpec) -> dict[str, Any]:
    """The cluster's namespace. Pod Security 'baseline' is enforced unless a pool needs hostNetwork
    or seccomp Unconfined (:func:`pod_security_level`); every other container here also meets it (no
    privilege, default capabilities only)."""
    labels = {L_NAME: "slurmk8s", L_INSTANCE: spec.name, L_PART_OF: "slurmk8s", L_CLUSTER: spec.name}
    level = pod_security_level(spec)
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


def users_config_map(spec: ClusterSpec, files: Mapping[str, str]) -> dict[str, Any]:
    """passwd and group fragments (identical UIDs on every pod)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(spec, USERS_CONFIG, "users"),
        "data": {name: files[name] for name in USER_FILES},
    }


def home_pvc(spec: ClusterSpec) -> dict[str, Any]:
    """Shared /home for login and workers (ReadWriteMany by default)."""
    return _pvc(spec, HOME_PVC, "storage", spec.storage.home)


# ---------------------------------------------------------------- checks and the whole set


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
    reserved = {LOGIN, LOGIN_HOST, CONTROLLER_POD, CONTROLLER, WORKERS, REST}
    issues = [
        Issue(f"pools[{next(i for i, p in enumerate(spec.pools) if p.name == n.pool)}].name_prefix",
              f"Slurm node name {n.name!r} clashes with the {n.name!r} pod/service of the cluster",
              "set a name_prefix for the pool")
        for n in inventory.nodes if n.name in reserved
    ]
    if issues:
        raise Problem(issues, title="invalid Slurm node names")


def kept_claims(spec: ClusterSpec) -> list[str]:
    """The PersistentVolumeClaims of the cluster (kept by `slurmk8s down`, deleted by `down --purge`)."""
    claims = [HOME_PVC, CONTROLLER_STATE_PVC]
    if spec.accounting.enabled and spec.accounting.external_database is None:
        claims.append(DATABASE_PVC)
    return claims


def all_objects(spec: ClusterSpec, inventory: Inventory, files: Mapping[str, str], secrets: ClusterSecrets,
                site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    """Every object of the deployed set, in apply order (namespace first). Worker pods are not in it.
    The admission policy and its binding are cluster-scoped (no namespace)."""
    check_names(spec, inventory)
    check_home_access(spec, inventory)
    objs: list[dict[str, Any]] = [namespace(spec), home_pvc(spec)]
    objs += [
        auth_secret(spec, secrets.munge_key_b64), *jwt_objects(spec, secrets), slurm_config_map(spec, files), users_config_map(spec, files),
        spec_config_map(spec, site), controller_service_account(spec), worker_role(spec),
        worker_role_binding(spec), *read_nodes_objects(spec), *admission_objects(spec, site), *control_tier_objects(spec),
        controller_state_pvc(spec),
        controller_service(spec), controller_statefulset(spec, files, site),
    ]
    if spec.login.enabled:
        objs += [ssh_host_keys_secret(spec, secrets.ssh_host_keys), authorized_keys_secret(spec),
                 login_deployment(spec, files, site), login_service(spec)]
    objs += accounting_objects(spec, secrets, site)
    objs += rest_objects(spec, files, site)
    objs += [worker_template_config_map(spec, p, site) for p in spec.pools]
    objs += [workers_service(spec), workers_pdb(spec)]
    objs += network_policies(spec, site)
    return objs
