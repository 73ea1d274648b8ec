"""Deploying a cluster with Pulumi: the program (``program``), its generated keys (``keys``, and
``stackkeys`` for an embedded component), the Automation API driver behind ``slurmk8s up | preview |
down | outputs`` (``automation``) and those commands (``commands``).

The public component for a Pulumi program of your own: ``from provisioner.deploy import SlurmCluster``
(:class:`provisioner.deploy.program.SlurmCluster`). Importing this package imports none of the
modules above (and so not Pulumi) until that name is used."""

from __future__ import annotations

from typing import Any

__all__ = ["SlurmCluster"]


def __getattr__(name: str) -> Any:
    if name == "SlurmCluster":
        from .program import SlurmCluster

        return SlurmCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
