"""The in-cluster reconcile loop: finds workers and Slurm nodes that disagree, fixes them, says why,
and serves the cluster's Prometheus metrics.

How it is run (second container of the slurmctld pod)
-----------------------------------------------------
- command: ``slurmk8s-reconcile --period 10 --metrics-port 9410`` (``--once`` runs one pass and
  exits: tests, debugging; ``--metrics-port 0`` serves no metrics).
- image: the slurmctld image (it has scontrol / squeue, the auth key setup and the provisioner venv).
- user: SlurmUser (``scontrol update`` needs SlurmUser or root), with the same Slurm client config
  and auth key as slurmctld (slurm.conf under /etc/slurm, munge / auth key from the secret).
- env: the elastic programs' settings, read the same way (process environment over
  ``SLURMK8S_ENV_FILE``, default /etc/slurmk8s/elastic.env): ``SLURMK8S_BACKEND=kubernetes``,
  ``SLURMK8S_INVENTORY``, ``SLURMK8S_SPEC`` / ``SLURMK8S_SITE`` / ``SLURMK8S_NAMESPACE``; and
  ``SLURMK8S_LOG`` (this loop logs to ``reconcile.log`` beside it unless ``SLURMK8S_RECONCILE_LOG``),
  ``SLURMK8S_EVENTS`` (default /var/log/slurmk8s/events.jsonl, written by the resume / suspend
  programs, tailed here for metrics), ``SLURMK8S_LEDGER`` (default
  /var/spool/slurmctld/slurmk8s/ledger.json), ``SLURMK8S_USAGE`` (default
  /var/spool/slurmctld/slurmk8s/usage.json: the node-seconds tally since `up`, saved every pass and
  continued after a restart or a wake from sleep), ``SLURMK8S_BACKOFF_FAILURES`` / ``_WINDOW`` /
  ``_COOLOFF`` (3 / 600 / 300).
- volumes: the StateSaveLocation PVC at /var/spool/slurmctld (the failure ledger must survive a
  restart and is shared with ResumeProgram), the same /var/log/slurmk8s volume as the slurmctld
  container (an emptyDir shared by both containers: events file and logs), the slurm config
  (/etc/slurm, with inventory.json), the spec ConfigMap (/etc/slurmk8s/spec), elastic.env, the auth
  key secret, and the ServiceAccount token.
- port: 9410/TCP, name ``metrics``, path ``/metrics`` (Prometheus text format).
- RBAC: the slurmctld ServiceAccount's pod rights in its own namespace; the loop itself uses only
  pods list (backend.list) and delete (backend.delete, which gets the pod first), and get of its own
  pod once at start (the owning StatefulSet's uid keys the node-seconds tally to this `up`).
- probes: ``/metrics`` answers while the loop runs; ``slurmk8s_reconcile_last_run_timestamp_seconds``
  tells whether passes still complete.

What it does, each period
-------------------------
fetch (workers from the backend first, then ``scontrol show nodes --json``, the inventory, the
failure ledger and ``squeue --json``, whose running jobs tell a worker restarted under its job)
-> :func:`classify` (pure, one :class:`Finding` per disagreement, each with a
:class:`Kind` and a detail) -> the actions of :data:`ACTIONS` for that kind -> one log line per
finding with what was done and why. The pool backoff (``consecutive failures >= N within a window
-> refuse resumes for a cooling-off period``) is computed from the :class:`FailureLedger`, which the
resume / resume-fail programs and this loop all write; the resume program reads it and refuses
nodes of a pool in backoff at once (reason ``backoff``).

With ``elasticity.idle_teardown`` in the spec, each pass also feeds :class:`IdleWatch` (jobs,
workers, the login pod's SSH sessions), which puts the control tier to sleep after that long idle
(:mod:`provisioner.controltier`); sleeps and wakes are also logged to ``SLURMK8S_TIER_LOG``
(default /var/spool/slurmctld/slurmk8s/control-tier.log, on the state volume).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence

from .elastic.backend import BackendError, NodeBackend, Worker
from .elastic.slurmcmd import SlurmCommandError, down_argv, resume_argv

if TYPE_CHECKING:
    from .elastic.programs import Log
    from .inventory import Inventory

DEFAULT_LEDGER = "/var/spool/slurmctld/slurmk8s/ledger.json"
DEFAULT_USAGE = "/var/spool/slurmctld/slurmk8s/usage.json"  # node-seconds since `up`, kept across restarts
DEFAULT_EVENTS = "/var/log/slurmk8s/events.jsonl"
DEFAULT_TIER_LOG = "/var/spool/slurmctld/slurmk8s/control-tier.log"  # sleeps and wakes, kept on the state volume
DEFAULT_PERIOD = 10.0
DEFAULT_METRICS_PORT = 9410
REASON_PREFIX = "slurmk8s"  # DOWN reasons we set start with this; others' DOWN nodes are left alone

# Pending reasons that will not clear by themselves (soon enough): Slurm would only notice them at
# ResumeTimeout. Unschedulable gets a longer bound (a cluster autoscaler may be adding a node).
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError")
UNSCHEDULABLE = "Unschedulable"
DEAD_PHASES = frozenset({"Failed", "Succeeded"})


# ---------------------------------------------------------------- inputs


def _num(value: Any) -> float | None:
    """Slurm 24.11 data_parser number ({"set", "infinite", "number"} or a bare int) -> float | None."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


@dataclass(frozen=True)
class NodeStatus:
    """One Slurm node as `scontrol show nodes --json` reports it (the parts the loop uses)."""

    name: str
    state: frozenset[str]  # base state and flags: {"IDLE", "CLOUD", "POWERED_DOWN"}
    reason: str = ""
    partitions: tuple[str, ...] = ()
    booted_at: float | None = None  # boot_time / slurmd_start_time, whichever is later

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "NodeStatus":
        times = [t for t in (_num(obj.get("boot_time")), _num(obj.get("slurmd_start_time"))) if t]
        return cls(
            name=str(obj.get("name", "")),
            state=frozenset(str(s).upper() for s in obj.get("state") or ()),
            reason=str(obj.get("reason") or ""),
            partitions=tuple(str(p) for p in obj.get("partitions") or ()),
            booted_at=max(times) if times else None,
        )

    @property
    def powered_down(self) -> bool:
        return "POWERED_DOWN" in self.state and not self.powering

    @property
    def powering(self) -> bool:
        return bool({"POWERING_UP", "POWERING_DOWN"} & self.state)

    @property
    def down(self) -> bool:
        return "DOWN" in self.state

    @property
    def down_by_us(self) -> bool:
        return self.down and self.reason.startswith(REASON_PREFIX)

    @property
    def summary(self) -> str:
        """One state word for metrics: down, drain, powering_up, powering_down, powered_down, or the
        base state (idle, allocated, mixed, ...)."""
        for flag in ("DOWN", "DRAIN", "POWERING_UP", "POWERING_DOWN", "POWERED_DOWN", "COMPLETING"):
            if flag in self.state:
                return flag.lower()
        for base in ("ALLOCATED", "MIXED", "IDLE", "FUTURE", "UNKNOWN", "ERROR"):
            if base in self.state:
                return base.lower()
        return "other"

    @property
    def busy(self) -> bool:
        """Running (part of) a job: allocated and booted (an allocated node powering up is not busy yet)."""
        return bool({"ALLOCATED", "MIXED", "COMPLETING"} & self.state) and not (
            {"POWERING_UP", "POWERED_DOWN"} & self.state)


