"""Stopping the Pulumi engine and what an interrupted run leaves (provisioner/deploy/engine.py).

The engine here is a stand-in `pulumi` script that behaves as the CLI does towards its caller: it
answers `pulumi version`, starts a child in its process group (the provider plugin's place), and
on SIGINT either cancels (exits) or, as an engine stuck in an operation, ignores it. Like Pulumi's
plugins, the provider runs in a process group of its own. Real
processes, real signals, real /proc; the Pulumi state is a plain dict.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pulumi import automation as auto

from provisioner.deploy import engine as eng

# bash runs the stand-in engine, sleep stands in for the provider: count them as Pulumi processes
NAMES = ("pulumi", "bash", "sleep")

ENGINE = """#!/bin/bash
if [ "$2" = version ] || [ "$1" = version ]; then echo v3.274.1; exit 0; fi
echo "$$" > "$(dirname "$0")/engine.pid"
setsid sleep 300 &
echo $! > "$(dirname "$0")/provider.pid"
{on_int}
echo "Updating (stand-in)"
wait
"""
CANCELS = "trap 'echo \"^C received; cancelling\"; kill $!; exit 255' INT"
STUCK = "trap '' INT"


def engine_root(tmp_path: Path, on_int: str) -> Path:
    root = tmp_path / "pulumi"
    (root / "bin").mkdir(parents=True)
    exe = root / "bin" / "pulumi"
    exe.write_text(ENGINE.replace("{on_int}", on_int))
    exe.chmod(0o755)
    return root


def alive(pid: int) -> bool:
    st = eng._stat(pid)
    return bool(st) and st[0] != "Z"


def wait_file(path: Path, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


@pytest.fixture(autouse=True)
def names(monkeypatch):
    monkeypatch.setattr(eng, "PULUMI_NAMES", NAMES)


def run_in_thread(cmd: eng.EngineCommand, out: list) -> threading.Thread:
    def go():
        try:
            out.append(cmd.run(["up", "--yes"], str(cmd.run_dir.parent), {}, out.append))
        except auto.CommandError as err:
            out.append(err)

    t = threading.Thread(target=go)
    t.start()
    return t


def test_engine_runs_in_its_own_session_its_tree_recorded_while_it_runs(tmp_path):
    root = engine_root(tmp_path, CANCELS)
    cmd = eng.EngineCommand(str(root), tmp_path / "run", "t20")
    out: list = []
    t = run_in_thread(cmd, out)
    pid = wait_file(root / "bin" / "engine.pid")
    provider = wait_file(root / "bin" / "provider.pid")
    assert os.getpgid(pid) == pid != os.getpgid(0)  # Ctrl-C at the terminal reaches slurmk8s, not the engine
    assert os.getpgid(provider) != pid  # as Pulumi's plugins
    def recorded() -> dict:
        try:
            return json.loads(cmd.record.read_text())
        except (OSError, ValueError):
            return {}

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(recorded().get("procs") or []) < 2:  # kept up to date every 0.5 s
        time.sleep(0.1)
    rec = recorded()
    assert rec["owner"][0] == os.getpid() and rec["command"] == "up"
    assert sorted(p[0] for p in rec["procs"]) == sorted([pid, provider])
    cmd.interrupt(print, grace=10)
    t.join(10)
    assert isinstance(out[-1], auto.CommandError) and "cancelling" in str(out[-1])
    assert not alive(pid) and not alive(provider)
    assert cmd.killed_engine is None and cmd.interrupted == 1
    assert not cmd.record.exists()


def test_an_engine_that_ignores_the_cancel_is_killed_with_its_provider(tmp_path):
    root = engine_root(tmp_path, STUCK)
    cmd = eng.EngineCommand(str(root), tmp_path / "run", "t20")
    out: list = []
    lines: list[str] = []
    t = run_in_thread(cmd, out)
    pid = wait_file(root / "bin" / "engine.pid")
    provider = wait_file(root / "bin" / "provider.pid")
    time.sleep(0.3)  # the trap is set
    t0 = time.monotonic()
    cmd.interrupt(lines.append, grace=1.0)
    t.join(10)
    assert time.monotonic() - t0 < 5
    assert lines == [f"the Pulumi engine (pid {pid}) did not stop within 1s of the cancel: killing it and its provider"]
    assert cmd.killed_engine == pid
    assert not alive(pid) and not alive(provider)
    assert isinstance(out[-1], auto.CommandError)


def test_sigterm_to_slurmk8s_cancels_the_engine_instead_of_orphaning_it(tmp_path):
    root = engine_root(tmp_path, CANCELS)
    cmd = eng.EngineCommand(str(root), tmp_path / "run", "t20")
    lines: list[str] = []
    guard = eng.Interruptible(cmd, lines.append)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with guard, pytest.raises(auto.CommandError):
        cmd.run(["up"], str(tmp_path), {})
    assert guard.signals == ["SIGTERM"]
    assert lines[0].startswith("SIGTERM received: asking the Pulumi engine to cancel")
    pid = int((root / "bin" / "engine.pid").read_text())
    provider = int((root / "bin" / "provider.pid").read_text())
    assert not alive(pid) and not alive(provider)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


class Stack:
    """The two calls recover makes on a Pulumi stack, over a plain deployment dict."""

    def __init__(self, name: str, deployment: dict):
        self.name = name
        self.deployment = deployment
        self.imported = None

    def export_stack(self):
        return SimpleNamespace(deployment=json.loads(json.dumps(self.deployment)))

    def import_stack(self, state):
        self.imported = state.deployment
        self.deployment = state.deployment


PENDING = {"resources": [], "pending_operations": [
    {"resource": {"urn": "urn:pulumi:t20::slurmk8s::kubernetes:apps/v1:Deployment::t20-slurmdbd"}, "type": "creating"},
    {"resource": {"urn": "urn:pulumi:t20::slurmk8s::kubernetes:core/v1:Service::t20-login"}, "type": "updating"}]}


def lock(state: Path, stack: str, pid: int, host: str | None = None) -> Path:
    path = state / "backend" / ".pulumi" / "locks" / "organization" / "slurmk8s" / stack / "0b5e.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "username": "root", "hostname": host or socket.gethostname(),
                                "timestamp": "2026-12-01T10:00:00Z"}))
    return path


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_recover_stops_leftovers_removes_a_stale_lock_and_clears_pending_operations(tmp_path):
    root = engine_root(tmp_path, STUCK)
    cmd = eng.EngineCommand(str(root), tmp_path / "state" / "run", "t20")
    # what a SIGKILLed slurmk8s and engine left: a provider (its own group) and the record, owned by a dead process
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)
    record = cmd.run_dir / "t20.engine.1.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"owner": [dead_pid(), "1"], "procs": [list(eng.proc_of(left.pid))],
                                  "command": "up", "started": "2026-12-01T10:00:00+0000"}))
    stale = lock(tmp_path / "state", "t20", dead_pid())
    stack = Stack("t20", PENDING)
    lines: list[str] = []
    done = eng.recover(stack, tmp_path / "state", cmd, lines.append)
    left.wait(10)
    assert not record.exists() and not stale.exists()
    assert stack.imported["pending_operations"] == []
    assert lines[0] == (f"recover: stopped the Pulumi processes that an interrupted `up` "
                        f"(2026-12-01T10:00:00+0000) left running (sleep {left.pid})")
    assert lines[1].startswith("recover: removed the lock of an update that is no longer running (pid ")
    assert lines[2] == ("recover: cleared 2 operation(s) an interrupted update left pending (creating t20-slurmdbd, "
                        "updating t20-login); this run applies them again (objects that exist are adopted)")
    assert len(done) == 3 and cmd.cleared_pending == 2
    assert eng.recover(stack, tmp_path / "state", cmd, lines.append) == []  # nothing left the second time


def test_a_lock_held_by_a_running_update_or_another_host_is_not_touched(tmp_path):
    root = engine_root(tmp_path, STUCK)
    cmd = eng.EngineCommand(str(root), tmp_path / "state" / "run", "t20")
    running = subprocess.Popen(["sleep", "300"])
    try:
        held = lock(tmp_path / "state", "t20", running.pid)
        with pytest.raises(RuntimeError, match=f"stack 't20' is locked by a running update .*pid {running.pid}"):
            eng.recover(Stack("t20", {}), tmp_path / "state", cmd, print)
        assert held.exists()
    finally:
        running.kill()
        running.wait()
    other = lock(tmp_path / "state", "t20", dead_pid(), host="elsewhere")
    with pytest.raises(RuntimeError, match="elsewhere"):
        eng.recover(Stack("t20", {}), tmp_path / "state", cmd, print)
    assert other.exists()


def test_a_record_of_a_running_slurmk8s_is_not_a_leftover(tmp_path):
    me = eng._stat(os.getpid())
    run = tmp_path / "run"
    run.mkdir()
    (run / "t20.engine.7.json").write_text(json.dumps({"owner": [os.getpid(), me[19]], "procs": [[1, "0"]]}))
    assert eng.leftover_engines(run, "t20") == []


def test_a_slurmk8s_killed_outright_takes_its_engine_along(tmp_path):
    """SIGKILL cannot be handled: the kernel sends the engine SIGINT when slurmk8s dies (PDEATHSIG)."""
    import sys

    root = engine_root(tmp_path, CANCELS)
    code = ("import pathlib, sys\n"
            "from provisioner.deploy import engine as eng\n"
            f"cmd = eng.EngineCommand({str(root)!r}, pathlib.Path({str(tmp_path / 'run')!r}), 't20')\n"
            f"cmd.run(['up'], {str(tmp_path)!r}, {{}})\n")
    repo = str(Path(__file__).resolve().parents[1])
    slurmk8s = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": repo},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = wait_file(root / "bin" / "engine.pid")
    provider = wait_file(root / "bin" / "provider.pid")
    time.sleep(0.3)
    slurmk8s.kill()
    slurmk8s.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (alive(pid) or alive(provider)):
        time.sleep(0.1)
    assert not alive(pid) and not alive(provider)


def test_an_interrupted_command_exits_130():
    import typer

    from provisioner.deploy import commands
    from provisioner.deploy.errors import DeployError, Interrupted

    with pytest.raises(typer.Exit) as stopped:
        commands._fail(Interrupted("`up` interrupted (SIGTERM)"))
    assert stopped.value.exit_code == 130
    with pytest.raises(typer.Exit) as failed:
        commands._fail(DeployError("no"))
    assert failed.value.exit_code == 2
