"""PrologSlurmctld (``slurmk8s-prolog-slurmctld``): holds a job until the nodes it was given have
booted, so it starts the moment its workers' slurmd registered instead of at Slurm's next
power-save pass. Must start fast: it imports little.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Mapping, Sequence

from ..logs import Log
from ..settings import Programs
from .context import _load_env, conf_seconds

PROLOG_POLL = 0.1
PROLOG_DEFAULT_TIMEOUT = 300.0
NOT_BOOTED = ("~", "#", "%")  # powered down, powering up, powering down
GIVE_UP_STATES = ("down", "drain", "fail", "inval", "unknown")


def resume_timeout_from_conf(path: str) -> float | None:
    """ResumeTimeout from slurm.conf (cheap scan, no parser import); None when absent/unreadable."""
    return conf_seconds(path, "ResumeTimeout")


def named_states(nodelist: str, sinfo: str = "sinfo", timeout: float = 10.0) -> list[tuple[str, str]] | None:
    """`sinfo -h -N -n LIST -o '%N %T'` -> (node, extended state) pairs ('allocated#', 'idle~', ...);
    every node's with an empty LIST."""
    import subprocess

    argv = [sinfo, "-h", "-N", *(("-n", nodelist) if nodelist else ()), "-o", "%N %T"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    pairs = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    return [(p[0], p[1]) for p in pairs if len(p) == 2]


def node_states(nodelist: str) -> list[str] | None:
    """One extended state per node of `nodelist`."""
    named = named_states(nodelist)
    return None if named is None else [state for _, state in named]


def powered_down(named: Sequence[tuple[str, str]]) -> list[str]:
    """The nodes whose resume call Slurm has still to make: powered down ('~'). Not those powering
    up ('#': the call is made or under way) nor those powering down ('%': their pod is being
    deleted; Slurm resumes them once that is done)."""
    return [node for node, state in named if state.endswith("~")]


def head_start(env: Mapping[str, str], job: str, nodes: Sequence[str], read_at: float) -> bool:
    """Ask the reconcile loop (elastic/warm.py) to create these nodes' pods now, ahead of Slurm's
    resume call (early.run_early_resume; their slurmd waits at the boot gate, bootgate.py, until
    that call; `read_at`: when their states were read, epoch seconds: a resume call after that is
    for this power-up); nothing is waited for. False when no loop listens:
    the prolog never runs that work itself (it must stay light and quick)."""
    from .warmcall import notify, socket_path

    return notify(socket_path(env), "early-resume", [job, ",".join(nodes), f"{read_at:.3f}"])


def booted(states: Sequence[str]) -> bool:
    return bool(states) and not any(s.endswith(NOT_BOOTED) for s in states)


def gave_up(states: Sequence[str]) -> bool:
    """A node of the job is down / drained / failed: Slurm requeues the job, stop waiting."""
    return any(s.rstrip("~#%*$@^-!").lower().startswith(GIVE_UP_STATES) for s in states)


def wait_for_boot(
    nodelist: str,
    timeout: float,
    states_of: Callable[[str], list[str] | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = PROLOG_POLL,
    first: list[str] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[str, float, int, list[str] | None]:
    """Poll until every node of `nodelist` booted -> (outcome, seconds waited, polls, last states).
    `first`: the states of the first poll, when the caller read them already; `stop()`: a
    reconfigure is due (quiesce.Hold): end the wait now.

    outcome: 'booted', 'gave-up' (a node went DOWN/DRAIN: Slurm handles the job), 'timeout' or
    'released' (a reconfigure was due: Slurm launches the job once its nodes booted, on its own
    power-save pass; a reconfigure must not wait behind this script).
    """
    states_of = states_of or node_states
    start = clock()
    polls = 0
    states: list[str] | None = None
    while True:
        if stop():
            return "released", clock() - start, polls, states
        states = first if polls == 0 and first is not None else states_of(nodelist)
        polls += 1
        if states is not None:
            if gave_up(states):  # first: a DOWN node pending power-down ('down!') has no boot suffix
                return "gave-up", clock() - start, polls, states
            if booted(states):
                return "booted", clock() - start, polls, states
        if clock() - start >= timeout:
            return "timeout", clock() - start, polls, states
        sleep(poll)


def wait_line(job: str, nodelist: str, result: tuple[str, float, int, list[str] | None], early: str,
              extra: str = "") -> str:
    """The prolog's log line, written when it had to wait (wherever the wait ran)."""
    outcome, waited, polls, states = result
    return (f"job {job} nodes {nodelist}: {outcome} after {waited:.2f}s ({polls} polls, states {states})"
            + (f"; pods of {early} asked for early" if early else "") + (f"; {extra}" if extra else ""))


class SharedStates:
    """Node states for every waiting prolog from one `sinfo` at a time: the reconcile loop serves
    the prologs' waits (warm.py), and however many jobs wait for their nodes to boot, slurmctld
    answers one `sinfo -h -N -o '%N %T'` per PROLOG_POLL, not one per job. A poller thread runs
    only while someone waits; `states_of` returns the states from the next snapshot to complete
    after it was called (None when sinfo failed, a node is missing, or none came within `patience`)."""

    def __init__(self, read: Callable[[], list[tuple[str, str]] | None] | None = None, poll: float = PROLOG_POLL,
                 patience: float = 15.0) -> None:
        import threading

        self._read = read or (lambda: named_states_all())
        self._poll = poll
        self._patience = patience
        self._cond = threading.Condition()
        self._seq = 0  # snapshots taken so far
        self._snapshot: dict[str, str] | None = None
        self._waiting = 0
        self.reads = 0  # sinfo calls made (the measure of its cost)
        self.read_errors = 0  # reads that raised: each a failed snapshot (None), the poller goes on
        self.last_error = ""
        threading.Thread(target=self._run, name="prolog-states", daemon=True).start()

    def states_of(self, nodelist: str) -> list[str] | None:
        from .plan import InputError, parse_hostlists

        try:
            names = parse_hostlists([nodelist])
        except InputError:
            return None
        with self._cond:
            want = self._seq + 1
            self._waiting += 1
            self._cond.notify_all()
            try:
                if not self._cond.wait_for(lambda: self._seq >= want, self._patience):
                    return None
                snapshot = self._snapshot
            finally:
                self._waiting -= 1
        if snapshot is None or any(n not in snapshot for n in names):
            return None
        return [snapshot[n] for n in names]

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting > 0)
            started = time.monotonic()
            try:
                pairs = self._read()
            except Exception as err:  # noqa: BLE001 - a failed snapshot; the thread serves every wait
                pairs = None
                self.read_errors += 1
                self.last_error = f"{type(err).__name__}: {err}"
            with self._cond:
                self.reads += 1
                self._snapshot = None if pairs is None else dict(pairs)
                self._seq += 1
                self._cond.notify_all()
            time.sleep(max(0.0, self._poll - (time.monotonic() - started)))


def named_states_all() -> list[tuple[str, str]] | None:
    """Every node's extended state (`sinfo -h -N -o '%N %T'`)."""
    return named_states("")


def run_wait(args: Sequence[str], ctx, states: SharedStates):
    """The prolog's wait, run by the reconcile loop for a prolog process (args: job, nodelist,
    timeout, the nodes asked for early): the same wait, the same log line, on shared states."""
    from .context import RunResult

    from .quiesce import Hold

    job, nodelist, timeout, early = (list(args) + ["", "", "0", ""])[:4]
    result = wait_for_boot(nodelist, float(timeout) or PROLOG_DEFAULT_TIMEOUT, states.states_of,
                           sleep=lambda _s: None,  # states_of itself waits for the next snapshot
                           stop=Hold.of(ctx.env).held)
    if result[2] > 1 or result[0] != "booted":
        ctx.log.write(wait_line(job, nodelist, result, early))
    return RunResult(0)


def prolog_main() -> int:
    """PrologSlurmctld: return once the job's nodes have booted, so Slurm launches it at once.

    Never fails the job on its own: every outcome, even an internal error, exits 0 (a failing
    PrologSlurmctld makes Slurm requeue or hold the job).
    """
    log: Log | None = None
    env, env_error = _load_env()
    settings = Programs.from_env(env)
    try:
        nodelist = env.get("SLURM_JOB_NODELIST", "")
        job = env.get("SLURM_JOB_ID", "?")
        if not nodelist:
            Log("prolog", settings.log).write(f"job {job}: no SLURM_JOB_NODELIST; exit 0")
            return 0
        timeout = settings.prolog_timeout or resume_timeout_from_conf(
            env.get("SLURM_CONF", "/etc/slurm/slurm.conf")) or PROLOG_DEFAULT_TIMEOUT
        read_at = time.time()
        named = named_states(nodelist)
        first = None if named is None else [state for _, state in named]
        if first is not None and booted(first) and not env_error:
            return 0  # nodes already up: stay quiet (runs for every job)
        # the head start (early.py; SLURMK8S_HEAD_START=0 turns it off): the loop creates the pods of
        # the nodes still powered down now, each held at the boot gate until Slurm's resume call
        cold = powered_down(named or ()) if settings.head_start else []
        early = ",".join(cold) if cold and head_start(env, job, cold, read_at) else ""
        from .warmcall import NotServed, delegate

        try:  # the loop waits for us, one sinfo for all the jobs that wait (SharedStates)
            delegate(settings.program_socket, "prolog", [job, nodelist, str(timeout), early], None)
            return 0
        except NotServed as why:
            served = str(why)
        from .quiesce import Hold

        result = wait_for_boot(nodelist, timeout, first=first, stop=Hold.of(env).held)
        if result[2] > 1 or result[0] != "booted" or env_error or served:
            log = Log("prolog", settings.log)
            log.write(wait_line(job, nodelist, result, early, "; ".join(filter(None, (served, env_error)))))
    except BaseException as err:  # noqa: BLE001 -- must never fail the job; logged, exit 0
        try:
            (log or Log("prolog", settings.log)).write(
                f"internal error, job released anyway: {type(err).__name__}: {err}")
        except OSError:
            sys.stderr.write(f"slurmk8s-prolog-slurmctld: {type(err).__name__}: {err}\n")
    return 0
