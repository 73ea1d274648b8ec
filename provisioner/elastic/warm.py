"""The power-saving programs, run warm inside the reconcile loop (and PrologSlurmctld's wait for its
nodes, on one `sinfo` shared by every waiting job: prolog.SharedStates).

Slurm starts a new ResumeProgram process for every resume. In Python that process spends most of
its time importing before its first pod exists (measured in the slurmctld image: about 2 s from
the allocation to the program's first line, and 1.6 s more before the create call returns, the
Kubernetes client alone 0.8 s of it): more than half of a job's wait from zero workers. The
reconcile loop runs beside slurmctld in the same pod with all of that loaded, so it serves the
programs on a Unix socket in an emptyDir both containers mount (SLURMK8S_PROGRAM_SOCKET,
default /run/slurmk8s/programs/programs.sock): the process Slurm starts imports only the standard
library, sends its arguments (and the resume file's text, which Slurm deletes when the program
ends), and waits for the exit code, which it returns to Slurm. The run itself is the same code
(:func:`programs.run_resume` etc.) with the same budget, log lines (under the caller's pid) and
events, with a fresh backend per run, so nothing a run reads (the owner StatefulSet's uid, the
spec) is older than the call.

Falling back: when the socket is absent or refuses (the loop restarting, a pod of an older
version, the Docker test bed, a disabled socket), the program runs in its own process as before.
When the loop dies after taking the call, before answering, the program runs it again itself: every
backend call is idempotent (a create adopts the worker a first attempt made; a delete of a gone
pod is done), so a repeat is safe, a lost resume is not. A reply never comes late: the caller waits
as long as Slurm lets it (Slurm kills the program after ResumeTimeout, as it would kill a slow one).

Protocol: one JSON object per line each way, one call per connection.
  request  {"program": "resume"|"suspend"|"resume-fail", "args": [...], "pid": N, "resume_file": text|null}
  reply    {"code": N}
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .warmcall import MAX_REQUEST, socket_path

if TYPE_CHECKING:
    from ..logs import Log
    from .bootgate import BootGate
    from .context import Context, RunResult
    from .prolog import SharedStates

READ_TIMEOUT = 10.0  # seconds to read a request: the program sends it at once after connecting
MAX_CALLS = 4096  # calls in flight (PrologSlurmctld's waits are one per starting job); more run themselves


# ---------------------------------------------------------------- the loop's side


Runner = Callable[[str, Sequence[str], str | None, int], int]


class ProgramServer:
    """Accepts calls on a Unix socket and runs each on its own thread with `runner(program, args,
    resume_file, pid) -> exit code`. Started by the reconcile loop; its threads are daemons.

    Bounded: a call takes one of `slots` (:data:`MAX_CALLS`) in the accept loop, before its
    thread starts; over the cap the connection is closed unanswered, and the program runs the call
    itself (NotServed), as without a loop. A request is read for at most `read_timeout` seconds."""

    def __init__(self, path: str, runner: Runner, log: "Log", max_calls: int = MAX_CALLS,
                 read_timeout: float = READ_TIMEOUT) -> None:
        self.path = path
        self.runner = runner
        self.log = log
        self.slots = threading.BoundedSemaphore(max_calls)
        self.max_calls = max_calls
        self.read_timeout = read_timeout
        self._refused_at = -60.0  # monotonic: calls over the cap are logged once a minute
        self._sock: socket.socket | None = None
        self._running = 0  # calls being run now (running())
        self._count_lock = threading.Lock()

    def running(self) -> int:
        """How many program calls are being run now: slurmctld's reconfigure waits for every script
        it started to end, and these may be waiting for slurmctld (livenodes.live.LiveNodes)."""
        with self._count_lock:
            return self._running

    def start(self) -> bool:
        """Bind and serve in the background; False (logged) when the socket cannot be made."""
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)  # left by a previous loop of this pod
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket 0600: only slurmctld's user may call
            try:
                sock.bind(self.path)
            finally:
                os.umask(old)
            sock.listen(64)
        except OSError as err:
            self.log.write(f"not serving the power-saving programs warm ({self.path}: {err}); "
                           "they run in their own processes")
            return False
        self._sock = sock
        threading.Thread(target=self._accept, name="programs", daemon=True).start()
        self.log.write(f"serving the power-saving programs on {self.path}")
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _accept(self) -> None:
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            if not self.slots.acquire(blocking=False):
                conn.close()  # no reply: the program runs the call itself
                self._refused()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="program-call", daemon=True).start()
            except RuntimeError:  # no thread to be had: as over the cap
                self.slots.release()
                conn.close()

    def _refused(self) -> None:
        now = time.monotonic()
        if now - self._refused_at >= 60:
            self._refused_at = now
            self.log.write(f"program call refused: over the cap of {self.max_calls} calls in flight; "
                           "the program runs it itself (logged once a minute)")

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                reply = self._answer(conn)
            finally:
                # the slot is free before the caller hears back: a caller that calls again on
                # its answer finds it free, never a reset for a call that is already over
                self.slots.release()
            if reply is not None:
                try:
                    conn.sendall(reply)
                except OSError:
                    pass  # the caller is gone (Slurm killed it at its timeout): the run is done anyway

    def _answer(self, conn: socket.socket) -> bytes | None:
        """Read one request and run it; the reply line, or None for no reply (the caller runs
        the call itself)."""
        try:
            conn.settimeout(self.read_timeout)
            line = conn.makefile("rb").readline(MAX_REQUEST)
            conn.settimeout(5.0)  # the reply is one short line
            request = json.loads(line)
            program, args, pid = request["program"], request["args"], int(request["pid"])
            resume_file = request.get("resume_file")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise TypeError("args must be a list of strings")
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.log.write(f"program call refused: unreadable request ({err})")
            return None
        with self._count_lock:
            self._running += 1
        try:
            code = self.runner(program, args, resume_file, pid)
        except Exception as err:  # a bug in a run must not stop the loop; the caller runs it itself
            self.log.write(f"{program} {' '.join(args)} for pid {pid} failed in the loop: "
                           f"{type(err).__name__}: {err}; the program runs it itself")
            return None
        finally:
            with self._count_lock:
                self._running -= 1
        return json.dumps({"code": code}).encode() + b"\n"


def runner_for(make_context: Callable[[str, int], "Context"],
               runs: Mapping[str, Callable[..., "RunResult"]]) -> Runner:
    """A Runner over the programs' run functions: a fresh Context (log under the caller's pid, its
    own backend) per call. `runs`: program -> run(args, ctx) or, for resume, run(args, ctx, text)."""

    def run(program: str, args: Sequence[str], resume_file: str | None, pid: int) -> int:
        target = runs.get(program)
        if target is None:
            raise ValueError(f"unknown program {program!r}")
        ctx = make_context(program, pid)
        ctx.log.write("run by the reconcile loop (warm)")
        try:
            result = target(args, ctx, resume_file) if program == "resume" else target(args, ctx)
        finally:
            ctx.log.close()
        return result.code

    return run


def runs(gate: "BootGate | None" = None) -> dict[str, Callable[..., "RunResult"]]:
    """What the loop serves: the three power-saving programs, PrologSlurmctld's early resume, and
    PrologSlurmctld's wait for its nodes (every waiting job on one `sinfo` at a time). With a boot
    `gate`, the early resume holds the nodes it creates and Slurm's resume call releases its nodes
    (Slurm has them POWERING_UP before it calls the program); without one there is no early resume."""
    import functools

    from . import programs
    from .early import run_early_resume
    from .prolog import SharedStates, run_wait

    def resume(args: Sequence[str], ctx: "Context", resume_file: str | None) -> "RunResult":
        if gate is not None:
            from .plan import InputError, parse_hostlists

            try:
                released = gate.release(parse_hostlists(list(args)))
            except InputError:
                released = {}  # the run itself says what is wrong with its arguments
            if released:
                ctx.log.write("boot gate: released " + ", ".join(f"{n} (held {s:.2f}s)"
                                                                  for n, s in sorted(released.items())))
        return programs.run_resume(args, ctx, resume_file)

    shared = SharedStates()
    if gate is not None:  # the gate asks Slurm on the same snapshot as the waiting prologs
        gate.state_of = functools.partial(_one_state, shared)
    return {**programs.RUNS, "resume": resume, "early-resume": functools.partial(run_early_resume, gate=gate),
            "prolog": functools.partial(run_wait, states=shared)}


def _one_state(shared: "SharedStates", node: str) -> str | None:
    states = shared.states_of(node)
    return states[0] if states else None


def serve(env: Mapping[str, str], log: "Log", gate: "BootGate | None" = None) -> ProgramServer | None:
    """Serve the power-saving programs for the reconcile loop, at socket_path(env); None when
    turned off or the socket cannot be made (logged). `gate`: the boot gate the loop serves (none:
    no pod is made ahead of Slurm's resume call)."""
    from . import programs

    path = socket_path(env)
    if not path:
        log.write("SLURMK8S_PROGRAM_SOCKET is empty: the power-saving programs run in their own processes")
        return None

    def make_context(program: str, pid: int) -> "Context":
        penv = programs.with_program_defaults(env)
        return programs.Context(penv, programs.program_log(program, penv, pid))

    server = ProgramServer(path, runner_for(make_context, runs(gate)), log)
    return server if server.start() else None
