"""Local toolchain and single-node Kubernetes for slurmk8s, on a machine with package mirrors only.

Two shell scripts do the work (shipped as package data):

- ``toolchain.sh`` builds etcd, Kubernetes, CoreDNS, kwok, helm, the Pulumi CLI and the
  pulumi-kubernetes provider from the Go module proxy into ``/var/cache/slurmk8s/toolchain``.
- ``cluster.sh`` runs a single-node cluster from those binaries (``up | down | status |
  load-image``), state in ``/var/lib/slurmk8s/localk8s``.

This package wraps them as the ``slurmk8s toolchain`` and ``slurmk8s cluster`` command groups.
"""

from __future__ import annotations

from provisioner.localk8s.cli import cluster_app, toolchain_app

__all__ = ["cluster_app", "toolchain_app"]
