"""Jobs land where Slurm placed them, on several real Kubernetes nodes (issue #14 item 2).

Three extra real nodes (`slurmk8s cluster node add`: their own kubelet and containerd, joined to the
local cluster's control plane) carry AWS-style network topology labels: two under leaf switch
`leaf-a`, one under `leaf-b`, both under one spine. A second small cluster (`topo`, namespace
slurm-topo) has one pinned pool on exactly those nodes (a node selector, and a toleration for the
taint that keeps every other test's pods off them) and `topology: {preset: aws}`. The tests read
Slurm's topology, place jobs with `--switches`, and check each worker pod's `spec.nodeName` and that
node's labels; an MPI allreduce (PMIx) runs across two Kubernetes nodes.

A third cluster (`blk`) places jobs by a block topology from the nodes' NVLink-domain labels
(Topograph 1.0's `accelerator.topograph.run/domain`): `--segment` keeps a job inside one domain.

The nodes and the clusters are removed afterwards. Needs the local cluster (`cluster node add` runs
kubelets on this machine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from typing import Any, Iterator

import pytest

from helpers import (FINAL, LOCAL_KUBECONFIG, SLURMK8S, TOOLCHAIN_BIN, Login, kjson, kubeconfig, kubectl_exe,
                     job_story, kubectl, side_cluster, side_spec, submit, wait_for, wait_job)
from test_e2e_cluster import ALLREDUCE_C

pytestmark = pytest.mark.e2e

NAME = "topo"
NAMESPACE = f"slurm-{NAME}"  # conftest's failure report collects this namespace's pod logs
TAINT = "slurmk8s.io/e2e-topo"
SELECT = {"slurmk8s.io/e2e-topo": "yes"}
L1, L2, L3 = (f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3))
NODES = {  # Kubernetes node -> its leaf switch (layer 3); one spine (layer 2) under one top (layer 1)
    "e2e-topo-a1": "leaf-a",
    "e2e-topo-a2": "leaf-a",
    "e2e-topo-b1": "leaf-b",
}
LATE_NODE, LATE_SELECT = "e2e-topo-late", {"slurmk8s.io/e2e-late": "yes"}
LATE_NODE_START = 300  # the late pool's node_start_timeout: Slurm's ResumeTimeout there is 120 s + this
LATE_AFTER = 150  # the node comes this long after the pod is Pending: past the cluster's ResumeTimeout (120 s)
EVICT_STORAGE = 64 * 2**20  # the evict pool's pods' ephemeral-storage limit (bytes)
DOMAIN = "accelerator.topograph.run/domain"  # Topograph 1.0's NVLink domain label (block topology)
DOMAINS = {"e2e-topo-a1": "nvl-1", "e2e-topo-a2": "nvl-1", "e2e-topo-b1": "nvl-2"}


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLURMK8S, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "KUBECONFIG": kubeconfig(),
                               "PATH": f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}"})


@pytest.fixture(scope="module")
def topo_nodes(cluster_reachable) -> Iterator[dict[str, str]]:
    if kubeconfig() != LOCAL_KUBECONFIG:
        pytest.fail(f"e2e/test_e2e_topology.py adds real nodes to the local cluster (`slurmk8s cluster node add`); "
                    f"KUBECONFIG={kubeconfig()} is another cluster: deselect it with --deselect or -k")
    added = []
    try:
        for node, leaf in NODES.items():
            _cli("cluster", "node", "remove", node)  # a leftover of an interrupted run
            labels = {**SELECT, L1: "nn-top", L2: "nn-spine", L3: leaf, DOMAIN: DOMAINS[node]}
            proc = _cli("cluster", "node", "add", node, *(a for k, v in labels.items() for a in ("--label", f"{k}={v}")),
                        "--taint", f"{TAINT}=true:NoSchedule", "--image", "slurmk8s/slurmd:dev")
            assert proc.returncode == 0, f"cluster node add {node}:\n{proc.stdout}\n{proc.stderr}"
            added.append(node)
            print(f"node {node} ({leaf}): {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else 'added'}")
        yield NODES
    finally:
        for node in added:
            proc = _cli("cluster", "node", "remove", node)
            if proc.returncode != 0:
                print(f"cluster node remove {node} failed:\n{proc.stdout}\n{proc.stderr}")


def _spec(public_key: str) -> dict[str, Any]:
    doc = side_spec(public_key, NAME)
    doc["topology"] = {"preset": "aws"}
    tolerate = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    doc["pools"] = [
        # one Slurm node per labelled Kubernetes node, placed by the topology
        {"name": "topo", "mode": "pinned", "node_selector": SELECT, "tolerations": tolerate,
         "pod_cpu_request": "50m", "pod_memory_request": "256Mi"},
        # slots on any of them, wherever Kubernetes schedules the pod (node loss)
        # (a PriorityClass of the workers' own, below the preemption test's pod: issue 42 item 4)
        {"name": "roam", "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m",
         "pod_memory_request": "128Mi", "domains": [{"name": "any", "count": 2}], "node_selector": SELECT,
         "tolerations": tolerate, "priority_class": WORKER_PRIORITY},
        # a slot whose Kubernetes node an autoscaler adds on demand: no node has its label until the
        # slow-scale-up test adds one, minutes after its pod is Pending (issue 42 item 5)
        {"name": "late", "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m",
         "pod_memory_request": "128Mi", "domains": [{"name": "any", "count": 1}], "node_selector": LATE_SELECT,
         "tolerations": tolerate, "node_start_timeout": f"{LATE_NODE_START}s"},
        # a slot whose pod the kubelet evicts when its job writes past the pod's ephemeral-storage limit
        # (issue 42 item 4: a real kubelet eviction; memory pressure would take the whole machine)
        {"name": "evict", "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m",
         "pod_memory_request": "128Mi", "domains": [{"name": "any", "count": 1}], "node_selector": SELECT,
         "tolerations": tolerate, "extra_resources": {"ephemeral-storage": EVICT_STORAGE}},
    ]
    return doc


WORKER_PRIORITY, HIGHER_PRIORITY = "slurmk8s-e2e-workers", "slurmk8s-e2e-higher"
PRIORITIES = {WORKER_PRIORITY: 1000, HIGHER_PRIORITY: 2000}


def _priority_classes(namespace: str, spec_path, state) -> None:
    """Before `up` (whose preflight checks that the pool's class exists)."""
    for name, value in PRIORITIES.items():
        kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "globalDefault": False, "description": "slurmk8s e2e (test_e2e_topology.py)"}))


