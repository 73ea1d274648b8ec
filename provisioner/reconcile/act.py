"""One reconcile pass: fetch, classify, act on each finding, report what was done and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..elastic.backend import BackendError, NodeBackend, WorkerReplaced
from ..elastic.ledger import FailureLedger, LedgerError, Policy
from ..slurm.commands import (
    SlurmClient,
    SlurmCommandError,
    down_argv,
    power_down_argv,
    plain_power_down_argv,
    resume_argv,
)
from ..slurm.state import JobStatus, parse_jobs, parse_nodes, running_since
from .classify import Finding, Kind, Op, RestartWatch, Snapshot, classify, watch_lost, watch_restarts

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..logs import Log


RAN_STATES = frozenset({"RUNNING", "COMPLETING", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL",
                        "OUT_OF_MEMORY", "PREEMPTED"})


@dataclass(frozen=True)
class Done:
    finding: Finding
    op: Op
    ok: bool
    error: str = ""
    argv: tuple[str, ...] = ()
    skipped: bool = False  # not done: the worker judged was replaced meanwhile (the finding is stale)

    @property
    def outcome(self) -> str:
        return "skipped" if self.skipped else "ok" if self.ok else "failed"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    done: list[Done] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what kept the pass from seeing everything
    snapshot: Snapshot | None = None
    jobs: list[JobStatus] | None = None  # the queue as this pass read it (None: unreadable)
    queue_asked: bool = False  # whether this pass asked for the queue (then None means it failed)

    def of(self, kind: Kind) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def acted(self) -> list[Finding]:
        return [f for f in self.findings if f.ops]


def _do(op: Op, finding: Finding, slurm: SlurmClient, backend: NodeBackend, ledger: FailureLedger,
        now: float, scontrol: str) -> tuple[str, ...]:
    """Carry out one op; returns the argv it ran (Slurm ops). Raises on failure."""
    name = finding.node
    if op in (Op.DELETE_WORKER, Op.FORCE_DELETE_WORKER):
        # only the worker judged, as judged: never its replacement, nor the same pod since adopted
        # by a resume (uid and version preconditions); one gone already raises WorkerGone
        backend.delete(name, finding.uid or None, force=op is Op.FORCE_DELETE_WORKER,
                       version=(finding.version or None) if finding.uid else None)
        return ()
    if op is Op.SET_DOWN:
        argv = down_argv([name], finding.down_reason, scontrol)
    elif op is Op.POWER_DOWN:
        argv = power_down_argv([name], scontrol)
    elif op is Op.RETURN_TO_SERVICE:
        argv = resume_argv([name], scontrol)
    elif op is Op.RESET_POWER_DOWN:
        argv = plain_power_down_argv([name], scontrol)
    elif op is Op.RECORD_FAILURE:
        ledger.record_failure(finding.pool or "unknown", name, finding.down_reason, now, finding.uid)
        return ()
    elif op is Op.RECORD_SUCCESS:
        ledger.record_success(finding.pool, now)
        return ()
    else:  # pragma: no cover - every Op is handled above
        raise ValueError(f"unknown op {op}")
    slurm.update(argv)
    return tuple(argv)


def run_once(slurm: SlurmClient, backend: NodeBackend, inventory: "Inventory", ledger: FailureLedger, now: float,
             log: "Log", policy: Policy = Policy(), scontrol: str = "scontrol",
             restart_watch: dict[str, RestartWatch] | None = None,
             lost_watch: dict[str, tuple[str, float]] | None = None,
             interrupted: Mapping[str, str] | None = None) -> Report:
    """Fetch, classify, act, log. Never raises for a failing backend, Slurm or ledger: the
    errors are in the report and the log, and the next pass tries again.

    `restart_watch`: the loop's memory of each worker's restart count across passes (see
    :func:`~provisioner.reconcile.classify.restarted_under_job`); updated in place. `lost_watch`: since
    when each worker's host has not answered (:func:`~provisioner.reconcile.classify.watch_lost`);
    updated in place. `interrupted`: the Kubernetes nodes with an interruption notice (notices.py).
    A pass that cannot read the queue leaves it as it was."""
    report = Report()
    try:
        # first: a worker missing here was missing before Slurm's answer too (in the loop a watch's
        # view, which trails the API by the time an event takes to arrive; the DOWN re-check below asks the API)
        workers = backend.list()
    except BackendError as err:
        report.errors.append(f"cannot list workers: {err.reason}")
        log.write(f"pass skipped: {report.errors[-1]}")
        if lost_watch is not None:
            # the API away: its node controller judges nodes by heartbeats that could not reach it
            # meanwhile, and marks healthy nodes' pods not ready when it is back; start over
            lost_watch.clear()
        return report
    try:
        nodes = parse_nodes(slurm.show_nodes())
    except SlurmCommandError as err:
        report.errors.append(f"cannot read Slurm's nodes: {err}")
        log.write(f"pass skipped: {report.errors[-1]}")
        return report
    try:
        history = ledger.load()
    except LedgerError as err:
        report.errors.append(str(err))
        log.write(f"{err}; classifying without failure history")
        history = {}
    report.queue_asked = True
    try:
        report.jobs = parse_jobs(slurm.jobs())
    except SlurmCommandError as err:
        log.write(f"cannot read the queue ({err}); workers restarted under a job are judged next pass")
    running = running_since(report.jobs or ())
    watched = dict(restart_watch or {})
    if report.jobs is not None:
        watched = watch_restarts(workers, running, watched)
        if restart_watch is not None:
            restart_watch.clear()
            restart_watch.update(watched)
    lost = watch_lost(workers, lost_watch or {}, now)
    if lost_watch is not None:
        lost_watch.clear()
        lost_watch.update(lost)
    try:
        taken_gone = dict(backend.taken_gone())
    except BackendError:
        taken_gone = {}
    snapshot = Snapshot(nodes, workers, inventory, history, running, watched, lost, dict(interrupted or {}),
                        taken_gone)
    report.snapshot = snapshot
    report.findings = classify(snapshot, now, policy)
    todo = report.acted
    if any(f.kind is Kind.MISSING_WORKER for f in todo):
        # DOWN kills the node's jobs: look once more, a resume may have created the worker meanwhile
        # (asked of the API for these nodes: never a cached view)
        try:
            again = backend.list(sorted({f.node for f in todo if f.kind is Kind.MISSING_WORKER}))
        except BackendError as err:
            again = workers
            log.write(f"could not re-list workers before setting nodes DOWN: {err.reason}")
        for f in [f for f in todo if f.kind is Kind.MISSING_WORKER and f.node in again]:
            log.write(f"{f.node}: worker appeared meanwhile; not setting it DOWN")
            todo.remove(f)
    for finding in todo:
        steps = []
        for op in finding.ops:
            try:
                argv = _do(op, finding, slurm, backend, ledger, now, scontrol)
            except WorkerReplaced as err:
                # the worker is not the one judged any more: a resume replaced it or adopted it
                # since the list, or another removed it (WorkerGone: the attempt may have ended and
                # the node's next begun, its pod not made yet). The finding is stale: the node's
                # attempt now is not set DOWN nor counted for it; the next pass judges what is there
                report.done.append(Done(finding, op, False, err.reason, skipped=True))
                steps.append(f"{op.value} skipped, and the rest: {err.reason}")
                break
            except (BackendError, SlurmCommandError, LedgerError) as err:
                error = err.reason if isinstance(err, BackendError) else str(err)
                report.done.append(Done(finding, op, False, error))
                steps.append(f"{op.value} FAILED ({error})")
                break
            report.done.append(Done(finding, op, True, "", argv))
            steps.append(f"{op.value} ok")
        log.write(f"{finding.node} {finding.kind.value}" + (f" [{finding.pool}]" if finding.pool else "")
                  + f": {finding.detail} -> {', '.join(steps)}")
    for f in report.of(Kind.POOL_BACKOFF):
        log.write(f"pool {f.pool} in backoff: {f.detail}")
    return report
