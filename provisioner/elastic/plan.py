"""What the resume / suspend / resume-fail programs should do, decided per node, with a reason.

Pure: no I/O, no clock. The programs gather the inputs (the hostlist Slurm passed, the parsed
``SLURM_RESUME_FILE``, the inventory, the backend's current workers), call a ``plan_*`` function,
log every :class:`Decision` and then carry out only the actions it names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

import hostlist

from ..errors import SlurmK8sError
from ..inventory import Inventory, SlurmNode
from ..kueue import Member, PodGroup, assign_groups
from .backend import Worker

# Worker phases that mean "this worker will (or does) run slurmd for its node".
LIVE_PHASES = frozenset({"Pending", "Running"})


class Action(str, Enum):
    CREATE = "create"  # create the node's worker
    REPLACE = "replace"  # remove a dead worker, then create a new one
    DELETE = "delete"  # remove the node's worker
    ADOPT = "adopt"  # keep the node's live worker for this attempt, recorded on it (else create one)
    NOTHING = "nothing"  # already as wanted
    FAIL = "fail"  # cannot act: set the node DOWN with the decision's detail as reason


class Reason(str, Enum):
    RESUME = "resume"  # Slurm resumes the node, no worker exists
    ALREADY_RUNNING = "already-running"  # Slurm resumes the node, its worker is up or starting
    WORKER_DEAD = "worker-dead"  # Slurm resumes the node, its old worker exited / is terminating
    UNKNOWN_NODE = "unknown-node"  # the node is not in the inventory (stale slurm.conf?)
    UNAVAILABLE = "unavailable"  # the inventory says the node must not run (cordoned k8s node...)
    SUSPEND = "suspend"  # Slurm suspends the node, its worker exists
    ALREADY_GONE = "already-gone"  # Slurm suspends / gave up on the node, no worker exists
    RESUME_FAILED = "resume-failed"  # Slurm gave up on the node (ResumeTimeout): remove its worker
    BACKOFF = "backoff"  # the node's pool failed to resume too often lately: refused for a while


@dataclass(frozen=True)
class Decision:
    node: str
    action: Action
    reason: Reason
    detail: str = ""
    slurm_node: SlurmNode | None = None  # for CREATE / REPLACE
    jobs: tuple[int, ...] = ()  # jobs Slurm resumes the node for (from SLURM_RESUME_FILE)
    uid: str = ""  # REPLACE: the dead worker to remove (only that one, not one that replaced it); ADOPT: the one kept
    version: str = ""  # ADOPT: the kept worker's version as listed (the adoption's write is conditional on it)
    group: PodGroup | None = None  # CREATE / REPLACE / ADOPT of a pool under Kueue: the pod group it joins

    def describe(self) -> str:
        jobs = f" jobs={','.join(map(str, self.jobs))}" if self.jobs else ""
        group = f" group={self.group.name}/{self.group.total}" if self.group else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.node} {self.action.value} ({self.reason.value}){jobs}{group}{detail}"


# ---------------------------------------------------------------- inputs


class InputError(SlurmK8sError, ValueError):
    """Slurm handed us something we cannot read (a bad hostlist or resume file)."""


def parse_hostlist(expr: str) -> list[str]:
    """A Slurm hostlist expression ('cpu-[0-3],gpu-1') -> node names, order kept, no duplicates."""
    expr = expr.strip()
    if not expr:
        return []
    try:
        names = hostlist.expand_hostlist(expr)
    except hostlist.BadHostlist as err:
        raise InputError(f"bad hostlist {expr!r}: {err}") from None
    return list(dict.fromkeys(names))


def parse_hostlists(args: Iterable[str]) -> list[str]:
    """argv after the program name: normally one hostlist; several are joined."""
    names: list[str] = []
    for arg in args:
        names += parse_hostlist(arg)
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class ResumeJob:
    job_id: int
    nodes_resume: tuple[str, ...]  # the job's nodes that this call resumes
    nodes_alloc: tuple[str, ...]  # all the job's nodes
    partition: str = ""
    features: str = ""


@dataclass(frozen=True)
class ResumeRequest:
    """The content of SLURM_RESUME_FILE (24.11 shape), parsed."""

    all_nodes: tuple[str, ...]
    jobs: tuple[ResumeJob, ...] = ()

    def jobs_of(self, node: str) -> tuple[int, ...]:
        return tuple(j.job_id for j in self.jobs if node in j.nodes_resume or node in j.nodes_alloc)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_resume_file(text: str) -> ResumeRequest:
    """SLURM_RESUME_FILE JSON -> :class:`ResumeRequest`; unknown keys are ignored."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"resume file is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise InputError("resume file is not a JSON object")
    jobs = []
    for i, job in enumerate(data.get("jobs") or ()):
        if not isinstance(job, dict) or not isinstance(job.get("job_id"), int):
            raise InputError(f"resume file jobs[{i}] has no integer job_id")
        jobs.append(ResumeJob(
            job_id=job["job_id"],
            nodes_resume=tuple(parse_hostlist(_str(job.get("nodes_resume")))),
            nodes_alloc=tuple(parse_hostlist(_str(job.get("nodes_alloc")))),
            partition=_str(job.get("partition")),
            features=_str(job.get("features")),
        ))
    return ResumeRequest(all_nodes=tuple(parse_hostlist(_str(data.get("all_nodes_resume")))), jobs=tuple(jobs))


# ---------------------------------------------------------------- plans


def _needs_worker(worker: Worker | None) -> bool:
    return worker is None or worker.phase not in LIVE_PHASES


