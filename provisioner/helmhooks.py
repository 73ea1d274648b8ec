"""The Helm chart's hooks: what `helm uninstall` must do that deleting the chart's own objects does not.

The values schema is the chart's other side (:mod:`provisioner.chart`); the in-cluster render, which
both paths run, is :mod:`provisioner.livenodes.render`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from . import names
from .settings import ClusterFiles


def delete_workers_main(argv: Sequence[str] | None = None) -> int:
    """slurmk8s-delete-workers: delete the cluster's worker pods (Helm pre-delete hook).

    Worker pods are created by Slurm's ResumeProgram, not by Helm, so `helm uninstall` alone would
    leave them running without a slurmctld; `slurmk8s down` deletes them the same way after destroy.
    Reads SLURMK8S_SPEC (the cluster name) and SLURMK8S_NAMESPACE.
    """
    from .elastic.k8s_backend import ClientPodApi
    from .kubeapi import api_client

    files = ClusterFiles.from_env(os.environ)
    try:
        with open(files.spec) as fh:
            name = json.load(fh)["name"]
        ns = files.require_namespace()
        api = ClientPodApi(api_client())
        selector = f"{names.L_CLUSTER}={name},{names.L_COMPONENT}=worker"
        pods = api.list(ns, selector)
        for pod in pods:
            api.delete(ns, pod["metadata"]["name"])
    except Exception as err:  # noqa: BLE001 - report and fail the hook (helm shows it)
        print(f"slurmk8s-delete-workers: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(f"slurmk8s-delete-workers: deleted {len(pods)} worker pod(s) of cluster {name} in {ns}")
    return 0