@pytest.fixture(scope="module")
def topo(topo_nodes, tmp_path_factory) -> Iterator[Login]:
    try:
        with side_cluster(NAME, _spec, tmp_path_factory.mktemp(NAME), prepare=_priority_classes) as login:
            yield login
    finally:
        kubectl("delete", "priorityclass", *PRIORITIES, "--ignore-not-found", check=False)


def _switches(login: Login, partition: str = "topo") -> dict[str, str]:
    """Slurm node of `partition` -> its leaf switch, from `scontrol show topology` (the leaves: level 0)."""
    mine = set(login.run(f"sinfo -h -p {partition} -N -o %N").stdout.split())
    out = login.run("scontrol show topology").stdout
    leaves = {}
    for line in out.splitlines():
        m = re.search(r"SwitchName=(\S+) Level=0 .*Nodes=(\S+)", line)
        if m:
            for node in login.run(f"scontrol show hostnames {m.group(2)}").stdout.split():
                if node in mine:
                    leaves[node] = m.group(1)
    return leaves


def _placed(job: dict[str, Any]) -> dict[str, str]:
    """The job's Slurm nodes -> the Kubernetes node each worker pod ran on."""
    pods = {p["metadata"]["name"]: p for p in kjson("get", "pods", "-n", NAMESPACE, "-l",
                                                    "app.kubernetes.io/component=worker")["items"]}
    out = {}
    for node in job["nodes_list"]:
        pod = pods.get(node)
        assert pod is not None, f"no worker pod for Slurm node {node} (pods: {sorted(pods)})"
        out[node] = pod["spec"]["nodeName"]
    return out


def _run_and_place(login: Login, script: str) -> tuple[dict[str, Any], dict[str, str], str]:
    """Submit `script`; once it runs, where each of its Slurm nodes' pods is. A job that ends before
    it is seen running (a failure within one poll) ends the wait too: the caller's check of its final
    state then shows its output, instead of this wait outwaiting a job that is already over."""
    job = submit(login, script)
    seen: dict[str, str] = {}

    def running():
        doc = login.json(f"scontrol show job {job} --json")["jobs"][0]
        state = set(doc["job_state"])
        if state & FINAL and "COMPLETED" not in state:
            return doc  # ended otherwise: its pods may be gone already
        # RUNNING+CONFIGURING: allocated, its nodes still powering up (no pod yet)
        if state & {"RUNNING", "COMPLETING", "COMPLETED"} and "CONFIGURING" not in state:
            doc["nodes_list"] = login.run(f"scontrol show hostnames {doc['nodes']}").stdout.split()
            seen.update(_placed(doc))
            return doc
        return None

    doc = wait_for(f"job {job} to start", running, 240, interval=1, show=lambda _: job_story(login, job))
    final = wait_job(login, job, 180)
    return {**doc, "final": final}, seen, job


def _k8s_leaf(node: str) -> str:
    return kjson("get", "node", node)["metadata"]["labels"][L3]


def test_slurm_sees_the_kubernetes_nodes_switches(topo: Login, topo_nodes):
    leaves = _switches(topo)
    assert sorted(leaves.values()) == ["leaf-a", "leaf-a", "leaf-b"], topo.run("scontrol show topology").stdout
    assert "nn-spine" in topo.run("scontrol show topology").stdout


def test_switches_1_lands_on_two_kubernetes_nodes_under_one_leaf(topo: Login, topo_nodes):
    job, placed, job_id = _run_and_place(topo, "#!/bin/bash\n#SBATCH -p topo -N2 --switches=1 -o sw-%j.out\nsrun hostname")
    assert job["final"]["job_state"] == ["COMPLETED"], topo.run(f"cat ~/sw-{job_id}.out", check=False).stdout
    k8s_nodes = set(placed.values())
    assert len(k8s_nodes) == 2, f"two Slurm nodes on one Kubernetes node: {placed}"
    assert {_k8s_leaf(n) for n in k8s_nodes} == {"leaf-a"}, placed  # the only leaf with two nodes
    leaves = _switches(topo)
    assert {leaves[n] for n in placed} == {"leaf-a"}, (placed, leaves)
    print(f"--switches=1: Slurm nodes {sorted(placed)} on Kubernetes nodes {sorted(k8s_nodes)} (leaf-a)")


def test_mpi_allreduce_across_kubernetes_nodes_and_a_job_spanning_both_switches(topo: Login, topo_nodes):
    topo.run(f"cat > allreduce.c <<'EOF'\n{ALLREDUCE_C}\nEOF\nmpicc -O2 -o allreduce allreduce.c")
    job, placed, job_id = _run_and_place(
        topo, "#!/bin/bash\n#SBATCH -p topo -N3 -n3 -o mpi3-%j.out\nsrun --mpi=pmix ./allreduce")
    out = topo.run(f"cat ~/mpi3-{job_id}.out", check=False).stdout
    assert job["final"]["job_state"] == ["COMPLETED"], out
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(lines) == 3 and all(line.endswith("sum 6021") for line in lines), out  # 1007 + 2007 + 3007
    assert set(placed.values()) == set(NODES), f"3 nodes should use every Kubernetes node: {placed}"
    assert {_k8s_leaf(n) for n in placed.values()} == {"leaf-a", "leaf-b"}
    print(f"MPI allreduce over 3 Kubernetes nodes across 2 leaf switches: {out.strip()}")


# ---------------------------------------------------------------- node loss (issue #14 item 3)

LOST_JOB = """#!/bin/bash
#SBATCH -p roam -N1 --requeue -o lost-%j.out
# first run: held until its Kubernetes node is lost; the requeued run ends at once
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 3601; fi
echo "ran on $(hostname) restart ${SLURM_RESTART_COUNT:-0}"
"""


def _k8s_ready(node: str) -> str:
    conds = kjson("get", "node", node)["status"].get("conditions") or []
    return next((c["status"] for c in conds if c["type"] == "Ready"), "?")


