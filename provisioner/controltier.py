"""Idle sleep and wake of the control tier (slurmctld, slurmdbd, the database, and the login pod
where the spec lets it sleep).

What is in the tier: every StatefulSet / Deployment of the cluster's namespace labelled
``slurmk8s.io/tier=control``. They sleep in the order login -> slurmctld -> slurmdbd -> database
(anything else labelled last) and wake in the reverse order, each by its
``app.kubernetes.io/component`` label. Sleeping scales them to zero replicas; volumes, Services and
Secrets stay.

Who does what
-------------
- The reconcile loop (slurmctld pod, :func:`provisioner.reconcile.main`) decides: with
  ``elasticity.idle_teardown`` set, an :class:`IdleTracker` is fed one :class:`Activity` per pass
  (active jobs, worker pods, SSH sessions on the login pod and the time of the last Slurm command /
  login there); once nothing was active for ``idle_teardown`` it runs :func:`sleep_tier`.
- Wakers: ``slurmk8s submit`` / ``slurmk8s ssh`` (the user's kubeconfig), and the login pod's
  agent (:func:`agent_main`, a sidecar with its own ServiceAccount that may only scale the tier),
  which a plain ``sbatch`` (and every other Slurm command, and each SSH login) on the login pod asks
  over the pod's loopback. Both run :func:`wake_tier`.
- Record: annotations on the slurmctld StatefulSet (``slurmk8s.io/state`` awake|asleep,
  ``slurmk8s.io/state-reason``, ``slurmk8s.io/state-since`` RFC3339), one Kubernetes Event per
  sleep and wake (reason ``ControlTierSleep`` / ``ControlTierWake``; a waker leaves a
  ``WakeRequested`` Event naming who and why, which the woken loop turns into the annotation), and
  the reconcile log.

Kubernetes is reached through :class:`TierApi` (a handful of calls, dicts in and out):
:class:`ClientTierApi` with the official client, :class:`FakeTierApi` in memory for the tests.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from . import manifests as m

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
SLEEP_RANK = {m.LOGIN: 0, m.CONTROLLER: 1, "slurmdbd": 2}
OTHER_RANK = 3

FINISHED_JOB_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                                 "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT"})
DEFAULT_WAKE_TIMEOUT = 300.0
ACTIVITY_STALE = 30.0  # a session count older than this is unknown (the login pod's writer stopped)


class TierError(Exception):
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


# ---------------------------------------------------------------- the tier


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
                   component=str((meta.get("labels") or {}).get(m.L_COMPONENT, "")),
                   replicas=1 if replicas is None else int(replicas),
                   ready=int(status.get("readyReplicas") or 0),
                   selector=",".join(f"{k}={v}" for k, v in sorted(match.items())),
                   annotations=dict(meta.get("annotations") or {}))


def sleep_order(workloads: Iterable[Workload]) -> list[Workload]:
    return sorted(workloads, key=lambda w: (w.rank, w.name))


def wake_order(workloads: Iterable[Workload]) -> list[Workload]:
    return list(reversed(sleep_order(workloads)))


def tier_state(workloads: Sequence[Workload]) -> str:
    """awake | asleep as the slurmctld StatefulSet's annotation says (awake when unset)."""
    for w in workloads:
        if w.component == m.CONTROLLER:
            return w.annotations.get(A_STATE, AWAKE)
    return AWAKE


# ---------------------------------------------------------------- deciding (pure)


@dataclass(frozen=True)
class Activity:
    """What keeps the tier awake, as one reconcile pass saw it; None = could not be read."""

    jobs: int | None  # jobs not finished (pending, running, completing, suspended, ...)
    workers: int | None  # worker pods, terminating ones included
    sessions: int | None  # authenticated SSH sessions on the login pod
    last_request: float | None = None  # last Slurm command / SSH login on the login pod (epoch)
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


# ---------------------------------------------------------------- the API boundary


class TierApi(Protocol):
    def list_workloads(self, namespace: str) -> list[dict[str, Any]]: ...

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]: ...

    def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None: ...

    def annotate(self, namespace: str, kind: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]: ...


TIER_SELECTOR = f"{m.L_TIER}={m.TIER_CONTROL}"
MERGE_PATCH = "application/merge-patch+json"  # the client would pick json-patch for a dict body


