"""The pool backoff as the programs and the reconcile loop keep it together (issue #16 item 1): a
failure counts once per attempt (per pod uid), only a node that had a pod counts at ResumeFailProgram,
a refusal is never a failure, a refused node goes back to powered-down idle at once, and after the
cooling-off one trial resume goes through (half-open) whose success clears the backoff.

Real time with the clock moved where a test needs Slurm's ResumeTimeout to pass (``later``)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from fakes.backend import FakeBackend
from fakes.slurm import FakeSlurm, FakeSlurmClient

from provisioner.elastic.backend import Worker
from provisioner.elastic.ledger import FileLedger, Policy, backoff_until
from provisioner.elastic.programs import Context, run_resume, run_resume_fail
from provisioner.inventory import Inventory, SlurmNode
from provisioner.logs import Log
from provisioner.reconcile.act import run_once

POLICY = Policy()  # what the programs use without SLURMK8S_BACKOFF_*: 3 failures / 600 s, 300 s cooling-off


def inventory(n: int = 8) -> Inventory:
    return Inventory(tuple(SlurmNode(f"cpu-{i}", "cpu", "cpu", 2, 1024) for i in range(n)))


@pytest.fixture
def ledger_path(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.json")


def ctx(ledger_path: str, backend: FakeBackend, slurm: FakeSlurm | None = None) -> Context:
    return Context({"SLURMK8S_LEDGER": ledger_path}, Log("test"), backend=backend, slurm=slurm or FakeSlurm(),
                   inventory=inventory())


def seed(ledger_path: str, *ats: float) -> None:
    for i, at in enumerate(ats):
        FileLedger(ledger_path).record_failure("cpu", f"cpu-{i}", "slurmk8s stuck-pending: ErrImagePull", at)


def failures(ledger_path: str) -> list[str]:
    history = FileLedger(ledger_path).load().get("cpu")
    return [f.node for f in history.failures] if history else []


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the programs' wall clock `seconds` ahead (time.time; the budget uses time.monotonic)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def slurm_node(name: str, *state: str, boot: float = 0.0) -> dict:
    return {"name": name, "state": list(state), "reason": "", "partitions": ["cpu"],
            "boot_time": {"set": True, "infinite": False, "number": int(boot)},
            "slurmd_start_time": {"set": True, "infinite": False, "number": 0}}


def test_a_node_refused_for_backoff_and_handed_to_resume_fail_is_not_a_new_failure(ledger_path, monkeypatch):
    now = time.time()
    seed(ledger_path, now - 30, now - 20, now - 10)
    until = backoff_until(FileLedger(ledger_path).load()["cpu"], now, POLICY)
    backend, slurm = FakeBackend(), FakeSlurm()
    run_resume(["cpu-5"], ctx(ledger_path, backend, slurm), None)
    assert backend.calls == [] and slurm.down["cpu-5"].startswith("slurmk8s backoff: pool cpu")
    # Slurm hands every node still powering up at ResumeTimeout to ResumeFailProgram, the refused one too
    later(monkeypatch, 300)
    run_resume_fail(["cpu-5"], ctx(ledger_path, backend))
    assert failures(ledger_path) == ["cpu-0", "cpu-1", "cpu-2"], "a refusal became a failure"
    assert backoff_until(FileLedger(ledger_path).load()["cpu"], now, POLICY) == until, "the backoff was extended"


def test_a_failed_create_counts_once_though_resume_fail_sees_the_node_again(ledger_path, monkeypatch):
    backend = FakeBackend(fail={"cpu-0": "image slurmd:nope not found"})
    run_resume(["cpu-0"], ctx(ledger_path, backend), None)
    assert failures(ledger_path) == ["cpu-0"]
    later(monkeypatch, 300)  # ResumeTimeout: no pod was ever made for this attempt
    run_resume_fail(["cpu-0"], ctx(ledger_path, backend))
    assert failures(ledger_path) == ["cpu-0"], "one failed attempt counted twice"


class GracefulBackend(FakeBackend):
    """Deletion as the API server does it for a running pod: Terminating first, gone later."""

    def delete(self, name: str, uid: str | None = None, force: bool = False, version: str | None = None) -> None:
        self.calls.append(("delete", name))
        if name in self.workers:
            self.workers[name] = replace(self.workers[name], phase="Terminating")


def test_a_pod_counted_by_the_loop_is_not_counted_again_by_resume_fail(ledger_path, monkeypatch):
    t0 = time.time()
    backend = GracefulBackend({"cpu-0": Worker("cpu-0", "Pending", "ErrImageNeverPull: no image", created_at=t0,
                                               uid="uid-a")})
    booting = slurm_node("cpu-0", "ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP")
    run_once(FakeSlurmClient(nodes=[booting]), backend, inventory(), FileLedger(ledger_path, POLICY), t0 + 90,
             Log("reconcile-test"), POLICY)
    assert failures(ledger_path) == ["cpu-0"] and backend.workers["cpu-0"].phase == "Terminating"
    later(monkeypatch, 300)  # ResumeTimeout while pod uid-a is still terminating
    run_resume_fail(["cpu-0"], ctx(ledger_path, backend))
    assert failures(ledger_path) == ["cpu-0"], "pod uid-a counted by the loop and again by resume-fail"


def test_another_pod_of_the_same_node_is_another_attempt(ledger_path):
    t0 = time.time()
    backend = FakeBackend({"cpu-0": Worker("cpu-0", "Pending", "Unschedulable: 0/3 nodes", created_at=t0, uid="a")})
    run_resume_fail(["cpu-0"], ctx(ledger_path, backend))
    backend.workers["cpu-0"] = Worker("cpu-0", "Pending", "Unschedulable: 0/3 nodes", created_at=t0 + 1, uid="b")
    run_resume_fail(["cpu-0"], ctx(ledger_path, backend))
    assert failures(ledger_path) == ["cpu-0", "cpu-0"]


def test_a_node_refused_for_backoff_is_powered_down_not_held_down_until_resume_timeout(ledger_path):
    now = time.time()
    seed(ledger_path, now - 30, now - 20, now - 10)
    slurm = FakeSlurm()
    context = ctx(ledger_path, FakeBackend(), slurm)
    result = run_resume(["cpu-[4-5]", "ghost-1"], context, None)
    assert result.code == 1
    assert set(slurm.down) == {"cpu-4", "cpu-5", "ghost-1"}  # DOWN with the reason: the jobs requeue now
    # POWER_DOWN_FORCE after DOWN: Slurm drops POWERING_UP (no ResumeTimeout wait, no ResumeFailProgram),
    # suspends the node and, with idle_on_node_suspend, has it idle~ again after SuspendTimeout
    assert sorted(slurm.powered_down) == ["cpu-4", "cpu-5"]  # an unknown node is left to ResumeTimeout
    # the line the Docker test bed and operators look for (tests/integration/test_reconcile_testbed.py)
    assert any(line.endswith("powered down cpu-4,cpu-5 (refused for backoff)") for line in context.log.lines)


def test_after_the_cooloff_one_trial_resume_goes_through_and_its_success_clears_the_backoff(ledger_path):
    now = time.time()
    seed(ledger_path, now - 330, now - 320, now - 310)  # cooled off 10 s ago
    backend, slurm = FakeBackend(), FakeSlurm()
    run_resume(["cpu-[3-6]"], ctx(ledger_path, backend, slurm), None)
    assert backend.calls == [("create", "cpu-3")], "half-open: one trial, not the whole pool"
    assert set(slurm.down) == {"cpu-4", "cpu-5", "cpu-6"}
    assert all("cpu-3 is the trial resume" in r for r in slurm.down.values()), slurm.down
    slurm = FakeSlurm()
    run_resume(["cpu-7"], ctx(ledger_path, backend, slurm), None)  # a later call while the trial runs
    assert "cpu-7" not in backend.workers and "trial resume of cpu-3 in progress" in slurm.down["cpu-7"]
    # the trial's node boots: the loop sees its worker up on an up node and clears the pool's history
    up = slurm_node("cpu-3", "IDLE", "CLOUD", boot=now - 5)
    run_once(FakeSlurmClient(nodes=[up]), backend, inventory(), FileLedger(ledger_path, POLICY), time.time() + 1,
             Log("reconcile-test"), POLICY)
    assert failures(ledger_path) == []
    slurm = FakeSlurm()
    run_resume(["cpu-[4-7]"], ctx(ledger_path, backend, slurm), None)
    assert set(backend.workers) == {"cpu-3", "cpu-4", "cpu-5", "cpu-6", "cpu-7"} and not slurm.down


def test_a_failed_trial_opens_the_backoff_again(ledger_path):
    now = time.time()
    seed(ledger_path, now - 330, now - 320, now - 310)
    backend, slurm = FakeBackend(fail={"cpu-3": "image slurmd:nope not found"}), FakeSlurm()
    run_resume(["cpu-[3-4]"], ctx(ledger_path, backend, slurm), None)
    assert backend.calls == [("create", "cpu-3")] and "trial" in slurm.down["cpu-4"]
    slurm = FakeSlurm()
    run_resume(["cpu-5"], ctx(ledger_path, backend, slurm), None)
    assert backend.calls == [("create", "cpu-3")]
    assert "4 consecutive resume failures" in slurm.down["cpu-5"] and "refused for 300s more" in slurm.down["cpu-5"]


def test_a_pod_of_a_node_on_a_cordoned_kubernetes_node_is_no_failure_at_resume_fail(ledger_path):
    """Its pod waited on a node that must not take pods (cordoned, NotReady, leaving): the pool's
    image and spec are fine, so Slurm's ResumeTimeout on it never backs the pool off (#14)."""
    t0 = time.time()
    backend = FakeBackend({"cpu-0": Worker("cpu-0", "Pending", "Unschedulable: 0/3 nodes", created_at=t0, uid="a")})
    cordoned = Inventory((SlurmNode("cpu-0", "cpu", "cpu", 2, 1024, k8s_node="k-0",
                                    unavailable="kubernetes node k-0 is cordoned"),))
    context = Context({"SLURMK8S_LEDGER": ledger_path}, Log("test"), backend=backend, slurm=FakeSlurm(),
                      inventory=cordoned)
    run_resume_fail(["cpu-0"], context)
    assert failures(ledger_path) == []


def test_a_node_refused_as_unavailable_is_powered_down_at_once_and_no_failure(ledger_path):
    """A node whose Kubernetes node is cordoned is refused (DOWN: its job requeues) and powered down
    at once, so it is idle~ (then drained by the loop) instead of DOWN+POWERING_UP until ResumeTimeout:
    seen in e2e, where an uncordoned node stayed out of service that long."""
    slurm, backend = FakeSlurm(), FakeBackend()
    cordoned = Inventory((SlurmNode("cpu-0", "cpu", "cpu", 2, 1024, k8s_node="k-0",
                                    unavailable="kubernetes node k-0 is cordoned"),))
    context = Context({"SLURMK8S_LEDGER": ledger_path}, Log("test"), backend=backend, slurm=slurm, inventory=cordoned)
    run_resume(["cpu-0"], context, None)
    assert backend.calls == [] and slurm.down["cpu-0"] == "slurmk8s unavailable: kubernetes node k-0 is cordoned"
    assert slurm.powered_down == ["cpu-0"]
    assert failures(ledger_path) == []
    # the line the Docker test bed and operators look for (tests/integration/test_reconcile_testbed.py)
    assert any(line.endswith("powered down cpu-0 (refused for unavailable)") for line in context.log.lines)