def trial_candidates(names: Iterable[str], inventory: Inventory, workers: Mapping[str, Worker],
                     pools: Iterable[str]) -> dict[str, str]:
    """pool -> the node to try first, for half-open `pools`: the first node Slurm asked for that is
    in the pool, may run and has no live worker (a pool with none has no trial now)."""
    wanted = set(pools)
    out: dict[str, str] = {}
    for name in names:
        node = inventory[name] if name in inventory else None
        if (node is not None and node.pool in wanted and node.pool not in out and not node.unavailable
                and _needs_worker(workers.get(name))):
            out[node.pool] = name
    return out


def plan_resume(
    names: Iterable[str],
    inventory: Inventory,
    workers: Mapping[str, Worker],
    request: ResumeRequest | None = None,
    backoff: Mapping[str, str] | None = None,
    trials: Mapping[str, str] | None = None,
) -> list[Decision]:
    """One decision per node Slurm asked to resume (argv is authoritative; the file adds job ids).

    `backoff`: pool -> why its resumes are refused now (see ``ledger.pool_gates``); a node of such a
    pool that needs a worker fails at once with that reason, unless it is in `trials` (node -> why:
    the half-open pool's one trial resume, claimed in the ledger).
    """
    decisions = []
    for name in names:
        jobs = request.jobs_of(name) if request else ()
        worker = workers.get(name)
        if name not in inventory:
            decisions.append(Decision(name, Action.FAIL, Reason.UNKNOWN_NODE,
                                      "not in the slurmk8s inventory; regenerate the config", jobs=jobs))
            continue
        node = inventory[name]
        trial = (trials or {}).get(name, "")
        if node.unavailable:
            decisions.append(Decision(name, Action.FAIL, Reason.UNAVAILABLE, node.unavailable, jobs=jobs))
        elif backoff and node.pool in backoff and _needs_worker(worker) and not trial:
            decisions.append(Decision(name, Action.FAIL, Reason.BACKOFF, f"pool {node.pool}: {backoff[node.pool]}",
                                      jobs=jobs))
        elif worker is None:
            decisions.append(Decision(name, Action.CREATE, Reason.RESUME, trial, slurm_node=node, jobs=jobs))
        elif worker.phase in LIVE_PHASES:
            # kept, and the keeping written on the worker: the reconcile loop may have judged it
            # (a worker for a powered-down node) just before Slurm resumed the node; its delete,
            # conditional on the version it judged, is refused once this attempt has adopted it
            decisions.append(Decision(name, Action.ADOPT, Reason.ALREADY_RUNNING, f"worker is {worker.phase}",
                                      slurm_node=node, jobs=jobs, uid=worker.uid, version=worker.version))
        else:
            why = f"worker is {worker.phase}" + (f" ({worker.reason})" if worker.reason else "")
            decisions.append(Decision(name, Action.REPLACE, Reason.WORKER_DEAD, why + (f"; {trial}" if trial else ""),
                                      slurm_node=node, jobs=jobs, uid=worker.uid))
    return decisions


def with_groups(decisions: Sequence[Decision], jobs: Sequence[tuple[int, Sequence[str]]],
                workers: Mapping[str, Worker], queues: Mapping[str, str], token: str) -> list[Decision]:
    """The decisions with the Kueue pod group of each worker a pool under Kueue gets (`queues`:
    pool -> LocalQueue; none: the decisions as they are).

    `jobs`: the job each node is powered up for (Slurm's resume file, or the prolog's one job). A
    kept worker (ADOPT) stays in its group, and should it be created after all, joins it again.
    The workers created for one job form one group per queue; a group of that job still forming
    (short of its total, every member gated: e.g. one of the prolog's creates failed) is
    completed first. A node powered up for no job gets no group (a workload of one pod)."""
    if not queues:
        return list(decisions)
    queue_of = {d.node: queues[d.slurm_node.pool] for d in decisions
                if d.slurm_node is not None and d.slurm_node.pool in queues}
    creating = [d.node for d in decisions if d.action in (Action.CREATE, Action.REPLACE) and d.node in queue_of]
    by_job = [(job, [n for n in creating if n in nodes]) for job, nodes in jobs]
    members = [Member(n, w.group, w.group_total, w.gated) for n, w in workers.items()
               if w.group and w.phase in LIVE_PHASES]
    groups = assign_groups(by_job, queue_of, members, token)
    out = []
    for d in decisions:
        worker = workers.get(d.node)
        if d.action is Action.ADOPT and d.node in queue_of and worker is not None and worker.group:
            d = replace(d, group=PodGroup(worker.group, worker.group_total))
        elif d.node in groups:
            d = replace(d, group=groups[d.node])
        out.append(d)
    return out


def plan_suspend(names: Iterable[str], workers: Mapping[str, Worker]) -> list[Decision]:
    """Slurm powers these nodes down (they are idle): remove their workers.

    Inventory membership does not matter here: a worker of a node that left the inventory must
    go too.
    """
    return [
        Decision(name, Action.DELETE, Reason.SUSPEND, f"worker is {workers[name].phase}")
        if name in workers else Decision(name, Action.NOTHING, Reason.ALREADY_GONE)
        for name in names
    ]


def plan_resume_fail(names: Iterable[str], workers: Mapping[str, Worker]) -> list[Decision]:
    """Slurm gave up on these nodes (no registration within ResumeTimeout): no orphan workers."""
    return [
        Decision(name, Action.DELETE, Reason.RESUME_FAILED,
                 f"worker is {workers[name].phase}" + (f" ({workers[name].reason})" if workers[name].reason else ""))
        if name in workers else Decision(name, Action.NOTHING, Reason.ALREADY_GONE)
        for name in names
    ]


def down_reason(decision: Decision, error: str | None = None) -> str:
    """The Slurm node reason for a failed decision: short, one line, no double quotes."""
    text = f"slurmk8s {decision.reason.value}: {error or decision.detail}"
    text = " ".join(text.replace('"', "'").split())
    return text[:200]
