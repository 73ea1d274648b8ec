"""Pools under Kueue (issue 41): the pods of one job's power-up are one Kueue pod group, named anew
each power-up; the pods carry Kueue's labels; a deleted pod does not wait for its group's end.
The real Kueue is exercised by e2e/test_e2e_kueue.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import node
from fakes.backend import FakeBackend
from fakes.kube import FakePodApi
from fakes.slurm import FakeSlurm

from provisioner import kueue
from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.elastic.bootgate import BootGate
from provisioner.elastic.early import run_early_resume
from provisioner.elastic.k8s_backend import KubernetesBackend
from provisioner.elastic.pods import worker_from_pod
from provisioner.elastic.programs import Context, Log, run_resume
from provisioner.errors import SpecError
from provisioner.generate import generate
from provisioner.inventory import Inventory, SlurmNode, nodes_from_api
from provisioner.names import A_ADOPTED

NS = "slurm-t"


def _spec(**kueue_cfg):
    return parse_spec({"name": "t", "pools": [
        {"name": "gpu", "node_selector": {"p": "g"}, "kueue": {"queue": "team-a", **kueue_cfg}},
        {"name": "cpu", "node_selector": {"p": "c"}}]})


def _inventory(spec):
    nodes = [node(n, {"p": "g"}) for n in ("g1", "g2", "g3")] + [node("c1", {"p": "c"})]
    return generate(spec, nodes_from_api(nodes)).inventory


# ---------------------------------------------------------------- spec and pods


def test_a_kueue_pool_names_a_queue_that_is_a_kubernetes_name():
    with pytest.raises(SpecError, match="pools\\[0\\].kueue.queue"):
        parse_spec({"name": "t", "pools": [{"name": "gpu", "kueue": {"queue": "Team_A"}}]})
    with pytest.raises(SpecError, match="kueue"):
        parse_spec({"name": "t", "pools": [{"name": "gpu", "kueue": {}}]})


def test_the_pods_of_a_kueue_pool_carry_the_queue_and_one_role_per_size():
    spec = _spec(priority_class="research")
    inv = _inventory(spec)
    pods = [m.worker_pod(spec, inv[n]) for n in ("gpu-g1", "gpu-g2")]
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[kueue.QUEUE_LABEL] == "team-a" and labels[kueue.PRIORITY_LABEL] == "research"
        assert annotations[kueue.RETRIABLE] == "false"
        assert kueue.GROUP_LABEL not in labels  # the group is the power-up's, set at create
    # pinned to different Kubernetes nodes, same size: one pod set in the group
    assert pods[0]["spec"]["affinity"] != pods[1]["spec"]["affinity"]
    assert pods[0]["metadata"]["annotations"][kueue.ROLE_HASH] == pods[1]["metadata"]["annotations"][kueue.ROLE_HASH]
    cpu = m.worker_pod(spec, inv["cpu-c1"])
    assert not {kueue.QUEUE_LABEL, kueue.PRIORITY_LABEL} & set(cpu["metadata"]["labels"])
    assert not {kueue.RETRIABLE, kueue.ROLE_HASH} & set(cpu["metadata"].get("annotations", {}))


# ---------------------------------------------------------------- groups


def test_one_jobs_pods_in_one_queue_are_one_group_named_anew_each_power_up():
    queue_of = {"g1": "a", "g2": "a", "g3": "b", "c1": ""}
    groups = kueue.assign_groups([(7, ["g1", "g2", "g3", "c1"])], queue_of, [], "tok")
    assert groups == {"g1": kueue.PodGroup("slurm-job7-tok-0", 2), "g2": kueue.PodGroup("slurm-job7-tok-0", 2),
                      "g3": kueue.PodGroup("slurm-job7-tok-1", 1)}
    assert groups["g1"].job == 7
    one = kueue.assign_groups([(7, ["g1", "g2"])], queue_of, [], kueue.new_token())
    again = kueue.assign_groups([(7, ["g1", "g2"])], queue_of, [], kueue.new_token())
    assert one["g1"].name != again["g1"].name  # a name used again would join an old workload


def test_a_forming_group_is_completed_and_an_admitted_one_is_not_replaced():
    queue_of = {"g1": "a", "g2": "a", "g3": "a"}
    forming = [kueue.Member("g1", "slurm-job7-old", 3), kueue.Member("g2", "slurm-job7-old", 3)]
    assert kueue.assign_groups([(7, ["g3"])], queue_of, forming, "new") == {"g3": kueue.PodGroup("slurm-job7-old", 3)}
    admitted = [kueue.Member("g1", "slurm-job7-old", 3, gated=False), kueue.Member("g2", "slurm-job7-old", 3, gated=False)]
    assert kueue.assign_groups([(7, ["g3"])], queue_of, admitted, "new") == {"g3": kueue.PodGroup("slurm-job7-new", 1)}
    other_job = [kueue.Member("g1", "slurm-job8-old", 3)]
    assert kueue.assign_groups([(7, ["g3"])], queue_of, other_job, "new") == {"g3": kueue.PodGroup("slurm-job7-new", 1)}


def _ctx(backend, inv, tmp_path: Path, program: str = "resume") -> Context:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\n")
    return Context({"SLURMK8S_BUDGET": "5", "SLURM_CONF": str(conf)}, Log(program, str(tmp_path / "elastic.log")),
                   backend=backend, slurm=FakeSlurm(), inventory=inv)


def _inv(*names: str) -> Inventory:
    return Inventory(tuple(SlurmNode(n, n.split("-")[0], n.split("-")[0], 2, 1024) for n in names))


def test_a_resume_makes_each_jobs_pods_one_group_and_a_second_one_joins_the_forming_group(tmp_path: Path):
    inv = _inv("gpu-0", "gpu-1", "gpu-2", "cpu-0")
    backend = FakeBackend(pool_queues={"gpu": "team-a"}, fail={"gpu-1": "Kubernetes API error 500"})
    resume_file = json.dumps({"all_nodes_resume": "gpu-[0-2],cpu-0", "jobs": [
        {"job_id": 41, "nodes_resume": "gpu-[0-1],cpu-0", "nodes_alloc": "gpu-[0-1],cpu-0"},
        {"job_id": 42, "nodes_resume": "gpu-2", "nodes_alloc": "gpu-2"}]})
    run_resume(["gpu-[0-2],cpu-0"], _ctx(backend, inv, tmp_path), resume_file)
    g41, g42 = backend.groups["gpu-0"], backend.groups["gpu-2"]
    assert (g41.job, g41.total, g42.job, g42.total) == (41, 2, 42, 1)
    assert backend.groups["gpu-1"] == g41 and "cpu-0" not in backend.groups  # cpu is under no queue
    assert backend.workers["gpu-0"].gated and "gpu-1" not in backend.workers
    # Slurm resumes gpu-1 again (its create failed): it completes job 41's group, still gated
    backend.fail.clear()
    backend.groups.clear()
    run_resume(["gpu-[0-1]"], _ctx(backend, inv, tmp_path), json.dumps({
        "all_nodes_resume": "gpu-[0-1]", "jobs": [{"job_id": 41, "nodes_resume": "gpu-[0-1]", "nodes_alloc": "gpu-[0-1]"}]}))
    assert backend.groups == {"gpu-1": g41}
    assert f"gpu-0 adopt (already-running) jobs=41 group={g41.name}/2" in (tmp_path / "elastic.log").read_text()


def test_the_prologs_head_start_makes_the_group_slurms_resume_keeps(tmp_path: Path):
    inv = _inv("gpu-0", "gpu-1")
    backend = FakeBackend(pool_queues={"gpu": "team-a"})
    gate = BootGate()
    assert run_early_resume(["51", "gpu-[0-1]"], _ctx(backend, inv, tmp_path, "early-resume"), gate).code == 0
    group = backend.groups["gpu-0"]
    assert backend.groups == {"gpu-0": group, "gpu-1": group} and (group.job, group.total) == (51, 2)
    backend.groups.clear()
    run_resume(["gpu-[0-1]"], _ctx(backend, inv, tmp_path), json.dumps({
        "all_nodes_resume": "gpu-[0-1]", "jobs": [{"job_id": 51, "nodes_resume": "gpu-[0-1]", "nodes_alloc": "gpu-[0-1]"}]}))
    assert backend.groups == {} and ("adopt", "gpu-0") in backend.calls  # kept, no new group


# ---------------------------------------------------------------- the Kubernetes backend


@pytest.fixture
def world():
    spec = _spec()
    api = FakePodApi(namespaces={NS})
    backend = KubernetesBackend(parse_spec({**spec.model_dump(mode="json", exclude_none=True), "namespace": NS}),
                                api, sleep=api.sleep, clock=api.clock, poll=0.5)
    return _inventory(spec), api, backend


def test_the_backend_labels_the_group_and_reads_it_back(world):
    inv, api, backend = world
    assert backend.queues() == {"gpu": "team-a"}
    backend.create(inv["gpu-g1"], kueue.PodGroup("slurm-job9-x", 2))
    pod = api.pods[(NS, "gpu-g1")]
    assert pod["metadata"]["labels"][kueue.GROUP_LABEL] == "slurm-job9-x"
    assert pod["metadata"]["annotations"][kueue.GROUP_TOTAL] == "2"
    pod["spec"]["schedulingGates"] = [{"name": g} for g in kueue.GATES]  # as Kueue's webhook adds them
    w = worker_from_pod(pod)
    assert (w.group, w.group_total, w.gated) == ("slurm-job9-x", 2, True)
    backend.create(inv["cpu-c1"], kueue.PodGroup("slurm-job9-x", 2))  # a pool under no queue: no group
    assert kueue.GROUP_LABEL not in api.pods[(NS, "cpu-c1")]["metadata"]["labels"]


def test_a_deleted_pod_does_not_wait_for_the_rest_of_its_group(world):
    """Kueue keeps its finalizer on a group's pods until the group is done; a suspended node's
    pod must go like any other, or the node's next worker (same name) could not be created."""
    inv, api, backend = world
    backend.create(inv["gpu-g1"], kueue.PodGroup("slurm-job9-x", 2))
    pod = api.pods[(NS, "gpu-g1")]
    pod["metadata"]["finalizers"] = ["other.example/keep", kueue.FINALIZER]
    api.set_phase(NS, "gpu-g1", "Running")
    backend.delete("gpu-g1")
    assert api.pods[(NS, "gpu-g1")]["metadata"]["finalizers"] == ["other.example/keep"]  # another's stays
    api.pods[(NS, "gpu-g1")]["metadata"]["finalizers"] = [kueue.FINALIZER]
    api.advance(60)  # grace over: kept by the finalizer alone
    assert api.pods[(NS, "gpu-g1")]["status"]["phase"] == "Failed"
    backend.create(inv["gpu-g1"], kueue.PodGroup("slurm-job10-y", 1))  # the next power-up
    assert api.pods[(NS, "gpu-g1")]["metadata"]["labels"][kueue.GROUP_LABEL] == "slurm-job10-y"
    assert "deletionTimestamp" not in api.pods[(NS, "gpu-g1")]["metadata"]


