"""Errors of `slurmk8s up | preview | down`."""

from __future__ import annotations

from ..errors import SlurmK8sError


class DeployError(SlurmK8sError):
    """Something stops a deployment; the message says what and how to fix it."""


class Interrupted(DeployError):
    """The operation was stopped by a signal (Ctrl-C, SIGTERM); the engine was cancelled."""

    reason = "Interrupted"
