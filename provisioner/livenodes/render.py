"""The Slurm configuration of a cluster on Kubernetes, from its spec and its Kubernetes nodes.

One function for every place that renders it: ``slurmk8s up`` (the ``slurm-config`` ConfigMap),
the slurmctld pod's start (its slurmctld container; both the Pulumi program's and the chart's) and
the reconcile loop (:mod:`provisioner.livenodes.live`), so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .. import manifests as m
from ..config import ClusterSpec
from ..generate import generate_for_kubernetes
from ..inventory import Inventory


@dataclass(frozen=True)
class Rendered:
    files: dict[str, str]  # file name -> text, as mounted under /etc/slurm (inventory.json unpacked)
    notes: list[str]  # what to log: Kubernetes nodes left out (and why), the topology's notices
    inventory: Inventory


def render(spec: ClusterSpec, k8s_nodes: Sequence[Mapping[str, Any]], cluster_domain: str = "cluster.local") -> Rendered:
    """Raises :class:`~provisioner.errors.SlurmK8sError` (naming the field and the fix) when the
    spec and the nodes do not give a valid cluster."""
    gen = generate_for_kubernetes(spec, k8s_nodes, cluster_domain)
    m.check_names(spec, gen.inventory)
    notes = [f"Kubernetes node left out of pool {e.k8s_node} ({e.pool}): {e.reason}" for e in gen.inventory.excluded]
    notes += [f"notice: {n}" for n in gen.topology.notices]
    return Rendered(m.config_map_files(m.slurm_config_map(spec, gen.files)), notes, gen.inventory)

