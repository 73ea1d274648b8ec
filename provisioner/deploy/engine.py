"""The Pulumi engine as a child process that `slurmk8s` can stop, and what an interrupted run leaves.

The Automation API starts the ``pulumi`` CLI (the engine), which starts the Kubernetes provider
plugin (in a process group of its own). :class:`EngineCommand` starts the engine in a session of its
own (Ctrl-C at the terminal reaches ``slurmk8s`` only), makes the kernel send it SIGINT should
``slurmk8s`` die (PR_SET_PDEATHSIG, through util-linux's ``setpriv``), and keeps its process tree (engine
and plugins, pid and start time) in ``<state>/run/<stack>.engine.<pid>.json`` while it runs.

- :meth:`EngineCommand.interrupt`: SIGINT, which the engine takes as "cancel": no new operations, the
  provider's waits are cancelled, the state is written, the lock released. If the engine has not
  exited after :data:`GRACE` seconds, it and its plugins are killed; its state then may hold
  pending operations and its lock, which :func:`recover` clears. A plugin that outlives a finished
  engine is killed too.
- :class:`Interruptible`: while an operation runs, Ctrl-C (SIGINT) and SIGTERM stop the engine as
  above instead of killing ``slurmk8s`` alone; a second Ctrl-C kills the group at once.
- :func:`recover`, before every ``up`` / ``preview`` / ``down``: stops engine and provider processes an
  earlier run left (the record above), removes the stack's lock when the process that took it is
  gone (same host, pid not a running ``pulumi``), and clears pending operations from the state, so
  that the run resumes where the interrupted one stopped (objects it created are adopted by
  server-side apply); each step says what it did.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import create_command_error

GRACE = 20.0  # seconds the engine has to cancel before its process group is killed
PR_SET_PDEATHSIG = 1
PULUMI_NAMES = ("pulumi",)  # executables of the engine and its plugins (pulumi, pulumi-resource-kubernetes)

Printer = Callable[[str], Any]


# ---------------------------------------------------------------- processes


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], pgrp [2], starttime [19])."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def _exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)"))
    except OSError:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return ""


def is_pulumi(pid: int) -> bool:
    """A live (not zombie) process running a Pulumi binary (the CLI or a plugin)."""
    st = _stat(pid)
    if not st:
        return False
    return st[0] != "Z" and _exe_name(pid).startswith(PULUMI_NAMES)


Proc = tuple[int, str]  # pid and start time (clock ticks after boot): a pid reused later does not match


def proc_of(pid: int) -> Proc | None:
    st = _stat(pid)
    return (pid, st[19]) if st else None


def same(proc: Sequence[Any]) -> bool:
    """The process still runs (not a zombie), is the one recorded (start time) and a Pulumi binary."""
    pid, start = int(proc[0]), str(proc[1])
    st = _stat(pid)
    if not st:
        return False
    return st[0] != "Z" and st[19] == start and _exe_name(pid).startswith(PULUMI_NAMES)


def descendants(pid: int) -> list[Proc]:
    """The process and everything it started, by parent pid (Pulumi starts each plugin in a process
    group of its own, so the group does not find them). Only Pulumi binaries count."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st:
                children.setdefault(int(st[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        proc = proc_of(p)
        if proc is not None and same(proc):
            out.append(proc)
        todo += children.get(p, [])
    return sorted(out)


def stop(procs: Sequence[Sequence[Any]], sig: int, wait: float = 5.0) -> list[int]:
    """Signal the recorded processes that still run; wait until they are gone. Returns the pids
    signalled."""
    hit = []
    for proc in procs:
        if same(proc):
            try:
                os.kill(int(proc[0]), sig)
                hit.append(int(proc[0]))
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(same(p) for p in procs):
        time.sleep(0.1)
    return hit


def _pdeathsig() -> Callable[[], None] | None:
    """A preexec function that has the kernel send the child SIGINT when its parent thread dies,
    resolved here in the parent (the child, between fork and exec, only calls it)."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigint = int(signal.SIGINT)

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, sigint, 0, 0, 0)

    return die_with_parent


def _follow(path: Path, proc: subprocess.Popen[Any], callback: Optional[Callable[[str], Any]],
            lines: list[str]) -> None:
    """Pass the lines the engine writes to `path` on as they come, until it has exited and all is read."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        partial = ""
        while True:
            chunk = fh.readline()
            if chunk:
                partial += chunk
                if not partial.endswith("\n"):
                    continue
            elif proc.poll() is None:
                time.sleep(0.05)
                continue
            elif not partial:
                return
            line, partial = partial.rstrip(), ""
            if callback:
                callback(line)
            lines.append(line)


class EngineCommand(auto.PulumiCommand):
    """`pulumi` run as the SDK runs it, but in a session of its own, its process tree recorded while
    it runs, and stoppable with :meth:`interrupt`."""

    def __init__(self, root: str, run_dir: Path, stack: str) -> None:
        super().__init__(root=root, skip_version_check=False)
        self.run_dir = run_dir
        self.stack = stack
        self.record = run_dir / f"{stack}.engine.{os.getpid()}.json"  # one per slurmk8s process
        self._lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.interrupted = 0  # SIGINTs sent to the running engine
        self.killed: list[int] = []  # pids killed: the engine did not stop in time, or a plugin outlived it
        self.killed_engine: int | None = None
        self.procs: list[Proc] = []  # the running engine and its plugins, as last seen
        self.cleared_pending = 0  # pending operations recover() cleared (the next update refreshes first)

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
            on_output: Optional[Callable[[str], Any]] = None,
            on_error: Optional[Callable[[str], Any]] = None) -> CommandResult:
        sep = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:sep]:
            args.insert(0, "--non-interactive")
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):
            env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env.get("PATH", "")])
        out: list[str] = []
        err: list[str] = []
        argv, preexec = [self.command, *args], None
        if threading.current_thread() is threading.main_thread():  # PDEATHSIG follows the spawning thread
            # util-linux's setpriv sets it and execs the engine (same pid); a preexec function would
            # do too, but forces a plain fork, which gRPC's fork handlers log about
            setpriv = shutil.which("setpriv")
            if setpriv:
                argv = [setpriv, "--pdeathsig", "INT", "--", *argv]
            else:
                preexec = _pdeathsig()
        # The engine writes to files, not pipes: should slurmk8s die, a write to a pipe nobody reads
        # would kill the engine (SIGPIPE) before it cancels, releases its lock and stops its provider.
        self.run_dir.mkdir(parents=True, exist_ok=True)
        out_path, err_path = self.record.with_suffix(".out"), self.record.with_suffix(".err")
        with open(out_path, "w") as out_w, open(err_path, "w") as err_w:
            proc = subprocess.Popen(argv, stdout=out_w, stderr=err_w, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                    start_new_session=True, preexec_fn=preexec)
        with self._lock:
            self.process = proc
        command = " ".join(a for a in args[:3] if not a.startswith("--"))
        done = threading.Event()
        tracker = threading.Thread(target=self._track, args=(proc, command, done), daemon=True)
        tracker.start()
        readers = [threading.Thread(target=_follow, args=(out_path, proc, on_output, out), daemon=True),
                   threading.Thread(target=_follow, args=(err_path, proc, on_error, err), daemon=True)]
        for t in readers:
            t.start()
        try:
            proc.wait()
        finally:
            for t in readers:
                t.join()
            done.set()
            tracker.join()
            with self._lock:
                self.process = None
            self.killed += stop(self.procs, signal.SIGKILL, wait=3.0)  # a plugin the engine did not stop
            self.procs = []
            for path in (self.record, out_path, err_path):
                path.unlink(missing_ok=True)
        result = CommandResult(stdout="\n".join(out), stderr="\n".join(err), code=proc.returncode)
        if proc.returncode != 0:
            raise create_command_error(result)
        return result

    def _track(self, proc: subprocess.Popen[bytes], command: str, done: threading.Event) -> None:
        """While the engine runs: its process tree, kept in `procs` and in the record (rewritten when
        it changes), so that a later run finds the plugins should this process and the engine die."""
        me = proc_of(os.getpid())
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.record.parent.mkdir(parents=True, exist_ok=True)
        seen: list[Proc] = []
        while True:
            now = descendants(proc.pid)
            if now and now != seen:
                seen = now
                with self._lock:
                    self.procs = sorted(set(self.procs) | set(now))
                    procs = list(self.procs)
                self.record.write_text(json.dumps({"owner": list(me) if me else None, "procs": procs,
                                                   "command": command, "started": started}))
            if done.wait(0.5):
                return

    def running(self) -> int | None:
        with self._lock:
            return self.process.pid if self.process is not None and self.process.poll() is None else None

    def interrupt(self, echo: Printer, grace: float = GRACE) -> None:
        """Ask the running engine to cancel (SIGINT); kill its process group if it has not exited
        after `grace` seconds (0: at once). Blocks until then; returns at once when none runs."""
        pid = self.running()
        if pid is None:
            return
        if grace > 0:
            self.interrupted += 1
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if self.running() is None:
                    return
                time.sleep(0.2)
            echo(f"the Pulumi engine (pid {pid}) did not stop within {grace:.0f}s of the cancel: killing it and "
                 "its provider")
        self.killed_engine = pid
        with self._lock:
            procs = sorted(set(self.procs) | set(descendants(pid)))
        self.killed += stop(procs, signal.SIGKILL)


