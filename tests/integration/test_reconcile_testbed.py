"""The reconcile loop against real Slurm daemons (issue 8, fault 4 "orphans and drift").

Three faults are made at once, then ONE pass of `slurmk8s-reconcile --once` runs inside the
slurmctld container, as SlurmUser, with the working tree's provisioner mounted (so the image need
not be rebuilt; the image has no prometheus_client yet, hence --metrics-port 0):
  (a) an orphan worker container created by hand with our labels, for no node of the inventory;
  (b) a worker container for a node Slurm has powered down;
  (c) the worker of a node running a job, removed behind Slurm's back.
Each must be fixed by that one pass and logged with its reason; the job must be requeued and the
node must come back to powered-down idle.

Run with `pytest -m integration tests/integration/test_reconcile_testbed.py` (about a minute).
"""

from __future__ import annotations

import re
import time
from typing import Callable, Iterator

import pytest

from testbed import IMAGES, Testbed, docker, wait_for

from provisioner.elastic.docker_backend import LABEL_CLUSTER, LABEL_NODE, LABEL_ROLE
from provisioner.slurm.commands import NODE_ADDR_GONE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(testbed_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    b = Testbed(tmp_path_factory.mktemp("reconcile"), node_count=3, suspend_time=60, resume_timeout=60,
                suspend_timeout=5, mount_source=True)
    yield from b.running()


def hand_made_worker(bed: Testbed, node: str) -> None:
    """A container that looks like one of ours (cluster / node / role labels) but no program made."""
    docker("run", "-d", "--name", node, "--network", bed.network,
           "--label", f"{LABEL_CLUSTER}={bed.token}", "--label", f"{LABEL_NODE}={node}",
           "--label", f"{LABEL_ROLE}=slurmd", "--entrypoint", "sleep", IMAGES["slurmd"], "600")
    bed.started.append(node)


def reconcile_once(bed: Testbed) -> str:
    before = bed.log_dir / "reconcile.log"
    offset = before.stat().st_size if before.exists() else 0
    proc = bed.exec(bed.ctld, ["/opt/slurmk8s/bin/python", "-m", "provisioner.reconcile", "--once",
                               "--metrics-port", "0", "--grace", "0"], user="slurm", check=False, timeout=60)
    log = (bed.log_dir / "reconcile.log").read_text()[offset:]
    assert proc.returncode == 0, f"reconcile exit {proc.returncode}: {proc.stderr}\n{log}"
    return log


def test_one_pass_fixes_orphan_stale_and_missing_workers(bed: Testbed):
    bed.wait_all_powered_down(timeout=60)
    names = bed.node_names
    stray, stale = f"{bed.token}-stray", names[-1]

    # (c) a job on a node, then its worker vanishes
    job = bed.sbatch("-N1", "-o", "/dev/null", "--wrap", "sleep 300")
    bed.wait_job(job, {"RUNNING"}, 90)
    [busy] = bed.hosts(bed.job(job)["nodes"])
    assert busy != stale
    # (a) and (b)
    hand_made_worker(bed, stray)
    hand_made_worker(bed, stale)
    assert bed.nodes()[stale].powered_down
    docker("rm", "-f", busy)

    log = reconcile_once(bed)

    assert re.search(rf"{stray} orphan-worker: pod {stray} Running is for no node in the inventory "
                     r"-> delete-worker ok", log), log
    assert re.search(rf"{stale} worker-for-powered-down-node \[cpu\]: pod {stale} Running exists while Slurm "
                     r"has the node powered down .* -> delete-worker ok", log), log
    assert re.search(rf"{busy} missing-worker \[cpu\]: pod {busy} is gone while Slurm has the node "
                     r"(ALLOCATED|MIXED) -> set-down ok, power-down ok", log), log
    assert set(bed.workers()) == set(), f"workers left: {bed.workers()}"

    node = bed.nodes()[busy]
    assert node.reason.startswith(f"slurmk8s missing-worker: pod {busy} is gone"), node
    assert bed.job_state(job) == "PENDING", "the job was requeued"
    # DOWN + POWER_DOWN_FORCE: after SuspendTimeout the node is powered-down idle, ready to resume
    wait_for(f"{busy} powered down and not DOWN",
             lambda: (lambda n: n.powered_down and "DOWN" not in n.state)(bed.nodes()[busy]), 30, interval=1)

    # a second pass finds nothing left to do
    again = reconcile_once(bed)
    assert "->" not in again, again
    bed.exec(bed.ctld, ["scancel", str(job)])


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def total(samples: dict[str, float], prefix: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items()
               if (k == prefix or k.startswith(prefix + "{")) and all(w in k for w in want))


def test_metrics_move_when_a_job_runs(bed: Testbed):
    """The loop serves /metrics; a job from zero moves the queue, resume, latency and node-second
    numbers. The slurmctld image predates the prometheus-client dependency, so the test copies the
    (pure Python) package in from this environment when the image lacks it."""
    import prometheus_client

    site = bed.exec(bed.ctld, ["/opt/slurmk8s/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                    ).stdout.strip()
    if bed.exec(bed.ctld, ["/opt/slurmk8s/bin/python", "-c", "import prometheus_client"], check=False).returncode:
        docker("cp", str(__import__("pathlib").Path(prometheus_client.__file__).parent), f"{bed.ctld}:{site}/")
    docker("exec", "-d", "-u", "slurm", bed.ctld, "sh", "-c", "echo $$ > /tmp/reconcile.pid; exec "
           "/opt/slurmk8s/bin/python -m provisioner.reconcile --period 1 --metrics-port 9410 >/tmp/reconcile.out 2>&1")
    url = f"http://{bed.ip(bed.ctld)}:9410/metrics"
    try:
        # the endpoint answers before the first pass has finished (slow on a busy machine): wait for
        # the pass, not for the endpoint
        scrape_until(url, "the loop's first pass", 60,
                     lambda s: total(s, "slurmk8s_reconcile_passes_total") >= 1, "slurmk8s_reconcile_passes_total")
        bed.wait_all_powered_down(timeout=60)
        job = bed.sbatch("-N1", "-o", "/dev/null", "--wrap", "sleep 12")  # long enough for a slow pass to see it run
        bed.wait_job(job, {"RUNNING"}, 90)
        # one pass must see the job running, its node busy and its worker Running, together
        scrape_until(url, "the running job, its busy node and its Running worker", 30,
                     lambda s: total(s, "slurmk8s_jobs", state="running") >= 1
                     and total(s, "slurmk8s_nodes", state="allocated") + total(s, "slurmk8s_nodes", state="mixed") >= 1
                     and total(s, "slurmk8s_workers", phase="Running") >= 1,
                     "slurmk8s_jobs", "slurmk8s_nodes", "slurmk8s_workers")
        bed.wait_job(job, {"COMPLETED"}, 60)
        s = scrape_until(url, "the finished job's numbers", 30,
                         lambda s: total(s, "slurmk8s_elastic_requests_total", program="resume", outcome="ok") >= 1
                         and total(s, "slurmk8s_job_submit_to_running_seconds_count") >= 1
                         and total(s, "slurmk8s_worker_start_seconds_count") >= 1
                         and total(s, "slurmk8s_controller_rpc_seconds_count", command="show_nodes") >= 3,
                         "slurmk8s_elastic_requests_total", "slurmk8s_job_submit_to_running_seconds_count",
                         "slurmk8s_worker_start_seconds_count", "slurmk8s_controller_rpc_seconds_count")
        assert total(s, "slurmk8s_job_submit_to_running_seconds_count") >= 1
        assert 0 < total(s, "slurmk8s_job_submit_to_running_seconds_sum") < 30
        assert total(s, "slurmk8s_worker_start_seconds_count") >= 1
        provisioned, busy = total(s, "slurmk8s_node_provisioned_seconds_total"), total(s, "slurmk8s_node_busy_seconds_total")
        # busy only once booted, which follows the worker's creation; one period of slack for the
        # worker list being read just before Slurm's nodes
        assert provisioned > 0 and 0 < busy <= provisioned + 1.5, (provisioned, busy)
        assert total(s, "slurmk8s_controller_rpc_seconds_count", command="show_nodes") >= 3
        print("\n" + "\n".join(f"{k} {v}" for k, v in sorted(s.items()) if k.startswith("slurmk8s_")
                               and "_bucket" not in k and "_created" not in k))
    finally:
        bed.exec(bed.ctld, ["sh", "-c", "kill $(cat /tmp/reconcile.pid)"], check=False)


def scrape_until(url: str, what: str, timeout: float, done: Callable[[dict[str, float]], bool],
                 *shown: str) -> dict[str, float]:
    """Scrape until `done(samples)` holds; on timeout say what the last scrape showed of the
    `shown` metric families (or why the endpoint did not answer)."""

    def read() -> dict[str, float] | str:
        try:
            return scrape(url)
        except OSError as e:
            return f"endpoint not answering: {e}"

    def families(s: dict[str, float] | str) -> object:
        return s if isinstance(s, str) else {k: v for k, v in s.items() if any(k.startswith(p) for p in shown)}

    samples = wait_for(what, read, timeout, until=lambda s: not isinstance(s, str) and done(s), show=families)
    assert isinstance(samples, dict)
    return samples


def test_resume_refuses_a_backed_off_pool_at_once(bed: Testbed):
    """Three recent failures of pool cpu in the ledger on the state volume: the next resume of a
    cpu node is refused within the program's first second, the node is set DOWN saying 'backoff'
    (the job requeues), then POWER_DOWN_FORCE: it is powered-down idle again after SuspendTimeout,
    not DOWN until ResumeTimeout. Evidence from the elastic log, not the DOWN state, which lasts
    about a second (idle_on_node_suspend)."""
    bed.power_down_all(timeout=60)  # the previous test's node may still sit idle (SuspendTime 60 s)
    seed = ("import time; from provisioner.elastic.ledger import FileLedger, DEFAULT_LEDGER\n"
            "for i in range(3): FileLedger(DEFAULT_LEDGER).record_failure('cpu', f'n{i}', 'ErrImagePull', time.time() - i)")
    bed.exec(bed.ctld, ["/opt/slurmk8s/bin/python", "-c", seed], user="slurm")
    since = docker("exec", bed.ctld, "date", "+%s").stdout.strip()
    job = bed.sbatch("-N1", "-o", "/dev/null", "--wrap", "true")
    try:
        def refused() -> str | None:
            m = re.search(r"powered down (\S+) \(refused for backoff\)", bed.elastic_log())
            return m.group(1) if m else None

        name = wait_for("a node refused for backoff and powered down", refused, 30)
        refused_at = time.monotonic()
        # Slurm pings at once when a power program ends, and pings a DOWN node that is not powering
        # up or down: by its name, which resolves to nothing (no worker). Debian's Slurm retries a
        # failed lookup for 10 s holding the lock of every address lookup, which the power-save pass
        # wants (under the node write lock) when it powers the node down: node reads stalled. The
        # program gives such nodes an address that fails at once (NODE_ADDR_GONE) instead.
        assert bed.scontrol_json("show", "node", name)["nodes"][0]["address"] == NODE_ADDR_GONE
        slowest = 0.0

        def timed_nodes() -> dict:
            nonlocal slowest
            start = time.monotonic()
            nodes = bed.nodes()
            slowest = max(slowest, time.monotonic() - start)
            return nodes
        log = bed.elastic_log()
        assert re.search(rf"decide {name} fail \(backoff\)( jobs=\d+)?: pool cpu: 3 consecutive", log), log
        assert re.search(rf"set DOWN {name}: slurmk8s backoff: pool cpu: 3 consecutive", log), log
        assert name not in bed.workers(), "no worker was created"
        # SuspendTimeout is 5 s here, ResumeTimeout 60 s: back well before ResumeTimeout
        wait_for(f"{name} powered-down idle again", lambda: (n := timed_nodes()[name]) and "POWERED_DOWN" in n.state
                 and not {"DOWN", "POWERING_UP", "POWERING_DOWN"} & set(n.state), 40)
        while time.monotonic() < refused_at + 12:  # a failed lookup is logged after its 10 s of retries
            timed_nodes()
            time.sleep(0.5)
        # 2.9 s with the node's name as its address (the stall is its cause's length, less SuspendTimeout)
        print(f"slowest node read in the 12 s after the refusal: {slowest:.2f} s")
        ctld_log = docker("logs", "--since", since, bed.ctld).stderr
        assert "getaddrinfo" not in ctld_log, "slurmctld looked up a name that does not resolve:\n" + ctld_log
        assert bed.scontrol_json("show", "node", name)["nodes"][0]["address"] == name, "reset at POWERED_DOWN"
    finally:
        bed.exec(bed.ctld, ["scancel", str(job)], check=False)
        bed.exec(bed.ctld, ["/opt/slurmk8s/bin/python", "-c",
                            "import time; from provisioner.elastic.ledger import FileLedger, DEFAULT_LEDGER\n"
                            "FileLedger(DEFAULT_LEDGER).record_success('cpu', time.time())"], user="slurm", check=False)
