"""The boot gate (provisioner/elastic/bootgate.py) and the worker's side of it, the slurmd
entrypoint's ask_boot_gate (images/entrypoint/lib.sh), run for real: bash, /dev/tcp and a gate
served on a local TCP port."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from waiting import wait_for

from provisioner.elastic import prolog
from provisioner.elastic.bootgate import BootGate, GateServer, ask, serve
from provisioner.logs import Log

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "images" / "entrypoint" / "lib.sh"


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
    down waits; POWERING_UP or up may start; when Slurm cannot be asked, only holds wait."""
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


def test_a_release_while_slurm_is_asked_opens_without_another_round():
    """Slurm's snapshot can predate the resume call that released the node while it was read: the
    gate answers at once, not after another poll."""
    gate = BootGate(poll=5.0)
    gate.hold(["cpu-0"])

    def state_of(node: str) -> str:
        gate.release([node])  # the resume call lands during the read
        return "idle~"

    gate.state_of = state_of
    started = time.monotonic()
    assert gate.wait("cpu-0", timeout=10)
    assert time.monotonic() - started < 1


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
    assert "boot gate: cpu-0 may start" in (tmp_path / "reconcile.log").read_text()
    assert ask("127.0.0.1", port, "cpu-0", timeout=1) == ""  # nobody listens: no gate


def test_the_gate_port_is_the_one_the_worker_entrypoint_writes():
    from provisioner.elastic.bootgate import DEFAULT_PORT
    from provisioner.names import ACTIVITY_PORT

    entrypoint = (ROOT / "images" / "entrypoint" / "slurmd.sh").read_text()
    asked = entrypoint.index(f'ask_boot_gate "$CONTROLLER_HOST" {DEFAULT_PORT} "$NODENAME"')
    assert asked < entrypoint.index('exec slurmd "${args[@]}"'), "the gate holds slurmd's start"
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


def _gate_server(gate: BootGate, tmp_path: Path, **attrs) -> GateServer:
    server = GateServer(("127.0.0.1", 0), gate, Log("reconcile", str(tmp_path / "r.log")), wait_max=2)
    for name, value in attrs.items():  # the server's settings, as the loop sets them
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _waiting(port: int, node: str = "cpu-0") -> tuple[threading.Thread, list[str]]:
    """A question that waits at the gate (its node held), answered into the list."""
    answers: list[str] = []
    t = threading.Thread(target=lambda: answers.append(ask("127.0.0.1", port, node)))
    t.start()
    time.sleep(0.2)
    return t, answers


def test_a_connection_over_the_cap_is_closed_before_a_thread_is_started_for_it(tmp_path: Path, monkeypatch):
    """The cap is taken in the accept loop: a flood of connections starts no thread once the slots
    are full (each would otherwise cost a thread before it found no slot)."""
    started: list[object] = []
    thread_for = GateServer.process_request_thread
    monkeypatch.setattr(GateServer, "process_request_thread",
                        lambda self, request, address: (started.append(address), thread_for(self, request, address)))
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = _gate_server(gate, tmp_path, slots=threading.BoundedSemaphore(1))
    port = server.server_address[1]
    try:
        t, first = _waiting(port)
        assert [ask("127.0.0.1", port, "cpu-0", timeout=2) for _ in range(20)] == [""] * 20
        gate.release(["cpu-0"])
        t.join(3)
        assert first == ["open"]
    finally:
        server.shutdown()
        server.server_close()
    assert len(started) == 1, f"{len(started)} threads started for 21 connections with one slot"


def test_one_peer_holds_at_most_its_share_of_the_slots(tmp_path: Path):
    """A job that opens connection after connection from its pod cannot fill the gate: past
    `max_per_peer` questions in flight from one address, the next is closed at once."""
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = _gate_server(gate, tmp_path, max_per_peer=1)
    port = server.server_address[1]
    try:
        t, first = _waiting(port)
        # the first question holds its slot before the second comes (0.2 s was not always enough under CI load)
        wait_for("the first question's slot", lambda: server._peers.get("127.0.0.1", 0) >= 1, 10, interval=0.02)
        started = time.monotonic()
        assert ask("127.0.0.1", port, "cpu-0", timeout=3) == ""
        assert time.monotonic() - started < 1
        gate.release(["cpu-0"])
        t.join(3)
        assert first == ["open"]
        # the handler gives its slot back just after its answer is sent (a CI run asked in between)
        wait_for("the slot back", lambda: server._peers.get("127.0.0.1", 0) == 0, 10, interval=0.02)
        assert ask("127.0.0.1", port, "cpu-0", timeout=3) == "open"  # its slot came back
    finally:
        server.shutdown()
        server.server_close()


