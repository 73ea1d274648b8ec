"""Topology: a switch tree (topology/tree) or blocks (topology/block) from node labels.

Pure. :func:`build_topology` derives it from an :class:`~provisioner.inventory.Inventory` and the
spec's topology rules, then validates it with the same checks Slurm applies (the fatal ones and the
silent ones: a node under no switch gets no jobs at all), so a bad file is never written.

A rule may name two label schemes, a current one and an older one (Topograph 1.0's tiers and
accelerator domain, and the labels it wrote before): each node is placed by the first it carries
completely. After an upgrade the older labels stay on the nodes, stale, so a node carrying both
is placed by the current ones, and the topology's ``notices`` say so (the renders print them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from .config import ClusterSpec, check_block_sizes
from .config import Topology as Rules  # the spec's rules; Topology here is the result
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
    # worth saying at render time, never fatal: printed by `slurmk8s render`, logged by the Pulumi
    # program and by the slurmctld container as it renders at start
    notices: tuple[Issue, ...] = ()

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


Hops = tuple[tuple[str, str], ...]  # a node's switches from the top down, as (label key, value)


@dataclass(frozen=True)
class _Placement:
    hops: Hops
    fallback: bool  # placed by the older scheme (``levels`` under ``tier_prefix``)


def _tier_hops(rules: Rules, labels: Mapping[str, str]) -> tuple[Hops, list[str]]:
    """The node's tier labels, highest tier (its top) first, and the tier keys missing below that
    top: tiers count from the node up, so a gap would hang a switch from the wrong parent."""
    tiers: dict[int, tuple[str, str]] = {}
    for key, value in labels.items():
        n = rules.tier_number(key)
        if n is not None and value:
            tiers[n] = (key, value)
    if not tiers:
        return (), [f"{rules.tier_prefix}N"]
    missing = [f"{rules.tier_prefix}{n}" for n in range(max(tiers)) if n not in tiers]
    return tuple(tiers[n] for n in sorted(tiers, reverse=True)), missing


def _level_hops(levels: tuple[str, ...], labels: Mapping[str, str]) -> tuple[Hops, list[str]]:
    return tuple((k, labels[k]) for k in levels if labels.get(k)), [k for k in levels if not labels.get(k)]


def _place(rules: Rules, labels: Mapping[str, str]) -> tuple[_Placement | None, str]:
    """The node's switches by the first scheme it carries completely (the tiers, then ``levels``);
    else None and what it lacks, per scheme."""
    schemes: list[tuple[Hops, list[str]]] = []
    if rules.tier_prefix:
        schemes.append(_tier_hops(rules, labels))
    if rules.levels:
        schemes.append(_level_hops(rules.levels, labels))
    for i, (hops, missing) in enumerate(schemes):
        if hops and not missing:
            return _Placement(hops, fallback=i > 0), ""
    return None, " or ".join(", ".join(missing) for _, missing in schemes)


def _keys_text(keys: Iterable[str]) -> str:
    """Label keys for a message: ``net/{a,b}`` when they share a prefix."""
    keys = list(keys)
    prefixes = {k.rpartition("/")[0] for k in keys}
    if len(keys) > 1 and len(prefixes) == 1 and "" not in prefixes:
        return f"{prefixes.pop()}/{{{','.join(k.rpartition('/')[2] for k in keys)}}}"
    return ", ".join(keys)


def _few(names: list[str]) -> str:
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"{len(names)} node(s) ({', '.join(names[:5])}{more})"


def _scheme_notices(current: str, older: tuple[str, ...], both: list[str], older_only: list[str],
                    current_count: int, one_scheme: str) -> tuple[Issue, ...]:
    """What to say when nodes carry two label schemes: the ones carrying both (placed by the
    current one, the older labels being stale) and, while a relabelling is half done, the ones
    still placed by the older labels."""
    out: list[Issue] = []
    old = _keys_text(older)
    if both:
        out.append(Issue("topology", f"{_few(both)} carry both {current} and the older {old} labels; placed by "
                         f"{current}, the older ones are ignored (stale, left by an upgrade such as Topograph 1.0's)",
                         f"remove them: kubectl label node NAME {' '.join(k + '-' for k in older)}"))
    if older_only and current_count:
        out.append(Issue("topology", f"{_few(older_only)} carry only the older {old} labels and are placed by "
                         f"those, the other {current_count} node(s) by {current}",
                         f"relabel them (Topograph 1.0 does once it runs there), or read one scheme only "
                         f"(preset {one_scheme})"))
    return tuple(out)


_Step = tuple[str, int, str, str]  # a switch on a node's path: label key, level, switch name, identity


def _steps(rules: Rules, hops: Hops) -> tuple[_Step, ...]:
    """The switches of a placement, from the top: the label key, the level (0 = leaf), the
    switch's name and what identifies it (the raw value, or the raw path with switch_names: path)."""
    out: list[_Step] = []
    path: list[str] = []
    for j, (key, raw) in enumerate(hops):
        path.append(_name(raw))
        name = "_".join(path) if rules.switch_names == "path" else path[-1]
        ident = "/".join(v for _, v in hops[: j + 1]) if rules.switch_names == "path" else raw
        out.append((key, len(hops) - 1 - j, name, ident))
    return tuple(out)