def parse_nodes(doc: Mapping[str, Any]) -> dict[str, NodeStatus]:
    out = {}
    for obj in doc.get("nodes") or ():
        node = NodeStatus.from_json(obj)
        if node.name:
            out[node.name] = node
    return out


@dataclass(frozen=True)
class JobStatus:
    job_id: int
    partition: str
    state: str  # first of job_state ("PENDING", "RUNNING", ...); CONFIGURING counts as PENDING
    submit_time: float | None = None
    start_time: float | None = None
    nodes: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "JobStatus":
        states = [str(s).upper() for s in obj.get("job_state") or ()]
        state = states[0] if states else "UNKNOWN"
        if "CONFIGURING" in states:
            state = "PENDING"  # allocated, waiting for its nodes to boot: not running yet
        return cls(int(obj.get("job_id", 0)), str(obj.get("partition") or ""), state,
                   _num(obj.get("submit_time")), _num(obj.get("start_time")), _expand(obj.get("nodes")))


def _expand(hostlist_expr: Any) -> tuple[str, ...]:
    if not isinstance(hostlist_expr, str) or not hostlist_expr.strip():
        return ()
    import hostlist

    try:
        return tuple(hostlist.expand_hostlist(hostlist_expr))
    except hostlist.BadHostlist:
        return ()


def running_since(jobs: Iterable[JobStatus]) -> dict[str, tuple[float, int]]:
    """node -> (start time, job id) of the earliest job RUNNING on it."""
    out: dict[str, tuple[float, int]] = {}
    for j in jobs:
        if j.state != "RUNNING" or j.start_time is None:
            continue
        for n in j.nodes:
            if n not in out or j.start_time < out[n][0]:
                out[n] = (j.start_time, j.job_id)
    return out


def parse_jobs(doc: Mapping[str, Any]) -> list[JobStatus]:
    return [JobStatus.from_json(j) for j in doc.get("jobs") or () if isinstance(j, dict)]


# ---------------------------------------------------------------- failure history / backoff


@dataclass(frozen=True)
class Failure:
    node: str
    at: float
    reason: str


@dataclass(frozen=True)
class PoolHistory:
    failures: tuple[Failure, ...] = ()
    last_success: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"failures": [{"node": f.node, "at": f.at, "reason": f.reason} for f in self.failures],
                "last_success": self.last_success}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "PoolHistory":
        failures = tuple(Failure(str(f["node"]), float(f["at"]), str(f.get("reason", "")))
                         for f in obj.get("failures") or () if isinstance(f, dict) and "node" in f and "at" in f)
        last = obj.get("last_success")
        return cls(failures, float(last) if isinstance(last, (int, float)) else None)


@dataclass(frozen=True)
class Policy:
    """The loop's bounds (seconds) and the pool backoff rule."""

    grace: float = 20.0  # a healthy worker / a freshly booted node is not judged before this age
    pending_timeout: float = 60.0  # image / config errors while Pending
    unschedulable_timeout: float = 180.0  # Unschedulable (an autoscaler may be adding capacity)
    backoff_failures: int = 3  # consecutive resume failures of a pool ...
    backoff_window: float = 600.0  # ... within this many seconds ...
    backoff_cooloff: float = 300.0  # ... refuse its resumes for this long after the last one
    dedupe: float = 120.0  # a node's failure seen again (by another program) within this counts once
    keep: int = 50  # failures kept per pool

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: float) -> "Policy":
        def get(key: str, default: float) -> float:
            try:
                return float(env.get(key, default))
            except ValueError:
                return default

        base = cls()
        policy = cls(backoff_failures=int(get("SLURMK8S_BACKOFF_FAILURES", base.backoff_failures)),
                     backoff_window=get("SLURMK8S_BACKOFF_WINDOW", base.backoff_window),
                     backoff_cooloff=get("SLURMK8S_BACKOFF_COOLOFF", base.backoff_cooloff))
        return replace(policy, **overrides) if overrides else policy


def consecutive_failures(history: PoolHistory, now: float, policy: Policy) -> list[Failure]:
    """Failures after the pool's last success and within the window."""
    since = max(history.last_success or -math.inf, now - policy.backoff_window)
    return [f for f in history.failures if f.at > since]


def backoff_until(history: PoolHistory, now: float, policy: Policy) -> float | None:
    """When the pool's cooling-off period ends, or None when the pool is not backed off."""
    failures = consecutive_failures(history, now, policy)
    if len(failures) < max(1, policy.backoff_failures):
        return None
    until = max(f.at for f in failures) + policy.backoff_cooloff
    return until if until > now else None


def backoff_detail(history: PoolHistory, now: float, policy: Policy) -> str | None:
    """The refusal reason for a pool in backoff (None when it is not)."""
    until = backoff_until(history, now, policy)
    if until is None:
        return None
    failures = consecutive_failures(history, now, policy)
    last = max(failures, key=lambda f: f.at)
    return (f"{len(failures)} consecutive resume failures within {policy.backoff_window:.0f}s, "
            f"last {last.node}: {last.reason}; resumes refused for {until - now:.0f}s more")


def add_failure(history: PoolHistory, node: str, reason: str, at: float, policy: Policy) -> PoolHistory:
    """The history with one failure more (pure); a repeat of the same node's failure counts once."""
    for f in history.failures:
        if f.node == node and abs(at - f.at) < policy.dedupe and f.at > (history.last_success or -math.inf):
            return history
    failures = (*history.failures, Failure(node, at, reason[:200]))[-policy.keep:]
    return PoolHistory(failures, history.last_success)


class LedgerError(Exception):
    pass