def test_a_lost_kubernetes_node_sets_its_slurm_node_down_and_the_job_runs_again_elsewhere(topo: Login, topo_nodes):
    """The kubelet and containerd of the node under a running job stop (`slurmk8s cluster node stop`,
    its containers left running, as on a lost machine). The node controller marks it Unknown and its
    pods not ready; the reconcile loop sets the Slurm node DOWN naming the Kubernetes node, Slurm
    requeues the job, the pod is removed at once and the job runs again on a node that answers.
    When the node answers again its kubelet kills what was left, and the Slurm node is back in
    service by itself."""
    job = submit(topo, LOST_JOB)

    def running_on() -> tuple[str, str] | None:
        doc = topo.json(f"scontrol show job {job} --json")["jobs"][0]
        if "RUNNING" in doc["job_state"] and "CONFIGURING" not in doc["job_state"] and doc.get("nodes"):
            pod = kjson("get", "pod", "-n", NAMESPACE, doc["nodes"])
            return doc["nodes"], pod["spec"]["nodeName"]
        return None

    slurm_node, k8s_node = wait_for(f"job {job} to run", running_on, 240, interval=1)
    assert k8s_node in NODES
    stopped = _cli("cluster", "node", "stop", k8s_node)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    t_stop = time.monotonic()
    try:
        seen: dict[str, float] = {}

        def down_named() -> bool:
            now = time.monotonic()
            if "unknown" not in seen and _k8s_ready(k8s_node) != "True":
                seen["unknown"] = now
            doc = topo.json(f"scontrol show node {slurm_node} --json")["nodes"][0]
            if f"Kubernetes node {k8s_node} stopped answering" in (doc.get("reason") or ""):
                seen.setdefault("down", now)
            restarts = topo.json(f"scontrol show job {job} --json")["jobs"][0].get("restart_cnt") or 0
            return "down" in seen and restarts >= 1

        wait_for(f"Slurm node {slurm_node} DOWN naming {k8s_node} and job {job} requeued", down_named, 150,
                 interval=1)
        after_condition = seen["down"] - seen.get("unknown", seen["down"])
        print(f"node loss: kubelet stopped -> Kubernetes node not Ready {seen.get('unknown', 0) - t_stop:.0f}s, "
              f"-> Slurm node DOWN {seen['down'] - t_stop:.0f}s ({after_condition:.0f}s after the condition)")
        assert after_condition <= 60, f"DOWN {after_condition:.0f}s after the node's condition changed"
        final = wait_job(topo, job, 240)
        out = topo.run(f"cat ~/lost-{job}.out", check=False).stdout
        assert final["job_state"] == ["COMPLETED"] and "restart 1" in out, (final["job_state"], out)
        print(f"node loss: kubelet stopped -> job COMPLETED after its requeue {time.monotonic() - t_stop:.0f}s")
    finally:
        started = _cli("cluster", "node", "start", k8s_node)
        assert started.returncode == 0, started.stdout + started.stderr
    # the kubelet answers again: what was left of the lost pod goes, and nothing is left on the node
    wait_for("the lost pod's processes to be gone", lambda: subprocess.run(
        ["pgrep", "-f", "sleep 3601"], capture_output=True).returncode != 0, 120, interval=2)
    wait_for(f"Slurm node {slurm_node} back in service", lambda: not (
        {"DOWN", "DRAIN", "FAIL"} & set(topo.json(f"scontrol show node {slurm_node} --json")["nodes"][0]["state"])),
        120, interval=2)


# ---------------------------------------------------------------- node churn, live (issue #14 item 4)

SELECT_KEY = next(iter(SELECT))


def _slurm(k8s_node: str) -> str:
    return f"topo-{k8s_node}"


def _node(login: Login, name: str) -> dict[str, Any] | None:
    """The Slurm node as `scontrol show node --json` has it; None once slurmctld no longer has it."""
    proc = login.run(f"scontrol show node {name} --json", check=False)
    if proc.returncode != 0:
        return None
    nodes = json.loads(proc.stdout).get("nodes") or []
    return nodes[0] if nodes else None


def _ctld(*argv: str) -> str:
    """A Slurm command as SlurmUser in the slurmctld container (an operator's view)."""
    return kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "setpriv", "--reuid", "slurm",
                   "--regid", "slurm", "--init-groups", "--", *argv).stdout


def _pool_failures(pool: str = "topo") -> list[dict[str, Any]]:
    """The pool's failures in the resume failure ledger (the pool backoff counts these)."""
    proc = kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "reconcile", "--", "cat",
                   "/var/spool/slurmctld/slurmk8s/ledger.json", check=False)
    doc = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}
    return ((doc.get("pools") or {}).get(pool) or {}).get("failures") or []


def _reconcile_log() -> str:
    return kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "cat",
                   "/var/log/slurmk8s/reconcile.log", check=False).stdout


def _boot_time() -> str:
    m = re.search(r"^BOOT_TIME\s*=\s*(\S+)", _ctld("scontrol", "show", "config"), re.M)
    assert m, "no BOOT_TIME in scontrol show config"
    return m.group(1)


def _job(login: Login, job: str) -> dict[str, Any]:
    return login.json(f"scontrol show job {job} --json")["jobs"][0]


def test_a_cordon_drains_the_slurm_node_live_and_is_never_a_pool_failure(topo: Login, topo_nodes):
    """`kubectl cordon` of a pool's Kubernetes node drains its Slurm node (reason naming the
    cordon) within one reconcile period, with no `up` and no restart. A job that Slurm hands the
    node anyway (an operator undrained it) is refused by the resume program and requeued, and the
    pool's failure ledger stays empty; `kubectl uncordon` returns the node to service."""
    k8s_node = "e2e-topo-b1"
    name = _slurm(k8s_node)
    boot = _boot_time()
    kubectl("cordon", k8s_node)
    try:
        t0 = time.monotonic()
        wait_for(f"Slurm node {name} drained for the cordon", lambda: "DRAIN" in (_node(topo, name) or {}).get("state", [])
                 and "cordoned" in (_node(topo, name) or {}).get("reason", ""), 60, interval=1)
        print(f"cordon: kubectl cordon -> Slurm node DRAIN (reason cordoned) {time.monotonic() - t0:.1f}s")
        # the race a cordon can lose: the node is handed a job before the loop saw the cordon
        job = submit(topo, f"#!/bin/bash\n#SBATCH -p topo -w {name} --requeue -o cordon-%j.out\nhostname")
        _ctld("scontrol", "update", f"nodename={name}", "state=undrain")

        def refused() -> bool:
            doc = _job(topo, job)
            node = _node(topo, name) or {}
            return (doc.get("restart_cnt") or 0) >= 1 or ("DOWN" in node.get("state", []) and "cordoned" in
                                                          node.get("reason", ""))
        wait_for(f"job {job} refused on the cordoned node and requeued", refused, 90, interval=1)
        pods = kjson("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=worker")["items"]
        assert not [p for p in pods if p["metadata"]["name"] == name and p["status"].get("phase") == "Running"]
        assert not _pool_failures(), f"a cordoned node counted as a failure of pool topo: {_pool_failures()}"
        topo.run(f"scancel {job}")
    finally:
        kubectl("uncordon", k8s_node)
    t1 = time.monotonic()
    wait_for(f"Slurm node {name} back in service after the uncordon", lambda: not (
        {"DOWN", "DRAIN", "FAIL"} & set((_node(topo, name) or {"state": ["DOWN"]})["state"])), 120, interval=1)
    print(f"cordon: kubectl uncordon -> Slurm node back in service {time.monotonic() - t1:.1f}s")
    # no restart and no reconfigure: slurmctld's boot time is the one it had before the cordon
    assert _boot_time() == boot
    assert not _pool_failures()


