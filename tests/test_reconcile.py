"""Unit tests for the reconcile loop: the pure classifier (every Kind), the action table, run_once
with fakes (recorded argv), the pool backoff and its ledger, the resume program's refusal, the
events file, the metrics and the dashboard's queries. No Docker, no Slurm."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from factories import node as k8s_node
from fakes.backend import FakeBackend
from fakes.ledger import MemoryLedger
from fakes.slurm import FakeSlurm, FakeSlurmClient

from provisioner.config import parse_spec
from provisioner.elastic import programs
from provisioner.elastic.backend import BackendError, Worker
from provisioner.elastic.events import DEFAULT_EVENTS, EventTail
from provisioner.elastic.ledger import (
    DEFAULT_LEDGER,
    Failure,
    FileLedger,
    LedgerError,
    Policy,
    PoolHistory,
    backoff_until,
    pool_gates,
)
from provisioner.elastic.plan import Reason
from provisioner.elastic.programs import Context, run_resume, run_resume_fail, run_suspend
from provisioner.logs import Log
from provisioner.inventory import Inventory, SlurmNode, build_inventory, nodes_from_api
from provisioner.reconcile.act import Report, run_once
from provisioner.reconcile.classify import ACTIONS, Finding, Kind, Op, RestartWatch, Snapshot, classify
from provisioner.reconcile.main import _deployment_id
from provisioner.reconcile.metrics import Metrics, dashboard_queries, exported_names, metric_catalog, metrics_markdown
from provisioner.reconcile.usage import Usage, UsageFile, resume_usage
from provisioner.slurm.commands import SlurmCommandError
from provisioner.slurm.state import JobStatus, _num, parse_jobs, parse_nodes, running_since

NOW = 1_800_000_000.0
POLICY = Policy(grace=20, pending_timeout=60, unschedulable_timeout=180, backoff_failures=3,
                backoff_window=600, backoff_cooloff=300)
DASHBOARD = Path(__file__).resolve().parents[1] / "charts" / "dashboards" / "slurmk8s.json"


def inventory(n: int = 4, pool: str = "cpu") -> Inventory:
    return Inventory(tuple(SlurmNode(f"{pool}-{i}", pool, pool, 2, 1024) for i in range(n)))


def node_json(name: str, *state: str, reason: str = "", boot: float | None = None) -> dict:
    obj = {"name": name, "state": list(state), "reason": reason, "partitions": ["cpu"],
           "boot_time": {"set": True, "infinite": False, "number": int(boot or 0)},
           "slurmd_start_time": {"set": True, "infinite": False, "number": 0}}
    return obj


def powered_down(name: str, **kw) -> dict:
    return node_json(name, "IDLE", "CLOUD", "POWERED_DOWN", **kw)


def up(name: str, base: str = "ALLOCATED", boot: float = NOW - 600, **kw) -> dict:
    return node_json(name, base, "CLOUD", boot=boot, **kw)


def worker(name: str, phase: str = "Running", reason: str = "", age: float = 300) -> Worker:
    return Worker(name, phase, reason, created_at=NOW - age)


def snap(nodes: list[dict], workers: list[Worker] = (), inv: Inventory | None = None,
         history: dict[str, PoolHistory] | None = None) -> Snapshot:
    return Snapshot(parse_nodes({"nodes": nodes}), {w.name: w for w in workers}, inv or inventory(),
                    history or {})


def kinds(s: Snapshot, now: float = NOW, policy: Policy = POLICY) -> dict[str, Kind]:
    return {f.node: f.kind for f in classify(s, now, policy)}


def only(s: Snapshot, name: str) -> Finding:
    [f] = [f for f in classify(s, NOW, POLICY) if f.node == name]
    return f


# ---------------------------------------------------------------- parsing


def test_parse_nodes_reads_24_11_numbers_and_state_lists():
    [n] = parse_nodes({"nodes": [{"name": "a", "state": ["MIXED", "CLOUD"], "reason": "",
                                  "boot_time": {"set": True, "infinite": False, "number": 100},
                                  "slurmd_start_time": {"set": True, "infinite": False, "number": 120},
                                  "partitions": ["cpu"]}]}).values()
    assert n.state == {"MIXED", "CLOUD"} and n.booted_at == 120 and n.busy and n.summary == "mixed"
    [c] = parse_nodes({"nodes": [node_json("c", "ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP")]}).values()
    assert not c.busy and c.summary == "powering_up"  # allocated, but no worker has booted yet
    [p] = parse_nodes({"nodes": [powered_down("b")]}).values()
    assert p.powered_down and p.booted_at is None and p.summary == "powered_down"
    assert _num({"set": False, "number": 5}) is None and _num({"set": True, "infinite": True}) is None


def test_parse_jobs_configuring_counts_as_pending():
    jobs = parse_jobs({"jobs": [
        {"job_id": 1, "partition": "cpu", "job_state": ["RUNNING", "CONFIGURING"],
         "submit_time": {"set": True, "number": 10}, "start_time": {"set": True, "number": 12}},
        {"job_id": 2, "partition": "cpu", "job_state": ["RUNNING"]}]})
    assert [(j.job_id, j.state) for j in jobs] == [(1, "PENDING"), (2, "RUNNING")]
    assert jobs[0].submit_time == 10 and jobs[1].start_time is None


# ---------------------------------------------------------------- classes


def test_agreeing_pairs_are_ok():
    s = snap([powered_down("cpu-0"), up("cpu-1"), up("cpu-2", "IDLE")],
             [worker("cpu-1"), worker("cpu-2")])
    assert kinds(s) == {"cpu-0": Kind.OK, "cpu-1": Kind.OK, "cpu-2": Kind.OK}
    assert all(not f.ops for f in classify(s, NOW, POLICY))


def test_orphan_worker_not_in_inventory():
    s = snap([powered_down("cpu-0")], [worker("stray-9")])
    f = only(s, "stray-9")
    assert f.kind == Kind.ORPHAN_WORKER and "no node in the inventory" in f.detail
    assert f.ops == (Op.DELETE_WORKER,)


def test_orphan_worker_for_inventory_node_unknown_to_slurm():
    s = snap([], [worker("cpu-3")])
    assert only(s, "cpu-3").kind == Kind.ORPHAN_WORKER
    assert "Slurm's nodes" in only(s, "cpu-3").detail


def test_new_orphan_within_grace_is_left_for_now():
    s = snap([], [worker("stray-9", age=5)])
    assert only(s, "stray-9").kind == Kind.OK


def test_worker_for_powered_down_node():
    s = snap([powered_down("cpu-0")], [worker("cpu-0", age=60)])
    f = only(s, "cpu-0")
    assert f.kind == Kind.WORKER_FOR_POWERED_DOWN_NODE and "POWERED_DOWN" in f.detail
    assert f.ops == (Op.DELETE_WORKER,)


def test_worker_for_powering_up_or_down_node_or_within_grace_is_ok():
    s = snap([node_json("cpu-0", "IDLE", "CLOUD", "POWERED_DOWN", "POWERING_UP"),
              node_json("cpu-1", "IDLE", "CLOUD", "POWERING_DOWN"), powered_down("cpu-2")],
             [worker("cpu-0", age=60), worker("cpu-1", age=60), worker("cpu-2", age=5)])
    assert set(kinds(s).values()) == {Kind.OK}


def test_terminating_worker_of_powered_down_node_is_ok():
    s = snap([powered_down("cpu-0")], [worker("cpu-0", "Terminating", age=60)])
    assert only(s, "cpu-0").kind == Kind.OK


def test_missing_worker_of_allocated_node():
    s = snap([up("cpu-1", "ALLOCATED")], [])
    f = only(s, "cpu-1")
    assert f.kind == Kind.MISSING_WORKER
    assert f.ops == (Op.SET_DOWN, Op.POWER_DOWN)
    assert "pod cpu-1 is gone" in f.down_reason and f.down_reason.startswith("slurmk8s missing-worker:")


def test_missing_worker_also_when_its_pod_terminates_and_an_idle_nodes_is_only_powered_down():
    """With no job on the node nothing needs requeueing: an idle node whose worker is gone (or going,
    no one saying why) is suspended (POWER_DOWN_FORCE), never set DOWN."""
    s = snap([up("cpu-1", "IDLE"), up("cpu-2"), up("cpu-3", "IDLE")], [worker("cpu-2", "Terminating"),
                                                                         worker("cpu-3", "Terminating")])
    assert kinds(s) == {"cpu-1": Kind.IDLE_WORKER_GONE, "cpu-2": Kind.MISSING_WORKER, "cpu-3": Kind.IDLE_WORKER_GONE}
    assert only(s, "cpu-1").ops == (Op.POWER_DOWN,)


def test_a_worker_gone_between_two_passes_is_still_named_by_who_took_it():
    """The watch saw the pod's last state (a scheduler preemption's DisruptionTarget) before it went:
    the finding names the cause, busy or idle, and is no pool failure."""
    cause = "Kubernetes: PreemptionByScheduler: hi-prio: preempting to accommodate a higher priority pod"
    s = Snapshot(parse_nodes({"nodes": [up("cpu-1"), up("cpu-2", "IDLE")]}), {}, inventory(), {},
                 {"cpu-1": (NOW - 60, 9)}, taken_gone={"cpu-1": cause, "cpu-2": cause})
    assert kinds(s) == {"cpu-1": Kind.WORKER_TAKEN, "cpu-2": Kind.IDLE_WORKER_TAKEN}
    assert only(s, "cpu-1").down_reason.startswith("slurmk8s worker-taken: pod cpu-1 taken away under job 9: "
                                                   "Kubernetes: PreemptionByScheduler")


def test_a_node_an_operator_set_fail_is_left_alone_without_its_pod_unless_a_job_runs_there():
    # powering it down would clear the FAIL (idle_on_node_suspend); a job on it must still requeue
    s = snap([node_json("cpu-1", "IDLE", "CLOUD", "FAIL", boot=NOW - 600),
              node_json("cpu-2", "ALLOCATED", "CLOUD", "FAIL", boot=NOW - 600)], [])
    assert kinds(s) == {"cpu-1": Kind.OK, "cpu-2": Kind.MISSING_WORKER}
    assert "FAIL set by an operator" in only(s, "cpu-1").detail


def test_missing_worker_not_judged_right_after_boot():
    s = snap([up("cpu-1", boot=NOW - 3)], [])
    assert only(s, "cpu-1").kind == Kind.OK


def test_missing_worker_not_for_powering_or_powered_down_nodes_nor_foreign_nodes():
    s = snap([node_json("cpu-0", "ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP"),
              node_json("cpu-1", "IDLE", "CLOUD", "POWERING_DOWN"), powered_down("cpu-2"),
              up("other-0")], [])
    assert set(kinds(s).values()) == {Kind.OK}


@pytest.mark.parametrize("reason", ["ErrImagePull: pull access denied", "ImagePullBackOff: Back-off pulling",
                                    "ErrImageNeverPull: image not present", "CreateContainerConfigError: no secret"])
def test_stuck_pending_image_and_config_errors(reason):
    s = snap([node_json("cpu-0", "ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP")],
             [worker("cpu-0", "Pending", reason, age=61)])
    f = only(s, "cpu-0")
    assert f.kind == Kind.STUCK_PENDING and reason.split(":")[0] in f.down_reason
    assert f.ops == (Op.DELETE_WORKER, Op.SET_DOWN, Op.RECORD_FAILURE)


def test_stuck_pending_bounds():
    nodes = [node_json("cpu-0", "ALLOCATED", "CLOUD", "POWERING_UP")]
    young = snap(nodes, [worker("cpu-0", "Pending", "ErrImagePull: x", age=59)])
    assert only(young, "cpu-0").kind == Kind.OK
    unsched = "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."
    assert only(snap(nodes, [worker("cpu-0", "Pending", unsched, age=120)]), "cpu-0").kind == Kind.OK
    assert only(snap(nodes, [worker("cpu-0", "Pending", unsched, age=181)]), "cpu-0").kind == Kind.STUCK_PENDING
    # plain Pending (ContainerCreating, no reason) is never stuck by this rule
    assert only(snap(nodes, [worker("cpu-0", "Pending", "", age=1000)]), "cpu-0").kind == Kind.OK


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_worker_failed(phase):
    s = snap([up("cpu-1")], [worker("cpu-1", phase, "Error (exit 1)")])
    f = only(s, "cpu-1")
    assert f.kind == Kind.WORKER_FAILED and "Error (exit 1)" in f.down_reason
    assert f.ops == (Op.DELETE_WORKER, Op.SET_DOWN, Op.RECORD_FAILURE)


def test_young_failed_worker_gets_the_grace_period():
    # a Docker container between create and start lists as "created" -> phase Failed (seen in the test bed)
    s = snap([node_json("cpu-1", "ALLOCATED", "CLOUD", "POWERING_UP")], [worker("cpu-1", "Failed", "Created", age=1)])
    assert only(s, "cpu-1").kind == Kind.OK


def test_down_by_us_without_worker_is_powered_down_then_returned():
    s = snap([node_json("cpu-0", "DOWN", "CLOUD", reason="slurmk8s missing-worker: pod cpu-0 is gone"),
              node_json("cpu-1", "DOWN", "CLOUD", "POWERED_DOWN", reason="slurmk8s resume: image missing"),
              node_json("cpu-2", "DOWN", "CLOUD", "POWERED_DOWN", "POWERING_UP", reason="slurmk8s resume: x")], [])
    k = kinds(s)
    assert k["cpu-0"] == Kind.DOWN_WORKER_GONE and ACTIONS[Kind.DOWN_WORKER_GONE] == (Op.POWER_DOWN,)
    assert k["cpu-1"] == Kind.DOWN_POWERED_DOWN and ACTIONS[Kind.DOWN_POWERED_DOWN] == (Op.RETURN_TO_SERVICE,)
    assert k["cpu-2"] == Kind.OK  # powering up: Slurm's ResumeTimeout and resume-fail handle it


def test_a_down_powered_down_node_drained_by_a_cordon_is_resumed_only_once_uncordoned():
    """state=RESUME clears DOWN and DRAIN together: on a node slurmk8s set DOWN whose Kubernetes
    node is cordoned (drained by the cordon; Slurm keeps one reason, slurmk8s's DOWN one, so the
    drain pass cannot tell the drain is its own), the RESUME left it idle and undrained until the
    next pass, and a job could land on a node that cannot start (issue 40, read-only finding). It
    waits while the inventory says the node is unavailable; once uncordoned, RESUME clears both."""
    import dataclasses

    base = inventory()
    cordoned = Inventory(tuple(dataclasses.replace(n, unavailable="kubernetes node k-1 is cordoned")
                               if n.name == "cpu-1" else n for n in base.nodes))
    down = node_json("cpu-1", "DOWN", "DRAIN", "CLOUD", "POWERED_DOWN", reason="slurmk8s resume: pod cannot start")
    f = only(snap([down], [], inv=cordoned), "cpu-1")
    assert f.kind == Kind.OK and "cordoned" in f.detail and f.ops == (), f
    assert only(snap([down], [], inv=base), "cpu-1").ops == (Op.RETURN_TO_SERVICE,)  # uncordoned


def test_down_by_an_admin_is_left_alone():
    s = snap([node_json("cpu-0", "DOWN", "CLOUD", reason="bad DIMM, ticket 42"),
              node_json("cpu-1", "DOWN", "CLOUD", "POWERED_DOWN", reason="maintenance")], [])
    assert set(kinds(s).values()) == {Kind.OK}


def test_pool_backoff_and_recovery_findings():
    failures = tuple(Failure(f"cpu-{i}", NOW - 100 + i, "ErrImagePull") for i in range(3))
    history = {"cpu": PoolHistory(failures)}
    s = snap([up("cpu-1")], [worker("cpu-1", age=300)], history=history)
    found = classify(s, NOW, POLICY)
    [b] = [f for f in found if f.kind == Kind.POOL_BACKOFF]
    assert b.node == "cpu" and "3 consecutive resume failures" in b.detail and b.ops == ()
    # the worker predates the failures: no recovery; one created after them that runs: recovered
    assert only(s, "cpu-1").kind == Kind.OK
    s2 = snap([up("cpu-1")], [worker("cpu-1", age=10)], history=history)
    assert only(s2, "cpu-1").kind == Kind.POOL_RECOVERED and ACTIONS[Kind.POOL_RECOVERED] == (Op.RECORD_SUCCESS,)


def test_every_kind_has_an_action_row_and_every_op_is_used():
    assert set(ACTIONS) == set(Kind)
    assert {op for ops in ACTIONS.values() for op in ops} == set(Op)


# ---------------------------------------------------------------- backoff rule and ledgers


def hist(*ats: float, last_success: float | None = None) -> PoolHistory:
    return PoolHistory(tuple(Failure(f"n{i}", at, "x") for i, at in enumerate(ats)), last_success)


def test_backoff_needs_n_failures_within_the_window_after_the_last_success():
    assert backoff_until(hist(NOW - 30, NOW - 20), NOW, POLICY) is None
    assert backoff_until(hist(NOW - 30, NOW - 20, NOW - 10), NOW, POLICY) == NOW - 10 + 300
    assert backoff_until(hist(NOW - 900, NOW - 20, NOW - 10), NOW, POLICY) is None  # one out of the window
    assert backoff_until(hist(NOW - 30, NOW - 20, NOW - 10, last_success=NOW - 25), NOW, POLICY) is None
    assert backoff_until(hist(NOW - 330, NOW - 320, NOW - 310), NOW, POLICY) is None  # cooled off


def test_memory_ledger_counts_an_attempt_once_and_success_resets():
    led = MemoryLedger(POLICY)
    led.record_failure("cpu", "cpu-0", "stuck", NOW, "uid-a")
    led.record_failure("cpu", "cpu-0", "resume-failed", NOW + 300, "uid-a")  # same pod, seen by resume-fail
    led.record_failure("cpu", "cpu-1", "create refused", NOW + 61)  # no pod: always its own attempt
    assert [f.node for f in led.load()["cpu"].failures] == ["cpu-0", "cpu-1"]
    led.record_failure("cpu", "cpu-0", "again", NOW + 200, "uid-b")  # the node's next pod: a later attempt
    assert len(led.load()["cpu"].failures) == 3
    assert pool_gates(led, NOW + 201, POLICY)["cpu"].detail.startswith("3 consecutive")
    led.record_success("cpu", NOW + 202)
    assert pool_gates(led, NOW + 203, POLICY) == {}


def test_file_ledger_survives_a_new_instance(tmp_path):
    path = str(tmp_path / "spool" / "slurmk8s" / "ledger.json")
    FileLedger(path, POLICY).record_failure("gpu", "gpu-0", "ErrImagePull", NOW, "uid-a")
    FileLedger(path, POLICY).record_failure("gpu", "gpu-1", "ErrImagePull", NOW + 1)
    FileLedger(path, POLICY).record_failure("gpu", "gpu-2", "x", NOW + 2)
    assert FileLedger(path, POLICY).claim_trial("gpu", "gpu-3", NOW + 303)  # cooled off: gpu-3 is the trial
    assert not FileLedger(path, POLICY).claim_trial("gpu", "gpu-4", NOW + 304)  # one at a time
    loaded = FileLedger(path, POLICY).load()
    assert [(f.node, f.attempt) for f in loaded["gpu"].failures] == [("gpu-0", "uid-a"), ("gpu-1", ""), ("gpu-2", "")]
    assert loaded["gpu"].trial.node == "gpu-3"
    FileLedger(path, POLICY).record_success("gpu", NOW + 2)
    assert FileLedger(path, POLICY).load()["gpu"] == PoolHistory((), NOW + 2)


def test_file_ledger_not_json_is_reset(tmp_path):
    """(tests/test_ledger_file.py has the bad files and the unreadable one.)"""
    path = tmp_path / "ledger.json"
    path.write_text("{not json")
    said: list[str] = []
    assert FileLedger(str(path), log=said.append).load() == {} and "reset to empty" in said[0]
    assert FileLedger(str(tmp_path / "absent.json")).load() == {}


def test_programs_and_reconcile_agree_on_the_ledger_path():
    assert programs.DEFAULT_LEDGER == DEFAULT_LEDGER and programs.DEFAULT_EVENTS == DEFAULT_EVENTS


# ---------------------------------------------------------------- run_once


def run(nodes, workers=(), inv=None, ledger=None, backend=None, slurm=None, policy=POLICY):
    backend = backend or FakeBackend({w.name: w for w in workers})
    slurm = slurm or FakeSlurmClient(nodes=nodes)
    ledger = ledger if ledger is not None else MemoryLedger(policy)
    log = Log("reconcile-test")
    report = run_once(slurm, backend, inv or inventory(), ledger, NOW, log, policy)
    return report, backend, slurm, ledger, log


def test_run_once_deletes_orphan_and_stale_workers_and_logs_why():
    report, backend, slurm, _, log = run([powered_down("cpu-0")], [worker("stray-9"), worker("cpu-0")])
    assert sorted(c for c in backend.calls) == [("delete", "cpu-0"), ("delete", "stray-9")]
    assert slurm.updates == []
    text = "\n".join(log.lines)
    assert re.search(r"stray-9 orphan-worker: pod stray-9 Running is for no node in the inventory -> "
                     r"delete-worker ok", text), text
    assert re.search(r"cpu-0 worker-for-powered-down-node \[cpu\]: .* -> delete-worker ok", text), text


def test_run_once_missing_worker_sets_down_naming_the_pod_then_powers_down():
    report, backend, slurm, _, log = run([up("cpu-1")], [])
    assert slurm.updates == [
        ["scontrol", "update", "nodename=cpu-1", "state=DOWN",
         "reason=slurmk8s missing-worker: pod cpu-1 is gone while Slurm has the node ALLOCATED"],
        ["scontrol", "update", "nodename=cpu-1", "state=POWER_DOWN_FORCE", "nodeaddr=127.0.0.1"],
    ]
    assert backend.calls == []
    assert [d.op for d in report.done] == [Op.SET_DOWN, Op.POWER_DOWN] and all(d.ok for d in report.done)


class AppearingBackend(FakeBackend):
    """The worker shows up between the first and the second list (a resume racing the pass)."""

    def list(self, names=None):
        listed = {n: w for n, w in self.workers.items() if names is None or n in names}
        self.workers.setdefault("cpu-1", Worker("cpu-1", "Pending", created_at=NOW))
        return listed


def test_run_once_rechecks_before_setting_a_node_down():
    report, _, slurm, _, log = run([up("cpu-1")], backend=AppearingBackend())
    assert slurm.updates == []
    assert any("worker appeared meanwhile" in line for line in log.lines)


def test_run_once_stuck_pending_deletes_sets_down_and_records_the_failure():
    nodes = [node_json("cpu-0", "ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP")]
    report, backend, slurm, ledger, _ = run(nodes, [worker("cpu-0", "Pending", "ErrImageNeverPull: no image", 90)])
    assert backend.calls == [("delete", "cpu-0")]
    [argv] = slurm.updates
    assert argv[:4] == ["scontrol", "update", "nodename=cpu-0", "state=DOWN"]
    assert argv[4].startswith("reason=slurmk8s stuck-pending: pod cpu-0 Pending (ErrImageNeverPull: no image) for 90s")
    [failure] = ledger.load()["cpu"].failures
    assert failure.node == "cpu-0" and failure.at == NOW and "ErrImageNeverPull" in failure.reason


def test_run_once_failed_worker():
    report, backend, slurm, ledger, _ = run([up("cpu-1")], [worker("cpu-1", "Failed", "OOMKilled (exit 137)")])
    assert backend.calls == [("delete", "cpu-1")]
    assert slurm.updates[0][3] == "state=DOWN" and "OOMKilled" in slurm.updates[0][4]
    assert len(ledger.load()["cpu"].failures) == 1


def test_run_once_returns_down_nodes_to_powered_down_idle():
    nodes = [node_json("cpu-0", "DOWN", "CLOUD", reason="slurmk8s missing-worker: pod cpu-0 is gone"),
             node_json("cpu-1", "DOWN", "CLOUD", "POWERED_DOWN", reason="slurmk8s stuck-pending: x")]
    _, _, slurm, _, _ = run(nodes)
    assert slurm.updates == [["scontrol", "update", "nodename=cpu-0", "state=POWER_DOWN_FORCE", "nodeaddr=127.0.0.1"],
                             ["scontrol", "update", "nodename=cpu-1", "state=RESUME"]]


def test_run_once_pool_recovery_resets_the_ledger():
    ledger = MemoryLedger(POLICY)
    for i in range(3):
        ledger.record_failure("cpu", f"cpu-{i}", "x", NOW - 100 + i)
    report, _, _, ledger, log = run([up("cpu-3")], [worker("cpu-3", age=10)], ledger=ledger)
    assert ledger.load()["cpu"] == PoolHistory((), NOW)
    assert any("pool cpu in backoff" in line for line in log.lines)  # as seen at the start of the pass


def test_run_once_a_failing_step_stops_the_rest_and_is_reported():
    class NoDelete(FakeBackend):
        def delete(self, name, uid=None, force=False, version=None):
            raise BackendError(name, "RBAC: not allowed to delete pods")

    report, _, slurm, ledger, log = run([up("cpu-1")], backend=NoDelete({"cpu-1": worker("cpu-1", "Failed")}))
    assert slurm.updates == [] and ledger.load() == {}
    [done] = report.done
    assert not done.ok and "RBAC" in done.error
    assert any("delete-worker FAILED (RBAC: not allowed to delete pods)" in line for line in log.lines)


def test_run_once_slurm_update_failure_is_reported():
    slurm = FakeSlurmClient(nodes=[up("cpu-1")], fail_updates=True)
    report, _, slurm, _, _ = run(None, slurm=slurm)
    assert len(slurm.updates) == 1 and not report.done[0].ok  # POWER_DOWN not attempted after DOWN failed


def test_run_once_skips_the_pass_when_it_cannot_see():
    class Blind(FakeBackend):
        def list(self):
            raise BackendError("*", "Kubernetes API unreachable")

    report, _, slurm, _, _ = run([up("cpu-1")], backend=Blind())
    assert report.errors == ["cannot list workers: Kubernetes API unreachable"] and slurm.updates == []
    report, backend, _, _, _ = run(None, [worker("stray")], slurm=FakeSlurmClient(fail_reads=True))
    assert "cannot read Slurm's nodes" in report.errors[0] and backend.calls == []


# ---------------------------------------------------------------- the resume program's side


def test_resume_refuses_a_backed_off_pool_fast_and_says_why(tmp_path):
    path = str(tmp_path / "ledger.json")
    import time as _time

    for i in range(3):
        FileLedger(path).record_failure("cpu", f"cpu-{i}", "ErrImagePull: denied", _time.time() - 10 + i)
    backend, slurm = FakeBackend(), FakeSlurm()
    c = Context({"SLURMK8S_LEDGER": path, "SLURMK8S_EVENTS": str(tmp_path / "events.jsonl")}, Log("test"),
                backend=backend, slurm=slurm, inventory=inventory())
    result = run_resume(["cpu-3"], c, None)
    assert result.code == 1 and backend.calls == []
    assert slurm.down["cpu-3"].startswith("slurmk8s backoff: pool cpu: 3 consecutive resume failures")
    [event] = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert event["reason"] == Reason.BACKOFF.value and event["outcome"] == "failed" and event["program"] == "test"
    # a refusal is not a new failure of the pool
    assert len(FileLedger(path).load()["cpu"].failures) == 3


def test_resume_backend_failures_feed_the_ledger_and_resume_fail_too(tmp_path):
    path = str(tmp_path / "ledger.json")
    backend = FakeBackend(fail={"cpu-0": "image slurmd:x not found"})
    c = Context({"SLURMK8S_LEDGER": path}, Log("test"), backend=backend, slurm=FakeSlurm(), inventory=inventory())
    run_resume(["cpu-[0-1]"], c, None)
    [f] = FileLedger(path).load()["cpu"].failures
    assert f.node == "cpu-0" and "not found" in f.reason
    # resume-fail counts the nodes whose worker it found (cpu-2), by its uid; not those with none
    pending = FakeBackend({"cpu-2": Worker("cpu-2", "Pending", "Unschedulable: 0/3 nodes", uid="uid-2")})
    c = Context({"SLURMK8S_LEDGER": path}, Log("test"), backend=pending, slurm=FakeSlurm(), inventory=inventory())
    run_resume_fail(["cpu-[2-3]"], c)
    assert [(f.node, f.attempt) for f in FileLedger(path).load()["cpu"].failures] == [("cpu-0", ""), ("cpu-2", "uid-2")]


def test_programs_append_one_event_per_decision_with_its_outcome(tmp_path):
    events = tmp_path / "log" / "events.jsonl"
    backend = FakeBackend({"cpu-1": Worker("cpu-1", "Running")}, fail={"cpu-2": "boom"})
    c = Context({"SLURMK8S_EVENTS": str(events)}, Log("resume"), backend=backend, slurm=FakeSlurm(),
                inventory=inventory())
    run_resume(["cpu-[0-2]"], c, None)
    c = Context({"SLURMK8S_EVENTS": str(events)}, Log("suspend"), backend=backend, slurm=FakeSlurm())
    run_suspend(["cpu-0"], c)
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    got = sorted((r["program"], r["node"], r["action"], r["reason"], r["outcome"]) for r in rows)
    assert got == [("resume", "cpu-0", "create", "resume", "ok"),
                   ("resume", "cpu-1", "adopt", "already-running", "ok"),
                   ("resume", "cpu-2", "create", "resume", "failed"),
                   ("suspend", "cpu-0", "delete", "suspend", "ok")]
    assert [r["error"] for r in rows if r["node"] == "cpu-2"] == ["boom"]


def test_programs_without_ledger_or_events_settings_touch_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = Context({}, Log("test"), backend=FakeBackend(), slurm=FakeSlurm(), inventory=inventory())
    assert c.ledger() is None
    run_resume(["cpu-0"], c, None)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- events tail


def test_event_tail_starts_at_the_end_and_handles_partial_lines_and_truncation(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"old": 1}\n')
    tail = EventTail(str(path))
    assert tail.read() == []
    with open(path, "a") as fh:
        fh.write('{"a": 1}\n{"b"')
    assert tail.read() == [{"a": 1}]
    with open(path, "a") as fh:
        fh.write(': 2}\nnot json\n')
    assert tail.read() == [{"b": 2}]
    path.write_text('{"c": 3}\n')  # rotated / truncated
    assert tail.read() == [{"c": 3}]
    assert EventTail(str(tmp_path / "missing")).read() == []


def test_event_tail_counts_the_first_events_of_a_file_created_after_the_start(tmp_path):
    # a fresh cluster: the loop starts before the first resume creates the events file
    path = tmp_path / "events.jsonl"
    tail = EventTail(str(path))
    assert tail.read() == []
    path.write_text('{"program": "resume", "outcome": "ok"}\n')
    assert tail.read() == [{"program": "resume", "outcome": "ok"}]
    assert tail.read() == []


# ---------------------------------------------------------------- metrics and dashboard


def test_a_worker_created_in_the_loops_first_second_counts_its_start():
    # Kubernetes and Docker give creation times in whole seconds: a pod made 0.4 s after the loop
    # started (at 0.7 s past a second) reads as made 0.3 s before it, and was once left uncounted
    # (the CI flake of test_metrics_move_when_a_job_runs)
    m = Metrics()
    started = NOW + 0.3
    s = snap([up("cpu-0")], [Worker("cpu-0", "Running", created_at=NOW, ready_at=NOW + 2)], inventory())
    m.observe_pass(Report(snapshot=s), [], NOW + 3, started, 0.1, [])
    assert re.search(r'^slurmk8s_worker_start_seconds_count\{pool="cpu"\} 1\.0$', m.exposition().decode(), re.M)
    # one made a whole second before the start is from before this process: not counted
    m = Metrics()
    s = snap([up("cpu-0")], [Worker("cpu-0", "Running", created_at=NOW - 1, ready_at=NOW + 2)], inventory())
    m.observe_pass(Report(snapshot=s), [], NOW + 3, started, 0.1, [])
    assert not re.search(r'^slurmk8s_worker_start_seconds_count\{pool="cpu"\} 1', m.exposition().decode(), re.M)


def test_metrics_move_with_a_pass():
    m = Metrics()
    started = NOW - 1000
    inv = inventory()
    s = snap([up("cpu-0"), powered_down("cpu-1"), node_json("cpu-2", "IDLE", "CLOUD", "POWERING_UP")],
             [Worker("cpu-0", "Running", created_at=NOW - 30, ready_at=NOW - 27.5),
              Worker("cpu-2", "Pending", created_at=NOW - 1)], inv)
    report = Report(findings=classify(s, NOW, POLICY), snapshot=s)
    jobs = parse_jobs({"jobs": [
        {"job_id": 7, "partition": "cpu", "job_state": ["RUNNING"], "submit_time": {"set": True, "number": NOW - 40},
         "start_time": {"set": True, "number": NOW - 37}, "nodes": "cpu-0"},
        {"job_id": 8, "partition": "cpu", "job_state": ["PENDING"]}]})
    m.observe_rpc("show_nodes", 0.02, True)
    m.observe_rpc("squeue", 11.0, False)
    m.observe_pass(report, jobs, NOW, started, 0.1, ["gpu"])
    m.observe_pass(report, jobs, NOW + 10, started, 0.1, [])  # 10 s later: node-seconds counted
    m.observe_events([{"program": "resume", "action": "create", "reason": "resume", "outcome": "ok"}])
    text = m.exposition().decode()

    def value(sample: str) -> float:
        match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
        assert match, f"{sample} not in\n{text}"
        return float(match.group(1))

    assert value('slurmk8s_jobs{partition="cpu",state="running"}') == 1
    assert value('slurmk8s_jobs{partition="cpu",state="pending"}') == 1
    assert value('slurmk8s_nodes{pool="cpu",state="allocated"}') == 1
    assert value('slurmk8s_nodes{pool="cpu",state="powering_up"}') == 1
    assert value('slurmk8s_workers{phase="Running",pool="cpu"}') == 1
    assert value('slurmk8s_job_submit_to_running_seconds_count{partition="cpu"}') == 1  # once per job
    assert value('slurmk8s_job_submit_to_running_seconds_sum{partition="cpu"}') == 3
    assert value('slurmk8s_worker_start_seconds_sum{pool="cpu"}') == 2.5
    assert value('slurmk8s_node_provisioned_seconds_total{pool="cpu"}') == 20  # 2 workers x 10 s
    assert value('slurmk8s_node_busy_seconds_total{pool="cpu"}') == 10
    assert value('slurmk8s_controller_rpc_errors_total{command="squeue"}') == 1
    assert value('slurmk8s_controller_rpc_seconds_count{command="show_nodes"}') == 1
    assert value('slurmk8s_pool_backoff{pool="gpu"}') == 0  # was 1 in the first pass, then cleared
    assert value('slurmk8s_elastic_requests_total{action="create",outcome="ok",program="resume",reason="resume"}') == 1
    assert value('slurmk8s_reconcile_passes_total{outcome="ok"}') == 2


def our_dashboard_queries() -> list[str]:
    return dashboard_queries(json.loads(DASHBOARD.read_text()))


PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                   "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions (followed by
    '('), keywords, label names (inside {...} or a by/without/on/ignoring/group_x list), strings,
    durations ([5m]) or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\b\d+(ms|s|m|h|d|w|y)\b", " ", text)  # durations (offset 5m)
    text = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b", " ", text)  # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in PROMQL_KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def test_promql_metric_names_parses_what_a_regex_on_the_prefix_would_miss():
    q = ('histogram_quantile(0.95, sum by (le, pool) (rate(slurmk8s_worker_start_seconds_bucket{pool!="x"}[15m])))'
         ' / on (pool) group_left(phase) node_cpu_seconds_total offset 5m > bool 1e3')
    assert promql_metric_names(q) == {"slurmk8s_worker_start_seconds_bucket", "node_cpu_seconds_total"}
    assert promql_metric_names("time() - slurmk8s_reconcile_last_run_timestamp_seconds") == {
        "slurmk8s_reconcile_last_run_timestamp_seconds"}
    assert promql_metric_names('sum(slurmk8s_jobs{state="pending"}) and up') == {"slurmk8s_jobs", "up"}


def test_dashboard_queries_use_only_exported_metrics():
    exported = exported_names(Metrics().registry)
    queries = our_dashboard_queries()
    assert len(queries) >= 10
    used = set()
    for q in queries:
        names = promql_metric_names(q)
        assert names, f"query uses no metric: {q}"
        unknown = names - exported
        assert not unknown, f"{q}: {sorted(unknown)} not exported (exported: {sorted(exported)})"
        used |= names
    # the list, each shown somewhere
    for family in ("slurmk8s_jobs", "slurmk8s_nodes", "slurmk8s_workers", "slurmk8s_elastic_requests_total",
                   "slurmk8s_job_submit_to_running_seconds_bucket", "slurmk8s_worker_start_seconds_bucket",
                   "slurmk8s_node_provisioned_seconds_total", "slurmk8s_node_busy_seconds_total",
                   "slurmk8s_controller_rpc_seconds_bucket", "slurmk8s_health_drained_nodes"):
        assert family in used, f"dashboard shows no {family}"


def test_dashboard_check_would_catch_a_typo():
    exported = exported_names(Metrics().registry)
    assert "slurmk8s_jobs" in exported and "slurmk8s_job_pending" not in exported
    assert "slurmk8s_node_busy_seconds_total" in exported and "slurmk8s_node_busy_seconds" not in exported
    assert promql_metric_names("sum by (pool) (rate(slurmk8s_node_busy_seconds[5m]))") - exported == {
        "slurmk8s_node_busy_seconds"}


METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_readme_metrics_table_is_current():
    text = METRICS_DOC.read_text()
    begin, end = "<!-- metrics-table: generated by `slurmk8s-reconcile --metrics-table` -->\n", "<!-- /metrics-table -->"
    assert begin in text and end in text, "docs/metrics.md lacks the generated metrics table markers"
    current = text.split(begin, 1)[1].split(end, 1)[0]
    assert current == metrics_markdown(), \
        "docs/metrics.md's metrics table is stale: replace it with the output of `slurmk8s-reconcile --metrics-table`"


def test_metric_catalog_lists_every_family_with_its_labels():
    catalog = {d.name: d for d in metric_catalog(Metrics())}
    exported = exported_names(Metrics().registry)
    for name, d in catalog.items():
        assert (name if d.kind != "histogram" else name + "_bucket") in exported, name
    assert catalog["slurmk8s_jobs"].labels == ("partition", "state")
    assert catalog["slurmk8s_health_drained_nodes"].labels == ("pool", "check")
    assert catalog["slurmk8s_node_busy_seconds_total"].kind == "counter"
    assert catalog["slurmk8s_job_submit_to_running_seconds"].kind == "histogram"


def test_health_drained_nodes_are_counted_by_check():
    m = Metrics()
    s = snap([node_json("cpu-0", "IDLE", "DRAIN", "CLOUD", reason="health: memory: 300MiB available ..."),
              node_json("cpu-1", "ALLOCATED", "DRAIN", "CLOUD", reason="health: mpi: 2-rank loopback exit 3"),
              node_json("cpu-2", "IDLE", "DRAIN", "CLOUD", reason="maintenance by alice"),
              node_json("cpu-3", "IDLE", "CLOUD", reason="health: disk: old reason, no longer drained")],
             [worker("cpu-0"), worker("cpu-1"), worker("cpu-2"), worker("cpu-3")])
    report = Report(findings=classify(s, NOW, POLICY), snapshot=s)
    m.observe_pass(report, [], NOW, NOW - 100, 0.1, [])
    text = m.exposition().decode()
    assert 'slurmk8s_health_drained_nodes{check="memory",pool="cpu"} 1.0' in text
    assert 'slurmk8s_health_drained_nodes{check="mpi",pool="cpu"} 1.0' in text
    assert "disk" not in re.findall(r"^slurmk8s_health_drained_nodes\S*", text, re.M).__str__()
    # undrained on the next pass: the gauge drops to 0
    s2 = snap([node_json("cpu-0", "IDLE", "CLOUD", "POWERED_DOWN", reason="health: memory: ...")], [])
    m.observe_pass(Report(findings=classify(s2, NOW, POLICY), snapshot=s2), [], NOW + 10, NOW - 100, 0.1, [])
    assert 'slurmk8s_health_drained_nodes{check="memory",pool="cpu"} 0.0' in m.exposition().decode()


# ---------------------------------------------------------------- node-seconds since `up`


def test_usage_tally_continues_after_a_restart_and_restarts_with_a_new_deployment(tmp_path):
    f = UsageFile(str(tmp_path / "slurmk8s" / "usage.json"))
    assert f.load() is None
    first, why = resume_usage(f.load(), "sts-uid-1", NOW)
    assert first.since == NOW and "counting from now" in why
    m = Metrics()
    m.restore_usage(first)
    s = snap([up("cpu-0")], [worker("cpu-0")])
    report = Report(findings=classify(s, NOW, POLICY), snapshot=s)
    running = [JobStatus(7, "cpu", "RUNNING", NOW, NOW + 5, ("cpu-0",))]
    m.observe_pass(report, running, NOW + 10, NOW, 0.1, [])
    m.observe_pass(report, running, NOW + 40, NOW, 0.1, [])  # 30 s provisioned and busy
    f.save(m.usage("sts-uid-1"))
    saved = f.load()
    assert saved == Usage("sts-uid-1", NOW, {"cpu": 30.0}, {"cpu": 30.0})

    # a restart (or a wake from sleep: same StatefulSet) continues the counters from the file
    again, why = resume_usage(saved, "sts-uid-1", NOW + 100)
    assert again == saved and "continuing" in why
    m2 = Metrics()
    m2.restore_usage(again)
    text = m2.exposition().decode()
    assert 'slurmk8s_node_provisioned_seconds_total{pool="cpu"} 30.0' in text
    since = re.search(r"^slurmk8s_usage_since_timestamp_seconds (\S+)$", text, re.M)
    assert since and float(since.group(1)) == NOW
    # the deployment cannot be told (not on Kubernetes, or the pod unreadable): continue
    assert resume_usage(saved, "", NOW + 100)[0].provisioned == {"cpu": 30.0}
    # a new `up` (new StatefulSet) starts over
    fresh, why = resume_usage(saved, "sts-uid-2", NOW + 200)
    assert fresh == Usage("sts-uid-2", NOW + 200) and "earlier deployment" in why


def test_usage_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "usage.json"
    bad.write_text("{not json")
    with pytest.raises(LedgerError, match="usage.json"):
        UsageFile(str(bad)).load()
    bad.write_text('{"deployment": "x"}')
    with pytest.raises(LedgerError, match="since"):
        UsageFile(str(bad)).load()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(LedgerError, match="cannot write"):
        UsageFile(str(blocked / "usage.json")).save(Usage("", NOW))


def test_deployment_id_is_the_owning_statefulset_uid():
    from fakes.kube import FakePodApi

    from provisioner.config import parse_spec
    from provisioner.elastic.k8s_backend import KubernetesBackend

    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "mode": "slots", "cpus": 1, "memory": "1Gi",
                                               "domains": [{"name": "a", "count": 1}]}],
                       "users": [{"name": "alice", "uid": 2001, "ssh_keys": ["ssh-ed25519 AAAA x"]}]})
    api = FakePodApi()
    api.create("slurm-t", {"metadata": {"name": "slurmctld-0", "ownerReferences": [
        {"kind": "StatefulSet", "name": "slurmctld", "uid": "0c1d-uid"}]}, "spec": {"containers": [{"name": "c"}]}})
    backend = KubernetesBackend(spec, api, namespace="slurm-t")
    assert backend.owner_uid("slurmctld-0") == "0c1d-uid"
    api.allowed = frozenset({"list"})
    lines = []

    class Log:
        def write(self, line):
            lines.append(line)

    import os
    os.environ["HOSTNAME"] = "slurmctld-0"
    assert _deployment_id(backend, Log()) == "" and "continuing the saved tally" in lines[0]
    assert _deployment_id(FakeBackend(), Log()) == ""


def test_kube_worker_ready_at_comes_from_the_ready_condition():
    from provisioner.elastic.pods import worker_from_pod

    pod = {"metadata": {"name": "cpu-0", "creationTimestamp": "2027-01-15T08:00:00Z"},
           "status": {"phase": "Running", "conditions": [
               {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T08:00:00Z"},
               {"type": "Ready", "status": "True", "lastTransitionTime": "2027-01-15T08:00:02Z"}]}}
    w = worker_from_pod(pod)
    assert w.ready_at - w.created_at == 2
    pod["status"]["conditions"][1]["status"] = "False"
    assert worker_from_pod(pod).ready_at is None


def test_short_jobs_finished_between_passes_still_count_and_cancelled_ones_do_not():
    m = Metrics()
    s = snap([up("cpu-0")], [Worker("cpu-0", "Running", created_at=NOW - 30)], inventory())
    report = Report(findings=classify(s, NOW, POLICY), snapshot=s)
    jobs = parse_jobs({"jobs": [
        {"job_id": 9, "partition": "cpu", "job_state": ["COMPLETED"], "submit_time": {"set": True, "number": NOW - 9},
         "start_time": {"set": True, "number": NOW - 6}},
        {"job_id": 10, "partition": "cpu", "job_state": ["CANCELLED"], "submit_time": {"set": True, "number": NOW - 9},
         "start_time": {"set": True, "number": NOW - 1}}]})
    m.observe_pass(report, jobs, NOW, NOW - 1000, 0.1, [])
    m.observe_pass(report, jobs, NOW + 10, NOW - 1000, 0.1, [])  # seen again: counted once
    text = m.exposition().decode()
    count = re.search(r'^slurmk8s_job_submit_to_running_seconds_count\{partition="cpu"\} (\S+)$', text, re.M)
    total = re.search(r'^slurmk8s_job_submit_to_running_seconds_sum\{partition="cpu"\} (\S+)$', text, re.M)
    assert count and float(count.group(1)) == 1 and total and float(total.group(1)) == 3


def test_loop_stops_at_once_on_sigterm(tmp_path):
    """The loop is PID 1 of its container: without its own SIGTERM handler a pod deletion waits out the
    whole grace period (30 s) before the new slurmctld pod starts."""
    import os
    import signal
    import subprocess
    import sys
    import time

    log = tmp_path / "reconcile.log"
    env = {**os.environ, "SLURMK8S_ENV_FILE": str(tmp_path / "none.env"), "SLURMK8S_INVENTORY": str(tmp_path / "x.json"),
           "SLURMK8S_RECONCILE_LOG": str(log), "SLURMK8S_LEDGER": str(tmp_path / "ledger.json"),
           "SLURMK8S_EVENTS": str(tmp_path / "events.jsonl")}
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.reconcile", "--period", "300", "--metrics-port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while "pass skipped" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=10)
    assert time.monotonic() - t0 < 5
    assert code in (0, 1), f"killed by the signal instead of stopping: {code}"
    assert "SIGTERM: stopping after this pass" in log.read_text()


# ---------------------------------------------------------------- a worker's container restarted under its job


def _job(job_id: int, nodes: str, start: float, state: str = "RUNNING") -> dict:
    return {"job_id": job_id, "partition": "cpu", "job_state": [state], "nodes": nodes,
            "start_time": {"set": True, "infinite": False, "number": int(start)}}


def test_running_since_expands_hostlists_and_keeps_the_oldest_job():
    jobs = parse_jobs({"jobs": [_job(7, "cpu-[0-1]", NOW - 100), _job(8, "cpu-1", NOW - 300),
                                   _job(9, "cpu-2", NOW - 50, "COMPLETED"), _job(10, "", NOW)]})
    assert jobs[0].nodes == ("cpu-0", "cpu-1")
    assert running_since(jobs) == {"cpu-0": (NOW - 100, 7), "cpu-1": (NOW - 300, 8)}


def test_container_died_under_a_running_job_sets_the_node_down_naming_the_pod():
    # slurmd came back (slurmd -b): Slurm's boot time of the node, in slurmctld's clock, is after the
    # job's start, in the same clock; the kubelet reports the restart (restartCount)
    died = Worker("cpu-1", "Running", created_at=NOW - 600, died_at=NOW - 30, restarts=1,
                  died_how="slurmd Error (exit 137), 1 restarts")
    base = snap([up("cpu-1", boot=NOW - 25)], [died])
    under_job = Snapshot(base.nodes, base.workers, base.inventory, {}, {"cpu-1": (NOW - 120, 42)})
    f = only(under_job, "cpu-1")
    assert f.kind is Kind.WORKER_RESTARTED and f.ops == (Op.SET_DOWN, Op.POWER_DOWN)
    assert "pod cpu-1 container died under job 42" in f.down_reason and "exit 137" in f.down_reason
    # it died before the job started (a crash while idle: slurmd came back, the job ran on it since)
    later_job = Snapshot(base.nodes, base.workers, base.inventory, {}, {"cpu-1": (NOW - 10, 43)})
    assert only(later_job, "cpu-1").kind is Kind.OK
    # no job on it (idle node): nothing to requeue
    assert only(Snapshot(parse_nodes({"nodes": [up("cpu-1", "IDLE")]}), base.workers, base.inventory), "cpu-1").kind \
        is Kind.OK


# The kubelet's clock against slurmctld's: the worker's node runs `skew` seconds ahead (+) or behind (-).
SKEWS = (120, -120, 0)


@pytest.mark.parametrize("skew", SKEWS)
def test_clock_skew_never_requeues_a_healthy_job(skew):
    """A container that died (and came back) before the job started, seen through a kubelet clock
    120 s off: the job runs on the restarted slurmd and is never flagged, on the first pass that
    sees it nor on the next ones."""
    start, true_death = NOW - 100, NOW - 110  # the container died 10 s before the job started
    died = Worker("cpu-1", "Running", created_at=NOW - 600 + skew, died_at=true_death + skew, restarts=1,
                  died_how="slurmd Error (exit 137), 1 restarts")
    nodes = [up("cpu-1", boot=true_death + 3)]  # the new slurmd registered, before the job started
    first = Snapshot(parse_nodes({"nodes": nodes}), {"cpu-1": died}, inventory(), {}, {"cpu-1": (start, 42)})
    assert only(first, "cpu-1").kind is Kind.OK
    watched = Snapshot(first.nodes, first.workers, first.inventory, {}, first.running,
                       {"cpu-1": RestartWatch("", 42, before=1, at_first=1, last=1)})
    assert only(watched, "cpu-1").kind is Kind.OK


@pytest.mark.parametrize("skew", SKEWS)
def test_a_restart_under_a_running_job_is_flagged_whatever_the_skew(skew):
    start = NOW - 100
    for true_death in (start + 1, start + 60):
        died = Worker("cpu-1", "Running", created_at=NOW - 600 + skew, died_at=true_death + skew, restarts=1,
                      died_how="slurmd Error (exit 137), 1 restarts")
        # slurmd registered again: Slurm's boot time (its own clock) is after the job's start
        back = Snapshot(parse_nodes({"nodes": [up("cpu-1", boot=true_death + 3)]}), {"cpu-1": died}, inventory(),
                        {}, {"cpu-1": (start, 42)})
        assert only(back, "cpu-1").kind is Kind.WORKER_RESTARTED, (skew, true_death)
        # not registered again yet (or crash-looping): the kubelet's count went up since the loop
        # first saw the job on this pod
        not_back = Snapshot(parse_nodes({"nodes": [up("cpu-1", boot=NOW - 600)]}), {"cpu-1": died}, inventory(),
                            {}, {"cpu-1": (start, 42)}, {"cpu-1": RestartWatch("", 42, 0, 0, 1)})
        assert only(not_back, "cpu-1").kind is Kind.WORKER_RESTARTED, (skew, true_death)
    # the count seen for another job, or another pod by the same name, is no baseline for this one
    other = Snapshot(parse_nodes({"nodes": [up("cpu-1", boot=NOW - 600)]}), {"cpu-1": died}, inventory(),
                     {}, {"cpu-1": (start, 42)}, {"cpu-1": RestartWatch("", 41, 0, 0, 1)})
    assert only(other, "cpu-1").kind is Kind.OK
    replaced = Snapshot(other.nodes, other.workers, other.inventory, {}, other.running,
                        {"cpu-1": RestartWatch("old-uid", 42, 0, 0, 1)})
    assert only(replaced, "cpu-1").kind is Kind.OK


def test_a_slurmd_back_two_seconds_after_the_job_started_is_a_restart_one_second_is_rounding():
    """Whole seconds on both sides: a node booted just before its job may read a second after it;
    a slurmd restarted under a 1.6 s old job read 2 s after it (a CI run missed it with 2 s slack)."""
    start = NOW - 100
    died = Worker("cpu-1", "Running", created_at=NOW - 600, died_at=start + 1, restarts=1,
                  died_how="slurmd Error (exit 137), 1 restarts")
    kinds_by_boot = {}
    for after in (1, 2):
        snap = Snapshot(parse_nodes({"nodes": [up("cpu-1", boot=start + after)]}), {"cpu-1": died}, inventory(),
                        {}, {"cpu-1": (start, 42)})
        kinds_by_boot[after] = only(snap, "cpu-1").kind
    assert kinds_by_boot == {1: Kind.OK, 2: Kind.WORKER_RESTARTED}


def test_slurm_boot_time_is_slurmctlds_not_slurmds_start_time():
    """boot_time is slurmctld's clock minus the uptime slurmd reports (slurmd -b counts it from its
    own start); slurmd_start_time is slurmd's own clock, so it is not used to judge a job."""
    n = parse_nodes({"nodes": [{**node_json("cpu-1", "ALLOCATED", boot=NOW - 50),
                                "slurmd_start_time": {"set": True, "infinite": False, "number": int(NOW)}}]})["cpu-1"]
    assert n.slurm_boot_at == NOW - 50 and n.booted_at == NOW


