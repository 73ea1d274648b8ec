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
from provisioner.elastic import warm
from provisioner.elastic.warm import NotServed, ProgramServer, delegate, runner_for
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


def test_the_prolog_waits_in_the_loop_on_the_shared_states(sock: str, tmp_path: Path, monkeypatch):
    """A prolog whose nodes are not up hands its wait to the loop, which answers once the shared
    snapshot shows them booted and writes the prolog's line under its pid; the prolog never polls."""
    elastic = tmp_path / "elastic.log"

    def make_context(program, pid):
        return programs.Context({"SLURMK8S_BUDGET": "5"}, Log(program, str(elastic), pid=pid))

    # the loop's shared sinfo: cpu-0 boots (its slurmd registers) the third time it is read
    reads = iter(["allocated#", "allocated#"])
    shared = prolog.SharedStates(read=lambda: [("cpu-0", next(reads, "allocated")), ("cpu-1", "allocated")])
    served = {**warm.runs(), "prolog": functools.partial(prolog.run_wait, states=shared)}
    server = serve(sock, runner_for(make_context, served), tmp_path)
    monkeypatch.setenv("SLURMK8S_LOG", str(elastic))
    monkeypatch.setenv("SLURMK8S_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("SLURMK8S_PROGRAM_SOCKET", sock)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cpu-[0-1]")
    monkeypatch.setenv("SLURMK8S_PROLOG_TIMEOUT", "5")
    monkeypatch.setattr(prolog, "named_states", lambda nodelist: [("cpu-0", "allocated#"), ("cpu-1", "allocated")])
    monkeypatch.setattr(prolog, "node_states", lambda nodelist: pytest.fail("the prolog polled sinfo itself"))
    try:
        assert prolog.prolog_main() == 0
    finally:
        server.close()
    assert shared.reads >= 3
    assert re.search(rf"prolog\[{os.getpid()}\] job 12 nodes cpu-\[0-1\]: booted after ", elastic.read_text())


def test_without_a_loop_the_prolog_polls_itself(tmp_path: Path, monkeypatch):
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
    assert "booted after" in text


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
    assert 0.5 < elapsed < 2.5, elapsed
    # about one read per 0.1 s for all 64 waiters (each polling itself: 64 reads per 0.1 s)
    assert shared.reads <= elapsed / prolog.PROLOG_POLL + 3, (shared.reads, elapsed)
