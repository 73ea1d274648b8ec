"""A worker replaced since a finding was made about it is never deleted for its predecessor's fault
(issue #16 item 4): every delete of the reconcile loop is conditional on the uid of the worker the
finding was about (a Kubernetes uid precondition; the container id for Docker), and a finding whose
worker was replaced stops there (no DOWN, no failure counted against the pool)."""

from __future__ import annotations

import time

from factories import node
from fakes.docker import FakeDockerEngine
from fakes.kube import FakePodApi
from fakes.ledger import MemoryLedger
from fakes.slurm import FakeSlurmClient

from provisioner.config import parse_spec
from provisioner.elastic.docker_backend import LABEL_CLUSTER, LABEL_NODE, DockerBackend, DockerConfig
from provisioner.elastic.k8s_backend import KubernetesBackend
from provisioner.elastic.ledger import Policy
from provisioner.generate import generate
from provisioner.inventory import Inventory, SlurmNode, nodes_from_api
from provisioner.logs import Log
from provisioner.reconcile.act import run_once

NS = "slurm-t"


def up(name: str, boot: float) -> dict:
    return {"name": name, "state": ["ALLOCATED", "CLOUD"], "reason": "", "partitions": ["cpu"],
            "boot_time": {"set": True, "infinite": False, "number": int(boot)},
            "slurmd_start_time": {"set": True, "infinite": False, "number": 0}}


class ResumeRacesTheLoop:
    """The backend the loop sees, while a resume replaces `node`'s worker right after the loop's list."""

    def __init__(self, inner, replace) -> None:
        self.inner, self.replace, self.raced = inner, replace, False

    def list(self):
        workers = self.inner.list()
        if not self.raced:
            self.raced = True
            self.replace()
        return workers

    def create(self, node, group=None):
        self.inner.create(node, group)

    def queues(self):
        return self.inner.queues()

    def workload(self, group):
        return self.inner.workload(group)

    def mark_busy(self, name, uid, busy):
        return self.inner.mark_busy(name, uid, busy)

    def taken_gone(self):
        return self.inner.taken_gone()

    def delete(self, name, uid=None, force=False, version=None):
        if uid is None:
            return self.inner.delete(name)
        return self.inner.delete(name, uid, version=version)


def test_the_loop_never_deletes_the_pod_that_replaced_the_one_it_judged():
    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "node_selector": {"p": "c"}}]})
    inv = generate(spec, nodes_from_api([node("n1", {"p": "c"})])).inventory
    api = FakePodApi(namespaces={NS})
    backend = KubernetesBackend(spec, api, sleep=api.sleep, clock=api.clock)
    backend.create(inv["cpu-n1"])
    api.set_phase(NS, "cpu-n1", "Failed")  # the old pod died: the loop will judge it worker-failed
    old = api.pods[(NS, "cpu-n1")]["metadata"]["uid"]
    api.advance(300)
    racing = ResumeRacesTheLoop(backend, lambda: backend.create(inv["cpu-n1"]))  # Slurm resumed the node again
    ledger, slurm, log = MemoryLedger(), FakeSlurmClient(nodes=[up("cpu-n1", api.now - 600)]), Log("reconcile-test")
    report = run_once(slurm, racing, inv, ledger, api.now, log, Policy())
    [finding] = report.acted
    assert finding.kind.value == "worker-failed" and finding.uid == old
    new = api.pods[(NS, "cpu-n1")]
    assert new["metadata"]["uid"] != old
    assert "deletionTimestamp" not in new["metadata"], "the fresh pod was deleted for its predecessor's fault"
    assert slurm.updates == [] and ledger.load() == {}, "the fresh attempt's node was set DOWN / counted"
    assert any("replaced" in line for line in log.lines), log.lines


def test_the_docker_backend_deletes_by_container_id_too():
    config = DockerConfig(cluster="c1", network="net1", controller="ctld:6817")
    engine = FakeDockerEngine()
    backend = DockerBackend(config, engine)
    labels = {LABEL_CLUSTER: "c1", LABEL_NODE: "cpu-0"}
    old = engine.run("cpu-0", labels, state="exited", created=time.time() - 300)
    inv = Inventory((SlurmNode("cpu-0", "cpu", "cpu", 2, 1024),))

    def replace() -> None:  # a resume: the dead container goes, a new one with the node's name starts
        engine.call("DELETE", "/containers/cpu-0", query={"force": "1"})
        backend.create(inv["cpu-0"])

    racing = ResumeRacesTheLoop(backend, replace)
    slurm, log = FakeSlurmClient(nodes=[up("cpu-0", time.time() - 600)]), Log("reconcile-test")
    report = run_once(slurm, racing, inv, MemoryLedger(), time.time(), log, Policy())
    assert [f.uid for f in report.acted] == [old]
    assert len(engine.containers) == 1, "the new container was removed for its predecessor's fault"
    [current] = engine.containers.values()
    assert current["Id"] != old and current["State"] == "running"
    assert slurm.updates == []


def _one_pinned_pod():
    """A fake API holding the pod of pinned node cpu-n1 (bound to n1): (api, backend, the pod's uid)."""
    spec = parse_spec({"name": "t", "pools": [{"name": "cpu", "node_selector": {"p": "c"}}]})
    inv = generate(spec, nodes_from_api([node("n1", {"p": "c"})])).inventory
    api = FakePodApi(namespaces={NS})
    backend = KubernetesBackend(spec, api, sleep=api.sleep, clock=api.clock)
    backend.create(inv["cpu-n1"])
    return api, backend, api.pods[(NS, "cpu-n1")]["metadata"]["uid"]


def test_a_kubernetes_delete_with_a_uid_removes_only_that_pod():
    import pytest

    from provisioner.elastic.backend import WorkerGone, WorkerReplaced

    api, backend, uid = _one_pinned_pod()
    with pytest.raises(WorkerReplaced, match="left alone"):
        backend.delete("cpu-n1", "uid-of-an-older-pod")
    assert "deletionTimestamp" not in api.pods[(NS, "cpu-n1")]["metadata"]
    backend.delete("cpu-n1", uid)
    assert backend.list()["cpu-n1"].phase == "Terminating"
    api.advance(60)
    with pytest.raises(WorkerGone):  # gone: nothing deleted, and the caller's finding is stale (issue 40)
        backend.delete("cpu-n1", uid)
    backend.delete("cpu-n1")  # by name (the suspend's): gone is a no-op
    assert backend.list() == {}


def test_a_forced_kubernetes_delete_removes_the_pod_at_once_and_keeps_the_uid_condition():
    """A worker whose host stopped answering: a graceful delete would leave the pod Terminating until
    the host answers (and the node's next pod could not be created); forced, it is gone at once."""
    import pytest

    from provisioner.elastic.backend import WorkerReplaced

    api, backend, uid = _one_pinned_pod()
    with pytest.raises(WorkerReplaced):
        backend.delete("cpu-n1", "uid-of-an-older-pod", force=True)
    backend.delete("cpu-n1", uid, force=True)
    assert backend.list() == {}
