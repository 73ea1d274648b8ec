"""Worker pods under Kueue (a pool's ``kueue:``): Kueue's names, and the pod groups of a resume.

Standard library only: the power-saving programs import it on their hot path.

A pool with ``kueue: {queue: <LocalQueue>}`` gives its worker pods Kueue's queue label; Kueue's
webhook gates every such pod at its creation and lifts the gates once the pod's workload fits the
ClusterQueue's quota. The pods that one power-up creates for one Slurm job are one Kueue *pod
group*: one workload, admitted whole or not at all, so a job never holds part of its nodes while
it waits for the rest (Kueue's plain-Pod integration, v0.17):

- label ``kueue.x-k8s.io/pod-group-name``: a name new with each power-up of the job (a name used
  again would join an old workload and could bypass its quota), and annotation
  ``kueue.x-k8s.io/pod-group-total-count``: how many pods the group will have;
- annotation ``kueue.x-k8s.io/retriable-in-group: "false"``: a worker pod never succeeds (it is
  deleted when Slurm suspends its node), and this tells Kueue that the group is done once none
  of its pods is active, rather than waiting for replacements;
- annotation ``kueue.x-k8s.io/role-hash``: the pods of one size are one pod set, whatever node
  each is pinned to (Kueue's own hash would count each pinned pod as a role of its own, and a
  workload holds at most 8).

Kueue keeps a finalizer on the pods it manages until their whole group is done; the backend
removes it from a pod it deletes, so that the node's next worker (same name) is not held up by
the rest of the group (see :mod:`provisioner.elastic.k8s_backend`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

# Kueue's names (sigs.k8s.io/kueue v0.17: pkg/controller/jobs/pod/constants, pkg/constants)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass
MANAGED_LABEL = "kueue.x-k8s.io/managed"  # Kueue's webhook sets it ("true"); also its finalizer's name
FINALIZER = MANAGED_LABEL
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE = "kueue.x-k8s.io/retriable-in-group"
ROLE_HASH = "kueue.x-k8s.io/role-hash"
# the scheduling gates Kueue's webhook adds (topology: Topology Aware Scheduling, on by default)
GATES = ("kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology")

GROUP_PREFIX = "slurm-job"  # a group is named slurm-job<id>-<token>
# Kueue's objects: a pod group's Workload is named after the group (v1beta2: Kueue 0.17's storage version)
GROUP = "kueue.x-k8s.io"
API = f"{GROUP}/v1beta2"
WORKLOADS = "workloads"
WAITING = "slurmk8s: waiting for Kueue"  # how a job's comment starts while Kueue holds its pods
# ... and while a worker pod of the job waits for a Kubernetes node (an autoscaler adding one)
NODE_WAITING = "slurmk8s: waiting for a Kubernetes node"
OURS = (WAITING, NODE_WAITING)
COMMENT_MAX = 400  # the part of the Workload's condition a comment carries


def role_hash(pool: str, requests: Mapping[str, str]) -> str:
    """The pod set of a worker pod in its group: its pool and size (8 hex digits, as Kueue's own)."""
    text = json.dumps({"pool": pool, "requests": dict(sorted(requests.items()))}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class PodGroup:
    name: str
    total: int

    @property
    def job(self) -> int | None:
        return job_of(self.name)


def job_of(group: str) -> int | None:
    """The Slurm job a group of ours was made for (None for another name)."""
    if not group.startswith(GROUP_PREFIX):
        return None
    head = group[len(GROUP_PREFIX):].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def new_token(clock: float | None = None) -> str:
    """A part of a group's name that differs with each power-up: milliseconds (base 36) and 3 random
    bytes, so two power-ups of one job never share a group."""
    ms = int((time.time() if clock is None else clock) * 1000)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while ms:
        ms, d = divmod(ms, 36)
        out = digits[d] + out
    return f"{out or '0'}{os.urandom(3).hex()}"


@dataclass(frozen=True)
class Member:
    """A live worker pod that belongs to a group: its node, the group it names and whether Kueue
    still gates it (not admitted yet)."""

    node: str
    group: str
    total: int
    gated: bool = True


def assign_groups(jobs: Sequence[tuple[int, Sequence[str]]], queue_of: Mapping[str, str],
                  members: Iterable[Member], token: str) -> dict[str, PodGroup]:
    """The group of each node a power-up creates a worker pod for, by job.

    `jobs`: each job and the nodes whose pods are created for it now, in order; `queue_of`: the
    LocalQueue of each node's pool (nodes of other pools get no group); `members`: the live pods
    that already belong to a group (e.g. those the prolog's head start made). One job's pods in
    one queue are one group: a group of that job still forming (short of its total, none of its
    pods admitted: a create that failed before) takes the first of them, the rest form a new
    group, named with `token`. A node is
    in one job's group only, the first job's that lists it."""
    forming: dict[tuple[int, str], list[tuple[str, int, int]]] = {}
    counts: dict[str, int] = {}
    totals: dict[str, int] = {}
    admitted: set[str] = set()  # a group admitted once had all its pods: one it lost is not replaced
    for mem in members:
        counts[mem.group] = counts.get(mem.group, 0) + 1
        totals[mem.group] = mem.total
        if not mem.gated:
            admitted.add(mem.group)
    queue_by_member = {mem.group: queue_of.get(mem.node, "") for mem in members}
    for group, count in sorted(counts.items()):
        job = job_of(group)
        if job is not None and totals[group] > count and group not in admitted:
            forming.setdefault((job, queue_by_member[group]), []).append((group, totals[group], count))
    out: dict[str, PodGroup] = {}
    for job, nodes in jobs:
        by_queue: dict[str, list[str]] = {}
        for node in nodes:
            if node in out or not queue_of.get(node):
                continue
            by_queue.setdefault(queue_of[node], []).append(node)
        for i, (queue, todo) in enumerate(sorted(by_queue.items())):
            for group, total, count in forming.get((job, queue), ()):
                take, todo = todo[:total - count], todo[total - count:]
                out.update((node, PodGroup(group, total)) for node in take)
            if todo:  # one group per queue: a job across two queues' pools gets -0, -1
                name = f"{GROUP_PREFIX}{job}-{token}" + (f"-{i}" if len(by_queue) > 1 else "")
                out.update((node, PodGroup(name, len(todo))) for node in todo)
    return out


def why_waiting(queue: str, group: str, workload: Mapping[str, Any] | None, present: int, total: int) -> str:
    """What a job whose pods Kueue still gates waits for, in words for its Slurm comment: the
    Workload's condition that holds it back (QuotaReserved or Admitted False: the ClusterQueue's
    missing quota, an oversize group, an inactive queue), or, before the group's last pod exists
    (Kueue makes no Workload until then), how many of its pods exist."""
    head = f"{WAITING} (queue {queue or '?'}, pod group {group})"
    if workload is None:
        return f"{head}: {present} of {total} pods created, Kueue admits the group once all exist"
    for kind in ("QuotaReserved", "Admitted"):
        cond = _false(workload, kind)
        if cond is not None:
            text = " ".join(str(cond.get("message") or cond.get("reason") or "not admitted").split())
            return f"{head}: {text}"[:COMMENT_MAX]
    return f"{head}: admitted, the pods are starting"


def lacks_unused_quota(workload: Mapping[str, Any]) -> bool:
    """Whether the Workload waits because quota it fits is in use (Kueue's QuotaReserved False,
    "insufficient unused quota ..."): what an idle node of the queue handing its share on can end."""
    cond = _false(workload, "QuotaReserved")
    return cond is not None and "insufficient unused quota" in str(cond.get("message") or "")


def _false(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The Workload's condition of type `kind` when its status is False (the last one of that type)."""
    conditions = {str(c.get("type")): c for c in (workload.get("status") or {}).get("conditions") or ()}
    cond = conditions.get(kind)
    return cond if cond is not None and cond.get("status") == "False" else None


@dataclass(frozen=True)
class Wait:
    """One job's pods held by Kueue, from the workers listed: the group and how many of its pods exist."""

    job: int
    group: str
    queue: str
    present: int
    total: int


def waits(workers: Iterable[Any], pool_of: Mapping[str, str], queue_of_pool: Mapping[str, str]) -> dict[int, Wait]:
    """The jobs whose Kueue pod group is not admitted yet (any pod of it still gated), by job id, from
    the workers (:class:`provisioner.elastic.backend.Worker`: ``name``, ``group``, ``group_total``,
    ``gated``). A job with groups in two queues is listed with the first of them by name."""
    present: dict[str, int] = {}
    held: dict[str, tuple[int, str, int]] = {}
    for w in workers:
        if not w.group:
            continue
        present[w.group] = present.get(w.group, 0) + 1
        job = job_of(w.group)
        if w.gated and job is not None:
            held[w.group] = (job, queue_of_pool.get(pool_of.get(w.name, ""), ""), w.group_total)
    out: dict[int, Wait] = {}
    for group in sorted(held):
        job, queue, total = held[group]
        out.setdefault(job, Wait(job, group, queue, present[group], total))
    return out


def why_no_node(node: str, pod: str, reason: str) -> str:
    """What a job whose worker pod the scheduler cannot place yet waits for (its PodScheduled message)."""
    return f"{NODE_WAITING} for {node} (pod {pod} {reason})"[:COMMENT_MAX]


def comment_updates(comments: Mapping[int, str], why: Mapping[int, str]) -> dict[int, str]:
    """The Slurm job comments to write (job id -> comment; "" clears): `why` for each waiting job
    whose comment is empty or an older one of ours, and "" for a job whose comment is ours but that
    waits no longer. A comment the job's owner set is never touched. `comments`: the queue's jobs."""
    out: dict[int, str] = {}
    for job, current in comments.items():
        ours = current.startswith(OURS)
        if job in why and (ours or not current) and current != why[job]:
            out[job] = why[job]
        elif job not in why and ours:
            out[job] = ""
    return out
