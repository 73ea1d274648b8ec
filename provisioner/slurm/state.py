"""What Slurm says, parsed: ``scontrol show nodes --json`` and ``squeue --json`` into small typed records.

Used by the reconcile loop and by ``slurmk8s status``; pure (no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

REASON_PREFIX = "slurmk8s"  # DOWN reasons we set start with this; others' DOWN nodes are left alone


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
    # boot_time alone: slurmctld's own clock minus the uptime slurmd reports at registration (with
    # slurmd -b, the seconds since slurmd started), so comparable with job start times; not
    # slurmd_start_time, which is the worker's clock
    slurm_boot_at: float | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "NodeStatus":
        times = [t for t in (_num(obj.get("boot_time")), _num(obj.get("slurmd_start_time"))) if t]
        return cls(
            name=str(obj.get("name", "")),
            state=frozenset(str(s).upper() for s in obj.get("state") or ()),
            reason=str(obj.get("reason") or ""),
            partitions=tuple(str(p) for p in obj.get("partitions") or ()),
            booted_at=max(times) if times else None,
            slurm_boot_at=_num(obj.get("boot_time")) or None,
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
    end_time: float | None = None  # a running job's is its time limit's end, not an end
    comment: str = ""  # the job's comment (--comment, or slurmk8s' note while Kueue holds its pods)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "JobStatus":
        states = [str(s).upper() for s in obj.get("job_state") or ()]
        state = states[0] if states else "UNKNOWN"
        if "CONFIGURING" in states:
            state = "PENDING"  # allocated, waiting for its nodes to boot: not running yet
        return cls(int(obj.get("job_id", 0)), str(obj.get("partition") or ""), state,
                   _num(obj.get("submit_time")), _num(obj.get("start_time")), _expand(obj.get("nodes")),
                   _num(obj.get("end_time")), str(obj.get("comment") or ""))


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
