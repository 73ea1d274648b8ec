"""Idle sleep of the control tier, as the reconcile loop drives it: after ``elasticity.idle_teardown``
with no job, no worker, no SSH session and no Slurm command, the tier is put to sleep
(:mod:`provisioner.controltier`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .. import settings
from ..elastic.backend import BackendError, NodeBackend
from ..slurm.commands import SlurmCli, SlurmCommandError

if TYPE_CHECKING:
    from ..logs import Log


DEFAULT_TIER_LOG: str = settings.default(settings.TIER_LOG)  # sleeps and wakes, kept on the state volume


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
    _failed: str = ""  # a sleep of this loop failed: the next pass repairs what it left

    def activity(self, job_doc: Mapping[str, Any] | None, workers: int | None, now: float) -> Any:
        from ..controltier.decision import Activity, active_jobs

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
            busy.append(f"a Slurm command, SSH login or REST request {time.time() - act.last_request:.0f}s ago")
        return "; ".join(busy)

    def step(self, job_doc: Mapping[str, Any] | None, workers: int | None, now: float) -> bool:
        """One pass; True when the tier was put to sleep (this process should end)."""
        from ..controltier.decision import TierError

        if not self.started:
            try:
                if self._failed:
                    self.log(f"control tier: {self.tier.on_controller_start(self._failed)}")
                else:
                    self.log(f"control tier: {self.tier.on_controller_start()}")
                self.started, self._failed = True, ""
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
            # the sleep undid itself and recorded awake, unless the API refused that too: the next
            # pass does it again (records awake, scales up what is at zero), as a loop that starts
            self.started, self._failed = False, "a sleep that failed was undone"
            return False


def merge_activity(*sources: tuple[int | None, tuple[str, ...], float | None, str]
                   ) -> tuple[int | None, tuple[str, ...], float | None, str]:
    """One (sessions, users, last_request, why unknown) from several (the login agent's, the REST
    front's): the sessions add up, the latest request counts; any source unknown makes it unknown."""
    whys = [why or "no answer" for count, _u, _l, why in sources if count is None]
    lasts = [last for _c, _u, last, _w in sources if last is not None]
    users = tuple(dict.fromkeys(u for _c, us, _l, _w in sources for u in us))
    total = None if whys else sum(count or 0 for count, _u, _l, _w in sources)
    return total, users, max(lasts) if lasts else None, "; ".join(whys)


def idle_watch_from_env(env: Mapping[str, str], log: "Log", slurm: "SlurmCli",
                        backend: Callable[[], NodeBackend]) -> IdleWatch | None:
    """The IdleWatch when the spec sets elasticity.idle_teardown (else None)."""
    from .. import manifests as m
    from ..config import parse_spec
    from ..controltier.activity import activity_from_doc, fetch_activity, port_open
    from ..controltier.api import ClientTierApi
    from ..controltier.decision import IdleTracker, Workload
    from ..controltier.tier import Tier
    from ..errors import SlurmK8sError
    from ..kubeapi import KubeConfigError, api_client
    from ..logs import Log

    files = settings.ClusterFiles.from_env(env)
    spec_path = files.spec
    try:
        with open(spec_path) as fh:
            spec = parse_spec(json.load(fh), source=spec_path)
    except (OSError, ValueError, SlurmK8sError) as err:
        log.write(f"idle teardown off: cannot read the spec {spec_path}: {err}")
        return None
    teardown = spec.elasticity.idle_teardown
    if teardown is None:
        return None
    site_path = files.site_path
    try:
        with open(site_path) as fh:
            domain = json.load(fh).get("cluster_domain", "cluster.local")
    except (OSError, ValueError):
        domain = "cluster.local"
    namespace = files.namespace or spec.namespace_name
    # sleeps and wakes also go to a log on the state volume: the reconcile log's emptyDir goes with the pod
    durable = Log("control-tier", settings.Reconcile.from_env(env).tier_log)

    def tier_log(line: str) -> None:
        log.write(line)
        durable.write(line)

    try:
        client = api_client(env=env)
    except KubeConfigError as err:
        log.write(f"idle teardown off: no Kubernetes API client: {err}")
        return None
    tier = Tier(ClientTierApi(client), namespace, "slurmk8s-reconcile", log=tier_log)
    url = f"http://{m.LOGIN_HOST}.{m.WORKERS}.{namespace}.svc.{domain}:{m.ACTIVITY_PORT}/activity"
    rest_url = f"http://{m.REST}.{m.WORKERS}.{namespace}.svc.{domain}:{m.ACTIVITY_PORT}/activity"

    def login_sessions() -> tuple[int | None, tuple[str, ...], float | None, str]:
        if not spec.login.enabled:
            return 0, (), None, ""
        doc, err = fetch_activity(url)
        if doc is None and m.login_sleeps(spec):
            try:  # asleep with the tier: no login pod, no session
                dep = tier.api.get_workload(namespace, "Deployment", m.LOGIN)
                if (dep.get("spec") or {}).get("replicas") == 0 and not tier.pods_of(Workload.from_obj(dep)):
                    return 0, (), None, ""
            except Exception as exc:  # noqa: BLE001 - any failure here means "unknown", reported
                err = f"{err}; login Deployment unreadable: {exc}"
        return activity_from_doc(doc, err)

    def sessions() -> tuple[int | None, tuple[str, ...], float | None, str]:
        got = login_sessions()
        if not spec.rest.enabled:
            return got
        return merge_activity(got, activity_from_doc(*fetch_activity(rest_url)))

    log.write(f"idle teardown after {teardown:.0f}s; login sessions from {url}"
              + (f", REST requests from {rest_url}" if spec.rest.enabled else "")
              + f"; sleeps and wakes also in {durable.path}")
    return IdleWatch(tier, IdleTracker(float(teardown)), sessions, slurm.jobs,
                     lambda: len(backend().list()),
                     lambda: not port_open("127.0.0.1", m.SLURMCTLD_PORT), tier_log)