# ---------------------------------------------------------------- the admission policy


def _admitted_by_kueue(spec, inv, name: str, group: kueue.PodGroup | None) -> dict:
    """The pod as the backend creates it and Kueue's webhook leaves it, before validating admission."""
    from test_admission import as_admitted

    pod = m.worker_pod(spec, inv[name])
    if group is not None:
        pod["metadata"]["labels"][kueue.GROUP_LABEL] = group.name
        pod["metadata"]["annotations"][kueue.GROUP_TOTAL] = str(group.total)
    if kueue.QUEUE_LABEL in pod["metadata"]["labels"]:
        pod["metadata"]["labels"][kueue.MANAGED_LABEL] = "true"
        pod["metadata"]["finalizers"] = [kueue.FINALIZER]
        pod["spec"]["schedulingGates"] = [{"name": g} for g in kueue.GATES]
    return as_admitted(pod)


def test_the_policy_admits_a_kueue_pools_pod_as_kueue_leaves_it_and_nothing_more():
    from test_admission import admit

    spec = _spec(priority_class="research")
    inv = _inventory(spec)
    policy, user = m.worker_pod_policy(spec), m.controller_user(spec)
    pod = _admitted_by_kueue(spec, inv, "gpu-g1", kueue.PodGroup("slurm-job3-t", 2))
    assert admit(policy, pod, user) == []
    other_gate = json.loads(json.dumps(pod))
    other_gate["spec"]["schedulingGates"].append({"name": "example.com/hold"})
    assert any("scheduling gates other than Kueue" in r for r in admit(policy, other_gate, user))
    other_queue = json.loads(json.dumps(pod))
    other_queue["metadata"]["labels"][kueue.QUEUE_LABEL] = "team-b"
    assert any(f"label {kueue.QUEUE_LABEL}=team-b" in r for r in admit(policy, other_queue, user))
    # a pool under no queue: neither Kueue's gates nor a group
    cpu = _admitted_by_kueue(spec, inv, "cpu-c1", None)
    assert admit(policy, cpu, user) == []
    gated = json.loads(json.dumps(cpu))
    gated["spec"]["schedulingGates"] = [{"name": kueue.GATES[0]}]
    assert any("pool cpu is under no Kueue queue" in r for r in admit(policy, gated, user))
    grouped = json.loads(json.dumps(cpu))
    grouped["metadata"]["labels"][kueue.GROUP_LABEL] = "slurm-job3-t"
    assert any(f"label {kueue.GROUP_LABEL}=slurm-job3-t" in r for r in admit(policy, grouped, user))