def test_a_question_from_a_pod_that_is_not_the_nodes_worker_is_closed_at_once(tmp_path: Path):
    """Only the worker pod of the node named may ask for it (its pod IP, the loop's check): a job
    elsewhere naming a held node gets a closed connection, at once, and takes no waiting slot."""
    asked: list[tuple[str, str]] = []

    def is_worker(node: str, ip: str) -> bool | None:
        asked.append((node, ip))
        return {"cpu-0": False, "cpu-1": True}.get(node)  # cpu-2: cannot tell (the API did not answer)

    gate = BootGate()
    gate.hold(["cpu-0", "cpu-1", "cpu-2"])
    server = _gate_server(gate, tmp_path, is_worker=is_worker, wait_max=0.3)
    port = server.server_address[1]
    try:
        started = time.monotonic()
        assert ask("127.0.0.1", port, "cpu-0", timeout=3) == ""
        assert time.monotonic() - started < 0.25
        assert ask("127.0.0.1", port, "cpu-1", timeout=3) == "held"
        assert ask("127.0.0.1", port, "cpu-2", timeout=3) == "held"  # as before the check: Slurm's state decides
    finally:
        server.shutdown()
        server.server_close()
    assert asked == [("cpu-0", "127.0.0.1"), ("cpu-1", "127.0.0.1"), ("cpu-2", "127.0.0.1")]
    said = (tmp_path / "r.log").read_text()
    assert "boot gate: refused a question for cpu-0 from 127.0.0.1, not its worker pod" in said


def test_a_silent_connection_is_closed_after_the_read_timeout(tmp_path: Path):
    """Sound before this change (StreamRequestHandler's 5 s timeout): a connection that sends no
    node name holds its slot for the read timeout only."""
    import socket

    server = _gate_server(BootGate(), tmp_path)
    try:
        with socket.create_connection(server.server_address, timeout=10) as conn:
            started = time.monotonic()
            assert conn.recv(64) == b""
            took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert 4 <= took < 7


def _pod(ip: str = "", *, ips: tuple[str, ...] = (), deleting: bool = False) -> dict:
    status: dict = {"podIP": ip} if ip else {}
    if ips:
        status["podIPs"] = [{"ip": i} for i in ips]
    meta = {"deletionTimestamp": "2025-01-01T00:00:00Z"} if deleting else {}
    return {"metadata": meta, "status": status}


def test_worker_pods_match_the_callers_address_with_the_nodes_pod_ip():
    from provisioner.kubeapi import ApiError
    from provisioner.elastic.bootgate import WorkerPods

    pods = {"cpu-0": [_pod("10.0.0.5")], "cpu-1": [_pod(ips=("10.0.0.7", "fd00::7"))],
            "cpu-2": [_pod("10.0.0.9", deleting=True)], "cpu-3": []}
    asked: list[str] = []

    def pods_of(node: str) -> list:
        asked.append(node)
        if node == "down":
            raise ApiError(0, "Unreachable", "connection refused")
        if node == "bad..name":
            raise ApiError(400, "BadRequest", "invalid label value")
        return pods[node]

    slept: list[float] = []
    check = WorkerPods(pods_of, wait=1.0, poll=0.25, sleep=slept.append, clock=lambda: sum(slept))
    assert check("cpu-0", "10.0.0.5") is True
    assert check("cpu-0", "10.0.0.5") is True and asked == ["cpu-0"]  # remembered: no second list
    assert check("cpu-0", "10.0.0.6") is False  # another address than the node's pod: at once
    assert check("cpu-1", "fd00::7") is True
    assert check("cpu-2", "10.0.0.9") is False  # a pod being deleted asks for nobody
    assert slept == [0.25] * 4  # (cpu-2's deleted pod counts as none: asked again, as for cpu-3)
    slept.clear()
    assert check("cpu-3", "10.0.0.5") is False and slept == [0.25] * 4  # no pod IP posted in 1 s
    assert check("down", "10.0.0.5") is None  # cannot tell
    assert check("bad..name", "10.0.0.5") is False


