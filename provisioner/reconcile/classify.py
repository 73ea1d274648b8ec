"""Classify each (Slurm node, worker) pair: one :class:`Finding` per disagreement, each with a
:class:`Kind`, a detail and the actions of :data:`ACTIONS` for that kind. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Mapping

from ..elastic.backend import Worker
from ..elastic.ledger import Policy, PoolHistory, backoff_detail
from ..slurm.state import REASON_PREFIX, NodeStatus

if TYPE_CHECKING:
    from ..inventory import Inventory




# Pending reasons that will not clear by themselves (soon enough): Slurm would only notice them at
# ResumeTimeout. Unschedulable gets a longer bound (a cluster autoscaler may be adding a node).
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError")


UNSCHEDULABLE = "Unschedulable"
DEAD_PHASES = frozenset({"Failed", "Succeeded"})


class Kind(str, Enum):
    OK = "ok"
    ORPHAN_WORKER = "orphan-worker"  # a worker for no node of the inventory / of Slurm
    WORKER_FOR_POWERED_DOWN_NODE = "worker-for-powered-down-node"
    MISSING_WORKER = "missing-worker"  # Slurm has the node up / allocated, no worker exists
    STUCK_PENDING = "stuck-pending"  # Pending for a reason that will not clear in time
    WORKER_FAILED = "worker-failed"  # the worker exited (phase Failed / Succeeded)
    DOWN_WORKER_GONE = "down-worker-gone"  # DOWN by slurmk8s, not powered down, no worker: power it down
    DOWN_POWERED_DOWN = "down-powered-down"  # DOWN+POWERED_DOWN by slurmk8s, no worker: back to idle
    POOL_BACKOFF = "pool-backoff"  # the pool failed too often: resumes are refused for a while
    POOL_RECOVERED = "pool-recovered"  # a worker created after the pool's failures came up
    WORKER_RESTARTED = "worker-restarted"  # the worker's container died under a running job (restarted in place)
    HOST_LOST = "host-lost"  # the worker's Kubernetes node stopped answering (kubelet or node lost)
    NODE_UNAVAILABLE = "node-unavailable"  # Pending for a node the inventory says must not run (cordoned / NotReady)
    WORKER_TAKEN = "worker-taken"  # another actor removes the worker and says why (preempted, evicted)
    IDLE_WORKER_TAKEN = "idle-worker-taken"  # the same for a worker with no job (a drain, a consolidation)
    HOST_INTERRUPTED = "host-interrupted"  # the worker's Kubernetes node has an interruption notice
    IDLE_HOST_INTERRUPTED = "idle-host-interrupted"  # the same, no job on the node
    IDLE_WORKER_GONE = "idle-worker-gone"  # an up, idle node's worker is gone (no job to requeue)
    UNREGISTERED_POWERED_DOWN = "unregistered-powered-down"  # idle~ and NOT_RESPONDING: lost at a reconfigure


class Op(str, Enum):
    DELETE_WORKER = "delete-worker"
    FORCE_DELETE_WORKER = "force-delete-worker"  # at once: its host cannot confirm a graceful end
    SET_DOWN = "set-down"  # scontrol update state=DOWN reason=...: Slurm requeues the node's jobs
    POWER_DOWN = "power-down"  # scontrol update state=POWER_DOWN_FORCE: suspend, then idle~
    RETURN_TO_SERVICE = "return-to-service"  # scontrol update state=RESUME: DOWN~ -> idle~
    RESET_POWER_DOWN = "reset-power-down"  # scontrol update state=POWER_DOWN (no FORCE): idle~ afresh
    RECORD_FAILURE = "record-failure"
    RECORD_SUCCESS = "record-success"


# What each kind of finding makes the loop do, in order (a failing step stops the rest).
ACTIONS: dict[Kind, tuple[Op, ...]] = {
    Kind.OK: (),
    Kind.ORPHAN_WORKER: (Op.DELETE_WORKER,),
    Kind.WORKER_FOR_POWERED_DOWN_NODE: (Op.DELETE_WORKER,),
    Kind.MISSING_WORKER: (Op.SET_DOWN, Op.POWER_DOWN),
    Kind.STUCK_PENDING: (Op.DELETE_WORKER, Op.SET_DOWN, Op.RECORD_FAILURE),
    Kind.WORKER_FAILED: (Op.DELETE_WORKER, Op.SET_DOWN, Op.RECORD_FAILURE),
    Kind.DOWN_WORKER_GONE: (Op.POWER_DOWN,),
    Kind.DOWN_POWERED_DOWN: (Op.RETURN_TO_SERVICE,),
    Kind.POOL_BACKOFF: (),  # the resume program refuses; nothing to do here
    Kind.POOL_RECOVERED: (Op.RECORD_SUCCESS,),
    # the job's processes died with the container, though Slurm still has it RUNNING (slurmd came
    # back with -b and knows nothing of it): DOWN requeues it now, then a fresh pod for the next one
    Kind.WORKER_RESTARTED: (Op.SET_DOWN, Op.POWER_DOWN),
    # the node's jobs are lost with their host: DOWN requeues them now (not after the pod eviction
    # timeout or SlurmdTimeout); the pod is removed from the API at once, so the next resume can
    # create the node's pod elsewhere (its host kills the old one when it answers again); not a
    # failure of the pool: its image and spec are fine
    Kind.HOST_LOST: (Op.SET_DOWN, Op.FORCE_DELETE_WORKER, Op.POWER_DOWN),
    # the pinned node's Kubernetes node is cordoned / NotReady: its pod cannot start there until an
    # operator acts, so waiting out the Unschedulable bound only holds the job; DOWN requeues it now.
    # Not a failure of the pool: counting it would back off the pool's healthy nodes too
    Kind.NODE_UNAVAILABLE: (Op.DELETE_WORKER, Op.SET_DOWN),
    # as MISSING_WORKER, for a pod whose condition says who is removing it (Kueue preempted the job's
    # pod group, the scheduler preempted the pod, an eviction): the DOWN reason names the cause; the
    # worker's preStop hook has requeued the node's jobs already, DOWN requeues any left. Not a
    # failure of the pool
    Kind.WORKER_TAKEN: (Op.SET_DOWN, Op.POWER_DOWN),
    # the same with no job on the node (the PodDisruptionBudget lets a drain or a consolidation
    # evict idle workers): nothing to requeue, so it is suspended at once, never set DOWN
    Kind.IDLE_WORKER_TAKEN: (Op.POWER_DOWN,),
    # the worker's host announced its end (a spot reclaim, a consolidation: notices.py): DOWN
    # requeues the node's jobs now, with SIGTERM and KillWait while the host still runs them, rather
    # than NODE_FAIL once it is gone; the suspend then deletes the pod, and the next resume places
    # the node's pod on another host. Not a failure of the pool
    Kind.HOST_INTERRUPTED: (Op.SET_DOWN, Op.POWER_DOWN),
    # the same with no job: suspended at once, so that no job starts there meanwhile
    Kind.IDLE_HOST_INTERRUPTED: (Op.POWER_DOWN,),
    # as MISSING_WORKER with no job on the node (its preStop hook requeued them, or there was none):
    # nothing to requeue, so it is suspended, never set DOWN
    Kind.IDLE_WORKER_GONE: (Op.POWER_DOWN,),
    # UNDRAIN, and RESUME of a DRAIN or DOWN node, make Slurm 24.11 wait for the node to register
    # again (NOT_RESPONDING), which a powered-down node never does: it stays schedulable only until
    # slurmctld re-reads its state, and a reconfigure or restart then leaves it out of scheduling
    # for good. A plain POWER_DOWN clears the flag (Slurm's suspend does), kills no job (a job
    # allocated meanwhile runs first) and finds no worker to delete
    Kind.UNREGISTERED_POWERED_DOWN: (Op.RESET_POWER_DOWN,),
}


@dataclass(frozen=True)
class Finding:
    node: str  # Slurm node / worker name; the pool name for POOL_* findings
    kind: Kind
    detail: str = ""
    pool: str = ""
    uid: str = ""  # the uid of the worker the finding was made about ('' for none)
    version: str = ""  # and its version then: a delete of the worker is conditional on both

    @property
    def ops(self) -> tuple[Op, ...]:
        return ACTIONS[self.kind]

    @property
    def down_reason(self) -> str:
        """The Slurm node reason for SET_DOWN: names the kind and the pod, one line, no quotes."""
        text = f"{REASON_PREFIX} {self.kind.value}: {self.detail}"
        return " ".join(text.replace('"', "'").split())[:200]

    def describe(self) -> str:
        ops = ", ".join(op.value for op in self.ops) or "nothing"
        return f"{self.node} {self.kind.value}" + (f" [{self.pool}]" if self.pool else "") + \
            (f": {self.detail}" if self.detail else "") + f" -> {ops}"


@dataclass(frozen=True)
class Snapshot:
    nodes: Mapping[str, NodeStatus]  # Slurm's view
    workers: Mapping[str, Worker]  # the backend's view (fetched before the nodes)
    inventory: "Inventory"
    history: Mapping[str, PoolHistory] = field(default_factory=dict)  # pool -> resume failure history
    # node -> (start time, job id) of its oldest running job
    running: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # node -> what the loop has seen of its worker's restart count, this pass included; kept by
    # the loop across passes (:func:`watch_restarts`)
    watched: Mapping[str, RestartWatch] = field(default_factory=dict)
    # node -> (worker uid, when the loop first saw that worker's host not answering): :func:`watch_lost`
    lost: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    # Kubernetes node -> its interruption notice (notices.py), for the hosts that have one
    interrupted: Mapping[str, str] = field(default_factory=dict)
    # node -> who took its worker, gone since (NodeBackend.taken_gone: the pod went between passes)
    taken_gone: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RestartWatch:
    """The loop's memory of one worker's restart count (the kubelet's ``restartCount``)."""

    uid: str  # the worker (pod uid): another pod by the same name starts a new memory
    job: int | None  # the oldest job RUNNING on it at the last pass (None: none)
    before: int  # the count at the last pass before `job` was first seen (0: the loop saw no earlier pass of this pod, which started at 0)
    at_first: int  # the count at the first pass that saw `job` on this worker
    last: int  # the count at the last pass


# Slurm's boot time of a healthy node is at most its registration (job starts come after it) but,
# in whole seconds on both sides, can read a second later; a slurmd restarted under a job starts
# at least a second after it (the container's restart, munged, the wait for slurmctld come first).
# With a slack of 2 s, a job 1.6 s old when its container was killed stayed RUNNING with nothing
# running in one CI run (e2e/test_e2e_drift.py): its restarted slurmd booted 2 s after it started.
BOOT_SLACK = 1.0


def restarted_under_job(name: str, node: NodeStatus, worker: Worker, snapshot: Snapshot) -> bool:
    """Did the worker's container die under the oldest job Slurm has RUNNING on the node?

    Never by comparing the kubelet's clock with slurmctld's (the container's
    ``lastState.terminated.finishedAt`` against the job's start from ``squeue``): a worker's node
    running 2 minutes ahead would requeue every young job that runs on a slurmd restarted just
    before it. Each comparison here stays within one clock, or needs none:

    1. slurmctld's clock: the node's Slurm boot time against the job's start. slurmctld sets the
       boot time to its own clock minus the uptime slurmd reports, which slurmd -b counts from its
       own start; so a slurmd restarted under the job boots after the job started (by more than
       :data:`BOOT_SLACK`), while one the job was launched on booted before it. Seen once the
       restarted slurmd has registered (seconds), on whichever pass sees the job first.
    2. The order of the loop's passes (:attr:`Snapshot.watched`): the kubelet's count went up
       since the first pass that saw this job RUNNING on this worker (same pod uid, same job id).
       Catches a restart whose slurmd has not registered again (crash loop), whatever either
       clock says.
    3. Both together, for a container killed within a second of its job's start, before any pass
       saw the job: the count went up since the last pass before the job was seen (a pod the
       loop never saw started at 0), and the restarted slurmd's boot time is within
       :data:`BOOT_SLACK` of the job's start, where whole seconds cannot order the two. Such a
       job is taken as dead: requeued, where leaving it would keep it RUNNING with nothing
       running until its time limit (a CI run did). The price: a job started within a second of
       a slurmd that crashed while idle, both since the last pass, is requeued once.

    All need the kubelet to report a restart at all (``restarts`` > 0): a fresh pod has none.
    """
    since = snapshot.running.get(name)
    if since is None or worker.phase != "Running" or not node.busy or worker.restarts <= 0:
        return False
    start, job = since
    boot = node.slurm_boot_at
    if boot is not None and boot > start + BOOT_SLACK:
        return True
    seen = snapshot.watched.get(name)
    if seen is None or (seen.uid, seen.job) != (worker.uid, job):
        return False
    if worker.restarts > seen.at_first:
        return True
    return worker.restarts > seen.before and boot is not None and boot >= start - BOOT_SLACK


def watch_restarts(workers: Mapping[str, Worker], running: Mapping[str, tuple[float, int]],
                   previous: Mapping[str, RestartWatch]) -> dict[str, RestartWatch]:
    """This pass's :attr:`Snapshot.watched`, from the last pass's: one entry per worker, with the
    restart counts that :func:`restarted_under_job` compares against."""
    out: dict[str, RestartWatch] = {}
    for name, worker in workers.items():
        job = running[name][1] if name in running else None
        count = worker.restarts
        prev = previous.get(name)
        if prev is None or prev.uid != worker.uid:
            out[name] = RestartWatch(worker.uid, job, 0, count, count)
        elif prev.job == job:
            out[name] = replace(prev, last=count)
        else:
            out[name] = RestartWatch(worker.uid, job, prev.last, count, count)
    return out


def watch_lost(workers: Mapping[str, Worker], previous: Mapping[str, tuple[str, float]],
               now: float) -> dict[str, tuple[str, float]]:
    """This pass's :attr:`Snapshot.lost`: for each worker whose host is not answering, when the loop
    first saw it so (the same pod since); a worker seen answering again starts over."""
    out: dict[str, tuple[str, float]] = {}
    for name, worker in workers.items():
        if worker.host_lost:
            prev = previous.get(name)
            out[name] = prev if prev is not None and prev[0] == worker.uid else (worker.uid, now)
    return out


def _age(since: float | None, now: float) -> float:
    return now - since if since is not None else math.inf


def _worker_words(w: Worker) -> str:
    return f"pod {w.name} {w.phase}" + (f" ({w.reason})" if w.reason else "")


def _stuck_bound(w: Worker, policy: Policy) -> float | None:
    if w.phase != "Pending" or not w.reason:
        return None
    if w.reason.startswith(UNSCHEDULABLE):
        return w.start_bound or policy.unschedulable_timeout
    if w.reason.startswith(STUCK_REASONS):
        return policy.pending_timeout
    return None


def classify_pair(name: str, node: NodeStatus | None, worker: Worker | None, snapshot: Snapshot, now: float,
                  policy: Policy) -> Finding:
    """One (Slurm node, worker) pair -> a Finding (OK when they agree)."""
    inv = snapshot.inventory
    pool = inv[name].pool if name in inv else ""
    if worker is not None and worker.phase != "Terminating" and worker.host_lost and node is not None:
        seen = snapshot.lost.get(name)
        lost_for = now - seen[1] if seen is not None and seen[0] == worker.uid else 0.0
        if lost_for < policy.host_lost_grace:
            return Finding(name, Kind.OK, f"Kubernetes node {worker.host or '?'} not answering for {lost_for:.0f}s "
                                          f"(judged after {policy.host_lost_grace:.0f}s)", pool)
        return Finding(name, Kind.HOST_LOST, f"Kubernetes node {worker.host or '?'} stopped answering "
                                             f"(pod {name} marked not ready by the node controller "
                                             f"{lost_for:.0f}s ago)", pool)
    if (worker is not None and worker.phase == "Running" and worker.host is not None
            and worker.host in snapshot.interrupted and node is not None
            and not (node.down or node.powering or node.powered_down)):
        notice = snapshot.interrupted[worker.host]
        if name in snapshot.running or node.busy:
            job = f" job {snapshot.running[name][1]} requeued:" if name in snapshot.running else ""
            return Finding(name, Kind.HOST_INTERRUPTED, f"{notice}:{job} pod {name} goes with it", pool)
        return Finding(name, Kind.IDLE_HOST_INTERRUPTED, f"{notice}: idle pod {name} goes with it", pool)
    if worker is not None and worker.phase != "Terminating":
        age = _age(worker.created_at, now)
        if name not in inv or node is None:
            where = "the inventory" if name not in inv else "Slurm's nodes"
            if age < policy.grace:
                return Finding(name, Kind.OK, f"new worker not in {where} yet ({age:.0f}s old)", pool)
            return Finding(name, Kind.ORPHAN_WORKER, f"{_worker_words(worker)} is for no node in {where}", pool)
        if node.powered_down:
            if age < policy.grace:
                return Finding(name, Kind.OK, f"worker {age:.0f}s old for a powered-down node: within grace", pool)
            return Finding(name, Kind.WORKER_FOR_POWERED_DOWN_NODE,
                           f"{_worker_words(worker)} exists while Slurm has the node powered down "
                           f"({'+'.join(sorted(node.state))})", pool)
        if "POWERING_DOWN" in node.state:
            return Finding(name, Kind.OK, "powering down: the suspend program removes the worker", pool)
        if worker.phase in DEAD_PHASES:
            if age < policy.grace:
                # seen in the test bed: a container between the backend's create and start calls
                # lists as "created" (phase Failed); a young worker gets the grace period
                return Finding(name, Kind.OK, f"{_worker_words(worker)} but only {age:.0f}s old: within grace", pool)
            if worker.taken:  # the kubelet ended it (Evicted, or Succeeded: pods.taken_by): not the pool's fault
                return _taken(name, node, worker.taken, snapshot, pool)
            return Finding(name, Kind.WORKER_FAILED, f"{_worker_words(worker)}", pool)
        unavailable = inv[name].unavailable
        if worker.phase == "Pending" and unavailable:
            # before the stuck bounds: an Unschedulable pod here is the node's fault, not the pool's.
            # The inventory's reason first: it names the Kubernetes node and survives down_reason's cut
            if age < policy.grace:
                return Finding(name, Kind.OK, f"{unavailable}; {_worker_words(worker)} {age:.0f}s old: "
                                              f"within grace", pool)
            return Finding(name, Kind.NODE_UNAVAILABLE, f"{unavailable}: {_worker_words(worker)} for {age:.0f}s", pool)
        bound = _stuck_bound(worker, policy)
        if bound is not None and age >= bound:
            if worker.reason.startswith(UNSCHEDULABLE):  # the pool's node_start_timeout, or the loop's bound
                return Finding(name, Kind.STUCK_PENDING, f"no Kubernetes node took it in {age:.0f}s: "
                                                         f"{_worker_words(worker)}", pool)
            return Finding(name, Kind.STUCK_PENDING, f"{_worker_words(worker)} for {age:.0f}s", pool)
        if restarted_under_job(name, node, worker, snapshot):
            job_id = snapshot.running[name][1]
            # the kubelet's time of the death, for the reader only (never compared with Slurm's)
            died = "" if worker.died_at is None else \
                f", at {time.strftime('%H:%M:%SZ', time.gmtime(worker.died_at))} by the kubelet's clock"
            return Finding(name, Kind.WORKER_RESTARTED, f"pod {name} container died under job {job_id} "
                                                        f"({worker.died_how or 'restarted'}{died})", pool)
        history = snapshot.history.get(pool)
        if (history and history.failures and worker.phase == "Running" and not node.powering and not node.down
                and worker.created_at is not None and worker.created_at > max(f.at for f in history.failures)):
            return Finding(name, Kind.POOL_RECOVERED, f"pod {name} created after the pool's last failure is up", pool)
        return Finding(name, Kind.OK, "", pool)
    # no worker (or one on its way out)
    if node is None:
        return Finding(name, Kind.OK, "worker terminating", pool)
    if node.powering:
        return Finding(name, Kind.OK, "powering up / down: Slurm's timeouts apply", pool)
    if node.powered_down:
        if node.down_by_us and "DRAIN" in node.state and name in inv and inv[name].unavailable:
            # state=RESUME would clear the cordon's drain with the DOWN (Slurm keeps one reason, ours
            # now, so the drain pass could not tell it was its own): it waits for the uncordon, then
            # RESUME clears both at once
            return Finding(name, Kind.OK, f"DOWN and drained, {inv[name].unavailable}: returned once "
                                          f"available", pool)
        if node.down_by_us:
            return Finding(name, Kind.DOWN_POWERED_DOWN, f"no worker; was set DOWN: {node.reason}", pool)
        if "NOT_RESPONDING" in node.state and "IDLE" in node.state and not {"DOWN", "DRAIN", "FAIL"} & node.state:
            return Finding(name, Kind.UNREGISTERED_POWERED_DOWN, "powered down and NOT_RESPONDING (an undrain or "
                                                                 "resume waits for a registration it never makes)", pool)
        return Finding(name, Kind.OK, "", pool)
    if node.down:
        if node.down_by_us:
            return Finding(name, Kind.DOWN_WORKER_GONE, f"no worker; was set DOWN: {node.reason}", pool)
        return Finding(name, Kind.OK, "DOWN by someone else: left alone", pool)
    if name not in inv:
        return Finding(name, Kind.OK, "not in the inventory: not ours to judge", pool)
    if "FAIL" in node.state and not node.busy:
        # an operator took it out (state=FAIL): powering it down would clear that (idle_on_node_suspend)
        return Finding(name, Kind.OK, "FAIL set by an operator, no job: left alone", pool)
    if _age(node.booted_at, now) < policy.grace:
        return Finding(name, Kind.OK, "just booted: the worker list may predate it", pool)
    idle = name not in snapshot.running and not node.busy
    taken = worker.taken if worker is not None else snapshot.taken_gone.get(name, "")
    if taken:  # on its way out (or gone since the last pass), and the pod said who took it
        return _taken(name, node, taken, snapshot, pool)
    gone = f"pod {name} is gone" + (f" ({worker.phase})" if worker is not None else "")
    if idle:
        return Finding(name, Kind.IDLE_WORKER_GONE, f"{gone} while Slurm has the node "
                                                    f"{'+'.join(sorted(node.state - {'CLOUD'}))}", pool)
    return Finding(name, Kind.MISSING_WORKER,
                   f"{gone} while Slurm has the node {'+'.join(sorted(node.state - {'CLOUD'}))}", pool)


def _taken(name: str, node: NodeStatus, taken: str, snapshot: Snapshot, pool: str) -> Finding:
    """Another actor took the node's worker and said why (`taken`): DOWN naming it under a job,
    powered down when idle; never a failure of the pool."""
    if name not in snapshot.running and not node.busy:
        return Finding(name, Kind.IDLE_WORKER_TAKEN, f"idle pod {name} taken away: {taken}", pool)
    job = f" under job {snapshot.running[name][1]}" if name in snapshot.running else ""
    return Finding(name, Kind.WORKER_TAKEN, f"pod {name} taken away{job}: {taken}", pool)


def classify(snapshot: Snapshot, now: float, policy: Policy = Policy()) -> list[Finding]:
    """Every Slurm node and every worker -> findings (OK ones included), then one per pool in
    backoff. Pure: no I/O, no clock."""
    names = sorted(set(snapshot.nodes) | set(snapshot.workers))
    findings = []
    for n in names:
        finding = classify_pair(n, snapshot.nodes.get(n), snapshot.workers.get(n), snapshot, now, policy)
        worker = snapshot.workers.get(n)
        findings.append(replace(finding, uid=worker.uid, version=worker.version) if worker is not None else finding)
    for pool, history in sorted(snapshot.history.items()):
        detail = backoff_detail(history, now, policy)
        if detail:
            findings.append(Finding(pool, Kind.POOL_BACKOFF, detail, pool))
    return findings
