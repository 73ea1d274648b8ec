"""NetworkPolicies: any traffic among the cluster's own pods but two guarded ports, SSH, metrics and
the REST API from anywhere."""

from __future__ import annotations

from typing import Any

from ..config import ClusterSpec
from .common import K8sSite, _meta
from ..names import (ACTIVITY_PORT, BOOT_GATE_PORT, CONTROLLER, L_CLUSTER, L_COMPONENT, LOGIN, MARIADB, METRICS_PORT,
                    MYSQL_PORT, REST, REST_PORT, SLURMDBD, SSH_PORT, WORKER, selector)

# Ports only one component of the cluster may call, on the pods of another: component -> (port, caller).
# The boot gate of the reconcile loop (slurmctld pod) holds a starting worker until its node's resume;
# a user's shell on the login pod must not ask it (it checks who asks, too). The activity ports of
# the login and REST pods tell the reconcile loop (slurmctld pod) whether users are active.
GUARDED: dict[str, tuple[int, str]] = {CONTROLLER: (BOOT_GATE_PORT, WORKER), LOGIN: (ACTIVITY_PORT, CONTROLLER),
                                       REST: (ACTIVITY_PORT, CONTROLLER)}


def network_policies(spec: ClusterSpec, site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    """Any traffic among the cluster's own pods (MPI, NCCL, srun and jobs that call back to the
    login pod use arbitrary ports), but for the :data:`GUARDED` ports, which only their one caller
    reaches; from elsewhere only SSH to the login pod, the controller's metrics (counts, no user
    data) and, with ``rest``, HTTP to slurmrestd (every request there needs a user's token).

    Host-network workers send from their node's address, which no pod selector matches: their
    nodes' addresses (``site.host_network_sources``) are admitted to the cluster's pods too, and
    to the boot gate, which workers call.
    """
    own = {"matchLabels": {L_CLUSTER: spec.name}}
    hosts = [{"ipBlock": {"cidr": cidr}} for cidr in site.host_network_sources]
    peers: list[dict[str, Any]] = [{"podSelector": own}, *hosts]
    # the internal database is not among them: only slurmdbd reaches it (policy below)
    targets = {"matchLabels": {L_CLUSTER: spec.name},
               "matchExpressions": [{"key": L_COMPONENT, "operator": "NotIn", "values": [MARIADB, *GUARDED]}]}
    intra = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(spec, "intra-cluster", "network"),
        "spec": {"podSelector": targets, "policyTypes": ["Ingress"], "ingress": [{"from": peers}]},
    }
    policies = [intra]
    for component, (port, caller) in GUARDED.items():
        if component == LOGIN and not spec.login.enabled or component == REST and not spec.rest.enabled:
            continue
        callers = [{"podSelector": {"matchLabels": selector(spec, caller)}}, *(hosts if caller == WORKER else [])]
        policies.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(spec, f"{component}-from-cluster", "network"),
            "spec": {
                "podSelector": {"matchLabels": selector(spec, component)},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": peers, "ports": _every_port_but(port)},
                            {"from": callers, "ports": [{"protocol": "TCP", "port": port}]}],
            },
        })
    policies += [_open_port(spec, "login-ssh", LOGIN, SSH_PORT),
                 _open_port(spec, "controller-metrics", CONTROLLER, METRICS_PORT)]
    if spec.rest.enabled:
        policies.append(_open_port(spec, "rest-http", REST, REST_PORT))
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


def _every_port_but(port: int) -> list[dict[str, Any]]:
    """Every TCP port but one (two ranges), every UDP and SCTP port."""
    return [{"protocol": "TCP", "port": 1, "endPort": port - 1}, {"protocol": "TCP", "port": port + 1, "endPort": 65535},
            {"protocol": "UDP"}, {"protocol": "SCTP"}]


def _open_port(spec: ClusterSpec, name: str, component: str, port: int) -> dict[str, Any]:
    """Admit one TCP port of one component's pods from anywhere (SSH to login, metrics, REST)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(spec, name, "network"),
        "spec": {
            "podSelector": {"matchLabels": selector(spec, component)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": port}]}],
        },
    }