class FailureLedger(Protocol):
    """Per-pool resume failure history that survives restarts and is shared between processes."""

    def load(self) -> dict[str, PoolHistory]: ...

    def record_failure(self, pool: str, node: str, reason: str, at: float) -> None: ...

    def record_success(self, pool: str, at: float) -> None: ...


@dataclass
class MemoryLedger:
    """In-memory FailureLedger for tests."""

    policy: Policy = field(default_factory=Policy)
    pools: dict[str, PoolHistory] = field(default_factory=dict)

    def load(self) -> dict[str, PoolHistory]:
        return dict(self.pools)

    def record_failure(self, pool: str, node: str, reason: str, at: float) -> None:
        self.pools[pool] = add_failure(self.pools.get(pool, PoolHistory()), node, reason, at, self.policy)

    def record_success(self, pool: str, at: float) -> None:
        self.pools[pool] = PoolHistory((), at)


@dataclass
class FileLedger:
    """FailureLedger in one JSON file (on the StateSaveLocation volume), updated under flock and
    replaced atomically, so the resume programs and the loop can write it concurrently."""

    path: str = DEFAULT_LEDGER
    policy: Policy = field(default_factory=Policy)

    def _read(self) -> dict[str, PoolHistory]:
        try:
            with open(self.path) as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as err:
            raise LedgerError(f"cannot read the failure ledger {self.path}: {err}") from None
        pools = doc.get("pools") if isinstance(doc, dict) else None
        return {str(k): PoolHistory.from_json(v) for k, v in (pools or {}).items() if isinstance(v, dict)}

    def load(self) -> dict[str, PoolHistory]:
        return self._read()

    def _update(self, fn: Callable[[dict[str, PoolHistory]], dict[str, PoolHistory]]) -> None:
        import fcntl

        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                pools = fn(self._read())
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as fh:
                    json.dump({"pools": {k: v.to_json() for k, v in sorted(pools.items())}}, fh, indent=1)
                os.replace(tmp, self.path)
        except OSError as err:
            raise LedgerError(f"cannot update the failure ledger {self.path}: {err}") from None

    def record_failure(self, pool: str, node: str, reason: str, at: float) -> None:
        self._update(lambda p: {**p, pool: add_failure(p.get(pool, PoolHistory()), node, reason, at, self.policy)})

    def record_success(self, pool: str, at: float) -> None:
        self._update(lambda p: {**p, pool: PoolHistory((), at)})


def active_backoffs(ledger: FailureLedger, now: float, policy: Policy) -> dict[str, str]:
    """pool -> refusal reason, for the pools in backoff now (used by the resume program)."""
    out = {}
    for pool, history in ledger.load().items():
        detail = backoff_detail(history, now, policy)
        if detail:
            out[pool] = detail
    return out


# ---------------------------------------------------------------- classification


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


class Op(str, Enum):
    DELETE_WORKER = "delete-worker"
    SET_DOWN = "set-down"  # scontrol update state=DOWN reason=...: Slurm requeues the node's jobs
    POWER_DOWN = "power-down"  # scontrol update state=POWER_DOWN_FORCE: suspend, then idle~
    RETURN_TO_SERVICE = "return-to-service"  # scontrol update state=RESUME: DOWN~ -> idle~
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
}


@dataclass(frozen=True)
class Finding:
    node: str  # Slurm node / worker name; the pool name for POOL_* findings
    kind: Kind
    detail: str = ""
    pool: str = ""

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


def _age(since: float | None, now: float) -> float:
    return now - since if since is not None else math.inf


def _worker_words(w: Worker) -> str:
    return f"pod {w.name} {w.phase}" + (f" ({w.reason})" if w.reason else "")


def _stuck_bound(w: Worker, policy: Policy) -> float | None:
    if w.phase != "Pending" or not w.reason:
        return None
    if w.reason.startswith(UNSCHEDULABLE):
        return policy.unschedulable_timeout
    if w.reason.startswith(STUCK_REASONS):
        return policy.pending_timeout
    return None


def classify_pair(name: str, node: NodeStatus | None, worker: Worker | None, snapshot: Snapshot, now: float,
                  policy: Policy) -> Finding:
    """One (Slurm node, worker) pair -> a Finding (OK when they agree)."""
    inv = snapshot.inventory
    pool = inv[name].pool if name in inv else ""
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
            return Finding(name, Kind.WORKER_FAILED, f"{_worker_words(worker)}", pool)
        bound = _stuck_bound(worker, policy)
        if bound is not None and age >= bound:
            return Finding(name, Kind.STUCK_PENDING, f"{_worker_words(worker)} for {age:.0f}s", pool)
        since = snapshot.running.get(name)
        if (worker.died_at is not None and worker.phase == "Running" and node.busy and since
                and since[0] <= worker.died_at):
            died = time.strftime("%H:%M:%SZ", time.gmtime(worker.died_at))
            return Finding(name, Kind.WORKER_RESTARTED, f"pod {name} container died under job {since[1]} "
                                                        f"({worker.died_how or 'restarted'}, at {died})", pool)
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
        if node.down_by_us:
            return Finding(name, Kind.DOWN_POWERED_DOWN, f"no worker; was set DOWN: {node.reason}", pool)
        return Finding(name, Kind.OK, "", pool)
    if node.down:
        if node.down_by_us:
            return Finding(name, Kind.DOWN_WORKER_GONE, f"no worker; was set DOWN: {node.reason}", pool)
        return Finding(name, Kind.OK, "DOWN by someone else: left alone", pool)
    if name not in inv:
        return Finding(name, Kind.OK, "not in the inventory: not ours to judge", pool)
    if _age(node.booted_at, now) < policy.grace:
        return Finding(name, Kind.OK, "just booted: the worker list may predate it", pool)
    gone = f"pod {name} is gone" + (f" ({worker.phase})" if worker is not None else "")
    return Finding(name, Kind.MISSING_WORKER,
                   f"{gone} while Slurm has the node {'+'.join(sorted(node.state - {'CLOUD'}))}", pool)


def classify(snapshot: Snapshot, now: float, policy: Policy = Policy()) -> list[Finding]:
    """Every Slurm node and every worker -> findings (OK ones included), then one per pool in
    backoff. Pure: no I/O, no clock."""
    names = sorted(set(snapshot.nodes) | set(snapshot.workers))
    findings = [classify_pair(n, snapshot.nodes.get(n), snapshot.workers.get(n), snapshot, now, policy)
                for n in names]
    for pool, history in sorted(snapshot.history.items()):
        detail = backoff_detail(history, now, policy)
        if detail:
            findings.append(Finding(pool, Kind.POOL_BACKOFF, detail, pool))
    return findings


# ---------------------------------------------------------------- Slurm access


