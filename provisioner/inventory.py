"""Inventory: which Slurm nodes exist, derived from Kubernetes Nodes and the pools of a spec.

Pure: takes Node objects as the API returns them (``kubectl get nodes -o json`` items) and a
:class:`~provisioner.config.ClusterSpec`, returns a frozen :class:`Inventory`. Deterministic: the
same input gives the same nodes in the same order, whatever the order of the API's list.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from . import settings
from .config import ClusterSpec, Pool, mib, parse_quantity
from .errors import Issue, InventoryError

MAX_NODE_NAME = 63  # the worker pod's hostname is the Slurm node name: one DNS label
# On the reconcile loop's own copy of a Node that left a pinned pool while its Slurm node still runs
# a job (provisioner.livenodes): why; the Slurm node stays, unavailable, until the job ends.
LEAVING_ANNOTATION = "slurmk8s.io/leaving"
# The taints Kubernetes itself sets and clears with a node's state (node.kubernetes.io/unschedulable,
# not-ready, unreachable, memory-pressure, disk-pressure, pid-pressure, network-unavailable, ...).
KUBERNETES_TAINTS = ("node.kubernetes.io/",)


_NOT_NAME = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")
_NOT_WORD = re.compile(r"[^A-Za-z0-9_.-]+")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def sanitize_name(raw: str) -> str:
    """A Kubernetes name -> a Slurm node name / DNS label: lowercase, [a-z0-9-], no '.'."""
    return _DASHES.sub("-", _NOT_NAME.sub("-", raw.lower())).strip("-")


def sanitize_word(raw: str) -> str:
    """A label value -> a Slurm feature / GRES type / switch name: [A-Za-z0-9_.-]."""
    return _NOT_WORD.sub("_", raw).strip("_.-")


def gpu_type_from(raw: str) -> str:
    return _NOT_ALNUM.sub("_", raw.lower()).strip("_")


@dataclass(frozen=True)
class K8sNode:
    """The parts of a Kubernetes Node that slurmk8s uses."""

    name: str
    labels: Mapping[str, str]
    cpu_milli: int
    memory_bytes: int
    extended: Mapping[str, int]
    unschedulable: bool
    ready: bool
    taints: tuple[Mapping[str, str], ...]
    leaving: str | None = None  # LEAVING_ANNOTATION

    @classmethod
    def from_api(cls, obj: Mapping[str, Any], index: int = 0) -> "K8sNode":
        where = f"nodes[{index}]"
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name or not isinstance(name, str):
            raise InventoryError.one(f"{where}.metadata.name", "missing node name",
                                     "pass Node objects as `kubectl get nodes -o json` prints them")
        status = obj.get("status") or {}
        alloc = status.get("allocatable") or status.get("capacity") or {}
        try:
            cpu = int(round(parse_quantity(alloc.get("cpu", 0)) * 1000))
            memory = int(parse_quantity(alloc.get("memory", 0)))
            extended = {k: int(parse_quantity(v)) for k, v in alloc.items() if "/" in k}
        except ValueError as err:
            raise InventoryError.one(f"{where} ({name}).status.allocatable", str(err),
                                     "pass Node objects as the API returns them") from None
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        spec = obj.get("spec") or {}
        return cls(
            name=name,
            labels=dict(meta.get("labels") or {}),
            cpu_milli=cpu,
            memory_bytes=memory,
            extended=extended,
            unschedulable=bool(spec.get("unschedulable")),
            ready=ready,
            taints=tuple(dict(t) for t in spec.get("taints") or ()),
            leaving=(meta.get("annotations") or {}).get(LEAVING_ANNOTATION),
        )


@dataclass(frozen=True)
class SlurmNode:
    name: str
    pool: str
    partition: str
    cpus: int
    real_memory: int  # MiB
    gpus: int = 0
    gpu_type: str | None = None
    features: tuple[str, ...] = ()
    weight: int = 1
    k8s_node: str | None = None  # pinned pools: the Kubernetes node the pod must run on
    domain: str | None = None  # slot pools: the value of the pool's domain label
    topology_labels: tuple[tuple[str, str], ...] = ()
    unavailable: str | None = None  # why the node must not take jobs now (drained in Slurm)

    @property
    def gres_env(self) -> dict[str, str]:
        """What the node's worker entrypoint needs to write the node's gres.conf line from the GPU
        device files its pod has: the count and type slurm.conf declares. Empty without GPUs."""
        if not self.gpus:
            return {}
        env = {settings.GPUS: str(self.gpus)}
        if self.gpu_type:
            env[settings.GPU_TYPE] = self.gpu_type
        return env

    @property
    def gres(self) -> str | None:
        if not self.gpus:
            return None
        return f"gpu:{self.gpu_type}:{self.gpus}" if self.gpu_type else f"gpu:{self.gpus}"

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.topology_labels)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "pool": self.pool, "partition": self.partition, "cpus": self.cpus,
            "real_memory": self.real_memory, "gpus": self.gpus, "gpu_type": self.gpu_type,
            "features": list(self.features), "weight": self.weight, "k8s_node": self.k8s_node,
            "domain": self.domain, "topology_labels": dict(self.topology_labels),
            "unavailable": self.unavailable,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SlurmNode":
        return cls(
            name=d["name"], pool=d["pool"], partition=d["partition"], cpus=d["cpus"],
            real_memory=d["real_memory"], gpus=d.get("gpus", 0), gpu_type=d.get("gpu_type"),
            features=tuple(d.get("features", ())), weight=d.get("weight", 1), k8s_node=d.get("k8s_node"),
            domain=d.get("domain"), topology_labels=tuple(sorted((d.get("topology_labels") or {}).items())),
            unavailable=d.get("unavailable"),
        )


@dataclass(frozen=True)
class Excluded:
    k8s_node: str
    pool: str
    reason: str


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[SlurmNode, ...]
    excluded: tuple[Excluded, ...] = ()
    _index: Mapping[str, SlurmNode] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {n.name: n for n in self.nodes})

    def __getitem__(self, name: str) -> SlurmNode:
        return self._index[name]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def in_pool(self, pool: str) -> list[SlurmNode]:
        return [n for n in self.nodes if n.pool == pool]

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [n.to_json() for n in self.nodes],
            "excluded": [{"k8s_node": e.k8s_node, "pool": e.pool, "reason": e.reason} for e in self.excluded],
        }

    @classmethod
    def read(cls, path: str) -> "Inventory":
        """The inventory written with the config: ``path``, or ``path.gz`` beside it (the Pulumi
        program's ConfigMap carries it gzipped)."""
        import gzip
        import json
        import os

        if not os.path.exists(path) and os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rt") as fh:
                return cls.from_json(json.load(fh))
        with open(path) as fh:
            return cls.from_json(json.load(fh))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Inventory":
        return cls(
            nodes=tuple(SlurmNode.from_json(n) for n in d.get("nodes", ())),
            excluded=tuple(Excluded(**e) for e in d.get("excluded", ())),
        )


def nodes_from_api(obj: Any) -> list[K8sNode]:
    """Accept a NodeList (``{"items": [...]}``) or a plain list of Node objects."""
    items = obj.get("items") if isinstance(obj, Mapping) else obj
    if not isinstance(items, list):
        raise InventoryError.one("nodes", "expected a NodeList ({'items': [...]}) or a list of Node objects",
                                 "pass the output of `kubectl get nodes -o json`")
    return [K8sNode.from_api(item, i) for i, item in enumerate(items)]


def _tolerated(taint: Mapping[str, str], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and not tol.get("key"):
            return True
        if tol.get("key") != taint.get("key"):
            continue
        if tol.get("operator") == "Exists" or tol.get("value") == taint.get("value"):
            return True
    return False


def _topology_labels(spec: ClusterSpec, pool: Pool, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The node's labels the topology and the pool's domain read (tier labels are any number, so
    they are picked by name, not looked up)."""
    return tuple(sorted((k, v) for k, v in labels.items()
                        if spec.topology.uses_label(k) or k == pool.domain_label))


def _pinned(spec: ClusterSpec, index: int, pool: Pool, members: list[K8sNode]) -> tuple[list[SlurmNode], list[Excluded]]:
    nodes: list[SlurmNode] = []
    excluded: list[Excluded] = []
    reserve_milli = int(round(parse_quantity(pool.reserve_cpu) * 1000))
    reserve_mib = mib(pool.reserve_memory)
    min_mib = mib(pool.min_memory)
    for k8s in sorted(members, key=lambda n: n.name):
        untolerated = [t for t in k8s.taints if t.get("effect") in ("NoSchedule", "NoExecute")
                       and not _tolerated(t, pool.tolerations)]
        # Kubernetes' own taints (cordon, not-ready, unreachable, memory-pressure, ...) and the
        # interruption notices (spec.elasticity.interruption_taints: the node is about to go) say the
        # node is unavailable for now: its Slurm node keeps its place and is drained; any other taint
        # the pool does not tolerate keeps the node out of the pool
        notices = spec.elasticity.interruption_taints
        transient = [t for t in untolerated if str(t.get("key", "")).startswith(KUBERNETES_TAINTS)
                     or t.get("key") in notices]
        blocking = [t for t in untolerated if t not in transient]
        if blocking:
            t = blocking[0]
            excluded.append(Excluded(k8s.name, pool.name,
                                     f"taint {t.get('key')}={t.get('value', '')}:{t.get('effect')} is not tolerated"))
            continue
        cpus = math.floor((k8s.cpu_milli - reserve_milli) / 1000)
        memory = k8s.memory_bytes // 2**20 - reserve_mib
        if cpus < pool.min_cpus or memory < min_mib:
            excluded.append(Excluded(k8s.name, pool.name,
                                     f"too small after the reserve: {max(cpus, 0)} CPUs, {max(memory, 0)} MiB "
                                     f"(pool minimum {pool.min_cpus} CPUs, {min_mib} MiB)"))
            continue
        if pool.max_nodes is not None and len(nodes) >= pool.max_nodes:
            excluded.append(Excluded(k8s.name, pool.name, f"pool max_nodes={pool.max_nodes} reached"))
            continue
        base = k8s.name.split(".", 1)[0] if pool.name_from == "short" else k8s.name
        gpus = k8s.extended.get(pool.gpu_resource, 0)
        gpu_label = k8s.labels.get(pool.gpu_type_label)
        features = list(pool.features) + [pool.name]
        for key in pool.feature_labels:
            value = k8s.labels.get(key)
            if value and sanitize_word(value):
                features.append(sanitize_word(value))
        unavailable = None
        if k8s.leaving:
            unavailable = f"kubernetes node {k8s.name} {k8s.leaving}"
        elif k8s.unschedulable:
            unavailable = f"kubernetes node {k8s.name} is cordoned"
        elif not k8s.ready:
            unavailable = f"kubernetes node {k8s.name} is NotReady"
        elif transient:
            t = transient[0]
            what = "interruption notice" if t.get("key") in notices else "taint"
            unavailable = f"kubernetes node {k8s.name} has {what} {t.get('key')}:{t.get('effect')}"
        nodes.append(SlurmNode(
            name=pool.node_prefix + sanitize_name(base),
            pool=pool.name,
            partition=pool.partition_name,
            cpus=cpus,
            real_memory=memory,
            gpus=gpus,
            gpu_type=gpu_type_from(gpu_label) if gpus and gpu_label else None,
            features=tuple(dict.fromkeys(features)),
            weight=pool.weight,
            k8s_node=k8s.name,
            topology_labels=_topology_labels(spec, pool, k8s.labels),
            unavailable=unavailable,
        ))
    return nodes, excluded


def _slots(pool: Pool) -> list[SlurmNode]:
    nodes: list[SlurmNode] = []
    qualify = len(pool.domains) > 1 or pool.domain_label is not None
    for domain in pool.domains:
        stem = pool.node_prefix + (f"{sanitize_name(domain.name)}-" if qualify else "")
        for i in range(domain.count):
            nodes.append(SlurmNode(
                name=f"{stem}{i}",
                pool=pool.name,
                partition=pool.partition_name,
                cpus=pool.cpus or 1,
                real_memory=mib(pool.memory),
                gpus=pool.gpus,
                gpu_type=gpu_type_from(pool.gpu_type) if pool.gpu_type else None,
                features=tuple(dict.fromkeys(list(pool.features) + [pool.name])),
                weight=pool.weight,
                domain=domain.name,
                topology_labels=((pool.domain_label, domain.name),) if pool.domain_label else (),
            ))
    return nodes


def build_inventory(spec: ClusterSpec, k8s_nodes: Iterable[K8sNode]) -> Inventory:
    """Compute the Slurm nodes; raise :class:`InventoryError` listing every problem found."""
    k8s_nodes = list(k8s_nodes)
    issues: list[Issue] = []
    seen_k8s: dict[str, int] = {}
    for i, n in enumerate(k8s_nodes):
        if n.name in seen_k8s:
            issues.append(Issue(f"nodes[{i}]", f"Kubernetes node {n.name!r} appears twice in the node list",
                                "pass each Node once"))
        seen_k8s.setdefault(n.name, i)

    owner: dict[str, int] = {}
    members: dict[int, list[K8sNode]] = {i: [] for i, p in enumerate(spec.pools) if p.mode == "pinned"}
    for k8s in k8s_nodes:
        for i, pool in enumerate(spec.pools):
            if pool.mode != "pinned":
                continue
            if pool.selects(k8s.labels):
                if k8s.name in owner:
                    j = owner[k8s.name]
                    issues.append(Issue(
                        f"pools[{i}].node_selector",
                        f"Kubernetes node {k8s.name!r} matches both pool {spec.pools[j].name!r} and pool "
                        f"{pool.name!r}",
                        "make the pools' node_selectors disjoint (a node can back only one Slurm node)",
                    ))
                    continue
                owner[k8s.name] = i
                members[i].append(k8s)

    nodes: list[SlurmNode] = []
    excluded: list[Excluded] = []
    for i, pool in enumerate(spec.pools):
        if pool.mode == "slots":
            pool_nodes = _slots(pool)
        else:
            pool_nodes, pool_excluded = _pinned(spec, i, pool, members[i])
            excluded += pool_excluded
            if not pool_nodes:
                why = "; ".join(f"{e.k8s_node}: {e.reason}" for e in pool_excluded[:5])
                issues.append(Issue(
                    f"pools[{i}].node_selector",
                    f"pool {pool.name!r} has no usable Kubernetes node"
                    + (f" ({why})" if why else f" (no node has labels {pool.node_selector})"),
                    "check node_selector against `kubectl get nodes --show-labels`, or use mode: slots for "
                    "node groups that scale from zero",
                ))
        nodes += pool_nodes

    by_name: dict[str, SlurmNode] = {}
    for node in nodes:
        pool_index = next(i for i, p in enumerate(spec.pools) if p.name == node.pool)
        where = f"pools[{pool_index}]"
        if not node.name or len(node.name) > MAX_NODE_NAME:
            issues.append(Issue(
                f"{where}.name_prefix",
                f"Slurm node name {node.name!r} (from {node.k8s_node or node.domain!r}) is "
                f"{len(node.name)} characters; a worker pod's hostname allows {MAX_NODE_NAME}",
                "shorten name_prefix, or use name_from: short to drop the node's domain suffix",
            ))
        other = by_name.get(node.name)
        if other is not None:
            issues.append(Issue(
                f"{where}.name_from",
                f"Kubernetes nodes {other.k8s_node or other.domain!r} and {node.k8s_node or node.domain!r} both "
                f"become Slurm node {node.name!r}",
                "use name_from: full, or give the pools distinct name_prefix values",
            ))
        by_name.setdefault(node.name, node)
    if issues:
        raise InventoryError(issues, title="cannot build the Slurm inventory")
    return Inventory(nodes=tuple(nodes), excluded=tuple(excluded))