def test_an_adoption_may_keep_what_kueue_wrote_at_admission():
    """Kueue writes the flavor's nodeSelector and tolerations into a pod it admits (an update of
    its own); the resume's adoption mark comes after and keeps them, a create may not bring them."""
    from test_admission import admit

    spec = _spec()
    inv = _inventory(spec)
    policy, user = m.worker_pod_policy(spec), m.controller_user(spec)
    old = _admitted_by_kueue(spec, inv, "gpu-g1", kueue.PodGroup("slurm-job3-t", 1))
    old["spec"].pop("schedulingGates")
    old["spec"]["nodeSelector"] = {**old["spec"].get("nodeSelector", {}), "cloud.example/flavor": "spot"}
    old["spec"]["tolerations"].append({"key": "spot", "operator": "Exists", "effect": "NoSchedule"})
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"][A_ADOPTED] = "1700000000.000 0a1b2c3d"
    assert admit(policy, new, user, old) == []
    refusals = admit(policy, new, user)
    assert any("the pod sets nodeSelector" in r for r in refusals) and any("tolerates spot" in r for r in refusals)


def test_a_wait_for_quota_that_outlasts_resume_timeout_is_no_failure_of_the_pool(tmp_path: Path):
    """ResumeTimeout bounds the wait for Kueue: the job is requeued, the node returned to service,
    and, its worker never admitted, nothing is counted towards the pool's backoff."""
    from provisioner.elastic.backend import Worker
    from provisioner.elastic.ledger import FileLedger
    from provisioner.elastic.programs import run_resume_fail

    ledger = str(tmp_path / "ledger.json")
    backend = FakeBackend(workers={
        "gpu-0": Worker("gpu-0", "Pending", reason="SchedulingGated", uid="u0", group="slurm-job5-t", group_total=2,
                        gated=True),
        "gpu-1": Worker("gpu-1", "Pending", reason="ErrImagePull: x", uid="u1", group="slurm-job5-t", group_total=2)})
    slurm = FakeSlurm()
    log = tmp_path / "elastic.log"
    c = Context({"SLURMK8S_BUDGET": "5", "SLURMK8S_LEDGER": ledger}, Log("resume-fail", str(log)), backend=backend,
                slurm=slurm, inventory=_inv("gpu-0", "gpu-1"))
    assert run_resume_fail(["gpu-[0-1]"], c).code == 0
    assert backend.workers == {} and slurm.returned == ["gpu-0", "gpu-1"]
    assert [f.node for f in FileLedger(ledger).load()["gpu"].failures] == ["gpu-1"]  # the admitted one failed
    assert "gpu-0: still waiting for Kueue's admission (group slurm-job5-t): not a failure" in log.read_text()