class SlurmClient(Protocol):
    def show_nodes(self) -> dict[str, Any]: ...

    def jobs(self) -> dict[str, Any]: ...

    def update(self, argv: Sequence[str]) -> None: ...


def power_down_argv(names: Sequence[str], scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", f"nodename={','.join(names)}", "state=POWER_DOWN_FORCE"]


@dataclass
class SlurmCli:
    """scontrol / squeue with --json, argv lists, a timeout per call; `observe(command, seconds, ok)`
    is told the latency of every call (the controller RPC metric)."""

    timeout: float = 10.0
    scontrol: str = field(default_factory=lambda: shutil.which("scontrol") or "/usr/bin/scontrol")
    squeue: str = field(default_factory=lambda: shutil.which("squeue") or "/usr/bin/squeue")
    observe: Callable[[str, float, bool], None] | None = None

    def _run(self, command: str, argv: Sequence[str]) -> str:
        start = time.monotonic()
        ok = False
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=self.timeout, check=False)
            if proc.returncode != 0:
                raise SlurmCommandError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:300]}")
            ok = True
            return proc.stdout
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmCommandError(f"{' '.join(argv)}: {err}") from None
        finally:
            if self.observe is not None:
                self.observe(command, time.monotonic() - start, ok)

    def _json(self, command: str, argv: Sequence[str]) -> dict[str, Any]:
        text = self._run(command, argv)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise SlurmCommandError(f"{' '.join(argv)}: not JSON: {err}") from None
        return doc if isinstance(doc, dict) else {}

    def show_nodes(self) -> dict[str, Any]:
        return self._json("show_nodes", [self.scontrol, "show", "nodes", "--json"])

    def jobs(self) -> dict[str, Any]:
        # every state: a job shorter than one period is seen only once it has finished
        return self._json("squeue", [self.squeue, "--json", "--states=all"])

    def update(self, argv: Sequence[str]) -> None:
        self._run("update", argv)