def _tree(spec: ClusterSpec, inventory: Inventory) -> Topology:
    rules = spec.topology
    issues: list[Issue] = []
    unlabeled: list[str] = []
    both: list[str] = []
    older_only: list[str] = []
    current_count = 0
    # per level (0 = leaf, as Switch.level): switch name -> (parent name, a node under it)
    parent_of: dict[int, dict[str, tuple[str | None, str]]] = defaultdict(dict)
    raw_of: dict[int, dict[str, str]] = defaultdict(dict)
    leaf_nodes: dict[str, list[str]] = defaultdict(list)

    # a node's topology labels -> its placement, what it lacks, whether it carries `levels` labels,
    # and its switches from the top (_steps): worked out once per distinct set of labels (the nodes
    # under one leaf share theirs)
    placed: dict[tuple[tuple[str, str], ...], tuple[_Placement | None, str, bool, tuple[_Step, ...]]] = {}
    for node in inventory.nodes:
        who = node.k8s_node or node.name
        memo = placed.get(node.topology_labels)
        if memo is None:
            labels = node.labels
            placement, missing = _place(rules, labels)
            memo = placed[node.topology_labels] = (
                placement, missing, any(labels.get(k) for k in rules.levels),
                _steps(rules, placement.hops) if placement is not None else ())
        placement, missing, carries_levels, steps = memo
        if placement is None:
            if rules.unlabeled == "error":
                issues.append(Issue(f"nodes.{who}", f"lacks topology label(s) {missing}",
                                    "label the node, or set topology.unlabeled: group"))
            unlabeled.append(node.name)
            continue
        if placement.fallback:
            older_only.append(who)
        elif rules.tier_prefix:
            current_count += 1
            if carries_levels:
                both.append(who)
        parent: str | None = None
        for key, level, name, ident in steps:
            seen_raw = raw_of[level].setdefault(name, ident)
            if seen_raw != ident:
                issues.append(Issue(f"nodes.{who}",
                                    f"label values {seen_raw!r} and {ident!r} of {key} both become switch {name!r}",
                                    "use label values that differ in letters or digits"))
            known = parent_of[level].get(name)
            if known is None:
                parent_of[level][name] = (parent, who)
            elif known[0] != parent:
                issues.append(Issue(
                    f"nodes.{who}",
                    f"label conflict: switch {name!r} ({key}) is under {_under(known[0])} for node {known[1]!r} "
                    f"but under {_under(parent)} for this node; a switch has one parent in a tree",
                    "fix the nodes' labels, or set topology.switch_names: path if the values repeat per parent",
                ))
            parent = name
        leaf_nodes[steps[-1][2]].append(node.name)  # its leaf switch: the last step's (a placement has one or more)
    if issues:
        raise TopologyError(issues, title="invalid topology labels")

    children_of: dict[tuple[int, str], list[str]] = defaultdict(list)
    for level, members in parent_of.items():
        for child, (par, _) in members.items():
            if par is not None:
                children_of[(level + 1, par)].append(child)
    switches: list[Switch] = []
    for level in sorted(parent_of):
        for name in sorted(parent_of[level]):
            if level == 0:
                switches.append(Switch(name, 0, nodes=tuple(leaf_nodes[name])))
            else:
                switches.append(Switch(name, level, switches=tuple(sorted(children_of[(level, name)]))))
    # nodes may carry different numbers of tiers: a top is any switch without a parent
    tops = sorted(name for members in parent_of.values() for name, (par, _) in members.items() if par is None)
    if unlabeled:
        switches.append(Switch(UNLABELED, 0, nodes=tuple(unlabeled)))
        tops.append(UNLABELED)
    if len(tops) > 1:
        top_level = max(s.level for s in switches) + 1
        switches.append(Switch(ROOT, top_level, switches=tuple(tops)))
    notices = _scheme_notices(f"{rules.tier_prefix}N", rules.levels, both, older_only, current_count,
                              "topograph-fabric or topograph-legacy") if rules.tier_prefix and rules.levels else ()
    return Topology("tree", switches=tuple(switches), notices=notices)


def _under(parent: str | None) -> str:
    return repr(parent) if parent is not None else "no switch (a top)"


def _blocks(spec: ClusterSpec, inventory: Inventory) -> Topology:
    rules = spec.topology
    keys = [k for k in (rules.block_label, rules.fallback_block_label) if k]
    members: dict[str, list[str]] = defaultdict(list)
    raw_of: dict[str, str] = {}
    issues: list[Issue] = []
    both: list[str] = []
    older_only: list[str] = []
    current_count = 0
    for node in inventory.nodes:
        who = node.k8s_node or node.name
        labels = node.labels
        key = next((k for k in keys if labels.get(k)), None)
        if key is None:
            if rules.unlabeled == "error":
                issues.append(Issue(f"nodes.{who}", f"lacks block label {' or '.join(keys)}",
                                    "label the node, or set topology.unlabeled: group"))
            members[UNLABELED].append(node.name)
            continue
        if rules.fallback_block_label:
            if key == rules.fallback_block_label:
                older_only.append(who)
            else:
                current_count += 1
                if labels.get(rules.fallback_block_label):
                    both.append(who)
        raw = labels[key]
        name = _name(raw)
        if raw_of.setdefault(name, raw) != raw:
            issues.append(Issue(f"nodes.{who}",
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
    notices = _scheme_notices(rules.block_label or "", (rules.fallback_block_label,), both, older_only, current_count,
                              "topograph-accelerator or topograph-legacy-nvlink") if rules.fallback_block_label else ()
    return Topology("block", blocks=blocks, block_sizes=tuple(sizes), notices=notices)


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