# ---------------------------------------------------------------- `up` refuses a queue that is not there

def _queues(*names, cluster_queue="cq", active=True):
    cond = {"type": "Active", "status": "True" if active else "False", "reason": "ClusterQueueIsInactive",
            "message": "Can't submit new workloads to clusterQueue"}
    return {n: {"metadata": {"name": n}, "spec": {"clusterQueue": cluster_queue}, "status": {"conditions": [cond]}}
            for n in names}


def test_up_refuses_a_kueue_pool_where_kueue_is_not_installed():
    from provisioner.deploy import preflight as pf

    (issue,) = pf.kueue_issues(_spec(), pf.ClusterFacts())
    assert issue.field == "pools[0].kueue" and "serves no kueue.x-k8s.io API" in issue.message
    assert "install Kueue" in issue.fix
    with pytest.raises(pf.PreflightError, match="nothing was applied"):
        pf.check(_spec(), pf.ClusterFacts())
    # a spec without a Kueue pool needs no Kueue
    assert pf.kueue_issues(parse_spec({"name": "t", "pools": [{"name": "cpu"}]}), pf.ClusterFacts()) == []


def test_up_refuses_a_missing_local_queue_naming_the_queues_that_exist():
    from provisioner.deploy import preflight as pf

    facts = pf.ClusterFacts(kueue_api="kueue.x-k8s.io/v1beta2", local_queues=_queues("team-b"),
                            cluster_queues={"cq": {}})
    (issue,) = pf.kueue_issues(_spec(), facts)
    assert issue.field == "pools[0].kueue.queue"
    assert issue.message == "LocalQueue 'team-a' not found in namespace slurm-t (LocalQueues there: team-b)"
    ok = pf.ClusterFacts(kueue_api="kueue.x-k8s.io/v1beta2", local_queues=_queues("team-a"), cluster_queues={"cq": {}})
    assert pf.kueue_issues(_spec(), ok) == []


