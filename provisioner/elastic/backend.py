"""The node-backend interface: how a Slurm node's worker (a pod, a container) is created and removed.

The resume/suspend programs decide *what* to do (see ``plan``); a backend only *does* it. Every
method is idempotent: creating a worker that exists, or deleting one that is gone, is a no-op. A
delete made because of what one worker did names that worker's uid (and the version judged), so its
replacement, or the same worker since adopted by a resume, is never removed in its stead.
Errors are raised as :class:`BackendError` with a short reason that ends up as the Slurm node's
DOWN reason, so it must say what went wrong in words an operator can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from ..errors import SlurmK8sError
from ..inventory import SlurmNode
from ..kueue import PodGroup
from ..settings import Programs


class BackendError(SlurmK8sError):
    def __init__(self, node: str, reason: str, *, retryable: bool = False) -> None:
        self.node = node
        self.reason = reason
        self.retryable = retryable
        super().__init__(f"{node}: {reason}")


class WorkerReplaced(BackendError):
    """``delete(name, uid)``: the node's worker is not the one judged any more (a resume replaced it,
    or, with a `version`, it changed since: a resume adopted it); nothing was deleted."""


class WorkerGone(WorkerReplaced):
    """``delete(name, uid)``: the worker `uid` is gone already, removed by someone else (the
    resume-fail or suspend program, a resume replacing it); nothing was deleted. What was judged
    about it is stale: the node may be on its next attempt already."""


@dataclass(frozen=True)
class Worker:
    """What a backend knows about one worker."""

    name: str  # the Slurm node name
    phase: str  # Pending | Running | Succeeded | Failed | Unknown | Terminating
    reason: str = ""  # e.g. "Unschedulable: 0/3 nodes are available", "ErrImageNeverPull"
    created_at: float | None = None  # epoch seconds
    host: str | None = None  # Kubernetes node / Docker host it runs on
    ready_at: float | None = None  # epoch seconds it became Ready, where the backend knows it
    # the worker's container died and was restarted in place (restartPolicy Always): when it last
    # died and how, where the backend knows it; a job running on it then lost its processes
    died_at: float | None = None
    died_how: str = ""  # e.g. "Error (exit 137)"
    # how many times the worker's containers were restarted in place (the kubelet's restartCount;
    # 0 where the backend does not know). Only ever compared with an earlier count of the same worker
    restarts: int = 0
    # this worker's identity: the pod's metadata.uid, the container's id. A node's next worker has
    # the same name but another uid: one resume attempt, one uid
    uid: str = ""
    # the worker's host stopped answering: Kubernetes' node controller marked the pod not ready
    # (Ready False) while its containers were last seen ready, as it does for every pod of a node
    # whose kubelet stopped posting status (NotReady / Unknown, after node-monitor-grace-period)
    host_lost: bool = False
    # the version of the worker as listed (the pod's metadata.resourceVersion; '' where the backend
    # has none): any write to the pod changes it, a resume's adoption included (NodeBackend.adopt)
    version: str = ""
    # the Kueue pod group the worker belongs to and the group's size ('' and 0: none)
    group: str = ""
    group_total: int = 0
    gated: bool = False  # Kueue holds it back (its scheduling gates): not admitted yet
    # who is taking the worker away and why, where the pod says so (a condition another controller
    # set before deleting it: Kueue's TerminationTarget on preemption, Kubernetes' DisruptionTarget
    # on a scheduler preemption, an eviction, a taint or the kubelet); '' when it does not
    taken: str = ""
    # the worker carries the busy marks (names.BUSY_ANNOTATIONS: autoscalers leave its node alone;
    # names.L_BUSY: the PodDisruptionBudget refuses its eviction); None: only some of them
    busy_marked: bool | None = False
    # how long it may wait Unschedulable for a Kubernetes node to come (its pool's node_start_timeout,
    # in seconds); None: the loop's own bound (Policy.unschedulable_timeout)
    start_bound: float | None = None


class NodeBackend(Protocol):
    def create(self, node: SlurmNode, group: PodGroup | None = None) -> None:
        """Create the node's worker (or keep the one there, same spec). `group`: the Kueue pod
        group it joins (a pool under Kueue, one power-up of a job); a backend without Kueue
        ignores it."""

    def delete(self, name: str, uid: str | None = None, force: bool = False, version: str | None = None) -> None:
        """Remove the node's worker. With `uid`, only that worker: another worker by the name now
        raises :class:`WorkerReplaced` and is left alone, one gone already :class:`WorkerGone`
        (nothing to delete, and what was judged about it is stale). With `version` too, only that
        worker as it was then: a worker changed since (adopted by a resume) raises WorkerReplaced.
        With `force`, at once (no grace period): for a worker whose host stopped answering, which
        could not confirm a graceful end; its host kills what is left when it answers again."""
        ...

    def adopt(self, name: str, uid: str, version: str = "") -> bool:
        """A resume keeps the node's live worker `uid` (listed at `version`) for this attempt, and
        records it on the worker where the backend can, so that a delete judged before, conditional
        on that version, is refused. False when the worker is not kept (gone, replaced, being
        deleted or dead, a delete having come first): the caller creates the node's worker."""
        ...

    def list(self, names: Sequence[str] | None = None) -> Mapping[str, Worker]:
        """The workers, by Slurm node name: all of them, or those of `names` only (the backend may
        ask its API for just those, so a call about a few nodes costs the same in a cluster of any
        size)."""
        ...

    def queues(self) -> Mapping[str, str]:
        """The Kueue LocalQueue of each pool under Kueue (pool -> queue); empty without Kueue."""
        ...

    def taken_gone(self) -> Mapping[str, str]:
        """Workers gone in the last minutes whose last state said who took them (Worker.taken), by
        Slurm node name: a preemption or an eviction whose pod went between two passes is still
        named. Empty for a backend that cannot tell."""
        ...

    def mark_busy(self, name: str, uid: str, busy: bool) -> bool:
        """Write (busy) or remove the busy marks on the node's worker `uid` (Karpenter's
        do-not-disrupt, cluster-autoscaler's safe-to-evict, the label the workers' PodDisruptionBudget
        selects). False when that worker is gone or replaced; a backend without autoscalers does
        nothing. Raises BackendError."""
        ...

    def workload(self, group: str) -> Mapping[str, Any] | None:
        """The Kueue Workload of pod group `group` (None: none yet, or a backend without Kueue).
        Raises BackendError when the API does not answer."""
        ...


class BackendFactory(Protocol):
    def __call__(self, env: Mapping[str, str]) -> NodeBackend: ...


# SLURMK8S_BACKEND value -> "module:function"; the function takes the environment and returns a
# NodeBackend. Imported lazily, so a backend's dependencies load only where it is used.
BACKENDS: dict[str, str] = {
    "docker": "provisioner.elastic.docker_backend:from_env",
    "kubernetes": "provisioner.elastic.k8s_backend:from_env",
}


def backend_from_env(env: Mapping[str, str]) -> NodeBackend:
    """The backend named by SLURMK8S_BACKEND (default: docker), configured from `env`."""
    import importlib

    name = Programs.from_env(env).backend
    target = BACKENDS.get(name)
    if target is None:
        raise BackendError("*", f"unknown SLURMK8S_BACKEND={name!r}; known: {', '.join(sorted(BACKENDS))}")
    module, _, func = target.partition(":")
    factory: BackendFactory = getattr(importlib.import_module(module), func)
    return factory(env)
