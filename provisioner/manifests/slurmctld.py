"""slurmctld: its configuration, state volume, Service and StatefulSet (with the reconcile and
accounting containers)."""

from __future__ import annotations

import base64
import gzip

import json
import posixpath
from typing import Any, Mapping

from .. import settings
from ..config import ClusterSpec
from .common import (K8sSite, _container_security, _meta, _pod_security, _pvc, _pvc_volume, content_hash,
                     dns_searches, tier_labels)
from ..names import (A_SPEC_HASH, A_USERS_HASH, AUTH_SECRET, BASE_CAPS, BIN_DIR, CONFIG_INIT, CONTROLLER,
                    CONTROLLER_GRACE_SECONDS, CONTROLLER_STATE_PVC, ELASTIC_ENV_KEY, JWT_DIR, JWT_SECRET,
                    METRICS_PORT, MUNGE_DIR, MUNGE_SOCKET_DIR, POD_FILES_DIR, PROGRAM_SOCKET_DIR, RECONCILE_MEMORY_LIMIT,
                    RECONCILE_PERIOD, SLURM_CONF_DIR,
                    SLURM_CONFIG, SLURM_FILES, GZIPPED_FILES,
                    SLURM_UID, SLURMCTLD_PORT, SLURMK8S_LOG_DIR, SPEC_CONFIG, SPEC_DIR, STATE_DIR, USER_FILES,
                    USERS_CONFIG, USERS_DIR, base_labels, selector)


# ---------------------------------------------------------------- configuration


def slurm_config_map(spec: ClusterSpec, files: Mapping[str, str]) -> dict[str, Any]:
    """slurm.conf, topology.conf, gres.conf (+ gres-slurmctld.conf) and inventory.json, mounted at
    /etc/slurm on slurmctld.

    inventory.json travels gzipped (``binaryData`` ``inventory.json.gz``): about 470 bytes a node in
    JSON would pass Kubernetes' 1 MiB object limit near 2,000 nodes; gzipped, 10,000 nodes take
    about 70 KiB. Its readers open either file (:meth:`provisioner.inventory.Inventory.read`).
    """
    data = {name: files[name] for name in SLURM_FILES if name in files and name not in GZIPPED_FILES}
    binary = {f"{name}.gz": base64.b64encode(gzip.compress(files[name].encode(), mtime=0)).decode()
              for name in GZIPPED_FILES if name in files}
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(spec, SLURM_CONFIG, CONTROLLER),
        "data": data,
        **({"binaryData": binary} if binary else {}),
    }


def config_map_files(config_map: Mapping[str, Any]) -> dict[str, str]:
    """The files a ConfigMap built by :func:`slurm_config_map` mounts, gzipped ones unpacked."""
    files = dict(config_map.get("data") or {})
    for key, value in (config_map.get("binaryData") or {}).items():
        files[key.removesuffix(".gz")] = gzip.decompress(base64.b64decode(value)).decode()
    return files


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
        settings.BACKEND: "kubernetes",
        settings.INVENTORY: f"{SLURM_CONF_DIR}/inventory.json",
        settings.SPEC: f"{SPEC_DIR}/spec.json",
        settings.SITE: f"{SPEC_DIR}/site.json",
        settings.NAMESPACE: spec.namespace_name,
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


def _under_pod_files(path: str) -> str:
    """A directory the images expect (SPEC_DIR, ...) as the name of its part of POD_FILES_DIR."""
    return posixpath.relpath(path, POD_FILES_DIR)


def pod_files(spec: ClusterSpec) -> list[tuple[str, str, str]]:
    """(kind, name, directory under POD_FILES_DIR) of what slurmctld's entrypoint reads from the API
    (provisioner.podfiles): the spec, the users, the munge key, and the JWT key when slurmctld signs
    users' JWTs (rest.enabled), each where the images expect it. The Role of the pod's
    ServiceAccount may get exactly these."""
    out = [("configmap", SPEC_CONFIG, SPEC_DIR), ("configmap", USERS_CONFIG, USERS_DIR), ("secret", AUTH_SECRET, MUNGE_DIR)]
    if spec.rest.enabled:
        out.append(("secret", JWT_SECRET, JWT_DIR))
    return [(kind, name, _under_pod_files(path)) for kind, name, path in out]


# ---------------------------------------------------------------- state, Service, StatefulSet