def test_up_refuses_a_local_queue_whose_cluster_queue_is_missing_or_inactive_and_an_unknown_priority():
    from provisioner.deploy import preflight as pf

    api = "kueue.x-k8s.io/v1beta2"
    (gone,) = pf.kueue_issues(_spec(), pf.ClusterFacts(kueue_api=api, local_queues=_queues("team-a")))
    assert "points at ClusterQueue 'cq', which does not exist" in gone.message
    (idle,) = pf.kueue_issues(_spec(), pf.ClusterFacts(kueue_api=api, local_queues=_queues("team-a", active=False),
                                                       cluster_queues={"cq": {}}))
    assert "is inactive: ClusterQueueIsInactive" in idle.message and "kubectl describe clusterqueue cq" in idle.fix
    (prio,) = pf.kueue_issues(_spec(priority_class="urgent"),
                              pf.ClusterFacts(kueue_api=api, local_queues=_queues("team-a"), cluster_queues={"cq": {}}))
    assert prio.field == "pools[0].kueue.priority_class" and "'urgent' not found" in prio.message
    assert pf.kueue_issues(_spec(priority_class="urgent"), pf.ClusterFacts(
        kueue_api=api, local_queues=_queues("team-a"), cluster_queues={"cq": {}},
        priority_classes=frozenset({"urgent"}))) == []


# ---------------------------------------------------------------- a job held by Kueue says why

QUOTA = ("couldn't assign flavors to pod set 3f2a: insufficient unused quota for cpu in flavor default, "
         "2 more needed")


