"""The control tier's few Kubernetes calls (:class:`TierApi`, dicts in and out) and
:class:`ClientTierApi`, which makes them through :mod:`provisioner.kubeapi`.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from .. import manifests as m
from ..kubeapi import RawClient
from .decision import rfc3339


class TierApi(Protocol):
    def list_workloads(self, namespace: str) -> list[dict[str, Any]]: ...

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]: ...

    def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None: ...

    def annotate(self, namespace: str, kind: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]: ...


TIER_SELECTOR = f"{m.L_TIER}={m.TIER_CONTROL}"


MERGE_PATCH = "application/merge-patch+json"  # the client would pick json-patch for a dict body


class ClientTierApi(RawClient):
    """TierApi over the official client (raw JSON), with request timeouts."""

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

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self._core.read_namespaced_pod, name, namespace)

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self._call(self._core.create_namespaced_event, namespace, dict(body))

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        return self._call(self._core.list_namespaced_event, namespace, field_selector=field_selector).get("items", [])


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