class ClientTierApi:
    """TierApi over the official client (raw JSON), with request timeouts."""

    def __init__(self, api_client: Any, timeout: tuple[float, float] = (5.0, 15.0)) -> None:
        from kubernetes import client

        self._apps = client.AppsV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from .kube import raw_call

        return raw_call(fn, self._timeout, *args, **kwargs)

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        out = []
        for kind, fn in (("StatefulSet", self._apps.list_namespaced_stateful_set),
                         ("Deployment", self._apps.list_namespaced_deployment)):
            for item in self._call(fn, namespace, label_selector=TIER_SELECTOR).get("items", []):
                out.append({**item, "kind": kind})
        return out

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        fn = self._apps.read_namespaced_stateful_set if kind == "StatefulSet" else self._apps.read_namespaced_deployment
        return {**self._call(fn, name, namespace), "kind": kind}

    def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        fn = (self._apps.patch_namespaced_stateful_set_scale if kind == "StatefulSet"
              else self._apps.patch_namespaced_deployment_scale)
        self._call(fn, name, namespace, {"spec": {"replicas": replicas}}, field_manager="slurmk8s-control-tier",
                   _content_type=MERGE_PATCH)

    def annotate(self, namespace: str, kind: str, name: str, annotations: Mapping[str, str]) -> None:
        fn = self._apps.patch_namespaced_stateful_set if kind == "StatefulSet" else self._apps.patch_namespaced_deployment
        self._call(fn, name, namespace, {"metadata": {"annotations": dict(annotations)}},
                   field_manager="slurmk8s-control-tier", _content_type=MERGE_PATCH)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._call(self._core.list_namespaced_pod, namespace, label_selector=selector).get("items", [])

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self._call(self._core.create_namespaced_event, namespace, dict(body))

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        return self._call(self._core.list_namespaced_event, namespace, field_selector=field_selector).get("items", [])


@dataclass
class FakeTierApi:
    """In-memory TierApi: workloads whose ready count follows replicas after `ready_after` polls
    (pods appear with them and go when scaled to 0), events, and a log of every call."""

    workloads: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    ready_after: int = 1  # get_workload calls until a scaled-up workload reports ready
    forbidden: set[str] = field(default_factory=set)  # verbs that fail with 403 (RBAC)
    _pending: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, kind: str, name: str, component: str, replicas: int = 1, tier: bool = True,
            annotations: Mapping[str, str] | None = None) -> None:
        labels = {m.L_COMPONENT: component, **({m.L_TIER: m.TIER_CONTROL} if tier else {})}
        self.workloads[(kind, name)] = {
            "kind": kind, "metadata": {"name": name, "labels": labels, "annotations": dict(annotations or {})},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {m.L_COMPONENT: component}}},
            "status": {"readyReplicas": replicas},
        }

    def _check(self, verb: str) -> None:
        from .kube import ApiError

        if verb in self.forbidden:
            raise ApiError(403, "Forbidden", f"cannot {verb}")

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        self._check("list")
        return [json.loads(json.dumps(o)) for o in self.workloads.values()
                if (o["metadata"]["labels"]).get(m.L_TIER) == m.TIER_CONTROL]

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        self._check("get")
        key = (kind, name)
        obj = self.workloads[key]
        if key in self._pending:
            self._pending[key] -= 1
            if self._pending[key] <= 0:
                del self._pending[key]
                obj["status"]["readyReplicas"] = obj["spec"]["replicas"]
        return json.loads(json.dumps(obj))

    def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        self._check("scale")
        self.calls.append(("scale", kind, name, replicas))
        obj = self.workloads[(kind, name)]
        obj["spec"]["replicas"] = replicas
        if replicas == 0:
            obj["status"]["readyReplicas"] = 0
        else:
            self._pending[(kind, name)] = self.ready_after

    def annotate(self, namespace: str, kind: str, name: str, annotations: Mapping[str, str]) -> None:
        self._check("annotate")
        self.calls.append(("annotate", kind, name, dict(annotations)))
        self.workloads[(kind, name)]["metadata"]["annotations"].update(annotations)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        want = dict(kv.split("=", 1) for kv in selector.split(",") if kv)
        pods = []
        for obj in self.workloads.values():
            if obj["spec"]["selector"]["matchLabels"] == want:
                pods += [{"metadata": {"name": f"{obj['metadata']['name']}-{i}"}}
                         for i in range(max(obj["spec"]["replicas"], obj["status"]["readyReplicas"]))]
        return pods

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self._check("event")
        self.calls.append(("event", body["reason"], body["message"]))
        self.events.append(dict(body))

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        want = dict(kv.split("=", 1) for kv in field_selector.split(",") if kv)
        return [e for e in self.events if all(_dig(e, k) == v for k, v in want.items())]


