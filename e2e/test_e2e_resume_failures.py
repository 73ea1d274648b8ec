"""Resumes that cannot be satisfied, injected for real on the session cluster (issue #8 part 2):

- no Kubernetes node fits the pod (pool `huge`: 64 CPUs requested on a 2-core node -> Unschedulable);
- the image is not there (pool `noimage`, pull policy Never -> ErrImageNeverPull);
- the API refuses the create (403: the slurmctld ServiceAccount's Role loses the `create` verb).

What must hold: the node is marked DOWN with a reason that names the cause (and the pod, where one
was made) by ResumeTimeout at the latest; no pod is left behind; the job is requeued, not lost; the
node returns to powered-down idle so a later job can try again, and the requeued job completes once
the cause is gone; a pool that keeps failing is backed off (its resumes refused without an API call).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from faultkit import (controller_log, new_down_reason, nodes, pool_pods, queue, since, slurm_down_reasons,
                      slurmctld_log, submit_many, unresolved_names, wait_pool_at_rest)
from helpers import NAMESPACE, Cluster, kjson, kubectl, wait_for

pytestmark = pytest.mark.e2e

ROLE = "slurmk8s-worker-pods"  # provisioner.manifests.WORKER_ROLE
RESUME_TIMEOUT = 120  # e2e_spec()'s elasticity.resume_timeout


def _requeued(login, jobs: list[str]) -> dict | None:
    q = queue(login, jobs)
    ok = len(q) == len(jobs) and all(j["restart_cnt"] >= 1 and "PENDING" in j["job_state"] for j in q.values())
    return q if ok else None


def _set_create_allowed(allowed: bool) -> None:
    role = kjson("get", "role", "-n", NAMESPACE, ROLE)
    verbs = [v for v in role["rules"][0]["verbs"] if v != "create"] + (["create"] if allowed else [])
    patch = [{"op": "replace", "path": "/rules/0/verbs", "value": verbs}]
    kubectl("patch", "role", "-n", NAMESPACE, ROLE, "--type", "json", "-p", json.dumps(patch))


def test_unsatisfiable_resumes_end_down_with_reason_no_pod_left_job_requeued(cluster: Cluster):
    login = cluster.login()
    for pool in ("huge", "noimage", "ctl"):
        wait_pool_at_rest(login, pool)
    t0 = time.time()
    start = time.monotonic()
    ctl_nodes = sorted(nodes(login, "ctl"))
    log = slurmctld_log()
    downs_before = {k: len(slurm_down_reasons(k, log)) for k in ctl_nodes + ["noimage-0", "noimage-1", "noimage-2"]}
    unresolved_before = len(unresolved_names(log))
    huge = submit_many(login, 1, "-p huge -N1 -o /dev/null --wrap hostname")
    noimage = submit_many(login, 3, "-p noimage -N1 -o /dev/null --wrap hostname")

    # the faults are real: the pods exist and Kubernetes says why they cannot start
    def pods_stuck():
        pods = {**pool_pods("huge"), **pool_pods("noimage")}
        if set(pods) != {"huge-0", "noimage-0", "noimage-1", "noimage-2"}:
            return None
        text = json.dumps({k: p.get("status") for k, p in pods.items()})
        return pods if "Unschedulable" in text and text.count("ErrImageNeverPull") >= 3 else None

    wait_for("pods of huge and noimage pending for their faults", pods_stuck, 60, interval=1)

    # 403 from the API server: the Role loses `create` while a job needs a new node
    _set_create_allowed(False)
    try:
        refused = submit_many(login, 1, "-p ctl -N1 -o ~/rbac-%j.out --wrap hostname")

        # durable evidence (slurmctld's log, the job's restart count), not the node's DOWN state,
        # which lasts about a second (see faultkit.slurm_down_reasons)
        def down_forbidden():
            job = queue(login, refused)[refused[0]]
            log = slurmctld_log()
            hit = {k: r for k in ctl_nodes
                   if (r := new_down_reason(k, "RBAC: not allowed to create pods", downs_before[k], log))}
            return (hit, job) if hit and job["restart_cnt"] >= 1 else None

        hit, job = wait_for("a ctl node set DOWN with the 403 as its reason, its job requeued", down_forbidden, 60)
    finally:
        _set_create_allowed(True)
    rbac_node = next(iter(hit))
    print(f"403: {rbac_node} set DOWN, reason {hit[rbac_node]!r}; job {refused[0]} "
          f"{job['job_state']} restart_cnt {job['restart_cnt']}")
    assert rbac_node not in pool_pods("ctl", include_terminating=True), "a pod was made despite the 403"

    # missing image: the reconcile loop removes the pod after 60 s Pending, sets the node DOWN naming
    # the pod and the cause, and Slurm requeues the job (well before ResumeTimeout)
    def noimage_down():
        log = slurmctld_log()
        reasons = {k: new_down_reason(k, f"pod {k}", downs_before[k], log) for k in ("noimage-0", "noimage-1", "noimage-2")}
        return reasons if all(r and "ErrImageNeverPull" in r for r in reasons.values()) else None

    n = wait_for("every noimage node set DOWN naming its pod and ErrImageNeverPull", noimage_down, 60 + 40, interval=1)
    print(f"missing image -> DOWN after {time.monotonic() - start:.0f} s: {n['noimage-0']!r}")
    wait_for("the noimage pods removed", lambda: not pool_pods("noimage", include_terminating=True), 40)
    wait_for("the noimage jobs requeued", lambda: _requeued(login, noimage), 30)

    # unschedulable: Slurm's ResumeTimeout fires, the resume-fail program removes the pod and returns
    # the node to service; the job is requeued
    wait_for("the huge job requeued at ResumeTimeout", lambda: _requeued(login, huge), RESUME_TIMEOUT + 40)
    wait_for("the huge pod removed", lambda: not pool_pods("huge", include_terminating=True), 40)
    print(f"unschedulable -> requeued, pod removed after {time.monotonic() - start:.0f} s")
    elastic = "\n".join(since(controller_log("elastic.log"), t0))
    assert re.search(r"resume-fail: Slurm gave up on \d+ nodes: [^\n]*\bhuge-0\b", elastic), elastic[-3000:]

    # the nodes return to powered-down idle: a later job can try again
    login.run(f"scancel {' '.join(huge + noimage)}")
    wait_pool_at_rest(login, "huge", 60)
    wait_pool_at_rest(login, "noimage", RESUME_TIMEOUT + 40)

    # three failures in a row: the pool is backed off; a new job's resume is refused at once,
    # with the reason on the node, and no pod is created
    probe = submit_many(login, 1, "-p noimage -N1 -o /dev/null --wrap hostname")

    def refused_for_backoff():
        # from slurmctld's log: the refused node is DOWN only until the resume program powers it
        # down (POWER_DOWN_FORCE, idle~ again after SuspendTimeout), too short a window to poll for
        assert not pool_pods("noimage", include_terminating=True), "a pod was created for a backed-off pool"
        log = slurmctld_log()
        hit = {k: r for k in ("noimage-0", "noimage-1", "noimage-2")
               if (r := new_down_reason(k, "slurmk8s backoff", downs_before[k], log))}
        return hit or None

    hit = wait_for("the noimage resume refused for backoff", refused_for_backoff, 30)
    print(f"backoff: {hit}")
    assert "3 consecutive resume failures" in next(iter(hit.values())), hit
    for _ in range(5):  # and it stays that way: no pod, no retry storm
        assert not pool_pods("noimage", include_terminating=True)
        time.sleep(1)
    login.run(f"scancel {probe[0]}")

    # the 403 is gone: the requeued job runs once its node is back (ResumeTimeout) and it is eligible again
    final = wait_for(f"job {refused[0]} to complete after the 403 was lifted",
                     lambda: (j := queue(login, refused)[refused[0]]) and "COMPLETED" in j["job_state"] and j,
                     RESUME_TIMEOUT + 180, interval=2)
    assert final["restart_cnt"] >= 1
    wait_pool_at_rest(login, "ctl")
    # leave the cluster as found: the node refused for backoff is powered down at once (idle~ after
    # SuspendTimeout); the noimage nodes whose pods the loop removed return at ResumeTimeout
    wait_pool_at_rest(login, "noimage", RESUME_TIMEOUT + 40)
    reconcile = since(controller_log("reconcile.log"), t0)
    assert any("noimage-0 stuck-pending" in l and "delete-worker ok" in l for l in reconcile), "\n".join(reconcile)
    # no node without a worker was messaged by its name (it stalled slurmctld for 10 s a name, once
    # failing this test): every node slurmk8s forces down gets an address that fails at once
    assert not unresolved_names(slurmctld_log())[unresolved_before:]
    print(f"unsatisfiable resumes: {time.monotonic() - start:.0f} s in all")
