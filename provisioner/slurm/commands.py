"""The Slurm commands slurmk8s runs in the cluster: argv lists (never shell strings), a timeout per
call, ``--json`` where Slurm has it, and one error type.

:func:`run` is the one runner. :class:`SlurmControl` / :class:`Scontrol` are what the elasticity
programs need (set nodes DOWN, return them to service); :class:`SlurmClient` / :class:`SlurmCli`
what the reconcile loop needs (nodes and jobs as JSON, any ``scontrol update``), with the latency of
every call reported to an observer (the controller RPC metric).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import hostlist

from ..errors import SlurmK8sError

MAX_STDERR = 300

# The address slurmk8s gives a node whose worker is gone or going, when it takes the node out of
# service. slurmctld then sends nothing to the node's name, which does not resolve without a worker:
# Debian's Slurm retries a failed lookup for 10 s while holding the lock every address lookup takes,
# so one such message stalled slurmctld. Nothing listens on slurmd's port in slurmctld's own network
# namespace (the control pod never uses the host's network), so a message to it is refused at once.
# Slurm resets a CLOUD node's address to its name when it is powered down, and takes the worker's
# address when its slurmd registers.
NODE_ADDR_GONE = "127.0.0.1"


class SlurmCommandError(SlurmK8sError):
    """A Slurm command failed, timed out or could not be run (slurmctld unreachable is the usual
    cause, so it is worth retrying on the next pass)."""

    retryable = True


def run(argv: Sequence[str], timeout: float = 10.0, *,
        observe: Callable[[float, bool], None] | None = None) -> str:
    """Run one Slurm command; its stdout, or :class:`SlurmCommandError` naming the command and what
    it said. ``observe(seconds, ok)`` is told how the call went."""
    start = time.monotonic()
    ok = False
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise SlurmCommandError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:MAX_STDERR]}")
        ok = True
        return proc.stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmCommandError(f"{' '.join(argv)}: {err}") from None
    finally:
        if observe is not None:
            observe(time.monotonic() - start, ok)


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/bin/{name}"


def _nodes(names: Sequence[str]) -> str:
    return f"nodename={hostlist.collect_hostlist(list(names))}"


def down_argv(names: Sequence[str], reason: str, scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", _nodes(names), "state=DOWN", f"reason={reason}"]


def resume_argv(names: Sequence[str], scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", _nodes(names), "state=RESUME"]


def states_argv(names: Sequence[str], sinfo: str = "sinfo") -> list[str]:
    """One line per node: its name and extended state ('idle%', 'allocated#', ...)."""
    return [sinfo, "-h", "-N", "-n", hostlist.collect_hostlist(list(names)), "-o", "%N %T"]


def plain_power_down_argv(names: Sequence[str], scontrol: str = "scontrol") -> list[str]:
    """POWER_DOWN: suspend once idle (a job allocated meanwhile runs first), no address change."""
    return [scontrol, "update", _nodes(names), "state=POWER_DOWN"]


def power_down_argv(names: Sequence[str], scontrol: str = "scontrol") -> list[str]:
    """POWER_DOWN_FORCE, and the address :data:`NODE_ADDR_GONE`: every node slurmk8s forces down has
    lost its worker or is about to (the suspend program deletes it), and a DOWN node that never
    registered is messaged by name until it is powering down (Slurm pings at once when a power
    program ends)."""
    return [scontrol, "update", f"nodename={','.join(names)}", "state=POWER_DOWN_FORCE",
            f"nodeaddr={','.join(NODE_ADDR_GONE for _ in names)}"]


# ---------------------------------------------------------------- the elasticity programs' needs


class SlurmControl(Protocol):
    def set_down(self, names: Sequence[str], reason: str) -> None:
        """Mark nodes DOWN with a reason (their jobs are requeued by Slurm)."""
        ...

    def return_to_service(self, names: Sequence[str]) -> None:
        """DOWN+POWERED_DOWN -> IDLE+POWERED_DOWN: the next job that needs the node resumes it again."""
        ...

    def power_down(self, names: Sequence[str]) -> None:
        """POWER_DOWN_FORCE: a node set DOWN while powering up stops powering up (no ResumeTimeout
        wait) and is suspended; with idle_on_node_suspend it is IDLE+POWERED_DOWN after SuspendTimeout."""
        ...

    def end_power_down(self, names: Sequence[str]) -> None:
        """RESUME on nodes POWERING_DOWN whose workers are gone: POWERED_DOWN and available at once,
        instead of at SuspendTimeout, and a scheduling pass queued (elastic/powerdown.py)."""
        ...

    def node_states(self, names: Sequence[str]) -> list[str] | None:
        """sinfo's extended state of each node ('idle%', 'allocated#', ...), in the order given;
        None when sinfo fails or leaves one out."""
        ...


@dataclass(frozen=True)
class Scontrol:
    timeout: float = 10.0
    scontrol: str = field(default_factory=lambda: _binary("scontrol"))

    def run(self, argv: list[str]) -> str:
        return run(argv, self.timeout)

    def set_down(self, names: Sequence[str], reason: str) -> None:
        self.run(down_argv(names, reason, self.scontrol))

    def return_to_service(self, names: Sequence[str]) -> None:
        self.run(resume_argv(names, self.scontrol))

    def power_down(self, names: Sequence[str]) -> None:
        self.run(power_down_argv(names, self.scontrol))

    def end_power_down(self, names: Sequence[str]) -> None:
        self.run(resume_argv(names, self.scontrol))

    def node_states(self, names: Sequence[str]) -> list[str] | None:
        try:
            out = self.run(states_argv(names, _binary("sinfo")))
        except SlurmCommandError:
            return None
        states = dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)
        return [states[n] for n in names] if all(n in states for n in names) else None


# ---------------------------------------------------------------- the reconcile loop's needs


class SlurmClient(Protocol):
    def show_nodes(self) -> dict[str, Any]: ...

    def jobs(self) -> dict[str, Any]: ...

    def update(self, argv: Sequence[str]) -> None: ...


@dataclass
class SlurmCli:
    """scontrol / squeue with --json, argv lists, a timeout per call; `observe(command, seconds, ok)`
    is told the latency of every call (the controller RPC metric)."""

    timeout: float = 10.0
    scontrol: str = field(default_factory=lambda: _binary("scontrol"))
    squeue: str = field(default_factory=lambda: _binary("squeue"))
    observe: Callable[[str, float, bool], None] | None = None

    def _run(self, command: str, argv: Sequence[str]) -> str:
        observe = self.observe
        return run(argv, self.timeout,
                   observe=None if observe is None else lambda seconds, ok: observe(command, seconds, ok))

    def _json(self, command: str, argv: Sequence[str]) -> dict[str, Any]:
        text = self._run(command, argv)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise SlurmCommandError(f"{' '.join(argv)}: not JSON: {err}") from None
        return doc if isinstance(doc, dict) else {}

    def show_nodes(self) -> dict[str, Any]:
        return self._json("show_nodes", [self.scontrol, "show", "nodes", "--json"])

    def jobs(self) -> dict[str, Any]:
        # every state: a job shorter than one period is seen only once it has finished
        return self._json("squeue", [self.squeue, "--json", "--states=all"])

    def update(self, argv: Sequence[str]) -> None:
        self._run("update", argv)
