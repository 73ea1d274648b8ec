"""Builders for Kubernetes Node objects as the API returns them (used by tests and bench)."""

from __future__ import annotations

from typing import Any


def node(
    name: str,
    labels: dict[str, str] | None = None,
    cpu: str = "8",
    memory: str = "32Gi",
    gpus: int = 0,
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {},
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    if taints:
        obj["spec"]["taints"] = taints
    return obj


def node_list(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": nodes}


AWS = "topology.k8s.aws/network-node-layer-"


def aws_fleet(spines: int, leaves_per_spine: int, nodes_per_leaf: int, *, pool_label: str = "gpu",
              gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3", prefix: str = "ip-10-0") -> list[dict[str, Any]]:
    """A 3-level AWS-labelled fleet: one layer-1 network node, `spines` layer-2, leaves layer-3."""
    out = []
    n = 0
    for s in range(spines):
        for leaf in range(leaves_per_spine):
            for _ in range(nodes_per_leaf):
                out.append(node(
                    f"{prefix}-{n // 256}-{n % 256}.ec2.internal",
                    {f"{AWS}1": "nn-top", f"{AWS}2": f"nn-spine{s}", f"{AWS}3": f"nn-leaf{s}-{leaf}",
                     "pool": pool_label, "nvidia.com/gpu.product": product,
                     "node.kubernetes.io/instance-type": "p5.48xlarge"},
                    cpu="191450m", memory="2000Gi", gpus=gpus,
                ))
                n += 1
    return out
