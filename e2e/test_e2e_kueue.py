"""A pool under a real Kueue queue (issue 41), on the local cluster: `up` refuses a missing
LocalQueue before applying anything; one job's pods are one pod group, admitted whole or not at
all; a job waiting for quota says why in its comment and runs as soon as the quota frees; with
Kueue stopped the nodes go DOWN with a reason naming Kueue, and the job completes once it is back.

Side cluster `kq` (namespace slurm-kq, labelled for Kueue to manage) with one slot pool of four
1-CPU nodes under LocalQueue `slurm` -> ClusterQueue `e2e-kq` whose quota holds the pods of one
2-node job (each worker pod requests 50m CPU and 128Mi).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers import (MADE_BY, ROOT, SUSPEND_TIME, TOOLCHAIN_BIN, kjson, kubeconfig, kubectl, side_cluster, side_spec,
                     slurmk8s, submit, wait_for, wait_job)
from kueuelab import apply, cluster_queue, kueue_outage, kueue_share, local_queue, resource_flavor

from provisioner import kueue as names
from provisioner.localk8s import kueue_manifests as km

pytestmark = pytest.mark.e2e

NAME = "kq"
NS = f"slurm-{NAME}"
QUEUE, CQ, FLAVOR = "slurm", "e2e-kq", "e2e-kq"
CHART = ROOT / "charts" / "slurmk8s"
POD = {"pod_cpu_request": "50m", "pod_memory_request": "128Mi"}
HIGH_NAME = "e2e-kq-high"  # a WorkloadPriorityClass above the Slurm pool's (Kueue's default, 0)
HIGH = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": HIGH_NAME},
        "value": 1000, "description": "e2e: another tenant's urgent workload"}


def kq_spec(public_key: str) -> dict[str, Any]:
    spec = side_spec(public_key, NAME)
    spec["pools"] = [{"name": "kq", "mode": "slots", "cpus": 1, "memory": "1Gi", **POD,
                      "domains": [{"name": "local", "count": 4}], "kueue": {"queue": QUEUE}}]
    return spec


@pytest.fixture(scope="module")
def kq(kueue, tmp_path_factory) -> Iterator[Any]:
    """The side cluster, deployed after `up` was first refused for want of its LocalQueue."""
    seen: dict[str, Any] = {}

    def prepare(ns: str, spec_path: Path, state: Path) -> None:
        kubectl("create", "namespace", ns)
        kubectl("label", "namespace", ns, f"{MADE_BY}=e2e", f"{km.MANAGED_KEY}={km.MANAGED_VALUE}", "--overwrite")
        refused = slurmk8s("up", "--spec", str(spec_path), "--state", str(state), log=spec_path.with_suffix(".refused"))
        seen["refused"] = (refused.returncode, spec_path.with_suffix(".refused").read_text())
        seen["applied"] = kjson("get", "statefulsets,deployments,configmaps", "-n", ns)["items"]
        # the chart's own check, against the live cluster (lookup runs under --dry-run=server)
        seen["helm"] = subprocess.run([str(Path(TOOLCHAIN_BIN) / "helm"), "install", "kq-check", str(CHART), "-n", ns,
                                       "--dry-run=server", "--values", str(spec_path), "--kubeconfig", kubeconfig()],
                                      capture_output=True, text=True, timeout=120)
        apply(resource_flavor(FLAVOR), local_queue(ns, QUEUE, CQ), HIGH,
              cluster_queue(CQ, FLAVOR, cpu="100m", memory="256Mi", preemption={"withinClusterQueue": "LowerPriority"}))

    with contextlib.ExitStack() as stack:
        with kueue_share():  # Kueue runs while the cluster is made (its tests hold it themselves)
            stack.callback(_remove_queues)
            login = stack.enter_context(side_cluster(NAME, kq_spec, tmp_path_factory.mktemp(NAME), prepare=prepare))
        login.refused, login.applied, login.helm = seen["refused"], seen["applied"], seen["helm"]
        yield login
        with kueue_share():  # and while it is removed (Kueue finalizes its objects)
            stack.close()


def _remove_queues() -> None:
    for kind, name in (("clusterqueue", CQ), ("resourceflavor", FLAVOR), ("workloadpriorityclass", HIGH_NAME)):
        kubectl("delete", kind, name, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150, check=False)


def test_up_refuses_a_pool_whose_local_queue_is_missing_before_applying_anything(kq):
    code, log = kq.refused
    assert code != 0, log
    assert f"LocalQueue '{QUEUE}' not found in namespace {NS}" in log, log[-3000:]
    assert "nothing was applied" in log
    # the owner record may be on the namespace; no object of the cluster is
    assert [o["metadata"]["name"] for o in kq.applied if o["metadata"]["name"] != "kube-root-ca.crt"] == []


def test_the_chart_refuses_a_pool_whose_local_queue_is_missing(kq):
    done = kq.helm
    assert done.returncode != 0, done.stdout[-2000:]
    assert f'pools[0].kueue.queue: LocalQueue "{QUEUE}" not found in namespace {NS}' in done.stderr, done.stderr


def _pods(job: str) -> list[dict[str, Any]]:
    return [p for p in kjson("get", "pods", "-n", NS, "-l", names.GROUP_LABEL)["items"]
            if names.job_of(p["metadata"]["labels"][names.GROUP_LABEL]) == int(job)]


def _gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] in names.GATES for g in pod["spec"].get("schedulingGates") or [])


def _comment(login, job: str) -> str:
    out = login.run(f"squeue -h -j {job} -O comment:500", check=False).stdout.strip()
    return "" if out == "(null)" else out


def test_two_jobs_on_a_quota_for_one_hold_no_part_the_second_says_why_and_runs_as_the_first_ends(kq, kueue_steady):
    first = submit(kq, "#!/bin/bash\n#SBATCH -p kq -N 2 -t 5\nsleep 12\n")
    wait_for(f"job {first} running", lambda: "RUNNING" in kq.run(f"squeue -h -j {first} -o %T").stdout, 120)
    second = submit(kq, "#!/bin/bash\n#SBATCH -p kq -N 2 -t 5\nsrun hostname\nsleep 15\n")
    wait_for(f"job {second}'s two pods, gated", lambda: [p for p in _pods(second) if _gated(p)][1:], 60)
    group = _pods(second)[0]["metadata"]["labels"][names.GROUP_LABEL]
    comment = wait_for(f"job {second}'s comment naming Kueue's reason", lambda: (
        c if "insufficient unused quota" in (c := _comment(kq, second)) else None), 30,
        show=lambda _: f"comment: {_comment(kq, second)!r}")
    assert comment.startswith(f"slurmk8s: waiting for Kueue (queue {QUEUE}, pod group {group}): ")
    shown = kq.run(f"scontrol show job {second}").stdout
    assert "Comment=slurmk8s: waiting for Kueue" in shown

    partial, ended, freed, started = 0, None, None, None
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        mine = _pods(second)
        running = [p for p in mine if p["status"].get("phase") == "Running"]
        if any(_gated(p) for p in mine):
            partial = max(partial, len(running))  # a pod of the job running while another waits
        if ended is None and "RUNNING" not in kq.run(f"squeue -h -j {first} -o %T", check=False).stdout:
            ended = time.monotonic()  # the first job ended: its nodes are idle, their pods still up
        if freed is None and not _pods(first):
            freed = time.monotonic()  # the first job's pods gone: its quota is free
        if "RUNNING" in kq.run(f"squeue -h -j {second} -o %T", check=False).stdout or \
                kq.run(f"sacct -n -X -j {second} -o State", check=False).stdout.strip().startswith("COMPLETED"):
            started = time.monotonic()
            break
        time.sleep(0.3)
    assert started is not None, f"job {second} never ran"
    assert partial == 0, f"{partial} pods of job {second} ran while others were gated"
    assert freed is not None and ended is not None
    print(f"kueue: job {first} ended -> its pods gone {freed - ended:.2f} s -> job {second} RUNNING "
          f"{started - freed:.2f} s (quota freed -> RUNNING: goal p50 <= 2 s)")
    # the first job's idle nodes handed their quota on at the loop's next pass (10 s period), not at
    # SuspendTime: Slurm suspends an idle node no sooner, so without the handover its pods (and their
    # quota) stay at least that long
    assert freed - ended < SUSPEND_TIME, f"job {first}'s pods went {freed - ended:.1f} s after it ended"
    # admitted and running: the loop clears the comment at its next pass
    wait_for(f"job {second}'s Kueue comment cleared while it runs", lambda: _comment(kq, second) == "", 15,
             show=lambda _: f"comment: {_comment(kq, second)!r}")
    assert wait_job(kq, first, 60)["job_state"] == ["COMPLETED"]
    assert wait_job(kq, second, 60)["job_state"] == ["COMPLETED"]


def test_with_kueue_down_the_nodes_go_down_naming_kueue_and_the_job_completes_once_it_is_back(kq):
    with kueue_outage():
        job = submit(kq, "#!/bin/bash\n#SBATCH -p kq -N 1 -t 5\nhostname\n")
        reason = wait_for("a node DOWN with a reason naming Kueue", lambda: next(
            (line for line in kq.run("sinfo -h -R -o '%N|%E'", check=False).stdout.splitlines()
             if "Kueue does not answer" in line), None), 60,
            show=lambda _: kq.run("sinfo -h -R -o '%N|%E'; squeue", check=False).stdout)
        print(f"kueue down: {reason}")
        assert re.search(r"admission webhook \S+ failed", reason)
    # Kueue back: the job requeued by the failed resume runs on a node of the pool
    assert wait_job(kq, job, 240)["job_state"] == ["COMPLETED"]



PREEMPTED = r"""#!/bin/bash
#SBATCH -p kq -N 2 -t 5
# first run: wait to be preempted, and say whether SIGTERM came before the kill; a run after the
# requeue ends at once
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then echo "run ${SLURM_RESTART_COUNT}"; exit 0; fi
trap 'echo "SIGTERM at $(date +%s)" > ~/kq-term-$SLURM_JOB_ID; exit 143' TERM
sleep 300 & wait
"""


def test_a_job_kueue_preempts_is_requeued_after_sigterm_and_completes_later(kq, kueue_steady):
    """Another tenant's higher-priority workload needs the ClusterQueue's quota: Kueue preempts the
    job's pod group (condition TerminationTarget, then a delete). The worker's preStop hook requeues
    the job while slurmd still runs: the job gets SIGTERM, is requeued (not FAILED), the pool is not
    backed off, and the job completes once the quota is back."""
    job = submit(kq, PREEMPTED)
    wait_for(f"job {job} running", lambda: "RUNNING" in kq.run(f"squeue -h -j {job} -o %T").stdout, 120)
    urgent = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "urgent", "namespace": NS,
                           "labels": {names.QUEUE_LABEL: QUEUE, names.PRIORITY_LABEL: HIGH_NAME}},
              "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                       "containers": [{"name": "main", "image": "slurmk8s/slurmd:dev", "imagePullPolicy": "Never",
                                       "command": ["sleep", "600"],
                                       "resources": {"requests": {"cpu": "100m", "memory": "16Mi"},
                                                     "limits": {"memory": "16Mi"}}}]}}
    t0 = time.monotonic()
    apply(urgent)
    try:
        requeued = wait_for(f"job {job} requeued", lambda: (
            s if (s := kq.run(f"squeue -h -j {job} -o %T", check=False).stdout.strip()) in
            ("PENDING", "REQUEUED", "REQUEUE_HOLD") else None), 60,
            show=lambda _: kq.run(f"scontrol show job {job}; sinfo -R", check=False).stdout)
        print(f"kueue preemption -> job {job} {requeued} after {time.monotonic() - t0:.1f} s")
        term = kq.run(f"cat ~/kq-term-{job}", check=False).stdout
        assert term.startswith("SIGTERM at"), f"the job got no SIGTERM before its pod went: {term!r}"
        wait_for("the urgent pod running", lambda: kjson("get", "pod", "urgent", "-n", NS)["status"].get("phase")
                 == "Running", 60)
    finally:
        kubectl("delete", "pod", "urgent", "-n", NS, "--ignore-not-found", "--wait=true", timeout=90)
    done = wait_job(kq, job, 240)
    assert done["job_state"] == ["COMPLETED"] and done["restart_cnt"] >= 1, done
    reasons = kq.run("sinfo -h -R -o '%E'", check=False).stdout
    assert "backoff" not in reasons, reasons
