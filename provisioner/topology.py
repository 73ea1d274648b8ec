"""Topology: a switch tree (topology/tree) or blocks (topology/block) from node labels.

Pure. :func:`build_topology` derives it from an :class:`~provisioner.inventory.Inventory` and the
spec's topology rules, then validates it with the same checks Slurm applies (the fatal ones and the
silent ones: a node under no switch gets no jobs at all), so a bad file is never written.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Literal

from .config import ClusterSpec, check_block_sizes
from .errors import Issue, TopologyError
from .inventory import Inventory, sanitize_word

UNLABELED = "unlabeled"
ROOT = "root"


@dataclass(frozen=True)
class Switch:
    name: str
    level: int  # 0 = leaf (holds nodes), as `scontrol show topology` counts
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    plugin: Literal["tree", "block", "flat"]
    switches: tuple[Switch, ...] = ()
    blocks: tuple[Block, ...] = ()
    block_sizes: tuple[int, ...] = ()

    @property
    def slurm_plugin(self) -> str:
        return {"tree": "topology/tree", "block": "topology/block", "flat": "topology/flat"}[self.plugin]


def _name(value: str) -> str:
    return sanitize_word(value) or "_"


def build_topology(spec: ClusterSpec, inventory: Inventory) -> Topology:
    rules = spec.topology
    if rules.plugin == "flat":
        return Topology("flat")
    if rules.plugin == "block":
        topo = _blocks(spec, inventory)
        issues = validate_blocks(topo.blocks, topo.block_sizes, inventory.names)
    else:
        topo = _tree(spec, inventory)
        issues = validate_tree(topo.switches, inventory.names)
    if issues:
        raise TopologyError(issues, title="invalid topology")
    return topo


def _tree(spec: ClusterSpec, inventory: Inventory) -> Topology:
    rules = spec.topology
    levels = rules.levels
    depth = len(levels)
    issues: list[Issue] = []
    unlabeled: list[str] = []
    # per level (0 = top): switch name -> (raw path, parent name, children)
    parent_of: list[dict[str, tuple[str | None, str]]] = [dict() for _ in levels]
    raw_of: list[dict[str, str]] = [dict() for _ in levels]
    leaf_nodes: dict[str, list[str]] = defaultdict(list)

    for node in inventory.nodes:
        labels = node.labels
        values = [labels.get(k) for k in levels]
        if any(v is None or v == "" for v in values):
            if rules.unlabeled == "error":
                missing = [k for k, v in zip(levels, values) if not v]
                issues.append(Issue(f"nodes.{node.k8s_node or node.name}",
                                    f"lacks topology label(s) {', '.join(missing)}",
                                    "label the node, or set topology.unlabeled: group"))
            unlabeled.append(node.name)
            continue
        parent: str | None = None
        path: list[str] = []
        for j, raw in enumerate(values):
            path.append(_name(raw))
            name = "_".join(path) if rules.switch_names == "path" else path[-1]
            key = "/".join(values[: j + 1]) if rules.switch_names == "path" else raw
            seen_raw = raw_of[j].setdefault(name, key)
            if seen_raw != key:
                issues.append(Issue(f"nodes.{node.k8s_node or node.name}",
                                    f"label values {seen_raw!r} and {key!r} of {levels[j]} both become switch {name!r}",
                                    "use label values that differ in letters or digits"))
            known = parent_of[j].get(name)
            if known is None:
                parent_of[j][name] = (parent, node.k8s_node or node.name)
            elif known[0] != parent:
                issues.append(Issue(
                    f"nodes.{node.k8s_node or node.name}",
                    f"label conflict: switch {name!r} ({levels[j]}) is under {known[0]!r} for node {known[1]!r} "
                    f"but under {parent!r} for this node; a switch has one parent in a tree",
                    "fix the nodes' labels, or set topology.switch_names: path if the values repeat per parent",
                ))
            parent = name
        leaf_nodes[parent].append(node.name)  # type: ignore[index]
    if issues:
        raise TopologyError(issues, title="invalid topology labels")

    switches: list[Switch] = []
    for j in range(depth - 1, -1, -1):
        level = depth - 1 - j
        children_of: dict[str, list[str]] = defaultdict(list)
        if j + 1 < depth:
            for child, (par, _) in parent_of[j + 1].items():
                children_of[par].append(child)  # type: ignore[index]
        for name in sorted(parent_of[j]):
            if j == depth - 1:
                switches.append(Switch(name, level, nodes=tuple(leaf_nodes[name])))
            else:
                switches.append(Switch(name, level, switches=tuple(sorted(children_of[name]))))
    tops = sorted(parent_of[0]) if depth else []
    if unlabeled:
        switches.append(Switch(UNLABELED, 0, nodes=tuple(unlabeled)))
        tops.append(UNLABELED)
    if len(tops) > 1:
        top_level = max(s.level for s in switches) + 1
        switches.append(Switch(ROOT, top_level, switches=tuple(tops)))
    return Topology("tree", switches=tuple(switches))


def _blocks(spec: ClusterSpec, inventory: Inventory) -> Topology:
    rules = spec.topology
    key = rules.block_label or ""
    members: dict[str, list[str]] = defaultdict(list)
    raw_of: dict[str, str] = {}
    issues: list[Issue] = []
    for node in inventory.nodes:
        raw = node.labels.get(key)
        if not raw:
            if rules.unlabeled == "error":
                issues.append(Issue(f"nodes.{node.k8s_node or node.name}", f"lacks block label {key}",
                                    "label the node, or set topology.unlabeled: group"))
            members[UNLABELED].append(node.name)
            continue
        name = _name(raw)
        if raw_of.setdefault(name, raw) != raw:
            issues.append(Issue(f"nodes.{node.k8s_node or node.name}",
                                f"label values {raw_of[name]!r} and {raw!r} of {key} both become block {name!r}",
                                "use label values that differ in letters or digits"))
        members[name].append(node.name)
    if UNLABELED in raw_of:
        issues.append(Issue("topology.block_label", f"a block is labelled {UNLABELED!r}, a name slurmk8s reserves "
                            "for nodes without the label", "rename that label value"))
    if issues:
        raise TopologyError(issues, title="invalid topology labels")
    blocks = tuple(Block(name, tuple(nodes)) for name, nodes in sorted(members.items()))
    sizes = rules.block_sizes or ((min(len(b.nodes) for b in blocks),) if blocks else ())
    return Topology("block", blocks=blocks, block_sizes=tuple(sizes))


def validate_tree(switches: Iterable[Switch], node_names: Iterable[str]) -> list[Issue]:
    """Everything slurmctld treats as fatal in a switch tree, plus nodes it would silently starve."""
    switches = list(switches)
    known_nodes = set(node_names)
    issues: list[Issue] = []
    by_name: dict[str, Switch] = {}
    for sw in switches:
        if sw.name in by_name:
            issues.append(Issue(f"topology.switches.{sw.name}", "duplicate switch name",
                                "switch names must be unique across all levels; set topology.switch_names: path"))
        by_name.setdefault(sw.name, sw)
        if not sw.name or any(c in sw.name for c in " ,=[]"):
            issues.append(Issue(f"topology.switches.{sw.name!r}", "switch name is empty or has ' ,=[]'",
                                "use label values made of letters, digits, '_', '.', '-'"))
        if not sw.nodes and not sw.switches:
            issues.append(Issue(f"topology.switches.{sw.name}", "switch has no nodes and no child switches",
                                "remove it; Slurm 24.11 refuses empty switches"))
    holder: dict[str, str] = {}
    for sw in switches:
        for child in sw.switches:
            if child not in by_name:
                issues.append(Issue(f"topology.switches.{sw.name}", f"child switch {child!r} is not defined",
                                    "define it or remove it from Switches="))
        for node in sw.nodes:
            if node not in known_nodes:
                issues.append(Issue(f"topology.switches.{sw.name}", f"node {node!r} is not a Slurm node",
                                    "regenerate topology from the same inventory as slurm.conf"))
            if node in holder and holder[node] != sw.name:
                issues.append(Issue(f"topology.switches.{sw.name}",
                                    f"node {node!r} is also under switch {holder[node]!r}",
                                    "a node sits under exactly one leaf switch"))
            holder.setdefault(node, sw.name)
    # cycles: depth-first walk with colours
    state: dict[str, int] = {}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        state[name] = 1
        for child in by_name[name].switches:
            if child not in by_name:
                continue
            if state.get(child) == 1:
                cycle = " -> ".join(trail[trail.index(child):] + (child,)) if child in trail else child
                issues.append(Issue(f"topology.switches.{name}", f"switch cycle {cycle}",
                                    "a switch may not contain itself, directly or through children"))
            elif state.get(child) is None:
                visit(child, trail + (child,))
        state[name] = 2

    for name in by_name:
        if state.get(name) is None:
            visit(name, (name,))
    if known_nodes and not holder:
        issues.append(Issue("topology", "no switch holds any node", "check topology.levels against the node labels"))
    orphans = sorted(known_nodes - set(holder))
    if orphans:
        issues.append(Issue("topology", f"{len(orphans)} node(s) under no switch would never get a job "
                            f"(e.g. {', '.join(orphans[:3])})", "set topology.unlabeled: group or label them"))
    return issues


def validate_blocks(blocks: Iterable[Block], sizes: tuple[int, ...], node_names: Iterable[str]) -> list[Issue]:
    blocks = list(blocks)
    known = set(node_names)
    issues: list[Issue] = []
    try:
        check_block_sizes(sizes)
    except ValueError as err:
        what, _, fix = str(err).partition("; ")
        issues.append(Issue("topology.block_sizes", what, fix or "use a base, then 2x, 4x, ... of it"))
    names: set[str] = set()
    holder: dict[str, str] = {}
    for b in blocks:
        if b.name in names:
            issues.append(Issue(f"topology.blocks.{b.name}", "duplicate block name", "use distinct label values"))
        names.add(b.name)
        if not b.nodes:
            issues.append(Issue(f"topology.blocks.{b.name}", "block has no nodes", "remove it"))
        for node in b.nodes:
            if node not in known:
                issues.append(Issue(f"topology.blocks.{b.name}", f"node {node!r} is not a Slurm node",
                                    "regenerate topology from the same inventory as slurm.conf"))
            if node in holder:
                issues.append(Issue(f"topology.blocks.{b.name}", f"node {node!r} is also in block {holder[node]!r}",
                                    "a node belongs to exactly one block"))
            holder.setdefault(node, b.name)
    if sizes:
        small = [b for b in blocks if len(b.nodes) < sizes[0]]
        if small:
            smallest = min(len(b.nodes) for b in blocks)
            issues.append(Issue(
                "topology.block_sizes",
                f"block(s) {', '.join(f'{b.name} ({len(b.nodes)} nodes)' for b in small[:5])} are smaller than "
                f"the base block size {sizes[0]}; Slurm 24.11 needs every block to hold at least the base size",
                f"lower block_sizes[0] to at most {smallest}, or add nodes to those blocks",
            ))
        if sizes[-1] > len(known):
            issues.append(Issue("topology.block_sizes",
                                f"largest block size {sizes[-1]} exceeds the {len(known)} nodes of the cluster",
                                "drop the sizes larger than the node count"))
    orphans = sorted(known - set(holder))
    if orphans:
        issues.append(Issue("topology", f"{len(orphans)} node(s) in no block would never get a job "
                            f"(e.g. {', '.join(orphans[:3])})", "set topology.unlabeled: group or label them"))
    return issues
