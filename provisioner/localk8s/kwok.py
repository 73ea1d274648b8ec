"""Fake (kwok-managed) Nodes: pure manifest building and argument parsing, no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import SlurmK8sError

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_TAINT_KEY = KWOK_ANNOTATION

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
_NODE_NAME = re.compile(rf"^{_DNS_SUBDOMAIN}$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


class KwokNodeError(SlurmK8sError, ValueError):
    """Invalid fake-node specification (the message says which part)."""


@dataclass(frozen=True)
class KwokNodeSpec:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    taint: bool = True
    arch: str = "amd64"


def parse_key_values(items: Sequence[str], what: str) -> dict[str, str]:
    """Parse ``["k=v", ...]`` (as given on the command line) into a dict; ``k=`` means empty."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KwokNodeError(f"{what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def validate_labels(labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if not _LABEL_KEY.match(key) or len(name) > 63 or len(prefix) > 253:
            raise KwokNodeError(f"label key {key!r} is not a valid Kubernetes label key")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise KwokNodeError(f"label value {value!r} (key {key!r}) is not a valid Kubernetes label value")


def validate_capacity(capacity: Mapping[str, str]) -> None:
    for resource, quantity in capacity.items():
        if not _LABEL_KEY.match(resource):
            raise KwokNodeError(f"resource name {resource!r} is not valid")
        if not _QUANTITY.match(quantity):
            raise KwokNodeError(f"quantity {quantity!r} for {resource} is not a Kubernetes quantity (e.g. 32, 500m, 256Gi)")


def node_names(base: str, count: int) -> list[str]:
    """``base`` for one node, ``base-0 .. base-(count-1)`` for several."""
    if count < 1:
        raise KwokNodeError(f"count must be >= 1, got {count}")
    names = [base] if count == 1 else [f"{base}-{i}" for i in range(count)]
    for name in names:
        if len(name) > 253 or not _NODE_NAME.match(name):
            raise KwokNodeError(f"node name {name!r} is not a valid DNS subdomain (lowercase, digits, '-', '.')")
    return names


def kwok_node_manifest(spec: KwokNodeSpec) -> dict:
    """The Node object for a fake node that the kwok controller of the local cluster manages.

    The annotation is what the controller selects on. The default NoSchedule taint keeps real
    workloads off the fake node; pods meant for it tolerate ``kwok.x-k8s.io/node=fake``.
    """
    validate_labels(spec.labels)
    validate_capacity(spec.capacity)
    node_names(spec.name, 1)
    labels = {
        "kubernetes.io/arch": spec.arch,
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": spec.name,
        "type": "kwok",
        **dict(spec.labels),
    }
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", **dict(spec.capacity)}
    node: dict = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": dict(sorted(labels.items())),
        },
        "spec": {},
        "status": {
            "allocatable": dict(sorted(capacity.items())),
            "capacity": dict(sorted(capacity.items())),
        },
    }
    if spec.taint:
        node["spec"]["taints"] = [{"key": KWOK_TAINT_KEY, "value": KWOK_ANNOTATION_VALUE, "effect": "NoSchedule"}]
    return node


def kwok_node_list(specs: Sequence[KwokNodeSpec]) -> dict:
    """A v1 List of fake nodes, for one ``kubectl apply -f -``."""
    return {"apiVersion": "v1", "kind": "List", "items": [kwok_node_manifest(s) for s in specs]}