@dataclass
class FakeSlurmClient:
    """Canned `scontrol show nodes --json` / `squeue --json`; records every update argv."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    job_list: list[dict[str, Any]] = field(default_factory=list)
    updates: list[list[str]] = field(default_factory=list)
    fail_updates: bool = False
    fail_reads: bool = False

    def show_nodes(self) -> dict[str, Any]:
        if self.fail_reads:
            raise SlurmCommandError("scontrol: error: Unable to contact slurm controller")
        return {"nodes": self.nodes}

    def jobs(self) -> dict[str, Any]:
        if self.fail_reads:
            raise SlurmCommandError("squeue: error: Unable to contact slurm controller")
        return {"jobs": self.job_list}

    def update(self, argv: Sequence[str]) -> None:
        self.updates.append(list(argv))
        if self.fail_updates:
            raise SlurmCommandError(f"{' '.join(argv)}: exit 1: slurm_update error: Invalid node state")


# ---------------------------------------------------------------- acting


RAN_STATES = frozenset({"RUNNING", "COMPLETING", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL",
                        "OUT_OF_MEMORY", "PREEMPTED"})


@dataclass(frozen=True)
class Done:
    finding: Finding
    op: Op
    ok: bool
    error: str = ""
    argv: tuple[str, ...] = ()


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    done: list[Done] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what kept the pass from seeing everything
    snapshot: Snapshot | None = None
    jobs: list[JobStatus] | None = None  # the queue as this pass read it (None: unreadable)

    def of(self, kind: Kind) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def acted(self) -> list[Finding]:
        return [f for f in self.findings if f.ops]


def _do(op: Op, finding: Finding, slurm: SlurmClient, backend: NodeBackend, ledger: FailureLedger,
        now: float, scontrol: str) -> tuple[str, ...]:
    """Carry out one op; returns the argv it ran (Slurm ops). Raises on failure."""
    name = finding.node
    if op is Op.DELETE_WORKER:
        backend.delete(name)
        return ()
    if op is Op.SET_DOWN:
        argv = down_argv([name], finding.down_reason, scontrol)
    elif op is Op.POWER_DOWN:
        argv = power_down_argv([name], scontrol)
    elif op is Op.RETURN_TO_SERVICE:
        argv = resume_argv([name], scontrol)
    elif op is Op.RECORD_FAILURE:
        ledger.record_failure(finding.pool or "unknown", name, finding.down_reason, now)
        return ()
    elif op is Op.RECORD_SUCCESS:
        ledger.record_success(finding.pool, now)
        return ()
    else:  # pragma: no cover - every Op is handled above
        raise ValueError(f"unknown op {op}")
    slurm.update(argv)
    return tuple(argv)


def run_once(slurm: SlurmClient, backend: NodeBackend, inventory: "Inventory", ledger: FailureLedger, now: float,
             log: "Log", policy: Policy = Policy(), scontrol: str = "scontrol") -> Report:
    """Fetch, classify, act, log. Never raises for a failing backend, Slurm or ledger: the
    errors are in the report and the log, and the next pass tries again."""
    report = Report()
    try:
        workers = backend.list()  # first: a worker missing here was missing before Slurm's answer too
    except BackendError as err:
        report.errors.append(f"cannot list workers: {err.reason}")
        log.write(f"pass skipped: {report.errors[-1]}")
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
    try:
        report.jobs = parse_jobs(slurm.jobs())
    except SlurmCommandError as err:
        log.write(f"cannot read the queue ({err}); workers restarted under a job are judged next pass")
    snapshot = Snapshot(nodes, workers, inventory, history, running_since(report.jobs or ()))
    report.snapshot = snapshot
    report.findings = classify(snapshot, now, policy)
    todo = report.acted
    if any(f.kind is Kind.MISSING_WORKER for f in todo):
        # DOWN kills the node's jobs: look once more, a resume may have created the worker meanwhile
        try:
            again = backend.list()
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


# ---------------------------------------------------------------- events from the resume / suspend programs


@dataclass
class EventTail:
    """Reads the JSON lines appended to the events file since the last call (from its end at start:
    counters restart at zero with the process, as Prometheus expects; from its beginning when it
    did not exist at start, so a fresh cluster's first resume is counted)."""

    path: str
    offset: int | None = None
    _partial: str = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            if self.offset is None:
                self.offset = 0  # no file yet (a fresh cluster): everything written to it later is new
            return []
        if self.offset is None:
            self.offset = size
            return []
        if size < self.offset:  # truncated / rotated
            self.offset, self._partial = 0, ""
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(size - self.offset)
        except OSError:
            return []
        self.offset += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn or foreign line: skip it, keep reading
            if isinstance(obj, dict):
                out.append(obj)
        return out


# ---------------------------------------------------------------- metrics


LATENCY_BUCKETS = (0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The loop's Prometheus metrics, in their own registry (prometheus_client imported here only)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.jobs = Gauge("slurmk8s_jobs", "Jobs by partition and state (pending: also CONFIGURING, waiting for "
                          "its nodes to boot; running)", ["partition", "state"], registry=r)
        self.nodes = Gauge("slurmk8s_nodes", "Slurm nodes by pool and state (down, drain, powering_up, powering_down, "
                           "powered_down, completing, allocated, mixed, idle, ...)", ["pool", "state"], registry=r)
        self.workers = Gauge("slurmk8s_workers", "Worker pods by pool and phase (Pending, Running, Failed, Succeeded, "
                             "Terminating)", ["pool", "phase"], registry=r)
        self.elastic = Counter("slurmk8s_elastic_requests", "Resume / suspend / resume-fail requests per node "
                               "by program, action, reason and outcome (from the programs' events file)",
                               ["program", "action", "reason", "outcome"], registry=r)
        self.findings = Counter("slurmk8s_reconcile_findings", "Reconcile findings that needed action, by kind",
                                ["kind"], registry=r)
        self.actions = Counter("slurmk8s_reconcile_actions", "Reconcile actions by op and outcome",
                               ["op", "outcome"], registry=r)
        self.passes = Counter("slurmk8s_reconcile_passes", "Reconcile passes by outcome", ["outcome"], registry=r)
        self.last_run = Gauge("slurmk8s_reconcile_last_run_timestamp_seconds", "End of the last reconcile pass",
                              registry=r)
        self.pass_seconds = Histogram("slurmk8s_reconcile_duration_seconds", "Time of one reconcile pass",
                                      buckets=RPC_BUCKETS, registry=r)
        self.backoff = Gauge("slurmk8s_pool_backoff", "1 while the pool's resumes are refused (backoff)",
                             ["pool"], registry=r)
        self.submit_to_running = Histogram("slurmk8s_job_submit_to_running_seconds",
                                           "Job submit_time -> start_time, observed when first seen RUNNING",
                                           ["partition"], buckets=LATENCY_BUCKETS, registry=r)
        self.pod_start = Histogram("slurmk8s_worker_start_seconds", "Worker pod created -> Ready, for pods "
                                   "created while the loop runs", ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.provisioned = Counter("slurmk8s_node_provisioned_seconds", "Node-seconds with a worker pod in "
                                   "existence (not Terminating), since `up`", ["pool"], registry=r)
        self.busy = Counter("slurmk8s_node_busy_seconds", "Node-seconds a booted node was allocated to jobs, "
                            "since `up`", ["pool"], registry=r)
        self.rpc = Histogram("slurmk8s_controller_rpc_seconds", "Latency of the loop's scontrol / squeue calls "
                             "(slurmctld RPCs)", ["command"], buckets=RPC_BUCKETS, registry=r)
        self.rpc_errors = Counter("slurmk8s_controller_rpc_errors", "Failed scontrol / squeue calls",
                                  ["command"], registry=r)
        self.health_drained = Gauge("slurmk8s_health_drained_nodes", "Slurm nodes drained by a failed health "
                                    "check, by pool and check (disk, shm, memory, mpi, gpu)", ["pool", "check"],
                                    registry=r)
        self.usage_since = Gauge("slurmk8s_usage_since_timestamp_seconds", "Start of the node-seconds tally "
                                 "(provisioned / busy): the cluster's `up`; kept across controller restarts",
                                 registry=r)
        self._usage: dict[str, dict[str, float]] = {"provisioned": {}, "busy": {}}
        self._since: float | None = None
        self._gauge_keys: dict[str, set[tuple[str, ...]]] = {}
        self._seen_running: dict[int, float] = {}
        self._seen_ready: set[tuple[str, float]] = set()
        self._last: float | None = None
        self._lock = threading.Lock()

    # -- observation helpers

    def observe_rpc(self, command: str, seconds: float, ok: bool) -> None:
        self.rpc.labels(command).observe(seconds)
        if not ok:
            self.rpc_errors.labels(command).inc()

    def _set_gauge(self, key: str, gauge: Any, values: Mapping[tuple[str, ...], float]) -> None:
        """Set a labelled gauge to exactly `values` (label sets not seen any more drop to 0)."""
        old = self._gauge_keys.get(key, set())
        for labels in old - set(values):
            gauge.labels(*labels).set(0)
        for labels, v in values.items():
            gauge.labels(*labels).set(v)
        self._gauge_keys[key] = old | set(values)

    def observe_pass(self, report: Report, jobs: Sequence[JobStatus] | None, now: float, started: float,
                     seconds: float, backoff_pools: Iterable[str]) -> None:
        with self._lock:
            self.passes.labels("ok" if not report.errors else "error").inc()
            self.pass_seconds.observe(seconds)
            self.last_run.set(now)
            for f in report.acted:
                self.findings.labels(f.kind.value).inc()
            for d in report.done:
                self.actions.labels(d.op.value, "ok" if d.ok else "failed").inc()
            pools = set(backoff_pools)
            self._set_gauge("backoff", self.backoff, {(p,): 1.0 for p in pools})
            snap = report.snapshot
            if snap is not None:
                self._observe_snapshot(snap, now, started)
            if jobs is not None:
                self._observe_jobs(jobs, started)

    def _observe_snapshot(self, snap: Snapshot, now: float, started: float) -> None:
        inv = snap.inventory

        def pool_of(name: str) -> str:
            return inv[name].pool if name in inv else "unknown"

        counts: dict[tuple[str, ...], float] = {}
        for name, node in snap.nodes.items():
            key = (pool_of(name), node.summary)
            counts[key] = counts.get(key, 0) + 1
        self._set_gauge("nodes", self.nodes, counts)
        counts = {}
        for name, w in snap.workers.items():
            key = (pool_of(name), w.phase)
            counts[key] = counts.get(key, 0) + 1
        self._set_gauge("workers", self.workers, counts)
        counts = {}
        for name, node in snap.nodes.items():
            check = health_check_of(node)
            if check:
                key = (pool_of(name), check)
                counts[key] = counts.get(key, 0) + 1
        self._set_gauge("health_drained", self.health_drained, counts)
        # node-seconds since the previous pass, attributed with this pass's state
        if self._last is not None:
            dt = max(0.0, now - self._last)
            for name, w in snap.workers.items():
                if w.phase != "Terminating":
                    self._add_usage("provisioned", pool_of(name), dt)
            for name, node in snap.nodes.items():
                if node.busy:
                    self._add_usage("busy", pool_of(name), dt)
        self._last = now
        for name, w in snap.workers.items():
            if w.phase != "Running" or w.created_at is None or w.created_at < started:
                continue  # only workers created while this process watches: no stale huge values
            key = (name, w.created_at)
            if key in self._seen_ready:
                continue
            self._seen_ready.add(key)
            ready = w.ready_at or now
            self.pod_start.labels(pool_of(name)).observe(max(0.0, ready - w.created_at))
        live = {(n, w.created_at) for n, w in snap.workers.items()}
        self._seen_ready &= live

    def _observe_jobs(self, jobs: Sequence[JobStatus], started: float) -> None:
        counts: dict[tuple[str, ...], float] = {}
        for j in jobs:
            if j.state in ("PENDING", "RUNNING"):
                key = (j.partition, j.state.lower())
                counts[key] = counts.get(key, 0) + 1
        self._set_gauge("jobs", self.jobs, counts)
        for j in jobs:
            # started jobs, running or already finished (a short job may never be seen RUNNING);
            # CANCELLED is left out: Slurm gives a job cancelled while pending a start time too
            if j.state not in RAN_STATES or not j.start_time or j.job_id in self._seen_running:
                continue
            self._seen_running[j.job_id] = j.start_time or 0.0
            if j.submit_time and j.start_time and j.start_time >= started - 1:
                self.submit_to_running.labels(j.partition).observe(max(0.0, j.start_time - j.submit_time))
        listed = {j.job_id for j in jobs}  # forget a job once squeue no longer lists it (MinJobAge)
        for job_id in [k for k in self._seen_running if k not in listed]:
            del self._seen_running[job_id]

    def _add_usage(self, kind: str, pool: str, seconds: float) -> None:
        (self.provisioned if kind == "provisioned" else self.busy).labels(pool).inc(seconds)
        totals = self._usage[kind]
        totals[pool] = totals.get(pool, 0.0) + seconds

    def restore_usage(self, usage: "Usage") -> None:
        """Continue the node-seconds counters from a saved tally (a restarted or woken controller)."""
        with self._lock:
            for kind, totals in (("provisioned", usage.provisioned), ("busy", usage.busy)):
                for pool, seconds in sorted(totals.items()):
                    if seconds > 0:
                        self._add_usage(kind, pool, seconds)
            self._since = usage.since
            self.usage_since.set(usage.since)

    def usage(self, deployment: str) -> "Usage":
        """The node-seconds tally to save (since the restored / first start)."""
        with self._lock:
            return Usage(deployment, self._since if self._since is not None else 0.0,
                         dict(self._usage["provisioned"]), dict(self._usage["busy"]))

    def observe_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for e in events:
                self.elastic.labels(str(e.get("program", "")), str(e.get("action", "")), str(e.get("reason", "")),
                                    str(e.get("outcome", ""))).inc()

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)


def health_check_of(node: NodeStatus) -> str:
    """The failed check of a node drained by slurmk8s-healthcheck (reason 'health: <check>: ...'), else ''."""
    if "DRAIN" not in node.state or not node.reason.startswith("health: "):
        return ""
    check = node.reason[len("health: "):].split(":", 1)[0].strip()
    return check if check.isidentifier() else "other"


# ---------------------------------------------------------------- node-seconds since `up`, across restarts


@dataclass(frozen=True)
class Usage:
    """Node-seconds provisioned / busy per pool since `since`, for the deployment (the slurmctld
    StatefulSet's uid: a new `up` after `down` starts a new tally; a restart or a wake from sleep
    continues it)."""

    deployment: str
    since: float
    provisioned: Mapping[str, float] = field(default_factory=dict)
    busy: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "since": self.since,
                "provisioned": dict(sorted(self.provisioned.items())), "busy": dict(sorted(self.busy.items()))}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Usage":
        def totals(key: str) -> dict[str, float]:
            raw = obj.get(key)
            return {str(k): float(v) for k, v in (raw.items() if isinstance(raw, dict) else ())
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}

        since = obj.get("since")
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            raise ValueError("no 'since' timestamp")
        return cls(str(obj.get("deployment") or ""), float(since), totals("provisioned"), totals("busy"))