# ---------------------------------------------------------------- drains (issue 42 item 2)

BUSY = "slurmk8s.io/busy"  # names.L_BUSY: the label the workers' PodDisruptionBudget selects
PDB_REFUSAL = "would violate the pod's disruption budget"  # kubectl drain's line for a refused eviction
DRAIN_JOB = "#!/bin/bash\n#SBATCH -p topo -w {node} -o drain-%j.out\nsleep {seconds}; echo done\n"


def _worker(name: str) -> dict[str, Any] | None:
    """The Slurm node's worker pod, unless it is on its way out."""
    proc = kubectl("get", "pod", "-n", NAMESPACE, name, "-o", "json", check=False)
    pod = json.loads(proc.stdout) if proc.returncode == 0 else None
    return pod if pod and not pod["metadata"].get("deletionTimestamp") else None


def _busy_label(name: str) -> str | None:
    pod = _worker(name)
    return None if pod is None else (pod["metadata"].get("labels") or {}).get(BUSY, "")


def _drain(k8s_node: str) -> subprocess.Popen[str]:
    # --force: worker pods have no controller, which kubectl drain refuses without it; it still
    # evicts (the PodDisruptionBudget holds), it only lifts kubectl's own check
    return subprocess.Popen([kubectl_exe(), "--kubeconfig", kubeconfig(), "drain", k8s_node, "--ignore-daemonsets",
                             "--delete-emptydir-data", "--force", "--timeout=180s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_drain_evicts_idle_workers_at_once_and_waits_for_a_busy_workers_job(topo: Login, topo_nodes):
    """`kubectl drain` of a Kubernetes node. Its idle worker is evicted at once (the workers'
    PodDisruptionBudget covers busy workers only) and its Slurm node powered down, never DOWN. A busy
    worker's eviction is refused while its job runs: the cordon drains the Slurm node, the job
    completes where it runs (no requeue), the worker is then idle and evicted, and the drain ends."""
    idle_k8s, busy_k8s = "e2e-topo-a1", "e2e-topo-a2"
    idle, busy = _slurm(idle_k8s), _slurm(busy_k8s)
    try:
        # an idle worker: a job brings it up; drained once the loop has seen it idle
        job = submit(topo, DRAIN_JOB.format(node=idle, seconds=0))
        assert wait_job(topo, job, 180)["job_state"] == ["COMPLETED"], job_story(topo, job)
        wait_for(f"worker {idle} up and idle (no busy label)", lambda: _busy_label(idle) == "", 30, interval=0.5)
        t0 = time.monotonic()
        drain = _drain(idle_k8s)
        out, err = drain.communicate(timeout=200)
        took = time.monotonic() - t0
        assert drain.returncode == 0, out + err
        assert PDB_REFUSAL not in err, f"the idle worker's eviction was refused:\n{err}"
        print(f"drain: kubectl drain of a node with only an idle worker done in {took:.1f}s (goal <= 10s)")
        assert took <= 10, f"kubectl drain took {took:.1f}s with only an idle worker:\n{out}{err}"

        def powered_down() -> dict[str, Any] | None:
            node = _node(topo, idle) or {}
            assert "DOWN" not in node.get("state", []), f"the evicted idle worker's node was set DOWN: {node}"
            return node if "POWERED_DOWN" in node.get("state", []) else None
        wait_for(f"Slurm node {idle} powered down", powered_down, 60, interval=0.5)
        assert not _pool_failures()

        # a busy worker: its job runs out its time on the cordoned (drained) node
        job = submit(topo, DRAIN_JOB.format(node=busy, seconds=20))
        wait_for(f"job {job} running with its worker labelled busy", lambda: "RUNNING" in _job(topo, job)["job_state"]
                 and "CONFIGURING" not in _job(topo, job)["job_state"] and _busy_label(busy) == "true", 120,
                 interval=0.5, show=lambda _: job_story(topo, job))
        t0 = time.monotonic()
        drain = _drain(busy_k8s)
        wait_for(f"Slurm node {busy} drained for the cordon", lambda: "DRAIN" in (_node(topo, busy) or {}).get(
            "state", []) and "cordoned" in (_node(topo, busy) or {}).get("reason", ""), 30, interval=0.5)
        drained = time.monotonic() - t0
        time.sleep(6)  # kubectl drain has tried the eviction at least once
        assert _worker(busy) is not None, "the busy worker was evicted under its job"
        assert drain.poll() is None, "kubectl drain ended while the job ran"
        final = wait_job(topo, job, 120)
        ended = time.monotonic()
        assert final["job_state"] == ["COMPLETED"] and not final.get("restart_cnt"), \
            (final["job_state"], final.get("restart_cnt"), job_story(topo, job))
        out, err = drain.communicate(timeout=120)
        done = time.monotonic()
        assert drain.returncode == 0, out + err
        assert PDB_REFUSAL in err, f"no eviction was refused while the job ran:\n{err}"
        print(f"drain: busy worker: Slurm node drained {drained:.1f}s after kubectl drain; the job COMPLETED "
              f"in place; drain done {done - ended:.1f}s after the job ended ({done - t0:.1f}s in all)")
        assert topo.run(f"cat ~/drain-{job}.out").stdout.strip() == "done"
    finally:
        for k8s_node in (idle_k8s, busy_k8s):
            kubectl("uncordon", k8s_node, check=False)
    for name in (idle, busy):
        wait_for(f"Slurm node {name} back in service after the uncordon", lambda name=name: not (
            {"DOWN", "DRAIN", "FAIL"} & set((_node(topo, name) or {"state": ["DOWN"]})["state"])), 120, interval=1)
    assert not _pool_failures()


# ---------------------------------------------------------------- interruption notices (issue 42 item 3)

NOTICE = "karpenter.sh/disrupted"  # one of elasticity.interruption_taints' defaults
# A roam job whose first run waits to be taken away (and records the SIGTERM it gets); the requeued
# run takes 5 s, so that it is seen running. {name}: the files' prefix.
TAKEN_JOB = """#!/bin/bash
#SBATCH -p roam -N1 --requeue -o {name}-%j.out
trap 'echo "SIGTERM on $(hostname)" > ~/{name}-term-$SLURM_JOB_ID; exit 143' TERM
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then sleep 3601 & wait; else sleep 5; fi
echo "ran on $(hostname) restart ${{SLURM_RESTART_COUNT:-0}}"
"""


def _completed_after_sigterm_and_one_requeue(login: Login, job: str, name: str) -> None:
    final = wait_job(login, job, 120)
    out = login.run(f"cat ~/{name}-{job}.out", check=False).stdout
    assert final["job_state"] == ["COMPLETED"] and "restart 1" in out, (final["job_state"], out)
    term = login.run(f"cat ~/{name}-term-{job}", check=False).stdout
    assert term.startswith("SIGTERM on"), f"the job got no SIGTERM before its requeue: {term!r}"
    assert not _pool_failures("roam"), _pool_failures("roam")


def test_an_interruption_notice_requeues_the_job_at_once_and_it_runs_again_on_another_host(topo: Login, topo_nodes):
    """Karpenter's disruption taint on the Kubernetes node under a running job (as on a spot reclaim):
    within one reconcile pass the Slurm node goes DOWN with a reason naming the notice while the host
    still runs, the job gets SIGTERM and is requeued (not NODE_FAIL after the loss), and it runs
    again on another host (the taint keeps the pod off it). The pinned pool's node on that host is
    drained meanwhile, and back in service once the taint is gone."""
    job = submit(topo, TAKEN_JOB.format(name="notice"))

    def running_on() -> tuple[str, str] | None:
        doc = _job(topo, job)
        if "RUNNING" in doc["job_state"] and "CONFIGURING" not in doc["job_state"] and doc.get("nodes"):
            pod = _worker(doc["nodes"])
            return (doc["nodes"], pod["spec"]["nodeName"]) if pod and pod["spec"].get("nodeName") else None
        return None

    slurm_node, host = wait_for(f"job {job} to run", running_on, 240, interval=1, show=lambda _: job_story(topo, job))
    pinned = _slurm(host)
    kubectl("taint", "node", host, f"{NOTICE}=:NoSchedule")
    t0 = time.monotonic()
    try:
        seen: dict[str, float] = {}

        def requeued() -> bool:
            node = _node(topo, slurm_node) or {}
            if "host-interrupted" in node.get("reason", "") and NOTICE in node.get("reason", ""):
                seen.setdefault("down", time.monotonic() - t0)
            doc = _job(topo, job)
            if (doc.get("restart_cnt") or 0) >= 1:
                seen.setdefault("requeued", time.monotonic() - t0)
            return "down" in seen and "requeued" in seen
        wait_for(f"Slurm node {slurm_node} DOWN naming the notice and job {job} requeued", requeued, 60,
                 interval=0.5, show=lambda _: job_story(topo, job))
        print(f"notice: taint -> Slurm node DOWN {seen['down']:.1f}s, job requeued {seen['requeued']:.1f}s "
              f"(goal <= 5 s)")
        assert seen["requeued"] <= 15, f"the job was requeued {seen['requeued']:.1f}s after the notice"
        assert "interruption notice" in ((_node(topo, pinned) or {}).get("reason") or ""), \
            f"the pinned node {pinned} on the host is not drained for the notice: {_node(topo, pinned)}"
        again = wait_for(f"job {job} running again", running_on, 240, interval=0.5,
                         show=lambda _: job_story(topo, job))
        print(f"notice: taint -> job RUNNING again on {again[1]} {time.monotonic() - t0:.1f}s "
              f"(Slurm holds a requeued job cred_expire, here 30 s)")
        assert again[1] != host, f"the job ran again on the host with the notice {host}"
        _completed_after_sigterm_and_one_requeue(topo, job, "notice")
    finally:
        kubectl("taint", "node", host, f"{NOTICE}:NoSchedule-", check=False)
    for name in (slurm_node, pinned):
        wait_for(f"Slurm node {name} back in service", lambda name=name: not (
            {"DOWN", "DRAIN", "FAIL"} & set((_node(topo, name) or {"state": ["DOWN"]})["state"])), 120, interval=1)


# ---------------------------------------------------------------- scheduler preemption (issue 42 item 4)

def _preemptor(host: str, worker: dict[str, Any]) -> dict[str, Any]:
    """A pod of the higher PriorityClass that fits on `host` only once the worker is gone: it asks
    for every CPU the pods there leave but this cluster's workers (so the scheduler cannot pick a
    pinned worker of priority 0 alone as the victim)."""
    allocatable = _milli(kjson("get", "node", host)["status"]["allocatable"]["cpu"])
    pods = kjson("get", "pods", "-A", "--field-selector", f"spec.nodeName={host}")["items"]
    ours = {p["metadata"]["uid"] for p in pods if p["metadata"]["namespace"] == NAMESPACE and
            (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "worker"}
    assert worker["metadata"]["uid"] in ours
    used = sum(_milli(c.get("resources", {}).get("requests", {}).get("cpu", "0")) for p in pods
               if p["status"].get("phase") not in ("Succeeded", "Failed") and p["metadata"]["uid"] not in ours
               for c in p["spec"]["containers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "e2e-preemptor", "namespace": "default"},
            "spec": {"priorityClassName": HIGHER_PRIORITY, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {"kubernetes.io/hostname": host},
                     "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "sleep", "image": "slurmk8s/slurmd:dev", "imagePullPolicy": "Never",
                                     "command": ["sleep", "infinity"],
                                     "resources": {"requests": {"cpu": f"{allocatable - used}m"}}}]}}


def test_a_worker_preempted_by_a_higher_priority_pod_requeues_its_job_which_runs_elsewhere(topo: Login, topo_nodes):
    """The roam pool's workers run at their PriorityClass (pools[].priority_class, 1000). A pod of a
    higher class that needs the worker's CPU on its host: the scheduler preempts the worker (its
    DisruptionTarget condition says PreemptionByScheduler), the worker's preStop hook requeues the
    job with SIGTERM, the loop's finding names the preemption, the pool is not backed off, and the
    job runs again on another host."""
    job = submit(topo, TAKEN_JOB.format(name="preempt"))

    def running_on() -> tuple[str, dict[str, Any]] | None:
        doc = _job(topo, job)
        if "RUNNING" in doc["job_state"] and "CONFIGURING" not in doc["job_state"] and doc.get("nodes"):
            pod = _worker(doc["nodes"])
            return (doc["nodes"], pod) if pod and pod["spec"].get("nodeName") else None
        return None

    slurm_node, pod = wait_for(f"job {job} to run", running_on, 240, interval=1, show=lambda _: job_story(topo, job))
    assert pod["spec"].get("priority") == PRIORITIES[WORKER_PRIORITY], pod["spec"].get("priority")
    host = pod["spec"]["nodeName"]
    kubectl("apply", "-f", "-", input=json.dumps(_preemptor(host, pod)))
    t0 = time.monotonic()
    try:
        wait_for(f"job {job} requeued", lambda: (_job(topo, job).get("restart_cnt") or 0) >= 1, 90,
                 interval=0.5, show=lambda _: job_story(topo, job))
        print(f"preemption: higher-priority pod -> job requeued {time.monotonic() - t0:.1f}s")
        # the preStop hook requeued it, so the loop finds the node idle: powered down, the cause named
        said = wait_for("the loop's finding naming the preemption", lambda: next(
            (line for line in _reconcile_log().splitlines() if f"{slurm_node} " in line and "PreemptionByScheduler"
             in line), None), 60, interval=1)
        print(f"preemption: {said.split(' reconcile[', 1)[-1][:160]}")
        again = wait_for(f"job {job} running again", running_on, 240, interval=0.5, show=lambda _: job_story(topo, job))
        assert again[1]["spec"]["nodeName"] != host, "the job ran again on the host of the preemptor"
        _completed_after_sigterm_and_one_requeue(topo, job, "preempt")
        print(f"preemption: higher-priority pod -> job COMPLETED after its requeue {time.monotonic() - t0:.1f}s")
    finally:
        kubectl("delete", "pod", "-n", "default", "e2e-preemptor", "--ignore-not-found", "--wait=false", check=False)
    wait_for(f"Slurm node {slurm_node} back in service", lambda: not (
        {"DOWN", "DRAIN", "FAIL"} & set((_node(topo, slurm_node) or {"state": ["DOWN"]})["state"])), 120, interval=1)


def _milli(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _filler(k8s_node: str) -> dict[str, Any]:
    """A pod that takes every CPU left on `k8s_node`, so that a worker pod for it stays Pending."""
    allocatable = _milli(kjson("get", "node", k8s_node)["status"]["allocatable"]["cpu"])
    pods = kjson("get", "pods", "-A", "--field-selector", f"spec.nodeName={k8s_node}")["items"]
    used = sum(_milli(c.get("resources", {}).get("requests", {}).get("cpu", "0")) for p in pods
               if p["status"].get("phase") not in ("Succeeded", "Failed") for c in p["spec"]["containers"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "e2e-filler", "namespace": "default"},
            "spec": {"nodeName": k8s_node, "terminationGracePeriodSeconds": 0,
                     "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "sleep", "image": "slurmk8s/slurmd:dev", "imagePullPolicy": "Never",
                                     "command": ["sleep", "infinity"],
                                     "resources": {"requests": {"cpu": f"{max(allocatable - used - 10, 1)}m"}}}]}}


def test_a_reconfigure_during_a_boot_wait_blocks_no_slurm_command(topo: Login, topo_nodes):
    """Issue 40 item 1: a topology label changes while a job's PrologSlurmctld waits for its node
    to boot (its worker pod Pending: the Kubernetes node is full). Slurm 24.11 answers no RPC during
    a reconfigure until every script it started has ended, so a reconfigure behind that wait would
    stall every Slurm command until ResumeTimeout. The loop holds first: the wait ends, the
    reconfigure runs, and no `squeue` takes more than 5 s; the job runs once the node has room."""
    full, moved = "e2e-topo-a2", "e2e-topo-b1"
    kubectl("delete", "pod", "-n", "default", "e2e-filler", "--ignore-not-found", "--wait=true")
    # a worker pod of an earlier test still on that node (roam-0 until its SuspendTime) would be
    # counted by the filler and then free its CPU: the job's pod started there after 7 s in a CI run,
    # its boot wait ending before the reconfigure it was to be released for
    wait_for(f"no worker pod on {full}", lambda: not kjson(
        "get", "pods", "-A", "-l", "app.kubernetes.io/component=worker",
        "--field-selector", f"spec.nodeName={full}")["items"], 180, interval=1)
    kubectl("apply", "-f", "-", input=json.dumps(_filler(full)))
    wait_for("the filler pod running", lambda: kjson("get", "pod", "-n", "default", "e2e-filler")["status"].get(
        "phase") == "Running", 60, interval=1)
    calls: list[tuple[float, float]] = []  # (start, seconds) of each squeue
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t = time.monotonic()
            _ctld("timeout", "300", "squeue", "-h")
            calls.append((t, time.monotonic() - t))
            done.wait(0.5)

    job = ""
    prober = threading.Thread(target=probe, daemon=True)
    try:
        job = submit(topo, f"#!/bin/bash\n#SBATCH -p topo -w {_slurm(full)} -o boot-wait-%j.out\nhostname")
        wait_for(f"job {job} waiting for its node to boot (CONFIGURING, worker pod Pending)",
                 lambda: "CONFIGURING" in _job(topo, job)["job_state"] and kjson(
                     "get", "pod", "-n", NAMESPACE, _slurm(full))["status"].get("phase") == "Pending", 90, interval=1)
        prober.start()
        time.sleep(3)
        kubectl("label", "node", moved, f"{L3}=leaf-a", "--overwrite")
        t0 = time.monotonic()
        wait_for(f"{moved} under leaf-a", lambda: _switches(topo).get(_slurm(moved)) == "leaf-a", 90, interval=1)
        print(f"boot wait: topology label changed -> reconfigured {time.monotonic() - t0:.1f}s")
        time.sleep(5)
        done.set()
        prober.join(320)
        worst = max(seconds for _, seconds in calls)
        print(f"boot wait: {len(calls)} squeue calls during the reconfigure, worst {worst:.2f}s (goal <= 5 s)")
        # the goal is 5 s (0.49 s measured alone); under CI's load slurmctld's re-exec itself took 9 s
        # once. Behind a boot wait it stalls for minutes (60 s defer, then until ResumeTimeout): 30 s
        # tells the two apart without timing CI's load
        assert worst <= 30, f"a Slurm command was blocked {worst:.1f}s behind the reconfigure: {calls}"
        log = _reconcile_log()
        assert "reconfigured slurmctld" in log, log[-3000:]
        assert f"job {job} nodes {_slurm(full)}: released" in kubectl(
            "exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "cat",
            "/var/log/slurmk8s/elastic.log", check=False).stdout, "the boot wait was released for the reconfigure"
        kubectl("delete", "pod", "-n", "default", "e2e-filler", "--wait=true")
        assert wait_job(topo, job, 180)["job_state"] == ["COMPLETED"], job_story(topo, job)
    finally:
        done.set()
        kubectl("delete", "pod", "-n", "default", "e2e-filler", "--ignore-not-found", "--wait=false", check=False)
        kubectl("label", "node", moved, f"{L3}=leaf-b", "--overwrite")
        if job:
            topo.run(f"scancel {job}", check=False)
    wait_for(f"{moved} back under leaf-b", lambda: _switches(topo).get(_slurm(moved)) == "leaf-b", 60, interval=1)


def test_labels_move_add_and_remove_slurm_nodes_live_and_keep_every_job(topo: Login, topo_nodes):
    """Node churn on a running cluster, applied by the reconcile loop with `scontrol reconfigure`:
    a changed leaf label moves the node in topology.conf; a node that loses the pool's label under
    a running job stays (drained) until the job ends, then leaves Slurm and its pod goes; the label
    back makes it a Slurm node again, in its switch, that runs a job on that Kubernetes node. A
    running and a pending job live through every reconfigure."""
    busy, moved = "e2e-topo-a1", "e2e-topo-b1"
    running = submit(topo, f"#!/bin/bash\n#SBATCH -p topo -w {_slurm(busy)} -o churn-run-%j.out\nsleep 600")
    pending = submit(topo, "#!/bin/bash\n#SBATCH -p topo --begin=now+2hours -o churn-pend-%j.out\nhostname")
    wait_for(f"job {running} running", lambda: "RUNNING" in _job(topo, running)["job_state"]
             and "CONFIGURING" not in _job(topo, running)["job_state"], 240, interval=1,
             show=lambda _: job_story(topo, running))
    start = _job(topo, running)["start_time"]
    try:
        # a changed topology label: the node moves to the other leaf switch
        kubectl("label", "node", moved, f"{L3}=leaf-a", "--overwrite")
        t0 = time.monotonic()
        wait_for(f"{moved} under leaf-a", lambda: _switches(topo).get(_slurm(moved)) == "leaf-a", 60, interval=1)
        print(f"churn: topology label changed -> node moved in Slurm's topology {time.monotonic() - t0:.1f}s")

        # the busy node loses the pool's label: kept, drained, until its job ends
        kubectl("label", "node", busy, f"{SELECT_KEY}-")
        t0 = time.monotonic()
        wait_for(f"{_slurm(busy)} drained as leaving", lambda: "left the pool" in (_node(topo, _slurm(busy)) or {}).get(
            "reason", ""), 60, interval=1)
        print(f"churn: pool label removed under a job -> Slurm node drained, kept {time.monotonic() - t0:.1f}s")
        doc = _job(topo, running)
        assert "RUNNING" in doc["job_state"] and doc["start_time"] == start, doc["job_state"]
        topo.run(f"scancel {running}")
        t0 = time.monotonic()
        wait_for(f"{_slurm(busy)} gone from Slurm once idle", lambda: _node(topo, _slurm(busy)) is None, 90, interval=1)
        print(f"churn: job ended -> the node left Slurm {time.monotonic() - t0:.1f}s")
        wait_for(f"pod {_slurm(busy)} gone", lambda: kubectl("get", "pod", "-n", NAMESPACE, _slurm(busy),
                                                             check=False).returncode != 0, 120, interval=2)

        # the label back: a Slurm node again, in its switch, running a job on that Kubernetes node
        kubectl("label", "node", busy, f"{SELECT_KEY}={SELECT[SELECT_KEY]}", "--overwrite")
        t0 = time.monotonic()
        wait_for(f"{_slurm(busy)} back in Slurm under leaf-a", lambda: _switches(topo).get(_slurm(busy)) == "leaf-a",
                 60, interval=1)
        print(f"churn: pool label added -> Slurm node in its switch {time.monotonic() - t0:.1f}s")
        job, placed, job_id = _run_and_place(topo, f"#!/bin/bash\n#SBATCH -p topo -w {_slurm(busy)} -o back-%j.out\nhostname")
        assert job["final"]["job_state"] == ["COMPLETED"] and placed == {_slurm(busy): busy}, (job["final"], placed)

        # the pending job lived through three reconfigures
        assert "PENDING" in _job(topo, pending)["job_state"]
        log = _reconcile_log()
        assert log.count("reconfigured slurmctld") >= 3, log[-3000:]
    finally:
        kubectl("label", "node", moved, f"{L3}=leaf-b", "--overwrite")
        kubectl("label", "node", busy, f"{SELECT_KEY}={SELECT[SELECT_KEY]}", "--overwrite")
        topo.run(f"scancel {running} {pending}", check=False)
    wait_for(f"{moved} back under leaf-b", lambda: _switches(topo).get(_slurm(moved)) == "leaf-b", 60, interval=1)


# ---------------------------------------------------------------- block topology (issue #14 item 2)

BLK = "blk"


def _blk_spec(public_key: str) -> dict[str, Any]:
    doc = side_spec(public_key, BLK)
    doc["topology"] = {"preset": "topograph-accelerator"}
    tolerate = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    # two slots per NVLink domain, each on a Kubernetes node of that domain
    doc["pools"] = [{"name": "blk", "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m",
                     "pod_memory_request": "128Mi", "node_selector": SELECT, "tolerations": tolerate,
                     "domain_label": DOMAIN, "domains": [{"name": "nvl-1", "count": 2}, {"name": "nvl-2", "count": 2}]}]
    return doc


@pytest.fixture(scope="module")
def blk(topo_nodes, tmp_path_factory) -> Iterator[Login]:
    with side_cluster(BLK, _blk_spec, tmp_path_factory.mktemp(BLK)) as login:
        yield login


def test_segment_keeps_a_job_in_one_nvlink_domain_and_mpi_runs_in_it(blk: Login, topo_nodes):
    """Slurm's block topology from the nodes' NVLink-domain labels: `--segment=2` puts both nodes of
    the job in one block, and each worker pod runs on a Kubernetes node of that domain; an MPI
    allreduce (PMIx) runs across them."""
    out = blk.run("scontrol show topology").stdout
    assert "BlockName=nvl-1" in out and "BlockName=nvl-2" in out, out
    blk.run(f"cat > allreduce.c <<'EOF'\n{ALLREDUCE_C}\nEOF\nmpicc -O2 -o allreduce allreduce.c")
    namespace = f"slurm-{BLK}"
    job = submit(blk, "#!/bin/bash\n#SBATCH -p blk -N2 -n2 --segment=2 -o seg-%j.out\nsrun --mpi=pmix ./allreduce")
    final = wait_job(blk, job, 240)
    text = blk.run(f"cat ~/seg-{job}.out", check=False).stdout
    assert final["job_state"] == ["COMPLETED"], text
    nodes = blk.run(f"scontrol show hostnames {final['nodes']}").stdout.split()
    blocks = {n.rsplit("-", 1)[0].removeprefix("blk-") for n in nodes}  # blk-nvl-1-0 -> nvl-1
    assert len(nodes) == 2 and len(blocks) == 1, f"--segment=2 split across blocks: {nodes}"
    lines = [line for line in text.splitlines() if line.startswith("rank ")]
    assert len(lines) == 2 and all(line.endswith("sum 3014") for line in lines), text  # 1007 + 2007
    (block,) = blocks
    events = kjson("get", "events", "-n", namespace, "--field-selector", "reason=Scheduled")["items"]
    hosts = {e["involvedObject"]["name"]: e["message"].rsplit(" to ", 1)[-1] for e in events}
    assert all(DOMAINS[hosts[n]] == block for n in nodes), f"pods {nodes} on {hosts} outside domain {block}"
    print(f"--segment=2: Slurm nodes {nodes} in block {block}, on Kubernetes nodes {[hosts[n] for n in nodes]}")


def test_a_job_waits_for_a_slow_new_kubernetes_node_says_why_and_runs_once_it_comes(topo: Login, topo_nodes):
    """Issue 42 item 5: the late pool's pod has no node to run on (as on a cluster whose autoscaler
    adds one for a Pending pod); the node is added (a real kubelet) 150 s after the pod is Pending,
    past the cluster's ResumeTimeout (120 s). The pool's node_start_timeout (300 s) makes Slurm wait
    (its partition's ResumeTimeout 420 s) and the loop too (not its 180 s Unschedulable bound); the
    job's comment names the scheduler's message meanwhile; the job then runs, never requeued."""
    slurm_node = topo.run("sinfo -h -p late -N -o %N").stdout.split()[0]
    assert f"ResumeTimeout={120 + LATE_NODE_START}" in topo.run("scontrol show partition late").stdout
    _cli("cluster", "node", "remove", LATE_NODE)  # a leftover of an interrupted run
    job = submit(topo, "#!/bin/bash\n#SBATCH -p late -N1 -o late-%j.out\nhostname")
    try:
        def pending() -> bool:
            pod = _worker(slurm_node)
            return bool(pod) and any(c.get("reason") == "Unschedulable" for c in pod["status"].get("conditions") or ())

        wait_for(f"job {job}'s pod Unschedulable", pending, 90, interval=1, show=lambda _: job_story(topo, job))
        t0 = time.monotonic()
        said = wait_for(f"job {job}'s comment naming the wait", lambda: (c := _job(topo, job).get("comment") or "")
                        .startswith("slurmk8s: waiting for a Kubernetes node") and c, 60, interval=1)
        print(f"slow node: comment {said[:160]}")
        time.sleep(max(0.0, LATE_AFTER - (time.monotonic() - t0)))
        doc = _job(topo, job)
        assert "CONFIGURING" in doc["job_state"] and not doc.get("restart_cnt"), job_story(topo, job)
        proc = _cli("cluster", "node", "add", LATE_NODE, *(a for k, v in LATE_SELECT.items() for a in ("--label", f"{k}={v}")),
                    "--taint", f"{TAINT}=true:NoSchedule", "--image", "slurmk8s/slurmd:dev")
        assert proc.returncode == 0, f"cluster node add {LATE_NODE}:\n{proc.stdout}\n{proc.stderr}"
        added = time.monotonic()
        done = wait_job(topo, job, 180)
        assert done["job_state"] == ["COMPLETED"] and not done.get("restart_cnt"), job_story(topo, job)
        print(f"slow node: pod Pending -> node added {added - t0:.0f}s (cluster ResumeTimeout 120 s), "
              f"node added -> job COMPLETED {time.monotonic() - added:.1f}s, never requeued")
        assert not _pool_failures("late"), _pool_failures("late")
    finally:
        topo.run(f"scancel {job}", check=False)
        topo.run(f"scontrol update nodename={slurm_node} state=POWER_DOWN_FORCE", check=False)
        wait_for(f"{slurm_node}'s pod gone", lambda: _worker(slurm_node) is None, 60, interval=1)
        _cli("cluster", "node", "remove", LATE_NODE)


# Its first run writes past the pod's ephemeral-storage limit and waits to be evicted; the requeued run
# (SLURM_RESTART_COUNT 1) just ends.
EVICT_JOB = """#!/bin/bash
#SBATCH -p evict -N1 --requeue -o evict-%j.out
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  dd if=/dev/zero of=/tmp/fill-$SLURM_JOB_ID bs=1M count=200 status=none
  sleep 300
fi
echo "run ${SLURM_RESTART_COUNT:-0} done"
"""


def test_a_worker_the_kubelet_evicts_requeues_its_job_naming_the_eviction_and_is_no_pool_failure(topo: Login, topo_nodes):
    """Issue 42 item 4: the kubelet evicts the evict pool's worker (its job wrote past the pod's
    ephemeral-storage limit: a real eviction, which Kubernetes 1.34 leaves with no DisruptionTarget
    condition; its preStop hook requeues the job, slurmd exits 0, the pod ends Succeeded). Without
    the fix the loop judged it worker-failed and counted a pool failure. Now the node goes the
    worker-taken way naming the kubelet, the pool is not backed off, the node returns and the
    requeued job completes."""
    job = submit(topo, EVICT_JOB)
    doc = wait_for(f"job {job} running", lambda: (d := _job(topo, job)) and "RUNNING" in d["job_state"] and
                   "CONFIGURING" not in d["job_state"] and d.get("nodes") and d, 240, interval=1,
                   show=lambda _: job_story(topo, job))
    slurm_node = doc["nodes"]
    t0 = time.monotonic()
    wait_for(f"job {job} requeued", lambda: (_job(topo, job).get("restart_cnt") or 0) >= 1, 120, interval=0.5,
             show=lambda _: job_story(topo, job))
    print(f"eviction: job RUNNING -> requeued {time.monotonic() - t0:.1f}s (the kubelet's eviction within it)")
    # the eviction: the pod's status says Evicted, or (its preStop hook ran, slurmd exited 0) the pod
    # ended by itself, which only the kubelet does to a restartPolicy Always pod
    said = wait_for("the loop's finding naming the kubelet", lambda: next(
        (line for line in _reconcile_log().splitlines() if line.split(" reconcile[", 1)[-1].split("] ", 1)[-1]
         .startswith(f"{slurm_node} ") and "kubelet" in line), None), 60, interval=1)
    print(f"eviction: {said.split(' reconcile[', 1)[-1][:220]}")
    assert "worker-failed" not in said and "record-failure" not in said, said
    done = wait_job(topo, job, 300)
    assert done["job_state"] == ["COMPLETED"], job_story(topo, job)
    print(f"eviction: job RUNNING -> requeued job COMPLETED {time.monotonic() - t0:.1f}s")
    assert "run 1 done" in topo.run(f"cat evict-{job}.out").stdout
    assert not _pool_failures("evict"), _pool_failures("evict")
    wait_for(f"Slurm node {slurm_node} back in service", lambda: not (
        {"DOWN", "DRAIN", "FAIL"} & set((_node(topo, slurm_node) or {"state": ["DOWN"]})["state"])), 120, interval=1)
