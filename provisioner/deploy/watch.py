"""Watching the cluster while `slurmk8s up` applies: claims that do not bind, pods that cannot start.

Pulumi's await logic waits up to 10 minutes for a StatefulSet or Deployment and then reports the
last pod status it saw ("containers with unready status: [slurmdbd]"), which names neither the
cause nor the fix. While the update runs, :class:`Watcher` lists the namespace's claims and the
cluster's own pods (not the workers), the events of claims and the Warning events of pods (field
selectors), the PersistentVolumes and StorageClasses, every :data:`POLL` seconds. :func:`diagnose`
(pure: API objects as plain dicts in, :class:`Finding` out) says what Kubernetes reports and what to
do; a finding that will not change by itself (``fatal``) and has lasted its ``bound`` stops `up`:
the engine is asked to cancel and the error lists the findings. The others are printed once as
notes (a crash-looping container, a pod waiting for capacity an autoscaler may add).

What stops `up`:

- a claim that cannot bind: a PersistentVolume reserved for it that still holds the deleted claim of
  the same name (Released after ``down --purge``); a binding or provisioning failure the PV
  controller reports; a class without a provisioner that has no volume for it; an external
  provisioner that made no volume within :data:`PROVISION_BOUND`; its pod unschedulable because of
  its volumes (WaitForFirstConsumer);
- a pod that cannot start: an image that is not there (ErrImageNeverPull, InvalidImageName at
  once; ErrImagePull / ImagePullBackOff after :data:`IMAGE_BOUND`), a container whose config cannot
  be made (CreateContainerConfigError), volumes that bind to no node the pod may run on.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .. import manifests as m
from .. import volumes as vol

POLL = 2.0
DEFINITE_BOUND = 4.0  # causes that cannot change (a volume held by a deleted claim, an image that is not there)
CLAIM_BOUND = 15.0  # a claim Pending with a reason Kubernetes gives, a pod unschedulable because of its volumes
IMAGE_BOUND = 30.0  # pulls that fail (a registry may answer late)
CONFIG_BOUND = 30.0  # a Secret or ConfigMap the pod needs (created by the same update)
PROVISION_BOUND = 120.0  # an external provisioner that has not made the volume
NOTE_BOUND = 20.0  # notes are printed once they last this long

Obj = Mapping[str, Any]

CLAIMS = {m.HOME_PVC: ("storage.home", "/home"),
          m.CONTROLLER_STATE_PVC: ("storage.controller_state", "slurmctld state"),
          m.DATABASE_PVC: ("storage.database", "accounting database")}
NO_PROVISIONER = "kubernetes.io/no-provisioner"
DEFAULT_CLASS = ("storageclass.kubernetes.io/is-default-class", "storageclass.beta.kubernetes.io/is-default-class")
VOLUME_WORDS = re.compile(r"persistent ?volume|volume node affinity|PersistentVolumeClaim|volume binding|"
                          r"bind volume|unbound", re.I)
NEVER_PULL = ("ErrImageNeverPull", "InvalidImageName")
PULL = ("ErrImagePull", "ImagePullBackOff")
CONFIG = ("CreateContainerConfigError", "CreateContainerError")


@dataclass(frozen=True)
class Snapshot:
    """What one look at the cluster saw (plain dicts, as `kubectl get -o json` shows them)."""

    namespace: str
    claims: Sequence[Obj] = ()  # PVCs of the namespace
    pods: Sequence[Obj] = ()  # the cluster's pods (not the workers)
    events: Sequence[Obj] = ()  # events of the claims, Warning events of the pods
    volumes: Sequence[Obj] = ()  # PersistentVolumes (none when the credentials may not list them)
    storage_classes: Sequence[Obj] = ()
    local: bool = False  # the local cluster of this machine: fixes name `slurmk8s cluster ...`


@dataclass(frozen=True)
class Finding:
    key: str  # identity across looks (object uid + cause)
    subject: str  # "claim home (/home)", "pod slurmdbd-6d9f-x"
    message: str  # what is wrong, in Kubernetes' words where it has some
    fix: str
    fatal: bool  # will not change by itself: stops `up` once it lasted `bound` seconds
    bound: float

    def text(self, lasted: float | None = None) -> str:
        since = f" for {lasted:.0f}s" if lasted is not None and lasted >= 1 else ""
        return f"{self.subject}{since}: {self.message.rstrip('. ')}" + (f". Fix: {self.fix}" if self.fix else "")


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _name(obj: Obj) -> str:
    return _meta(obj).get("name", "")


def _when(ev: Obj) -> str:
    return str(ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp") or "")


def events_of(obj: Obj, kind: str, events: Sequence[Obj]) -> list[Obj]:
    """Events about this very object (same uid when the event names one), oldest first."""
    uid = _meta(obj).get("uid")
    out = []
    for ev in events:
        inv = ev.get("involvedObject") or {}
        if inv.get("kind") != kind or inv.get("name") != _name(obj):
            continue
        if uid and inv.get("uid") and inv["uid"] != uid:
            continue
        out.append(ev)
    return sorted(out, key=_when)


def _class_of(claim: Obj, classes: Mapping[str, Obj]) -> tuple[str | None, Obj | None]:
    name = (claim.get("spec") or {}).get("storageClassName")
    if name is None:  # unset: the default class, when the cluster has one
        name = next((n for n, sc in classes.items()
                     if any(((sc.get("metadata") or {}).get("annotations") or {}).get(a) == "true"
                            for a in DEFAULT_CLASS)), None)
    return name or None, classes.get(name or "")


def _claim_label(name: str) -> tuple[str, str]:
    where, purpose = CLAIMS.get(name, ("storage.<volume>", name))
    return where, purpose


def _consumers(claim: str, pods: Sequence[Obj]) -> list[Obj]:
    return [p for p in pods
            if any(((v.get("persistentVolumeClaim") or {}).get("claimName") == claim)
                   for v in (p.get("spec") or {}).get("volumes") or [])]


def _unschedulable(pod: Obj, events: Sequence[Obj]) -> str | None:
    """The scheduler's message for a pod it could not place, else None."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "Unschedulable")
    failed = [ev for ev in events_of(pod, "Pod", events) if ev.get("reason") == "FailedScheduling"]
    return str(failed[-1].get("message") or "FailedScheduling") if failed else None