def controller_state_pvc(spec: ClusterSpec) -> dict[str, Any]:
    return _pvc(spec, CONTROLLER_STATE_PVC, CONTROLLER, spec.storage.controller_state)


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

    ``replicas`` is left out on purpose (see the module docstring). The Slurm configuration is
    rendered in the pod, by the slurmctld container's entrypoint before slurmctld starts (CONFIG_INIT,
    once per pod), from the spec and the Kubernetes nodes (the same function as `up`,
    :mod:`provisioner.livenodes`), into an emptyDir that the reconcile container keeps current as
    nodes are cordoned, relabelled, added and removed (with `scontrol reconfigure`, no restart). The
    reconcile and accounting containers wait for it (``--wait-config``). So the pod carries no hash
    of those files: a change of the spec or of the users rolls it (annotations), a change of the
    nodes does not.
    """
    labels = {**base_labels(spec, CONTROLLER)}
    annotations = {
        A_USERS_HASH: content_hash({n: files[n] for n in USER_FILES}),
        A_SPEC_HASH: content_hash(spec_document(spec, site)),
    }
    container = {
        "name": "slurmctld",
        "image": spec.images.controller,
        "imagePullPolicy": spec.images.pull_policy,
        # for commands run in the container (kubectl exec); the programs Slurm starts read elastic.env.
        # SLURMK8S_CONFIG_INIT: the entrypoint fills the slurm-config emptyDir with it before slurmctld
        # starts, once per pod: slurm.conf, topology.conf, gres.conf(s) and inventory.json from the spec
        # and the Kubernetes nodes as they are then (the files `up` wrote into the slurm-config
        # ConfigMap, from the nodes as they were then); or, without a Python start, the files slurmctld
        # last ran with, which the reconcile loop keeps on the state volume, when made from this very
        # spec by this very image (images/entrypoint/config-init.sh, provisioner/livenodes/cache.py).
        # Not an init container: the kubelet would start this container up to a second after its end.
        "env": [{"name": k, "value": v} for k, v in elastic_env(spec).items()]
        + [{"name": settings.CONFIG_INIT, "value": CONFIG_INIT},
           {"name": settings.POD_FILES, "value": " ".join(f"{k}/{n}:{d}" for k, n, d in pod_files(spec))}],
        "ports": [{"name": "slurmctld", "containerPort": SLURMCTLD_PORT, "protocol": "TCP"}],
        # a wake waits for readiness: each second (a TCP connect; the kernel answers it from the backlog)
        "readinessProbe": {"tcpSocket": {"port": SLURMCTLD_PORT}, "periodSeconds": 1, "failureThreshold": 3},
        "livenessProbe": {"tcpSocket": {"port": SLURMCTLD_PORT}, "initialDelaySeconds": 60,
                          "periodSeconds": 20, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
        "securityContext": _container_security(BASE_CAPS),
        "volumeMounts": [
            {"name": "slurm-config", "mountPath": SLURM_CONF_DIR},  # written by CONFIG_INIT (as slurm)
            {"name": "pod-files", "mountPath": POD_FILES_DIR},  # written by the entrypoint (podfiles)
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "munge-socket", "mountPath": MUNGE_SOCKET_DIR},
            {"name": "slurmk8s-log", "mountPath": SLURMK8S_LOG_DIR},
            {"name": "programs-socket", "mountPath": PROGRAM_SOCKET_DIR},
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
                    "--metrics-port", str(METRICS_PORT), "--wait-config", SLURM_CONF_DIR],
        "env": [{"name": k, "value": v} for k, v in elastic_env(spec).items()],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # the pod's readiness is what a wake waits for (controltier/tier.py): a probe every 10 s made
        # a woken tier wait up to 10 s more once the loop listened; a TCP connect each second is free
        "readinessProbe": {"tcpSocket": {"port": METRICS_PORT}, "periodSeconds": 1},
        # a memory limit (names.py says why that size); no CPU limit, which would only slow a pass
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": RECONCILE_MEMORY_LIMIT}},
        "securityContext": {**_container_security(()), "runAsUser": SLURM_UID, "runAsGroup": SLURM_UID,
                            "runAsNonRoot": True},
        "volumeMounts": [
            # written: the loop keeps the configuration in line with the Kubernetes nodes
            {"name": "slurm-config", "mountPath": SLURM_CONF_DIR},
            # the spec alone (filled by the slurmctld container before slurm-config's .ready); the
            # programs' settings come from the env above
            {"name": "pod-files", "mountPath": SPEC_DIR, "subPath": _under_pod_files(SPEC_DIR), "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "munge-socket", "mountPath": MUNGE_SOCKET_DIR},
            {"name": "slurmk8s-log", "mountPath": SLURMK8S_LOG_DIR},
            {"name": "programs-socket", "mountPath": PROGRAM_SOCKET_DIR},
        ],
    }
    volumes = [
        {"name": "slurm-config", "emptyDir": {"sizeLimit": "64Mi"}},
        # in memory: the munge and JWT keys land here, as on a Secret volume's tmpfs
        {"name": "pod-files", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        _pvc_volume("state", CONTROLLER_STATE_PVC),
        {"name": "munge-socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "slurmk8s-log", "emptyDir": {"sizeLimit": "256Mi"}},
        # the reconcile loop's socket for the power-saving programs slurmctld starts (elastic/warm.py)
        {"name": "programs-socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
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
                    "volumes": volumes,
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
                    "--period", "30", "--wait-config", SLURM_CONF_DIR],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
        "securityContext": {**_container_security(()), "runAsUser": SLURM_UID, "runAsGroup": SLURM_UID,
                            "runAsNonRoot": True},
        "volumeMounts": [
            {"name": "slurm-config", "mountPath": SLURM_CONF_DIR, "readOnly": True},
            {"name": "pod-files", "mountPath": SPEC_DIR, "subPath": _under_pod_files(SPEC_DIR), "readOnly": True},
            {"name": "munge-socket", "mountPath": MUNGE_SOCKET_DIR},
        ],
    }
