"""Worker pods (built per Slurm node at resume; never part of the deployed set), their per-pool
templates, headless Service and PodDisruptionBudget."""

from __future__ import annotations

import json
from typing import Any

from .. import kueue, settings
from ..config import ClusterSpec, Pool
from ..inventory import SlurmNode
from .common import (K8sSite, _config_volume, _container_security, _meta, _pod_security, _pvc_volume,
                     _secret_volume, content_hash, controller_address, dns_searches, home_on_one_node)
from ..names import (A_IMAGE_INTERFACE, A_K8S_NODE, A_MULTUS, A_NODE_START, A_SPEC_HASH, AUTH_SECRET, BASE_CAPS,
                    HOME_PVC, IMAGE_INTERFACE, L_BUSY, L_CLUSTER, L_MANAGED_BY, L_NODE, L_POOL, L_SUBDOMAIN, LOGIN, MUNGE_DIR,
                    SLURMD_PORT, TEMPLATE_PREFIX, USERS_CONFIG, USERS_DIR, WORKER_GRACE_SECONDS, WORKER_STOP, WORKERS,
                    base_labels, selector)


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
    """No voluntary eviction of a busy worker pod: the reconcile loop labels a worker busy while a
    job runs on its node (reconcile/busy.py), so a drain waits for the job and then goes on. An idle
    worker is not covered: a drain or a consolidation evicts it at once (its node is powered down;
    the next job gets a fresh pod). Unhealthy (not Ready) workers may always be evicted."""
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": _meta(spec, WORKERS, "worker"),
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {**selector(spec, "worker"), L_BUSY: "true"}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _shm_size(pool: Pool, node: SlurmNode) -> str:
    if pool.shm_size is not None:
        return str(pool.shm_size)
    return f"{max(64, node.real_memory // 2)}Mi"


def task_prolog_env(pool: Pool) -> str:
    """The pool's job environment as Slurm's TaskProlog prints it: one ``export NAME=value`` line
    per variable. The worker pod carries it (SLURMK8S_JOB_ENV); the entrypoint writes it to
    /run/slurmk8s/job-env, which the TaskProlog (images/slurmd/task-prolog) prints for every task.
    slurmstepd takes each value verbatim to the end of its line (the spec refuses line breaks)
    and sets it over the submitter's."""
    return "".join(f"export {name}={value}\n" for name, value in pool.job_env.items())


def worker_container_security(pool: Pool) -> dict[str, Any]:
    """The slurmd container's securityContext: no privilege, no escalation, the base capabilities,
    seccomp RuntimeDefault. A pool with container jobs (``containers.enabled``) differs in its
    seccomp profile only: rootless crun creates a user namespace (unshare/clone with CLONE_NEWUSER,
    then mount, pivot_root, keyctl), which RuntimeDefault refuses with EPERM (docs/containers.md)."""
    sc = _container_security(BASE_CAPS)
    sc["seccompProfile"] = pool.containers.seccomp_profile()
    return sc


def worker_pod_template(spec: ClusterSpec, pool: Pool, site: K8sSite = K8sSite()) -> dict[str, Any]:
    """Everything of a pool's worker pod that does not depend on the Slurm node.

    :func:`worker_pod` fills in the node's name, placement and size. Stored per pool in a ConfigMap
    so operators can see what a resume will create.
    """
    net = pool.network
    env = [{"name": settings.CONTROLLER, "value": controller_address(spec, site)},
           {"name": settings.POOL, "value": pool.name},
           # the entrypoint raises the memlock limit only when asked (set_memlock, images/entrypoint/lib.sh);
           # no capability is added for it: see Network.memlock_unlimited
           {"name": settings.MEMLOCK_UNLIMITED, "value": "1" if net.memlock_unlimited else "0"}]
    env += [{"name": k, "value": v} for k, v in sorted(net.nccl_env.items())]
    if pool.containers.enabled:
        # the entrypoint makes each user's crun state directory, /run/user/<uid> (oci.conf's --root)
        env.append({"name": settings.CONTAINERS, "value": "1"})
    job_env = task_prolog_env(pool)
    if job_env:
        # slurmd's environment does not reach jobs: the entrypoint writes this to
        # /run/slurmk8s/job-env, which Slurm's TaskProlog exports into every task
        env.append({"name": settings.JOB_ENV, "value": job_env})
    container = {
        "name": "slurmd",
        "image": pool.image or spec.images.worker,
        "imagePullPolicy": spec.images.pull_policy,
        "env": env,
        "ports": [{"name": "slurmd", "containerPort": SLURMD_PORT, "protocol": "TCP"}],
        # no probe: slurmd logs an error for every bare TCP connection, and nothing waits for a
        # worker pod's readiness (Slurm tracks the node's registration itself)
        "securityContext": worker_container_security(pool),
        # the pod is being deleted: its running jobs are requeued while slurmd still runs, so their
        # steps get SIGTERM and time to end (images/slurmd/worker-stop), not SIGKILL with slurmd's exit
        "lifecycle": {"preStop": {"exec": {"command": [WORKER_STOP]}}},
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
        "securityContext": {**_pod_security(), "seccompProfile": pool.containers.seccomp_profile()},
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
    if pool.priority_class:
        pod_spec["priorityClassName"] = pool.priority_class
    metadata: dict[str, Any] = {
        "namespace": spec.namespace_name,
        "labels": {**base_labels(spec, "worker"), L_POOL: pool.name, L_SUBDOMAIN: WORKERS,
                   L_MANAGED_BY: "slurmk8s"},
    }
    if net.multus_networks:
        metadata["annotations"] = {A_MULTUS: ",".join(net.multus_networks)}
    if pool.kueue is not None:
        # submitted to the pool's LocalQueue; each power-up's pods of one job are one group (the
        # backend names it), done once none of its pods is active (provisioner/kueue.py)
        metadata["labels"][kueue.QUEUE_LABEL] = pool.kueue.queue
        if pool.kueue.priority_class:
            metadata["labels"][kueue.PRIORITY_LABEL] = pool.kueue.priority_class
        metadata.setdefault("annotations", {})[kueue.RETRIABLE] = "false"
    if pool.node_start_timeout is not None:  # the reconcile loop's bound on its Unschedulable wait
        metadata.setdefault("annotations", {})[A_NODE_START] = str(pool.node_start_timeout)
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
    container["env"].insert(1, {"name": settings.NODENAME, "value": node.name})
    # GPU nodes: the entrypoint writes the node's gres.conf line from the pod's /dev/nvidia<N> files
    container["env"] += [{"name": k, "value": v} for k, v in node.gres_env.items()]
    container["resources"] = worker_resources(spec, node)
    if pool.kueue is not None:  # one pod set per size in the job's group, wherever each pod is placed
        annotations[kueue.ROLE_HASH] = kueue.role_hash(pool.name, container["resources"]["requests"])
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
                     "labels": {**base_labels(spec, "worker"), L_POOL: pool.name},
                     # the image was checked for this interface (or is the one `up` checks next)
                     "annotations": {A_IMAGE_INTERFACE: str(IMAGE_INTERFACE)}},
        "data": {"pod.json": json.dumps(worker_pod_template(spec, pool, site), indent=1, sort_keys=True) + "\n"},
    }