def _static_fix(claim: Obj, where: str, cls: str | None, namespace: str) -> str:
    spec = claim.get("spec") or {}
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "?")
    modes = "/".join(spec.get("accessModes") or [])
    return (f"create a PersistentVolume of class {cls!r} with at least {size} {modes} for {namespace}/{_name(claim)} "
            f"(see examples/localk8s/storage.yaml), or set {where}.storage_class to a class with a provisioner")


def _claim_findings(claim: Obj, snap: Snapshot, classes: Mapping[str, Obj]) -> list[Finding]:
    name = _name(claim)
    uid = _meta(claim).get("uid", name)
    where, purpose = _claim_label(name)
    subject = f"claim {name} ({purpose}) Pending"
    held = vol.released_for(snap.namespace, name, snap.volumes, snap.claims)
    if held:
        pv = held[0]
        old = ((pv.get("spec") or {}).get("claimRef") or {}).get("uid", "")
        return [Finding(f"{uid}/held", subject,
                        f"PersistentVolume {_name(pv)} is reserved for it but still belongs to the deleted claim of the "
                        f"same name (uid {old[:8]}..., volume {vol.phase(pv) or 'phase unknown'}), so Kubernetes binds "
                        "it to no new claim",
                        vol.release_fix(_name(pv), local=snap.local and vol.is_local_volume(pv), namespace=snap.namespace),
                        True, DEFINITE_BOUND)]
    cls, sc = _class_of(claim, classes)
    evs = events_of(claim, "PersistentVolumeClaim", snap.events)
    last = evs[-1] if evs else {}
    reason, said = str(last.get("reason") or ""), str(last.get("message") or "")
    if reason in ("ProvisioningFailed", "FailedBinding"):
        if cls is None:
            have = ", ".join(sorted(classes)) or "none"
            fix = f"set {where}.storage_class to one of the cluster's classes ({have}), or make one the default"
        elif sc is not None and sc.get("provisioner") == NO_PROVISIONER:
            fix = _static_fix(claim, where, cls, snap.namespace)
        else:
            fix = f"see why the provisioner of class {cls!r} fails (its logs), or set {where}.storage_class to another class"
        return [Finding(f"{uid}/{reason}", subject, f"{reason}: {said}", fix, True, CLAIM_BOUND)]
    if reason == "ExternalProvisioning":
        provisioner = (sc or {}).get("provisioner", "?")
        if provisioner == NO_PROVISIONER:
            return [Finding(f"{uid}/static", subject,
                            f"StorageClass {cls!r} has no provisioner and no PersistentVolume of it fits this claim",
                            _static_fix(claim, where, cls, snap.namespace), True, CLAIM_BOUND)]
        return [Finding(f"{uid}/provisioning", subject, f"no volume yet: {said}",
                        f"check that the provisioner {provisioner} of class {cls!r} runs and can create volumes "
                        f"(`kubectl get pods -A`, its logs), or set {where}.storage_class to another class",
                        True, PROVISION_BOUND)]
    consumers = _consumers(name, snap.pods)
    if reason in ("WaitForFirstConsumer", "WaitForPodScheduled") or (sc or {}).get("volumeBindingMode") == "WaitForFirstConsumer":
        for pod in consumers:
            why = _unschedulable(pod, snap.events)
            if why and VOLUME_WORDS.search(why):
                fix = (_static_fix(claim, where, cls, snap.namespace) if (sc or {}).get("provisioner") == NO_PROVISIONER
                       else f"see `kubectl describe pvc -n {snap.namespace} {name}`; set {where}.storage_class to a "
                       "class whose volumes the cluster's nodes can reach")
                return [Finding(f"{uid}/unschedulable", subject,
                                f"its class {cls!r} binds when a pod uses it (WaitForFirstConsumer), and its pod "
                                f"{_name(pod)} cannot be scheduled: {why}", fix, True, CLAIM_BOUND)]
        if not consumers:
            return [Finding(f"{uid}/no-consumer", subject,
                            f"its class {cls!r} binds when a pod uses it (WaitForFirstConsumer) and no pod using it "
                            "exists yet", "", False, NOTE_BOUND)]
        return []
    if not evs:
        return [Finding(f"{uid}/silent", subject, "Kubernetes reported no event for it yet",
                        "check that kube-controller-manager runs (it binds claims)", False, NOTE_BOUND)]
    return []