def resume_usage(saved: Usage | None, deployment: str, now: float) -> tuple[Usage, str]:
    """The tally to continue from (pure) and why: the saved one when it belongs to this deployment
    (or this deployment cannot be told), else a fresh one starting now."""
    if saved is None:
        return Usage(deployment, now), "no saved node-seconds: counting from now"
    if deployment and saved.deployment and saved.deployment != deployment:
        return Usage(deployment, now), (f"saved node-seconds belong to an earlier deployment ({saved.deployment}): "
                                        "counting from now")
    return replace(saved, deployment=deployment or saved.deployment), \
        f"continuing the node-seconds tally started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(saved.since))}"


@dataclass
class UsageFile:
    """The tally in one JSON file on the StateSaveLocation volume, replaced atomically."""

    path: str = DEFAULT_USAGE

    def load(self) -> Usage | None:
        try:
            with open(self.path) as fh:
                doc = json.load(fh)
            return Usage.from_json(doc if isinstance(doc, dict) else {})
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise LedgerError(f"cannot read the node-seconds tally {self.path}: {err}") from None

    def save(self, usage: Usage) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(usage.to_json(), fh)
            os.replace(tmp, self.path)
        except OSError as err:
            raise LedgerError(f"cannot write the node-seconds tally {self.path}: {err}") from None


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as exported: counters end in _total; histograms add _bucket / _sum / _count
    kind: str
    labels: tuple[str, ...]
    help: str


def metric_catalog(metrics: "Metrics") -> list[MetricDoc]:
    """Every metric the loop exports, with its labels (also those with no sample yet)."""
    from prometheus_client.metrics import MetricWrapperBase

    out = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            kind = value._type  # counter | gauge | histogram
            name = value._name + ("_total" if kind == "counter" else "")
            out.append(MetricDoc(name, kind, tuple(value._labelnames), value._documentation))
    return sorted(out, key=lambda d: d.name)


def metrics_markdown(metrics: "Metrics | None" = None) -> str:
    """The README's metrics table (kept current by a test)."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for d in metric_catalog(metrics or Metrics()):
        labels = ", ".join(f"`{label}`" for label in d.labels) or "-"
        rows.append(f"| `{d.name}` | {d.kind} | {labels} | {d.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def dashboard_queries(dashboard: Any) -> list[str]:
    """Every PromQL expression (`expr`) of a Grafana dashboard document, in document order: the
    unit tests check them against the exported names, the e2e tier runs them on Prometheus."""
    if isinstance(dashboard, dict):
        own = [dashboard["expr"]] if isinstance(dashboard.get("expr"), str) else []
        return own + [e for v in dashboard.values() for e in dashboard_queries(v)]
    if isinstance(dashboard, list):
        return [e for v in dashboard for e in dashboard_queries(v)]
    return []


def exported_names(registry: Any) -> set[str]:
    """Every sample name the registry can export (counter _total, histogram _bucket/_sum/_count...),
    whether or not a labelled child exists yet."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
    names = set()
    for family in registry.collect():
        for s in suffixes.get(family.type, ("",)):
            names.add(family.name + s)
    return names


