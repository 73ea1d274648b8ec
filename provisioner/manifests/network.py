"""NetworkPolicies: any traffic among the cluster's own pods, SSH, metrics and the REST API from anywhere."""

from __future__ import annotations

from typing import Any

from ..config import ClusterSpec
from .common import K8sSite, _meta
from ..names import (CONTROLLER, L_CLUSTER, L_COMPONENT, LOGIN, MARIADB, METRICS_PORT, MYSQL_PORT, REST, REST_PORT,
                    SLURMDBD, SSH_PORT, selector)


def network_policies(spec: ClusterSpec, site: K8sSite = K8sSite()) -> list[dict[str, Any]]:
    """Any traffic among the cluster's own pods (MPI, NCCL, srun and jobs that call back to the
    login pod use arbitrary ports); from elsewhere only SSH to the login pod (and, with ``rest``,
    HTTP to slurmrestd; every request there needs a user's token).

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