def _image(pod: Obj, container: str) -> str:
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if c.get("name") == container:
            return str(c.get("image", "?"))
    return "?"


def _failed_exit(cs: Obj) -> Mapping[str, Any] | None:
    """The container's last exit when it failed (now or the run before)."""
    for term in ((cs.get("state") or {}).get("terminated"), (cs.get("lastState") or {}).get("terminated")):
        if term and term.get("exitCode") not in (None, 0):
            return term
    return None


def _pod_findings(pod: Obj, snap: Snapshot, claims: Mapping[str, Obj]) -> list[Finding]:
    if _meta(pod).get("deletionTimestamp"):
        return []
    name = _name(pod)
    uid = _meta(pod).get("uid", name)
    subject = f"pod {name}"
    out = []
    why = _unschedulable(pod, snap.events)
    if why:
        used = [(v.get("persistentVolumeClaim") or {}).get("claimName") for v in (pod.get("spec") or {}).get("volumes") or []]
        pending = [c for c in used if c and vol.phase(claims.get(c, {})) in ("Pending", "")]
        if VOLUME_WORDS.search(why):
            if not pending:  # its claims are bound, to volumes no node it may use can reach
                held = ", ".join(f"{c} (PersistentVolume {(claims.get(c, {}).get('spec') or {}).get('volumeName', '?')})"
                                 for c in used if c)
                out.append(Finding(f"{uid}/volumes", subject,
                                   f"cannot be scheduled: {why.rstrip('. ')}; its claims are bound: {held}",
                                   "a volume's node affinity names no node this pod may run on: give the volume one "
                                   "that does (a PersistentVolume's node affinity cannot change: re-create it; "
                                   "`kubectl get pv -o yaml`), or `slurmk8s down --purge` and use other volumes",
                                   True, CLAIM_BOUND))
            # else: the claim's finding says why
        else:
            out.append(Finding(f"{uid}/capacity", subject, f"cannot be scheduled yet: {why}",
                               "free or add capacity; `up` keeps waiting (an autoscaler may add a node)", False,
                               NOTE_BOUND))
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        said = str(waiting.get("message") or "").strip()
        container = cs.get("name", "?")
        image = _image(pod, container)
        what = f"container {container}: {reason}" + (f": {said}" if said else "")
        load = f"`slurmk8s cluster load-image {image}`" if snap.local else "push it to a registry the nodes reach"
        if reason in NEVER_PULL:
            fix = (f"make image {image} available on the cluster's nodes ({load}) or fix images.* in the spec"
                   + (" (images.pull_policy is Never: nothing is pulled)" if reason == "ErrImageNeverPull" else ""))
            out.append(Finding(f"{uid}/{container}/{reason}", subject, what, fix, True, DEFINITE_BOUND))
        elif reason in PULL:
            out.append(Finding(f"{uid}/{container}/pull", subject, what,
                               f"make image {image} pullable from the cluster's nodes ({load}), or fix images.* in the "
                               "spec", True, IMAGE_BOUND))
        elif reason in CONFIG:
            out.append(Finding(f"{uid}/{container}/config", subject, what,
                               f"see `kubectl -n {snap.namespace} describe pod {name}`", True, CONFIG_BOUND))
        elif reason == "CrashLoopBackOff" or (int(cs.get("restartCount") or 0) >= 2 and _failed_exit(cs)):
            term = _failed_exit(cs) or {}
            code = term.get("exitCode", "?")
            out.append(Finding(f"{uid}/{container}/crash", subject,
                               f"container {container} keeps exiting (restarts {cs.get('restartCount', 0)}, last exit "
                               f"code {code}{', ' + term['reason'] if term.get('reason') else ''})",
                               f"`kubectl -n {snap.namespace} logs {name} -c {container} --previous`; it often follows "
                               "from a service it needs that has not started (see the other lines)", False, NOTE_BOUND))
    return out


