"""A suspended node's power-down ends once its worker is gone (elastic/powerdown.py), not at
SuspendTimeout: jobs that arrived meanwhile are scheduled at once instead of at Slurm's next
backfill or main pass."""

from __future__ import annotations

import pytest
from fakes.backend import FakeBackend
from fakes.clock import Clock
from fakes.slurm import FakeSlurm

from provisioner.elastic.backend import BackendError, Worker
from provisioner.elastic.powerdown import after_suspend, end_when_gone
from provisioner.elastic.programs import Context, run_suspend
from provisioner.logs import Log
from provisioner.slurm.commands import Scontrol, SlurmCommandError


def run(present, states, slurm=None, timeout=14.0, names=("cpu-0", "cpu-1"), **kw):
    clock, log, slurm = Clock(), Log("suspend"), slurm or FakeSlurm()
    ended = end_when_gone(list(names), present, states, slurm.end_power_down, log, timeout,
                          clock=clock, sleep=clock.sleep, **kw)
    return ended, slurm, log.lines, clock.now


def gone_after(polls: dict[str, int]):
    """present(): each node's worker is there for its first `polls[node]` looks."""
    seen: dict[str, int] = {}

    def present(names):
        there = []
        for n in names:
            seen[n] = seen.get(n, 0) + 1
            if seen[n] <= polls.get(n, 0):
                there.append(n)
        return there

    return present


def test_each_node_ends_its_power_down_as_soon_as_its_worker_is_gone():
    asked: list[list[str]] = []

    def states(names):
        asked.append(list(names))
        return ["idle%"] * len(names)

    ended, slurm, lines, waited = run(gone_after({"cpu-0": 1, "cpu-1": 3}), states)
    assert ended == ["cpu-0", "cpu-1"] and slurm.ended == ["cpu-0", "cpu-1"]
    assert asked == [["cpu-0"], ["cpu-1"]]  # sinfo only about the nodes just gone
    assert waited == 0.75  # three looks, 0.25 s apart
    assert any("power-down of cpu-0 ended 0.25s after" in line for line in lines), lines


def test_a_node_drained_or_already_powered_down_is_left_to_slurm():
    """RESUME would clear an operator's drain: only a node plainly powering down is touched."""
    state = {"cpu-0": "drained%", "cpu-1": "idle~", "cpu-2": "idle%"}
    ended, slurm, lines, _ = run(lambda names: [], lambda names: [state[n] for n in names],
                                 names=("cpu-0", "cpu-1", "cpu-2"))
    assert ended == slurm.ended == ["cpu-2"]
    assert any("power-down of cpu-0 (drained%) left to SuspendTimeout" in line for line in lines), lines
    assert not any("cpu-1" in line for line in lines)  # powered down already: nothing to say


def test_a_worker_still_there_near_suspend_timeout_is_left_to_slurm():
    ended, slurm, lines, waited = run(lambda names: list(names), lambda names: ["idle%"] * len(names), timeout=2.0)
    assert ended == [] and slurm.ended == []
    assert waited == 2.0
    assert lines[-1].endswith("power-down of cpu-0,cpu-1 left to SuspendTimeout: after 2.0s their workers are still there")


def test_a_reconfigure_due_ends_the_wait_at_once():
    """Issue 40 item 1: slurmctld's reconfigure waits, answering nothing, for this program to end;
    with the hold set (elastic/quiesce.py) the rest is left to SuspendTimeout after one look."""
    ended, slurm, lines, waited = run(gone_after({"cpu-0": 1, "cpu-1": 100}), lambda names: ["idle%"] * len(names),
                                      stop=lambda: True)
    assert ended == [] and waited == 0.0
    assert lines[-1].endswith("power-down of cpu-0,cpu-1 left to SuspendTimeout: a reconfigure is due "
                              "(slurmctld answers nothing during it until this program ends)"), lines


def test_failing_reads_wait_and_look_again():
    looks = iter([BackendError("*", "API timeout"), BackendError("*", "API timeout"), [], []])

    def present(names):
        got = next(looks)
        if isinstance(got, Exception):
            raise got
        return got

    answers = iter([None, ["idle%", "idle%"]])  # sinfo failing once
    ended, _, lines, waited = run(present, lambda names: next(answers))
    assert ended == ["cpu-0", "cpu-1"] and waited == 0.75
    assert sum("cannot list the workers (API timeout)" in line for line in lines) == 1, lines  # said once


def test_a_wait_ended_by_failing_reads_says_so():
    def present(names):
        raise BackendError("*", "Kubernetes API error 503")

    _, _, lines, _ = run(present, lambda names: ["idle%"] * len(names), timeout=1.0)
    assert lines[-1].endswith("left to SuspendTimeout: after 1.0s their workers could not be listed: "
                              "Kubernetes API error 503"), lines
    _, _, lines, _ = run(lambda names: [], lambda names: None, timeout=1.0)
    assert lines[-1].endswith("after 1.0s sinfo did not answer for them"), lines


