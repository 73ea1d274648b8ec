"""The few Slurm commands the elasticity programs run: argv lists, bounded by a timeout.

:class:`SlurmControl` is the interface; :class:`Scontrol` runs the real commands,
:class:`FakeSlurm` records calls for unit tests.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import hostlist


class SlurmCommandError(Exception):
    pass


class SlurmControl(Protocol):
    def set_down(self, names: Sequence[str], reason: str) -> None:
        """Mark nodes DOWN with a reason (their jobs are requeued by Slurm)."""
        ...

    def return_to_service(self, names: Sequence[str]) -> None:
        """DOWN+POWERED_DOWN -> IDLE+POWERED_DOWN: the next job that needs the node resumes it again."""
        ...


def _nodes(names: Sequence[str]) -> str:
    return f"nodename={hostlist.collect_hostlist(list(names))}"


def down_argv(names: Sequence[str], reason: str, scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", _nodes(names), "state=DOWN", f"reason={reason}"]


def resume_argv(names: Sequence[str], scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", _nodes(names), "state=RESUME"]


@dataclass(frozen=True)
class Scontrol:
    timeout: float = 10.0
    scontrol: str = field(default_factory=lambda: shutil.which("scontrol") or "/usr/bin/scontrol")

    def run(self, argv: list[str]) -> str:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmCommandError(f"{' '.join(argv)}: {err}") from None
        if proc.returncode != 0:
            raise SlurmCommandError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def set_down(self, names: Sequence[str], reason: str) -> None:
        self.run(down_argv(names, reason, self.scontrol))

    def return_to_service(self, names: Sequence[str]) -> None:
        self.run(resume_argv(names, self.scontrol))


@dataclass
class FakeSlurm:
    """Records what the programs asked Slurm to do; `fail` makes set_down raise."""

    down: dict[str, str] = field(default_factory=dict)
    returned: list[str] = field(default_factory=list)
    fail: bool = False

    def set_down(self, names: Sequence[str], reason: str) -> None:
        if self.fail:
            raise SlurmCommandError("scontrol: slurm_update error: Unable to contact slurm controller")
        for name in names:
            self.down[name] = reason

    def return_to_service(self, names: Sequence[str]) -> None:
        if self.fail:
            raise SlurmCommandError("scontrol: slurm_update error: Unable to contact slurm controller")
        self.returned += names
