"""Keep Slurm's drain state in line with the Kubernetes nodes behind pinned Slurm nodes.

A cordoned or NotReady Kubernetes node keeps its Slurm node (stable names and topology) but must
not take jobs: the inventory marks it ``unavailable`` with a reason, and this module drains it in
Slurm. (slurm.conf's DownNodes cannot do it: slurmctld 24.11 drops a DownNodes node whose name does
not resolve, which a powered-down CLOUD node's never does.) A node slurmk8s drained that is
available again is returned to service; drains set by people or health checks are never touched.

Runs in the slurmctld pod at start (entrypoint) and after every reconfigure: `slurmk8s-sync-nodes`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import hostlist

from .inventory import Inventory
from .logs import Log
from .slurm.commands import Scontrol, SlurmCommandError

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


def plan(inventory: Inventory, slurm_nodes: Iterable[Mapping[str, Any]]) -> list[Action]:
    """Pure: inventory + `scontrol show nodes --json` nodes -> drains / undrains to apply."""
    current = {n["name"]: n for n in slurm_nodes}
    drains: dict[str, list[str]] = {}
    undrain: list[str] = []
    for node in inventory.nodes:
        seen = current.get(node.name)
        if seen is None:
            continue
        states = set(seen.get("state") or ())
        reason = seen.get("reason") or ""
        drained = "DRAIN" in states
        if node.unavailable:
            if not (drained and reason == node.unavailable):
                drains.setdefault(node.unavailable, []).append(node.name)
        elif drained and reason.startswith(OUR_PREFIX):
            undrain.append(node.name)
    actions = [Action(tuple(names), "DRAIN", reason) for reason, names in sorted(drains.items())]
    if undrain:
        actions.append(Action(tuple(undrain), "UNDRAIN", "available again"))
    return actions


def main(argv: Sequence[str] | None = None) -> int:
    """slurmk8s-sync-nodes [--wait SECONDS]: wait for slurmctld, then apply the plan."""
    args = list(sys.argv[1:] if argv is None else argv)
    wait = float(args[args.index("--wait") + 1]) if "--wait" in args else 0.0
    path = os.environ.get("SLURMK8S_INVENTORY", "/etc/slurm/inventory.json")
    log = Log("slurmk8s-sync-nodes", stream=sys.stderr).write
    try:
        inventory = Inventory.read(path)
    except (OSError, ValueError, KeyError) as err:
        log(f"cannot read the inventory {path}: {err}")
        return 1
    scontrol = Scontrol(timeout=20.0)
    deadline = time.monotonic() + wait
    while True:
        try:
            nodes = json.loads(scontrol.run([scontrol.scontrol, "show", "nodes", "--json"]))["nodes"]
            break
        except (SlurmCommandError, ValueError, KeyError) as err:
            if time.monotonic() >= deadline:
                log(f"slurmctld not answering: {err}")
                return 1
            time.sleep(1.0)
    status = 0
    for action in plan(inventory, nodes):
        try:
            scontrol.run(action.argv(scontrol.scontrol))
            log(f"{action.state} {','.join(action.names)}: {action.reason}")
        except SlurmCommandError as err:
            log(str(err))
            status = 1
    return status
