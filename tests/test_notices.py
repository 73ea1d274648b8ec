"""Interruption notices (issue 42 item 3): a Kubernetes node that says it is about to go (Karpenter's
disruption taint, AWS Node Termination Handler's, GKE's, a configured condition) has its workers'
Slurm nodes taken out at the next pass: DOWN with the notice as the reason while the host still
runs the jobs (Slurm requeues them with SIGTERM and KillWait, not NODE_FAIL after the loss), an idle
one powered down; a pinned pool's node stays in Slurm, drained."""

from __future__ import annotations

import io

from factories import node as k8s_node
from fakes.backend import FakeBackend
from fakes.ledger import MemoryLedger
from fakes.slurm import FakeSlurmClient

from provisioner.config import INTERRUPTION_TAINTS, parse_spec
from provisioner.elastic.backend import Worker
from provisioner.elastic.ledger import Policy
from provisioner.inventory import Inventory, SlurmNode, build_inventory, nodes_from_api
from provisioner.logs import Log
from provisioner.reconcile.act import run_once
from provisioner.reconcile.classify import Kind
from provisioner.reconcile.notices import NoticeReader, notice, notices

NOW = 1_800_000_000.0
POLICY = Policy(grace=20, pending_timeout=60, unschedulable_timeout=180, backoff_failures=3,
                backoff_window=600, backoff_cooloff=300)
SPOT = {"key": "aws-node-termination-handler/spot-itn", "value": "1765000000", "effect": "NoSchedule"}
KARPENTER = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
SAID = "kubernetes node ip-10-0-1-7 has interruption notice aws-node-termination-handler/spot-itn=1765000000:NoSchedule"


def _node(name: str, taints=(), conditions=()) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": list(taints)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]}}


def _slurm_node(name: str, base: str) -> dict:
    return {"name": name, "state": [base, "CLOUD"], "reason": "", "partitions": ["cpu"],
            "boot_time": {"set": True, "infinite": False, "number": int(NOW - 600)},
            "slurmd_start_time": {"set": True, "infinite": False, "number": 0}}


def _job(job_id: int, nodes: str) -> dict:
    return {"job_id": job_id, "partition": "cpu", "job_state": ["RUNNING"], "nodes": nodes,
            "start_time": {"set": True, "infinite": False, "number": int(NOW - 120)}}


def _pass(nodes: list[dict], jobs: list[dict], workers: list[Worker], interrupted: dict[str, str]):
    slurm = FakeSlurmClient(nodes=nodes, job_list=jobs)
    ledger = MemoryLedger(POLICY)
    inventory = Inventory(tuple(SlurmNode(f"cpu-{i}", "cpu", "cpu", 2, 1024) for i in range(4)))
    report = run_once(slurm, FakeBackend({w.name: w for w in workers}), inventory, ledger, NOW,
                      Log("reconcile", stream=io.StringIO()), POLICY, interrupted=interrupted)
    return report, slurm, ledger


