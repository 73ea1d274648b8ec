"""Real Kueue in the local lab (issue 41 item 1): `slurmk8s cluster kueue up` on the real cluster.

- a pod group that does not fit the free quota stays gated whole, its Workload saying why;
- once quota frees, the whole group is ungated at once (the time is printed);
- with Kueue's manager stopped, pods (and Jobs, Deployments) are still created in a namespace Kueue
  does not manage, while in a managed one the webhook refuses them: the namespaceSelector on every
  webhook is what keeps a stopped Kueue from blocking the cluster;
- `kueue status` says up, with the version; the cluster's webhooks are the restricted ones and the
  visibility API is not registered.

Kueue's own objects are cluster-wide (ResourceFlavor, ClusterQueue): each test names its own after
the namespace it makes, and removes them (e2e/kueuelab.py)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from helpers import kjson, kubectl, refuse_foreign, wait_for
from kueuelab import (ADMISSION_GATE, LAB_MADE_BY, LabQueues, gates, group_workload, kueue_cli, kueue_outage,
                      managed_namespace, plain_namespace, pods, queued_pod, workload_conditions)
from provisioner import kueue as names
from provisioner.localk8s import kueue_manifests as km

pytestmark = pytest.mark.e2e

NAMESPACE = "kueue-lab"  # conftest's failure report collects this namespace's pod logs
FREE_NS = "kueue-lab-free"  # not managed by Kueue
OUT_NS = "kueue-lab-out"  # managed, used while Kueue is stopped
POD_CPU = "10m"


def fresh(ns: str) -> None:
    """A namespace an earlier run of this module left goes first; any other is never touched."""
    if refuse_foreign(ns, LAB_MADE_BY):
        kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)


@pytest.fixture
def lab(kueue_steady):
    fresh(NAMESPACE)
    queues = LabQueues(prefix=NAMESPACE, cpu="50m")  # five pods of 10m
    queues.made = queues.objects()
    queues.cleanup()  # a ClusterQueue or flavor an interrupted run left
    yield queues.create()
    queues.cleanup()


def test_a_group_waits_whole_for_quota_and_goes_at_once_when_it_frees(lab, kueue_steady):
    ns, image = lab.namespace, kueue_steady.image
    print(f"Kueue {kueue_steady.version}, image {image}; `kueue up` took {kueue_steady.up_seconds:.1f} s")
    # a holder takes 30m of the 50m: the free quota is two pods' worth
    kubectl("apply", "-f", "-", input=json.dumps(queued_pod(ns, "holder", lab.queue, image, "30m")))
    wait_for("the holder pod Running", lambda: kjson("get", "pod", "holder", "-n", ns)["status"].get("phase")
             == "Running", 60)

    group = f"lab-{uuid.uuid4().hex[:8]}"  # new each run: a reused group name could join an old workload
    members = [queued_pod(ns, f"{group}-{i}", lab.queue, image, POD_CPU, group=group, total=3) for i in range(3)]
    t_create = time.monotonic()
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": members}))
    selector = f"{names.GROUP_LABEL}={group}"

    # (a) gated whole, and the Workload says why
    wait_for(f"the Workload of group {group}", lambda: group_workload(ns, group), 30)
    reason = wait_for("the group's Workload to say it waits for quota",
                      lambda: workload_conditions(ns, group).get("QuotaReserved"),
                      30, until=lambda c: c and c.get("status") == "False" and "insufficient unused quota" in
                      c.get("message", ""))
    print(f"waiting group's QuotaReserved=False ({reason.get('reason')}): {reason['message']}")
    held_until = time.monotonic() + 4
    while time.monotonic() < held_until:
        now = pods(ns, selector)
        assert len(now) == 3
        for pod in now:
            assert ADMISSION_GATE in gates(pod), f"{pod['metadata']['name']} ungated with the quota full"
            assert not pod["spec"].get("nodeName"), f"{pod['metadata']['name']} was scheduled with the quota full"
        time.sleep(0.5)
    assert "Admitted" not in workload_conditions(ns, group) or \
        workload_conditions(ns, group)["Admitted"]["status"] == "False"

    # (b) the holder ends: its quota comes back, and the whole group goes
    t_free = time.monotonic()
    kubectl("exec", "-n", ns, "holder", "--", "touch", "/tmp/done")
    t_exec = time.monotonic() - t_free
    running_while_gated = 0
    ungated_at = holder_done = None
    deadline = t_free + 60
    while time.monotonic() < deadline:
        every = kjson("get", "pods", "-n", ns)["items"]
        now = [p for p in every if (p["metadata"].get("labels") or {}).get(names.GROUP_LABEL) == group]
        if holder_done is None and any(p["metadata"]["name"] == "holder" and p["status"].get("phase") == "Succeeded"
                                       for p in every):
            holder_done = time.monotonic()
        gated = [p for p in now if gates(p)]
        running = [p for p in now if p["status"].get("phase") == "Running"]
        if gated:
            running_while_gated = max(running_while_gated, len(running))
        if ungated_at is None and not gated:
            ungated_at = time.monotonic()
        if ungated_at is not None and len(running) == 3:
            break
        time.sleep(0.05)
    assert ungated_at is not None, "the group stayed gated after its quota freed"
    t_running = time.monotonic()
    assert len(running) == 3, f"ungated, but not all Running: {[p['status'].get('phase') for p in now]}"
    assert running_while_gated == 0, "a member ran while others of its group were still gated"
    seen_done = f"{holder_done - t_free:.2f} s" if holder_done else "not seen"
    print(f"quota freed (holder told to exit; the exec took {t_exec:.2f} s; holder seen Succeeded at {seen_done}) "
          f"-> all 3 ungated at {ungated_at - t_free:.2f} s, all 3 Running at {t_running - t_free:.2f} s "
          f"(group created {t_free - t_create:.1f} s before)")
    admitted = workload_conditions(ns, group).get("Admitted", {})
    assert admitted.get("status") == "True", admitted


def test_a_stopped_kueue_blocks_only_the_namespaces_it_manages(kueue):
    for ns in (FREE_NS, OUT_NS):
        fresh(ns)
    plain_namespace(FREE_NS)
    managed_namespace(OUT_NS)
    pod = queued_pod(FREE_NS, "free-pod", "none", kueue.image, POD_CPU, command=["true"])
    del pod["metadata"]["labels"][names.QUEUE_LABEL]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": FREE_NS, "name": "free-job"},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": pod["spec"]["containers"]}}}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": FREE_NS, "name": "free"},
                  "spec": {"selector": {"matchLabels": {"app": "free"}},
                           "template": {"metadata": {"labels": {"app": "free"}},
                                        "spec": {"containers": pod["spec"]["containers"]}}}}
    managed_pod = {**pod, "metadata": {"namespace": OUT_NS, "name": "managed-pod"}}
    try:
        with kueue_outage():
            assert not kjson("get", "pods", "-n", km.NAMESPACE)["items"], "the manager is still there"
            t0 = time.monotonic()
            made = kubectl("create", "-f", "-", input=json.dumps(pod), check=False)
            took = time.monotonic() - t0
            assert made.returncode == 0, f"pod creation outside Kueue's namespaces failed with Kueue down: {made.stderr}"
            print(f"with Kueue stopped: a pod created in an unmanaged namespace in {took:.2f} s")
            for doc in (job, deployment):
                dry = kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
                assert dry.returncode == 0, f"{doc['kind']} refused outside Kueue's namespaces: {dry.stderr}"
            # the control: in a managed namespace the API server does call the stopped webhook, and fails
            refused = kubectl("create", "-f", "-", input=json.dumps(managed_pod), check=False)
            assert refused.returncode != 0 and "kueue" in refused.stderr, (refused.stdout, refused.stderr)
            print(f"... and refused in a managed namespace: {refused.stderr.strip()[:200]}")
        status = kueue_cli("status")
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        for ns in (FREE_NS, OUT_NS):
            kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def test_status_says_up_and_the_cluster_has_the_restricted_webhooks(kueue_steady):
    status = kueue_cli("status")
    assert status.returncode == 0 and f"Kueue: up ({kueue_steady.version})" in status.stdout, status.stdout
    configs = [kjson("get", "mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration"),
               kjson("get", "validatingwebhookconfiguration", "kueue-validating-webhook-configuration")]
    assert km.webhooks_restricted(configs, km.LabSettings(version="", image=""))
    assert km.webhooks_have_ca(configs)
    for api in ("v1beta1", "v1beta2"):
        got = kubectl("get", "apiservice", f"{api}.{km.VISIBILITY_GROUP}", "--ignore-not-found", "-o", "name")
        assert not got.stdout.strip(), f"the visibility API is registered: {got.stdout}"
