"""The Kubernetes node backend: one worker pod per resumed Slurm node.

Runs inside the slurmctld pod (ResumeProgram / SuspendProgram, ``SLURMK8S_BACKEND=kubernetes``)
with the slurmctld ServiceAccount, which may only create/get/list/watch/delete pods in its own
namespace. The pod comes from :func:`provisioner.manifests.worker_pod`, the same builder the Pulumi
program stores as the pools' templates, fed with the spec mounted from the ``slurmk8s-spec``
ConfigMap.

Every call is idempotent and bounded: a create of a pod that is already there for the same node is
a no-op; a dead (Failed / Succeeded) pod or one built from an older spec is replaced; a pod still
terminating is waited for at most ``terminating_wait`` seconds; a delete of a missing pod is a
no-op. Kubernetes API errors become :class:`~provisioner.elastic.backend.BackendError` with a short
reason (it becomes the Slurm node's DOWN reason) and ``retryable`` set for transient ones, so a
failing API never turns into a crash loop.

The API is reached through :class:`PodApi` (four calls, dicts in and out); :class:`ClientPodApi`
implements it with the official client and :class:`FakePodApi` in memory, with the API server's
semantics for names, conflicts, preconditions, graceful deletion and RBAC, for the tests.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from . import manifests as m
from .config import ClusterSpec, parse_spec
from .elastic.backend import BackendError, Worker
from .errors import SlurmK8sError
from .inventory import SlurmNode

DEFAULT_SPEC = f"{m.SPEC_DIR}/spec.json"
DEFAULT_SITE = f"{m.SPEC_DIR}/site.json"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TERMINAL_PHASES = frozenset({"Failed", "Succeeded"})
MAX_REASON = 200


# ---------------------------------------------------------------- the API boundary


class ApiError(Exception):
    """A failed API call: HTTP status (0 = no answer), the Status reason and message."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")


class PodApi(Protocol):
    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def get(self, namespace: str, name: str) -> dict[str, Any]: ...

    def delete(self, namespace: str, name: str, *, grace_seconds: int | None = None,
               uid: str | None = None) -> None: ...

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...


def api_error_from(exc: Exception) -> ApiError:
    """kubernetes.client ApiException / urllib3 errors -> ApiError, message from the Status body."""
    status = getattr(exc, "status", None)
    if status is None or status == 0:
        return ApiError(0, "Unreachable", str(exc).splitlines()[0][:MAX_REASON] if str(exc) else type(exc).__name__)
    reason = getattr(exc, "reason", "") or ""
    message = ""
    body = getattr(exc, "body", None)
    if body:
        try:
            doc = json.loads(body)
        except (TypeError, ValueError):
            message = str(body)[:MAX_REASON]
        else:
            if isinstance(doc, dict):
                message = str(doc.get("message", ""))
                reason = str(doc.get("reason") or reason)
    return ApiError(int(status), reason, message)


def transport_error(exc: Exception) -> ApiError:
    """A connection-level failure: TLS verification (a setup problem, not transient) or no answer."""
    text = str(exc)
    tls = re.search(r"certificate verify failed: ([^(')\]]+)", text)
    if tls:
        return ApiError(0, "TLSVerify", tls.group(1).strip())
    return ApiError(0, "Unreachable", f"{type(exc).__name__}: {text[:MAX_REASON]}")