def diagnose(snap: Snapshot) -> list[Finding]:
    """Every finding in one look at the cluster: claims first (the usual root cause), then pods."""
    classes = {_name(sc): sc for sc in snap.storage_classes}
    claims = {_name(c): c for c in snap.claims}
    out: list[Finding] = []
    for claim in snap.claims:
        if vol.phase(claim) in ("Pending", "") and not _meta(claim).get("deletionTimestamp"):
            out += _claim_findings(claim, snap, classes)
    for pod in snap.pods:
        out += _pod_findings(pod, snap, claims)
    return out


@dataclass
class Tracker:
    """How long each finding has lasted (first seen on this clock); which are due."""

    first: dict[str, float] = field(default_factory=dict)
    noted: set[str] = field(default_factory=set)

    def observe(self, findings: Sequence[Finding], now: float) -> tuple[list[Finding], list[tuple[Finding, float]]]:
        """(notes to print now, fatal findings due with how long they lasted)."""
        keys = {f.key for f in findings}
        for gone in set(self.first) - keys:
            del self.first[gone]
        notes, due = [], []
        for f in findings:
            lasted = now - self.first.setdefault(f.key, now)
            if lasted < f.bound:
                continue
            if f.fatal:
                due.append((f, lasted))
            elif f.key not in self.noted:
                self.noted.add(f.key)
                notes.append(f)
        return notes, due