def _dig(obj: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


# ---------------------------------------------------------------- sleep and wake


def event_body(namespace: str, reason: str, message: str, at: float, source: str,
               kind: str = "StatefulSet", name: str = m.CONTROLLER) -> dict[str, Any]:
    stamp = rfc3339(at)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "apps/v1", "kind": kind, "name": name, "namespace": namespace},
        "reason": reason, "message": message[:1000], "type": "Normal",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": source},
    }


@dataclass
class Tier:
    """The control tier of one namespace, and the steps that sleep and wake it."""

    api: TierApi
    namespace: str
    source: str  # who acts: slurmk8s-reconcile, slurmk8s-login-agent, slurmk8s-cli
    log: Callable[[str], None] = lambda _line: None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    poll: float = 0.5

    def _api_error(self, what: str, err: Exception) -> TierError:
        status = getattr(err, "status", None)
        hint = ""
        if status == 403:
            hint = (" (RBAC: this identity may not do that in namespace "
                    f"{self.namespace}; see docs/elasticity.md, 'Idle sleep and wake', for the rights needed)")
        elif status == 404:
            hint = f" (not found in namespace {self.namespace}: is the cluster deployed?)"
        return TierError(f"{what}: {err}{hint}")

    def workloads(self) -> list[Workload]:
        from .kube import ApiError

        try:
            return [Workload.from_obj(o) for o in self.api.list_workloads(self.namespace)]
        except ApiError as err:
            raise self._api_error("cannot list the control tier", err) from None

    def event(self, reason: str, message: str) -> str:
        """Emit an Event on the slurmctld StatefulSet; returns an error text ('' when done)."""
        from .kube import ApiError

        try:
            self.api.create_event(self.namespace, event_body(self.namespace, reason, message, self.clock(),
                                                             self.source))
        except ApiError as err:
            return f"could not record Event {reason}: {err}"
        return ""

    def record(self, state: str, reason: str, event: str) -> None:
        """Annotate the slurmctld StatefulSet, emit the Event, log. Raises TierError when the
        annotation cannot be written (the Event is best effort, and logged when it fails)."""
        from .kube import ApiError

        now = self.clock()
        try:
            self.api.annotate(self.namespace, "StatefulSet", m.CONTROLLER,
                              {A_STATE: state, A_REASON: reason[:500], A_SINCE: rfc3339(now)})
        except ApiError as err:
            raise self._api_error(f"cannot record state {state} on statefulset/{m.CONTROLLER}", err) from None
        problem = self.event(event, reason)
        self.log(f"control tier {state}: {reason}" + (f" ({problem})" if problem else ""))

    def _scale(self, w: Workload, replicas: int) -> None:
        from .kube import ApiError

        try:
            self.api.scale(self.namespace, w.kind, w.name, replicas)
        except ApiError as err:
            raise self._api_error(f"cannot scale {w.ref} to {replicas}", err) from None

    def _ready(self, w: Workload) -> Workload:
        from .kube import ApiError

        try:
            return Workload.from_obj(self.api.get_workload(self.namespace, w.kind, w.name))
        except ApiError as err:
            raise self._api_error(f"cannot read {w.ref}", err) from None

    def pods_of(self, w: Workload) -> int:
        from .kube import ApiError

        if not w.selector:
            return 0
        try:
            return len(self.api.list_pods(self.namespace, w.selector))
        except ApiError as err:
            raise self._api_error(f"cannot list the pods of {w.ref}", err) from None

    def _why_not_ready(self, w: Workload) -> str:
        """The pod's own reason (image pull, crash, unschedulable), for a timeout message."""
        from .kube import ApiError, pod_phase, pod_reason

        try:
            pods = self.api.list_pods(self.namespace, w.selector) if w.selector else []
        except ApiError:
            return ""
        return "; ".join(f"pod {p['metadata']['name']} {pod_phase(p)}" + (f": {pod_reason(p)}" if pod_reason(p) else "")
                         for p in pods)

    # -- wake

    def wake(self, reason: str, progress: Callable[[str], None] = lambda _l: None,
             timeout: float = DEFAULT_WAKE_TIMEOUT, running_in: str = "") -> bool:
        """Scale every tier workload at zero back to one, database first, each ready before the
        next. Idempotent; True when something was asleep or still starting (then slurmctld may
        not answer RPCs yet), False when all was up. Leaves a WakeRequested Event naming who and
        why when it scales (the woken reconcile loop records the awake state with it).
        `running_in`: the component the caller itself runs in (the login agent: login), which is
        evidently up and must not be waited for (its readiness may wait for this very wake)."""
        ws = [w for w in self.workloads() if not running_in or w.component != running_in]
        if not any(w.component == m.CONTROLLER for w in ws):
            raise TierError(f"no statefulset/{m.CONTROLLER} labelled {TIER_SELECTOR} in namespace {self.namespace}: "
                            "is the cluster deployed (slurmk8s up), and does --namespace / --spec name it?")
        asleep = [w for w in ws if w.replicas < 1]
        if not asleep and all(w.ready >= 1 for w in ws):
            return False
        if asleep:
            problem = self.event(EV_WAKE_REQUEST, reason)
            if problem:
                self.log(problem)
            progress(f"waking the control tier ({reason})")
        start = self.clock()
        deadline = start + timeout
        for w in wake_order(ws):
            if w.replicas < 1:
                progress(f"scaling {w.ref} to 1")
                self._scale(w, 1)
            t0 = self.clock()
            while True:
                cur = self._ready(w)
                if cur.ready >= 1:
                    break
                if self.clock() > deadline:
                    why = self._why_not_ready(w)
                    raise TierError(f"{w.ref} not ready after {timeout:.0f}s" + (f": {why}" if why else "")
                                    + f"; see kubectl -n {self.namespace} describe {w.ref}")
                self.sleep(self.poll)
            progress(f"{w.ref} ready ({self.clock() - t0:.1f}s)")
        progress(f"control tier awake ({self.clock() - start:.1f}s)")
        return True

    # -- sleep

    def sleep_tier(self, reason: str, recheck: Callable[[], str], controller_stopped: Callable[[], bool],
                   gone_timeout: float = 30.0) -> bool:
        """Scale the tier to zero: login -> slurmctld -> slurmdbd -> database, each one's pods
        gone before the next. `recheck()` runs once the login pod is gone (and before slurmctld
        goes): a non-empty answer (a job or session appeared) aborts, scaling back up what was
        scaled down. `controller_stopped()` tells when slurmctld has saved its state and exited
        (this runs in the slurmctld pod: its own stop is awaited that way). True when asleep."""
        ws = sleep_order(self.workloads())
        self.record(ASLEEP, reason, EV_SLEEP)
        done: list[Workload] = []
        try:
            return self._sleep_steps(ws, done, recheck, controller_stopped, gone_timeout)
        except TierError as err:
            if any(d.component == m.CONTROLLER for d in done):
                raise  # slurmctld is stopping: the woken loop finishes or undoes the rest
            for d in reversed(done):
                try:
                    self._scale(d, 1)
                except TierError as again:
                    self.log(f"sleep failed and {d.ref} could not be scaled back: {again}")
            self.record(AWAKE, f"sleep failed: {err}", EV_SLEEP_ABORTED)
            raise

    def _sleep_steps(self, ws: list[Workload], done: list[Workload], recheck: Callable[[], str],
                     controller_stopped: Callable[[], bool], gone_timeout: float) -> bool:
        for w in ws:
            if w.component == m.CONTROLLER:
                late = recheck()
                if late:
                    for d in reversed(done):
                        self._scale(d, 1)
                    self.record(AWAKE, f"sleep aborted: {late}", EV_SLEEP_ABORTED)
                    return False
            self.log(f"sleep: scaling {w.ref} to 0")
            self._scale(w, 0)
            done.append(w)
            deadline = self.clock() + gone_timeout
            if w.component == m.CONTROLLER:
                while not controller_stopped() and self.clock() < deadline:
                    self.sleep(self.poll)
                self.log("sleep: slurmctld stopped (state saved)" if controller_stopped()
                         else f"sleep: slurmctld still answers after {gone_timeout:.0f}s; going on")
                continue
            while self.pods_of(w) and self.clock() < deadline:
                self.sleep(self.poll)
            if self.pods_of(w):
                self.log(f"sleep: pods of {w.ref} still there after {gone_timeout:.0f}s; going on")
        self.log("sleep: control tier at zero replicas")
        return True

    # -- on start of the reconcile loop

    def on_controller_start(self) -> str:
        """The loop just started in a running slurmctld pod: the tier is awake. Record it (with the
        latest wake request's reason when the annotation still says asleep), and scale back up any
        tier workload left at zero by an interrupted sleep. Returns what was done."""
        from .kube import ApiError

        ws = self.workloads()
        ctl = next((w for w in ws if w.component == m.CONTROLLER), None)
        if ctl is None:
            return "no slurmctld StatefulSet labelled as the control tier"
        state = ctl.annotations.get(A_STATE)
        left = [w for w in ws if w.replicas < 1 and w.component != m.CONTROLLER]
        for w in wake_order(left):
            self.log(f"wake: {w.ref} was left at 0 replicas; scaling it to 1")
            self._scale(w, 1)
        if state == AWAKE:
            return "already recorded awake"
        if state is None:
            self.record(AWAKE, "deployed", EV_WAKE)
            return "recorded awake (deployed)"
        since = parse_rfc3339(ctl.annotations.get(A_SINCE)) or 0.0
        reason = "slurmctld started (no wake request recorded)"
        try:
            events = self.api.list_events(self.namespace, f"involvedObject.name={m.CONTROLLER},reason={EV_WAKE_REQUEST}")
        except ApiError as err:
            self.log(f"cannot read wake requests: {err}")
            events = []
        requests = [(parse_rfc3339(e.get("lastTimestamp") or e.get("eventTime")) or 0.0, str(e.get("message", "")))
                    for e in events]
        requests = [r for r in requests if r[0] >= since - 1]
        if requests:
            reason = max(requests)[1]
        self.record(AWAKE, f"woken: {reason}", EV_WAKE)
        return f"recorded awake ({reason})"