# ---------------------------------------------------------------- idle sleep of the control tier


@dataclass
class IdleWatch:
    """Feeds the control tier's IdleTracker once per pass and puts the tier to sleep when it says
    so (see provisioner.controltier). The I/O is injected: `jobs()` (squeue --json doc),
    `sessions()` ((count, users, last_request, why unknown) from the login agent) and `tier`."""

    tier: Any  # controltier.Tier
    tracker: Any  # controltier.IdleTracker
    sessions: Callable[[], tuple[int | None, tuple[str, ...], float | None, str]]
    jobs: Callable[[], Mapping[str, Any]]
    workers: Callable[[], int]
    controller_stopped: Callable[[], bool]
    log: Callable[[str], None]
    recent: float = 15.0  # a Slurm command / login this recent aborts a sleep at the last check
    started: bool = False
    _said: str = ""

    def activity(self, job_doc: Mapping[str, Any] | None, workers: int | None, now: float) -> Any:
        from .controltier import Activity, active_jobs

        sessions, users, last, why = self.sessions()
        unknown = why if sessions is None else ("cannot read the queue" if job_doc is None else "")
        return Activity(jobs=active_jobs(job_doc) if job_doc is not None else None, workers=workers,
                        sessions=sessions, last_request=last, users=users, unknown=unknown)

    def recheck(self) -> str:
        """Fresh look right before slurmctld goes: '' when still idle, else what is busy."""
        try:
            job_doc: Mapping[str, Any] | None = self.jobs()
        except SlurmCommandError:
            job_doc = None
        try:
            workers: int | None = self.workers()
        except BackendError:
            workers = None
        act = self.activity(job_doc, workers, time.time())
        busy = act.busy()
        if act.last_request is not None and time.time() - act.last_request < self.recent:
            busy.append(f"a Slurm command or SSH login on the login pod {time.time() - act.last_request:.0f}s ago")
        return "; ".join(busy)

    def step(self, job_doc: Mapping[str, Any] | None, workers: int | None, now: float) -> bool:
        """One pass; True when the tier was put to sleep (this process should end)."""
        from .controltier import TierError

        if not self.started:
            try:
                self.log(f"control tier: {self.tier.on_controller_start()}")
                self.started = True
            except TierError as err:
                self.log(f"control tier: cannot record the wake yet: {err}")
        act = self.activity(job_doc, workers, now)
        reason = self.tracker.update(act, now)
        status = self.tracker.why_awake(act, now)
        kind = status.split(",")[0].split(" ")[0] if not act.busy() else "; ".join(
            b.split(" ", 1)[-1] for b in act.busy())
        if kind != self._said and not reason:
            self.log(f"control tier awake: {status}")
            self._said = kind
        if not reason:
            return False
        self.log(f"control tier going to sleep: {reason}")
        try:
            return bool(self.tier.sleep_tier(reason, self.recheck, self.controller_stopped))
        except TierError as err:
            self.log(f"control tier: sleep failed: {err}")
            self.tracker.idle_since = None  # try again after a full idle period
            return False


def idle_watch_from_env(env: Mapping[str, str], log: "Log", slurm: "SlurmCli",
                        backend: Callable[[], NodeBackend]) -> IdleWatch | None:
    """The IdleWatch when the spec sets elasticity.idle_teardown (else None)."""
    from . import controltier as ct
    from . import manifests as m
    from .elastic.programs import Log
    from .config import parse_spec
    from .errors import SlurmK8sError
    from .kube import DEFAULT_SITE, DEFAULT_SPEC, _api_client

    spec_path = env.get("SLURMK8S_SPEC", DEFAULT_SPEC)
    try:
        with open(spec_path) as fh:
            spec = parse_spec(json.load(fh), source=spec_path)
    except (OSError, ValueError, SlurmK8sError) as err:
        log.write(f"idle teardown off: cannot read the spec {spec_path}: {err}")
        return None
    teardown = spec.elasticity.idle_teardown
    if teardown is None:
        return None
    site_path = env.get("SLURMK8S_SITE", DEFAULT_SITE)
    try:
        with open(site_path) as fh:
            domain = json.load(fh).get("cluster_domain", "cluster.local")
    except (OSError, ValueError):
        domain = "cluster.local"
    namespace = env.get("SLURMK8S_NAMESPACE") or spec.namespace_name
    # sleeps and wakes also go to a log on the state volume: the reconcile log's emptyDir goes with the pod
    durable = Log("control-tier", env.get("SLURMK8S_TIER_LOG", DEFAULT_TIER_LOG))

    def tier_log(line: str) -> None:
        log.write(line)
        durable.write(line)

    try:
        client = _api_client(env)
    except BackendError as err:
        log.write(f"idle teardown off: no Kubernetes API client: {err.reason}")
        return None
    tier = ct.Tier(ct.ClientTierApi(client), namespace, "slurmk8s-reconcile", log=tier_log)
    url = f"http://{m.LOGIN_HOST}.{m.WORKERS}.{namespace}.svc.{domain}:{m.ACTIVITY_PORT}/activity"

    def sessions() -> tuple[int | None, tuple[str, ...], float | None, str]:
        if not spec.login.enabled:
            return 0, (), None, ""
        doc, err = ct.fetch_activity(url)
        if doc is None and m.login_sleeps(spec):
            try:  # asleep with the tier: no login pod, no session
                dep = tier.api.get_workload(namespace, "Deployment", m.LOGIN)
                if (dep.get("spec") or {}).get("replicas") == 0 and not tier.pods_of(ct.Workload.from_obj(dep)):
                    return 0, (), None, ""
            except Exception as exc:  # noqa: BLE001 - any failure here means "unknown", reported
                err = f"{err}; login Deployment unreadable: {exc}"
        return ct.activity_from_doc(doc, err)

    log.write(f"idle teardown after {teardown:.0f}s; login sessions from {url}; sleeps and wakes also in {durable.path}")
    return IdleWatch(tier, ct.IdleTracker(float(teardown)), sessions, slurm.jobs,
                     lambda: len(backend().list()),
                     lambda: not ct.port_open("127.0.0.1", m.SLURMCTLD_PORT), tier_log)


