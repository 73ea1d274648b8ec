"""Observability on the real cluster (after test_e2e_faults.py, same cluster): the host's own
Prometheus scrapes the reconcile loop and sees the numbers move when a job runs; a health check
made to fail on purpose drains its worker with the reason, `slurmk8s status` and the metrics show
it, and the next resume of that node gets a fresh pod that passes; every query of the Grafana
dashboard runs on that Prometheus.

Prometheus is Debian's `prometheus` package (.ci/run installs it); this file installs nothing. It
scrapes the slurmctld pod's IP (pod IPs are routable from the host of the local cluster) every
2 s into a throw-away TSDB.

The fault: a job leaves 400 MiB in /dev/shm (a leaked shared-memory segment, the classic cause of
nodes that run out of memory for the next job). It counts against the pod's memory limit, so the
`memory` check, run by slurmd every health.interval (15 s in the e2e spec), drains the node with
`health: memory: ...`. The fresh pod of the next resume has an empty /dev/shm.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers import (
    NAMESPACE,
    ROOT,
    SLURMK8S,
    Cluster,
    job_state,
    kjson,
    kubeconfig,
    submit,
    wait_for,
    wait_job,
    worker_pods,
)

from provisioner.reconcile.metrics import dashboard_queries

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "charts" / "dashboards" / "slurmk8s.json"
SCRAPE_INTERVAL = "2s"
# what a job must move: resume requests, jobs seen started, node-seconds, controller RPCs
COUNTERS = {
    "resumes": 'sum(slurmk8s_elastic_requests_total{program="resume"})',
    "started": "sum(slurmk8s_job_submit_to_running_seconds_count)",
    "busy": "sum(slurmk8s_node_busy_seconds_total)",
    "provisioned": "sum(slurmk8s_node_provisioned_seconds_total)",
    "rpcs": "sum(slurmk8s_controller_rpc_seconds_count)",
}


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def value(self, expr: str) -> float | None:
        """The sum of an instant query's samples (None when it has none)."""
        result = self.query(expr)
        return sum(float(r["value"][1]) for r in result) if result else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("no `prometheus` binary on PATH: install Debian's package (`apt-get install prometheus`; "
                    ".ci/run does)")
    ip = kjson("get", "pod", "-n", NAMESPACE, "slurmctld-0")["status"]["podIP"]
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [{"job_name": "slurmk8s", "scrape_interval": SCRAPE_INTERVAL,
                            "scrape_timeout": SCRAPE_INTERVAL,
                            "static_configs": [{"targets": [f"{ip}:9410"],
                                                "labels": {"namespace": NAMESPACE, "pod": "slurmctld-0"}}]}]}))
    port = _free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}")

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited {proc.returncode}:\n{(work / 'prometheus.log').read_text()[-3000:]}")
        try:
            return prom.value('up{job="slurmk8s"}') == 1
        except OSError:
            return False

    try:
        wait_for(f"Prometheus ({exe}) to scrape {ip}:9410", ready, 60, interval=0.5)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def status_json() -> dict[str, Any]:
    """`slurmk8s status --json`, as a script would run it (the user's kubeconfig)."""
    env = dict(os.environ, KUBECONFIG=kubeconfig())
    proc = subprocess.run([SLURMK8S, "status", "--namespace", NAMESPACE, "--json"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert proc.returncode == 0, f"slurmk8s status exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_prometheus_sees_the_numbers_move_when_a_job_runs(cluster: Cluster, prometheus: Prometheus):
    prom = prometheus
    # the e2e pool's nodes, whatever their state (the fault tests' pools have their own)
    assert prom.value('sum(slurmk8s_nodes{pool="cpu"})') == 3
    login = cluster.login()
    wait_for("every worker pod to be gone", lambda: worker_pods() == {}, 120, interval=2)
    wait_for("Prometheus to see zero worker pods",
             lambda: not prom.value('sum(slurmk8s_workers{phase!="Terminating"}) > 0'), 30, interval=1)
    before = {k: prom.value(q) or 0.0 for k, q in COUNTERS.items()}
    job = submit(login, "#!/bin/bash\n#SBATCH -N1 -o /dev/null\nsleep 25")
    wait_for("the job to run", lambda: "RUNNING" in job_state(login, job)["job_state"], 120)
    seen = wait_for("Prometheus to see one running job and a Running worker pod", lambda: (
        prom.value('sum(slurmk8s_jobs{state="running"})') == 1
        and prom.value('sum(slurmk8s_workers{phase="Running"})') == 1
        and prom.value('sum(slurmk8s_nodes{state="allocated"})') == 1) or None, 40, interval=1)
    assert seen

    # the same cluster through `slurmk8s status --json`, while the job runs
    doc = status_json()
    assert doc["state"] == "awake" and doc["errors"] == [], doc
    assert doc["queue"] == {"cpu": {"pending": 0, "running": 1}}, doc["queue"]
    assert doc["nodes"]["counts"].get("allocated") == 1, doc["nodes"]
    assert [w["phase"] for w in doc["workers"]] == ["Running"], doc["workers"]
    assert {v["name"] for v in doc["volumes"]} >= {"home", "slurmctld-state"}, doc["volumes"]
    assert all(v["phase"] == "Bound" for v in doc["volumes"]), doc["volumes"]
    assert doc["usage"]["since"] and doc["usage"]["provisioned_node_seconds"] > 0, doc["usage"]
    print(f"status while the job runs: {json.dumps({k: doc[k] for k in ('state', 'queue', 'usage')})}")

    assert wait_job(login, job, 120)["job_state"] == ["COMPLETED"]

    last: dict[str, float] = {}

    def moved() -> dict[str, float] | None:
        last.update({k: prom.value(q) or 0.0 for k, q in COUNTERS.items()})
        return dict(last) if all(last[k] > before[k] for k in before) else None

    try:
        after = wait_for("every counter to move in Prometheus", moved, 40, interval=1)
    except pytest.fail.Exception:
        everything = prom.query('{__name__=~"slurmk8s_.*|up|scrape_.*"}')
        samples = "\n".join(f"{r['metric']} {r['value'][1]}" for r in everything
                            if not r["metric"]["__name__"].endswith("_bucket"))
        pytest.fail(f"counters did not all move: before {before}, last {last}; Prometheus has:\n{samples}")
    assert after["busy"] - before["busy"] >= 10, (before, after)  # a 25 s job, sampled every 10 s
    assert after["provisioned"] - before["provisioned"] >= after["busy"] - before["busy"]
    p50 = prom.value("histogram_quantile(0.5, sum by (le) (slurmk8s_job_submit_to_running_seconds_bucket))")
    print(f"Prometheus: before {before} after {after}; submit-to-RUNNING p50 (buckets) {p50}")
    wait_for("Prometheus to see no running job", lambda: prom.value('sum(slurmk8s_jobs{state="running"})') == 0,
             30, interval=1)


def test_failing_health_check_drains_the_node_and_the_next_resume_gets_a_fresh_pod(cluster: Cluster,
                                                                                   prometheus: Prometheus):
    login = cluster.login()
    # the job leaks 400 MiB of /dev/shm and stays (holding 100 MiB of the node's 1 GiB for itself)
    job = submit(login, "#!/bin/bash\n#SBATCH -N1 --mem=100M -o leak-%j.out\n"
                        "dd if=/dev/zero of=/dev/shm/leaked bs=1M count=400 status=none && echo leaked\nsleep 600")
    running = wait_for("the leaking job to run", lambda: (s := job_state(login, job)) and
                       "RUNNING" in s["job_state"] and s, 120)
    node = running["nodes"]
    old_uid = wait_for(f"the worker pod of {node}", lambda: worker_pods().get(node, {}).get("metadata", {}).get("uid"),
                       30)

    def drained() -> dict[str, Any] | None:
        [n] = login.json(f"scontrol show node {node} --json")["nodes"]
        return n if "DRAIN" in n["state"] and (n.get("reason") or "").startswith("health: memory:") else None

    t0 = time.monotonic()
    seen = wait_for(f"{node} drained by its periodic health check", drained, 90, interval=1)
    print(f"{node} drained after {time.monotonic() - t0:.0f} s: {seen['state']} reason {seen['reason']!r}")
    assert "allocated to jobs vs RealMemory" in seen["reason"], seen["reason"]
    assert "RUNNING" in job_state(login, job)["job_state"], "a drain must not kill the running job"

    # `slurmk8s status` shows it with its reason, and so does the metric
    doc = status_json()
    [row] = [n for n in doc["nodes"]["list"] if n["name"] == node]
    assert row["category"] in ("draining", "drained") and row["health_check"] == "memory", row
    assert {"name": node, "check": "memory", "reason": seen["reason"]} in doc["health_drained"], doc["health_drained"]
    wait_for("Prometheus to see the health drain", lambda: prometheus.value(
        'sum(slurmk8s_health_drained_nodes{check="memory"})') == 1, 30, interval=1)
    screen = subprocess.run([SLURMK8S, "status", "--namespace", NAMESPACE], capture_output=True, text=True,
                            env=dict(os.environ, KUBECONFIG=kubeconfig(), COLUMNS="200"), timeout=60, check=False)
    assert screen.returncode == 0 and "[health memory] health: memory:" in screen.stdout, screen.stdout + screen.stderr
    print(screen.stdout)

    # done with the job: the drained node is idle, suspended after SuspendTime, its pod deleted
    login.run(f"scancel {job}")
    wait_for(f"the pod of drained {node} deleted", lambda: node not in worker_pods(), 120, interval=1)
    wait_for(f"{node} powered down", lambda: login.run(f"sinfo -h -N -n {node} -o %T").stdout.strip().endswith("~"),
             60, interval=1)

    # the next resume of that node: a fresh pod (empty /dev/shm) passes its check before registering
    again = submit(login, f"#!/bin/bash\n#SBATCH -N1 -w {node} -o fresh-%j.out\ndf -m --output=used /dev/shm | tail -1")
    final = wait_job(login, again, 180)
    assert final["job_state"] == ["COMPLETED"], final
    new_uid = worker_pods().get(node, {}).get("metadata", {}).get("uid")
    assert new_uid and new_uid != old_uid, "the node must come back in a new pod"
    assert login.run(f"cat ~/fresh-{again}.out").stdout.strip() == "0", "the fresh pod's /dev/shm must be empty"
    [n] = login.json(f"scontrol show node {node} --json")["nodes"]
    assert "DRAIN" not in n["state"], n["state"]


def test_every_dashboard_query_runs_on_prometheus(cluster: Cluster, prometheus: Prometheus):
    # a job pending while Prometheus scrapes, so the pending-jobs panel has data whatever ran before
    # this test (run after the cluster tests alone, no job happened to be pending at a scrape)
    login = cluster.login()
    held = submit(login, "#!/bin/bash\n#SBATCH -N1 -H -o held-%j.out\nhostname")
    try:
        wait_for("Prometheus to see a pending job", lambda: prometheus.query('sum(slurmk8s_jobs{state="pending"})'),
                 90, interval=2)
    finally:
        login.run(f"scancel {held}", check=False)
    exprs = dashboard_queries(json.loads(DASHBOARD.read_text()))
    names = set(prometheus.api("label/__name__/values"))
    empty = []
    for expr in exprs:
        result = prometheus.query(expr)  # a syntax error or an unknown function fails here
        if not result:
            empty.append(expr)
    # what may be empty after this session: failures that did not happen (no errors, no backoff)
    allowed_empty = ("outcome!=", "rpc_errors", "pool_backoff", "reconcile_findings", "reconcile_actions")
    unexpected = [e for e in empty if not any(a in e for a in allowed_empty)]
    assert not unexpected, f"dashboard queries with no data after a job ran: {unexpected}\n" \
                           f"(Prometheus has {sorted(n for n in names if n.startswith('slurmk8s_'))})"
    print(f"{len(exprs)} dashboard queries ran; empty (allowed): {empty}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([str(Path(__file__))]))
