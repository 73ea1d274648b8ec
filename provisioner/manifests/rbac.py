"""ServiceAccounts, Roles and RoleBindings: the resume/suspend programs' and the idle teardown's."""

from __future__ import annotations

from typing import Any

from ..config import ClusterSpec
from ..kueue import GROUP as KUEUE_GROUP
from ..kueue import WORKLOADS
from .common import _meta, login_sleeps, sleeps
from ..names import base_labels
from ..names import (CONTROLLER, CONTROLLER_POD, LOGIN, LOGIN_AGENT, MARIADB, REST, REST_FRONT, SLURMDBD, TIER_ROLE,
                     TIER_STATE, WORKER_ROLE)
from .slurmctld import pod_files


# ---------------------------------------------------------------- RBAC for the resume/suspend programs


def controller_service_account(spec: ClusterSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, CONTROLLER, CONTROLLER)}


def worker_role(spec: ClusterSpec) -> dict[str, Any]:
    """Pods, in this namespace only: what ResumeProgram / SuspendProgram need (`patch`: a resume
    that keeps a live worker marks it so, which makes the reconcile loop's delete judged before it
    fail its resourceVersion precondition: elastic.k8s_backend.KubernetesBackend.adopt; what any
    update may make of a pod is bounded by the worker pod admission policy, which checks UPDATE as
    CREATE); a get of the slurmctld StatefulSet alone, whose uid every worker pod's ownerReference
    names; and a get of the ConfigMaps and Secrets slurmctld's pod reads at its start instead of
    mounting them (:func:`.slurmctld.pod_files`), by name. With a pool under Kueue: a get of the
    namespace's Kueue Workloads, whose conditions say why a job's pods wait (reconcile/kueuewait.py)."""
    files = pod_files(spec)
    kueue_rules = ([{"apiGroups": [KUEUE_GROUP], "resources": [WORKLOADS], "verbs": ["get"]}]
                   if any(p.kueue is not None for p in spec.pools) else [])
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": _meta(spec, WORKER_ROLE, CONTROLLER),
        "rules": [{"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
                  {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": [CONTROLLER],
                   "verbs": ["get"]},
                  *({"apiGroups": [""], "resources": [f"{kind}s"], "verbs": ["get"],
                     "resourceNames": [name for k, name, _ in files if k == kind]} for kind in ("configmap", "secret")),
                  *kueue_rules],
    }


def worker_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _meta(spec, WORKER_ROLE, CONTROLLER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WORKER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": spec.namespace_name}],
    }


# ---------------------------------------------------------------- read access to the nodes (pinned pools, notices)


def pinned(spec: ClusterSpec) -> bool:
    """A pool pinned to Kubernetes nodes: its Slurm nodes are rendered from the nodes."""
    return any(p.mode == "pinned" for p in spec.pools)


def read_nodes_name(spec: ClusterSpec) -> str:
    return f"slurmk8s-{spec.namespace_name}-read-nodes"


def read_nodes_cluster_role(spec: ClusterSpec) -> dict[str, Any]:
    """get / list of the Kubernetes nodes (cluster-scoped, named per namespace): the slurmctld pod
    renders pinned pools from the nodes at start (the slurmctld container, before slurmctld) and the
    reconcile loop follows them and their interruption notices."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": read_nodes_name(spec), "labels": base_labels(spec, CONTROLLER)},
        # watch: the loop's trigger for interruption notices (reconcile/notices.py NoticeWatch)
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
    }


def read_nodes_cluster_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": read_nodes_name(spec), "labels": base_labels(spec, CONTROLLER)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": read_nodes_name(spec)},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": spec.namespace_name}],
    }


def read_nodes_objects(spec: ClusterSpec) -> list[dict[str, Any]]:
    return [read_nodes_cluster_role(spec), read_nodes_cluster_role_binding(spec)] if reads_nodes(spec) else []


def reads_nodes(spec: ClusterSpec) -> bool:
    """slurmctld's pod reads the nodes: to render a pinned pool, or for interruption notices."""
    return pinned(spec) or spec.elasticity.follows_notices


