"""The watcher of `slurmk8s up` (provisioner/deploy/watch.py) and the local volumes it and `up` give
back (provisioner/volumes.py), on API objects recorded from the local cluster (tests/recorded/):

- watch_stuck.json: namespace slurm-t20-rec after a `down --purge`-like deletion of the claim
  accounting-db and a new one of the same name: its static volume Released and held by the old uid,
  mariadb-0 unschedulable; plus a claim without a class and without a default class (FailedBinding),
  one of an external provisioner that does not exist (ExternalProvisioning), one of an Immediate
  class without a provisioner (ProvisioningFailed), a pod whose image is not there
  (ErrImageNeverPull), a pod asking for more CPU than the node has, a crash-looping slurmdbd.
- watch_after_reclaim.json: the same a few seconds after `slurmk8s cluster reclaim-volumes`: the
  volume bound again, mariadb-0 running, slurmdbd restarting.
- watch_healthy.json: only the database claim (Bound) and its pod (Running).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from provisioner import volumes as vol
from provisioner.deploy import watch
from provisioner.deploy import preflight as pf
from provisioner.config import parse_spec

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / f"watch_{name}.json").read_text())


def snapshot(doc: dict, **changes) -> watch.Snapshot:
    fields = {k: doc[k] for k in ("namespace", "claims", "pods", "events", "volumes", "storage_classes", "local")}
    return watch.Snapshot(**{**fields, **changes})


def by_subject(findings):
    return {f.subject.split(" (")[0].split(":")[0].replace(" Pending", ""): f for f in findings}


# ---------------------------------------------------------------- diagnose


def test_a_claim_held_by_a_released_volume_says_which_volume_and_how_to_free_it():
    found = by_subject(watch.diagnose(snapshot(recorded("stuck"))))
    held = found["claim accounting-db"]
    assert held.fatal and held.bound == watch.DEFINITE_BOUND
    assert held.text(16) == (
        "claim accounting-db (accounting database) Pending for 16s: PersistentVolume t20-rec-accounting-db is reserved "
        "for it but still belongs to the deleted claim of the same name (uid 5485bcb7..., volume Released), so "
        "Kubernetes binds it to no new claim. Fix: `slurmk8s cluster reclaim-volumes --namespace slurm-t20-rec` (the "
        "local cluster's own volumes: deletes the old data and makes them Available), or rerun `slurmk8s up`, which "
        "does it for its own claims")
    # the pod that waits for it is not reported twice: the claim's line says why
    assert "pod mariadb-0" not in found


def test_the_same_volume_outside_the_local_cluster_gets_the_kubectl_fix():
    held = by_subject(watch.diagnose(snapshot(recorded("stuck"), local=False)))["claim accounting-db"]
    assert held.fix.startswith("if the old data may go to the new claim, free the volume: `kubectl patch pv "
                               "t20-rec-accounting-db --type json -p '[{\"op\":\"remove\",\"path\":\"/spec/claimRef/uid\"}]'`")


def test_binding_and_provisioning_failures_quote_kubernetes_and_name_the_spec_field():
    found = by_subject(watch.diagnose(snapshot(recorded("stuck"))))
    home = found["claim home"]
    assert home.fatal and home.bound == watch.CLAIM_BOUND
    assert home.message == "FailedBinding: no persistent volumes available for this claim and no storage class is set"
    assert home.fix == ("set storage.home.storage_class to one of the cluster's classes (t20-external, t20-static, "
                        "t20-static-immediate), or make one the default")
    state = found["claim slurmctld-state"]
    assert state.fatal and state.bound == watch.PROVISION_BOUND  # an external provisioner gets longer
    assert "external provisioner 'example.com/t20-none'" in state.message
    assert "storage.controller_state.storage_class" in state.fix
    static = found["claim static-immediate"]
    assert static.message == "ProvisioningFailed: no volume plugin matched name: kubernetes.io/no-provisioner"
    assert static.fix.startswith("create a PersistentVolume of class 't20-static-immediate' with at least 1Gi "
                                 "ReadWriteOnce for slurm-t20-rec/static-immediate")


def test_an_image_that_is_not_there_stops_at_once_capacity_only_notes():
    found = by_subject(watch.diagnose(snapshot(recorded("stuck"))))
    login = found["pod login-5f7b9-xyz12"]
    assert login.fatal and login.bound == watch.DEFINITE_BOUND
    assert login.message.startswith('container login: ErrImageNeverPull: Container image "slurmk8s/missing:none" is '
                                    "not present with pull policy of Never")
    assert "`slurmk8s cluster load-image slurmk8s/missing:none`" in login.fix
    assert "load-image" not in by_subject(watch.diagnose(snapshot(recorded("stuck"), local=False)))[
        "pod login-5f7b9-xyz12"].fix
    cpu = found["pod slurmctld-0"]  # an autoscaler may add a node: a note, `up` keeps waiting
    assert not cpu.fatal and "Insufficient cpu" in cpu.message


def test_after_the_reclaim_the_claim_binds_and_a_crash_loop_is_a_note():
    found = by_subject(watch.diagnose(snapshot(recorded("after_reclaim"))))
    assert "claim accounting-db" not in found and "pod mariadb-0" not in found
    crash = found["pod slurmdbd-7c9d8-abcde"]
    assert not crash.fatal
    assert crash.message == "container slurmdbd keeps exiting (restarts 4, last exit code 1, Error)"
    assert crash.fix.startswith("`kubectl -n slurm-t20-rec logs slurmdbd-7c9d8-abcde -c slurmdbd --previous`")


def test_a_healthy_namespace_has_no_finding():
    assert watch.diagnose(snapshot(recorded("healthy"))) == []


def test_events_of_a_deleted_claim_of_the_same_name_are_not_its_successors():
    doc = recorded("stuck")
    claim = next(c for c in doc["claims"] if c["metadata"]["name"] == "home")
    ev = next(e for e in doc["events"] if e["involvedObject"]["name"] == "home")
    old = copy.deepcopy(ev)
    old["involvedObject"]["uid"] = "0000-old"
    assert watch.events_of(claim, "PersistentVolumeClaim", [old]) == []
    assert watch.events_of(claim, "PersistentVolumeClaim", [ev]) == [ev]


# ---------------------------------------------------------------- how long a finding lasts


def test_tracker_reports_fatal_findings_after_their_bound_and_notes_once():
    findings = watch.diagnose(snapshot(recorded("stuck")))
    t = watch.Tracker()
    notes, due = t.observe(findings, 100.0)
    assert notes == [] and due == []
    notes, due = t.observe(findings, 100.0 + watch.DEFINITE_BOUND)
    assert {f.subject.split(" ")[1] for f, _ in due} == {"accounting-db", "login-5f7b9-xyz12"}
    notes, due = t.observe(findings, 100.0 + watch.NOTE_BOUND)
    assert [f.subject for f in notes] == ["pod slurmctld-0", "pod slurmdbd-7c9d8-abcde"]
    assert len(due) == 4  # + home, static-immediate (15 s); slurmctld-state waits 120 s
    assert t.observe(findings, 100.0 + watch.NOTE_BOUND + 1)[0] == []  # a note is printed once
    # gone, then back: its time starts again
    t.observe([], 200.0)
    assert t.observe(findings, 201.0) == ([], [])


def test_watcher_stops_up_once_with_the_report():
    lines: list[str] = []
    stopped: list[int] = []
    clock = iter(float(i) for i in range(0, 1000, 3))
    w = watch.Watcher(lambda: snapshot(recorded("stuck")), lines.append, lambda: stopped.append(1),
                      clock=lambda: next(clock))
    assert w.check() == []
    due = w.check()  # 3 s later: nothing is past DEFINITE_BOUND yet
    assert due == []
    due = w.check()
    assert [f.subject for f, _ in due] == ["claim accounting-db (accounting database) Pending", "pod login-5f7b9-xyz12"]
    assert w.stopped_by == due
    text = watch.report(due, 17.4)
    assert text.splitlines()[0] == "`up` stopped after 17s: 2 problem(s) that will not go away by waiting:"
    assert text.splitlines()[1].startswith("  - claim accounting-db (accounting database) Pending for 6s: "
                                           "PersistentVolume t20-rec-accounting-db is reserved for it")


def test_watcher_survives_api_hiccups_and_its_own_bugs():
    from provisioner.kubeapi import ApiError

    lines: list[str] = []

    def flaky():
        raise ApiError(0, "Unreachable", "connection refused")

    w = watch.Watcher(flaky, lines.append, lambda: None)
    for _ in range(3):
        assert w.check() == []
    assert lines == ["watch: cannot read the cluster (0 Unreachable: connection refused); `up` goes on, the watch "
                     "keeps trying"]

    def buggy():
        raise KeyError("x")

    w = watch.Watcher(buggy, lines.append, lambda: None)
    assert w.check() == []
    assert lines[-1].startswith("watch: stopped by an internal error (KeyError")


# ---------------------------------------------------------------- the local volumes


def test_reclaimable_finds_the_local_volume_held_by_the_deleted_claim():
    doc = recorded("stuck")
    (item,) = vol.reclaimable(doc["volumes"], doc["claims"])
    assert item.volume == "t20-rec-accounting-db"
    assert item.path == "/var/lib/slurmk8s/volumes/t20-rec/accounting-db"
    assert item.claim == "slurm-t20-rec/accounting-db"
    assert item.drop == ("uid", "resourceVersion")
    assert vol.release_patch(item) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": item.resource_version},
        {"op": "remove", "path": "/spec/claimRef/uid"},
        {"op": "remove", "path": "/spec/claimRef/resourceVersion"}]
    assert vol.reclaimable(doc["volumes"], doc["claims"], namespace="slurm-other") == []
    assert vol.reclaimable(doc["volumes"], doc["claims"], namespace="slurm-t20-rec", names=["home"]) == []
    not_yet = copy.deepcopy(doc["volumes"])
    not_yet[0]["status"]["phase"] = "Bound"  # the PV controller has not seen the claim go yet
    assert [i.volume for i in vol.reclaimable(not_yet, doc["claims"])] == ["t20-rec-accounting-db"]
    elsewhere = copy.deepcopy(doc["volumes"])
    elsewhere[0]["spec"]["hostPath"]["path"] = "/srv/data/accounting-db"  # not the local cluster's own
    assert vol.reclaimable(elsewhere, doc["claims"]) == []


def test_a_bound_volume_and_one_whose_claim_still_exists_are_left_alone():
    doc = recorded("after_reclaim")
    assert vol.reclaimable(doc["volumes"], doc["claims"]) == []
    stuck = recorded("stuck")
    old_claim = copy.deepcopy(next(c for c in stuck["claims"] if c["metadata"]["name"] == "accounting-db"))
    old_claim["metadata"]["uid"] = stuck["volumes"][0]["spec"]["claimRef"]["uid"]  # the claim is still there
    assert vol.reclaimable(stuck["volumes"], [old_claim]) == []


def test_wipe_deletes_the_contents_only_and_never_outside_the_root(tmp_path):
    root = tmp_path / "volumes"
    data = root / "c" / "home"
    (data / "alice" / "deep").mkdir(parents=True)
    (data / "alice" / "deep" / "f").write_text("x")
    (data / "file").write_text("y")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("z")
    (data / "link").symlink_to(outside)
    assert vol.wipe(str(data), str(root)) == 3
    assert data.is_dir() and list(data.iterdir()) == []
    assert (outside / "keep").exists()  # a link is removed, not followed
    (root / "c" / "escape").symlink_to(outside)
    with pytest.raises(ValueError):
        vol.wipe(str(root / "c" / "escape"), str(root))
    assert vol.wipe(str(root / "c" / "missing"), str(root)) == 0


def test_is_local_cluster_compares_the_api_server_with_the_local_kubeconfig(tmp_path):
    (tmp_path / "kubeconfig").write_text("clusters:\n- name: slurmk8s-local\n  cluster: {server: 'https://192.0.2.2:6443'}\n")
    env = {"LOCALK8S_ROOT": str(tmp_path)}

    class Client:  # the two attributes of kubernetes.client.ApiClient it reads
        def __init__(self, host):
            self.configuration = type("C", (), {"host": host})()

    assert vol.is_local_cluster(Client("https://192.0.2.2:6443"), env)
    assert not vol.is_local_cluster(Client("https://10.0.0.1:6443"), env)
    assert not vol.is_local_cluster(Client("https://192.0.2.2:6443"), {"LOCALK8S_ROOT": str(tmp_path / "none")})


# ---------------------------------------------------------------- preflight


SPEC = {"name": "t20-rec", "pools": [{"name": "cpu"}],
        "storage": {"home": {"size": "1Gi", "storage_class": "t20-static", "access_mode": "ReadWriteOnce"},
                    "controller_state": {"size": "1Gi", "storage_class": "t20-static"},
                    "database": {"size": "1Gi", "storage_class": "t20-static"}}}


def _facts(doc: dict, **changes) -> pf.ClusterFacts:
    # the namespace after `down --purge`: no claim left; home and state have free volumes of their own
    free = []
    for claim in ("home", "slurmctld-state"):
        pv = copy.deepcopy(doc["volumes"][0])
        pv["metadata"]["name"] = f"t20-rec-{claim}"
        pv["spec"]["claimRef"] = {"namespace": "slurm-t20-rec", "name": claim}
        pv["status"] = {"phase": "Available"}
        free.append(pv)
    return pf.ClusterFacts(storage_classes=doc["storage_classes"], volumes=doc["volumes"] + free, claims=[],
                           **changes)


def test_preflight_refuses_a_static_volume_still_held_by_the_deleted_claim():
    doc = recorded("stuck")
    (issue,) = pf.storage_issues(parse_spec(SPEC), _facts(doc))
    assert issue.field == "storage.database"
    assert issue.message == ("PersistentVolume t20-rec-accounting-db is reserved for claim slurm-t20-rec/accounting-db "
                             "but still belongs to the deleted claim of that name (Released, e.g. after `slurmk8s down "
                             "--purge`), so Kubernetes binds it to no new claim")
    assert issue.fix.startswith("if the old data may go to the new claim, free the volume: `kubectl patch pv")
    (local,) = pf.storage_issues(parse_spec(SPEC), _facts(doc, local=True))
    assert local.fix.startswith("`slurmk8s cluster reclaim-volumes --namespace slurm-t20-rec`")
    # preview on the local cluster: `up` will give it back first, so it counts as free
    assert pf.storage_issues(parse_spec(SPEC), _facts(doc, local=True,
                                                      reclaimable=frozenset({"t20-rec-accounting-db"}))) == []


def test_a_pod_whose_bound_volume_no_node_reaches_names_the_claim_and_the_volume():
    doc = recorded("healthy")
    pod = copy.deepcopy(doc["pods"][0])  # mariadb-0, made unschedulable as the scheduler reported it for t20-w
    pod["spec"].pop("nodeName", None)
    pod["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 node(s) didn't match PersistentVolume's node affinity. no new claims "
                   "to deallocate, preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."}]}
    (f,) = watch.diagnose(snapshot(doc, pods=[pod]))
    assert f.fatal and f.subject == "pod mariadb-0"
    assert f.message.endswith("1 Preemption is not helpful for scheduling; its claims are bound: accounting-db "
                              "(PersistentVolume t20-rec-accounting-db)")
    assert f.fix.startswith("a volume's node affinity names no node this pod may run on")
