"""Sleep and wake of the control tier: scale its workloads in order, record the state on the
ConfigMap slurmk8s-tier-state (its annotations) and as Kubernetes Events.

The state was kept on the slurmctld StatefulSet's annotations before: that took `patch` of the
StatefulSet, which also rewrites slurmctld's pod template (any image, privileged, hostPath), a pod
the StatefulSet controller then creates past the worker pod admission policy. slurmctld's account
now scales its workloads by their scale subresource alone. A cluster upgraded from that release
(asleep, say) has the old annotations and an empty ConfigMap: they are read while the ConfigMap
has no state (:meth:`Tier.state`), and the woken loop's first record moves the state over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .. import names
from .api import TIER_SELECTOR, TierApi, event_body
from .decision import (
    A_REASON,
    A_SINCE,
    A_STATE,
    ASLEEP,
    AWAKE,
    DEFAULT_WAKE_TIMEOUT,
    EV_SLEEP,
    EV_SLEEP_ABORTED,
    EV_WAKE,
    EV_WAKE_REQUEST,
    TierError,
    Workload,
    parse_rfc3339,
    rfc3339,
    sleep_order,
    tier_state,
    wake_order,
)

# what a wake waits for: what Slurm commands and logins need (accounting comes up on its own)
WAKE_WAITS_FOR = frozenset({names.CONTROLLER, names.LOGIN})


# the kubelet's FailedMount message when it could not read a pod's PersistentVolumeClaim
# (`Unable to attach or mount volumes: ... error processing PVC NS/NAME: failed to fetch PVC ...`)
PVC_NOT_READ = "error processing PVC"

SLEEP_WAIT = 120.0  # how long a wake waits for a sleep under way to finish (each step is bounded)


@dataclass
class _Replaced:
    """One wait's record for Tier._replace_skipped_pod: the pod uids it deleted (each once) and
    whether a refusal was logged (once per wake)."""
    uids: set[str] = field(default_factory=set)
    refusal_logged: bool = False


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
    # how often a wake asks `answers` (slurmctld's port) while it waits; None: each poll
    answer_poll: float | None = None
    # whether a wake may list and delete a woken Deployment's pods (the login pod's, when it sleeps
    # with the tier) that the kubelet skipped for their claim: the CLI's own credentials may; the
    # wakers' Roles (login agent, REST front) name slurmctld's pod alone, as a Deployment's pod names
    # are not known in advance and an unnamed `delete` would reach the workers
    replace_deployment_pods: bool = False
    _state_refusal_logged: bool = field(default=False, init=False, repr=False)

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
        """The tier's workloads, slurmctld's carrying the recorded state (:meth:`state`) as its
        annotations (what decision.tier_state reads)."""
        from ..kubeapi import ApiError

        try:
            ws = [Workload.from_obj(o) for o in self.api.list_workloads(self.namespace)]
        except ApiError as err:
            raise self._api_error("cannot list the control tier", err) from None
        ctl = next((w for w in ws if w.component == names.CONTROLLER), None)
        if ctl is None:
            return ws
        state = self.state(ctl)
        return [replace(w, annotations=state) if w is ctl else w for w in ws]

    def state(self, ctl: Workload) -> dict[str, str]:
        """The recorded state (A_STATE, A_REASON, A_SINCE): the state ConfigMap's annotations; while
        it has none (a cluster upgraded from a release that annotated the StatefulSet, until the
        loop's first record) or is not there (a cluster deployed by such a release), those of the
        slurmctld StatefulSet `ctl`. A refusal (an identity without `get` on that ConfigMap: a
        user's kubeconfig with the rights documented before it) reads the StatefulSet's too, and is
        logged once: the state only tells a wake to wait for a sleep under way."""
        from ..kubeapi import ApiError

        keys = (A_STATE, A_REASON, A_SINCE)
        try:
            recorded = self.api.get_state(self.namespace)
        except ApiError as err:
            if err.status == 403:
                if not self._state_refusal_logged:
                    self._state_refusal_logged = True
                    self.log(f"cannot read configmap/{names.TIER_STATE} (the control tier's state): {err}; a sleep "
                             "under way is not seen (grant get on it: docs/elasticity.md, 'Idle sleep and wake')")
            elif err.status != 404:
                raise self._api_error(f"cannot read the control tier's state (configmap/{names.TIER_STATE})", err) from None
            recorded = {}
        source = recorded if A_STATE in recorded else ctl.annotations
        return {k: str(source[k]) for k in keys if k in source}

    def event(self, reason: str, message: str) -> str:
        """Emit an Event on the slurmctld StatefulSet; returns an error text ('' when done)."""
        from ..kubeapi import ApiError

        try:
            self.api.create_event(self.namespace, event_body(self.namespace, reason, message, self.clock(),
                                                             self.source))
        except ApiError as err:
            return f"could not record Event {reason}: {err}"
        return ""

    def record(self, state: str, reason: str, event: str) -> None:
        """Annotate the state ConfigMap, emit the Event, log. Raises TierError when the
        annotation cannot be written (the Event is best effort, and logged when it fails)."""
        from ..kubeapi import ApiError

        now = self.clock()
        try:
            self.api.set_state(self.namespace, {A_STATE: state, A_REASON: reason[:500], A_SINCE: rfc3339(now)})
        except ApiError as err:
            hint = (f" (configmap/{names.TIER_STATE} is made by the deploy: run `slurmk8s up` again)"
                    if err.status == 404 else "")
            raise self._api_error(f"cannot record state {state} on configmap/{names.TIER_STATE}{hint}", err) from None
        problem = self.event(event, reason)
        self.log(f"control tier {state}: {reason}" + (f" ({problem})" if problem else ""))

    def _scale(self, w: Workload, replicas: int) -> None:
        from ..kubeapi import ApiError

        try:
            self.api.scale(self.namespace, w.kind, w.name, replicas)
        except ApiError as err:
            raise self._api_error(f"cannot scale {w.ref} to {replicas}", err) from None

    def _ready(self, w: Workload) -> Workload:
        from ..kubeapi import ApiError

        try:
            return Workload.from_obj(self.api.get_workload(self.namespace, w.kind, w.name))
        except ApiError as err:
            raise self._api_error(f"cannot read {w.ref}", err) from None

    def pods_of(self, w: Workload) -> int:
        from ..kubeapi import ApiError

        if not w.selector:
            return 0
        try:
            return len(self.api.list_pods(self.namespace, w.selector))
        except ApiError as err:
            raise self._api_error(f"cannot list the pods of {w.ref}", err) from None

    def _why_not_ready(self, w: Workload) -> str:
        """The pod's own reason (image pull, crash, unschedulable), for a timeout message."""
        from ..elastic.pods import pod_phase, pod_reason
        from ..kubeapi import ApiError

        try:
            pods = self.api.list_pods(self.namespace, w.selector) if w.selector else []
        except ApiError:
            return ""
        return "; ".join(f"pod {p['metadata']['name']} {pod_phase(p)}" + (f": {pod_reason(p)}" if pod_reason(p) else "")
                         for p in pods)

    # -- wake

    def wake(self, reason: str, progress: Callable[[str], None] = lambda _l: None,
             timeout: float = DEFAULT_WAKE_TIMEOUT, running_in: str = "",
             scaled: Callable[[], None] = lambda: None, answers: Callable[[], bool] | None = None) -> bool:
        """Scale every tier workload at zero back to one, all at once, and wait until slurmctld (and
        the login pod, when it sleeps with the tier) is ready; accounting (slurmdbd, its database)
        finishes starting on its own. Idempotent; True when something was asleep or still starting
        (then slurmctld may not answer RPCs yet), False when all was up. A sleep under way (`asleep` recorded, not all
        at zero yet) is waited for and then undone: the request may follow the sleep's last look
        at the queue, and a job saved in that window must not wait for the next wake. Leaves a WakeRequested Event naming who and
        why when it scales (the woken reconcile loop records the awake state with it).
        `running_in`: the component the caller itself runs in (the login agent: login), which is
        evidently up and must not be waited for (its readiness may wait for this very wake).
        `scaled` is called once no sleep is under way any more and every workload is scaled to
        one (or was up): from then on a command that reaches slurmctld is not lost to a sleep, so
        a caller may go on before the readiness this call still waits for. (A sleep that did not
        finish within SLEEP_WAIT, its pod killed half-way, is not waited for longer: `scaled` then
        follows the scale-up of what it left at zero.)
        `answers`: slurmctld is up as soon as this says so (:func:`controller_listens`: its port takes
        connections), before its pod's readiness, which waits for every container of the pod and
        for the kubelet's next probe."""
        ws = [w for w in self.workloads() if not running_in or w.component != running_in]
        if not any(w.component == names.CONTROLLER for w in ws):
            raise TierError(f"no statefulset/{names.CONTROLLER} labelled {TIER_SELECTOR} in namespace {self.namespace}: "
                            "is the cluster deployed (slurmk8s up), and does --namespace / --spec name it?")
        start = self.clock()
        deadline = start + timeout
        if tier_state(ws) == ASLEEP and any(w.replicas >= 1 for w in ws):
            ws = self._await_sleep(ws, running_in, progress, deadline)
        asleep = [w for w in ws if w.replicas < 1]
        if not asleep and all(w.ready >= 1 for w in ws if w.component in WAKE_WAITS_FOR):
            scaled()
            return False
        if asleep:
            problem = self.event(EV_WAKE_REQUEST, reason)
            if problem:
                self.log(problem)
            progress(f"waking the control tier ({reason})")
        # all at once: slurmdbd waits for its database by itself, and slurmctld, once it has state
        # files (any wake: the tier slept after a start), takes jobs without slurmdbd and queues
        # their accounting records until it answers (images/entrypoint/slurmctld.sh)
        for w in wake_order(ws):
            if w.replicas < 1:
                progress(f"scaling {w.ref} to 1")
                self._scale(w, 1)
        scaled()
        later = [w for w in ws if w.component not in WAKE_WAITS_FOR]
        if later:
            progress("not waited for: " + ", ".join(w.ref for w in later)
                     + " (slurmctld queues accounting records until slurmdbd answers)")
        for w in wake_order([w for w in ws if w.component in WAKE_WAITS_FOR]):
            t0 = self.clock()
            how = "ready"
            # slurmctld's port is asked each answer_poll, its ready count read each poll (by the
            # clock: a pass whose connect waits out its timeout does not space the reads out);
            # without a port to ask, the ready count is read each pass
            quick = w.component == names.CONTROLLER and answers is not None
            nap = self.answer_poll if quick and self.answer_poll else self.poll
            scaled_up, look_at = False, t0
            replaced = _Replaced()
            while True:
                if not quick or self.clock() >= look_at:
                    cur = self._ready(w)
                    if cur.ready >= 1:
                        break
                    scaled_up, look_at = cur.replicas >= 1, self.clock() + self.poll
                    if scaled_up and (w.kind == "StatefulSet" or self.replace_deployment_pods):
                        self._replace_skipped_pod(w, progress, replaced)
                if quick and scaled_up and answers is not None and answers():
                    how = "takes connections on its port"
                    break
                if self.clock() > deadline:
                    why = self._why_not_ready(w)
                    raise TierError(f"{w.ref} not ready after {timeout:.0f}s" + (f": {why}" if why else "")
                                    + f"; see kubectl -n {self.namespace} describe {w.ref}")
                self.sleep(nap)
            progress(f"{w.ref} {how} ({self.clock() - t0:.1f}s)")
        progress(f"control tier awake ({self.clock() - start:.1f}s)")
        return True

    def _replace_skipped_pod(self, w: Workload, progress: Callable[[str], None],
                             replaced: "_Replaced | None" = None) -> None:
        """A woken workload's pod that the kubelet skipped for its volume claim: delete it, and its
        StatefulSet (or the Deployment's ReplicaSet) makes it again at once.

        The kubelet reads a new pod's PersistentVolumeClaims as the node. When it asks before the API
        server's node authorizer has seen the pod bound to the node, it is refused ("no relationship
        found between node and this object"; kubernetes/kubernetes#113429), reports FailedMount,
        skips the pod, and looks at it again only after its back-off of 10-15 s. Measured on the
        local cluster: one woken slurmctld pod in five answered after 18 s instead of 3 s. On that
        FailedMount Event of this pod (by uid), while none of its containers has started, the pod
        is deleted (gracefully, its uid a precondition: a pod made since under the same name is left
        alone); the controller makes it again, and the new pod's kubelet reads the claim afresh
        (measured: running 2.2-3.1 s after the claim was readable, 10-17 s without). Deleting is what
        a waker may do anyway in effect (it may scale the workload to zero); changing the pod instead
        (an annotation makes the kubelet sync it) would need `patch` on it, which allows a new image.
        A StatefulSet's one pod is read by name (the wakers' Roles allow get/delete on slurmctld-0
        alone); a Deployment's pods (the login pod, when it sleeps with the tier) are listed by its
        selector, by the CLI's wake alone (`replace_deployment_pods`). Best effort: a refusal (a Role
        from before these rights) is logged once and the wake goes on."""
        from ..kubeapi import ApiError

        replaced = _Replaced() if replaced is None else replaced  # a wait passes its own, kept across its polls
        name = f"{w.name}-0"  # the tier's StatefulSets run one pod
        deleted = []
        try:
            if w.kind == "StatefulSet":
                pods = [self.api.get_pod(self.namespace, name)]
            elif w.selector:
                pods = self.api.list_pods(self.namespace, w.selector)
            else:
                return
            for pod in pods:
                meta = pod.get("metadata") or {}
                name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
                statuses = (pod.get("status") or {}).get("containerStatuses") or []
                if (not uid or uid in replaced.uids or meta.get("deletionTimestamp")
                        or not (pod.get("spec") or {}).get("nodeName")
                        or any("waiting" not in (c.get("state") or {"waiting": {}}) for c in statuses)):
                    continue  # not bound yet, being deleted, or its containers are past their volumes
                events = self.api.list_events(self.namespace, f"involvedObject.uid={uid},reason=FailedMount")
                if not any(PVC_NOT_READ in str(e.get("message", "")) for e in events):
                    continue
                replaced.uids.add(uid)
                self.api.delete_pod(self.namespace, name, uid)
                deleted.append(name)
        except ApiError as err:
            if err.status not in (404, 409) and not replaced.refusal_logged:  # 404/409: not made yet, or
                replaced.refusal_logged = True  # gone or made again meanwhile: nothing to do; a refusal: once
                whose = f"pod {name}'s" if w.kind == "StatefulSet" else f"{w.ref}'s pods'"
                self.log(f"cannot look at {whose} volume mounts: {err}")
        maker = "the StatefulSet makes it again" if w.kind == "StatefulSet" else "its ReplicaSet makes another"
        for gone in deleted:
            progress(f"pod {gone}: the kubelet could not read its volume claim (FailedMount) and would look "
                     f"again only after 10-15 s; deleted it, {maker} at once")

    def _await_sleep(self, ws: list[Workload], running_in: str, progress: Callable[[str], None],
                     deadline: float) -> list[Workload]:
        """A sleep is under way: the loop recorded `asleep` before its last look at the queue, so a
        command that reaches slurmctld after that look is saved with its state and nothing would
        run it. Wait until the sleep is done (every workload at 0) or aborted (`awake` again), then
        the caller wakes what is asleep. A sleep that stops half-way (its pod killed) is waited for
        up to SLEEP_WAIT seconds; the wake then scales up what is at 0 and waits for the rest. One
        whose sleeper is gone (:meth:`_sleeper_gone`) is not waited for at all: nothing can finish it."""
        progress("the control tier is going to sleep; waking it again once it is down")
        give_up = min(deadline, self.clock() + SLEEP_WAIT)
        while True:
            if tier_state(ws) != ASLEEP or all(w.replicas < 1 for w in ws):
                return ws
            if self._sleeper_gone(ws):
                self.log("wake: the sleep recorded stopped half-way (slurmctld's pod, which ran it, is gone); "
                         "waking what is down")
                return ws
            if self.clock() > give_up:
                self.log(f"wake: the sleep under way did not finish in {SLEEP_WAIT:.0f}s; waking what is down")
                return ws
            self.sleep(self.poll)
            ws = [w for w in self.workloads() if not running_in or w.component != running_in]

    def _sleeper_gone(self, ws: list[Workload]) -> bool:
        """No sleep can be under way: slurmctld is scaled to zero and its pod is gone. The sleep
        runs in that pod (the reconcile loop), whose object the API server keeps until every
        container of it has ended: the loop finishing the sleep's last steps keeps it there. Only
        a 404 says so: a refusal (a Role without `get` on that pod) or an error says nothing, and
        the wake waits as before (SLEEP_WAIT at most). With slurmctld still up, a sleep that failed
        is its loop's own to repair (at its next pass)."""
        from ..kubeapi import ApiError

        ctl = next((w for w in ws if w.component == names.CONTROLLER), None)
        if ctl is None or ctl.replicas >= 1:
            return False
        try:
            self.api.get_pod(self.namespace, names.CONTROLLER_POD)
        except ApiError as err:
            return err.status == 404
        return False

    # -- sleep

    def sleep_tier(self, reason: str, recheck: Callable[[], str], controller_stopped: Callable[[], bool],
                   gone_timeout: float = 30.0) -> bool:
        """Scale the tier to zero: login -> slurmctld -> slurmdbd -> database, each one's pods
        gone before the next. `recheck()` runs once the login pod is gone (and before slurmctld
        goes): a non-empty answer (a job or session appeared) aborts, scaling back up what was
        scaled down. `controller_stopped()` tells when slurmctld has saved its state and exited
        (this runs in the slurmctld pod: its own stop is awaited that way). True when asleep.

        All or nothing: a step that fails (one API error) undoes the sleep, slurmctld included when
        it was stopped already (its StatefulSet makes its pod again, whose loop starts awake), and
        records `awake` (``sleep failed: ...``), then raises. A half left recorded asleep had every
        later wake wait SLEEP_WAIT for a sleep nobody was running. What cannot be undone here (the
        API away) is repaired by the loop's next pass (reconcile.idle.IdleWatch) or, once this pod
        is gone, by the next wake (:meth:`_await_sleep`)."""
        ws = sleep_order(self.workloads())
        self.record(ASLEEP, reason, EV_SLEEP)
        done: list[Workload] = []
        try:
            return self._sleep_steps(ws, done, recheck, controller_stopped, gone_timeout)
        except TierError as err:
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
            if w.component == names.CONTROLLER:
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
            if w.component == names.CONTROLLER:
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

    def on_controller_start(self, started: str = "slurmctld started") -> str:
        """The loop just started in a running slurmctld pod (or repairs a sleep of its own that
        failed: `started` says which): the tier is awake. Record it (with the latest wake request's
        reason when the annotation still says asleep), and scale back up any tier workload left at
        zero by an interrupted sleep. Returns what was done."""
        from ..kubeapi import ApiError

        ws = self.workloads()
        ctl = next((w for w in ws if w.component == names.CONTROLLER), None)
        if ctl is None:
            return "no slurmctld StatefulSet labelled as the control tier"
        state = ctl.annotations.get(A_STATE)
        left = [w for w in ws if w.replicas < 1 and w.component != names.CONTROLLER]
        for w in wake_order(left):
            self.log(f"wake: {w.ref} was left at 0 replicas; scaling it to 1")
            self._scale(w, 1)
        if state == AWAKE:
            return "already recorded awake"
        if state is None:
            self.record(AWAKE, "deployed", EV_WAKE)
            return "recorded awake (deployed)"
        since = parse_rfc3339(ctl.annotations.get(A_SINCE)) or 0.0
        reason = f"{started} (no wake request recorded)"
        try:
            events = self.api.list_events(self.namespace, f"involvedObject.name={names.CONTROLLER},reason={EV_WAKE_REQUEST}")
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


def controller_addresses(slices: list[dict[str, Any]]) -> list[str]:
    """The addresses that slurmctld's headless Service publishes for the pod slurmctld-0 (its DNS
    name, SlurmctldHost), from the Service's EndpointSlices, as the cluster DNS serves them: an
    endpoint marked not ready or terminating (the pod of a sleep) left out. The Service publishes
    not-ready addresses (the EndpointSlice controller then writes them ready), so the pod is there
    before its readiness probe passes."""
    out = []
    for s in slices:
        for ep in s.get("endpoints") or []:
            if names.CONTROLLER_POD not in (ep.get("hostname"), (ep.get("targetRef") or {}).get("name")):
                continue
            conditions = ep.get("conditions") or {}
            if conditions.get("terminating") or conditions.get("ready") is False:
                continue
            out += [a for a in ep.get("addresses") or [] if a not in out]
    return out


def controller_listens(api: TierApi, namespace: str, connect_timeout: float = 0.25) -> Callable[[], bool]:
    """`answers` for :meth:`Tier.wake`: True once slurmctld takes TCP connections on its port at
    the address its Service publishes (as its readiness probe checks, but at the wake's own poll).
    The address is read from the Service's EndpointSlices, which the cluster DNS serves, not from the
    pod: the kubelet posts the pod's IP a moment before the EndpointSlice has it, and a Slurm command
    that looked up slurmctld's name in that moment would get an NXDOMAIN, which the cluster DNS
    caches for seconds (CoreDNS: 5 s by default)."""
    from ..kubeapi import ApiError
    from .activity import port_open

    def listens() -> bool:
        try:
            slices = api.list_endpoint_slices(namespace, names.CONTROLLER)
        except ApiError:
            return False
        return any(port_open(ip, names.SLURMCTLD_PORT, timeout=connect_timeout) for ip in controller_addresses(slices))

    return listens
