"""An in-memory pod API (the PodApi protocol of provisioner.elastic.k8s_backend) with the API
server's semantics for names, conflicts, preconditions, graceful deletion and RBAC. The real API is
exercised by the e2e tier (tests/test_kube_backend.py's e2e tests and e2e/).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from provisioner.elastic.k8s_backend import TERMINAL_PHASES
from provisioner.kubeapi import ApiError

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _status(code: int, reason: str, message: str) -> ApiError:
    return ApiError(code, reason, message)


@dataclass
class FakePodApi:
    """Pods in memory with the API server's behaviour that the backend relies on:

    - create: 422 Invalid for a bad name or a missing container, 404 for an unknown namespace,
      409 AlreadyExists for a taken name; new pods get uid, creationTimestamp, phase Pending and,
      when their node affinity names a node, spec.nodeName (bound);
    - delete: 404 NotFound; 409 Conflict when a uid or resourceVersion precondition does not match;
      an unbound or finished pod, or grace 0, goes at once, a bound running pod gets
      deletionTimestamp and goes when its grace period has passed on the fake clock (``advance``,
      ``sleep``); a pod with finalizers (Kueue's) stays, Failed and terminating, until a patch
      takes the last one off; returns the pod as left (a Status when it is gone);
    - resourceVersion: a new one (one counter, as etcd's revision) at every write of a pod: its
      create, a phase the kubelet stand-in sets, the deletionTimestamp, a patch that changes it;
    - patch: a JSON merge patch of metadata.annotations / labels / finalizers (the list replaced); a
      metadata.resourceVersion in it
      is a precondition (409 Conflict); 404 NotFound; a patch that changes nothing writes nothing;
    - list with a label selector (`k=v`, `k in (a,b)`; recorded in ``selectors``); get;
    - RBAC: ``allowed`` verbs (403 Forbidden with the API server's wording otherwise);
    - ``fail_next``: errors to raise on the next calls (e.g. 500, 429, 0 = unreachable);
    - get_statefulset: the slurmctld StatefulSet (uid ``sts-<namespace>``) in every namespace, or
      only those in ``statefulsets`` when it is set; ``statefulset_error`` raised instead when set
      (not taken from ``fail_next``, which stays for the pod calls).
    """

    namespaces: set[str] = field(default_factory=set)
    allowed: frozenset[str] = frozenset({"create", "get", "list", "watch", "delete", "patch"})
    user: str = "system:serviceaccount:ns:slurmctld"
    now: float = 1_700_000_000.0
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    fail_next: list[ApiError] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    selectors: list[str] = field(default_factory=list)  # the label selector of each list
    limits: list[int] = field(default_factory=list)  # the limit of each list_page
    _gone_at: dict[tuple[str, str], float] = field(default_factory=dict)
    _revision: int = 0
    statefulsets: dict[tuple[str, str], dict[str, Any]] | None = None
    statefulset_error: ApiError | None = None
    workloads: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # Kueue's, get_workload

    # clock
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for key, at in list(self._gone_at.items()):
            if at <= self.now:
                self._end(key)

    def _end(self, key: tuple[str, str]) -> None:
        """A deleted pod whose containers are done: gone, or, while it has finalizers, kept
        (Failed, terminating) until the last is taken off (patch)."""
        pod = self.pods.get(key)
        self._gone_at.pop(key, None)
        if pod is None:
            return
        if pod["metadata"].get("finalizers"):
            pod["metadata"].setdefault("deletionTimestamp", "terminating")
            pod["metadata"]["deletionGracePeriodSeconds"] = 0
            pod["status"]["phase"] = "Failed"
            self._written(pod)
        else:
            self.pods.pop(key)

    def _written(self, pod: dict[str, Any]) -> None:
        self._revision += 1
        pod["metadata"]["resourceVersion"] = str(self._revision)

    # kubelet stand-in
    def set_phase(self, namespace: str, name: str, phase: str, *, waiting: str | None = None) -> None:
        pod = self.pods[(namespace, name)]
        pod["status"]["phase"] = phase
        if waiting:
            pod["status"]["containerStatuses"] = [{"name": "slurmd", "state": {"waiting": {"reason": waiting}}}]
        self._written(pod)

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
                    creationTimestamp=datetime.fromtimestamp(self.now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._written(pod)
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

    def delete(self, namespace: str, name: str, *, grace_seconds: int | None = None, uid: str | None = None,
               resource_version: str | None = None) -> dict[str, Any]:
        self._check("delete", namespace)
        key = (namespace, name)
        pod = self.pods.get(key)
        if pod is None:
            raise _status(404, "NotFound", f'pods "{name}" not found')
        if uid is not None and pod["metadata"]["uid"] != uid:
            raise _status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                                           f"UID in object meta: {pod['metadata']['uid']}")
        if resource_version is not None and pod["metadata"]["resourceVersion"] != resource_version:
            raise _status(409, "Conflict", f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                                           f"ResourceVersion in object meta: {pod['metadata']['resourceVersion']}")
        grace = grace_seconds if grace_seconds is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
        bound = bool(pod["spec"].get("nodeName"))
        if grace == 0 or not bound or pod["status"].get("phase") in TERMINAL_PHASES:
            self._end(key)
            gone = key not in self.pods
            return ({"kind": "Status", "status": "Success"} if gone else json.loads(json.dumps(pod)))
        if "deletionTimestamp" not in pod["metadata"]:
            pod["metadata"]["deletionTimestamp"] = "terminating"
            pod["metadata"]["deletionGracePeriodSeconds"] = grace
            self._gone_at[key] = self.now + grace
            self._written(pod)
        return json.loads(json.dumps(pod))

    def patch(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check("patch", namespace)
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise _status(404, "NotFound", f'pods "{name}" not found')
        meta = pod["metadata"]
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != meta["resourceVersion"]:
            raise _status(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": the object has been '
                                           "modified; please apply your changes to the latest version and try again")
        before = json.dumps(meta, sort_keys=True)
        for part in ("annotations", "labels"):
            for k, v in ((body.get("metadata") or {}).get(part) or {}).items():
                if v is None:
                    (meta.get(part) or {}).pop(k, None)
                else:
                    meta.setdefault(part, {})[k] = v
        if "finalizers" in (body.get("metadata") or {}):  # a merge patch replaces the list
            meta["finalizers"] = list(body["metadata"]["finalizers"] or ())
            if not meta["finalizers"]:
                meta.pop("finalizers")
        if json.dumps(meta, sort_keys=True) != before:
            self._written(pod)
        key = (namespace, name)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and key not in self._gone_at:
            self.pods.pop(key)  # its containers were done: the last finalizer was all that kept it
        return json.loads(json.dumps(pod))

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._check("list", namespace)
        self.selectors.append(label_selector)
        want: dict[str, set[str]] = {}  # key -> the values it may have (`k=v`, `k in (a,b)`)
        for part in re.findall(r"[^,(]+(?:\([^)]*\))?", label_selector):
            key, sep, value = part.partition("=")
            if sep:
                want[key.strip()] = {value.strip()}
            else:
                key, _, values = part.partition(" in ")
                want[key.strip()] = {v.strip() for v in values.strip().strip("()").split(",")}
        out = []
        for (ns, _), pod in sorted(self.pods.items()):
            labels = pod["metadata"].get("labels") or {}
            if ns == namespace and all(labels.get(k) in v for k, v in want.items()):
                out.append(json.loads(json.dumps(pod)))
        return out

    def list_page(self, namespace: str, label_selector: str, limit: int, cont: str = "") -> dict[str, Any]:
        """A page of :meth:`list` (the continue token is the offset), with a resourceVersion."""
        items = self.list(namespace, label_selector)
        self.limits.append(limit)
        start = int(cont or 0)
        more = start + limit < len(items)
        return {"items": items[start:start + limit],
                "metadata": {"resourceVersion": str(len(self.calls)), "continue": str(start + limit) if more else ""}}

    def get_statefulset(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("get-statefulset", namespace))
        if self.statefulset_error is not None:
            raise self.statefulset_error
        if self.statefulsets is None:
            if name == "slurmctld":
                return {"apiVersion": "apps/v1", "kind": "StatefulSet",
                        "metadata": {"name": name, "namespace": namespace, "uid": f"sts-{namespace}"}}
        elif (namespace, name) in self.statefulsets:
            return json.loads(json.dumps(self.statefulsets[(namespace, name)]))
        raise _status(404, "NotFound", f'statefulsets.apps "{name}" not found')

    def get_workload(self, namespace: str, name: str) -> dict[str, Any]:
        """A Kueue Workload from ``workloads`` ((namespace, name) -> object); 404 otherwise."""
        self.calls.append(("get-workload", name))
        self._check("get", namespace)
        if (namespace, name) in self.workloads:
            return json.loads(json.dumps(self.workloads[(namespace, name)]))
        raise _status(404, "NotFound", f'workloads.kueue.x-k8s.io "{name}" not found')


def _affinity_node(pod: Mapping[str, Any]) -> str | None:
    terms = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return f["values"][0]
    return None
