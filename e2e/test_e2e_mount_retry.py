"""The wake's answer to a pod the kubelet skipped for its volume claim
(controltier.tier.Tier._replace_skipped_pod), against the real kubelet, API server and StatefulSet
or ReplicaSet controller (slurmctld's StatefulSet; the login Deployment, when it sleeps with the tier).

The race it answers (the node authorizer has not yet seen the pod bound when the kubelet reads the
claim) cannot be forced; the kubelet's answer to it can: a StatefulSet's (or a Deployment's) pod
bound to a node whose claim does not exist yet fails the same way (`FailedMount`: "error processing
PVC ...: failed to fetch PVC from API server"), and the kubelet then skips it for its back-off of
10-15 s. The claim is made, and the wake's step deletes the pod: its controller makes it again,
and the new pod runs well before the old one's back-off would have ended. Measured: running
2.6-3.2 s after the FailedMount was seen; without the step (the same test with the call left out)
12.0 s.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from helpers import kjson, kubeconfig, kubectl, wait_for

pytestmark = pytest.mark.e2e

NAMESPACE = "slurm-mountretry"  # the failure report collects this namespace's pod logs
PV = "slurmk8s-e2e-mount-retry"
STS = "waker"
KUBELET_BACKOFF_MIN = 10.0  # the kubelet syncs a skipped pod again after 10-15 s (back-off with jitter)


def _node() -> str:
    """A Ready, untainted node with a kubelet (not a kwok node) for the pod's nodeName: the oldest,
    which is the lab's own. Nodes other modules add and remove while this one runs (the topology
    module's, tainted) would take the pod with them."""
    for node in sorted(kjson("get", "nodes")["items"], key=lambda n: n["metadata"]["creationTimestamp"]):
        meta = node["metadata"]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        kwok = "kwok.x-k8s.io/node" in (meta.get("annotations") or {})
        if ready and not kwok and not node["spec"].get("taints") and not meta.get("deletionTimestamp"):
            return meta["name"]
    pytest.fail("no Ready, untainted node with a kubelet")


def _apply(doc: str) -> None:
    kubectl("apply", "-f", "-", input=doc)


@pytest.fixture
def namespace(cluster_reachable) -> Iterator[str]:
    kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--ignore-not-found", timeout=120)
    kubectl("delete", "pv", PV, "--ignore-not-found")
    kubectl("create", "namespace", NAMESPACE)
    yield NAMESPACE
    kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found")
    kubectl("delete", "pv", PV, "--wait=false", "--ignore-not-found")


def _failed_mounts(uid: str) -> list[dict[str, Any]]:
    return kjson("get", "events", "-n", NAMESPACE, "--field-selector",
                 f"involvedObject.uid={uid},reason=FailedMount")["items"]


def _running(pod: dict[str, Any]) -> bool:
    return any("running" in (c.get("state") or {}) for c in pod.get("status", {}).get("containerStatuses") or [])


def _pod(namespace: str) -> dict[str, Any] | None:
    """The workload's pod (the newest, when a Deployment's old one is still going)."""
    found = [p for p in kjson("get", "pods", "-n", namespace, "-l", f"app={STS}")["items"]
             if not p["metadata"].get("deletionTimestamp")]
    return max(found, key=lambda p: p["metadata"]["creationTimestamp"]) if found else None


@pytest.mark.parametrize("kind", ["StatefulSet", "Deployment"])
def test_a_pod_the_kubelet_skipped_for_its_claim_is_made_again_and_runs_at_once(namespace, kind):
    """StatefulSet: slurmctld's (the pod read by name); Deployment: the login pod's, when it sleeps
    with the tier (its pods listed by the Deployment's selector)."""
    from provisioner.controltier.api import ClientTierApi
    from provisioner.controltier.decision import Workload
    from provisioner.controltier.tier import Tier
    from provisioner.kubeapi import api_client

    _apply(f"""
apiVersion: apps/v1
kind: {kind}
metadata: {{name: {STS}, namespace: {namespace}}}
spec:
  {f"serviceName: {STS}" if kind == "StatefulSet" else "strategy: {type: Recreate}"}
  replicas: 1
  selector: {{matchLabels: {{app: {STS}}}}}
  template:
    metadata: {{labels: {{app: {STS}}}}}
    spec:
      nodeName: {_node()}
      terminationGracePeriodSeconds: 5
      containers:
      - {{name: c, image: "slurmk8s/slurmctld:dev", imagePullPolicy: Never, command: [sleep, "600"],
          volumeMounts: [{{name: state, mountPath: /state}}]}}
      volumes: [{{name: state, persistentVolumeClaim: {{claimName: state}}}}]
""")
    uid = wait_for(f"the {kind}'s pod", lambda: _pod(namespace), 60)["metadata"]["uid"]
    failed = wait_for("the kubelet's FailedMount for the missing claim", lambda: _failed_mounts(uid), 60)
    seen = time.monotonic()  # the kubelet skipped the pod at most a poll before: its back-off ends >= ~10 s after
    assert "error processing PVC" in failed[0]["message"], failed[0]["message"]
    _apply(f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {PV}}}
spec:
  capacity: {{storage: 1Mi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: ""
  hostPath: {{path: /tmp/{PV}, type: DirectoryOrCreate}}
  claimRef: {{namespace: {namespace}, name: state}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: state, namespace: {namespace}}}
spec: {{accessModes: [ReadWriteOnce], storageClassName: "", volumeName: {PV}, resources: {{requests: {{storage: 1Mi}}}}}}
""")
    # bound at once, as the volume controller binds it (its own pass comes 0.5-8 s later here, which
    # would leave too little of the kubelet's back-off to tell the two apart)
    claim_uid = kjson("get", "pvc", "state", "-n", namespace)["metadata"]["uid"]
    kubectl("patch", "pv", PV, "--type=merge", "-p", f'{{"spec":{{"claimRef":{{"uid":"{claim_uid}"}}}}}}')
    kubectl("patch", "pv", PV, "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Bound"}}')
    kubectl("patch", "pvc", "state", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", '{"status":{"phase":"Bound","accessModes":["ReadWriteOnce"],"capacity":{"storage":"1Mi"}}}')
    wait_for("the claim bound", lambda: kjson("get", "pvc", "state", "-n", namespace)["status"].get("phase") == "Bound",
             30, 0.1)
    tier = Tier(ClientTierApi(api_client(kubeconfig())), namespace, "e2e")
    progress: list[str] = []
    workload = Workload(kind=kind, name=STS, component="x", replicas=1, ready=0, selector=f"app={STS}")
    tier._replace_skipped_pod(workload, progress.append)
    asked = time.monotonic()
    assert progress and "could not read its volume claim" in progress[0], progress
    pod = wait_for("the pod made again, running", lambda: _pod(namespace), 60, 0.2,
                   until=lambda p: p is not None and p["metadata"]["uid"] != uid and _running(p))
    ran = time.monotonic()
    print(f"FailedMount seen -> deleted {asked - seen:.1f} s -> made again and running {ran - asked:.1f} s")
    # the old pod would not have been looked at again before its back-off
    assert ran - seen < KUBELET_BACKOFF_MIN - 1, (asked - seen, ran - asked)
    # a second look finds the new pod running: nothing more is deleted
    tier._replace_skipped_pod(workload, progress.append)
    assert len(progress) == 1 and _pod(namespace)["metadata"]["uid"] == pod["metadata"]["uid"]