def test_a_notice_is_a_listed_taint_or_a_true_listed_condition():
    conds = ("VMEventScheduled",)
    assert notice(_node("ip-10-0-1-7", [SPOT]), INTERRUPTION_TAINTS, conds) == SAID
    assert notice(_node("n", [KARPENTER]), INTERRUPTION_TAINTS, ()) == \
        "kubernetes node n has interruption notice karpenter.sh/disrupted:NoSchedule"
    event = {"type": "VMEventScheduled", "status": "True", "reason": "Preempt", "message": "in 30s"}
    assert notice(_node("n", (), [event]), (), conds) == \
        "kubernetes node n has interruption notice VMEventScheduled (Preempt: in 30s)"
    assert notice(_node("n", (), [{**event, "status": "False"}]), (), conds) == ""
    # a taint that is not listed, Kubernetes' own cordon taint, no list at all: no notice
    assert notice(_node("n", [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                              {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
                  INTERRUPTION_TAINTS, conds) == ""
    assert notice(_node("n", [SPOT]), (), ()) == ""
    assert notices([_node("a", [SPOT]), _node("b")], INTERRUPTION_TAINTS, ()) == {
        "a": SAID.replace("ip-10-0-1-7", "a")}


def test_a_busy_worker_on_a_host_with_a_notice_is_set_down_naming_it_and_its_job_requeued_now():
    """The host still runs: DOWN now has Slurm requeue the job with SIGTERM and KillWait, and the
    power down deletes the pod; the next resume puts the node's pod on another host. No pool failure."""
    busy = Worker("cpu-1", "Running", created_at=NOW - 600, uid="u1", host="ip-10-0-1-7")
    other = Worker("cpu-2", "Running", created_at=NOW - 600, uid="u2", host="ip-10-0-1-8")
    report, slurm, ledger = _pass([_slurm_node("cpu-1", "ALLOCATED"), _slurm_node("cpu-2", "ALLOCATED")],
                                  [_job(42, "cpu-1"), _job(43, "cpu-2")], [busy, other], {"ip-10-0-1-7": SAID})
    assert [f.node for f in report.of(Kind.HOST_INTERRUPTED)] == ["cpu-1"]
    assert [(u[2], u[3]) for u in slurm.updates] == [("nodename=cpu-1", "state=DOWN"),
                                                     ("nodename=cpu-1", "state=POWER_DOWN_FORCE")]
    assert SAID in slurm.updates[0][4] and "job 42 requeued" in slurm.updates[0][4]
    assert not any(h.failures for h in ledger.load().values())


def test_an_idle_worker_on_a_host_with_a_notice_is_powered_down_never_set_down():
    idle = Worker("cpu-1", "Running", created_at=NOW - 600, uid="u1", host="ip-10-0-1-7")
    report, slurm, _ = _pass([_slurm_node("cpu-1", "IDLE")], [], [idle], {"ip-10-0-1-7": SAID})
    assert report.of(Kind.IDLE_HOST_INTERRUPTED)
    assert [u[3] for u in slurm.updates] == ["state=POWER_DOWN_FORCE"]


def test_a_node_already_down_or_powering_down_or_a_worker_on_its_way_out_is_not_taken_again():
    going = Worker("cpu-1", "Terminating", created_at=NOW - 600, uid="u1", host="ip-10-0-1-7")
    report, slurm, _ = _pass([_slurm_node("cpu-1", "IDLE")], [], [going], {"ip-10-0-1-7": SAID})
    assert not report.of(Kind.HOST_INTERRUPTED) and not report.of(Kind.IDLE_HOST_INTERRUPTED)
    running = Worker("cpu-1", "Running", created_at=NOW - 600, uid="u1", host="ip-10-0-1-7")
    down = {**_slurm_node("cpu-1", "IDLE"), "state": ["IDLE", "CLOUD", "POWERING_DOWN"]}
    report, slurm, _ = _pass([down], [], [running], {"ip-10-0-1-7": SAID})
    assert not report.of(Kind.HOST_INTERRUPTED) and not report.of(Kind.IDLE_HOST_INTERRUPTED)
    assert slurm.updates == []


def test_the_reader_says_each_new_notice_once_and_keeps_the_last_through_a_failed_list():
    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "mode": "slots", "cpus": 2, "memory": "1Gi",
                                                "domains": [{"name": "d", "count": 1}]}]})
    said: list[str] = []
    answers: list = [[_node("a", [SPOT])], [_node("a", [SPOT]), _node("b", [KARPENTER])], RuntimeError("503")]

    def list_nodes():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    reader = NoticeReader(spec, list_nodes, said.append)
    assert set(reader.read()) == {"a"}
    assert set(reader.read()) == {"a", "b"}
    assert set(reader.read()) == {"a", "b"}  # the list failed: the last notices stand
    assert said == [SAID.replace("ip-10-0-1-7", "a"), "kubernetes node b has interruption notice "
                    "karpenter.sh/disrupted:NoSchedule", "cannot list the Kubernetes nodes for interruption notices: 503"]