class Interruptible:
    """While an operation runs (main thread only): Ctrl-C and SIGTERM cancel the engine (SIGINT,
    then a kill after GRACE) instead of killing slurmk8s alone; a second Ctrl-C kills at once."""

    def __init__(self, engine: EngineCommand, echo: Printer) -> None:
        self.engine = engine
        self.echo = echo
        self.signals: list[str] = []
        self._saved: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        self.signals.append(name)
        if len(self.signals) == 1:
            self.echo(f"{name} received: asking the Pulumi engine to cancel (it finishes the operations in flight, "
                      f"at most {GRACE:.0f}s; Ctrl-C again stops it at once)")
            threading.Thread(target=self.engine.interrupt, args=(self.echo,), daemon=True).start()
        else:
            self.echo(f"{name} received again: stopping the Pulumi engine and its provider now")
            threading.Thread(target=self.engine.interrupt, args=(self.echo, 0), daemon=True).start()

    def __enter__(self) -> "Interruptible":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------- what an interrupted run leaves


def leftover_engines(run_dir: Path, stack: str) -> list[tuple[Path, dict[str, Any], list[Sequence[Any]]]]:
    """Records of engines whose slurmk8s process is gone, with their Pulumi processes still running."""
    out = []
    for record in sorted(run_dir.glob(f"{stack}.engine.*.json")) if run_dir.is_dir() else []:
        try:
            rec = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        owner = rec.get("owner")
        if owner:
            st = _stat(int(owner[0]))
            if st and st[0] != "Z" and st[19] == str(owner[1]):
                continue  # that slurmk8s still runs it
        out.append((record, rec, [p for p in rec.get("procs") or [] if same(p)]))
    return out


