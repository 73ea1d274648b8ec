"""A job whose worker pods Kueue holds back says why, in its Slurm comment (issue 41).

Kueue gates the pods of a pool under a queue until their pod group fits the ClusterQueue's quota.
Meanwhile Slurm shows the job CONFIGURING with no reason a researcher could act on. Each pass,
after the reconcile itself, :func:`explain` finds the jobs with a gated group (from the workers the
pass listed), reads each group's Workload and writes what holds it back into the job's comment
(``scontrol show job`` prints ``Comment=``, ``squeue -O comment`` a column):

    slurmk8s: waiting for Kueue (queue team-a, pod group slurm-job7-...): couldn't assign flavors
    to pod set 3f2a...: insufficient unused quota for cpu in flavor default, 2 more needed

and clears it once Kueue admits the group. A comment the job's owner gave it is left alone. The
wait itself is not a failure: the nodes stay powering up, the pool is never backed off for it, and
ResumeTimeout bounds it (Slurm then requeues the job, reason "ResumeTimeout reached").

While a job waits for quota its queue may still hold quota it does not use: a node of the queue's
pools left idle by an ended job keeps its admitted pod until Slurm suspends it at SuspendTime
(300 s by default), and the waiting job would wait as long. :func:`hand_over` powers such nodes
down at once, as many as the waiting pod groups have pods: their pods go, Kueue releases their
quota and admits the waiting group (its next requeue batch, ~1 s). Only for a Workload that lacks
*unused* quota (a group larger than the quota, or an inactive queue, gains nothing from it), and only
nodes Slurm reports plain idle (no job, not planned for one, not reserved, draining or leaving).

The same for a job whose worker pod the scheduler cannot place yet (Unschedulable: a cluster
autoscaler may be adding a node, within the pool's node_start_timeout), in any pool:

    slurmk8s: waiting for a Kubernetes node for gpu-3 (pod gpu-3 Pending (Unschedulable: 0/5 nodes
    are available: 5 Insufficient nvidia.com/gpu. ...))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import hostlist

from .. import kueue
from ..elastic.backend import BackendError, NodeBackend
from ..slurm.commands import SlurmClient, SlurmCommandError, plain_power_down_argv
from ..slurm.state import JobStatus
from .classify import UNSCHEDULABLE

if TYPE_CHECKING:
    from ..elastic.programs import Log
    from .classify import Snapshot

LIVE = ("PENDING", "RUNNING", "SUSPENDED")  # a job whose comment may change (an ended one's is history)
MAX_READS = 32  # Workloads read in one pass: a queue of thousands waiting costs a bounded pass
HOLDING = (*LIVE, "COMPLETING")  # a job whose nodes are its own (an ended job's list is history)
IDLE = frozenset({"IDLE", "CLOUD"})  # a node up, with no job and no plan, reservation, drain or power change


def explain(slurm: SlurmClient, backend: NodeBackend, snapshot: "Snapshot", jobs: Sequence[JobStatus],
            log: "Log", scontrol: str = "scontrol") -> list[str]:
    """Write (or clear) the Kueue comment of each job of `jobs` as its pods stand in `snapshot`;
    returns the errors (logged too). Never raises."""
    queues = backend.queues()
    pool_of = {n.name: n.pool for n in snapshot.inventory.nodes}
    waits = kueue.waits(snapshot.workers.values(), pool_of, queues) if queues else {}
    comments = {j.job_id: j.comment for j in jobs if j.state in LIVE}
    errors: list[str] = []
    why = no_node(snapshot, jobs)
    short: dict[str, list[kueue.Wait]] = {}  # queue -> the waits that lack unused quota in it
    for job, wait in list(waits.items())[:MAX_READS]:
        if job not in comments:
            continue
        try:
            workload = backend.workload(wait.group) if wait.present >= wait.total else None
        except BackendError as err:
            errors.append(f"cannot read Kueue's Workload {wait.group}: {err.reason}")
            continue
        why[job] = kueue.why_waiting(wait.queue, wait.group, workload, wait.present, wait.total)
        if workload is not None and kueue.lacks_unused_quota(workload):
            short.setdefault(wait.queue, []).append(wait)
    for job in waits.keys() - why.keys():  # not read this pass: the comment stays as it is
        comments.pop(job, None)
    for job, text in sorted(kueue.comment_updates(comments, why).items()):
        try:
            slurm.update([scontrol, "update", f"jobid={job}", f"comment={text}"])
        except SlurmCommandError as err:
            errors.append(f"cannot set job {job}'s comment: {err}")
            continue
        log.write(f"job {job}: {text}" if text else f"job {job}: its pods are admitted and placed, comment cleared")
    for error in errors:
        log.write(error)
    return errors + hand_over(slurm, snapshot, jobs, short, queues, log, scontrol)


def hand_over(slurm: SlurmClient, snapshot: "Snapshot", jobs: Sequence[JobStatus],
              short: Mapping[str, Sequence[kueue.Wait]], queue_of_pool: Mapping[str, str], log: "Log",
              scontrol: str = "scontrol") -> list[str]:
    """Power down idle nodes of each queue in `short` (queue -> the waits lacking unused quota
    there), as many as those waits' groups have pods: plain POWER_DOWN takes an idle node out of
    scheduling and suspends it (a job given it meanwhile runs first). Returns the errors (logged);
    a refused update is tried again next pass, a node already powering down is not picked again."""
    if not short:  # the common pass: no job lacks quota a node of its queue could hand on
        return []
    held = {n for j in jobs if j.state in HOLDING for n in j.nodes}
    errors: list[str] = []
    for queue, waiting in sorted(short.items()):
        idle = [n.name for n in snapshot.inventory.nodes
                if queue_of_pool.get(n.pool) == queue and n.name not in held and _holds_quota(snapshot, n.name)]
        take = idle[:sum(w.total for w in waiting)]
        if not take:
            continue
        names, job = hostlist.collect_hostlist(take), waiting[0].job
        try:
            slurm.update(plain_power_down_argv(take, scontrol))
        except SlurmCommandError as err:
            errors.append(f"cannot power down {names} for job {job}'s quota: {err}")
            log.write(errors[-1])
            continue
        log.write(f"{names}: powered down to hand their Kueue quota to job {job} (queue {queue})")
    return errors


def _holds_quota(snapshot: "Snapshot", name: str) -> bool:
    """Whether node `name` is plain idle in Slurm while its worker pod is admitted and running."""
    node, worker = snapshot.nodes.get(name), snapshot.workers.get(name)
    return (node is not None and worker is not None and "IDLE" in node.state and node.state <= IDLE
            and worker.phase == "Running" and not worker.gated)


def no_node(snapshot: "Snapshot", jobs: Sequence[JobStatus]) -> dict[int, str]:
    """The comment of each job waiting for its nodes (allocated, PENDING) one of whose worker pods
    the scheduler cannot place: the first such node's pod and the scheduler's message."""
    out: dict[int, str] = {}
    for job in jobs:
        if job.state != "PENDING":
            continue
        for node in job.nodes:
            w = snapshot.workers.get(node)
            if w is not None and w.phase == "Pending" and not w.gated and w.reason.startswith(UNSCHEDULABLE):
                out[job.job_id] = kueue.why_no_node(node, w.name, f"{w.phase} ({w.reason})")
                break
    return out
