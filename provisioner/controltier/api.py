"""The control tier's few Kubernetes calls (:class:`TierApi`, dicts in and out) and
:class:`ClientTierApi`, which makes them through :mod:`provisioner.kubeapi`.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from .. import names
from ..kubeapi import MERGE_PATCH, RawClient, api_path
from .decision import rfc3339


class TierApi(Protocol):
    def list_workloads(self, namespace: str) -> list[dict[str, Any]]: ...

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]: ...

    def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None: ...

    def get_state(self, namespace: str) -> dict[str, str]: ...

    def set_state(self, namespace: str, annotations: Mapping[str, str]) -> None: ...

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...

    def list_endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]: ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]: ...


TIER_SELECTOR = f"{names.L_TIER}={names.TIER_CONTROL}"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # the EndpointSlice controller's label: its Service


class ClientTierApi(RawClient):
    """TierApi over the Kubernetes API by REST path (raw JSON), with request timeouts."""

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        out = []
        for kind in ("StatefulSet", "Deployment"):
            doc = self.request("GET", _workload_path(namespace, kind), {"labelSelector": TIER_SELECTOR})
            out += [{**item, "kind": kind} for item in doc.get("items", [])]
        return out

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        return {**self.request("GET", _workload_path(namespace, kind, name)), "kind": kind}

    def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        self.request("PATCH", _workload_path(namespace, kind, name, "scale"), {"fieldManager": FIELD_MANAGER},
                     {"spec": {"replicas": replicas}}, MERGE_PATCH)

    def get_state(self, namespace: str) -> dict[str, str]:
        """The annotations of the tier's state ConfigMap (manifests.rbac.tier_state_config_map)."""
        doc = self.request("GET", api_path("v1", namespace, "configmaps", names.TIER_STATE))
        return dict((doc.get("metadata") or {}).get("annotations") or {})

    def set_state(self, namespace: str, annotations: Mapping[str, str]) -> None:
        self.request("PATCH", api_path("v1", namespace, "configmaps", names.TIER_STATE), {"fieldManager": FIELD_MANAGER},
                     {"metadata": {"annotations": dict(annotations)}}, MERGE_PATCH)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.request("GET", api_path("v1", namespace, "pods"), {"labelSelector": selector}).get("items", [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", api_path("v1", namespace, "pods", name))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod `name` as it is now (its uid a precondition: a pod made since under that
        name refuses it, 409), gracefully."""
        self.request("DELETE", api_path("v1", namespace, "pods", name), None,
                     {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}})

    def list_endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        return self.request("GET", api_path("discovery.k8s.io/v1", namespace, "endpointslices"),
                            {"labelSelector": f"{SERVICE_NAME_LABEL}={service}"}).get("items", [])

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.request("POST", api_path("v1", namespace, "events"), None, dict(body))

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        return self.request("GET", api_path("v1", namespace, "events"),
                            {"fieldSelector": field_selector}).get("items", [])


FIELD_MANAGER = "slurmk8s-control-tier"


def _workload_path(namespace: str, kind: str, name: str = "", sub: str = "") -> str:
    return api_path("apps/v1", namespace, "statefulsets" if kind == "StatefulSet" else "deployments", name, sub)


def event_body(namespace: str, reason: str, message: str, at: float, source: str,
               kind: str = "StatefulSet", name: str = names.CONTROLLER) -> dict[str, Any]:
    stamp = rfc3339(at)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "apps/v1", "kind": kind, "name": name, "namespace": namespace},
        "reason": reason, "message": message[:1000], "type": "Normal",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": source},
    }
