"""The Slurm configuration of a cluster on Kubernetes, from its spec and its Kubernetes nodes.

One function for every place that renders it: ``slurmk8s up`` (the ``slurm-config`` ConfigMap),
the slurmctld pod's start (its slurmctld container; both the Pulumi program's and the chart's) and
the reconcile loop (:mod:`provisioner.livenodes.live`), so they cannot disagree.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .. import manifests as m
from ..config import ClusterSpec
from ..errors import SlurmK8sError
from ..generate import generate_for_kubernetes
from ..inventory import Inventory
from ..render import write_files
from .source import read_domain, read_nodes, read_spec


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


# ---------------------------------------------------------------- slurmk8s-render-config: the slurmctld pod's start


def render_files(spec: ClusterSpec, k8s_nodes: Sequence[Mapping[str, Any]],
                 cluster_domain: str = "cluster.local") -> tuple[dict[str, str], list[str]]:
    """The files of the ``slurm-config`` ConfigMap, exactly as the Pulumi program builds them, and
    the lines to log: the Kubernetes nodes left out (with the reason), the topology's notices."""
    rendered = render(spec, k8s_nodes, cluster_domain)
    return rendered.files, rendered.notes


def _log(message: str) -> None:
    print(f"slurmk8s-render-config: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """slurmk8s-render-config --out DIR: spec (SLURMK8S_SPEC) + Kubernetes nodes -> DIR/slurm.conf, ...

    Exit status 2: the spec or the nodes do not give a valid cluster (the message names the field and
    the fix); 1: the Kubernetes API could not be read. Either way the slurmctld container exits and
    the kubelet restarts it.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--out" not in args or args.index("--out") + 1 >= len(args):
        _log("usage: slurmk8s-render-config --out DIR")
        return 2
    out = args[args.index("--out") + 1]
    try:
        spec = read_spec(os.environ)
    except SlurmK8sError as err:
        _log(f"not a valid cluster spec (the chart's values, or the spec `slurmk8s up` wrote):\n{err}")
        return 2
    except (OSError, ValueError) as err:
        _log(f"cannot read the cluster spec: {err}")
        return 2
    raw: list[dict[str, Any]] = []
    if m.pinned(spec):
        try:
            raw = read_nodes(os.environ)
        except Exception as err:  # noqa: BLE001 - any API failure: say which and let the kubelet retry
            _log(f"cannot list the Kubernetes nodes (the ClusterRole slurmk8s-<namespace>-read-nodes grants "
                 f"get/list on nodes): {err}")
            return 1
    domain, warning = read_domain(os.environ)
    if warning:
        _log(warning)
    try:
        files, notes = render_files(spec, raw, domain)
    except SlurmK8sError as err:
        _log(f"cannot build the cluster from the spec and the {len(raw)} Kubernetes nodes:\n{err}")
        return 2
    for line in notes:
        _log(line)
    write_files(files, out)
    _log(f"wrote {', '.join(sorted(files))} to {out} ({len(raw)} Kubernetes nodes read)")
    return 0
