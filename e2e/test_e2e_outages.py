"""Outages of the control tier while jobs run, on the real cluster (issue #8 part 3, issue #7 part 3):
slurmctld killed and its pod deleted with 50 jobs pending and 4 running; the Kubernetes API server and
the kubelet stopped and started while jobs run. What must hold: no job lost, running jobs finish
without a requeue, no worker pod orphaned or duplicated, and the pool settles back to zero pods.

Runs on the session cluster, on the pool `ctl` (4 one-CPU slots) that only these tests use."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from faultkit import (CONTROLLER_POD, accounting, controller_log, controller_pod, controller_ready, nodes,
                      pool_pods, queue, sacct_states, since, slurm_answers, states, submit_many, wait_final,
                      wait_pool_at_rest)
from helpers import LOCAL_KUBECONFIG, NAMESPACE, SLURMK8S, TOOLCHAIN_BIN, Cluster, kubeconfig, kubectl, wait_for

pytestmark = pytest.mark.e2e

POOL = "ctl"
RUNNING = 4
PENDING = 50


def _hold_jobs(login, tag: str, count: int) -> list[str]:
    """`count` jobs that run until ~/release-<tag> exists (at most 10 min), each on its own node."""
    login.run(f"rm -f ~/release-{tag}")
    wrap = (f"echo start ${{SLURM_RESTART_COUNT:-0}}; for i in $(seq 600); do [ -e ~/release-{tag} ] && break; sleep 1; done; "
            f"echo done")
    return submit_many(login, count, f"-p {POOL} -N1 -o ~/{tag}-%j.out --wrap '{wrap}'")


def _wait_running_and_booted(login, jobs: list[str], timeout: float = 180) -> dict[str, str]:
    """job -> node, once every job RUNNING on a booted node with its worker pod Running."""

    def ready():
        q = queue(login, jobs)
        if len(q) != len(jobs) or any(j["job_state"] != ["RUNNING"] for j in q.values()):
            return None
        placed = {k: j["nodes"] for k, j in q.items()}
        ns = nodes(login, POOL)
        pods = pool_pods(POOL)
        for node in placed.values():
            if node not in ns or {"POWERING_UP", "POWERED_DOWN"} & set(ns[node]["state"]):
                return None
            if pods.get(node, {}).get("status", {}).get("phase") != "Running":
                return None
        return placed

    return wait_for(f"{len(jobs)} jobs running on booted nodes of {POOL}", ready, timeout, interval=2)


def _pod_uids() -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in pool_pods(POOL, include_terminating=True).items()}


def _assert_no_orphan_or_duplicate(login, placed: dict[str, str], uids: dict[str, str], when: str) -> None:
    now = _pod_uids()
    for job, node in placed.items():
        assert now.get(node) == uids[node], (f"{when}: the pod of {node} (job {job}) was replaced or removed: "
                                             f"before {uids[node]}, now {now.get(node)}")
    ns = nodes(login, POOL)
    for name in now:
        assert name in ns, f"{when}: pod {name} is for no Slurm node of {POOL}"
        assert "POWERED_DOWN" not in ns[name]["state"] or "POWERING_UP" in ns[name]["state"], (
            f"{when}: pod {name} exists while Slurm has the node {ns[name]['state']}")


def _uid_now() -> str:
    proc = kubectl("get", "pod", "-n", NAMESPACE, CONTROLLER_POD, "-o", "jsonpath={.metadata.uid}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _release(login, tag: str) -> None:
    login.run(f"touch ~/release-{tag}")


def _state_saved_since(login, job: str) -> float | None:
    """mtime of slurmctld's job_state file once it is later than `job`'s submission (by slurmctld's clock)."""
    submitted = queue(login, [job])[job]["submit_time"]["number"]
    proc = kubectl("exec", "-n", NAMESPACE, CONTROLLER_POD, "-c", "slurmctld", "--", "stat", "-c", "%.3Y",
                   "/var/spool/slurmctld/job_state", check=False)
    if proc.returncode != 0:
        return None
    mtime = float(proc.stdout.strip())
    return mtime if mtime >= submitted + 1 else None  # whole seconds: a save in the same second may predate it


def test_slurmctld_killed_and_its_pod_deleted_with_50_pending_and_4_running(cluster: Cluster):
    login = cluster.login()
    wait_pool_at_rest(login, POOL)
    t0 = time.time()
    running = _hold_jobs(login, "ctlkill", RUNNING)
    pending: list[str] = []
    try:
        _controller_outages(login, running, pending, t0)
    finally:  # leave the pool to the next test whatever happened
        _release(login, "ctlkill")
        login.run(f"scancel {' '.join(running + pending)}", check=False)


def _controller_outages(login, running: list[str], pending: list[str], t0: float) -> None:
    placed = _wait_running_and_booted(login, running)
    assert len(set(placed.values())) == RUNNING, placed
    pending += submit_many(login, PENDING, f"-p {POOL} -N1 -o /dev/null --wrap 'echo ok'")
    t_sub = time.monotonic()
    before = states(login, running + pending)
    assert [before[j] for j in running] == ["RUNNING"] * RUNNING, before
    assert all(before[j] == "PENDING" for j in pending), before
    uids = _pod_uids()
    assert sorted(uids) == sorted(placed.values()), f"pods {sorted(uids)} for running nodes {placed}"

    def still_there(when: str) -> None:
        now = states(login, running + pending)
        lost = sorted(set(running + pending) - set(now), key=int)
        assert not lost, f"{when}: jobs lost: {lost}"
        assert [now[j] for j in running] == ["RUNNING"] * RUNNING, f"{when}: running jobs now {now}"
        assert all(now[j] == "PENDING" for j in pending), f"{when}: pending jobs now {now}"
        _assert_no_orphan_or_duplicate(login, placed, uids, when)

    # 1. slurmctld dies (SIGKILL: nothing saved on the way out) once it has saved the queue: Slurm
    # writes its state in batches (within seconds), so a job accepted just before a hard crash can
    # be lost; one that was saved must not be. The container restarts in its pod.
    wait_for("slurmctld to save the queue", lambda: _state_saved_since(login, pending[-1]), 60, interval=0.5)
    print(f"job state saved {time.monotonic() - t_sub:.1f} s after the last sbatch returned")
    pod = controller_pod()
    restarts = {c["name"]: c.get("restartCount", 0) for c in pod["status"]["containerStatuses"]}["slurmctld"]
    killed = kubectl("exec", "-n", NAMESPACE, CONTROLLER_POD, "-c", "slurmctld", "--", "sh", "-c",
                     "kill -9 $(cat /run/slurmctld.pid)", check=False)
    assert killed.returncode == 0, killed.stderr
    t_kill = time.monotonic()
    wait_for("the slurmctld container to restart and be Ready", lambda: controller_ready(restarts_above=restarts), 120,
             interval=1)
    wait_for("slurmctld to answer again", lambda: slurm_answers(login), 60, interval=1)
    print(f"slurmctld SIGKILL -> answering again: {time.monotonic() - t_kill:.1f} s")
    still_there("after slurmctld was killed")

    # 2. jobs submitted a moment ago, then the pod is deleted (as an eviction, a node drain or a
    # rollout does): SIGTERM lets slurmctld save everything; a new pod mounts the same state volume
    pending += submit_many(login, 10, f"-p {POOL} -N1 -o /dev/null --wrap 'echo ok'")
    old_uid = controller_pod()["metadata"]["uid"]
    deleted = kubectl("delete", "pod", "-n", NAMESPACE, CONTROLLER_POD, "--wait=false", check=False)
    assert deleted.returncode == 0, deleted.stderr
    t_del = time.monotonic()
    wait_for("the old slurmctld pod to be gone", lambda: _uid_now() not in (old_uid, ""), 120, interval=0.5)
    t_gone = time.monotonic() - t_del
    wait_for("a new slurmctld pod, Ready", lambda: controller_ready(previous_uid=old_uid), 180, interval=1)
    print(f"slurmctld pod deleted -> old pod gone (its containers stopped) after {t_gone:.1f} s")
    wait_for("slurmctld to answer again", lambda: slurm_answers(login), 60, interval=1)
    print(f"slurmctld pod deleted -> new pod answering: {time.monotonic() - t_del:.1f} s")
    still_there("after the slurmctld pod was deleted")

    # 3. the running jobs finish where they ran, without a requeue; then the pending ones run and finish
    _release(login, "ctlkill")
    final = wait_final(login, running + pending, 600)
    bad = {k: j["job_state"] for k, j in final.items() if "COMPLETED" not in j["job_state"]}
    assert not bad, f"jobs not COMPLETED: {bad}"
    requeued = {k: j["restart_cnt"] for k, j in final.items() if k in running and j["restart_cnt"]}
    assert not requeued, f"running jobs were requeued by the outage: {requeued}"
    for job in running:
        out = login.run(f"cat ~/ctlkill-{job}.out").stdout.split("\n")
        assert out[0] == "start 0" and "done" in out, out
    if accounting(login):
        # slurmctld sends the job records to slurmdbd on its own time (and queued them while it was
        # away): sacct catches up with squeue a moment later
        ids = running + pending
        wait_for(f"sacct to show the {len(ids)} jobs COMPLETED", lambda: sacct_states(login, ids), 60, interval=2,
                 until=lambda acct: {acct.get(j) for j in ids} == {"COMPLETED"},
                 show=lambda acct: {j: acct.get(j) for j in ids if acct.get(j) != "COMPLETED"})
    else:
        print("no slurmdbd in this cluster: accounting not asserted (squeue/scontrol only)")
    # 4. the loop converges: zero pods, every node idle~, nothing judged orphaned or missing meanwhile
    wait_pool_at_rest(login, POOL)
    wrong = [l for l in since(controller_log("reconcile.log"), t0)
             if POOL + "-" in l and ("missing-worker" in l or "orphan-worker" in l or "worker-for-powered-down" in l)]
    assert not wrong, "the reconcile loop misjudged the pool after the restart:\n" + "\n".join(wrong)


def _cluster_restart(component: str, down_for: int) -> float:
    env = dict(os.environ, KUBECONFIG=kubeconfig(), PATH=f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}")
    t = time.monotonic()
    proc = subprocess.run([SLURMK8S, "cluster", "restart", component, "--down-for", str(down_for)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"slurmk8s cluster restart {component}: {proc.stdout}\n{proc.stderr}"
    return time.monotonic() - t


@pytest.mark.e2e_alone  # every other e2e test would see the API server and the kubelet gone
def test_apiserver_and_kubelet_restarted_while_jobs_run(cluster: Cluster):
    if kubeconfig() != LOCAL_KUBECONFIG:
        pytest.skip("stops the local cluster's daemons (slurmk8s cluster restart); KUBECONFIG is another cluster")
    login = cluster.login()
    wait_pool_at_rest(login, POOL)
    t0 = time.time()
    running = _hold_jobs(login, "apiout", 2)
    later: list[str] = []
    try:
        placed = _wait_running_and_booted(login, running)
        uids = _pod_uids()
        # the API server away for 25 s: the reconcile loop's passes fail and must not act on "no pods"
        took = _cluster_restart("kube-apiserver", 25)
        print(f"kube-apiserver down 25 s, ready again after {took:.1f} s")
        # the kubelet away for 25 s (shorter than the node-monitor grace period): pods keep running
        took = _cluster_restart("kubelet", 25)
        print(f"kubelet down 25 s, node Ready again after {took:.1f} s")
        time.sleep(12)  # one reconcile period after both are back
        now = states(login, running)
        assert [now.get(j) for j in running] == ["RUNNING"] * len(running), now
        _assert_no_orphan_or_duplicate(login, placed, uids, "after the API server and kubelet restarts")
        # after the outage, resumes work again: two more jobs get new pods on the two idle nodes
        later += submit_many(login, 2, f"-p {POOL} -N1 -o /dev/null --wrap 'echo ok'")
        _release(login, "apiout")
        final = wait_final(login, running + later, 300)
        bad = {k: (j["job_state"], j["restart_cnt"]) for k, j in final.items()
               if "COMPLETED" not in j["job_state"] or (k in running and j["restart_cnt"])}
        assert not bad, f"jobs not COMPLETED, or requeued by the outage: {bad}"
    finally:
        _release(login, "apiout")
        login.run(f"scancel {' '.join(running + later)}", check=False)
    wait_pool_at_rest(login, POOL)
    log = since(controller_log("reconcile.log"), t0)
    skipped = [l for l in log if "pass skipped" in l]
    wrong = [l for l in log if POOL + "-" in l and ("missing-worker" in l or "orphan-worker" in l)]
    assert not wrong, "the reconcile loop acted on a partial view during the outage:\n" + "\n".join(wrong)
    print(f"reconcile passes skipped during the outages: {len(skipped)}")
