"""Drift between Slurm and Kubernetes, made by hand on the session cluster (issue #8 parts 1 and 4):

- a worker pod created by hand with our labels, for no Slurm node (orphan);
- a worker pod for a node Slurm has powered down;
- a busy node's pod that vanishes at once (force-deleted, no grace) under a `--no-requeue` job;
- a busy node's slurmd container killed (the pod stays, the container restarts).

The reconcile loop must fix each within one period after its grace (20 s), and log what it did and
why; jobs are requeued, or fail where the user asked for --no-requeue; the pool returns to zero pods.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from faultkit import (controller_log, new_down_reason, nodes, pool_pods, queue, since, slurm_down_reasons,
                      slurmctld_log, submit_many, wait_final, wait_pool_at_rest)
from helpers import NAMESPACE, SUSPEND_TIME, Cluster, kubeconfig, kubectl, kubectl_exe, wait_for

pytestmark = pytest.mark.e2e

POOL = "ctl"
GRACE = 20  # reconcile.Policy.grace
PERIOD = 10  # manifests.RECONCILE_PERIOD
# slurmctld requeues a batch job missing from its node's registration by itself only when the job
# started more than BatchStartTimeout + MessageTimeout (10 + 10 s) before it (job_mgr.c
# _purge_missing_jobs); less the ~5 s the container takes to restart and register
SLURM_OWN_REQUEUE_AGE = 15


def _stray_pod(name: str, pool: str | None) -> dict:
    """A pod carrying our worker labels, made by hand: it only sleeps (it must not register with Slurm)."""
    labels = {"slurmk8s.io/cluster": "local", "app.kubernetes.io/component": "worker", "slurmk8s.io/node": name}
    if pool:
        labels["slurmk8s.io/pool"] = pool
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "sleep", "image": "slurmk8s/slurmd:dev", "imagePullPolicy": "Never",
                            "command": ["sleep", "600"],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        },
    }


def _apply(manifest: dict) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), "apply", "-f", "-"], input=json.dumps(manifest),
                          capture_output=True, text=True, timeout=60, check=False)


def _exists(name: str) -> bool:
    return kubectl("get", "pod", "-n", NAMESPACE, name, "-o", "name", check=False).returncode == 0


def _running_on(login, job: str, timeout: float = 120) -> str:
    def booted():
        j = queue(login, [job]).get(job)
        if not j or j["job_state"] != ["RUNNING"]:
            return None
        node = j["nodes"]
        n = nodes(login, POOL).get(node)
        pod = pool_pods(POOL).get(node)
        if not n or {"POWERING_UP", "POWERED_DOWN"} & set(n["state"]) or not pod:
            return None
        return node if pod["status"].get("phase") == "Running" else None

    return wait_for(f"job {job} running on a booted node", booted, timeout, interval=1)


def test_reconcile_fixes_orphan_and_stale_pods_and_a_vanished_busy_pod(cluster: Cluster):
    login = cluster.login()
    wait_pool_at_rest(login, POOL)
    t0 = time.time()
    # a busy node whose pod will vanish; the user asked for no requeue
    victim = submit_many(login, 1, f"-p {POOL} -N1 --no-requeue -o ~/norequeue-%j.out --wrap 'sleep 300'")[0]
    node = _running_on(login, victim)
    downs_before = len(slurm_down_reasons(node))
    stale = next(n for n in sorted(nodes(login, POOL)) if n != node)  # powered down: no job asks for it
    created = time.monotonic()
    for pod in (_stray_pod("stray-0", None), _stray_pod(stale, POOL)):
        proc = _apply(pod)
        assert proc.returncode == 0, proc.stderr
    gone = kubectl("delete", "pod", "-n", NAMESPACE, node, "--grace-period=0", "--force", "--wait=false", check=False)
    assert gone.returncode == 0, gone.stderr
    try:
        fixed = {}

        def all_fixed():
            for name in ("stray-0", stale):
                if name not in fixed and not _exists(name):
                    fixed[name] = time.monotonic() - created
            if node not in fixed and (reason := new_down_reason(node, f"pod {node} is gone", downs_before)):
                fixed[node] = time.monotonic() - created
                fixed["reason"] = reason
            return len(fixed) == 4

        # grace + one period, + a period of slack for a loaded machine
        try:
            wait_for("the loop to remove both stray pods and set the vanished pod's node DOWN", all_fixed,
                     GRACE + 2 * PERIOD + 15, interval=1)
        except BaseException:
            print(f"fixed so far: {fixed}; {node} DOWN reasons in slurmctld's log: {slurm_down_reasons(node)}\n"
                  f"reconcile.log since the submit:\n" + "\n".join(since(controller_log("reconcile.log"), t0)))
            raise
    finally:
        for name in ("stray-0", stale):
            kubectl("delete", "pod", "-n", NAMESPACE, name, "--ignore-not-found", "--wait=false", check=False)
    print(f"fixed after (s): { {k: round(v, 1) for k, v in fixed.items() if k != 'reason'} }; "
          f"{node}: {fixed['reason']!r}")
    # --no-requeue: the job fails (NODE_FAIL) instead of being requeued
    final = wait_final(login, [victim], 60)[victim]
    assert final["job_state"][0] == "NODE_FAIL" and final["restart_cnt"] == 0, final["job_state"]
    patterns = (r"stray-0 orphan-worker.*is for no node in the inventory -> delete-worker ok",
                rf"{stale} worker-for-powered-down-node \[{POOL}\].*powered down.*-> delete-worker ok",
                rf"{node} missing-worker \[{POOL}\]: pod {node} is gone.*-> set-down ok, power-down ok")

    def unlogged(text: str) -> list[str]:
        return [p for p in patterns if not re.search(p, text)]

    # the loop logs a finding once all its actions are done: the pods can be gone and the node DOWN
    # (the job failed) a moment before its line is written
    wait_for("the loop's log lines for the three fixes", lambda: "\n".join(since(controller_log("reconcile.log"), t0)),
             30, interval=1, until=lambda text: not unlogged(text),
             show=lambda text: f"reconcile.log since the submit:\n{text}\nno log line like {unlogged(text)}")
    wait_pool_at_rest(login, POOL)


def test_killed_worker_container_sets_its_node_down_and_requeues_the_job(cluster: Cluster):
    """slurmd's container is killed under a job and restarted in the same pod (restartPolicy Always):
    the job's processes are gone. When the restarted slurmd registers without the job, Slurm itself
    requeues it only if it started over 20 s before, and would otherwise keep a young job RUNNING
    with nothing running (until a later registration). The loop sees the container's
    death during the job, sets the node DOWN naming the pod (Slurm requeues the job) and powers it
    down, so the next resume gets a fresh pod."""
    login = cluster.login()
    wait_pool_at_rest(login, POOL)
    t0 = time.time()
    job = submit_many(login, 1, f"-p {POOL} -N1 -o ~/cntkill-%j.out --wrap 'sleep 300'")[0]
    try:
        node = _running_on(login, job)
        uid = pool_pods(POOL)[node]["metadata"]["uid"]
        started = queue(login, [job])[job]["start_time"]["number"]
        killed = kubectl("exec", "-n", NAMESPACE, node, "-c", "slurmd", "--", "sh", "-c",
                         "kill -9 $(cat /run/slurmd.pid)", check=False)
        assert killed.returncode == 0, killed.stderr
        t_kill, age_at_kill = time.monotonic(), time.time() - started

        finding = re.compile(rf"{node} worker-restarted \[{POOL}\]: pod {node} container died under job {job} "
                             rf"\(slurmd .*exit 137.*\) -> set-down ok, power-down ok")
        seen: dict[str, object] = {}

        def requeued():
            # durable evidence only: the job's restart count and the loop's log line, not the node's
            # DOWN state, which lasts about a second (see faultkit.slurm_down_reasons)
            seen["job"] = queue(login, [job]).get(job, {})
            seen["log"] = "\n".join(since(controller_log("reconcile.log"), t0))
            return (seen["job"].get("restart_cnt") or 0) >= 1

        def attributed():
            # the loop logs its finding once its actions are done (the DOWN that requeues the job,
            # then the power-down), so its line may follow the requeue by a moment. On a loaded
            # machine the job may be old enough at the kill for Slurm's own rule to win the race;
            # a younger job is requeued only by the loop
            seen["log"] = "\n".join(since(controller_log("reconcile.log"), t0))
            seen["slurm_own"] = f"Batch JobId={job} missing from batch node {node}" in slurmctld_log()
            return finding.search(str(seen["log"])) or (seen["slurm_own"] and age_at_kill > SLURM_OWN_REQUEUE_AGE)

        try:
            wait_for(f"job {job} requeued after its node's container died", requeued, 10 + 2 * PERIOD + 40, interval=1)
            t_requeued = time.monotonic()
            try:
                found = wait_for("the loop's worker-restarted line (or Slurm's own requeue of an old enough job)",
                                 attributed, PERIOD + 10, interval=1)
            except pytest.fail.Exception:
                found = None
            line = found if isinstance(found, re.Match) else None
            assert found, (f"job {job} ({age_at_kill:.1f} s old at the kill) was requeued, but not by the loop "
                           f"(Slurm's own requeue logged: {seen.get('slurm_own')})")
        except BaseException:
            n, j = nodes(login, POOL).get(node, {}), seen.get("job") or {}
            print(f"job {job} was {age_at_kill:.1f} s old at the kill; node {node}: state {n.get('state')} "
                  f"reason {n.get('reason')!r}; job: {j.get('job_state')} restart_cnt {j.get('restart_cnt')}\n"
                  f"reconcile.log since the submit:\n{seen.get('log')}")
            raise
        how = repr(line.group(0)) if line else f"by Slurm itself: the job was {age_at_kill:.1f} s old at the kill"
        print(f"container killed -> job requeued within {t_requeued - t_kill:.1f} s, {how}")
        # the pod with the dead job is removed (powered down by the loop, or idle-suspended), not reused
        wait_for(f"pod {node} removed", lambda: pool_pods(POOL, include_terminating=True).get(node, {})
                 .get("metadata", {}).get("uid") != uid, 60 if line else SUSPEND_TIME + 60, interval=1)
    finally:
        login.run(f"scancel {job}", check=False)
    wait_pool_at_rest(login, POOL)