def test_a_programming_error_is_not_taken_for_a_passing_api_error():
    with pytest.raises(TypeError):
        run(lambda names: 1 / None, lambda names: ["idle%"] * len(names))


def test_a_failing_scontrol_is_logged_and_slurms_timeout_still_applies():
    ended, _, lines, _ = run(lambda names: [], lambda names: ["idle%"] * len(names), slurm=FakeSlurm(fail=True))
    assert ended == []
    for node in ("cpu-0", "cpu-1"):  # tried alone after the joint call failed
        assert any(f"could not end the power-down of {node} (" in line and "at SuspendTimeout" in line
                   for line in lines), lines


def test_a_node_slurm_refuses_does_not_cost_the_others_their_end():
    """Slurm applies an update to the nodes it can and fails the call (e.g. a node whose
    SuspendTimeout passed meanwhile): each node is then tried alone."""

    class Refusing(FakeSlurm):
        def end_power_down(self, names):
            if "cpu-1" in names:
                raise SlurmCommandError("scontrol: error: Invalid node state transition requested")
            super().end_power_down(names)

    ended, slurm, lines, _ = run(lambda names: [], lambda names: ["idle%"] * len(names), slurm=Refusing(),
                                 names=("cpu-0", "cpu-1", "cpu-2"))
    assert ended == slurm.ended == ["cpu-0", "cpu-2"]
    assert any("could not end the power-down of cpu-1 (" in line for line in lines), lines


def test_the_wait_ends_before_suspend_timeout_counted_from_the_runs_start(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("SuspendTimeout=15\n")
    clock = Clock()
    c = Context({"SLURM_CONF": str(conf)}, Log("suspend"), backend=FakeBackend(workers={"cpu-0": Worker("cpu-0", "Running")}),
                slurm=FakeSlurm(), clock=clock, sleep=clock.sleep)
    clock.now = 3.0  # the deletions took 3 s
    assert after_suspend(c, ["cpu-0"]) == []
    assert clock.now == 3.0 + 11.0  # 15 s less the 1 s margin, less the 3 s already spent
    conf.write_text("# SuspendTimeout not set: Slurm's 30 s\n")
    clock.now = 0.0
    after_suspend(c, ["cpu-0"])
    assert clock.now == 29.0


def test_suspend_ends_the_power_down_of_the_nodes_whose_workers_it_removed(tmp_path):
    class FailingDelete(FakeBackend):
        def delete(self, name: str, uid: str | None = None, force: bool = False,
                   version: str | None = None) -> None:
            if name == "cpu-1":
                raise BackendError(name, "pod deletion refused (403)")
            super().delete(name)

    conf = tmp_path / "slurm.conf"
    conf.write_text("SuspendTimeout=15\n")
    backend = FailingDelete(workers={n: Worker(n, "Running") for n in ("cpu-0", "cpu-1")})
    slurm = FakeSlurm()
    clock = Clock()
    result = run_suspend(["cpu-[0-2]"], Context({"SLURMK8S_BUDGET": "5", "SLURM_CONF": str(conf)}, Log("suspend"),
                                                backend=backend, slurm=slurm, clock=clock, sleep=clock.sleep))
    assert result.code == 1 and set(slurm.down) == {"cpu-1"}
    # cpu-1, whose worker stays, is Slurm's (DOWN); cpu-2 had no worker (refused for backoff, or
    # gone missing, then POWER_DOWN_FORCE): SuspendTimeout paces its next attempt, as before
    assert slurm.ended == ["cpu-0"]


def test_scontrol_ends_a_power_down_with_resume_and_reads_states_in_order(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    asked = tmp_path / "asked"
    for name, script in {
        "scontrol": f'echo "$@" >> {calls}',
        # a node in two partitions is listed twice with -N
        "sinfo": f'echo "$@" > {asked}; echo "cpu-1 idle%"; echo "cpu-0 drained%"; echo "cpu-1 idle%"',
    }.items():
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
    control = Scontrol(scontrol=str(tmp_path / "scontrol"))
    control.end_power_down(["cpu-0", "cpu-1"])
    assert calls.read_text().split() == ["update", "nodename=cpu-[0-1]", "state=RESUME"]
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert control.node_states(["cpu-0", "cpu-1"]) == ["drained%", "idle%"]
    assert asked.read_text().split() == ["-h", "-N", "-n", "cpu-[0-1]", "-o", "%N", "%T"]
    assert control.node_states(["cpu-0", "cpu-9"]) is None  # sinfo left one out
