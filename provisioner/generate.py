"""The whole pure pipeline: spec + Kubernetes nodes -> inventory -> topology -> validated files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .config import ClusterSpec
from .inventory import Inventory, K8sNode, build_inventory
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
