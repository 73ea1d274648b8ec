"""Fake Slurm for unit tests: :class:`FakeSlurm` (the SlurmControl protocol of the elasticity
programs) and :class:`FakeSlurmClient` (the SlurmClient protocol of the reconcile loop)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from provisioner.slurm.commands import SlurmCommandError


@dataclass
class FakeSlurm:
    """Records what the programs asked Slurm to do; `fail` makes set_down raise."""

    down: dict[str, str] = field(default_factory=dict)
    returned: list[str] = field(default_factory=list)
    powered_down: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # end_power_down
    # sinfo's extended state by node (node_states); a node not named is plainly powering down
    states: dict[str, str] = field(default_factory=dict)
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

    def power_down(self, names: Sequence[str]) -> None:
        if self.fail:
            raise SlurmCommandError("scontrol: slurm_update error: Unable to contact slurm controller")
        self.powered_down += names

    def end_power_down(self, names: Sequence[str]) -> None:
        if self.fail:
            raise SlurmCommandError("scontrol: slurm_update error: Unable to contact slurm controller")
        self.ended += names

    def node_states(self, names: Sequence[str]) -> list[str] | None:
        return None if self.fail else [self.states.get(n, "idle%") for n in names]


@dataclass
class FakeSlurmClient:
    """Canned `scontrol show nodes --json` / `squeue --json`; records every update argv."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    job_list: list[dict[str, Any]] = field(default_factory=list)
    updates: list[list[str]] = field(default_factory=list)
    fail_updates: bool = False
    fail_reads: bool = False

    def show_nodes(self) -> dict[str, Any]:
        if self.fail_reads:
            raise SlurmCommandError("scontrol: error: Unable to contact slurm controller")
        return {"nodes": self.nodes}

    def jobs(self) -> dict[str, Any]:
        if self.fail_reads:
            raise SlurmCommandError("squeue: error: Unable to contact slurm controller")
        return {"jobs": self.job_list}

    def update(self, argv: Sequence[str]) -> None:
        self.updates.append(list(argv))
        if self.fail_updates:
            raise SlurmCommandError(f"{' '.join(argv)}: exit 1: slurm_update error: Invalid node state")
