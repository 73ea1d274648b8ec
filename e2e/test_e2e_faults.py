"""Faults on the real cluster (runs after test_e2e_cluster.py, on the same cluster): a busy worker pod
deleted under its job, and the reconcile loop's metrics endpoint as Prometheus would scrape it."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from helpers import NAMESPACE, Cluster, job_state, kjson, kubectl, submit, wait_for, wait_job, worker_pods

pytestmark = pytest.mark.e2e


def test_deleted_busy_worker_pod_requeues_its_job_which_then_completes(cluster: Cluster):
    login = cluster.login()
    job = submit(login, "#!/bin/bash\n#SBATCH -N1 -o victim-%j.out\necho start $SLURM_RESTART_COUNT; sleep 25; "
                        "echo done")
    running = wait_for("job running", lambda: (s := job_state(login, job)) and "RUNNING" in s["job_state"] and s, 120)
    node = running["nodes"]
    wait_for(f"the worker pod of {node}", lambda: node in worker_pods(), 30)

    def booted():  # no '#' (powering up): slurmd registered, the job's step runs on the pod
        state = login.run(f"sinfo -h -N -n {node} -o %T").stdout.strip()
        return state if state and not state.endswith(("#", "~", "%")) else None

    wait_for(f"node {node} to finish booting", booted, 60)
    deleted = kubectl("delete", "pod", "-n", NAMESPACE, node, "--wait=false", check=False)
    assert deleted.returncode == 0, f"deleting pod {node}: {deleted.stderr} (pods: {sorted(worker_pods())})"

    # the pod's preStop hook (images/slurmd/worker-stop) requeues the job while slurmd still runs, so
    # it gets SIGTERM and is queued again at once; the node is then idle and suspended as any other
    # (before the hook, the loop set it DOWN once the pod was gone: `pod X is gone`)
    t0 = time.monotonic()
    requeued = wait_for("the job requeued", lambda: (s := job_state(login, job))["restart_cnt"] >= 1 and s, 60)
    print(f"job {job} requeued {time.monotonic() - t0:.1f} s after its pod {node} was deleted")
    assert "COMPLETED" not in requeued["job_state"]
    final = wait_job(login, job, 300)
    assert final["job_state"] == ["COMPLETED"], final["job_state"]
    out = login.run(f"cat ~/victim-{job}.out").stdout
    assert out.splitlines()[-1] == "done" and "start 1" in out, out


def test_metrics_endpoint_reports_the_cluster(cluster: Cluster):
    pod = kjson("get", "pod", "-n", NAMESPACE, "slurmctld-0")
    url = f"http://{pod['status']['podIP']}:9410/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()

    families = {"slurmk8s_nodes", "slurmk8s_jobs", "slurmk8s_reconcile_passes_total",
                "slurmk8s_controller_rpc_seconds_count"}

    def names(text: str) -> set[str]:
        return set(re.findall(r"^(slurmk8s_[a-z_]+)", text, re.M))

    def cpu_nodes(text: str) -> float:
        # every Slurm node of the e2e pool `cpu`, whatever its state (the fault tests' pools have their own)
        return sum(float(v) for v in re.findall(r'^slurmk8s_nodes{[^}]*pool="cpu"[^}]*} ([0-9.e+]+)$', text, re.M))

    # the endpoint answers before the loop's first pass has filled it in (a new slurmctld pod): wait
    # for a scrape that shows a pass, not for the endpoint
    text = wait_for("the loop's families and the 3 nodes of pool cpu in the metrics", lambda: _try(scrape) or "", 60,
                    until=lambda t: families <= names(t) and cpu_nodes(t) == 3,
                    show=lambda t: f"families {sorted(names(t))}, pool cpu nodes {cpu_nodes(t)}" if t
                    else "endpoint not answering")
    before = _counter(text, "slurmk8s_elastic_requests_total")
    login = cluster.login()
    wait_for("every worker pod to be gone", lambda: worker_pods() == {}, 120, interval=2)
    job = submit(login, "#!/bin/bash\n#SBATCH -N1 -o /dev/null\ntrue")
    assert wait_job(login, job, 120)["job_state"] == ["COMPLETED"]

    def moved():  # the loop tails the programs' events file once per period (10 s)
        text = scrape()
        ok = (_counter(text, "slurmk8s_elastic_requests_total") > before
              and _counter(text, "slurmk8s_job_submit_to_running_seconds_count") >= 1)
        return text if ok else None

    try:
        wait_for("resume requests and submit-to-RUNNING to show in the metrics", moved, 60, interval=2)
    except pytest.fail.Exception:
        pytest.fail(f"metrics did not move (before: {before} resume requests); last scrape:\n"
                    + "\n".join(l for l in scrape().splitlines() if l.startswith("slurmk8s_")))
    assert _counter(text, "slurmk8s_node_busy_seconds_total") > 0


def _try(fn):
    try:
        return fn()
    except OSError:
        return None


def _counter(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))
