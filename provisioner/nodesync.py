"""``slurmk8s-sync-nodes``: drain the Slurm nodes whose Kubernetes node must not take jobs, once.

Runs in the slurmctld pod at start (entrypoint), so a cordoned node is drained before the reconcile
loop's first pass; the loop then keeps the drains current every pass. The plan is
:func:`provisioner.livenodes.drain.plan`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence

from .inventory import Inventory
from .livenodes.drain import plan
from .logs import Log
from .settings import SlurmctldStart
from .slurm.commands import Scontrol, SlurmCommandError
from .slurm.state import NodeStatus

def main(argv: Sequence[str] | None = None) -> int:
    """slurmk8s-sync-nodes [--wait SECONDS]: wait for slurmctld, then apply the plan."""
    args = list(sys.argv[1:] if argv is None else argv)
    wait = float(args[args.index("--wait") + 1]) if "--wait" in args else 0.0
    path = SlurmctldStart.from_env(os.environ).inventory
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
            nodes = [NodeStatus.from_json(n) for n in
                     json.loads(scontrol.run([scontrol.scontrol, "show", "nodes", "--json"]))["nodes"]]
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
            log(action.describe())
        except SlurmCommandError as err:
            log(str(err))
            status = 1
    return status
