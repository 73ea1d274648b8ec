"""The Helm chart's side of the pipeline (charts/slurmk8s): its values schema.

The chart deploys the same objects as the Pulumi program (``provisioner.deploy.program``) from the
same cluster spec (the chart's values). One thing a Go template cannot do is the Python core:
inventory from the Kubernetes nodes, topology, slurm.conf / topology.conf / gres.conf /
inventory.json. Those are rendered in the slurmctld pod, in both paths, by
``slurmk8s-render-config`` (:func:`provisioner.livenodes.render.main`); the chart's own hook is
:mod:`provisioner.helmhooks`, its default values :mod:`provisioner.chartdefaults`.

tests/test_chart.py renders the chart (``helm template``) and the Pulumi program for the same specs
and compares them object by object; it also runs :func:`provisioner.livenodes.render.render_files`
on the same nodes and checks that it yields the Pulumi program's ``slurm-config`` data.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .config import json_schema

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