# ---------------------------------------------------------------- RBAC for the idle teardown


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


def _tier_rules(spec: ClusterSpec, controller: bool) -> list[dict[str, Any]]:
    """Read the tier's workloads, scale exactly those (their scale subresource alone: a `patch` of
    the StatefulSet itself would let slurmctld's account rewrite slurmctld's pod template, which the
    StatefulSet controller then creates outside the worker pod admission policy), emit Events, read
    the tier's state (the ConfigMap :data:`TIER_STATE`, by name); the reconcile loop also writes
    that state (`patch` of that ConfigMap) and reads the wake requests (Events). A waker (the login
    agent, the REST front) also reads slurmctld's pod and its FailedMount Events, and may delete
    that pod (no more than scaling slurmctld to zero, which it may anyway), when the kubelet skipped
    it for its volume claim (controltier.tier.Tier._replace_skipped_pod)."""
    names = control_tier_workloads(spec)
    rules: list[dict[str, Any]] = [
        {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": ["get", "list"]}]
    for kind, resource in (("StatefulSet", "statefulsets/scale"), ("Deployment", "deployments/scale")):
        named = [n for k, n in names if k == kind]
        if named:
            rules.append({"apiGroups": ["apps"], "resources": [resource], "resourceNames": named,
                          "verbs": ["get", "patch", "update"]})
    rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]})
    if not controller:
        rules.append({"apiGroups": [""], "resources": ["pods"], "resourceNames": [CONTROLLER_POD],
                      "verbs": ["get", "delete"]})
    rules.append({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [TIER_STATE],
                  "verbs": ["get", "patch"] if controller else ["get"]})
    return rules


def tier_state_config_map(spec: ClusterSpec) -> dict[str, Any]:
    """Where the control tier's state is kept: the annotations of this ConfigMap (slurmk8s.io/state,
    state-reason, state-since; controltier.tier.Tier.record), written by the reconcile loop. The
    deploy creates it with neither data nor annotations, so that a re-deploy (server-side apply,
    or a Helm upgrade's three-way merge) leaves the recorded state alone."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(spec, TIER_STATE, CONTROLLER)}


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
    """Wake only: read the tier's workloads, scale exactly those, leave a WakeRequested Event; and
    list the namespace's EndpointSlices (the address slurmctld's Service publishes, which the cluster
    DNS serves), to see slurmctld's port take connections before its pod is Ready
    (controltier.tier.controller_listens). EndpointSlices are named by the controller that writes
    them, so the rule cannot name them: `list` with the Service's label."""
    rules = _tier_rules(spec, controller=False)
    rules.append({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]})
    return _role(spec, LOGIN_AGENT, LOGIN, rules)


def login_agent_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return _binding(spec, LOGIN_AGENT, LOGIN, LOGIN_AGENT)


def rest_front_service_account(spec: ClusterSpec) -> dict[str, Any]:
    """The slurmrestd pod's account. Its token reaches only the waking front's container; slurmrestd
    itself has none."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, REST_FRONT, REST),
            "automountServiceAccountToken": False}


def rest_front_role(spec: ClusterSpec) -> dict[str, Any]:
    """The login agent's rights (wake only), for a REST request that finds the tier asleep."""
    return _role(spec, REST_FRONT, REST, _tier_rules(spec, controller=False))


def rest_front_role_binding(spec: ClusterSpec) -> dict[str, Any]:
    return _binding(spec, REST_FRONT, REST, REST_FRONT)


def control_tier_objects(spec: ClusterSpec) -> list[dict[str, Any]]:
    """The RBAC of the idle teardown (none without ``idle_teardown``)."""
    if not sleeps(spec):
        return []
    objs = [tier_state_config_map(spec), control_tier_role(spec), control_tier_role_binding(spec)]
    if spec.login.enabled:
        objs += [login_agent_service_account(spec), login_agent_role(spec), login_agent_role_binding(spec)]
    if spec.rest.enabled:
        objs += [rest_front_service_account(spec), rest_front_role(spec), rest_front_role_binding(spec)]
    return objs