def _workload(status="False", message=QUOTA):
    return {"metadata": {"name": "w"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": status, "reason": "Pending", "message": message}]}}


def _held(tmp_path: Path, *, comment: str = "", gated: bool = True, present: int = 2, workloads=None,
          state: str = "CONFIGURING"):
    from fakes.slurm import FakeSlurmClient

    from provisioner.elastic.backend import Worker
    from provisioner.reconcile.classify import Snapshot
    from provisioner.reconcile.kueuewait import explain
    from provisioner.slurm.state import JobStatus

    inv = _inv("gpu-0", "gpu-1", "cpu-0")
    workers = {n: Worker(n, "Pending", group="slurm-job7-tok", group_total=2, gated=gated)
               for n in ("gpu-0", "gpu-1")[:present]}
    workers["cpu-0"] = Worker("cpu-0", "Running")
    backend = FakeBackend(workers=dict(workers), pool_queues={"gpu": "team-a"},
                          workloads={"slurm-job7-tok": _workload()} if workloads is None else workloads)
    slurm = FakeSlurmClient()
    states = ["PENDING", "CONFIGURING"] if state == "CONFIGURING" else [state]
    jobs = [JobStatus.from_json({"job_id": 7, "job_state": states, "comment": comment}),
            JobStatus.from_json({"job_id": 8, "job_state": ["RUNNING"], "comment": "mine"})]
    errors = explain(slurm, backend, Snapshot({}, workers, inv), jobs, Log("reconcile", str(tmp_path / "r.log")))
    return slurm.updates, errors, backend


def test_a_job_whose_pods_kueue_holds_says_why_in_its_comment_from_the_workloads_condition(tmp_path: Path):
    updates, errors, backend = _held(tmp_path)
    assert errors == [] and ("workload", "slurm-job7-tok") in backend.calls
    assert updates == [["scontrol", "update", "jobid=7", "comment=slurmk8s: waiting for Kueue (queue team-a, "
                        f"pod group slurm-job7-tok): {QUOTA}"]]
    # written once: the same comment is not written again; a job of other pools is never touched
    same = updates[0][3].split("=", 1)[1]
    assert _held(tmp_path, comment=same)[0] == []


def test_a_group_still_forming_has_no_workload_and_says_how_many_pods_exist(tmp_path: Path):
    updates, errors, backend = _held(tmp_path, present=1)
    assert ("workload", "slurm-job7-tok") not in backend.calls  # Kueue makes no Workload before the last pod
    assert updates[0][3].endswith("1 of 2 pods created, Kueue admits the group once all exist")


def test_the_comment_is_cleared_once_kueue_admits_and_an_owners_comment_is_never_touched(tmp_path: Path):
    ours = f"slurmk8s: waiting for Kueue (queue team-a, pod group slurm-job7-tok): {QUOTA}"
    assert _held(tmp_path, comment=ours, gated=False)[0] == [["scontrol", "update", "jobid=7", "comment="]]
    assert _held(tmp_path, comment=ours, gated=False, state="RUNNING")[0] == [
        ["scontrol", "update", "jobid=7", "comment="]]
    assert _held(tmp_path, comment="my experiment 12")[0] == []  # the owner's own comment stays
    assert _held(tmp_path, comment=ours, state="COMPLETED")[0] == []  # an ended job's comment is its history


def test_a_workload_that_cannot_be_read_leaves_the_comment_and_is_reported(tmp_path: Path):
    ours = "slurmk8s: waiting for Kueue (queue team-a, pod group slurm-job7-tok): 1 of 2 pods created"
    updates, errors, _ = _held(tmp_path, comment=ours, workloads={"slurm-job7-tok": "Kubernetes API unreachable"})
    assert updates == [] and errors == ["cannot read Kueue's Workload slurm-job7-tok: Kubernetes API unreachable"]


def test_why_waiting_reads_admitted_false_and_an_admitted_workload():
    held = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                      {"type": "Admitted", "status": "False", "reason": "AdmissionCheck",
                                       "message": "waiting for\n  admission checks"}]}}
    assert kueue.why_waiting("q", "g", held, 2, 2).endswith("): waiting for admission checks")
    admitted = {"status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
    assert kueue.why_waiting("q", "g", admitted, 2, 2).endswith("): admitted, the pods are starting")
    assert len(kueue.why_waiting("q", "g", _workload(message="x" * 2000), 2, 2)) == kueue.COMMENT_MAX


def test_kueue_down_makes_a_create_fail_with_a_reason_naming_kueue(world):
    from provisioner.elastic.backend import BackendError
    from provisioner.kubeapi import ApiError

    inv, api, backend = world
    # the API server's answer while Kueue's webhook Service has no endpoint (as seen on the local cluster)
    api.fail_next = [ApiError(500, "InternalError", 'Internal error occurred: failed calling webhook '
                              '"mpod.kb.io": failed to call webhook: Post "https://kueue-webhook-service.kueue-'
                              'system.svc:443/mutate--v1-pod?timeout=10s": no endpoints available for service '
                              '"kueue-webhook-service"')]
    with pytest.raises(BackendError) as err:
        backend.create(inv["gpu-g1"], kueue.PodGroup("slurm-job9-x", 1))
    assert err.value.reason.startswith("Kueue does not answer: its admission webhook mpod.kb.io failed")
    assert err.value.retryable


def test_the_spec_in_docs_kueue_md_is_a_valid_pool():
    """docs/kueue.md's spec snippet is a valid pool (the field names as the docs give them)."""
    import yaml

    text = (Path(__file__).resolve().parents[1] / "docs" / "kueue.md").read_text()
    snippet = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = parse_spec({"name": "docs", **yaml.safe_load(snippet)})
    assert spec.pools[0].kueue is not None and spec.pools[0].kueue.queue == "slurm"


# ---------------------------------------------------------------- an idle node hands its quota on


def _handover(tmp_path: Path, *, message: str = QUOTA, idle_state=("IDLE", "CLOUD"), jobs_on: tuple[str, ...] = (),
              idle: tuple[str, ...] = ("gpu-2", "gpu-3", "gpu-4"), fail: bool = False):
    """Job 7's two gpu pods gated for quota in queue team-a; the gpu nodes of `idle` up and idle
    (their pods admitted and Running), and cpu-0 too (a pool under no queue)."""
    from fakes.slurm import FakeSlurmClient

    from provisioner.elastic.backend import Worker
    from provisioner.reconcile.classify import Snapshot
    from provisioner.reconcile.kueuewait import explain
    from provisioner.slurm.state import JobStatus, NodeStatus

    inv = _inv("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "cpu-0")
    workers = {n: Worker(n, "Pending", group="slurm-job7-tok", group_total=2, gated=True) for n in ("gpu-0", "gpu-1")}
    workers.update((n, Worker(n, "Running", group=f"slurm-job{i}-old", group_total=1))
                   for i, n in enumerate(idle, start=3))
    workers["cpu-0"] = Worker("cpu-0", "Running")
    nodes = {n: NodeStatus(n, frozenset({"ALLOCATED", "CLOUD", "POWERING_UP"})) for n in ("gpu-0", "gpu-1")}
    nodes.update((n, NodeStatus(n, frozenset(idle_state))) for n in (*idle, "cpu-0"))
    backend = FakeBackend(workers=dict(workers), pool_queues={"gpu": "team-a"},
                          workloads={"slurm-job7-tok": _workload(message=message)})
    slurm = FakeSlurmClient(fail_updates=fail)
    jobs = [JobStatus.from_json({"job_id": 7, "job_state": ["PENDING", "CONFIGURING"], "nodes": "gpu-[0-1]"})]
    jobs += [JobStatus.from_json({"job_id": 9, "job_state": ["RUNNING"], "nodes": n}) for n in jobs_on]
    log = Log("reconcile", str(tmp_path / "r.log"))
    errors = explain(slurm, backend, Snapshot(nodes, workers, inv), jobs, log)
    downs = [u for u in slurm.updates if u[2].startswith("nodename=")]
    return downs, errors, (tmp_path / "r.log").read_text()


def test_while_a_job_waits_for_quota_idle_nodes_of_its_queue_power_down_to_hand_the_quota_on(tmp_path: Path):
    """An idle node of the queue keeps its admitted pod, and so its share of the quota, until
    SuspendTime; the job waiting for that quota would wait as long. As many idle nodes of the
    queue as the waiting group has pods are powered down at once (plain POWER_DOWN: Slurm takes
    an idle node out of scheduling and suspends it, so its pod goes); a pool under no queue keeps
    its idle nodes."""
    downs, errors, log = _handover(tmp_path)
    assert errors == []
    assert downs == [["scontrol", "update", "nodename=gpu-[2-3]", "state=POWER_DOWN"]]
    assert "gpu-[2-3]: powered down to hand their Kueue quota to job 7 (queue team-a)" in log


def test_no_handover_for_a_node_in_use_or_already_leaving_nor_for_a_wait_quota_cannot_end(tmp_path: Path):
    for state in (("IDLE", "CLOUD", "POWER_DOWN"), ("IDLE", "CLOUD", "POWERING_DOWN"), ("IDLE", "DRAIN"),
                  ("MIXED",), ("ALLOCATED",), ("IDLE", "COMPLETING"), ("IDLE", "PLANNED"), ("IDLE", "RESERVED")):
        assert _handover(tmp_path, idle_state=state)[0] == [], state
    # a node a job holds (its state read before the job came) is left to it
    assert _handover(tmp_path, jobs_on=("gpu-2", "gpu-3", "gpu-4"))[0] == []
    assert _handover(tmp_path, jobs_on=("gpu-2",))[0] == [["scontrol", "update", "nodename=gpu-[3-4]",
                                                           "state=POWER_DOWN"]]
    # a group larger than the quota, or held for another reason: nothing an idle node gives helps
    never = "couldn't assign flavors to pod set 3f2a: insufficient quota for cpu in flavor default, ... > maximum"
    assert _handover(tmp_path, message=never)[0] == []
    assert _handover(tmp_path, message="ClusterQueue e2e-kq is inactive")[0] == []


def test_a_handover_slurm_refuses_is_reported_and_tried_again_next_pass(tmp_path: Path):
    downs, errors, _ = _handover(tmp_path, fail=True)
    assert len(downs) == 1 and errors and errors[-1].startswith("cannot power down gpu-[2-3] for job 7's quota: ")
