"""Real Kueue on the local cluster, for the e2e tests: bring it up, make queues, read workloads.

Kueue comes from `slurmk8s cluster kueue up` (provisioner/localk8s/kueue.py): plain Pods only, in the
namespaces labelled `slurmk8s.io/kueue=managed` only (its webhooks too), API kueue.x-k8s.io/v1beta2.
The session fixture `kueue` (e2e/conftest.py) runs `up` once per session and leaves Kueue up when
the session ends: it touches no namespace but the managed ones, and the next session's `up` is then
a few seconds (`slurmk8s cluster kueue down` removes it).

Kueue is shared by every test that uses it, in this session's workers and in other sessions on this
machine, like the cluster itself (e2e/kubeshare.py): a test that relies on Kueue running holds it
shared (fixture `kueue_steady`, or `with kueue_share():`); one that stops it (`kueue_outage()`) holds
it alone. Each test makes its own namespace, ResourceFlavor, ClusterQueue and LocalQueue (names with
a prefix of its own) and removes them (`LabQueues.cleanup`): ClusterQueues and ResourceFlavors are
cluster-wide, and carry finalizers that only a running Kueue removes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

import kubeshare
from helpers import MADE_BY, ROOT, TOOLCHAIN_BIN, kjson, kubeconfig, kubectl, wait_for

from provisioner import kueue as names
from provisioner.localk8s import kueue_manifests as km

API = f"{km.KUEUE_GROUP}/v1beta2"
KUEUE_LOCK = Path(os.environ.get("SLURMK8S_E2E_KUEUE_LOCK")
                  or Path(tempfile.gettempdir()) / f"slurmk8s-e2e-kueue-{os.getuid()}.lock")
LAB_MADE_BY = "kueue-lab"  # the MADE_BY label on the namespaces these helpers make
ADMISSION_GATE = names.GATES[0]


# ---------------------------------------------------------------- Kueue itself
def kueue_cli(*args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    """`slurmk8s cluster kueue ARGS`, from this checkout's provisioner (as the console script would)."""
    return subprocess.run([sys.executable, "-c", "from provisioner.cli import app; app()", "cluster", "kueue", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "KUBECONFIG": kubeconfig(),
                               "PATH": f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}"})


def kueue_up() -> float:
    """`kueue up`; the test fails with its output if it fails. Returns its wall time in seconds."""
    t0 = time.monotonic()
    done = kueue_cli("up")
    took = time.monotonic() - t0
    if done.returncode != 0:
        pytest.fail(f"`slurmk8s cluster kueue up` failed (exit {done.returncode}) after {took:.0f} s:\n"
                    f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}", pytrace=False)
    print(done.stdout, end="")
    return took


@dataclass(frozen=True)
class Kueue:
    """What the session fixture hands out."""

    version: str
    image: str  # the manager's image: a trixie base with /bin/sh, already in every node's containerd
    up_seconds: float


def running_kueue() -> Kueue | None:
    dep = kubectl("get", "deployment", km.DEPLOYMENT, "-n", km.NAMESPACE, "--ignore-not-found", "-o", "json").stdout
    if not dep.strip():
        return None
    doc = json.loads(dep)
    return Kueue(version=doc["metadata"]["annotations"][km.VERSION_ANNOTATION],
                 image=km.manager_container(doc)["image"], up_seconds=0.0)


@contextlib.contextmanager
def kueue_share() -> Iterator[None]:
    """Kueue keeps running meanwhile (no test stops it)."""
    with kubeshare.kubernetes_share(KUEUE_LOCK, alone=False):
        yield


@contextlib.contextmanager
def kueue_alone() -> Iterator[None]:
    with kubeshare.kubernetes_share(KUEUE_LOCK, alone=True):
        yield


def manager_replicas(n: int) -> None:
    kubectl("scale", "deployment", km.DEPLOYMENT, "-n", km.NAMESPACE, f"--replicas={n}")


@contextlib.contextmanager
def kueue_outage() -> Iterator[None]:
    """Kueue's manager scaled to 0 (its pod gone) while no other test relies on it; brought back by
    `kueue up` afterwards, whatever happened (the test fails if it does not come back)."""
    with kueue_alone():
        manager_replicas(0)
        try:
            wait_for("the Kueue manager's pod to go", lambda: not kjson(
                "get", "pods", "-n", km.NAMESPACE, "-l", "control-plane=controller-manager")["items"], 60)
            yield
        finally:
            back = kueue_up()
            print(f"Kueue back (`kueue up` after the outage) in {back:.1f} s")


# ---------------------------------------------------------------- namespaces and queues
def managed_namespace(ns: str) -> None:
    """Namespace `ns`, made by these helpers and put under Kueue (label slurmk8s.io/kueue=managed)."""
    kubectl("create", "namespace", ns, check=False)
    kubectl("label", "namespace", ns, f"{MADE_BY}={LAB_MADE_BY}", f"{km.MANAGED_KEY}={km.MANAGED_VALUE}",
            "--overwrite")


def plain_namespace(ns: str) -> None:
    """Namespace `ns`, made by these helpers, not under Kueue."""
    kubectl("create", "namespace", ns, check=False)
    kubectl("label", "namespace", ns, f"{MADE_BY}={LAB_MADE_BY}", f"{km.MANAGED_KEY}-", "--overwrite")


def resource_flavor(name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}}