def test_run_once_remembers_the_restart_count_it_first_saw_under_each_job():
    slurm = FakeSlurmClient(nodes=[up("cpu-1")], job_list=[_job(42, "cpu-1", NOW - 120)])
    watch: dict = {}
    log = Log("reconcile", stream=io.StringIO())
    healthy = Worker("cpu-1", "Running", created_at=NOW - 600, uid="u1", restarts=2, died_at=NOW + 500)
    report = run_once(slurm, FakeBackend({"cpu-1": healthy}), inventory(), MemoryLedger(POLICY), NOW, log, POLICY,
                      restart_watch=watch)
    assert slurm.updates == [] and watch == {"cpu-1": RestartWatch("u1", 42, 0, 2, 2)}
    assert report.of(Kind.WORKER_RESTARTED) == []
    # the same count next pass: still fine; one more restart: flagged
    run_once(slurm, FakeBackend({"cpu-1": healthy}), inventory(), MemoryLedger(POLICY), NOW + 10, log, POLICY,
             restart_watch=watch)
    assert slurm.updates == [] and watch == {"cpu-1": RestartWatch("u1", 42, 0, 2, 2)}
    again = Worker("cpu-1", "Running", created_at=NOW - 600, uid="u1", restarts=3, died_at=NOW - 900)
    run_once(slurm, FakeBackend({"cpu-1": again}), inventory(), MemoryLedger(POLICY), NOW + 20, log, POLICY,
             restart_watch=watch)
    assert [u[3] for u in slurm.updates] == ["state=DOWN", "state=POWER_DOWN_FORCE"]
    # the job gone from the queue: its baseline goes too; the worker's count is kept for the next job
    slurm.job_list = []
    run_once(slurm, FakeBackend({"cpu-1": again}), inventory(), MemoryLedger(POLICY), NOW + 30, log, POLICY,
             restart_watch=watch)
    assert watch == {"cpu-1": RestartWatch("u1", None, 3, 3, 3)}


