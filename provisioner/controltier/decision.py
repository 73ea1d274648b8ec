"""What the control tier is and when it may sleep: its workloads and their order, its state, and the
idle tracker fed one :class:`Activity` per reconcile pass. Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from .. import names
from ..errors import SlurmK8sError

A_STATE = "slurmk8s.io/state"


A_REASON = "slurmk8s.io/state-reason"


A_SINCE = "slurmk8s.io/state-since"


AWAKE = "awake"


ASLEEP = "asleep"


EV_SLEEP = "ControlTierSleep"


EV_WAKE = "ControlTierWake"


EV_WAKE_REQUEST = "WakeRequested"


EV_SLEEP_ABORTED = "ControlTierSleepAborted"


# sleep order by component (lower first); unknown components (the database) sleep last
SLEEP_RANK = {names.LOGIN: 0, names.CONTROLLER: 1, "slurmdbd": 2}


OTHER_RANK = 3


FINISHED_JOB_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                                 "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT"})


DEFAULT_WAKE_TIMEOUT = 300.0


ACTIVITY_STALE = 30.0  # a session count older than this is unknown (the login pod's writer stopped)


class TierError(SlurmK8sError):
    """A sleep or wake step that failed, with what to do about it."""


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class Workload:
    kind: str  # StatefulSet | Deployment
    name: str
    component: str
    replicas: int  # spec.replicas
    ready: int  # status.readyReplicas
    selector: str = ""  # label selector of its pods
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return SLEEP_RANK.get(self.component, OTHER_RANK)

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()}/{self.name}"

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> "Workload":
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        match = ((spec.get("selector") or {}).get("matchLabels")) or {}
        replicas = spec.get("replicas")
        return cls(kind=str(obj.get("kind") or ""), name=str(meta.get("name", "")),
                   component=str((meta.get("labels") or {}).get(names.L_COMPONENT, "")),
                   replicas=1 if replicas is None else int(replicas),
                   ready=int(status.get("readyReplicas") or 0),
                   selector=",".join(f"{k}={v}" for k, v in sorted(match.items())),
                   annotations=dict(meta.get("annotations") or {}))


def sleep_order(workloads: Iterable[Workload]) -> list[Workload]:
    return sorted(workloads, key=lambda w: (w.rank, w.name))


def wake_order(workloads: Iterable[Workload]) -> list[Workload]:
    return list(reversed(sleep_order(workloads)))


def tier_state(workloads: Sequence[Workload]) -> str:
    """awake | asleep as recorded (awake when unset): slurmctld's Workload carries the recorded
    state as its annotations (tier.Tier.workloads reads it from the state ConfigMap)."""
    for w in workloads:
        if w.component == names.CONTROLLER:
            return w.annotations.get(A_STATE, AWAKE)
    return AWAKE


@dataclass(frozen=True)
class Activity:
    """What keeps the tier awake, as one reconcile pass saw it; None = could not be read."""

    jobs: int | None  # jobs not finished (pending, running, completing, suspended, ...)
    workers: int | None  # worker pods, terminating ones included
    sessions: int | None  # authenticated SSH sessions on the login pod
    last_request: float | None = None  # last Slurm command / SSH login on the login pod, or REST request (epoch)
    users: tuple[str, ...] = ()
    unknown: str = ""  # why sessions / jobs could not be read

    def busy(self) -> list[str]:
        """Why the tier is not idle now (empty: idle)."""
        out = []
        if self.jobs is None or self.workers is None or self.sessions is None:
            out.append(f"activity unknown ({self.unknown or 'not read'})")
        if self.jobs:
            out.append(f"{self.jobs} unfinished job(s)")
        if self.workers:
            out.append(f"{self.workers} worker pod(s)")
        if self.sessions:
            out.append(f"{self.sessions} SSH session(s) on the login pod"
                       + (f" ({', '.join(self.users)})" if self.users else ""))
        return out


def active_jobs(doc: Mapping[str, Any]) -> int:
    """Jobs of `squeue --json --states=all` that are not finished."""
    n = 0
    for job in doc.get("jobs") or ():
        states = {str(s).upper() for s in (job.get("job_state") or ())} if isinstance(job, dict) else set()
        if states and not states & FINISHED_JOB_STATES:
            n += 1
    return n


@dataclass
class IdleTracker:
    """Since when the tier has been idle; says when to sleep. Fed once per pass (no clock reads).

    The idle clock starts with the process (a restarted loop waits the full teardown again: it errs
    towards staying awake) and restarts on any activity, including a Slurm command or SSH login on
    the login pod at ``last_request``.
    """

    teardown: float
    idle_since: float | None = None

    def update(self, activity: Activity, now: float) -> str | None:
        """The sleep reason when the tier should sleep now, else None."""
        if activity.busy():
            self.idle_since = None
            return None
        since = self.idle_since if self.idle_since is not None else now
        if activity.last_request is not None:
            since = max(since, min(activity.last_request, now))
        self.idle_since = since
        if now - since < self.teardown:
            return None
        return (f"idle for {now - since:.0f}s (idle_teardown {self.teardown:.0f}s): no unfinished jobs, "
                f"no worker pods, no SSH sessions")

    def why_awake(self, activity: Activity, now: float) -> str:
        busy = activity.busy()
        if busy:
            return "; ".join(busy)
        left = self.teardown - (now - (self.idle_since if self.idle_since is not None else now))
        return f"idle, sleeping in {max(0.0, left):.0f}s"
