"""Helpers shared by the builders: the site, the secrets, metadata, addresses, security contexts, volumes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..config import ClusterSpec
from ..names import CONTROLLER, CONTROLLER_POD, L_TIER, SLURMCTLD_PORT, TIER_CONTROL, WORKERS, base_labels


@dataclass(frozen=True)
class K8sSite:
    """Facts about the Kubernetes cluster that the spec does not hold."""

    cluster_domain: str = "cluster.local"
    # Node addresses from which host-network workers reach slurmctld and login (NetworkPolicy).
    host_network_sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSecrets:
    """Generated once per cluster (see ``provisioner.deploy.keys``); values may be Pulumi outputs."""

    munge_key_b64: Any
    ssh_host_keys: Mapping[str, Any]
    db_password: Any = None  # the internal accounting database's password
    jwt_key_b64: Any = None  # the JWT key (base64 of its raw bytes), for rest.enabled


def _meta(spec: ClusterSpec, name: str, component: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": spec.namespace_name, "labels": base_labels(spec, component)}
    meta.update(extra)
    return meta


def _control_meta(spec: ClusterSpec, name: str, component: str) -> dict[str, Any]:
    meta = _meta(spec, name, component)
    meta["labels"][L_TIER] = TIER_CONTROL
    return meta


def tier_labels(spec: ClusterSpec, component: str) -> dict[str, str]:
    return {**base_labels(spec, component), L_TIER: TIER_CONTROL}


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


def sleeps(spec: ClusterSpec) -> bool:
    """The control tier may sleep (``elasticity.idle_teardown`` is set)."""
    return spec.elasticity.idle_teardown is not None


def login_sleeps(spec: ClusterSpec) -> bool:
    return spec.login.enabled and spec.login.sleeps_with_control_tier


def home_on_one_node(spec: ClusterSpec) -> bool:
    """/home is not ReadWriteMany: login and every worker must share the node the volume is attached to."""
    return spec.storage.home.access_mode != "ReadWriteMany"


# ---------------------------------------------------------------- security contexts and volumes


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


def _pvc(spec: ClusterSpec, name: str, component: str, volume) -> dict[str, Any]:
    pvc_spec: dict[str, Any] = {
        "accessModes": [volume.access_mode],
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class:
        pvc_spec["storageClassName"] = volume.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(spec, name, component), "spec": pvc_spec}


def service_account_token_volume(name: str) -> dict[str, Any]:
    """The pod's ServiceAccount token as a projected volume, for the one container that mounts it
    at SA_TOKEN_DIR (the pod itself automounts none): token, the cluster's CA, the namespace."""
    return {"name": name, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}
