"""The power-saving programs run warm by the reconcile loop (provisioner/elastic/warm.py): the
program Slurm starts hands its call over a Unix socket and returns the loop's exit code, and runs
the call itself whenever the loop does not serve or does not answer."""

from __future__ import annotations

import functools
import os
import re
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes.backend import FakeBackend
from fakes.slurm import FakeSlurm

from provisioner.elastic import programs, prolog
from provisioner.elastic.backend import Worker
from provisioner.elastic.ledger import FileLedger
from provisioner.elastic import warm
from provisioner.elastic.bootgate import BootGate
from provisioner.elastic.early import run_early_resume
from provisioner.elastic.warm import ProgramServer, runner_for
from provisioner.elastic.warmcall import NotServed, delegate
from provisioner.inventory import Inventory, SlurmNode
from provisioner.logs import Log


@pytest.fixture
def sock(tmp_path: Path) -> str:
    # AF_UNIX paths are short (108 bytes): pytest's tmp_path may be longer
    short = Path(f"/tmp/warm-{os.getpid()}-{time.monotonic_ns()}")
    short.mkdir()
    yield str(short / "programs.sock")
    for p in short.iterdir():
        p.unlink()
    short.rmdir()


def serve(path: str, runner, tmp_path: Path) -> ProgramServer:
    server = ProgramServer(path, runner, Log("reconcile", str(tmp_path / "reconcile.log")))
    assert server.start()
    return server


def test_the_loop_runs_the_call_and_the_program_returns_its_exit_code(sock: str, tmp_path: Path):
    calls = []

    def runner(program, args, resume_file, pid):
        calls.append((program, list(args), resume_file, pid))
        return 3

    server = serve(sock, runner, tmp_path)
    try:
        assert delegate(sock, "resume", ["cpu-[0-1]"], '{"jobs": []}') == 3
    finally:
        server.close()
    assert calls == [("resume", ["cpu-[0-1]"], '{"jobs": []}', os.getpid())]
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600  # only slurmctld's user may call
    assert f"serving the power-saving programs on {sock}" in (tmp_path / "reconcile.log").read_text()


def test_no_loop_listening_means_the_program_runs_the_call_itself_silently(sock: str):
    with pytest.raises(NotServed) as absent:
        delegate(sock, "suspend", ["cpu-0"], None)
    assert str(absent.value) == ""  # the usual case without a loop: nothing to log
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock)  # a socket file nobody accepts on (a loop that died)
    stale.close()
    with pytest.raises(NotServed) as refused:
        delegate(sock, "suspend", ["cpu-0"], None)
    assert str(refused.value) == ""
    with pytest.raises(NotServed):
        delegate("", "suspend", ["cpu-0"], None)  # turned off


def test_a_stale_socket_file_is_replaced_when_the_loop_starts(sock: str, tmp_path: Path):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock)
    stale.close()
    server = serve(sock, lambda *a: 0, tmp_path)
    try:
        assert delegate(sock, "suspend", [], None) == 0
    finally:
        server.close()


def test_a_call_the_loop_fails_on_is_run_by_the_program_itself(sock: str, tmp_path: Path):
    def runner(program, args, resume_file, pid):
        raise RuntimeError("a bug in the loop")

    server = serve(sock, runner, tmp_path)
    try:
        with pytest.raises(NotServed, match="the reconcile loop ended before it answered"):
            delegate(sock, "resume", ["cpu-0"], None)
    finally:
        server.close()
    assert "failed in the loop: RuntimeError: a bug in the loop; the program runs it itself" in \
        (tmp_path / "reconcile.log").read_text()


