"""Autoscalers see which workers are busy (issue 42): a worker pod carries Karpenter's
``karpenter.sh/do-not-disrupt: "true"`` and cluster-autoscaler's
``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` while a job runs on its node, and
neither once the node is idle, so consolidation or scale-down never takes a node from under a
running job and is never blocked by an idle worker. (Karpenter reads the annotation's presence:
it is removed, never set "false".)

Each pass, after the reconcile itself, :func:`mark` compares the workers the pass listed with the
jobs it read and writes only the changes (one merge patch each, the pod's uid as precondition).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..elastic.backend import BackendError, NodeBackend

if TYPE_CHECKING:
    from ..elastic.programs import Log
    from .classify import Snapshot


def changes(snapshot: "Snapshot") -> dict[str, bool]:
    """Worker -> busy, for each Running worker whose annotations disagree with Slurm's jobs (pure)."""
    out: dict[str, bool] = {}
    for name, w in sorted(snapshot.workers.items()):
        if w.phase != "Running" or not w.uid:
            continue
        busy = name in snapshot.running
        if busy != w.busy_marked:
            out[name] = busy
    return out


def mark(backend: NodeBackend, snapshot: "Snapshot", log: "Log") -> list[str]:
    """Write the changes; returns the errors (logged). Never raises."""
    errors = []
    for name, busy in changes(snapshot).items():
        try:
            if backend.mark_busy(name, snapshot.workers[name].uid, busy):
                log.write(f"{name}: {'busy: autoscalers keep its node' if busy else 'idle: its node may be scaled down'}")
        except BackendError as err:
            errors.append(f"cannot mark {name} {'busy' if busy else 'idle'}: {err.reason}")
            log.write(errors[-1])
    return errors
