"""What the in-cluster programs render from: the spec and site ConfigMap, and the Kubernetes nodes."""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..config import ClusterSpec, parse_spec
from ..settings import ClusterFiles


def read_spec(env: Mapping[str, str]) -> ClusterSpec:
    """The cluster spec the in-cluster programs read (``SLURMK8S_SPEC``, default the spec ConfigMap's
    spec.json). Raises OSError / ValueError when unreadable, SlurmK8sError when not a valid spec."""
    path = ClusterFiles.from_env(env).spec
    with open(path) as fh:
        return parse_spec(json.load(fh), source=path)


def read_domain(env: Mapping[str, str]) -> tuple[str, str]:
    """(the Kubernetes cluster's DNS domain from ``SLURMK8S_SITE``, a warning when it had to be assumed)."""
    domain = "cluster.local"
    path = ClusterFiles.from_env(env).site_path
    try:
        with open(path) as fh:
            return json.load(fh).get("cluster_domain") or domain, ""
    except (OSError, ValueError) as err:
        return domain, f"cannot read {path} ({err}): assuming cluster domain {domain}"


def read_nodes(env: Mapping[str, str], cached: bool = False) -> list[dict[str, Any]]:
    """The Node objects as the API returns them (in-cluster credentials, else KUBECONFIG), by the
    raw seam: slurmctld's start (and so a wake) reads them, and the generated CoreV1Api's import
    alone costs 0.6 s there. `cached`: from the API server's watch cache (``resourceVersion=0``: no
    etcd read, for a caller that lists every pass). Raises ApiError (or KubeConfigError) when they
    cannot be read."""
    from ..kubeapi import RawClient, api_client, quick_client

    client = quick_client(env=env) or api_client(env=env)
    query = {"resourceVersion": "0"} if cached else None
    return RawClient(client, timeout=(5.0, 60.0)).request("GET", "/api/v1/nodes", query).get("items") or []