# ---------------------------------------------------------------- the login pod's side


def read_activity_file(path: str) -> tuple[float, int, tuple[str, ...]] | None:
    """The login container's session count: one line `EPOCH COUNT USER,USER`, rewritten every few
    seconds by the login entrypoint (images/entrypoint/login.sh)."""
    try:
        with open(path) as fh:
            parts = fh.read().split()
    except OSError:
        return None
    try:
        users = tuple(u for u in parts[2].split(",") if u) if len(parts) > 2 else ()
        return float(parts[0]), int(parts[1]), users
    except (IndexError, ValueError):
        return None


def activity_doc(path: str, last_request: float | None, now: float) -> dict[str, Any]:
    got = read_activity_file(path)
    if got is None:
        return {"sessions": None, "error": f"no session count in {path} yet", "last_request": last_request}
    at, count, users = got
    if now - at > ACTIVITY_STALE:
        return {"sessions": None, "error": f"session count is {now - at:.0f}s old", "last_request": last_request}
    return {"sessions": count, "users": list(users), "updated": at, "last_request": last_request}


def activity_from_doc(doc: Mapping[str, Any] | None, error: str = "") -> tuple[int | None, tuple[str, ...], float | None, str]:
    """(sessions, users, last_request, why unknown) from the agent's /activity answer."""
    if doc is None:
        return None, (), None, error or "no answer"
    sessions = doc.get("sessions")
    last = doc.get("last_request")
    return (int(sessions) if isinstance(sessions, int) else None, tuple(doc.get("users") or ()),
            float(last) if isinstance(last, (int, float)) else None, str(doc.get("error") or ""))


