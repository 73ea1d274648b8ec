"""The Helm chart's side of the pipeline (charts/slurmk8s): its values schema, and the in-cluster render.

The chart deploys the same objects as the Pulumi program (``provisioner.deploy.program``) from the
same cluster spec (the chart's values). One thing a Go template cannot do is the Python core:
inventory from the Kubernetes nodes, topology, slurm.conf / topology.conf / gres.conf /
inventory.json. The chart therefore renders those in the slurmctld pod: before slurmctld starts,
the slurmctld container's entrypoint runs ``slurmk8s-config-init``, which (unless it copies back the
configuration kept on the state volume, :mod:`provisioner.livenodes.cache`) runs :func:`render_main`
(``slurmk8s-render-config``) from the controller image: it reads the spec the chart wrote to the
``slurmk8s-spec`` ConfigMap, lists the Kubernetes nodes (only when a pool is pinned to nodes), and
writes exactly the files that ``slurmk8s up`` puts into the ``slurm-config`` ConfigMap, through the
same functions (:func:`provisioner.generate.generate` and
:func:`provisioner.manifests.slurm_config_map`), into the volume mounted at /etc/slurm.

tests/test_chart.py renders the chart (``helm template``) and the Pulumi program for the same specs
and compares them object by object; it also runs :func:`render_files` on the same nodes and checks
that it yields the Pulumi program's ``slurm-config`` data.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any, Mapping, Sequence

from . import manifests as m
from .config import ClusterSpec, json_schema
from .errors import SlurmK8sError
from .livenodes.render import render
from .livenodes.source import read_domain, read_nodes, read_spec
from .render import write_files

# The chart's own settings, next to the spec's keys in the values (not part of the spec).
CHART_KEY = "chart"
_CHART_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Settings of the Helm chart itself (not part of the cluster spec; `slurmk8s up` takes "
                   "them from the Pulumi stack configuration).",
    "properties": {
        "clusterDomain": {
            "type": "string", "default": "cluster.local",
            "description": "DNS domain of the Kubernetes cluster (the stack's `slurmk8s:clusterDomain`).",
        },
        "hostNetworkSources": {
            "type": "array", "default": [],
            "items": {"type": "string", "pattern": r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"},
            "description": "CIDRs (InternalIP/32 of each Kubernetes node that backs a pool with "
                           "`network.host_network`) admitted by the intra-cluster NetworkPolicy; "
                           "`slurmk8s up` reads them from the Node objects.",
        },
        "createSecrets": {
            "type": "boolean", "default": True,
            "description": "Create the Secrets `slurm-auth` (munge key) and `ssh-host-keys`, generated once "
                           "and kept across upgrades (helm `lookup`). Set false where the chart is only "
                           "templated (Argo CD) and create both Secrets out of band (charts/slurmk8s/README.md).",
        },
    },
}


def values_schema() -> dict[str, Any]:
    """charts/slurmk8s/values.schema.json: the spec's JSON schema plus the chart's own `chart` key."""
    schema = copy.deepcopy(json_schema())
    schema["title"] = "slurmk8s Helm chart values (a cluster spec)"
    schema["properties"][CHART_KEY] = _CHART_SCHEMA
    ns = schema["properties"]["namespace"]
    ns["description"] = ("Kubernetes namespace. With the chart, the release namespace is the cluster's "
                         "namespace: leave this unset, or set it to the release namespace.")
    return schema


def values_schema_text() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------- the in-cluster render


def render_files(spec: ClusterSpec, k8s_nodes: Sequence[Mapping[str, Any]],
                 cluster_domain: str = "cluster.local") -> tuple[dict[str, str], list[str]]:
    """The files of the ``slurm-config`` ConfigMap, exactly as the Pulumi program builds them, and
    the lines to log: the Kubernetes nodes left out (with the reason), the topology's notices."""
    rendered = render(spec, k8s_nodes, cluster_domain)
    return rendered.files, rendered.notes


def _log(message: str) -> None:
    print(f"slurmk8s-render-config: {message}", file=sys.stderr, flush=True)


def render_main(argv: Sequence[str] | None = None) -> int:
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