def _pass(watch: dict, worker: Worker, boot: float, jobs: list[dict], now: float) -> FakeSlurmClient:
    """One pass of the loop with its memory `watch`; the Slurm calls it made are in `.updates`."""
    slurm = FakeSlurmClient(nodes=[up("cpu-1", "ALLOCATED" if jobs else "IDLE", boot=boot)], job_list=jobs)
    run_once(slurm, FakeBackend({"cpu-1": worker}), inventory(), MemoryLedger(POLICY), now,
             Log("reconcile", stream=io.StringIO()), POLICY, restart_watch=watch)
    return slurm


def test_a_container_killed_within_a_second_of_its_job_start_is_caught_though_no_pass_saw_the_job():
    """A CI run: the job was 0.7 s old at the kill, its slurmd was back within the second, and the
    loop's passes saw the pod idle before and the job only after: Slurm's boot time reads at most a
    second after the job's start (rounding, as for a healthy node), and the count seen under the
    job is already the restarted one. The count went up since the last pass before the job, and
    the boot is within the slack of the start: requeued."""
    start = NOW - 5
    fresh = Worker("cpu-1", "Running", created_at=NOW - 30, uid="u1", restarts=0)
    killed = Worker("cpu-1", "Running", created_at=NOW - 30, uid="u1", restarts=1, died_at=start + 0.7,
                    died_how="slurmd Error (exit 137)")
    for boot_after in (0, 1):
        watch: dict = {}
        assert _pass(watch, fresh, NOW - 25, [], NOW - 10).updates == []  # the pass before: idle, no restart
        seen = _pass(watch, killed, start + boot_after, [_job(42, "cpu-1", start)], NOW)
        assert [u[3] for u in seen.updates] == ["state=DOWN", "state=POWER_DOWN_FORCE"], boot_after
        # no pass saw the pod at all before (created for this job): it started at 0 restarts
        watch = {}
        seen = _pass(watch, killed, start + boot_after, [_job(42, "cpu-1", start)], NOW)
        assert [u[3] for u in seen.updates] == ["state=DOWN", "state=POWER_DOWN_FORCE"], boot_after


