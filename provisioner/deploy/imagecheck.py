"""Pool images (``pools[].image``, ``images.worker``) and ``images.login`` are slurmk8s images of the
right role: checked before `slurmk8s up` applies anything.

A pool pointing at an image that is not a slurmk8s worker image (a typo, another slurmk8s image, a
researcher's image built FROM plain Debian) used to be found 60 s into the first job on that pool:
Slurm's ResumeTimeout, the node DOWN, ``slurmk8s-resume-fail`` naming a crash-looping pod. Here it
becomes one error at `up`, naming the pool, the image and what was found, with nothing applied.

Mechanism (and why this one). The only thing that knows what a worker pod will run is the cluster's
own container runtime, with its registry credentials, pull policy and image store: the local
cluster's containerd holds images loaded with ``slurmk8s cluster load-image`` that no registry has,
and a real cluster pulls from registries this machine may not reach. So `up` runs each distinct
image once in a short-lived pod (:func:`check_pod`) the way the worker (login) pod runs it: the
image's own ENTRYPOINT and CMD, the pod's pull policy and security context, plus one variable,
``SLURMK8S_IDENTIFY=1``. The entrypoints' shared ``lib.sh`` then execs
``/usr/local/sbin/slurmk8s-identify`` before anything else (no munge key, no controller needed),
which prints the image's role, the interface version its entrypoint speaks, the slurmk8s and Slurm
versions, the arguments it was given (a derived image's CMD) and what its role needs that the image
lacks (images/entrypoint/identify.sh). Running it, rather than only reading the OCI labels, also
checks what the labels cannot: that the image pulls where the workers pull, that its ENTRYPOINT is
still slurmk8s's, that a derived image kept the files and the slurm user (uid 64030), and that it
sets no CMD. The labels (``org.slurmk8s.image``, ``org.slurmk8s.interface``, ``org.slurmk8s.version``,
images/Dockerfile) serve `preview`, which creates nothing: it reads them from the local Docker
engine's copy of the image when it has one (:func:`docker_labels`, :func:`label_issue`).

The pods run in parallel (one per distinct image), in the cluster's namespace, or in ``default``
before the namespace exists (`up` has not created it yet, and nothing of the cluster may be made
before the check passes); they are deleted afterwards, refusal or not. Refused is an image that ran
and is not a slurmk8s image of its role (or lost part of it); an image that did not run (the cluster
cannot pull it, no node takes the check pod, no answer in time) is only warned about: nothing is known
about it, and the check pod may land on a node that pulls differently from the pool's nodes (registry
credentials or mirrors per node group). Bounds: a pull failure counts after :data:`PULL_BOUND` (at
once on the local cluster, which has no registry), a container that keeps running after
:data:`RUN_BOUND` is not answering, the whole check gives up after :data:`TIMEOUT` (large images
take a while to pull; the pull is not wasted, the node keeps them).
Images the cluster already runs (the live pool templates' images, the login Deployment's) are not
checked again, so repeated `up`s pay nothing. ``SLURMK8S_SKIP_IMAGE_CHECK=1`` skips the check.

The decisions are pure (:func:`wanted`, :func:`look`, :func:`parse_identify`, :func:`outcome`,
:func:`verdict`, :func:`label_issue`): API objects as plain dicts in, issues out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..config import ClusterSpec, Images
from ..errors import Issue, Problem
from ..kubeapi import ApiError, RawClient, api_path
from ..manifests.common import _container_security, _pod_security
from .. import settings
from ..names import (A_IMAGE_INTERFACE, BASE_CAPS, IMAGE_INTERFACE, L_CLUSTER, L_COMPONENT, L_MANAGED_BY,
                               LOGIN, TEMPLATE_PREFIX, base_labels)

ROLE_LABEL = "org.slurmk8s.image"
INTERFACE_LABEL = "org.slurmk8s.interface"
VERSION_LABEL = "org.slurmk8s.version"
IDENTIFY_ENV = settings.IDENTIFY
IDENTIFY_PROGRAM = "/usr/local/sbin/slurmk8s-identify"
SKIP_ENV = settings.SKIP_IMAGE_CHECK
COMPONENT = "image-check"
DOC = "docs/pool-images.md"

TIMEOUT = 300.0  # the whole check (pulls of large images included)
RUN_BOUND = 20.0  # a container running this long has not answered the identify request
PULL_BOUND = 30.0  # a pull that keeps failing (a registry may answer late); at once on the local cluster
SCHEDULE_BOUND = 30.0  # a check pod no node takes
PROGRESS_EVERY = 10.0
POLL = 0.5

NEVER_PULL = ("ErrImageNeverPull", "InvalidImageName")
PULL = ("ErrImagePull", "ImagePullBackOff")
START = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError", "StartError",
         "ContainerCannotRun")
ROLE_WORDS = {"slurmd": "worker", "login": "login"}


class ImageCheckError(Problem):
    """An image the spec names is not a slurmk8s image of the role it is used for; nothing was applied."""


@dataclass(frozen=True)
class Want:
    """One image to check, the role it must have and the spec fields that name it."""

    image: str
    role: str  # "slurmd" (pools) or "login"
    fields: tuple[str, ...]

    @property
    def field(self) -> str:
        return ", ".join(self.fields)

    @property
    def kind(self) -> str:
        return ROLE_WORDS.get(self.role, self.role)


def wanted(spec: ClusterSpec, in_use: Mapping[str, set[str]] | None = None) -> list[Want]:
    """The distinct images to check: each pool's (``pools[<name>].image``, or ``images.worker`` for
    the pools without one) and ``images.login`` when there is a login pod; those the cluster already
    runs in that role (``in_use[role]``) are left out."""
    in_use = in_use or {}
    fields: dict[tuple[str, str], list[str]] = {}
    for pool in spec.pools:
        where = f"pools[{pool.name}].image" if pool.image else "images.worker"
        key = (pool.image or spec.images.worker, "slurmd")
        if where not in fields.setdefault(key, []):
            fields[key].append(where)
    if spec.login.enabled:
        fields.setdefault((spec.images.login, "login"), []).append("images.login")
    return [Want(image, role, tuple(where)) for (image, role), where in fields.items()
            if image not in in_use.get(role, set())]


def live_images(spec: ClusterSpec, api: Any, namespace_exists: bool) -> dict[str, set[str]]:
    """The images the deployed cluster already runs, by role (none before its namespace exists)."""
    if not namespace_exists:
        return {}
    ns = spec.namespace_name
    return in_use_from(api.config_maps(ns, f"{L_CLUSTER}={spec.name},{L_COMPONENT}=worker"), api.deployment(ns, LOGIN))


def in_use_from(config_maps: Sequence[Mapping[str, Any]], login: Mapping[str, Any] | None) -> dict[str, set[str]]:
    """Images the cluster already runs: its pool templates' (ConfigMaps ``worker-template-<pool>``,
    key pod.json) as workers, the login Deployment's login container as login. A template written
    for another image interface (or before templates recorded it) does not count: its images are
    checked again, so an upgrade refuses a pool image the new entrypoint contract does not fit."""
    workers: set[str] = set()
    for cm in config_maps:
        meta = cm.get("metadata") or {}
        if not (meta.get("name") or "").startswith(TEMPLATE_PREFIX):
            continue
        if (meta.get("annotations") or {}).get(A_IMAGE_INTERFACE) != str(IMAGE_INTERFACE):
            continue
        try:
            pod = json.loads((cm.get("data") or {}).get("pod.json") or "{}")
        except ValueError:
            continue
        workers.update(c.get("image") for c in (pod.get("spec") or {}).get("containers") or [] if c.get("image"))
    logins = {c.get("image") for c in (((login or {}).get("spec") or {}).get("template") or {})
              .get("spec", {}).get("containers") or [] if c.get("name") == LOGIN and c.get("image")}
    return {"slurmd": workers, "login": logins}


def check_pod(spec: ClusterSpec, want: Want, name: str, namespace: str) -> dict[str, Any]:
    """The short-lived pod that runs `want.image` as the worker (login) pod would, with
    SLURMK8S_IDENTIFY=1: no command or args of its own, the same pull policy and security context;
    no volume, no Secret, no service account token, small requests."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**base_labels(spec, COMPONENT), L_MANAGED_BY: "slurmk8s"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": _pod_security(),
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "identify",
                "image": want.image,
                "imagePullPolicy": spec.images.pull_policy,
                "env": [{"name": IDENTIFY_ENV, "value": "1"}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
                "securityContext": _container_security(BASE_CAPS),
            }],
        },
    }