def test_calls_run_at_once_side_by_side(sock: str, tmp_path: Path):
    server = serve(sock, lambda *a: time.sleep(0.6) or 0, tmp_path)
    codes: list[int] = []
    try:
        t0 = time.monotonic()
        threads = [threading.Thread(target=lambda: codes.append(delegate(sock, "resume", ["n"], None)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
    finally:
        server.close()
    assert codes == [0, 0, 0, 0]
    assert elapsed < 1.5, f"4 calls of 0.6 s took {elapsed:.2f} s: not run side by side"


def test_the_server_counts_the_calls_it_is_running(sock: str, tmp_path: Path):
    """running(): what a reconfigure waits for (livenodes.live.LiveNodes), a failed run included."""
    release = threading.Event()

    def runner(program, *rest):
        release.wait(10)
        if program == "suspend":
            raise RuntimeError("a bug")
        return 0

    server = serve(sock, runner, tmp_path)
    try:
        assert server.running() == 0
        answers: list[object] = []

        def call(program: str) -> None:
            try:
                answers.append(delegate(sock, program, ["n"], None))
            except NotServed:  # the run failed in the loop: the program would run it itself
                answers.append("not served")

        calls = [threading.Thread(target=call, args=(p,)) for p in ("resume", "suspend")]
        for t in calls:
            t.start()
        deadline = time.monotonic() + 5
        while server.running() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.running() == 2
        release.set()
        for t in calls:
            t.join(10)
        deadline = time.monotonic() + 5
        while server.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.running() == 0 and sorted(map(str, answers)) == ["0", "not served"]
    finally:
        server.close()


def test_a_caller_that_sends_nothing_is_dropped_after_the_read_timeout(sock: str, tmp_path: Path):
    """A connection that never sends its request does not hold a thread for ever."""
    server = ProgramServer(sock, lambda *a: 0, Log("reconcile", str(tmp_path / "reconcile.log")), read_timeout=0.3)
    assert server.start()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(3)
        conn.connect(sock)
        started = time.monotonic()
        try:
            assert conn.recv(64) == b""  # closed by the loop, unanswered
        finally:
            conn.close()
        assert time.monotonic() - started < 2
        assert delegate(sock, "resume", ["n"], None) == 0  # the next call is served as ever
    finally:
        server.close()
    assert "program call refused: unreadable request" in (tmp_path / "reconcile.log").read_text()


def test_calls_over_the_cap_start_no_thread_and_are_run_by_the_program_itself(sock: str, tmp_path: Path,
                                                                              monkeypatch):
    release = threading.Event()
    ran: list[str] = []

    def runner(program, args, *rest):
        ran.append(args[0])
        release.wait(10)
        return 0

    server = ProgramServer(sock, runner, Log("reconcile", str(tmp_path / "reconcile.log")), max_calls=1)
    assert server.start()
    try:
        first: list[object] = []
        t = threading.Thread(target=lambda: first.append(delegate(sock, "resume", ["a"], None)))
        t.start()
        deadline = time.monotonic() + 5
        while server.running() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        threads_before = threading.active_count()
        for _ in range(5):
            with pytest.raises(NotServed):  # closed unanswered (or reset): the program runs it itself
                delegate(sock, "resume", ["b"], None)
        assert threading.active_count() <= threads_before
        release.set()
        t.join(5)
        assert first == [0] and ran == ["a"]
        assert delegate(sock, "resume", ["c"], None) == 0  # its slot came back
    finally:
        release.set()
        server.close()
    assert "over the cap of 1" in (tmp_path / "reconcile.log").read_text()


def test_a_calls_slot_is_free_before_its_caller_hears_back(sock: str, tmp_path: Path):
    """A caller that calls again as soon as it has its answer finds the slot free: the slot is
    released before the reply is written, however slowly the release runs (a CI race once reset
    such a second call)."""

    class SlowSlots:
        def __init__(self):
            self.inner = threading.BoundedSemaphore(1)

        def acquire(self, blocking=True):
            return self.inner.acquire(blocking)

        def release(self):
            time.sleep(0.3)  # a release the scheduler runs late
            self.inner.release()

    server = ProgramServer(sock, lambda *a: 0, Log("reconcile", str(tmp_path / "reconcile.log")), max_calls=1)
    server.slots = SlowSlots()
    assert server.start()
    try:
        for _ in range(3):
            assert delegate(sock, "resume", ["a"], None) == 0
    finally:
        server.close()
    assert "over the cap" not in (tmp_path / "reconcile.log").read_text()


def test_a_warm_run_is_the_programs_run_logged_under_the_callers_pid(sock: str, tmp_path: Path):
    """runner_for runs the real run_suspend with a fresh Context per call; its log lines carry the
    pid of the program Slurm started, as if it had run them itself."""
    backend = FakeBackend()
    backend.workers["cpu-0"] = Worker("cpu-0", "Running")
    log_path = tmp_path / "elastic.log"

    def make_context(program, pid):
        return programs.Context({"SLURMK8S_BUDGET": "5"}, Log(program, str(log_path), pid=pid), backend=backend,
                                slurm=FakeSlurm())

    server = serve(sock, runner_for(make_context, programs.RUNS), tmp_path)
    try:
        assert delegate(sock, "suspend", ["cpu-0"], None) == 0
    finally:
        server.close()
    assert "cpu-0" not in backend.workers
    text = log_path.read_text()
    assert f"suspend[{os.getpid()}] run by the reconcile loop (warm)" in text
    assert f"suspend[{os.getpid()}] suspend 1 nodes: cpu-0" in text


def test_main_hands_the_call_to_the_loop_and_runs_it_itself_without_one(sock: str, tmp_path: Path, monkeypatch):
    log = tmp_path / "elastic.log"
    monkeypatch.setenv("SLURMK8S_LOG", str(log))
    monkeypatch.setenv("SLURMK8S_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("SLURMK8S_EVENTS", "")
    monkeypatch.setenv("SLURMK8S_LEDGER", "")
    monkeypatch.setenv("SLURMK8S_PROGRAM_SOCKET", sock)
    monkeypatch.setattr(sys, "argv", ["slurmk8s-suspend"])  # no nodes: nothing to do
    assert programs.suspend_main() == 0  # no loop: run here
    assert "suspend 0 nodes" in log.read_text()
    server = serve(sock, lambda *a: 5, tmp_path)
    try:
        assert programs.suspend_main() == 5  # the loop's answer
    finally:
        server.close()


# ---------------------------------------------------------------- PrologSlurmctld's wait, in the loop


def _inventory() -> Inventory:
    return Inventory((SlurmNode("cpu-0", "cpu", "cpu", 1, 1024), SlurmNode("cpu-1", "cpu", "cpu", 1, 1024),
                      SlurmNode("cpu-2", "cpu", "cpu", 1, 1024, unavailable="kubernetes node k-2 is cordoned"),
                      SlurmNode("gpu-0", "gpu", "gpu", 1, 1024)))


def _conf(tmp_path: Path) -> str:
    path = tmp_path / "slurm.conf"
    path.write_text("ClusterName=box\n")
    return str(path)


def test_an_early_resume_only_creates_and_leaves_every_other_decision_to_slurms_call(tmp_path: Path):
    """Unknown, unavailable and backed-off nodes are left alone; a failed create sets nothing DOWN
    and records no pool failure: Slurm's own resume call does all that, as always. Every node it
    creates is held at the boot gate until that call releases it."""
    ledger = str(tmp_path / "ledger.json")
    for i in range(3):  # pool gpu in backoff
        FileLedger(ledger).record_failure("gpu", "gpu-0", "ErrImagePull", time.time() - i)
    backend = FakeBackend(fail={"cpu-1": "Kubernetes API error 500"})
    slurm = FakeSlurm()
    gate = BootGate()
    log = Log("early-resume", str(tmp_path / "elastic.log"))
    env = {"SLURMK8S_BUDGET": "5", "SLURMK8S_LEDGER": ledger, "SLURM_CONF": _conf(tmp_path)}
    ctx = programs.Context(env, log, backend=backend, slurm=slurm, inventory=_inventory())
    assert run_early_resume(["12", "cpu-[0-2],gpu-0,nope-0"], ctx, gate).code == 0
    assert sorted(backend.calls) == [("create", "cpu-0"), ("create", "cpu-1")]
    assert set(backend.workers) == {"cpu-0"}
    assert gate.is_held("cpu-0") and gate.is_held("cpu-1") and not gate.is_held("cpu-2")
    assert slurm.down == {} and slurm.powered_down == []
    assert [f.node for f in FileLedger(ledger).load()["gpu"].failures] == ["gpu-0"] * 3  # nothing added
    assert "cpu" not in FileLedger(ledger).load()
    text = (tmp_path / "elastic.log").read_text()
    assert "early resume for job 12: cpu-0,cpu-1,cpu-2,gpu-0,nope-0" in text
    assert "left to Slurm's resume call: cpu-2,gpu-0,nope-0" in text
    assert "1 created; cpu-1 left to Slurm's resume call" in text
    # Slurm's resume call (as the loop serves it) opens the gate, keeps the pod made early and
    # retries the failed create
    backend.fail.clear()
    resume_log = tmp_path / "resume.log"
    resume = warm.runs(gate)["resume"]
    assert resume(["cpu-[0-1]"], programs.Context({"SLURMK8S_BUDGET": "5"}, Log("resume", str(resume_log)),
                                                  backend=backend, slurm=slurm, inventory=_inventory()),
                  None).code == 0
    assert not gate.is_held("cpu-0") and not gate.is_held("cpu-1")
    assert re.search(r"boot gate: released cpu-0 \(held \d+\.\d\ds\), cpu-1 \(held", resume_log.read_text())
    assert backend.calls[-1] == ("create", "cpu-1") and backend.calls.count(("create", "cpu-0")) == 1
    assert backend.lists == [["cpu-0", "cpu-1"]]  # Slurm's call read only its own nodes' workers


def test_without_a_boot_gate_nothing_is_created_early(tmp_path: Path):
    """A worker that cannot be held (no gate served) is left to Slurm's resume call entirely."""
    backend = FakeBackend()
    env = {"SLURMK8S_BUDGET": "5", "SLURM_CONF": _conf(tmp_path)}
    ctx = programs.Context(env, Log("early-resume", str(tmp_path / "elastic.log")), backend=backend,
                           slurm=FakeSlurm(), inventory=_inventory())
    assert run_early_resume(["12", "cpu-0"], ctx, None).code == 0
    assert backend.calls == []
    assert "no boot gate" in (tmp_path / "elastic.log").read_text()


def test_a_node_slurm_resumed_before_the_prologs_notice_is_neither_held_nor_created(tmp_path: Path):
    """The power-save pass can come before the prolog's notice: Slurm has the node POWERING_UP and
    its resume call creates the pod; holding it would keep its slurmd waiting for nothing."""
    backend = FakeBackend()
    gate = BootGate()
    gate.release(["cpu-1"])  # an earlier power-up of cpu-1, before the prolog read it powered down
    time.sleep(0.01)  # the prolog's read is passed on with 6 decimals: keep the three apart
    read_at = time.time()
    time.sleep(0.01)
    gate.release(["cpu-0"])  # this power-up's pass, after the read
    ctx = programs.Context({"SLURMK8S_BUDGET": "5", "SLURM_CONF": _conf(tmp_path)},
                           Log("early-resume", str(tmp_path / "elastic.log")), backend=backend, slurm=FakeSlurm(),
                           inventory=_inventory())
    assert run_early_resume(["12", "cpu-[0-1]", f"{read_at:.6f}"], ctx, gate).code == 0
    assert backend.calls == [("create", "cpu-1")]
    assert not gate.is_held("cpu-0") and gate.is_held("cpu-1")
    assert "resumed by Slurm already: cpu-0" in (tmp_path / "elastic.log").read_text()


def test_the_prolog_asks_the_loop_for_its_jobs_cold_nodes_and_waits_as_before(sock: str, tmp_path: Path,
                                                                             monkeypatch):
    backend = FakeBackend()
    elastic = tmp_path / "elastic.log"

    conf = _conf(tmp_path)
    gate = BootGate()

    def make_context(program, pid):
        return programs.Context({"SLURMK8S_BUDGET": "5", "SLURM_CONF": conf}, Log(program, str(elastic), pid=pid),
                                backend=backend, slurm=FakeSlurm(), inventory=_inventory())

    # the loop's shared sinfo: cpu-0 boots (its slurmd registers) the third time it is read
    reads = iter(["allocated#", "allocated#"])
    shared = prolog.SharedStates(read=lambda: [("cpu-0", next(reads, "allocated")), ("cpu-1", "allocated")])
    served = {**warm.runs(gate), "prolog": functools.partial(prolog.run_wait, states=shared)}
    server = serve(sock, runner_for(make_context, served), tmp_path)
    monkeypatch.setenv("SLURMK8S_LOG", str(elastic))
    monkeypatch.setenv("SLURMK8S_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("SLURMK8S_PROGRAM_SOCKET", sock)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cpu-[0-1]")
    monkeypatch.delenv("SLURMK8S_HEAD_START", raising=False)  # on by default (prolog_main)
    monkeypatch.setenv("SLURMK8S_PROLOG_TIMEOUT", "5")
    # cpu-0 powered down (allocated~), cpu-1 already up: only cpu-0 needs a pod
    monkeypatch.setattr(prolog, "named_states", lambda nodelist: [("cpu-0", "allocated~"), ("cpu-1", "allocated")])

    monkeypatch.setattr(prolog, "node_states", lambda nodelist: pytest.fail("the prolog polled sinfo itself"))
    try:
        assert prolog.prolog_main() == 0
    finally:
        server.close()
    assert backend.calls == [("create", "cpu-0")]
    assert gate.is_held("cpu-0")
    assert shared.reads >= 1
    text = elastic.read_text()
    assert "early resume for job 12: cpu-0" in text
    assert re.search(r"prolog\[\d+\] job 12 nodes cpu-\[0-1\]: booted after .*; pods of cpu-0 asked for early", text)


def test_without_a_loop_the_prolog_only_waits(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SLURMK8S_LOG", str(tmp_path / "elastic.log"))
    monkeypatch.setenv("SLURMK8S_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("SLURMK8S_PROGRAM_SOCKET", str(tmp_path / "absent.sock"))
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cpu-0")
    monkeypatch.setattr(prolog, "named_states", lambda nodelist: [("cpu-0", "allocated#")])
    polls = iter([["allocated#"], ["allocated"]])
    monkeypatch.setattr(prolog, "node_states", lambda nodelist: next(polls))
    assert prolog.prolog_main() == 0
    text = (tmp_path / "elastic.log").read_text()
    assert "booted after" in text and "asked for early" not in text and "early resume" not in text


def test_waiting_prologs_share_one_sinfo(tmp_path: Path):
    """However many jobs wait for their nodes, the loop asks slurmctld once per poll for all of
    them (issue #17 item 4: PrologSlurmctld's cost independent of how many jobs wait)."""
    booted_at = time.monotonic() + 0.6

    def read():
        state = "allocated" if time.monotonic() >= booted_at else "allocated#"
        return [(f"cpu-{i}", state) for i in range(64)]

    shared = prolog.SharedStates(read=read)
    ctx = lambda: programs.Context({}, Log("prolog", str(tmp_path / "elastic.log")))  # noqa: E731
    threads = [threading.Thread(target=prolog.run_wait, args=([str(i), f"cpu-{i}", "10", ""], ctx(), shared))
               for i in range(64)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    elapsed = time.monotonic() - t0
    lines = (tmp_path / "elastic.log").read_text().splitlines()
    assert len([line for line in lines if ": booted after " in line]) == 64, lines[:3]
    assert elapsed > 0.5, elapsed  # none saw its node booted before it was
    # about one read per 0.1 s for all 64 waiters (each polling itself: 64 reads per 0.1 s), however
    # long a loaded machine took to run the threads (a bound on the elapsed time flaked in a full run)
    assert shared.reads <= elapsed / prolog.PROLOG_POLL + 3, (shared.reads, elapsed)


def test_the_loops_gate_asks_slurm_on_the_prologs_shared_snapshot():
    gate = BootGate()
    served = warm.runs(gate)
    assert gate.state_of is not None and set(served) >= {"resume", "early-resume", "prolog"}


def test_the_head_start_can_be_turned_off(sock: str, tmp_path: Path, monkeypatch):
    """With SLURMK8S_HEAD_START=0 in the programs' environment the prolog asks for no early pods."""
    calls: list[str] = []
    server = serve(sock, lambda program, args, resume_file, pid: calls.append(program) or 0, tmp_path)
    monkeypatch.setenv("SLURMK8S_LOG", str(tmp_path / "elastic.log"))
    monkeypatch.setenv("SLURMK8S_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("SLURMK8S_PROGRAM_SOCKET", sock)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cpu-0")
    monkeypatch.setenv("SLURMK8S_HEAD_START", "0")
    monkeypatch.setattr(prolog, "named_states", lambda nodelist: [("cpu-0", "allocated~")])
    try:
        assert prolog.prolog_main() == 0
    finally:
        server.close()
    assert calls == ["prolog"]


def test_the_shared_sinfo_poller_outlives_a_read_that_raises():
    """A read that raises (sinfo's output not UTF-8, say) is a failed snapshot, not the end of the
    poller thread: the waiter of that snapshot gets None, the next one the states (before the fix
    the thread died and every later wait ran out its patience: each prolog waited ResumeTimeout)."""
    calls = iter([UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")])

    def read():
        err = next(calls, None)
        if err is not None:
            raise err
        return [("cpu-0", "allocated")]

    shared = prolog.SharedStates(read=read, poll=0.01, patience=2.0)
    assert shared.states_of("cpu-0") is None
    t0 = time.monotonic()
    assert shared.states_of("cpu-0") == ["allocated"]
    assert time.monotonic() - t0 < 1.0
    assert shared.read_errors == 1 and "UnicodeDecodeError" in shared.last_error