def test_a_slurmd_that_crashed_while_idle_keeps_the_job_started_after_it_came_back():
    """The price of the rule above is bounded by the slack: a slurmd that crashed while idle and was
    back 3 s before the next job started (both since the last pass) keeps that job; so does a loop
    that starts afresh (a woken controller) on a pod that restarted long before its job."""
    start = NOW - 5
    fresh = Worker("cpu-1", "Running", created_at=NOW - 300, uid="u1", restarts=0)
    crashed = Worker("cpu-1", "Running", created_at=NOW - 300, uid="u1", restarts=1, died_at=start - 4)
    watch: dict = {}
    _pass(watch, fresh, NOW - 290, [], NOW - 10)
    assert _pass(watch, crashed, start - 3, [_job(42, "cpu-1", start)], NOW).updates == []
    assert _pass(watch, crashed, start - 3, [_job(42, "cpu-1", start)], NOW + 10).updates == []
    old = Worker("cpu-1", "Running", created_at=NOW - 900, uid="u2", restarts=3, died_at=NOW - 800)
    assert _pass({}, old, NOW - 795, [_job(43, "cpu-1", NOW - 100)], NOW).updates == []


def test_run_once_reads_the_queue_and_requeues_the_job_of_a_restarted_worker():
    slurm = FakeSlurmClient(nodes=[up("cpu-1", boot=NOW - 25)], job_list=[_job(42, "cpu-1", NOW - 120)])
    died = Worker("cpu-1", "Running", created_at=NOW - 600, died_at=NOW - 30, restarts=1,
                  died_how="slurmd Error (exit 137)")
    log = Log("reconcile", stream=io.StringIO())
    report = run_once(slurm, FakeBackend({"cpu-1": died}), inventory(), MemoryLedger(POLICY), NOW, log, POLICY)
    assert [u[3] for u in slurm.updates] == ["state=DOWN", "state=POWER_DOWN_FORCE"]
    assert "worker-restarted" in slurm.updates[0][4] and report.jobs and report.jobs[0].job_id == 42
    assert any("cpu-1 worker-restarted" in l and "set-down ok, power-down ok" in l for l in log.lines)