def raw_call(fn: Callable[..., Any], timeout: tuple[float, float], *args: Any, **kwargs: Any) -> Any:
    """Call a kubernetes-client API method for its raw JSON (no model objects), with a request
    timeout; refusals become ApiError with the API's words, transport failures an 'Unreachable' one."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
    except ApiException as exc:
        raise api_error_from(exc) from None
    except (HTTPError, OSError) as exc:
        raise transport_error(exc) from None
    data = resp.data
    return json.loads(data) if data else {}


class ClientPodApi:
    """PodApi over the official client (raw JSON, no model objects), with request timeouts."""

    def __init__(self, api_client: Any, timeout: tuple[float, float] = (5.0, 15.0)) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return raw_call(fn, self._timeout, *args, **kwargs)

    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(self._core.create_namespaced_pod, namespace, dict(body),
                          field_manager="slurmk8s-resume")

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self._core.read_namespaced_pod, name, namespace)

    def delete(self, namespace: str, name: str, *, grace_seconds: int | None = None, uid: str | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        self._call(self._core.delete_namespaced_pod, name, namespace, body=body)

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._call(self._core.list_namespaced_pod, namespace, label_selector=label_selector).get("items", [])


# ---------------------------------------------------------------- the backend


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()[:MAX_REASON]


def pod_phase(pod: Mapping[str, Any]) -> str:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return (pod.get("status") or {}).get("phase") or "Pending"


def pod_reason(pod: Mapping[str, Any]) -> str:
    """Why a pod is not (or no longer) running, in a few words; '' when nothing is wrong."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and (state["waiting"] or {}).get("reason") not in (None, "ContainerCreating"):
            w = state["waiting"]
            return _one_line(f"{w.get('reason')}: {w.get('message', '')}".rstrip(": "))
        if "terminated" in state and (state["terminated"] or {}).get("reason"):
            t = state["terminated"]
            return _one_line(f"{t.get('reason')} (exit {t.get('exitCode')})")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return _one_line(f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}")
    if status.get("reason"):
        return _one_line(f"{status['reason']}: {status.get('message', '')}")
    return ""


def last_death(pod: Mapping[str, Any]) -> tuple[float | None, str]:
    """When the pod's container last died and was restarted in place (lastState.terminated), and how."""
    latest: tuple[float | None, str] = (None, "")
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = ((cs.get("lastState") or {}).get("terminated")) or {}
        at = _epoch(term.get("finishedAt"))
        if at is not None and (latest[0] is None or at > latest[0]):
            how = f"{cs.get('name')} {term.get('reason') or 'terminated'} (exit {term.get('exitCode')})"
            latest = (at, _one_line(f"{how}, {cs.get('restartCount', 0)} restarts"))
    return latest


def worker_from_pod(pod: Mapping[str, Any]) -> Worker:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    died_at, died_how = last_death(pod)
    return Worker(
        name=labels.get(m.L_NODE) or meta.get("name", ""),
        phase=pod_phase(pod),
        reason=pod_reason(pod),
        created_at=_epoch(meta.get("creationTimestamp")),
        host=(pod.get("spec") or {}).get("nodeName"),
        ready_at=next((_epoch(c.get("lastTransitionTime")) for c in (pod.get("status") or {}).get("conditions") or ()
                       if c.get("type") == "Ready" and c.get("status") == "True"), None),
        died_at=died_at,
        died_how=died_how,
    )


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
            return BackendError(node, f"RBAC: not allowed to {verb} pods in namespace {ns} "
                                      f"(check Role/RoleBinding {m.WORKER_ROLE}): {msg}")
        if err.status == 404 and verb == "create":
            return BackendError(node, f"namespace {ns} not found: {msg}")
        if err.status == 422 or err.status == 400:
            return BackendError(node, f"invalid worker pod spec ({err.reason}): {msg}")
        if err.status == 429:
            return BackendError(node, f"Kubernetes API throttling (429): {msg}", retryable=True)
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
            self.api.delete(self.namespace, name, grace_seconds=grace, uid=uid)
        except ApiError as err:
            if err.status == 404:
                return
            if err.status == 409:  # precondition: the pod was replaced meanwhile; the caller looks again
                return
            raise self._error(name, "delete", err) from None

    def _wait_gone(self, name: str, deadline: float) -> bool:
        while self.clock() < deadline:
            if self._get(name) is None:
                return True
            self.sleep(self.poll)
        return self._get(name) is None

    # -- NodeBackend

    def create(self, node: SlurmNode) -> None:
        desired = m.worker_pod(self.spec, node, self.site)
        want_hash = desired["metadata"]["annotations"][m.A_SPEC_HASH]
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
                pass
            elif phase in TERMINAL_PHASES:
                # nothing runs in it any more: remove it at once
                self._delete(node.name, meta.get("uid"), grace=0)
            elif (meta.get("annotations") or {}).get(m.A_SPEC_HASH) != want_hash:
                self._delete(node.name, meta.get("uid"))
            else:
                return  # already there for this node, same spec: nothing to do
            if not self._wait_gone(node.name, deadline):
                raise BackendError(node.name, f"previous pod {node.name} is still terminating after "
                                              f"{self.terminating_wait:.0f}s", retryable=True)
        raise BackendError(node.name, f"pod {node.name} kept reappearing while being replaced", retryable=True)

    def delete(self, name: str) -> None:
        pod = self._get(name)
        if pod is None:
            return
        if not self._ours(pod, name):
            raise BackendError(name, f"pod {name} in {self.namespace} is not this cluster's worker; not deleting it")
        self._delete(name, (pod.get("metadata") or {}).get("uid"))

    def owner_uid(self, pod_name: str) -> str:
        """uid of the StatefulSet owning pod `pod_name` ('' if none): tells one deployment (`up`) from
        the next, while a restart or a scale to zero and back keeps it."""
        pod = self._get(pod_name) or {}
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
            if ref.get("kind") == "StatefulSet":
                return str(ref.get("uid") or "")
        return ""

    def list(self) -> dict[str, Worker]:
        try:
            pods = self.api.list(self.namespace, self._selector)
        except ApiError as err:
            raise self._error("*", "list", err) from None
        workers = {}
        for pod in pods:
            w = worker_from_pod(pod)
            workers[w.name] = w
        return workers