def stack_locks(state: Path, stack: str) -> list[Path]:
    root = state / "backend" / ".pulumi" / "locks"
    return sorted(p for p in root.rglob("*.json") if p.parent.name == stack) if root.is_dir() else []


def remove_lock(lock: Path) -> None:
    """A lock file and the file backend's ``.attrs`` sidecar beside it."""
    lock.unlink(missing_ok=True)
    lock.with_name(lock.name + ".attrs").unlink(missing_ok=True)


def clear_pending(stack: Any) -> list[Mapping[str, Any]]:
    """Drop the operations an interrupted update left pending from the stack's state; returns them."""
    deployment = stack.export_stack()
    ops = (deployment.deployment or {}).get("pending_operations") or []
    if ops:
        deployment.deployment["pending_operations"] = []
        stack.import_stack(deployment)
    return ops


def lock_is_stale(content: Mapping[str, Any], host: str | None = None) -> bool:
    """The lock was taken on this host by a process that is no longer a running `pulumi`."""
    if content.get("hostname") != (host or socket.gethostname()):
        return False
    pid = int(content.get("pid") or 0)
    return pid <= 0 or not is_pulumi(pid)


def recover(stack: Any, state: Path, engine: EngineCommand, echo: Printer, *, pending: bool = True) -> list[str]:
    """Repair what an interrupted run left, saying so: its engine and provider processes, its lock,
    its pending operations. Returns what was done (empty: nothing was left). Raises RuntimeError
    with the reason when a live update holds the stack."""
    done: list[str] = []
    for record, rec, procs in leftover_engines(engine.run_dir, engine.stack):
        if procs:
            names = ", ".join(f"{_exe_name(int(p[0])) or '?'} {p[0]}" for p in procs)
            stop(procs, signal.SIGINT, wait=GRACE)
            killed = stop(procs, signal.SIGKILL)
            done.append(f"stopped the Pulumi processes that an interrupted `{rec.get('command', '?')}` "
                        f"({rec.get('started', '?')}) left running ({names}" + (", killed" if killed else "") + ")")
        for path in (record, record.with_suffix(".out"), record.with_suffix(".err")):
            path.unlink(missing_ok=True)
    for lock in stack_locks(state, stack.name):
        try:
            content = json.loads(lock.read_text())
        except (OSError, ValueError):
            content = {}
        if not lock_is_stale(content):
            where = f"{content.get('username', '?')}@{content.get('hostname', '?')} pid {content.get('pid', '?')}"
            raise RuntimeError(f"stack {stack.name!r} is locked by a running update ({where}, since "
                               f"{content.get('timestamp', '?')}; lock {lock})")
        remove_lock(lock)
        done.append(f"removed the lock of an update that is no longer running (pid {content.get('pid', '?')}, "
                    f"{content.get('timestamp', '?')})")
    if pending:
        ops = clear_pending(stack)
        if ops:
            engine.cleared_pending += len(ops)
            what = ", ".join(f"{op.get('type', '?')} {op.get('resource', {}).get('urn', '?').rsplit('::', 1)[-1]}"
                             for op in ops)
            done.append(f"cleared {len(ops)} operation(s) an interrupted update left pending ({what}); this run "
                        "applies them again (objects that exist are adopted)")
    for line in done:
        echo(f"recover: {line}")
    return done