# ---------------------------------------------------------------- the worker's Kubernetes node stopped answering


def test_a_worker_on_a_node_that_stopped_answering_is_set_down_and_removed_at_once():
    """#14: a kubelet that stops posting status makes the node controller mark the node's pods not
    ready (Ready False, ContainersReady as last reported) ~40-50 s later. Once the loop has seen it
    so for host_lost_grace (40 s), it sets the Slurm node DOWN naming the Kubernetes node (its jobs
    are requeued now, not after the 5 min eviction or SlurmdTimeout), removes the pod at once (no
    grace: nothing can confirm it) and powers the node down, so the next resume places its pod on
    a node that answers. Not a pool failure."""
    lost = Worker("cpu-1", "Running", created_at=NOW - 600, host="k8s-node-7", uid="u1", host_lost=True)
    slurm = FakeSlurmClient(nodes=[up("cpu-1")], job_list=[_job(42, "cpu-1", NOW - 120)])
    backend = FakeBackend({"cpu-1": lost})
    ledger = MemoryLedger(POLICY)
    log = Log("reconcile", stream=io.StringIO())
    watch: dict = {}
    for t in (NOW, NOW + 10, NOW + 30):  # seen lost for 30 s: not judged yet
        report = run_once(slurm, backend, inventory(), ledger, t, log, POLICY, lost_watch=watch)
        assert report.of(Kind.HOST_LOST) == [] and slurm.updates == [] and watch == {"cpu-1": ("u1", NOW)}
    report = run_once(slurm, backend, inventory(), ledger, NOW + 40, log, POLICY, lost_watch=watch)
    f = report.of(Kind.HOST_LOST)[0]
    assert f.ops == (Op.SET_DOWN, Op.FORCE_DELETE_WORKER, Op.POWER_DOWN) and f.uid == "u1"
    assert [u[3] for u in slurm.updates] == ["state=DOWN", "state=POWER_DOWN_FORCE"]
    assert "host-lost: Kubernetes node k8s-node-7 stopped answering" in slurm.updates[0][4]
    assert ("force-delete", "cpu-1") in backend.calls and "cpu-1" not in backend.workers
    assert not any(h.failures for h in ledger.load().values())