def report(due: Sequence[tuple[Finding, float]], elapsed: float) -> str:
    lines = [f"`up` stopped after {elapsed:.0f}s: {len(due)} problem(s) that will not go away by waiting:"]
    lines += [f"  - {f.text(lasted)}" for f, lasted in due]
    lines.append("The objects applied so far stay; after the fix, `slurmk8s up` continues from there.")
    return "\n".join(lines)


# ---------------------------------------------------------------- reading the cluster


def read(api_client: Any, cluster: str, namespace: str, *, local: bool = False,
         cluster_wide: bool = True) -> Snapshot:
    """One look: the namespace's claims, the cluster's pods (not the workers), their events; the
    volumes and classes when `cluster_wide` (credentials that may not list them: leave it False)."""
    from kubernetes import client

    from ..kubeapi import ApiError, raw_call

    core = client.CoreV1Api(api_client)
    t = (5.0, 20.0)
    claims = raw_call(core.list_namespaced_persistent_volume_claim, t, namespace).get("items") or []
    pods = raw_call(core.list_namespaced_pod, t, namespace,
                    label_selector=f"{m.L_CLUSTER}={cluster},{m.L_COMPONENT} notin (worker,db-check,image-check)").get("items") or []
    events = (raw_call(core.list_namespaced_event, t, namespace,
                       field_selector="involvedObject.kind=PersistentVolumeClaim").get("items") or []) + \
             (raw_call(core.list_namespaced_event, t, namespace,
                       field_selector="involvedObject.kind=Pod,type=Warning").get("items") or [])
    volumes: list[Any] = []
    classes: list[Any] = []
    if cluster_wide:
        try:
            volumes = raw_call(core.list_persistent_volume, t).get("items") or []
            classes = raw_call(client.StorageV1Api(api_client).list_storage_class, t).get("items") or []
        except ApiError as err:
            if err.status != 403:  # credentials limited to the namespace: judge without volumes and classes
                raise
    return Snapshot(namespace, claims, pods, events, volumes, classes, local)


class Watcher:
    """Looks at the cluster every `poll` seconds in a thread until stopped, prints notes once, and
    on fatal findings that lasted their bound records them in `stopped_by` and calls `on_fatal`."""

    def __init__(self, look: Callable[[], Snapshot], echo: Callable[[str], Any], on_fatal: Callable[[], Any], *,
                 poll: float = POLL, clock: Callable[[], float] = time.monotonic) -> None:
        self._look = look
        self._echo = echo
        self._on_fatal = on_fatal
        self._poll = poll
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.tracker = Tracker()
        self.started = clock()
        self.stopped_by: list[tuple[Finding, float]] = []
        self.failed_looks = 0

    def check(self) -> list[tuple[Finding, float]]:
        """One look; returns the fatal findings due (also kept in `stopped_by`)."""
        from ..errors import SlurmK8sError

        try:
            snap = self._look()
            findings = diagnose(snap)
        except SlurmK8sError as err:  # an API hiccup: look again next time
            self.failed_looks += 1
            if self.failed_looks == 3:
                self._echo(f"watch: cannot read the cluster ({err}); `up` goes on, the watch keeps trying")
            return []
        except Exception as err:  # noqa: BLE001 - a bug here must not break `up`: say so and stop watching
            self._echo(f"watch: stopped by an internal error ({type(err).__name__}: {err}); `up` goes on unwatched")
            self._stop.set()
            return []
        self.failed_looks = 0
        notes, due = self.tracker.observe(findings, self._clock())
        for f in notes:
            self._echo(f"note: {f.text()}")
        if due and not self.stopped_by:
            self.stopped_by = due
        return due

    def _loop(self) -> None:
        while not self._stop.wait(self._poll):
            if self.check():
                for f, lasted in self.stopped_by:
                    self._echo(f"error: {f.text(lasted)}")
                self._echo("stopping `up`: asking the Pulumi engine to cancel")
                self._on_fatal()
                return

    def start(self) -> "Watcher":
        self.started = self._clock()
        self._thread = threading.Thread(target=self._loop, name="slurmk8s-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def elapsed(self) -> float:
        return self._clock() - self.started