# ---------------------------------------------------------------- the loop


def _load_inventory(path: str) -> "Inventory":
    from .inventory import Inventory

    with open(path) as fh:
        return Inventory.from_json(json.load(fh))


def _deployment_id(backend: NodeBackend, log: "Log") -> str:
    """The slurmctld StatefulSet's uid, read from this pod (its name is the hostname): '' where the
    backend is not Kubernetes or the pod cannot be read (the saved tally is then continued)."""
    owner_uid = getattr(backend, "owner_uid", None)
    if owner_uid is None:
        return ""
    pod = os.environ.get("HOSTNAME") or socket.gethostname()
    try:
        return str(owner_uid(pod))
    except BackendError as err:
        log.write(f"cannot tell this deployment from pod {pod}: {err.reason}; continuing the saved tally")
        return ""


def _stop_on_sigterm(log: "Log") -> threading.Event:
    """An event set by SIGTERM (and SIGINT): the loop finishes its pass and exits 0 at once.

    The loop is its container's PID 1, which the kernel shields from signals it does not handle:
    without this, every pod deletion (eviction, rollout, a drained node) would wait out the whole
    termination grace period before the new slurmctld pod could start.
    """
    import signal

    stop = threading.Event()

    def handle(signum: int, _frame: Any) -> None:
        log.write(f"{signal.Signals(signum).name}: stopping after this pass")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    from .elastic.backend import backend_from_env
    from .elastic.programs import DEFAULT_INVENTORY, DEFAULT_LOG, Log, program_env

    parser = argparse.ArgumentParser(prog="slurmk8s-reconcile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="one pass, then exit (status 1 if it had errors)")
    parser.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="seconds between passes")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, help="0: no metrics endpoint")
    parser.add_argument("--grace", type=float, default=None, help="seconds before a worker / boot is judged")
    parser.add_argument("--pending-timeout", type=float, default=None)
    parser.add_argument("--unschedulable-timeout", type=float, default=None)
    parser.add_argument("--metrics-table", action="store_true",
                        help="print the metrics as a Markdown table and exit")
    args = parser.parse_args(argv)
    if args.metrics_table:
        sys.stdout.write(metrics_markdown())
        return 0

    env = program_env(os.environ)
    log_path = env.get("SLURMK8S_RECONCILE_LOG") or os.path.join(
        os.path.dirname(env.get("SLURMK8S_LOG", DEFAULT_LOG)), "reconcile.log")
    log = Log("reconcile", log_path)
    overrides = {k: v for k, v in (("grace", args.grace), ("pending_timeout", args.pending_timeout),
                                   ("unschedulable_timeout", args.unschedulable_timeout)) if v is not None}
    policy = Policy.from_env(env, **overrides)
    ledger = FileLedger(env.get("SLURMK8S_LEDGER", DEFAULT_LEDGER), policy)
    metrics = Metrics() if args.metrics_port else None
    slurm = SlurmCli(observe=metrics.observe_rpc if metrics else None)
    if metrics is not None:
        metrics.serve(args.metrics_port)
        log.write(f"metrics on :{args.metrics_port}/metrics")
    events = EventTail(env.get("SLURMK8S_EVENTS", DEFAULT_EVENTS))
    events.read()  # start at the end
    started = time.time()
    inventory_path = env.get("SLURMK8S_INVENTORY", DEFAULT_INVENTORY)
    log.write(f"started: period {args.period:.0f}s, grace {policy.grace:.0f}s, ledger {ledger.path}")
    backend: NodeBackend | None = None
    usage_file = UsageFile(env.get("SLURMK8S_USAGE", DEFAULT_USAGE)) if metrics is not None else None
    usage_restored, usage_error, deployment = False, False, ""

    def get_backend() -> NodeBackend:
        nonlocal backend
        backend = backend or backend_from_env(env)
        return backend

    # SIGTERM only sets `stop` (below): a sleep of the control tier under way (slurmctld's own pod
    # is stopping) still scales slurmdbd and the database down before the loop ends
    idle = idle_watch_from_env(env, log, slurm, get_backend)
    code = 0
    stop = _stop_on_sigterm(log)
    while not stop.is_set():
        tick = time.monotonic()
        now = time.time()
        errors: list[str] = []
        report = Report()
        try:
            inventory = _load_inventory(inventory_path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            errors.append(f"inventory {inventory_path} unreadable: {err}")
            inventory = None
        if inventory is not None:
            try:
                backend = backend or backend_from_env(env)
            except BackendError as err:
                errors.append(f"backend unavailable: {err.reason}")
        if metrics is not None and backend is not None and usage_file is not None and not usage_restored:
            usage_restored = True
            deployment = _deployment_id(backend, log)
            try:
                saved = usage_file.load()
            except LedgerError as err:
                log.write(f"{err}; counting from now")
                saved = None
            restored, why = resume_usage(saved, deployment, now)
            metrics.restore_usage(restored)
            log.write(why)
        if inventory is not None and backend is not None:
            report = run_once(slurm, backend, inventory, ledger, now, log, policy, slurm.scontrol)
        report.errors[:0] = errors
        for e in errors:
            log.write(f"pass skipped: {e}")
        if metrics is not None:
            jobs: list[JobStatus] | None = report.jobs
            if jobs is None:
                try:
                    jobs = parse_jobs(slurm.jobs())
                except SlurmCommandError as err:
                    log.write(f"cannot read the queue for metrics: {err}")
            pools = [f.pool for f in report.findings if f.kind is Kind.POOL_BACKOFF]
            metrics.observe_pass(report, jobs, now, started, time.monotonic() - tick, pools)
            metrics.observe_events(events.read())
            if usage_restored and usage_file is not None:
                try:
                    usage_file.save(metrics.usage(deployment))
                except LedgerError as err:
                    if not usage_error:
                        log.write(str(err))
                    usage_error = True
        code = 1 if report.errors else 0
        if idle is not None:
            snap = report.snapshot
            queue = report.jobs
            if queue is None:
                try:
                    queue = parse_jobs(slurm.jobs())
                except SlurmCommandError as err:
                    log.write(f"cannot read the queue: {err}")
            job_doc = None if queue is None else {"jobs": [{"job_state": [j.state]} for j in queue]}
            if idle.step(job_doc, len(snap.workers) if snap is not None else None, time.time()):
                log.write("control tier asleep: the reconcile loop ends with its pod")
                break
        if args.once:
            break
        stop.wait(max(0.5, args.period - (time.monotonic() - tick)))
    log.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
