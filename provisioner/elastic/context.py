"""What every power-saving program shares, and the modules that serve them (warm.py, prolog.py,
powerdown.py, early.py) import without importing the programs: the run's Context and RunResult, the
env file, slurm.conf's numbers, the events file. Standard library at the top level only (and the
package's logs and settings, themselves standard library only): the prolog imports it for every job.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .. import settings
from ..logs import Log, rotate_if_full
from ..settings import Programs
from .events import MAX_EVENTS_BYTES

if TYPE_CHECKING:
    from ..slurm.commands import SlurmControl
    from .backend import NodeBackend
    from .calls import Outcome
    from .plan import Decision

# the registry's defaults (provisioner.settings), by their old names
DEFAULT_ENV_FILE: str = settings.default(settings.ENV_FILE)
DEFAULT_LOG: str = settings.default(settings.LOG)
DEFAULT_INVENTORY: str = settings.default(settings.INVENTORY)
DEFAULT_PARALLEL: int = settings.default(settings.PARALLEL)
DEFAULT_BUDGET = 20.0  # seconds per wave of SLURMK8S_PARALLEL backend calls (and an unparsable SLURMK8S_BUDGET)
SLURM_TIMEOUT_MARGIN = 30.0  # the programs end this long before Slurm would kill them
SLURM_DEFAULT_TIMEOUT = 60.0  # Slurm's ResumeTimeout default, when slurm.conf says nothing
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
LIST_RETRY_PAUSES = (0.5, 1.5)  # seconds between the (at most three) tries at listing the workers


# ---------------------------------------------------------------- logging


def append_events(path: str, program: str, outcomes: Sequence["Outcome"], pending: Sequence["Decision"] = (),
                  now: float | None = None) -> str:
    """One JSON line per decision and its outcome (ok / failed / abandoned), appended with one
    write (O_APPEND) so concurrent programs do not interleave lines. Returns an error text or ''."""
    import json

    if not path:
        return ""
    at = time.time() if now is None else now
    rows = [{"ts": round(at, 3), "program": program, "node": o.decision.node, "action": o.decision.action.value,
             "reason": o.decision.reason.value, "outcome": "ok" if o.ok else "failed", "error": o.error[:200]}
            for o in outcomes]
    rows += [{"ts": round(at, 3), "program": program, "node": d.node, "action": d.action.value,
              "reason": d.reason.value, "outcome": "abandoned", "error": ""} for d in pending]
    if not rows:
        return ""
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        rotate_if_full(path, MAX_EVENTS_BYTES)  # keep one generation: the log volume is small
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as err:
        return f"cannot append to the events file {path}: {err}"
    return ""


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines (no quoting, no expansion; '#' starts a comment line) -> dict; {} if absent."""
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep and key.strip().isidentifier():
            out[key.strip()] = value.strip()
    return out


def program_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The env file under the process environment."""
    return {**read_env_file(Programs.from_env(environ).env_file), **environ}


def _load_env() -> tuple[dict[str, str], str]:
    try:
        return program_env(os.environ), ""
    except OSError as err:
        return dict(os.environ), f"cannot read the env file: {err}; using the process environment only"


def conf_seconds(path: str, key: str) -> float | None:
    """A number from slurm.conf (cheap scan, no parser import): the longest of its global value and
    those its PartitionName lines set (a node gets the longest of its partitions' ResumeTimeout, and
    Slurm bounds a power-saving program by the longest of all); None when absent/unreadable."""
    found: list[float] = []
    try:
        with open(path) as fh:
            for line in fh:
                text = line.split("#", 1)[0].strip()
                k, sep, value = text.partition("=")
                if sep and k.strip().lower() == key.lower():
                    found.append(float(value.strip()))
                elif k.strip().lower() == "partitionname":
                    found += [float(v) for k2, _, v in (w.partition("=") for w in text.split()[1:])
                              if k2.lower() == key.lower()]
    except (OSError, ValueError):
        return None
    return max(found) if found else None


class Context:
    """What a program run needs, gathered from the environment (or given by a test)."""

    def __init__(self, env: Mapping[str, str], log: Log, *, backend: "NodeBackend | None" = None,
                 slurm: "SlurmControl | None" = None, inventory=None, ledger=None,
                 sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None) -> None:
        self.env = env
        self.settings = Programs.from_env(env)
        self._sleep = sleep
        self.clock = clock or time.monotonic
        self.log = log
        self._backend = backend
        self._slurm = slurm
        self._inventory = inventory
        self.start = self.clock()
        self._ledger = ledger
        # before the calls (listing ...); fixed where SLURMK8S_BUDGET is set
        self.budget = DEFAULT_BUDGET if self.settings.budget is None else self.settings.budget
        self.parallel = self.settings.parallel

    def remaining(self) -> float:
        return self.budget - (self.clock() - self.start)

    def slurm_timeout(self) -> float:
        """When Slurm kills a power-saving program: max(ResumeTimeout, SuspendTimeout) of slurm.conf."""
        conf = self.env.get("SLURM_CONF", DEFAULT_SLURM_CONF)
        found = [t for t in (conf_seconds(conf, "ResumeTimeout"), conf_seconds(conf, "SuspendTimeout")) if t]
        return max(found) if found else SLURM_DEFAULT_TIMEOUT

    def budget_for(self, calls: int) -> float:
        """Seconds (from the start) the backend calls may take: SLURMK8S_BUDGET where set, else 20 s
        per wave of `parallel` calls, at most Slurm's timeout for the program less a margin."""
        if self.settings.budget is not None:
            return self.budget
        waves = -(-max(1, calls) // self.parallel)
        return min(max(DEFAULT_BUDGET, self.slurm_timeout() - SLURM_TIMEOUT_MARGIN), DEFAULT_BUDGET * waves)

    def sleep(self, seconds: float) -> None:
        (self._sleep or time.sleep)(seconds)

    @property
    def slurm(self) -> "SlurmControl":
        if self._slurm is None:
            from ..slurm.commands import Scontrol

            self._slurm = Scontrol()
        return self._slurm

    def backend(self) -> "NodeBackend":
        if self._backend is None:
            from .backend import backend_from_env

            self._backend = backend_from_env(self.env)
        return self._backend

    @property
    def program(self) -> str:
        return self.log.program.split("[", 1)[0]

    def ledger(self):
        """The per-pool failure ledger (reconcile.FileLedger at SLURMK8S_LEDGER); None without one.

        The programs' entry points (`_main`) default SLURMK8S_LEDGER / SLURMK8S_EVENTS; a Context
        built without them (tests) has no ledger and writes no events.
        """
        if self._ledger is None and self.settings.ledger:
            from .ledger import FileLedger, Policy

            self._ledger = FileLedger(self.settings.ledger, Policy.from_env(self.env), log=self.log.write)
        return self._ledger

    def emit(self, outcomes: Sequence["Outcome"], pending: Sequence["Decision"] = ()) -> None:
        error = append_events(self.settings.events or "", self.program, outcomes, pending)
        if error:
            self.log.write(error)

    def inventory(self):
        if self._inventory is None:
            from ..inventory import Inventory

            self._inventory = Inventory.read(self.settings.inventory)
        return self._inventory


class RunResult:
    """What a program run did: exit code, nodes set DOWN, the nodes whose calls were left running."""

    def __init__(self, code: int, down: Mapping[str, str] | None = None, pending: Sequence[str] = ()) -> None:
        self.code = code
        self.down = dict(down or {})
        self.pending = list(pending)

    @property
    def abandoned(self) -> bool:
        return bool(self.pending)
