"""The boot gate (provisioner/elastic/bootgate.py) and the worker's side of it, the slurmd image's
HealthCheckProgram wrapper (images/health/slurmk8s-healthcheck), run for real: bash, /dev/tcp and
a gate served on a local TCP port."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from provisioner.elastic import prolog
from provisioner.elastic.bootgate import BootGate, GateServer, ask, serve
from provisioner.logs import Log

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "images" / "health" / "slurmk8s-healthcheck"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_node_not_held_is_open_at_once_and_a_held_one_when_slurms_call_releases_it():
    gate = BootGate()
    assert gate.wait("cpu-9", 0) is True
    assert gate.hold(["cpu-0", "cpu-1"]) == ["cpu-0", "cpu-1"]
    assert gate.wait("cpu-0", 0.05) is False
    opened: list[bool] = []
    waiter = threading.Thread(target=lambda: opened.append(gate.wait("cpu-0", 5)))
    waiter.start()
    time.sleep(0.05)
    released = gate.release(["cpu-0", "cpu-7"])
    waiter.join(2)
    assert opened == [True] and set(released) == {"cpu-0"} and released["cpu-0"] >= 0.05
    assert gate.is_held("cpu-1") and not gate.is_held("cpu-0")


def test_holds_and_releases_end_by_themselves():
    """A job cancelled before the power-save pass never gets its resume call: the hold ends after
    HOLD_MAX. A resume call after the prolog read its node powered down means the pass came first:
    nothing to hold; one before is an earlier power-up's."""
    clock = Clock()
    gate = BootGate(clock=clock, hold_max=30)
    gate.hold(["cpu-0"])
    clock.now += 29
    assert gate.is_held("cpu-0")
    clock.now += 1
    assert not gate.is_held("cpu-0") and gate.wait("cpu-0", 0)
    gate.release(["cpu-1"])  # Slurm's call came after the prolog read cpu-1 powered down
    assert gate.hold(["cpu-1", "cpu-2"], since=clock.now - 0.5) == ["cpu-2"]
    clock.now += 15  # a later job's early resume of the same node: that call was for an earlier power-up
    assert gate.hold(["cpu-1"], since=clock.now - 0.5) == ["cpu-1"]


def test_slurms_state_decides_for_a_node_this_loop_did_not_resume():
    """After a restart of the loop (its holds are gone), for a pod whose job went away before the
    power-save pass, or when the resume call ran outside the loop: a node Slurm still has powered
    down waits; POWERING_UP or up may register; when Slurm cannot be asked, only holds wait."""
    states = {"cpu-0": "allocated~", "cpu-1": "allocated#", "cpu-2": "idle", "cpu-3": None}
    gate = BootGate(state_of=lambda n: states.get(n), poll=0.01)
    assert gate.wait("cpu-0", 0.05) is False
    assert gate.wait("cpu-1", 0) is True and gate.wait("cpu-2", 0) is True and gate.wait("cpu-3", 0) is True
    threading.Timer(0.1, states.update, kwargs={"cpu-0": "allocated#"}).start()
    assert gate.wait("cpu-0", 5) is True  # the pass came: POWERING_UP
    # held here, and the resume call ran outside the loop: Slurm's state opens it
    gate.hold(["cpu-4"])
    states["cpu-4"] = "allocated~"
    assert gate.wait("cpu-4", 0.05) is False
    states["cpu-4"] = "allocated#"
    assert gate.wait("cpu-4", 5) is True
    # held here and Slurm cannot be asked: still held until the release
    gate.hold(["cpu-3"])
    assert gate.wait("cpu-3", 0.05) is False
    gate.release(["cpu-3"])
    assert gate.wait("cpu-3", 0) is True


def test_a_resume_call_through_the_loop_opens_without_asking_slurm():
    gate = BootGate(state_of=lambda n: pytest.fail("asked Slurm"))
    gate.release(["cpu-0"])  # the ordinary path: Slurm's resume call created the pod
    assert gate.wait("cpu-0", 0) is True


def test_a_second_hold_restarts_the_holds_clock():
    clock = Clock()
    gate = BootGate(clock=clock, hold_max=30)
    gate.hold(["cpu-0"])
    clock.now += 20
    gate.hold(["cpu-0"])  # another job's head start on the same node
    clock.now += 20
    assert gate.is_held("cpu-0")