def test_a_pinned_pools_node_with_a_notice_stays_in_slurm_drained_naming_it():
    """Not excluded as an untolerated taint would be (its Slurm node would leave): it keeps its place
    and is drained until it is gone; with the list emptied the taint keeps the node out as before."""
    spec = parse_spec({"name": "t", "pools": [{"name": "p", "node_selector": {"pool": "p"}}]})
    nodes = nodes_from_api([k8s_node("n0", {"pool": "p"}, taints=[KARPENTER]), k8s_node("n1", {"pool": "p"})])
    inv = build_inventory(spec, nodes)
    assert inv.names == ["p-n0", "p-n1"]
    assert inv["p-n0"].unavailable == "kubernetes node n0 has interruption notice karpenter.sh/disrupted:NoSchedule"
    assert inv["p-n1"].unavailable is None
    off = spec.model_copy(update={"elasticity": spec.elasticity.model_copy(update={"interruption_taints": []})})
    inv = build_inventory(off, nodes)
    assert inv.names == ["p-n1"] and "karpenter.sh/disrupted" in inv.excluded[0].reason


def test_the_node_watch_nudges_the_loop_for_a_new_notice_only_and_resumes_after_a_failure():
    """A notice the reader has not seen yet sets the nudge (the next pass comes at once, not after
    the 10 s period); one it knows, or a node without one, does not; a failed watch is said once
    and retried from the watch cache ("0"); an ERROR event (410) starts from "0" again too."""
    import threading

    from provisioner.reconcile.notices import NoticeWatch

    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "mode": "slots", "cpus": 2, "memory": "1Gi",
                                                "domains": [{"name": "d", "count": 1}]}]})
    reader = NoticeReader(spec, lambda: [], lambda _: None)
    reader.last = {"known": "kubernetes node known has interruption notice ..."}
    nudge, said, asked = threading.Event(), [], []

    def node(name, version, taints=()):
        obj = _node(name, taints)
        obj["metadata"]["resourceVersion"] = version
        return obj

    scripts = [
        [{"type": "ADDED", "object": node("known", "5", [KARPENTER])}, {"type": "ADDED", "object": node("calm", "6")}],
        [{"type": "MODIFIED", "object": node("spot", "7", [SPOT])}],
        RuntimeError("connection reset"),
        RuntimeError("connection reset"),
        [{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}],
    ]

    def watch(version):
        asked.append(version)
        if not scripts:
            w.stop()
            return iter(())
        step = scripts.pop(0)
        if isinstance(step, Exception):
            raise step
        if step[0]["type"] == "MODIFIED":
            assert not nudge.is_set()  # nothing new before this event
        return iter(step)

    w = NoticeWatch(reader, watch, nudge, said.append, retry_s=(0.0, 0.0))
    w.run()
    assert nudge.is_set() and w.nudges == 1
    assert asked == ["0", "6", "7", "0", "0", "0"]
    assert said == ["node watch for interruption notices failed (connection reset); the pass's list still reads "
                    "them; retrying"]


def test_the_loops_wait_ends_at_a_nudge_or_a_stop_and_clears_the_nudge():
    import threading
    import time
    from types import SimpleNamespace

    from provisioner.reconcile.main import _wait

    loop = SimpleNamespace(stop=threading.Event(), nudge=threading.Event())
    threading.Timer(0.3, loop.nudge.set).start()
    t0 = time.monotonic()
    _wait(loop, 10)
    assert time.monotonic() - t0 < 2 and not loop.nudge.is_set()
    threading.Timer(0.3, loop.stop.set).start()
    t0 = time.monotonic()
    _wait(loop, 10)
    assert time.monotonic() - t0 < 2
