"""The slurmctld pod's configuration directory is whole.

The slurmctld container's entrypoint fills the pod's configuration directory (an emptyDir at
/etc/slurm) before slurmctld starts, once per pod, and writes ``.ready`` there last
(images/entrypoint/config-init.sh). The pod's other containers, started beside it by the kubelet,
wait for that file before they read the files or run a Slurm command (``--wait-config DIR`` of
``slurmk8s-reconcile`` and ``slurmk8s-accounting``): the reconcile loop also rewrites them, and must
never start on a directory still being filled. They wait however long it takes (a container that
gave up would only be restarted to wait again), and say every so often what they wait for.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from .. import names
from ..settings import ClusterFiles

POLL = 0.05  # s between looks: the file comes within a second of the pod's start
SAY_EVERY = 30.0  # s between "still waiting" lines


def wait_for_config(conf_dir: str, log: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep, poll: float = POLL,
                    say_every: float = SAY_EVERY, stop: Callable[[], bool] = lambda: False) -> float | None:
    """Return once `conf_dir`/.ready exists -> the seconds waited; None once `stop()` (SIGTERM).
    Logs once when it has to wait, then every `say_every` s, and when the wait ends."""
    marker = os.path.join(conf_dir, names.CONFIG_READY)
    if os.path.exists(marker):
        return 0.0
    start = clock()
    said = start
    log(f"waiting for the Slurm configuration in {conf_dir} (the slurmctld container writes it, "
        f"then {names.CONFIG_READY})")
    namespace = ClusterFiles.from_env(os.environ).namespace or "NAMESPACE"  # for the hint
    while not os.path.exists(marker):
        if stop():
            log(f"stopped while waiting for {marker}")
            return None
        if clock() - said >= say_every:
            said = clock()
            log(f"still waiting for {marker} after {said - start:.0f}s: see the "
                f"slurmctld container's log (kubectl -n {namespace} logs {names.CONTROLLER_POD} -c slurmctld)")
        sleep(poll)
    waited = clock() - start
    log(f"the Slurm configuration in {conf_dir} is ready after {waited:.2f}s")
    return waited
