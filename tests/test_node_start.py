"""A pool whose Kubernetes nodes an autoscaler adds on demand (issue 42, item 5): pools[].node_start_timeout.

Its worker pods say how long they may wait Unschedulable, the reconcile loop waits that long (not
its 3-minute bound), Slurm's ResumeTimeout for the pool's partition grows by it, the waiting job's
comment names the scheduler's message, and a node that never comes ends DOWN with a clear reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import node
from fakes.backend import FakeBackend
from fakes.slurm import FakeSlurmClient

from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.elastic.backend import Worker
from provisioner.elastic.ledger import Policy
from provisioner.elastic.pods import worker_from_pod
from provisioner.elastic.programs import Log
from provisioner.errors import SpecError
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api
from provisioner.reconcile.classify import Kind, Snapshot, classify
from provisioner.reconcile.kueuewait import explain
from provisioner.slurm.state import JobStatus, parse_nodes

NOW = 1_000_000.0
UNSCHED = "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."


def _spec(**burst):
    return parse_spec({"name": "t", "elasticity": {"resume_timeout": "5m"}, "pools": [
        {"name": "burst", "mode": "slots", "cpus": 2, "memory": "2Gi", "domain_label": "zone",
         "domains": [{"name": "a", "count": 2}], **burst},
        {"name": "cpu", "node_selector": {"p": "c"}}]})


def _generated(**burst):
    spec = _spec(**burst)
    return spec, generate(spec, nodes_from_api([node("c1", {"p": "c", "zone": "a"})]))


def test_node_start_timeout_is_a_duration_of_at_least_30s():
    assert _spec(node_start_timeout="10m").pool("burst").node_start_timeout == 600
    assert _spec().pool("burst").node_start_timeout is None
    with pytest.raises(SpecError, match="node_start_timeout"):
        _spec(node_start_timeout="10s")


def test_the_pools_partition_gets_resume_timeout_plus_node_start_and_others_keep_the_global_one():
    _, gen = _generated(node_start_timeout="10m")
    lines = {line.split()[0]: line for line in gen.files["slurm.conf"].splitlines() if line.startswith("PartitionName=")}
    assert "ResumeTimeout=900" in lines["PartitionName=burst"]  # 5m + 10m
    assert "ResumeTimeout" not in lines["PartitionName=cpu"]
    assert "\nResumeTimeout=300\n" in gen.files["slurm.conf"]
    _, plain = _generated()
    assert "ResumeTimeout=" not in "".join(ln for ln in plain.files["slurm.conf"].splitlines()
                                           if ln.startswith("PartitionName="))


def test_the_worker_pod_carries_its_bound_and_the_backend_reads_it_back():
    spec, gen = _generated(node_start_timeout="10m")
    burst = m.worker_pod(spec, gen.inventory.in_pool("burst")[0])
    assert burst["metadata"]["annotations"]["slurmk8s.io/node-start-timeout"] == "600"
    # in the pool's template too: the worker admission policy admits what the template has
    assert m.worker_pod_template(spec, spec.pool("burst"))["metadata"]["annotations"][
        "slurmk8s.io/node-start-timeout"] == "600"
    assert worker_from_pod(burst).start_bound == 600
    cpu = m.worker_pod(spec, gen.inventory.in_pool("cpu")[0])
    assert "slurmk8s.io/node-start-timeout" not in cpu["metadata"].get("annotations", {})
    assert worker_from_pod(cpu).start_bound is None


def _pending(age: float, start_bound: float | None) -> Snapshot:
    _, gen = _generated(node_start_timeout="10m")
    name = gen.inventory.in_pool("burst")[0].name
    nodes = parse_nodes({"nodes": [{"name": name, "state": ["IDLE", "CLOUD", "POWERING_UP"], "reason": "",
                                    "partitions": ["burst"]}]})
    return Snapshot(nodes, {name: Worker(name, "Pending", UNSCHED, created_at=NOW - age, start_bound=start_bound)},
                    gen.inventory, {})


def test_an_unschedulable_worker_waits_its_pools_node_start_then_ends_down_naming_the_scheduler():
    policy = Policy()  # the loop's own bound: 180 s
    by_kind = lambda s: {f.node: f for f in classify(s, NOW, policy)}  # noqa: E731
    [waiting] = by_kind(_pending(400, 600)).values()
    assert waiting.kind == Kind.OK  # past the loop's 180 s, within the pool's 600 s: an autoscaler may add a node
    [plain] = by_kind(_pending(400, None)).values()
    assert plain.kind == Kind.STUCK_PENDING
    [gone] = by_kind(_pending(601, 600)).values()
    assert gone.kind == Kind.STUCK_PENDING
    assert gone.down_reason.startswith("slurmk8s stuck-pending: no Kubernetes node took it in 601s: pod ")
    assert "Insufficient cpu" in gone.down_reason


def test_a_job_waiting_for_a_kubernetes_node_says_so_in_its_comment_and_it_is_cleared_once_placed(tmp_path: Path):
    def run(worker: Worker, comment: str = "") -> list[list[str]]:
        slurm = FakeSlurmClient()
        jobs = [JobStatus.from_json({"job_id": 9, "job_state": ["PENDING", "CONFIGURING"], "nodes": worker.name,
                                     "comment": comment})]
        _, gen = _generated(node_start_timeout="10m")
        errors = explain(slurm, FakeBackend(workers={worker.name: worker}), Snapshot({}, {worker.name: worker},
                         gen.inventory, {}), jobs, Log("reconcile", str(tmp_path / "r.log")))
        assert errors == []
        return slurm.updates

    name = "burst-a-0"
    [[*_, comment]] = run(Worker(name, "Pending", UNSCHED))
    assert comment == (f"comment=slurmk8s: waiting for a Kubernetes node for {name} (pod {name} Pending ({UNSCHED}))")
    ours = comment.split("=", 1)[1]
    assert run(Worker(name, "Pending", UNSCHED), ours) == []  # written once
    assert run(Worker(name, "Running"), ours) == [["scontrol", "update", "jobid=9", "comment="]]
    assert run(Worker(name, "Pending", UNSCHED), "my run 3") == []  # the owner's comment stays


def test_the_prolog_and_the_programs_bound_follow_the_longest_resume_timeout_of_any_partition(tmp_path: Path):
    """A job on the late pool's nodes is waited for as long as Slurm waits for them (the partition's
    ResumeTimeout), not the global one: the PrologSlurmctld's boot wait and the programs' budget read it."""
    from provisioner.elastic import prolog
    from provisioner.elastic.context import conf_seconds

    _, gen = _generated(node_start_timeout="10m")
    conf = tmp_path / "slurm.conf"
    conf.write_text(gen.files["slurm.conf"])
    assert prolog.resume_timeout_from_conf(str(conf)) == 900
    assert conf_seconds(str(conf), "SuspendTimeout") == 15  # no partition sets one
    conf.write_text("ResumeTimeout=300\nPartitionName=a Nodes=a-[0-1] ResumeTimeout=90 State=UP\n")
    assert conf_seconds(str(conf), "ResumeTimeout") == 300
