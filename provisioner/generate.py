"""The whole pure pipeline: spec + Kubernetes nodes -> inventory -> topology -> validated files.

:func:`generate_for_kubernetes` is the one place that assembles it for a cluster on Kubernetes:
``slurmk8s render``, ``up`` / ``preview`` (the Pulumi program), the Helm chart's in-cluster render
and the checks before Pulumi all call it, so the files they produce cannot disagree (a test renders
one spec every way and compares).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from . import manifests as m
from .config import ClusterSpec
from .inventory import Inventory, K8sNode, build_inventory, nodes_from_api
from .render import Site, render_all
from .topology import Topology, build_topology


@dataclass(frozen=True)
class Generated:
    inventory: Inventory
    topology: Topology
    files: dict[str, str]


def generate(spec: ClusterSpec, k8s_nodes: Iterable[K8sNode], site: Site = Site()) -> Generated:
    inventory = build_inventory(spec, k8s_nodes)
    topology = build_topology(spec, inventory)
    return Generated(inventory, topology, render_all(spec, inventory, topology, site))


def kubernetes_site(spec: ClusterSpec, cluster_domain: str = "cluster.local") -> Site:
    """The names the Slurm files use on Kubernetes: slurmdbd by its Service's full name in the
    cluster's DNS domain (or the external database's slurmdbd), the controller by its pod's name."""
    return Site(accounting_host=m.slurmdbd_host(spec, m.K8sSite(cluster_domain=cluster_domain)))


def generate_for_kubernetes(spec: ClusterSpec, k8s_nodes: Iterable[Mapping[str, Any]],
                            cluster_domain: str = "cluster.local") -> Generated:
    """:func:`generate` for a cluster on Kubernetes, from Node objects as the API returns them."""
    return generate(spec, nodes_from_api(list(k8s_nodes)), kubernetes_site(spec, cluster_domain))