# ---------------------------------------------------------------- what a look at a check pod says


def look(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(state, detail) of a check pod: ``done`` (its container terminated: detail 'exit N'), ``never``
    (the image is not there and will not be pulled, or its name is invalid), ``pull`` (pulls fail),
    ``start`` (the runtime cannot start the container: no such executable, ...), ``unschedulable``,
    ``running``, or ``pending`` (being scheduled, pulled, created)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        term = state.get("terminated")
        if term:
            reason = term.get("reason") or ""
            if reason in START or (reason == "Error" and term.get("exitCode") in (126, 127, 128)
                                   and term.get("message")):
                return "start", _one_line(f"{reason}: {term.get('message') or ''}")
            return "done", f"exit {term.get('exitCode')}"
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason") or ""
        text = _one_line(f"{reason}: {waiting.get('message') or ''}".rstrip(": "))
        if reason in NEVER_PULL:
            return "never", text
        if reason in PULL:
            return "pull", text
        if reason in START:
            return "start", text
        if state.get("running"):
            return "running", ""
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        return "done", status.get("reason") or phase
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and \
                cond.get("reason") == "Unschedulable":
            return "unschedulable", _one_line(str(cond.get("message") or "Unschedulable"))
    return "pending", "pulling or starting" if (pod.get("spec") or {}).get("nodeName") else "being scheduled"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()[:300]


@dataclass(frozen=True)
class Identity:
    """What ``slurmk8s-identify`` printed."""

    image: str
    interface: int | None
    version: str = ""
    slurm: str = ""
    args: str = ""
    missing: tuple[str, ...] = ()


def parse_identify(log: str) -> Identity | None:
    """The identity in a check pod's log, or None when the image printed none."""
    values: dict[str, str] = {}
    seen = False
    for line in log.splitlines():
        if not line.startswith("slurmk8s-identify: "):
            continue
        seen = True
        key, sep, value = line[len("slurmk8s-identify: "):].partition("=")
        if sep:
            values.setdefault(key.strip(), value.strip())
    if not seen:
        return None
    try:
        interface: int | None = int(values.get("interface", ""))
    except ValueError:
        interface = None
    missing = tuple(p for p in values.get("missing", "").split(",") if p)
    return Identity(values.get("image", ""), interface, values.get("version", ""), values.get("slurm", ""),
                    values.get("args", ""), missing)


@dataclass(frozen=True)
class Outcome:
    """How a check pod ended: ``identified`` (with the identity), ``exited`` (no identity: the log's
    last lines and the exit status), ``running`` (kept running), ``pull``/``never``/``start``
    (the runtime's reason), ``unschedulable``, ``timeout``."""

    kind: str
    detail: str = ""
    identity: Identity | None = None
    seconds: float = 0.0


def outcome(state: str, detail: str, lasted: float, *, waited: float, log: str | None = None,
            pull_bound: float = PULL_BOUND, timeout: float = TIMEOUT) -> Outcome | None:
    """The end of a check pod from one look (state and detail from :func:`look`, how long that state
    has lasted, how long the check has waited, the log once the container is done), or None: wait on."""
    if state == "done":
        ident = parse_identify(log or "")
        if ident is not None:
            return Outcome("identified", detail, ident, waited)
        tail = [ln.strip()[:200] for ln in (log or "").splitlines() if ln.strip()][-3:]
        return Outcome("exited", detail + (": " + " | ".join(tail) if tail else ", no output"), None, waited)
    if state in ("never", "start"):
        return Outcome(state, detail, None, waited)
    if state == "pull" and lasted >= pull_bound:
        return Outcome("pull", detail, None, waited)
    if state == "running" and lasted >= RUN_BOUND:
        return Outcome("running", f"still running after {lasted:.0f}s", None, waited)
    if state == "unschedulable" and lasted >= SCHEDULE_BOUND:
        return Outcome("unschedulable", detail, None, waited)
    if waited >= timeout:
        return Outcome("timeout", f"{state}: {detail}" if detail else state, None, waited)
    return None


LOGGED_ROLE = re.compile(r"\[slurmk8s-([a-z]+)\]")


def verdict(want: Want, out: Outcome, *, base: str, local: bool) -> tuple[Issue | None, str]:
    """(the issue, or None when the image may be used; a line to print then). `base` is the slurmk8s
    image of the role to derive from (for the fix); `local`: the local cluster. Refused: an image that ran
    and is not a slurmk8s image of the role (or lost part of it). Only warned about: one that did not run
    (cannot be pulled, no node for the check pod, no answer within the timeout), as nothing is known."""
    kind = want.kind
    derive = (f"build it FROM {base} (the entrypoint, {IDENTIFY_PROGRAM} and the org.slurmk8s.* labels come "
              f"with it; add only packages and files), load or push it, see {DOC}")
    what = f"not a slurmk8s {kind} image"
    if out.kind == "identified" and out.identity is not None:
        ident = out.identity
        if ident.image != want.role:
            found = f"the slurmk8s {ident.image} image" if ident.image else "a slurmk8s image without a role"
            return Issue(want.field, f"{want.image} is {what}: it identified itself as {found} "
                                     f"(image={ident.image or '?'})", derive), ""
        if ident.interface != IMAGE_INTERFACE:
            return Issue(want.field, f"{want.image} speaks slurmk8s image interface {ident.interface}, this slurmk8s "
                                     f"speaks {IMAGE_INTERFACE} (image built from slurmk8s {ident.version or '?'})",
                         f"rebuild it FROM the {kind} image of this slurmk8s version ({base}), see {DOC}"), ""
        if ident.missing:
            return Issue(want.field, f"{want.image} is a slurmk8s {want.role} image but lacks what a {kind} needs: "
                                     f"{', '.join(ident.missing)}",
                         f"keep what the base image has (entrypoint, users, Slurm): derive FROM {base} and only add; "
                         f"see {DOC}, 'What a derived image must keep'"), ""
        if ident.args:
            return Issue(want.field, f"{want.image} sets CMD ({ident.args!r}), which the entrypoint would append to "
                                     f"{'slurmd' if want.role == 'slurmd' else 'sshd'}'s command line",
                         "remove CMD (and ENTRYPOINT) from the Containerfile, or end it with `CMD []`"), ""
        return None, (f"{want.image}: slurmk8s {want.role} image (interface {ident.interface}, slurmk8s "
                      f"{ident.version or '?'}, Slurm {ident.slurm or '?'})")
    if out.kind == "exited":
        logged = LOGGED_ROLE.findall(out.detail)
        if logged and logged[-1] == want.role:
            # a slurmk8s image from before the identity: its entrypoint ran and stopped at the missing munge key
            return None, (f"{want.image}: slurmk8s {want.role} image from before image identity ({IDENTIFY_PROGRAM} "
                          "missing): accepted; rebuild it to have it checked fully")
        if logged:
            return Issue(want.field, f"{want.image} is {what}: its entrypoint logs as slurmk8s-{logged[-1]}, i.e. it "
                                     f"is the slurmk8s {logged[-1]} image", derive), ""
        return Issue(want.field, f"{want.image} is {what} (no {IDENTIFY_PROGRAM} answered {IDENTIFY_ENV}=1; "
                                 f"it ended with {out.detail})", derive), ""
    if out.kind == "running":
        return Issue(want.field, f"{want.image} is {what} (no {IDENTIFY_PROGRAM} answered {IDENTIFY_ENV}=1: its "
                                 f"entrypoint kept running, {out.detail})", derive), ""
    if out.kind == "start":
        return Issue(want.field, f"{want.image} is {what}: the container cannot start ({out.detail})", derive), ""
    # Below: the image did not run, so nothing is known about it. Not a refusal: the check pod may land on a
    # node that pulls differently from the pool's nodes (per-node-group registry credentials, mirrors).
    if out.kind in ("pull", "never"):
        fix = (f"load it into the local cluster: `slurmk8s cluster load-image {want.image}`" if local else
               "push it to a registry the cluster's nodes pull from and name it with that registry "
               "(or check the name)")
        return None, (f"warning: {want.field}: the cluster cannot pull {want.image} ({out.detail}), so it was not "
                      f"checked; worker pods on it will not start either. Fix: {fix}")
    if out.kind == "unschedulable":
        return None, (f"warning: {want.field}: the check pod for {want.image} fits on no node ({out.detail}), so the "
                      "image was not checked")
    return None, (f"warning: {want.field}: the check of {want.image} did not finish within {out.seconds:.0f}s "
                  f"({out.detail}), so the image was not checked")


def base_image(spec: ClusterSpec, want: Want) -> str:
    """The slurmk8s image to derive from, for the fix: the spec's (unless it is the one refused)."""
    if want.role == "login":
        return spec.images.login if "images.login" not in want.fields else Images().login
    return spec.images.worker if "images.worker" not in want.fields else Images().worker


# ---------------------------------------------------------------- running the check pods


class CheckApi(RawClient):
    """The calls the check makes (create, get, log, delete of pods; reading what the cluster runs),
    over the Kubernetes API with request timeouts; tests replace it with a fake."""

    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", api_path("v1", namespace, "pods"), {"fieldManager": "slurmk8s-up"}, dict(body))

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", api_path("v1", namespace, "pods", name))

    def log(self, namespace: str, name: str) -> str:
        return self.text(api_path("v1", namespace, "pods", name, "log"), {"tailLines": 200})

    def delete(self, namespace: str, name: str) -> None:
        self.request("DELETE", api_path("v1", namespace, "pods", name), None,
                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

    def config_maps(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        doc = self.request("GET", api_path("v1", namespace, "configmaps"), {"labelSelector": selector})
        return doc.get("items") or []

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", api_path("apps/v1", namespace, "deployments", name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise


@dataclass
class _Probe:
    want: Want
    name: str
    state: str = ""
    since: float = 0.0
    detail: str = ""
    result: Outcome | None = None
    created: bool = False


@dataclass
class Checker:
    """Runs the check pods of `wants` in `namespace` in parallel and judges them (:meth:`run`)."""

    spec: ClusterSpec
    api: Any  # CheckApi or a fake with the same methods
    namespace: str
    echo: Callable[[str], Any]
    local: bool = False
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Any] = time.sleep
    timeout: float = TIMEOUT
    stamp: str = field(default_factory=lambda: str(int(time.time())))

    def run(self, wants: Sequence[Want]) -> list[Issue]:
        if not wants:
            return []
        probes = [_Probe(w, f"slurmk8s-image-check-{self.stamp}-{i}") for i, w in enumerate(wants)]
        t0 = self.clock()
        self.echo(f"image check: {len(wants)} image(s) in pod(s) in namespace {self.namespace}: "
                  + ", ".join(f"{p.want.image} ({p.want.field})" for p in probes)
                  + " [pods " + " ".join(p.name for p in probes) + "]")
        try:
            probes = [p for p in probes if self._create(p)]
            self._wait(probes, t0)
        finally:
            self._delete([p for p in probes if p.created])
        issues: list[Issue] = []
        for p in probes:
            assert p.result is not None
            issue, line = verdict(p.want, p.result, base=base_image(self.spec, p.want), local=self.local)
            if issue is None:
                self.echo(line if line.startswith("warning: ") else f"image check: {line} ({p.result.seconds:.1f}s)")
            else:
                issues.append(issue)
        return issues

    def _create(self, p: _Probe) -> bool:
        """Start one check pod; False (with a warning) when the cluster refuses it: a deployer without
        the right to create pods there (``default`` before the namespace exists), a quota or a Pod
        Security level is no reason to refuse the `up`, only to leave that image unchecked."""
        try:
            self.api.create(self.namespace, check_pod(self.spec, p.want, p.name, self.namespace))
        except ApiError as err:
            self.echo(f"warning: {p.want.field}: {p.want.image} not checked: the cluster refused the check pod in "
                      f"namespace {self.namespace} ({err}); a wrong image would show only when a job first needs "
                      f"the pool (allow a 10m CPU pod there, or set {SKIP_ENV}=1 to silence this)")
            return False
        p.created = True
        return True

    def _wait(self, probes: list[_Probe], t0: float) -> None:
        pull_bound = 0.0 if self.local else PULL_BOUND
        next_progress = t0 + PROGRESS_EVERY
        while True:
            now = self.clock()
            waiting = [p for p in probes if p.result is None]
            if not waiting:
                return
            for p in waiting:
                state, detail = look(self.api.get(self.namespace, p.name))
                if state != p.state:
                    p.state, p.since = state, now
                p.detail = detail
                log = self.api.log(self.namespace, p.name) if state == "done" else None
                p.result = outcome(state, detail, now - p.since, waited=now - t0, log=log,
                                   pull_bound=pull_bound, timeout=self.timeout)
            if now >= next_progress and any(p.result is None for p in probes):
                self.echo(f"image check: waiting ({now - t0:.0f}s): " + ", ".join(
                    f"{p.want.image} {p.state} ({p.detail})" if p.detail else f"{p.want.image} {p.state}"
                    for p in probes if p.result is None))
                next_progress = now + PROGRESS_EVERY
            if any(p.result is None for p in probes):
                self.sleep(POLL)

    def _delete(self, probes: list[_Probe], timeout: float = 30.0) -> None:
        """Delete the check pods and wait until they are gone (nothing of a refused `up` stays behind)."""
        left = []
        for p in probes:
            try:
                self.api.delete(self.namespace, p.name)
                left.append(p)
            except ApiError as err:
                if err.status != 404:
                    self.echo(f"warning: could not delete the image check pod {self.namespace}/{p.name}: {err}")
        deadline = self.clock() + timeout
        while left and self.clock() < deadline:
            still = []
            for p in left:
                try:
                    self.api.get(self.namespace, p.name)
                    still.append(p)
                except ApiError as err:
                    if err.status != 404:
                        still.append(p)
            left = still
            if left:
                self.sleep(POLL)
        for p in left:
            self.echo(f"warning: the image check pod {self.namespace}/{p.name} is still terminating after "
                      f"{timeout:.0f}s")


def check(spec: ClusterSpec, api: Any, echo: Callable[[str], Any], *, namespace_exists: bool, local: bool,
          env: Mapping[str, str] | None = None, **checker: Any) -> None:
    """`slurmk8s up`: run the images the cluster does not run yet; raise ImageCheckError on any refusal."""
    env = os.environ if env is None else env
    if settings.Cli.from_env(env).skip_image_check:
        echo(f"image check: skipped ({SKIP_ENV}=1)")
        return
    ns = spec.namespace_name
    in_use = live_images(spec, api, namespace_exists)
    wants = wanted(spec, in_use)
    if not wants:
        return
    issues = Checker(spec, api, ns if namespace_exists else "default", echo, local, **checker).run(wants)
    if issues:
        raise ImageCheckError(issues, title="the spec names images that cannot serve their role (nothing was applied)")


# ---------------------------------------------------------------- preview: the labels


def docker_labels(image: str, timeout: float = 10.0) -> dict[str, str] | None:
    """The OCI labels of the local Docker engine's copy of `image`, or None (no such image, no engine)."""
    try:
        proc = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        labels = json.loads(proc.stdout.strip() or "null")
    except ValueError:
        return None
    return {str(k): str(v) for k, v in (labels or {}).items()}


def label_issue(want: Want, labels: Mapping[str, str], *, base: str) -> Issue | None:
    """`preview`: what the image's labels say (the local Docker engine's copy), or None when they fit."""
    where = "the labels of the local Docker engine's copy"
    role = labels.get(ROLE_LABEL)
    derive = f"build it FROM {base}, see {DOC}"
    if not role:
        return Issue(want.field, f"{want.image} is not a slurmk8s {want.kind} image (no {ROLE_LABEL} label in {where})",
                     derive)
    if role != want.role:
        return Issue(want.field, f"{want.image} is not a slurmk8s {want.kind} image: it is the slurmk8s {role} image "
                                 f"({ROLE_LABEL}={role} in {where})", derive)
    interface = labels.get(INTERFACE_LABEL)
    if interface is not None and interface != str(IMAGE_INTERFACE):
        return Issue(want.field, f"{want.image} speaks slurmk8s image interface {interface}, this slurmk8s speaks "
                                 f"{IMAGE_INTERFACE} ({where})", f"rebuild it FROM {base}, see {DOC}")
    return None


def preview_check(spec: ClusterSpec, api: Any, echo: Callable[[str], Any], *, namespace_exists: bool,
                  labels_of: Callable[[str], dict[str, str] | None] = docker_labels) -> None:
    """`slurmk8s preview` creates nothing: judge the new images by their labels where the local Docker
    engine has them; `up` runs the full check."""
    in_use = live_images(spec, api, namespace_exists)
    issues = []
    for want in wanted(spec, in_use):
        labels = labels_of(want.image)
        if labels is None:
            echo(f"note: preview cannot check {want.image} ({want.field}): not in the local Docker engine; "
                 "`up` checks it in the cluster")
            continue
        issue = label_issue(want, labels, base=base_image(spec, want))
        if issue is not None:
            issues.append(issue)
    if issues:
        raise ImageCheckError(issues, title="the spec names images that cannot serve their role")