def test_a_node_that_answers_again_within_the_grace_keeps_its_jobs():
    """A CI run: the API server took 50 s to come back, then the kubelet restarted (25 s): the node
    controller marked a healthy node's pods not ready for about half a minute. Seen answering again
    before host_lost_grace, nothing is done, and a later blip starts its own clock."""
    slurm = FakeSlurmClient(nodes=[up("cpu-1")], job_list=[_job(42, "cpu-1", NOW - 120)])
    log = Log("reconcile", stream=io.StringIO())
    watch: dict = {}
    blip = Worker("cpu-1", "Running", created_at=NOW - 600, host="n", uid="u1", host_lost=True)
    fine = Worker("cpu-1", "Running", created_at=NOW - 600, host="n", uid="u1")
    for t, w in ((NOW, blip), (NOW + 30, blip), (NOW + 35, fine), (NOW + 40, blip), (NOW + 70, blip)):
        run_once(slurm, FakeBackend({"cpu-1": w}), inventory(), MemoryLedger(POLICY), t, log, POLICY, lost_watch=watch)
    assert slurm.updates == [] and watch == {"cpu-1": ("u1", NOW + 40)}


def test_an_api_outage_restarts_the_lost_clock():
    """After the API server was away (the loop could not list its workers), the node controller marks
    pods of nodes whose heartbeats could not reach it; the loop's clock starts over from its first
    pass that lists workers again."""
    from provisioner.elastic.backend import BackendError

    class Flaky(FakeBackend):
        down = False

        def list(self):
            if self.down:
                raise BackendError("*", "Kubernetes API unreachable", retryable=True)
            return super().list()

    slurm = FakeSlurmClient(nodes=[up("cpu-1")], job_list=[_job(42, "cpu-1", NOW - 120)])
    log = Log("reconcile", stream=io.StringIO())
    backend = Flaky({"cpu-1": Worker("cpu-1", "Running", created_at=NOW - 600, host="n", uid="u1", host_lost=True)})
    watch: dict = {}
    run_once(slurm, backend, inventory(), MemoryLedger(POLICY), NOW, log, POLICY, lost_watch=watch)
    backend.down = True
    run_once(slurm, backend, inventory(), MemoryLedger(POLICY), NOW + 20, log, POLICY, lost_watch=watch)
    assert watch == {}
    backend.down = False
    run_once(slurm, backend, inventory(), MemoryLedger(POLICY), NOW + 45, log, POLICY, lost_watch=watch)
    assert slurm.updates == [] and watch == {"cpu-1": ("u1", NOW + 45)}


def test_host_lost_is_read_from_the_pods_conditions():
    from provisioner.elastic.pods import worker_from_pod

    def pod(ready: str, containers: str, phase: str = "Running") -> dict:
        return {"metadata": {"name": "cpu-1", "uid": "u"}, "spec": {"nodeName": "n7"},
                "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready},
                                                          {"type": "ContainersReady", "status": containers}]}}

    assert worker_from_pod(pod("False", "True")).host_lost  # the node controller's mark
    assert not worker_from_pod(pod("False", "False")).host_lost  # a failing readiness probe, a dead container
    assert not worker_from_pod(pod("True", "True")).host_lost
    assert not worker_from_pod(pod("False", "True", "Pending")).host_lost


# ---------------------------------------------------------------- a pinned node's Kubernetes node cordoned or gone


UNSCHED = ("Unschedulable: 0/3 nodes are available: 1 node(s) were unschedulable, "
           "2 node(s) didn't match Pod's node affinity/selector.")


def pinned(*k8s: dict) -> Inventory:
    """A pinned pool `gpu` over these Kubernetes nodes, built as a deploy builds it: a cordoned or
    NotReady node gives its Slurm node (gpu-<k8s name>) an `unavailable` reason."""
    spec = parse_spec({"name": "t", "pools": [{"name": "gpu", "node_selector": {"pool": "gpu"}}]})
    return build_inventory(spec, nodes_from_api(list(k8s)))


def gpu_host(name: str, **kw) -> dict:
    return k8s_node(name, {"pool": "gpu"}, **kw)


def resuming(name: str) -> dict:
    return node_json(name, "ALLOCATED", "CLOUD", "POWERING_UP")


def test_a_pending_worker_of_a_cordoned_or_notready_pinned_node_is_judged_after_the_grace_not_counted():
    """#14: the pod of a pinned node cannot start while its Kubernetes node is cordoned / NotReady;
    judged after the grace (not the 180 s Unschedulable bound): deleted, DOWN (the job requeues), and
    no failure of the pool, whose healthy nodes must not be backed off for it."""
    inv = pinned(gpu_host("k8s-1", unschedulable=True), gpu_host("k8s-2", ready=False))
    s = snap([resuming("gpu-k8s-1"), resuming("gpu-k8s-2")],
             [worker("gpu-k8s-1", "Pending", UNSCHED, age=20), worker("gpu-k8s-2", "Pending", "", age=20)], inv)
    f = only(s, "gpu-k8s-1")
    assert f.kind is Kind.NODE_UNAVAILABLE and f.pool == "gpu"
    assert f.ops == (Op.DELETE_WORKER, Op.SET_DOWN) and Op.RECORD_FAILURE not in f.ops
    # the reason names the Kubernetes node first: it survives down_reason's 200-character cut
    assert f.down_reason.startswith("slurmk8s node-unavailable: kubernetes node k8s-1 is cordoned: "
                                    "pod gpu-k8s-1 Pending (Unschedulable: 0/3 nodes are available")
    g = only(s, "gpu-k8s-2")  # bound to a NotReady node (no reason yet): it cannot start either
    assert g.kind is Kind.NODE_UNAVAILABLE
    assert g.detail == "kubernetes node k8s-2 is NotReady: pod gpu-k8s-2 Pending for 20s"


def test_within_the_grace_a_pending_worker_of_a_cordoned_node_is_left_for_now():
    inv = pinned(gpu_host("k8s-1", unschedulable=True))
    f = only(snap([resuming("gpu-k8s-1")], [worker("gpu-k8s-1", "Pending", UNSCHED, age=19)], inv), "gpu-k8s-1")
    assert f.kind is Kind.OK and f.ops == ()
    assert f.detail.startswith("kubernetes node k8s-1 is cordoned; pod gpu-k8s-1 Pending") and f.detail.endswith(
        "19s old: within grace")