class Agent:
    """The login pod's sidecar: wakes the tier for the login container's Slurm commands (line
    protocol on the pod's loopback) and serves the session count to the reconcile loop."""

    def __init__(self, tier: Tier, activity_file: str, timeout: float = DEFAULT_WAKE_TIMEOUT,
                 awake_cache: float = 2.0) -> None:
        self.tier = tier
        self.activity_file = activity_file
        self.timeout = timeout
        self.awake_cache = awake_cache
        self.last_request: float | None = None
        self._lock = threading.Lock()
        self._awake_at = 0.0
        self._waking = ""  # the reason of the wake under way
        self._woken = 0  # wakes done (requests that waited for one see it change)

    def handle(self, line: str, send: Callable[[str], None]) -> None:
        """One request: `wake USER WHAT`. Replies `progress TEXT`*, then `ok awake` (nothing to do),
        `ok woken` or `error TEXT`."""
        parts = line.split()
        if len(parts) < 1 or parts[0] != "wake":
            send("error unknown request (expected: wake USER COMMAND)")
            return
        user = parts[1] if len(parts) > 1 else "?"
        what = " ".join(parts[2:]) or "a Slurm command"
        self.last_request = time.time()
        if time.monotonic() - self._awake_at < self.awake_cache:
            send("ok awake")
            return
        generation = self._woken
        if self._waking:  # a wake is under way (e.g. from this user's SSH login): wait for it
            send(f"progress waking the control tier (already under way for {self._waking})")
        with self._lock:  # one wake at a time
            if self._woken != generation:
                send("ok woken")  # the wake we waited for is done; the caller waits for slurmctld
                return
            reason = f"{what} by {user} on the login pod"
            self._waking = reason
            try:
                woke = self.tier.wake(reason, progress=lambda t: send(f"progress {t}"), timeout=self.timeout,
                                      running_in=m.LOGIN)
            except TierError as err:
                self.tier.log(f"wake for {reason} failed: {err}")
                send(f"error {err}")
                return
            finally:
                self._waking = ""
            self._awake_at = time.monotonic()
            if woke:
                self._woken += 1
        if woke:
            self.tier.log(f"woke the control tier for {reason}")
        send("ok woken" if woke else "ok awake")

    def activity(self) -> dict[str, Any]:
        return activity_doc(self.activity_file, self.last_request, time.time())


