"""A finding of the reconcile loop acts only on the worker as the loop judged it (issue 40): a pod
that a resume adopted after the loop's look (item 2), or one that went away meanwhile (read-only
finding: a SET_DOWN after a delete that found the pod gone could hit the node's next attempt), is
left to the next pass, which judges what is there then.

The loop's delete carries the judged pod's uid and resourceVersion as preconditions; a resume that
keeps a live pod writes to it (an annotation, conditional on the version it read), so exactly one
of the two wins, whatever the order: the API server's own compare-and-swap on the pod."""

from __future__ import annotations

import pytest
from factories import node
from fakes.kube import FakePodApi
from fakes.ledger import MemoryLedger
from fakes.slurm import FakeSlurm, FakeSlurmClient

from provisioner.config import parse_spec
from provisioner.elastic.calls import act
from provisioner.elastic.k8s_backend import KubernetesBackend
from provisioner.elastic.ledger import Policy
from provisioner.elastic.plan import Action, Reason, plan_resume
from provisioner.names import A_ADOPTED
from provisioner.elastic.programs import Context, run_resume
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api
from provisioner.logs import Log
from provisioner.reconcile.act import run_once

NS = "slurm-t"


def state(name: str, *words: str) -> dict:
    return {"name": name, "state": list(words), "reason": "", "partitions": ["cpu"],
            "boot_time": {"set": True, "infinite": False, "number": 0},
            "slurmd_start_time": {"set": True, "infinite": False, "number": 0}}


class ThenMeanwhile(FakeSlurmClient):
    """Slurm's nodes as the loop reads them; right after that read, `meanwhile()` runs (what a
    resume or another program did between the loop's look and its acts)."""

    def __init__(self, nodes, meanwhile) -> None:
        super().__init__(nodes=nodes)
        self.meanwhile, self.ran = meanwhile, False

    def show_nodes(self):
        doc = super().show_nodes()
        if not self.ran:
            self.ran = True
            self.meanwhile()
        return doc


@pytest.fixture
def world():
    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "node_selector": {"p": "c"}}]})
    inv = generate(spec, nodes_from_api([node("n1", {"p": "c"})])).inventory
    api = FakePodApi(namespaces={NS})
    backend = KubernetesBackend(spec, api, sleep=api.sleep, clock=api.clock)
    return inv, api, backend


def test_a_pod_a_resume_adopted_after_the_loops_look_is_not_deleted(world):
    """Issue 40 item 2: a worker left for a powered-down node (a head start whose job was
    cancelled); the loop judges it worker-for-powered-down-node, then Slurm resumes the node for a
    new job and the resume keeps that running pod. The loop's delete must not remove it: its uid is
    the same, so the uid precondition alone passed, and the job waited out ResumeTimeout."""
    inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Running")
    uid = api.pods[(NS, "cpu-n1")]["metadata"]["uid"]
    api.advance(300)  # well past the loop's grace
    slurm_programs = FakeSlurm()
    resumed = []

    def resume() -> None:  # ResumeProgram for the new job, between the loop's read and its delete
        ctx = Context({}, Log("resume-test"), backend=backend, slurm=slurm_programs, inventory=inv)
        resumed.append(run_resume(["cpu-n1"], ctx, None).code)

    slurm = ThenMeanwhile([state("cpu-n1", "IDLE", "CLOUD", "POWERED_DOWN")], resume)
    log = Log("reconcile-test")
    report = run_once(slurm, backend, inv, MemoryLedger(), api.now, log, Policy())
    [finding] = report.acted
    assert finding.kind.value == "worker-for-powered-down-node" and finding.uid == uid
    assert resumed == [0] and slurm_programs.down == {}
    pod = api.pods.get((NS, "cpu-n1"))
    assert pod is not None and pod["metadata"]["uid"] == uid
    assert "deletionTimestamp" not in pod["metadata"], "the loop deleted the pod the resume had just kept"
    assert [d.outcome for d in report.done] == ["skipped"]
    assert any("changed since" in line for line in log.lines), log.lines


def test_a_resume_does_not_keep_a_pod_the_loop_deleted_first(world):
    """The other order: the loop's delete lands between the resume's list and its adoption. The
    adoption's write fails on the changed version, and the resume makes the node's next pod once the
    old one is gone, instead of counting on a pod that is terminating."""
    inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Running")
    workers = backend.list(["cpu-n1"])
    [decision] = plan_resume(["cpu-n1"], inv, workers)
    assert (decision.action, decision.reason) == (Action.ADOPT, Reason.ALREADY_RUNNING)
    old = workers["cpu-n1"]
    backend.delete("cpu-n1", old.uid, version=old.version)  # the loop's, judged a pass earlier
    assert api.pods[(NS, "cpu-n1")]["metadata"].get("deletionTimestamp")
    outcome = act(backend, decision)
    assert outcome.ok, outcome.error
    pod = api.pods[(NS, "cpu-n1")]
    assert pod["metadata"]["uid"] != old.uid and "deletionTimestamp" not in pod["metadata"]


def test_an_adopted_pod_says_so_and_a_resume_of_a_live_pod_costs_one_call(world):
    inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Running")
    w = backend.list(["cpu-n1"])["cpu-n1"]
    api.calls.clear()
    assert backend.adopt("cpu-n1", w.uid, w.version)
    assert [c[0] for c in api.calls] == ["patch"]
    meta = api.pods[(NS, "cpu-n1")]["metadata"]
    assert meta["annotations"][A_ADOPTED] and meta["resourceVersion"] != w.version
    # a version read before another change (the kubelet's status): looked at again, then kept
    api.set_phase(NS, "cpu-n1", "Running")
    assert backend.adopt("cpu-n1", w.uid, w.version)
    assert not backend.adopt("cpu-n1", "uid-of-another-pod", "")


@pytest.mark.parametrize("phase, waiting, kind", [("Failed", None, "worker-failed"),
                                                  ("Pending", "ErrImagePull", "stuck-pending")])
def test_a_pod_removed_before_the_loops_delete_sets_no_node_down(world, phase, waiting, kind):
    """Read-only finding of issue 40: the loop judged the node's failed pod; before its delete, the
    attempt ended and another began (the resume-fail removed the pod by name, the node was resumed
    again, its next pod not created yet). The delete finds the pod gone (404), or terminating: the
    SET_DOWN that followed it hit the node's next attempt (its job requeued) and the failure was
    counted against the pool a second time. Now the finding stops there; the next pass judges."""
    inv, api, backend = world
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", phase, waiting=waiting)
    uid = api.pods[(NS, "cpu-n1")]["metadata"]["uid"]
    api.advance(300)

    def attempt_ended() -> None:  # the resume-fail's delete (by name; gracefully)
        backend.delete("cpu-n1")

    slurm = ThenMeanwhile([state("cpu-n1", "ALLOCATED", "CLOUD", "POWERING_UP")], attempt_ended)
    ledger, log = MemoryLedger(), Log("reconcile-test")
    report = run_once(slurm, backend, inv, ledger, api.now, log, Policy())
    [finding] = report.acted
    assert finding.kind.value == kind and finding.uid == uid
    assert slurm.updates == [], "a node was set DOWN after its judged pod had gone"
    assert ledger.load() == {}
    assert [d.outcome for d in report.done] == ["skipped"]