def cluster_queue(name: str, flavor: str, cpu: str, memory: str, *, cohort: str | None = None,
                  preemption: Mapping[str, Any] | None = None, borrowing_limit: Mapping[str, str] | None = None,
                  ) -> dict[str, Any]:
    """A ClusterQueue of every namespace's LocalQueues with nominal `cpu` and `memory` in `flavor`;
    `preemption` is Kueue's own block (e.g. {"withinClusterQueue": "LowerPriority",
    "reclaimWithinCohort": "Any"}); `borrowing_limit` per resource, for a cohort."""
    resources = []
    for resource, quota in (("cpu", cpu), ("memory", memory)):
        one: dict[str, Any] = {"name": resource, "nominalQuota": quota}
        if borrowing_limit and resource in borrowing_limit:
            one["borrowingLimit"] = borrowing_limit[resource]
        resources.append(one)
    spec: dict[str, Any] = {"namespaceSelector": {},
                            "resourceGroups": [{"coveredResources": ["cpu", "memory"],
                                                "flavors": [{"name": flavor, "resources": resources}]}]}
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = dict(preemption)
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(ns: str, name: str, cq: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"namespace": ns, "name": name},
            "spec": {"clusterQueue": cq}}


def apply(*docs: Mapping[str, Any]) -> None:
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))


@dataclass
class LabQueues:
    """One test's Kueue objects: a managed namespace, a flavor, a ClusterQueue, a LocalQueue."""

    prefix: str
    cpu: str
    memory: str = "1Gi"
    cohort: str | None = None
    preemption: Mapping[str, Any] | None = None
    made: list[tuple[str, str, str | None]] = field(default_factory=list)  # (resource, name, namespace)

    @property
    def namespace(self) -> str:
        return self.prefix

    @property
    def flavor(self) -> str:
        return f"{self.prefix}-flavor"

    @property
    def cluster_queue(self) -> str:
        return f"{self.prefix}-cq"

    @property
    def queue(self) -> str:
        return "lab-queue"

    def objects(self) -> list[tuple[str, str, str | None]]:
        """In the order they go: the namespace (its LocalQueue and Workloads), then the ClusterQueue,
        then the flavor (its finalizer stays while a ClusterQueue names it)."""
        return [("namespace", self.namespace, None), ("clusterqueues.kueue.x-k8s.io", self.cluster_queue, None),
                ("resourceflavors.kueue.x-k8s.io", self.flavor, None)]

    def create(self) -> LabQueues:
        managed_namespace(self.namespace)
        apply(resource_flavor(self.flavor),
              cluster_queue(self.cluster_queue, self.flavor, self.cpu, self.memory, cohort=self.cohort,
                            preemption=self.preemption),
              local_queue(self.namespace, self.queue, self.cluster_queue))
        self.made = self.objects()
        wait_for(f"ClusterQueue {self.cluster_queue} Active", lambda: condition(
            kjson("get", "clusterqueue", self.cluster_queue), "Active").get("status") == "True", 30)
        return self

    def cleanup(self) -> None:
        """The namespace first (its pods, Workloads and LocalQueue, finalized by Kueue), then the
        ClusterQueue and the flavor: each waits until it is gone."""
        for resource, name, _ in self.made:
            if resource == "namespace":
                release_groups(name)
            kubectl("delete", resource, name, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
        self.made = []


def release_groups(ns: str) -> None:
    """Trap 4: a deleted member of a pod group turns Failed, keeps Kueue's finalizer, and its Workload
    (made again by Kueue if deleted) waits for a replacement; a namespace delete then never ends.
    `retriable-in-group: "false"` tells Kueue the group is done once no member is active."""
    kubectl("annotate", "pods", "--all", "-n", ns, f"{names.RETRIABLE}=false", "--overwrite", check=False)


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def workload_conditions(ns: str, name: str) -> dict[str, dict[str, Any]]:
    """A Workload's conditions by type ({} when there is no such Workload yet)."""
    got = kubectl("get", "workloads.kueue.x-k8s.io", name, "-n", ns, "--ignore-not-found", "-o", "json").stdout
    if not got.strip():
        return {}
    return {c["type"]: c for c in (json.loads(got).get("status") or {}).get("conditions") or []}


def group_workload(ns: str, group: str) -> str | None:
    """The Workload of a pod group (Kueue names it after the group), or None while there is none
    (trap 5: until every member exists there is no Workload)."""
    for wl in kjson("get", "workloads.kueue.x-k8s.io", "-n", ns)["items"]:
        if wl["metadata"]["name"] == group:
            return group
    return None


# ---------------------------------------------------------------- pods
def queued_pod(ns: str, name: str, queue: str, image: str, cpu: str, *, group: str | None = None,
               total: int | None = None, command: list[str] | None = None) -> dict[str, Any]:
    """A plain pod in Kueue's queue `queue` (one of a pod group if `group`); it runs `command` (default:
    wait for /tmp/done, then exit 0) and goes at once when deleted."""
    labels = {names.QUEUE_LABEL: queue}
    annotations: dict[str, str] = {}
    if group:  # as a pool's workers are (provisioner/kueue.py): the group ends with its last active pod
        labels[names.GROUP_LABEL] = group
        annotations[names.GROUP_TOTAL] = str(total)
        annotations[names.RETRIABLE] = "false"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": ns, "name": name, "labels": labels, "annotations": annotations},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": command or ["sh", "-c", "until [ -e /tmp/done ]; do sleep 0.1; done"],
                                     "resources": {"requests": {"cpu": cpu, "memory": "16Mi"},
                                                   "limits": {"memory": "16Mi"}}}]}}


def gates(pod: Mapping[str, Any]) -> list[str]:
    return [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def pods(ns: str, selector: str) -> list[dict[str, Any]]:
    return kjson("get", "pods", "-n", ns, "-l", selector)["items"]
