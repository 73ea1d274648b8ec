"""A reconfigure never waits behind the power-saving programs' optional waits.

Slurm 24.11 answers no RPC during ``scontrol reconfigure`` until every script it started has ended
(PrologSlurmctld, ResumeProgram, SuspendProgram). Two of ours wait for minutes at worst, and both
waits are only speed-ups that Slurm does without:

- PrologSlurmctld's boot wait (prolog.py) holds a job until its nodes booted so it launches at
  once; without it Slurm launches the job on its next power-save pass;
- the suspend program's end of a power-down (powerdown.py) waits for the workers to be gone;
  without it the node is available at SuspendTimeout.

A boot wait that waits on slurmctld's answers while slurmctld waits for the wait to end stalls
every Slurm command until ResumeTimeout. So the loop that is about to reconfigure (livenodes/live.py)
*holds* first: it creates one file, every such wait looks for it on each poll and ends at once (no
new one starts while it is there), the reconfigure runs as soon as the programs are done, and the
file goes. A file, not a flag in memory: the waits run in the loop (warm.py) and, when it does not
serve them, in the programs' own processes in the slurmctld container; both see the programs'
socket directory, an emptyDir the two containers mount. A file left by a loop that died is removed
when the next one starts (:func:`Hold.release`), so a hold never outlives its loop for long.
"""

from __future__ import annotations

import os
from typing import Mapping

from .warmcall import DEFAULT_SOCKET, socket_path

NAME = "reconfigure-due"


def hold_path(env: Mapping[str, str]) -> str:
    """The hold file: beside the programs' socket (its directory exists even when the socket is off)."""
    return os.path.join(os.path.dirname(socket_path(env) or DEFAULT_SOCKET), NAME)


class Hold:
    """The hold file of one cluster's programs: `held()` is what every optional wait polls."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def of(cls, env: Mapping[str, str]) -> "Hold":
        return cls(hold_path(env))

    def held(self) -> bool:
        return os.path.exists(self.path)

    def hold(self) -> bool:
        """Create the file; False (the waits then run on, and the reconfigure waits its bound) when
        the directory cannot be written."""
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "w"):
                pass
            return True
        except OSError:
            return False

    def release(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
