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
from typing import Iterator

import pytest

from testbed import IMAGES, Testbed, docker, wait_for

from provisioner.elastic.docker_backend import LABEL_CLUSTER, LABEL_NODE, LABEL_ROLE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(testbed_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    b = Testbed(tmp_path_factory.mktemp("reconcile"), node_count=3, suspend_time=60, resume_timeout=60,
                suspend_timeout=5, mount_source=True)
    b.up()
    try:
        yield b
    finally:
        b.down()
        print(f"\ntestbed {b.token}: logs kept in {b.log_dir}")


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
