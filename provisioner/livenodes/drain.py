"""Keep Slurm's drain state in line with the Kubernetes nodes behind pinned Slurm nodes.

A cordoned or NotReady Kubernetes node keeps its Slurm node (stable names and topology) but must
not take jobs: the inventory marks it ``unavailable`` with a reason, and this module drains it in
Slurm. (slurm.conf's DownNodes cannot do it: slurmctld 24.11 drops a DownNodes node whose name does
not resolve, which a powered-down CLOUD node's never does.) A node slurmk8s drained that is
available again is returned to service; drains set by people or health checks are never touched,
not even on a node that is cordoned meanwhile: their reason is kept, and the uncordon leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import hostlist

from ..inventory import Inventory
from ..slurm.state import NodeStatus

OUR_PREFIX = "kubernetes node "  # every reason slurmk8s sets here starts with it


@dataclass(frozen=True)
class Action:
    names: tuple[str, ...]
    state: str  # DRAIN | UNDRAIN
    reason: str

    def argv(self, scontrol: str = "scontrol") -> list[str]:
        argv = [scontrol, "update", f"nodename={hostlist.collect_hostlist(list(self.names))}", f"state={self.state}"]
        if self.state == "DRAIN":
            argv.append(f"reason={self.reason}")
        return argv

    def describe(self) -> str:
        return f"{self.state} {','.join(self.names)}: {self.reason}"


def plan(inventory: Inventory, slurm_nodes: Iterable[NodeStatus]) -> list[Action]:
    """Pure: inventory + Slurm's nodes -> drains / undrains to apply."""
    current = {n.name: n for n in slurm_nodes}
    drains: dict[str, list[str]] = {}
    undrain: list[str] = []
    for node in inventory.nodes:
        seen = current.get(node.name)
        if seen is None:
            continue
        drained = "DRAIN" in seen.state
        ours = drained and seen.reason.startswith(OUR_PREFIX)
        if drained and not ours:
            continue  # a health check's or an operator's drain: its reason stays, and so does the drain
        if node.unavailable:
            if not (drained and seen.reason == node.unavailable):
                drains.setdefault(node.unavailable, []).append(node.name)
        elif ours:
            undrain.append(node.name)
    actions = [Action(tuple(names), "DRAIN", reason) for reason, names in sorted(drains.items())]
    if undrain:
        actions.append(Action(tuple(undrain), "UNDRAIN", "available again"))
    return actions
