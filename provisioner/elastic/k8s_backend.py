"""The Kubernetes node backend: one worker pod per resumed Slurm node.

Runs inside the slurmctld pod (ResumeProgram / SuspendProgram, ``SLURMK8S_BACKEND=kubernetes``)
with the slurmctld ServiceAccount, which may only create/get/list/watch/delete pods in its own
namespace, and get the slurmctld StatefulSet: every worker pod names it as its owner
(:meth:`KubernetesBackend.owner_reference`), so the garbage collector removes them with it. The pod comes from :func:`provisioner.manifests.worker_pod`, the same builder the Pulumi
program stores as the pools' templates, fed with the spec mounted from the ``slurmk8s-spec``
ConfigMap. Its sibling for the Docker test bed is :mod:`provisioner.elastic.docker_backend`.

Every call is idempotent and bounded: a create of a pod that is already there for the same node is
a no-op; a dead (Failed / Succeeded) pod or one built from an older spec is replaced; a pod still
terminating is waited for at most ``terminating_wait`` seconds; a delete of a missing pod is a
no-op. Kubernetes API errors become :class:`~provisioner.elastic.backend.BackendError` with a short
reason (it becomes the Slurm node's DOWN reason) and ``retryable`` set for transient ones, so a
failing API never turns into a crash loop.

The API is reached through :class:`PodApi` (a few calls, dicts in and out); :class:`ClientPodApi`
implements it over :mod:`provisioner.kubeapi` (the one seam to the API); the unit tests use an
in-memory fake with the API server's semantics (tests/fakes/kube.py).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from .. import kueue
from .. import manifests as m
from ..config import ClusterSpec, parse_spec
from ..errors import SlurmK8sError
from ..inventory import SlurmNode
from ..kueue import PodGroup
from ..kubeapi import MERGE_PATCH, ApiError, KubeConfigError, RawClient, api_client, api_path
from ..manifests.admission import PREFIX as ADMISSION_PREFIX
from .. import settings
from ..names import A_ADOPTED, BUSY_ANNOTATIONS, L_BUSY
from .backend import BackendError, Worker, WorkerGone, WorkerReplaced
from .pods import _one_line, pod_phase, worker_from_pod

DEFAULT_SPEC: str = settings.default(settings.SPEC)
DEFAULT_SITE: str = settings.default(settings.SITE)
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TERMINAL_PHASES = frozenset({"Failed", "Succeeded"})
KEPT_PHASES = frozenset({"Pending", "Running"})  # a pod in these (not terminating) may be adopted
# a resume / suspend / resume-fail of at most this many nodes lists only their pods (KubernetesBackend.list)
LIST_BY_NAME_MAX = 200


def list_all(api: Any, namespace: str, selector: str, page: int = 500) -> tuple[list[Any], str]:
    """Every pod matching `selector` through ``api.list_page``, `page` at a time, and the list's
    resourceVersion (the pages are one snapshot: the API server serves each continuation at the
    first page's version). Pages bound what one response holds; the pods are all read anyway."""
    items: list[Any] = []
    cont = ""
    while True:
        doc = api.list_page(namespace, selector, page, cont)
        items.extend(doc.get("items") or ())
        meta = doc.get("metadata") or {}
        cont = str(meta.get("continue") or "")
        if not cont:
            return items, str(meta.get("resourceVersion") or "")


class PodApi(Protocol):
    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def get(self, namespace: str, name: str) -> dict[str, Any]: ...

    def delete(self, namespace: str, name: str, *, grace_seconds: int | None = None,
               uid: str | None = None, resource_version: str | None = None) -> dict[str, Any]: ...

    def patch(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    def list_page(self, namespace: str, label_selector: str, limit: int, cont: str = "") -> dict[str, Any]: ...

    def get_statefulset(self, namespace: str, name: str) -> dict[str, Any]: ...

    def get_workload(self, namespace: str, name: str) -> dict[str, Any]: ...


class ClientPodApi(RawClient):
    """PodApi over the Kubernetes API by REST path (raw JSON, no model objects), with request timeouts."""

    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", api_path("v1", namespace, "pods"), {"fieldManager": "slurmk8s-resume"}, dict(body))

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", api_path("v1", namespace, "pods", name))

    def delete(self, namespace: str, name: str, *, grace_seconds: int | None = None, uid: str | None = None,
               resource_version: str | None = None) -> dict[str, Any]:
        """Delete the pod, with `uid` and `resource_version` as preconditions where given (the API
        server answers 409 Conflict when the pod is another one, or has changed since). Returns the
        pod as the deletion left it (a Status when it is gone at once)."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v is not None}
        if preconditions:
            body["preconditions"] = preconditions
        return self.request("DELETE", api_path("v1", namespace, "pods", name), None, body)

    def patch(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the pod; a metadata.resourceVersion in it is a precondition (409
        Conflict when the pod has changed since). Returns the pod as written."""
        return self.request("PATCH", api_path("v1", namespace, "pods", name), {"fieldManager": "slurmk8s-resume"},
                            dict(body), MERGE_PATCH)

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return list_all(self, namespace, label_selector)[0]

    def list_page(self, namespace: str, label_selector: str, limit: int, cont: str = "") -> dict[str, Any]:
        """One page of a list (`limit` pods from continue token `cont`), as the API's PodList."""
        return self.request("GET", api_path("v1", namespace, "pods"),
                            {"labelSelector": label_selector, "limit": limit, "continue": cont or None})

    def watch(self, namespace: str, label_selector: str, resource_version: str,
              timeout_s: int) -> Iterator[dict[str, Any]]:
        """The pods' changes after `resource_version`, as the API's watch events ({"type",
        "object"}; bookmarks on), until the API server ends the watch after `timeout_s` seconds.
        A refusal raises ApiError (410 when the version is too old), as does a broken stream; an
        expiry found later comes as an ERROR event whose object is the Status (code 410)."""
        query = {"labelSelector": label_selector, "resourceVersion": resource_version,
                 "allowWatchBookmarks": True, "timeoutSeconds": timeout_s}
        return self.watch_path(api_path("v1", namespace, "pods"), query, (self._timeout[0], timeout_s + 30.0))

    def get_statefulset(self, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", api_path("apps/v1", namespace, "statefulsets", name))

    def get_workload(self, namespace: str, name: str) -> dict[str, Any]:
        """A Kueue Workload (a pod group's is named after the group)."""
        return self.request("GET", api_path(kueue.API, namespace, kueue.WORKLOADS, name))


@dataclass
class KubernetesBackend:
    """NodeBackend that creates / deletes the worker pod of one Slurm node."""

    spec: ClusterSpec
    api: PodApi
    namespace: str = ""
    site: m.K8sSite = m.K8sSite()
    terminating_wait: float = 15.0  # how long a create waits for a previous pod to go away
    poll: float = 0.5
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    max_attempts: int = 4
    _selector: str = field(init=False, default="")
    _owner: dict[str, Any] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.namespace:
            self.namespace = self.spec.namespace_name
        self._selector = f"{m.L_CLUSTER}={self.spec.name},{m.L_COMPONENT}=worker"

    # -- errors

    def _error(self, node: str, verb: str, err: ApiError) -> BackendError:
        ns = self.namespace
        msg = _one_line(err.message)
        if err.status == 0 and err.reason == "TLSVerify":
            return BackendError(node, f"cannot verify the Kubernetes API server's TLS certificate: {msg}")
        if err.status == 0:
            return BackendError(node, f"Kubernetes API unreachable ({msg})", retryable=True)
        if err.status == 401:
            return BackendError(node, f"Kubernetes API rejected the ServiceAccount token (401): {msg}", retryable=True)
        if err.status == 403:
            if "exceeded quota" in msg:
                return BackendError(node, f"resource quota of namespace {ns} exceeded: {msg}", retryable=True)
            if "PodSecurity" in msg:
                return BackendError(node, f"pod rejected by Pod Security admission in {ns}: {msg}")
            if "ValidatingAdmissionPolicy" in msg:
                # the worker pod does not match the pool templates (manifests/admission.py): the
                # spec mounted here and the policy applied by the last `up` disagree
                why = msg.rpartition("denied request: ")[2].removeprefix(ADMISSION_PREFIX)
                return BackendError(node, f"worker pod refused by the admission policy {m.policy_name(self.spec)} "
                                          f"(rerun `slurmk8s up` if the spec changed): {why}")
            return BackendError(node, f"RBAC: not allowed to {verb} pods in namespace {ns} "
                                      f"(check Role/RoleBinding {m.WORKER_ROLE}): {msg}")
        if err.status == 404 and verb == "create":
            return BackendError(node, f"namespace {ns} not found: {msg}")
        if err.status == 422 or err.status == 400:
            return BackendError(node, f"invalid worker pod spec ({err.reason}): {msg}")
        if err.status == 429:
            return BackendError(node, f"Kubernetes API throttling (429): {msg}", retryable=True)
        if err.status >= 500 and "failed calling webhook" in msg:
            # an admission webhook that does not answer: Kueue's, for a pool under a queue
            hook = msg.partition('failed calling webhook "')[2].partition('"')[0] or "?"
            if "kueue" in msg.lower():
                return BackendError(node, f"Kueue does not answer: its admission webhook {hook} failed, so no pod "
                                          f"of a pool under Kueue can be created (is Kueue running? kubectl -n "
                                          f"kueue-system get pods): {msg}", retryable=True)
            return BackendError(node, f"admission webhook {hook} failed: {msg}", retryable=True)
        if err.status >= 500:
            return BackendError(node, f"Kubernetes API error {err.status} {err.reason}: {msg}", retryable=True)
        return BackendError(node, f"Kubernetes API {verb} failed: {err.status} {err.reason}: {msg}",
                            retryable=err.status == 409)

    # -- helpers

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get(self.namespace, name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise self._error(name, "get", err) from None

    def _ours(self, pod: Mapping[str, Any], node: str) -> bool:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return labels.get(m.L_CLUSTER) == self.spec.name and labels.get(m.L_NODE) == node

    def _delete(self, name: str, uid: str | None, grace: int | None = None) -> None:
        try:
            pod = self.api.delete(self.namespace, name, grace_seconds=grace, uid=uid)
        except ApiError as err:
            if err.status == 404:
                return
            if err.status == 409:  # precondition: the pod was replaced meanwhile; the caller looks again
                return
            raise self._error(name, "delete", err) from None
        self._release_from_kueue(name, pod)

    def _release_from_kueue(self, name: str, pod: Mapping[str, Any] | None) -> None:
        """A deleted pod of a Kueue pool goes like any other: Kueue's finalizer, which would keep it
        until its whole pod group is done (the other nodes of the job may run on for hours, and
        the node's next worker needs the name), is taken off. Kueue sees the deletion all the same,
        and its group holds the quota until none of its pods is left (kueue.py)."""
        for _ in range(self.max_attempts):
            meta = (pod or {}).get("metadata") or {}
            finalizers = list(meta.get("finalizers") or ())
            if (pod or {}).get("kind", "Pod") != "Pod" or kueue.FINALIZER not in finalizers \
                    or not meta.get("deletionTimestamp"):
                return
            rest = [f for f in finalizers if f != kueue.FINALIZER]
            try:  # conditional on the version read: another controller's finalizer is never lost
                self.api.patch(self.namespace, name, {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                                                   "finalizers": rest}})
                return
            except ApiError as err:
                if err.status == 404:
                    return
                if err.status != 409:
                    raise self._error(name, "patch", err) from None
            pod = self._get(name)
            if pod is None or (pod.get("metadata") or {}).get("uid") != meta.get("uid"):
                return
        raise BackendError(name, f"pod {name} kept changing while Kueue's finalizer was taken off it", retryable=True)

    def _wait_gone(self, name: str, deadline: float) -> bool:
        while self.clock() < deadline:
            if self._get(name) is None:
                return True
            self.sleep(self.poll)
        return self._get(name) is None

    def owner_reference(self, node: str = "*") -> dict[str, Any]:
        """The ownerReference every worker pod gets: the slurmctld StatefulSet, read once per program run.

        With it, Kubernetes' garbage collector deletes the worker pods when the StatefulSet is
        deleted (`helm uninstall`, including pods a resume created after the pre-delete hook ran;
        `slurmk8s down`; the namespace's deletion). Only a deletion of the owner object does that:
        the idle teardown's scale of the StatefulSet to 0 replicas leaves its workers alone.
        controller: false (the StatefulSet controller does not adopt or manage them; they are not
        its replicas) and blockOwnerDeletion: false (needs no update right on the owner). A
        StatefulSet that cannot be read fails the resume: no ownerless pod is created.
        """
        if self._owner is None:
            ns = self.namespace
            why = ""
            try:
                sts = self.api.get_statefulset(ns, m.CONTROLLER)
            except ApiError as err:
                msg = _one_line(err.message)
                if err.status == 404:
                    why = f"StatefulSet {m.CONTROLLER} not found in {ns}"
                elif err.status == 403:
                    why = (f"RBAC: not allowed to get StatefulSet {m.CONTROLLER} in {ns} (check Role/RoleBinding "
                           f"{m.WORKER_ROLE}): {msg}")
                else:
                    why = f"{err.status or 'unreachable'} {err.reason}: {msg}".strip()
                raise BackendError(node, f"cannot read the worker pods' owner (StatefulSet {m.CONTROLLER} in {ns}): "
                                         f"{why}; no worker pod without an owner is created",
                                   retryable=err.status in (0, 429) or err.status >= 500) from None
            uid = str(((sts or {}).get("metadata") or {}).get("uid") or "")
            if not uid:
                raise BackendError(node, f"StatefulSet {m.CONTROLLER} in {ns} has no uid; no worker pod without "
                                         "an owner is created")
            self._owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": m.CONTROLLER, "uid": uid,
                           "controller": False, "blockOwnerDeletion": False}
        return dict(self._owner)

    # -- NodeBackend

    def create(self, node: SlurmNode, group: PodGroup | None = None) -> None:
        desired = m.worker_pod(self.spec, node, self.site)
        want_hash = desired["metadata"]["annotations"][m.A_SPEC_HASH]
        # after the spec hash: the owner's uid changes with each deployment, not the pod's spec;
        # a pool under Kueue: the pod group of this power-up of the node's job
        desired["metadata"]["ownerReferences"] = [self.owner_reference(node.name)]
        if group is not None and self.spec.pool(node.pool).kueue is not None:
            desired["metadata"]["labels"][kueue.GROUP_LABEL] = group.name
            desired["metadata"]["annotations"][kueue.GROUP_TOTAL] = str(group.total)
        deadline = self.clock() + self.terminating_wait
        for _ in range(self.max_attempts):
            try:
                self.api.create(self.namespace, desired)
                return
            except ApiError as err:
                if err.status != 409:
                    raise self._error(node.name, "create", err) from None
            pod = self._get(node.name)
            if pod is None:
                continue  # deleted between our create and get: try again
            meta = pod.get("metadata") or {}
            if not self._ours(pod, node.name):
                raise BackendError(node.name, f"a pod named {node.name} that is not this cluster's worker for "
                                              f"node {node.name} exists in {self.namespace}; delete or rename it")
            phase = pod_phase(pod)
            if phase == "Terminating":
                self._release_from_kueue(node.name, pod)  # e.g. Kueue preempted it: it goes as any other
            elif phase in TERMINAL_PHASES:
                # nothing runs in it any more: remove it at once
                self._delete(node.name, meta.get("uid"), grace=0)
            elif (meta.get("annotations") or {}).get(m.A_SPEC_HASH) != want_hash:
                self._delete(node.name, meta.get("uid"))
            elif self.adopt(node.name, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")):
                return  # already there for this node, same spec: kept, and marked so (adopt)
            else:
                continue  # deleted or replaced since the get: look again
            if not self._wait_gone(node.name, deadline):
                raise BackendError(node.name, f"previous pod {node.name} is still terminating after "
                                              f"{self.terminating_wait:.0f}s", retryable=True)
        raise BackendError(node.name, f"pod {node.name} kept reappearing while being replaced", retryable=True)

    def delete(self, name: str, uid: str | None = None, force: bool = False, version: str | None = None) -> None:
        grace = 0 if force else None
        if uid:
            # conditional on the pod judged (the uid came from our own labelled list, the version
            # with it): a pod that replaced it under the same name, or the same pod written since (a
            # resume adopted it, a delete began), fails the precondition (409) and stays
            try:
                pod = self.api.delete(self.namespace, name, uid=uid, grace_seconds=grace,
                                      resource_version=version or None)
            except ApiError as err:
                if err.status == 404:
                    raise WorkerGone(name, f"pod {name} (uid {uid}) is gone already: removed by another "
                                           "(the node may be on its next attempt); nothing deleted") from None
                if err.status == 409:
                    since = f"changed since it was judged (version {version})" if version else "replaced since"
                    raise WorkerReplaced(name, f"pod {name} was {since}, or replaced (uid {uid}); "
                                               "left alone, judged again by the next pass") from None
                raise self._error(name, "delete", err) from None
            self._release_from_kueue(name, pod)
            return
        live = self._get(name)
        if live is None:
            return
        if not self._ours(live, name):
            raise BackendError(name, f"pod {name} in {self.namespace} is not this cluster's worker; not deleting it")
        self._delete(name, (live.get("metadata") or {}).get("uid"), grace=grace)

    def adopt(self, name: str, uid: str, version: str = "") -> bool:
        """Keep the live pod `uid` for this resume: write an annotation on it (A_ADOPTED: when, and
        a token, so every adoption is a change) with the version listed as a precondition. The
        write changes the pod's resourceVersion, so a delete judged before it (the reconcile loop's,
        conditional on the version it judged) fails from then on; and a delete that came first
        changed the version too, so the write fails (409) and the pod, read again, is seen being
        deleted: not kept. One call when nothing changed since the list; a version gone stale is
        read again (the kubelet writes the pod's status). False: not kept (gone, another pod by the
        name, terminating or dead); the caller creates the node's worker."""
        for _ in range(self.max_attempts):
            if not version:
                pod = self._get(name)
                meta = (pod or {}).get("metadata") or {}
                if pod is None or meta.get("uid") != uid or pod_phase(pod) not in KEPT_PHASES:
                    return False
                version = str(meta.get("resourceVersion") or "")
            mark = f"{time.time():.3f} {uuid.uuid4().hex[:8]}"
            try:
                pod = self.api.patch(self.namespace, name, {"metadata": {"resourceVersion": version,
                                                                         "annotations": {A_ADOPTED: mark}}})
            except ApiError as err:
                if err.status == 404:
                    return False
                if err.status == 409:
                    version = ""  # written since the list: read it again
                    continue
                raise self._error(name, "patch", err) from None
            meta = (pod or {}).get("metadata") or {}
            return meta.get("uid") == uid and pod_phase(pod) in KEPT_PHASES
        raise BackendError(name, f"pod {name} kept changing while a resume adopted it", retryable=True)

    def queues(self) -> dict[str, str]:
        return {p.name: p.kueue.queue for p in self.spec.pools if p.kueue is not None}

    def mark_busy(self, name: str, uid: str, busy: bool) -> bool:
        """A merge patch of the annotations, with the uid as precondition (409: another pod by the name)."""
        value = {k: (v if busy else None) for k, v in BUSY_ANNOTATIONS.items()}
        label = {L_BUSY: "true" if busy else None}
        try:
            self.api.patch(self.namespace, name, {"metadata": {"uid": uid, "annotations": value, "labels": label}})
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise self._error(name, "patch", err) from None
        return True

    def workload(self, group: str) -> dict[str, Any] | None:
        try:
            return self.api.get_workload(self.namespace, group)
        except ApiError as err:
            if err.status == 404:
                return None
            raise self._error(group, "get workload", err) from None

    @property
    def selector(self) -> str:
        """The label selector of this cluster's worker pods."""
        return self._selector

    def ping(self) -> None:
        """One worker pod listed (``limit=1``): raises BackendError when the API does not answer."""
        try:
            self.api.list_page(self.namespace, self._selector, 1)
        except ApiError as err:
            raise self._error("*", "list", err) from None

    def owner_uid(self, pod_name: str) -> str:
        """uid of the StatefulSet owning pod `pod_name` ('' if none): tells one deployment (`up`) from
        the next, while a restart or a scale to zero and back keeps it. (Asked of slurmctld's own
        pod; a worker pod's owner is the same StatefulSet.)"""
        pod = self._get(pod_name) or {}
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
            if ref.get("kind") == "StatefulSet":
                return str(ref.get("uid") or "")
        return ""

    def taken_gone(self) -> dict[str, str]:
        return {}  # a list sees no pod that is gone: the watched backend remembers them (podwatch.py)

    def list(self, names: Sequence[str] | None = None) -> dict[str, Worker]:
        """The worker pods, all of them, or with `names` those of these nodes only: a label selector
        `<node label> in (...)`, so a resume, suspend or resume-fail of a few nodes reads a few pods,
        whatever the cluster's size. Past LIST_BY_NAME_MAX names, one list of all and a filter here
        (the selector would be long, and the call reads most pods anyway)."""
        wanted = None if names is None else sorted(set(names))
        selector = self._selector
        if wanted is not None and 0 < len(wanted) <= LIST_BY_NAME_MAX:
            selector += f",{m.L_NODE} in ({','.join(wanted)})"
        if wanted == []:
            return {}
        try:
            pods = self.api.list(self.namespace, selector)
        except ApiError as err:
            raise self._error("*", "list", err) from None
        workers = {}
        for pod in pods:
            w = worker_from_pod(pod)
            if wanted is None or w.name in wanted:
                workers[w.name] = w
        return workers


def _read_json(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise BackendError("*", f"cannot read the {what} at {path}: {err}") from None


def from_env(env: Mapping[str, str]) -> KubernetesBackend:
    """The backend as the resume / suspend programs build it (SLURMK8S_BACKEND=kubernetes).

    SLURMK8S_SPEC (default /etc/slurmk8s/spec/spec.json), SLURMK8S_SITE (site.json beside it),
    SLURMK8S_NAMESPACE (default: the ServiceAccount's namespace, else the spec's); in-cluster
    credentials when the ServiceAccount token is mounted, else KUBECONFIG. Works with an empty
    environment (Slurm does not pass slurmctld's environment to ResumeProgram).
    """
    files = settings.ClusterFiles.from_env(env)
    try:
        spec = parse_spec(_read_json(files.spec, "cluster spec"), source="spec.json")
    except SlurmK8sError as err:
        raise BackendError("*", f"invalid spec.json: {err}") from None
    # SLURMK8S_SITE set (not empty): that file; else the default's where there is one
    site_doc = _read_json(files.site, "site") if files.site else (
        _read_json(DEFAULT_SITE, "site") if Path(DEFAULT_SITE).exists() else {})
    site = m.K8sSite(cluster_domain=site_doc.get("cluster_domain", "cluster.local"),
                     host_network_sources=tuple(site_doc.get("host_network_sources", ())))
    namespace = files.namespace or ""
    if not namespace and Path(SA_NAMESPACE_FILE).exists():
        namespace = Path(SA_NAMESPACE_FILE).read_text().strip()  # the ServiceAccount's own namespace
    try:
        client = api_client(env=env)
    except KubeConfigError as err:
        raise BackendError("*", str(err)) from None
    return KubernetesBackend(spec, ClientPodApi(client), namespace=namespace or spec.namespace_name,
                             site=site)