def test_the_server_answers_open_held_and_refuses_garbage(tmp_path: Path):
    gate = BootGate()
    log = Log("reconcile", str(tmp_path / "reconcile.log"))
    server = GateServer(("127.0.0.1", 0), gate, log, wait_max=0.2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert ask("127.0.0.1", port, "cpu-0") == "open"
        gate.hold(["cpu-0"])
        assert ask("127.0.0.1", port, "cpu-0") == "held"
        threading.Timer(0.1, gate.release, args=(["cpu-0"],)).start()
        server.wait_max = 5
        started = time.monotonic()
        assert ask("127.0.0.1", port, "cpu-0") == "open"
        assert time.monotonic() - started < 2
        assert ask("127.0.0.1", port, "../etc/passwd") == ""  # not a node name: closed, no answer
    finally:
        server.shutdown()
        server.server_close()
    assert "boot gate: cpu-0 may register" in (tmp_path / "reconcile.log").read_text()
    assert ask("127.0.0.1", port, "cpu-0", timeout=1) == ""  # nobody listens: no gate


def test_the_gate_port_is_the_one_the_worker_entrypoint_writes():
    from provisioner.elastic.bootgate import DEFAULT_PORT
    from provisioner.manifests.names import ACTIVITY_PORT

    entrypoint = (ROOT / "images" / "entrypoint" / "slurmd.sh").read_text()
    assert f'"$CONTROLLER_HOST" {DEFAULT_PORT} >/run/slurmk8s/boot-gate' in entrypoint
    assert DEFAULT_PORT != ACTIVITY_PORT


def test_more_waiters_than_slots_are_let_go(tmp_path: Path):
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = GateServer(("127.0.0.1", 0), gate, Log("reconcile", str(tmp_path / "r.log")), wait_max=2,
                        max_waiters=1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        first: list[str] = []
        t = threading.Thread(target=lambda: first.append(ask("127.0.0.1", port, "cpu-0")))
        t.start()
        time.sleep(0.2)
        assert ask("127.0.0.1", port, "cpu-0") == ""  # no slot: a closed connection, the worker goes on
        gate.release(["cpu-0"])
        t.join(3)
        assert first == ["open"]
    finally:
        server.shutdown()
        server.server_close()


def test_serve_says_when_the_port_is_taken(tmp_path: Path):
    log_path = tmp_path / "reconcile.log"
    gate = BootGate()
    first = serve(gate, 0, Log("reconcile", str(log_path)), addr="127.0.0.1")
    assert first is not None
    try:
        assert serve(gate, first.server_address[1], Log("reconcile", str(log_path)), addr="127.0.0.1") is None
    finally:
        first.shutdown()
        first.server_close()
    assert "boot gate not served" in log_path.read_text()


def test_the_prolog_asks_an_early_start_only_for_nodes_still_powered_down():
    assert prolog.powered_down([("a", "allocated~"), ("b", "allocated#"), ("c", "idle%"), ("d", "allocated")]) == ["a"]


# ---------------------------------------------------------------- the worker's side (bash)


needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="the wrapper needs bash and coreutils' timeout")


def _run_wrapper(tmp_path: Path, gate_line: str | None, *args: str, checks_exit: int = 0,
                 env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    marker = tmp_path / "checks-ran"
    checks = tmp_path / "health.py"
    checks.write_text(f"import sys, pathlib\npathlib.Path({str(marker)!r}).write_text(' '.join(sys.argv[1:]))\n"
                      f"sys.exit({checks_exit})\n")
    gate_file = tmp_path / "boot-gate"
    if gate_line is not None:
        gate_file.write_text(gate_line + "\n")
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "cpu-0", "SLURMK8S_HEALTH_PY": str(checks),
           "SLURMK8S_BOOT_GATE_FILE": str(gate_file), "SLURMK8S_HEALTH_LOG": str(tmp_path / "health.log"),
           **(env_extra or {})}
    started = time.monotonic()
    proc = subprocess.run(["bash", str(WRAPPER), *args], env=env, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - started


@needs_bash
def test_slurmds_first_check_waits_at_the_gate_while_the_checks_run(tmp_path: Path):
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = serve(gate, 0, Log("reconcile", str(tmp_path / "reconcile.log")), addr="127.0.0.1")
    assert server is not None
    try:
        threading.Timer(1.0, gate.release, args=(["cpu-0"],)).start()
        proc, took = _run_wrapper(tmp_path, f"127.0.0.1 {server.server_address[1]}", checks_exit=3)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 3, proc.stderr  # the checks' own exit status
    assert 0.9 <= took < 10
    assert (tmp_path / "checks-ran").exists()
    assert not (tmp_path / "boot-gate").exists()  # asked once: later checks go straight to the checks
    assert "boot gate 127.0.0.1:" in (tmp_path / "health.log").read_text()
    assert ": open after 1." in (tmp_path / "health.log").read_text()


@needs_bash
def test_no_gate_served_means_go_on_at_once(tmp_path: Path):
    gate = BootGate()
    probe = serve(gate, 0, Log("reconcile", str(tmp_path / "r.log")), addr="127.0.0.1")
    assert probe is not None
    port = probe.server_address[1]
    probe.shutdown()
    probe.server_close()  # a port nobody listens on
    proc, took = _run_wrapper(tmp_path, f"127.0.0.1 {port}")
    assert proc.returncode == 0, proc.stderr
    assert took < 5
    assert "not served" in (tmp_path / "health.log").read_text()
    assert not (tmp_path / "boot-gate").exists()


@needs_bash
def test_a_check_run_by_hand_or_later_never_asks(tmp_path: Path):
    # with arguments (by hand, --mpi-boot) the gate file is left alone
    proc, _ = _run_wrapper(tmp_path, "127.0.0.1 1", "--no-drain")
    assert proc.returncode == 0 and (tmp_path / "checks-ran").read_text() == "--no-drain"
    assert (tmp_path / "boot-gate").exists() and not (tmp_path / "health.log").exists()
    # without a gate file (every check after the first)
    (tmp_path / "boot-gate").unlink()
    proc, took = _run_wrapper(tmp_path, None)
    assert proc.returncode == 0 and took < 5 and not (tmp_path / "health.log").exists()


@needs_bash
def test_a_gate_that_stays_held_is_given_up_after_its_bound(tmp_path: Path):
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = GateServer(("127.0.0.1", 0), gate, Log("reconcile", str(tmp_path / "r.log")), wait_max=0.3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc, took = _run_wrapper(tmp_path, f"127.0.0.1 {server.server_address[1]}",
                                  env_extra={"SLURMK8S_BOOT_GATE_MAX": "2"})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0 and 0.9 <= took < 6  # bash SECONDS: whole seconds of the wall clock
    assert ": held after " in (tmp_path / "health.log").read_text()
