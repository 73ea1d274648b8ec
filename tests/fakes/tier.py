"""An in-memory control-tier API (the TierApi protocol of provisioner.controltier.api), with RBAC
refusals; the real calls are exercised by e2e/test_e2e_sleep*.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from provisioner import manifests as m


@dataclass
class FakeTierApi:
    """In-memory TierApi: workloads whose ready count follows replicas after `ready_after` polls
    (pods appear with them and go when scaled to 0), events, and a log of every call."""

    workloads: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    ready_after: int = 1  # get_workload calls until a scaled-up workload reports ready
    forbidden: set[str] = field(default_factory=set)  # verbs that fail with 403 (RBAC)
    # list_endpoint_slices: the address each pod of a Service has in its EndpointSlice, and the
    # pods marked terminating there
    endpoint_ips: dict[str, str] = field(default_factory=dict)
    terminating: set[str] = field(default_factory=set)
    # get_pod / delete_pod / list_pods: pods by name, as the API returns them (none: 404)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    # get_state / set_state: the annotations of the ConfigMap slurmk8s-tier-state (None: no such
    # ConfigMap, 404: a cluster deployed by a release without it)
    state: dict[str, str] | None = field(default_factory=dict)
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
        from provisioner.kubeapi import ApiError

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

    def get_state(self, namespace: str) -> dict[str, str]:
        from provisioner.kubeapi import ApiError

        self._check("get_state")
        if self.state is None:
            raise ApiError(404, "NotFound", 'configmaps "slurmk8s-tier-state" not found')
        return dict(self.state)

    def set_state(self, namespace: str, annotations: Mapping[str, str]) -> None:
        from provisioner.kubeapi import ApiError

        self._check("set_state")
        self.calls.append(("set_state", dict(annotations)))
        if self.state is None:
            raise ApiError(404, "NotFound", 'configmaps "slurmk8s-tier-state" not found')
        self.state.update(annotations)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods of `pods` whose labels match; when none do, one per replica (a name alone)."""
        self._check("list_pods")
        want = dict(kv.split("=", 1) for kv in selector.split(",") if kv)
        labelled = [json.loads(json.dumps(p)) for p in self.pods.values()
                    if want.items() <= (p["metadata"].get("labels") or {}).items()]
        if labelled:
            return labelled
        pods = []
        for obj in self.workloads.values():
            if obj["spec"]["selector"]["matchLabels"] == want:
                pods += [{"metadata": {"name": f"{obj['metadata']['name']}-{i}"}}
                         for i in range(max(obj["spec"]["replicas"], obj["status"]["readyReplicas"]))]
        return pods

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        from provisioner.kubeapi import ApiError

        self._check("get_pod")
        self.calls.append(("get_pod", name))
        if name not in self.pods:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return json.loads(json.dumps(self.pods[name]))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        from provisioner.kubeapi import ApiError

        self._check("delete_pod")
        self.calls.append(("delete_pod", name, uid))
        if name not in self.pods:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if self.pods[name]["metadata"]["uid"] != uid:  # the uid precondition
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        del self.pods[name]

    def list_endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """One EndpointSlice of `service` with an endpoint per pod of `endpoint_ips` (none: no pod
        has an address yet), shaped as the EndpointSlice controller writes them."""
        self._check("list_endpoint_slices")
        self.calls.append(("list_endpoint_slices", service))
        return [{"metadata": {"name": f"{service}-x7k2p", "labels": {"kubernetes.io/service-name": service}},
                 "addressType": "IPv4",
                 "endpoints": [{"addresses": [ip], "hostname": pod, "targetRef": {"kind": "Pod", "name": pod},
                                "conditions": {"ready": True, "serving": True, "terminating": pod in self.terminating}}
                               for pod, ip in self.endpoint_ips.items()]}]

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