# ---------------------------------------------------------------- from the environment (in the slurmctld pod)


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
    try:
        spec = parse_spec(_read_json(env.get("SLURMK8S_SPEC", DEFAULT_SPEC), "cluster spec"), source="spec.json")
    except SlurmK8sError as err:
        raise BackendError("*", f"invalid spec.json: {err}") from None
    site_doc = _read_json(env["SLURMK8S_SITE"], "site") if env.get("SLURMK8S_SITE") else (
        _read_json(DEFAULT_SITE, "site") if Path(DEFAULT_SITE).exists() else {})
    site = m.K8sSite(cluster_domain=site_doc.get("cluster_domain", "cluster.local"),
                     host_network_sources=tuple(site_doc.get("host_network_sources", ())))
    namespace = env.get("SLURMK8S_NAMESPACE", "")
    if not namespace and Path(SA_NAMESPACE_FILE).exists():
        namespace = Path(SA_NAMESPACE_FILE).read_text().strip()  # the ServiceAccount's own namespace
    return KubernetesBackend(spec, ClientPodApi(_api_client(env)), namespace=namespace or spec.namespace_name,
                             site=site)


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _api_client(env: Mapping[str, str], sa_dir: str = SA_DIR) -> Any:
    """In-cluster credentials when the ServiceAccount token is mounted, else KUBECONFIG.

    Slurm runs ResumeProgram with a reduced environment, so KUBERNETES_SERVICE_HOST may be
    missing even inside the pod: then the API is reached as kubernetes.default.svc (which every
    pod resolves and the API server's certificate names).
    """
    from kubernetes import client, config
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token = Path(sa_dir) / "token"
    try:
        if env.get("KUBERNETES_SERVICE_HOST") or (token.exists() and not env.get("KUBECONFIG")):
            cfg = client.Configuration()
            InClusterConfigLoader(
                token_filename=str(token), cert_filename=str(Path(sa_dir) / "ca.crt"),
                environ={"KUBERNETES_SERVICE_HOST": env.get("KUBERNETES_SERVICE_HOST") or "kubernetes.default.svc",
                         "KUBERNETES_SERVICE_PORT": env.get("KUBERNETES_SERVICE_PORT") or "443"},
            ).load_and_set(cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(config_file=env.get("KUBECONFIG") or None)
    except config.ConfigException as err:
        raise BackendError("*", f"no Kubernetes credentials (in-cluster or KUBECONFIG): {err}") from None


# ---------------------------------------------------------------- an in-memory API server for tests

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _status(code: int, reason: str, message: str) -> ApiError:
    return ApiError(code, reason, message)


@dataclass
class FakePodApi:
    """Pods in memory with the API server's behaviour that the backend relies on:

    - create: 422 Invalid for a bad name or a missing container, 404 for an unknown namespace,
      409 AlreadyExists for a taken name; new pods get uid, creationTimestamp, phase Pending and,
      when their node affinity names a node, spec.nodeName (bound);
    - delete: 404 NotFound; 409 Conflict when a uid precondition does not match; an unbound or
      finished pod, or grace 0, goes at once, a bound running pod gets deletionTimestamp and goes
      when its grace period has passed on the fake clock (``advance``, ``sleep``);
    - list with an equality label selector; get;
    - RBAC: ``allowed`` verbs (403 Forbidden with the API server's wording otherwise);
    - ``fail_next``: errors to raise on the next calls (e.g. 500, 429, 0 = unreachable).
    """

    namespaces: set[str] = field(default_factory=set)
    allowed: frozenset[str] = frozenset({"create", "get", "list", "watch", "delete"})
    user: str = "system:serviceaccount:ns:slurmctld"
    now: float = 1_700_000_000.0
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    fail_next: list[ApiError] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    _gone_at: dict[tuple[str, str], float] = field(default_factory=dict)

    # clock
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for key, at in list(self._gone_at.items()):
            if at <= self.now:
                self.pods.pop(key, None)
                self._gone_at.pop(key, None)

    # kubelet stand-in
    def set_phase(self, namespace: str, name: str, phase: str, *, waiting: str | None = None) -> None:
        pod = self.pods[(namespace, name)]
        pod["status"]["phase"] = phase
        if waiting:
            pod["status"]["containerStatuses"] = [{"name": "slurmd", "state": {"waiting": {"reason": waiting}}}]

    def _check(self, verb: str, namespace: str) -> None:
        self.calls.append((verb, namespace))
        if self.fail_next:
            raise self.fail_next.pop(0)
        if verb not in self.allowed:
            raise _status(403, "Forbidden", f'pods is forbidden: User "{self.user}" cannot {verb} resource "pods" '
                                             f'in API group "" in the namespace "{namespace}"')

    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check("create", namespace)
        pod = json.loads(json.dumps(body))
        meta = pod.setdefault("metadata", {})
        name = meta.get("name", "")
        if self.namespaces and namespace not in self.namespaces:
            raise _status(404, "NotFound", f'namespaces "{namespace}" not found')
        if not name or len(name) > 253 or not _DNS1123.match(name):
            raise _status(422, "Invalid", f'Pod "{name}" is invalid: metadata.name: Invalid value: "{name}": '
                                          "a lowercase RFC 1123 subdomain must consist of ...")
        if not (pod.get("spec") or {}).get("containers"):
            raise _status(422, "Invalid", f'Pod "{name}" is invalid: spec.containers: Required value')
        if meta.get("namespace", namespace) != namespace:
            raise _status(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                             "sent on the request")
        if (namespace, name) in self.pods:
            raise _status(409, "AlreadyExists", f'pods "{name}" already exists')
        meta.update(namespace=namespace, uid=str(uuid.uuid4()),
                    creationTimestamp=datetime.fromtimestamp(self.now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    resourceVersion=str(len(self.calls)))
        pod["status"] = {"phase": "Pending"}
        node = _affinity_node(pod)
        if node:
            pod["spec"]["nodeName"] = node
        self.pods[(namespace, name)] = pod
        return json.loads(json.dumps(pod))

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        self._check("get", namespace)
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise _status(404, "NotFound", f'pods "{name}" not found')
        return json.loads(json.dumps(pod))

    def delete(self, namespace: str, name: str, *, grace_seconds: int | None = None, uid: str | None = None) -> None:
        self._check("delete", namespace)
        key = (namespace, name)
        pod = self.pods.get(key)
        if pod is None:
            raise _status(404, "NotFound", f'pods "{name}" not found')
        if uid is not None and pod["metadata"]["uid"] != uid:
            raise _status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                                           f"UID in object meta: {pod['metadata']['uid']}")
        grace = grace_seconds if grace_seconds is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
        bound = bool(pod["spec"].get("nodeName"))
        if grace == 0 or not bound or pod["status"].get("phase") in TERMINAL_PHASES:
            self.pods.pop(key)
            self._gone_at.pop(key, None)
            return
        if "deletionTimestamp" not in pod["metadata"]:
            pod["metadata"]["deletionTimestamp"] = "terminating"
            pod["metadata"]["deletionGracePeriodSeconds"] = grace
            self._gone_at[key] = self.now + grace

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._check("list", namespace)
        want = dict(part.split("=", 1) for part in label_selector.split(",") if part)
        out = []
        for (ns, _), pod in sorted(self.pods.items()):
            labels = pod["metadata"].get("labels") or {}
            if ns == namespace and all(labels.get(k) == v for k, v in want.items()):
                out.append(json.loads(json.dumps(pod)))
        return out


def _affinity_node(pod: Mapping[str, Any]) -> str | None:
    terms = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return f["values"][0]
    return None