def test_a_worker_pod_whose_ip_is_posted_late_is_asked_again():
    from provisioner.elastic.bootgate import WorkerPods

    answers = iter([[_pod()], [], [_pod("10.0.0.5")]])
    check = WorkerPods(lambda _n: next(answers), wait=5.0, poll=0.01)
    assert check("cpu-0", "10.0.0.5") is True


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
                                reason="the entrypoint needs bash and coreutils' timeout")


def _ask(address: str, env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """The slurmd entrypoint's question, as it asks it: ask_boot_gate from lib.sh, in bash."""
    host, port = address.split()
    env = {"PATH": os.environ["PATH"], "SLURMK8S_ROLE": "slurmd", **(env_extra or {})}
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", f'set -euo pipefail; . "{LIB}"; ask_boot_gate "$@"', "_", host, port, "cpu-0"],
                          env=env, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - started


def _served(gate: BootGate, tmp_path: Path, wait_max: float | None = None) -> GateServer:
    log = Log("reconcile", str(tmp_path / "reconcile.log"))
    if wait_max is None:
        server = serve(gate, 0, log, addr="127.0.0.1")
        assert server is not None
        return server
    server = GateServer(("127.0.0.1", 0), gate, log, wait_max=wait_max)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@needs_bash
def test_the_entrypoint_waits_at_the_gate_until_slurms_call_releases_its_node(tmp_path: Path):
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = _served(gate, tmp_path)
    try:
        threading.Timer(1.0, gate.release, args=(["cpu-0"],)).start()
        proc, took = _ask(f"127.0.0.1 {server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    assert 0.9 <= took < 10
    said = re.search(r"\[slurmk8s-slurmd\] boot gate 127\.0\.0\.1:\d+: open after (\d+\.\d+)s", proc.stderr)
    assert said and float(said.group(1)) >= 0.5, proc.stderr  # bash's own start counts in `took` only


@needs_bash
def test_slurmd_starts_no_earlier_by_its_own_clock_than_the_gates_answer(tmp_path: Path):
    """Slurm compares the boot time slurmd reports (this node's clock) with its boot request
    (slurmctld's): a worker whose clock is behind waits out the difference, bounded at 2 s."""
    for ahead, low, high, warned in ((0.8, 0.7, 5.0, False), (30.0, 1.9, 6.0, True)):
        gate = BootGate(clock=lambda ahead=ahead: time.time() + ahead)
        server = _served(gate, tmp_path)
        try:
            proc, took = _ask(f"127.0.0.1 {server.server_address[1]}")
        finally:
            server.shutdown()
            server.server_close()
        assert proc.returncode == 0, proc.stderr
        assert low <= took < high, (ahead, took, proc.stderr)
        assert ("clock is 2 s or more behind" in proc.stderr) is warned, proc.stderr


@needs_bash
def test_an_open_gate_costs_one_round_trip(tmp_path: Path):
    server = _served(BootGate(), tmp_path)
    try:
        proc, took = _ask(f"127.0.0.1 {server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0 and took < 5 and re.search(r": open after \d+\.\d+s", proc.stderr), proc.stderr


@needs_bash
def test_no_gate_served_means_go_on_at_once(tmp_path: Path):
    probe = _served(BootGate(), tmp_path)
    port = probe.server_address[1]
    probe.shutdown()
    probe.server_close()  # a port nobody listens on
    proc, took = _ask(f"127.0.0.1 {port}")
    assert proc.returncode == 0, proc.stderr
    assert took < 5
    assert "not served" in proc.stderr


@needs_bash
def test_a_gate_that_stays_held_is_given_up_after_its_bound(tmp_path: Path):
    gate = BootGate()
    gate.hold(["cpu-0"])
    server = _served(gate, tmp_path, wait_max=0.3)
    try:
        proc, took = _ask(f"127.0.0.1 {server.server_address[1]}", {"SLURMK8S_BOOT_GATE_MAX": "2"})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0 and 0.9 <= took < 6  # bash SECONDS: whole seconds of the wall clock
    assert ": held after " in proc.stderr, proc.stderr


def test_on_kubernetes_the_loop_serves_no_gate_that_cannot_check_who_asks(tmp_path: Path):
    from provisioner.reconcile.main import _boot_gate

    log_path = tmp_path / "reconcile.log"
    env = {"SLURMK8S_BACKEND": "kubernetes", "SLURMK8S_SPEC": str(tmp_path / "missing.json")}
    assert _boot_gate(True, Log("reconcile", str(log_path)), env) is None
    assert "boot gate not served (it cannot check who asks:" in log_path.read_text()