def test_an_unschedulable_worker_of_an_available_pinned_node_still_waits_out_the_unschedulable_bound():
    """Only the node the inventory says is unavailable is judged early: an Unschedulable pod of an
    available node (a cluster autoscaler may be making room) becomes stuck-pending, a pool failure,
    at unschedulable_timeout as before."""
    inv = pinned(gpu_host("k8s-1", unschedulable=True), gpu_host("k8s-3"))
    nodes = [resuming("gpu-k8s-1"), resuming("gpu-k8s-3")]
    for age, available in ((20, Kind.OK), (179, Kind.OK), (180, Kind.STUCK_PENDING)):
        s = snap(nodes, [worker("gpu-k8s-1", "Pending", UNSCHED, age), worker("gpu-k8s-3", "Pending", UNSCHED, age)],
                 inv)
        assert kinds(s) == {"gpu-k8s-1": Kind.NODE_UNAVAILABLE, "gpu-k8s-3": available}, age
    assert Op.RECORD_FAILURE in only(s, "gpu-k8s-3").ops


def test_a_running_worker_on_a_cordoned_node_is_left_alone():
    """Cordon means no new pods: a job running there finishes (Slurm drains the node); only a pod
    still waiting to start there is judged."""
    inv = pinned(gpu_host("k8s-1", unschedulable=True), gpu_host("k8s-2", unschedulable=True))
    busy = node_json("gpu-k8s-1", "ALLOCATED", "CLOUD", "DRAIN", reason="kubernetes node k8s-1 is cordoned",
                     boot=NOW - 600)
    s = snap([busy, resuming("gpu-k8s-2")],
             [worker("gpu-k8s-1", "Running", age=600), worker("gpu-k8s-2", "Pending", UNSCHED, age=600)], inv)
    assert kinds(s) == {"gpu-k8s-1": Kind.OK, "gpu-k8s-2": Kind.NODE_UNAVAILABLE}
    assert only(s, "gpu-k8s-1").ops == ()


def test_run_once_a_cordoned_nodes_pending_worker_is_deleted_and_set_down_without_a_pool_failure():
    """Through the pass: the pod deleted (only the one judged), the Slurm node DOWN (its job
    requeues), nothing in the ledger; before the fix this pod became stuck-pending after 180 s and
    counted towards the pool's backoff."""
    inv = pinned(gpu_host("k8s-1", unschedulable=True), gpu_host("k8s-3"))
    pending = Worker("gpu-k8s-1", "Pending", UNSCHED, created_at=NOW - 200, uid="u1")
    report, backend, slurm, ledger, log = run([resuming("gpu-k8s-1"), up("gpu-k8s-3")],
                                              [pending, worker("gpu-k8s-3")], inv=inv)
    assert backend.calls == [("delete", "gpu-k8s-1")] and "gpu-k8s-1" not in backend.workers
    [argv] = slurm.updates
    assert argv[:4] == ["scontrol", "update", "nodename=gpu-k8s-1", "state=DOWN"]
    assert argv[4].startswith("reason=slurmk8s node-unavailable: kubernetes node k8s-1 is cordoned: pod gpu-k8s-1")
    assert [(d.op, d.ok) for d in report.done] == [(Op.DELETE_WORKER, True), (Op.SET_DOWN, True)]
    assert ledger.load() == {} and report.of(Kind.POOL_BACKOFF) == []
    assert any("gpu-k8s-1 node-unavailable [gpu]: kubernetes node k8s-1 is cordoned" in line
               and line.endswith("-> delete-worker ok, set-down ok") for line in log.lines)


def test_run_once_an_unschedulable_worker_of_a_pinned_node_whose_kubernetes_node_is_gone_is_no_pool_failure():
    """A deleted Kubernetes node drops its Slurm node from the inventory: the pod left Pending
    (Unschedulable) for it is an orphan, deleted without counting a failure of the pool."""
    inv = pinned(gpu_host("k8s-3"))  # k8s-1 was deleted
    assert "gpu-k8s-1" not in inv
    report, backend, slurm, ledger, _ = run([resuming("gpu-k8s-1"), up("gpu-k8s-3")],
                                            [worker("gpu-k8s-1", "Pending", UNSCHED, age=600), worker("gpu-k8s-3")],
                                            inv=inv)
    [f] = report.acted
    assert f.node == "gpu-k8s-1" and f.kind is Kind.ORPHAN_WORKER and f.ops == (Op.DELETE_WORKER,)
    assert backend.calls == [("delete", "gpu-k8s-1")] and slurm.updates == [] and ledger.load() == {}


class _QueueCounter:
    """SlurmCli stand-in for the loop's main(): nodes answer, the queue read fails (slurmctld busy or
    away) unless `nodes_fail`, and every ask of the queue is counted."""

    asks = 0
    nodes_fail = False
    scontrol = "scontrol"

    def __init__(self, observe=None) -> None:
        pass

    def show_nodes(self) -> dict:
        if _QueueCounter.nodes_fail:
            raise SlurmCommandError("scontrol: error: Unable to contact slurm controller")
        return {"nodes": [up(n) for n in inventory().names]}

    def jobs(self) -> dict:
        _QueueCounter.asks += 1
        raise SlurmCommandError("squeue: error: Socket timed out on send/recv operation")