def _serve_lines(agent: Agent, host: str, port: int) -> None:
    import socketserver

    class Handler(socketserver.StreamRequestHandler):
        timeout = 15  # a client that sends no request line does not hold a thread for ever

        def handle(self) -> None:
            try:
                line = self.rfile.readline(512).decode(errors="replace").strip()
            except OSError:
                return

            def send(text: str) -> None:
                try:
                    self.wfile.write((" ".join(text.split()) + "\n").encode())
                    self.wfile.flush()
                except OSError:
                    pass  # the client left (a background wake from an SSH login): keep waking

            agent.handle(line, send)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server((host, port), Handler) as srv:
        srv.serve_forever()


def _serve_activity(agent: Agent, port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/activity":
                self.send_error(404)
                return
            body = json.dumps(agent.activity()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def agent_main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from .kube import _api_client

    parser = argparse.ArgumentParser(prog="python -m provisioner.controltier",
                                     description="The login pod's wake agent (see the module docstring).")
    parser.add_argument("--namespace", default=os.environ.get("SLURMK8S_NAMESPACE", ""))
    parser.add_argument("--wake-port", type=int, default=m.WAKE_PORT)
    parser.add_argument("--activity-port", type=int, default=m.ACTIVITY_PORT)
    parser.add_argument("--activity-file", default=f"{m.ACTIVITY_DIR}/sessions")
    parser.add_argument("--timeout", type=float, default=DEFAULT_WAKE_TIMEOUT)
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(f"{rfc3339(time.time())} login-agent {line}", flush=True)

    namespace = args.namespace
    if not namespace:
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as fh:
                namespace = fh.read().strip()
        except OSError:
            log("no --namespace and no ServiceAccount namespace file")
            return 2
    tier = Tier(ClientTierApi(_api_client(os.environ)), namespace, "slurmk8s-login-agent", log=log)
    agent = Agent(tier, args.activity_file, timeout=args.timeout)
    threading.Thread(target=_serve_activity, args=(agent, args.activity_port), daemon=True).start()
    log(f"serving wake requests on 127.0.0.1:{args.wake_port}, activity on :{args.activity_port}/activity "
        f"(namespace {namespace})")
    _serve_lines(agent, "127.0.0.1", args.wake_port)
    return 0


def fetch_activity(url: str, timeout: float = 3.0) -> tuple[dict[str, Any] | None, str]:
    """GET the login agent's /activity: (document, '') or (None, why not)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            doc = json.loads(resp.read().decode())
    except (OSError, urllib.error.URLError, ValueError) as err:
        return None, f"login agent at {url} did not answer: {err}"
    return (doc if isinstance(doc, dict) else None), ""


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(agent_main())