@pytest.mark.parametrize("nodes_fail", [False, True])
def test_a_pass_asks_slurmctld_for_the_queue_at_most_once(tmp_path, monkeypatch, nodes_fail):
    """The whole queue (`squeue --json --states=all`) is the loop's largest read, and with slurmctld
    away each ask waits out its timeout: a pass asks once, whether its own read failed (the pass,
    the metrics and the idle watch share it) or the pass stopped before the queue (one read for
    the metrics and the idle watch)."""
    import provisioner.elastic.backend as backend_mod
    import provisioner.reconcile.main as loop

    seen: list = []

    class Idle:
        def step(self, job_doc, workers, now) -> bool:
            seen.append(job_doc)
            return False

    _QueueCounter.asks, _QueueCounter.nodes_fail = 0, nodes_fail
    monkeypatch.setattr(loop, "SlurmCli", _QueueCounter)
    monkeypatch.setattr(loop, "idle_watch_from_env", lambda *a: Idle())
    monkeypatch.setattr(loop, "_live_nodes", lambda *a: None)
    monkeypatch.setattr(backend_mod, "backend_from_env", lambda env: FakeBackend())
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps(inventory().to_json()))
    for k, v in {"SLURMK8S_INVENTORY": str(inv), "SLURMK8S_LOG": str(tmp_path / "elastic.log"),
                 "SLURMK8S_LEDGER": str(tmp_path / "ledger.json"), "SLURMK8S_EVENTS": str(tmp_path / "events"),
                 "SLURMK8S_CONFIG_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    loop.main(["--once", "--metrics-port", "0"])
    assert _QueueCounter.asks == 1
    assert seen == [None]  # the idle watch was told the queue is unknown, not that it is empty


def test_busy_node_seconds_come_from_the_jobs_start_and_end_times():
    """As sacct counts them: a job that starts and ends between two passes counts in full, two jobs
    on one node count it once, a running job up to the pass, a pending one not at all, and a pass
    whose job listing failed leaves its time to the next pass."""
    m = Metrics()
    s = snap([up("cpu-0"), up("cpu-1")], [worker("cpu-0"), worker("cpu-1")])
    report = Report(findings=[], snapshot=s)
    m.observe_pass(report, [], NOW, NOW, 0.1, [])  # the first pass: counting starts here

    def job(i: int, state: str, start: float | None, end: float | None, nodes: tuple[str, ...]) -> JobStatus:
        return JobStatus(i, "cpu", state, NOW - 100, start, nodes, end)

    jobs = [job(1, "COMPLETED", NOW + 2, NOW + 4.5, ("cpu-0",)),  # 2.5 s, wholly between the passes
            job(2, "COMPLETED", NOW + 3, NOW + 6, ("cpu-0",)),  # overlaps job 1 on cpu-0: union 2..6
            job(3, "RUNNING", NOW + 7, NOW + 3600, ("cpu-1", "cpu-0")),  # end_time is its limit: up to now
            job(4, "PENDING", None, None, ()),
            job(5, "CANCELLED", None, NOW + 5, ()),  # cancelled while pending
            job(7, "CANCELLED", NOW + 5, NOW + 6, ("cpu-1",)),  # ran 1 s, then scancel: sacct counts it
            job(6, "COMPLETED", NOW - 50, NOW - 20, ("cpu-1",))]  # before the tally: not counted
    m.observe_pass(report, jobs, NOW + 10, NOW, 0.1, [])
    assert m.usage("d").busy == {"cpu": pytest.approx((6 - 2) + 3 + 3 + 1)}
    m.observe_pass(report, None, NOW + 20, NOW, 0.1, [])  # squeue failed: nothing counted yet
    assert m.usage("d").busy == {"cpu": pytest.approx(11)}
    jobs[2] = job(3, "COMPLETED", NOW + 7, NOW + 25, ("cpu-1", "cpu-0"))
    m.observe_pass(Report(findings=[]), jobs, NOW + 30, NOW, 0.1, [])  # job 3 ran 10..25 on two nodes
    assert m.usage("d").busy == {"cpu": pytest.approx(11 + 2 * 15)}  # no snapshot: the last pools


# ---------------------------------------------------------------- a worker taken away under a running job


@pytest.mark.parametrize("taken, said", [
    ("Kueue: WorkloadEvicted: Preempted to accommodate a workload (UID: 7f) due to prioritization in the "
     "ClusterQueue", "worker-taken: pod cpu-1 taken away under job 42: Kueue: WorkloadEvicted: Preempted to"),
    ("Kubernetes: EvictionByEvictionAPI: Eviction API: evicting",
     "worker-taken: pod cpu-1 taken away under job 42: Kubernetes: EvictionByEvictionAPI"),
    ("", ""),  # no condition (kubectl delete): judged once the pod is gone (missing-worker), as before
])
def test_a_worker_taken_away_sets_its_node_down_naming_who_took_it_and_is_no_pool_failure(taken, said):
    """Kueue's preemption (its TerminationTarget condition, then a delete), a scheduler preemption or
    an eviction (Kubernetes' DisruptionTarget): the node goes DOWN (any job still on it requeued) with
    a reason naming who took the pod, not the bare `pod is gone` of a delete nobody explained; the
    pool is not backed off for it."""
    going = Worker("cpu-1", "Terminating", created_at=NOW - 600, uid="u1", taken=taken)
    slurm = FakeSlurmClient(nodes=[up("cpu-1")], job_list=[_job(42, "cpu-1", NOW - 120)])
    ledger = MemoryLedger(POLICY)
    report = run_once(slurm, FakeBackend({"cpu-1": going}), inventory(), ledger, NOW,
                      Log("reconcile", stream=io.StringIO()), POLICY)
    assert bool(report.of(Kind.WORKER_TAKEN)) is bool(taken)
    if not taken:
        assert slurm.updates == []
        return
    assert [u[3] for u in slurm.updates] == ["state=DOWN", "state=POWER_DOWN_FORCE"]
    assert said in slurm.updates[0][4]
    assert not any(h.failures for h in ledger.load().values())
    # the suspend's own delete (powering down) is left to it
    assert kinds(snap([node_json("cpu-1", "IDLE", "CLOUD", "POWERING_DOWN")], [going]))["cpu-1"] is Kind.OK


def test_an_idle_worker_evicted_powers_its_node_down_without_setting_it_down():
    """A drain or a consolidation evicts an idle worker (the PodDisruptionBudget covers busy ones
    only): no job to requeue, so its node is suspended at once (POWER_DOWN_FORCE), never DOWN (no
    `down~` state for users to see, no RESUME pass after), and the pool is no failure."""
    going = Worker("cpu-1", "Terminating", created_at=NOW - 600, uid="u1",
                   taken="Kubernetes: EvictionByEvictionAPI: Eviction API: evicting")
    slurm = FakeSlurmClient(nodes=[up("cpu-1", base="IDLE")], job_list=[])
    ledger = MemoryLedger(POLICY)
    report = run_once(slurm, FakeBackend({"cpu-1": going}), inventory(), ledger, NOW,
                      Log("reconcile", stream=io.StringIO()), POLICY)
    assert report.of(Kind.IDLE_WORKER_TAKEN) and not report.of(Kind.WORKER_TAKEN)
    assert [u[3] for u in slurm.updates] == ["state=POWER_DOWN_FORCE"]
    assert not any(h.failures for h in ledger.load().values())


@pytest.mark.parametrize("busy", [True, False])
def test_a_worker_the_kubelet_evicted_is_taken_not_failed_and_the_pool_is_not_backed_off(busy):
    """A kubelet eviction (memory or disk pressure, a pod over its ephemeral-storage limit) leaves the
    pod object behind, phase Failed, reason Evicted, with Kubernetes' DisruptionTarget condition
    (TerminationByKubelet). That is no fault of the pool's image or spec: its node goes DOWN naming
    the eviction (the job requeued) or, idle, is powered down; no pool failure is counted."""
    evicted = Worker("cpu-1", "Failed", "Evicted: The node was low on resource: memory.", created_at=NOW - 600,
                     uid="u1", taken="Kubernetes: TerminationByKubelet: The node was low on resource: memory.")
    slurm = FakeSlurmClient(nodes=[up("cpu-1", base="ALLOCATED" if busy else "IDLE")],
                            job_list=[_job(42, "cpu-1", NOW - 120)] if busy else [])
    ledger = MemoryLedger(POLICY)
    report = run_once(slurm, FakeBackend({"cpu-1": evicted}), inventory(), ledger, NOW,
                      Log("reconcile", stream=io.StringIO()), POLICY)
    assert not report.of(Kind.WORKER_FAILED)
    assert report.of(Kind.WORKER_TAKEN if busy else Kind.IDLE_WORKER_TAKEN)
    assert [u[3] for u in slurm.updates] == (["state=DOWN", "state=POWER_DOWN_FORCE"] if busy
                                             else ["state=POWER_DOWN_FORCE"])
    if busy:
        assert "TerminationByKubelet" in slurm.updates[0][4]
    assert not any(h.failures for h in ledger.load().values())


def test_the_backend_reads_a_kubelet_eviction_without_a_condition_from_the_pods_status():
    """Kubernetes 1.34's kubelet evicts a pod over its ephemeral-storage limit with no DisruptionTarget
    condition (probed on the local cluster): phase Failed, reason Evicted, the message says why."""
    from provisioner.elastic.pods import taken_by, worker_from_pod

    pod = {"metadata": {"name": "cpu-1", "labels": {}}, "status": {
        "phase": "Failed", "reason": "Evicted",
        "message": "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed"}]}}
    assert taken_by(pod) == "kubelet: Evicted: Pod ephemeral local storage usage exceeds the total limit of containers 20Mi."
    assert worker_from_pod(pod).phase == "Failed"
    assert taken_by({"status": {"phase": "Failed", "reason": "OOMKilled"}}) == ""
    # the same eviction seen on the worker: its preStop hook ran, slurmd exited 0, the pod ended
    # Succeeded with nothing else said. A worker (restartPolicy Always) only ends so by the kubelet
    ended = {"metadata": {"name": "cpu-1"}, "spec": {"restartPolicy": "Always"}, "status": {
        "phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]}}
    assert taken_by(ended) == ("kubelet: ended the pod (Succeeded: Completed (exit 0)), as for an eviction or a "
                               "node shutdown")
    assert taken_by({**ended, "spec": {"restartPolicy": "Never"}}) == ""
    assert taken_by({**ended, "metadata": {"deletionTimestamp": "2026-12-07T15:20:23Z"}}) == ""


def test_the_backend_reads_who_takes_a_pod_from_its_conditions():
    from provisioner.elastic.pods import taken_by

    kueue_cond = {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted",
                  "message": "Preempted to accommodate a workload"}
    assert taken_by({"status": {"conditions": [kueue_cond]}}) == \
        "Kueue: WorkloadEvicted: Preempted to accommodate a workload"
    k8s = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
           "message": "prod-pod: preempting to accommodate a higher priority pod"}
    assert taken_by({"status": {"conditions": [k8s]}}).startswith("Kubernetes: PreemptionByScheduler: ")
    assert taken_by({"status": {"conditions": [{**k8s, "status": "False"}]}}) == ""
    assert taken_by({}) == ""


# ---------------------------------------------------------------- autoscalers see busy workers


def test_busy_workers_carry_the_autoscalers_annotations_and_idle_ones_lose_them():
    from provisioner.reconcile import busy

    workers = [Worker("cpu-0", "Running", uid="a"), Worker("cpu-1", "Running", uid="b", busy_marked=True),
               Worker("cpu-2", "Running", uid="c", busy_marked=True), Worker("cpu-3", "Pending", uid="d")]
    s = Snapshot(parse_nodes({"nodes": [up("cpu-0"), up("cpu-1"), up("cpu-2", base="IDLE")]}),
                 {w.name: w for w in workers}, inventory(), {}, {"cpu-0": (NOW, 7), "cpu-1": (NOW, 8)})
    assert busy.changes(s) == {"cpu-0": True, "cpu-2": False}  # cpu-1 already marked; a Pending pod is not
    backend = FakeBackend({w.name: w for w in workers})
    assert busy.mark(backend, s, Log("reconcile", stream=io.StringIO())) == []
    assert ("mark-busy", "cpu-0") in backend.calls and ("mark-idle", "cpu-2") in backend.calls
    assert backend.workers["cpu-0"].busy_marked and not backend.workers["cpu-2"].busy_marked


def test_a_worker_with_only_some_busy_marks_is_written_again_either_way():
    """An older release's marks (the annotations without the label), or a write cut short: the
    pass writes the whole set, busy or idle."""
    from provisioner.elastic.pods import busy_marks
    from provisioner.names import A_DO_NOT_DISRUPT, A_SAFE_TO_EVICT, L_BUSY
    from provisioner.reconcile import busy

    old = {"annotations": {A_DO_NOT_DISRUPT: "true", A_SAFE_TO_EVICT: "false"}, "labels": {"app": "x"}}
    assert busy_marks(old) is None
    assert busy_marks({**old, "labels": {L_BUSY: "true"}}) is True
    assert busy_marks({"labels": {"app": "x"}}) is False
    assert busy_marks({"labels": {L_BUSY: "true"}}) is None
    workers = [Worker("cpu-0", "Running", uid="a", busy_marked=None), Worker("cpu-1", "Running", uid="b", busy_marked=None)]
    s = Snapshot(parse_nodes({"nodes": [up("cpu-0"), up("cpu-1", base="IDLE")]}),
                 {w.name: w for w in workers}, inventory(), {}, {"cpu-0": (NOW, 7)})
    assert busy.changes(s) == {"cpu-0": True, "cpu-1": False}


def test_the_backend_writes_and_removes_the_annotations_with_the_pods_uid(tmp_path):
    from fakes.kube import FakePodApi

    from provisioner.elastic.k8s_backend import KubernetesBackend
    from provisioner.elastic.pods import worker_from_pod
    from provisioner.names import A_DO_NOT_DISRUPT, A_SAFE_TO_EVICT, L_BUSY

    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "mode": "slots", "cpus": 2, "memory": "1Gi",
                                                "domains": [{"name": "d", "count": 1}]}]})
    api = FakePodApi(namespaces={"slurm-t"})
    backend = KubernetesBackend(spec, api, "slurm-t")
    from provisioner.generate import generate

    backend.create(generate(spec, []).inventory["cpu-0"])
    pod = api.pods[("slurm-t", "cpu-0")]
    uid = pod["metadata"]["uid"]
    assert backend.mark_busy("cpu-0", uid, True)
    ann = api.pods[("slurm-t", "cpu-0")]["metadata"]["annotations"]
    assert ann[A_DO_NOT_DISRUPT] == "true" and ann[A_SAFE_TO_EVICT] == "false"
    # and the label the workers' PodDisruptionBudget selects: a busy worker's eviction is refused
    assert api.pods[("slurm-t", "cpu-0")]["metadata"]["labels"][L_BUSY] == "true"
    assert worker_from_pod(api.pods[("slurm-t", "cpu-0")]).busy_marked is True
    assert backend.mark_busy("cpu-0", uid, False)
    meta = api.pods[("slurm-t", "cpu-0")]["metadata"]
    ann = meta.get("annotations") or {}
    assert A_DO_NOT_DISRUPT not in ann and A_SAFE_TO_EVICT not in ann  # removed, not "false"
    assert L_BUSY not in meta["labels"]  # an idle worker may be evicted (a drain goes on at once)
    assert worker_from_pod(api.pods[("slurm-t", "cpu-0")]).busy_marked is False


def test_a_powered_down_node_left_not_responding_is_powered_down_again():
    """`scontrol update state=UNDRAIN` (the drain pass after an uncordon or a notice) and
    state=RESUME of a DRAIN or DOWN node make Slurm 24.11 wait for the node to register again
    (NOT_RESPONDING). A powered-down node never registers: it stays available only until slurmctld
    re-reads its state, and every `scontrol reconfigure` or restart drops an IDLE+POWERED_DOWN+
    NOT_RESPONDING node from the nodes it schedules (seen in e2e: a job pinned to it pended for
    ReqNodeNotAvail until its timeout). A plain POWER_DOWN clears the flag (Slurm's suspend
    does), never kills a job (no FORCE), and the suspend program has no worker to delete."""
    s = snap([powered_down("cpu-0"), node_json("cpu-1", "IDLE", "CLOUD", "POWERED_DOWN", "NOT_RESPONDING",
                                                reason="kubernetes node k-1 is cordoned"),
              node_json("cpu-2", "IDLE", "CLOUD", "POWERED_DOWN", "NOT_RESPONDING", "DRAIN", reason="operator"),
              node_json("cpu-3", "IDLE", "CLOUD", "POWERING_UP", "NOT_RESPONDING"),
              node_json("cpu-4", "ALLOCATED", "CLOUD", "POWERED_DOWN", "NOT_RESPONDING")], [])
    k = kinds(s)
    assert k["cpu-0"] == Kind.OK
    assert k["cpu-1"] == Kind.UNREGISTERED_POWERED_DOWN
    assert ACTIONS[Kind.UNREGISTERED_POWERED_DOWN] == (Op.RESET_POWER_DOWN,)
    assert k["cpu-2"] == Kind.OK  # an operator's drain: suspending would clear it
    assert k["cpu-3"] == Kind.OK  # powering up: its slurmd registers
    assert k["cpu-4"] == Kind.OK  # a job is on its way: its boot registers the node


def test_the_reset_power_down_is_plain_power_down_never_force():
    slurm = FakeSlurmClient(nodes=[node_json("cpu-1", "IDLE", "CLOUD", "POWERED_DOWN", "NOT_RESPONDING")])
    backend = FakeBackend()
    report = run_once(slurm, backend, inventory(), MemoryLedger(POLICY), NOW, Log("test"), POLICY)
    assert [f.kind for f in report.acted] == [Kind.UNREGISTERED_POWERED_DOWN]
    assert ["scontrol", "update", "nodename=cpu-1", "state=POWER_DOWN"] in slurm.updates
