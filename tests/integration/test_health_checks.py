"""Health checks on the Docker test bed: a worker whose check fails drains itself with the reason,
a healthy one stays IDLE, and the drained node comes back with a fresh worker.

Own small cluster (2 nodes, health interval 10 s): one node gets an image whose MPI probe is broken
on purpose (the docker backend's per-node image override), so its check fails at slurmd's start;
later a raised /dev/shm threshold (slurm.conf + scontrol reconfigure) makes the periodic check fail.
"""

from __future__ import annotations

import subprocess
import time
from typing import Iterator

import pytest

from testbed import IMAGES, NodeState, Testbed, docker, fake_k8s_nodes, wait_for

from provisioner.config import Health
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api
from provisioner.render import Site, write_files

pytestmark = pytest.mark.integration

BROKEN_MPI = """FROM {base}
RUN printf '#!/bin/sh\\necho "mpi-loopback: broken on purpose" >&2\\nexit 3\\n' >/usr/local/lib/slurmk8s/mpi-loopback
"""


class HealthTestbed(Testbed):
    __test__ = False

    def _prepare(self) -> None:
        super()._prepare()
        self.render(Health(interval=10))

    def render(self, health: Health) -> None:
        self.spec = self.spec.model_copy(update={"health": health})
        self.generated = generate(self.spec, nodes_from_api(fake_k8s_nodes(self.node_count)),
                                  Site(controller_host=self.ctld))
        write_files(self.generated.files, self.workdir / "etc-slurm")


@pytest.fixture(scope="module")
def bed(testbed_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HealthTestbed]:
    b = HealthTestbed(tmp_path_factory.mktemp("health"), node_count=2, suspend_time=30, resume_timeout=60,
                      suspend_timeout=5)
    yield from b.running()


def is_up(n: NodeState) -> bool:
    """Registered and usable: not powered down / powering, not DOWN / DRAIN / NOT_RESPONDING."""
    bad = {"POWERED_DOWN", "POWERING_UP", "POWERING_DOWN", "DOWN", "DRAIN", "NOT_RESPONDING", "FAIL"}
    return not bad & set(n.state)


def health_log(bed: Testbed, name: str) -> str:
    return bed.exec(name, ["cat", "/var/log/slurm/healthcheck.log"], check=False).stdout


def sinfo_r(bed: Testbed) -> str:
    return bed.exec(bed.ctld, ["sinfo", "-R", "-h", "-o", "%n|%E"]).stdout


def test_failing_check_drains_the_node_healthy_one_stays_idle_and_a_fresh_worker_replaces_it(bed: HealthTestbed):
    bad, good = bed.node_names
    broken = f"slurmk8s/slurmd-broken-mpi:{bed.token}"
    subprocess.run(["docker", "build", "-q", "-t", broken, "-"], input=BROKEN_MPI.format(base=IMAGES["slurmd"]),
                   text=True, check=True, capture_output=True, timeout=120)
    try:
        bed.set_overrides({"images": {bad: broken}})
        bed.exec(bed.ctld, ["scontrol", "update", f"nodename={bad},{good}", "state=POWER_UP"])

        # the check at slurmd's start (before it registers) drains the broken node
        def drained() -> bool:
            n = bed.nodes()[bad]
            return "DRAIN" in n.state and n.reason.startswith("health: mpi:")
        wait_for(f"{bad} drained by its health check", drained, 60)
        node = bed.nodes()[bad]
        assert node.reason == "health: mpi: 2-rank loopback exit 3: mpi-loopback: broken on purpose", node.reason
        assert f"{bad}|health: mpi: 2-rank loopback exit 3: mpi-loopback: broken on purpose" in sinfo_r(bed)
        started = time.monotonic()

        # the healthy node registers and stays IDLE through several periodic checks
        wait_for(f"{good} up", lambda: is_up(bed.nodes()[good]), 60)
        wait_for("two periodic checks on the healthy node",
                 lambda: health_log(bed, good).count("mpi: ok:") >= 3, 40, interval=1)
        log = health_log(bed, good)
        assert "gpu: skip: no GPU expected (the node's Gres has none)" in log
        assert "shm: ok: /dev/shm 512MiB" in log
        assert is_up(bed.nodes()[good]) and bed.nodes()[good].state[0] == "IDLE"
        assert "drained: health: mpi:" in health_log(bed, bad)
        print(f"healthy node checked {log.count('mpi: ok:')} times; drain reason: {node.reason}")

        # the drained, idle node is suspended after SuspendTime: its worker is deleted
        bed.set_overrides({})  # the node's "hardware" is fixed: the next worker gets the good image
        wait_for(f"{bad}'s worker removed", lambda: bad not in bed.workers(), 30 + 60, interval=1)
        wait_for(f"{bad} powered down", lambda: bed.nodes()[bad].powered_down, 60, interval=1)
        after = bed.nodes()[bad]
        print(f"{bad} after suspend ({time.monotonic() - started:.0f}s): state {after.state} reason {after.reason!r}")
        # SlurmctldParameters=idle_on_node_suspend: suspending clears DRAIN, no operator needed
        assert "DRAIN" not in after.state and after.state[0] == "IDLE", after
        # the next resume creates a fresh worker, which passes and takes jobs
        bed.exec(bed.ctld, ["scontrol", "update", f"nodename={bad}", "state=POWER_UP"], check=False)
        wait_for(f"{bad} up again with a fresh worker", lambda: is_up(bed.nodes()[bad]), 90, interval=1)
        assert "mpi: ok:" in health_log(bed, bad)
        assert "DRAIN" not in bed.nodes()[bad].state

        # the periodic check: a raised /dev/shm threshold (slurm.conf, reconfigure) drains it within an interval
        bed.render(Health(interval=10, min_shm="4Gi"))
        bed.exec(bed.ctld, ["scontrol", "reconfigure"])

        def shm_drained() -> bool:
            n = bed.nodes()[bad]
            return "DRAIN" in n.state and n.reason.startswith("health: shm:")
        wait_for(f"{bad} drained by the periodic check", shm_drained, 60, interval=1)
        assert bed.nodes()[bad].reason == "health: shm: /dev/shm is 512MiB, below 4096MiB"
    finally:
        bed.set_overrides({})
        docker("rmi", "-f", broken, check=False)


def test_an_operators_fail_keeps_the_node_and_its_worker_out_past_suspend_time(bed: HealthTestbed):
    """#16 item 6: DOWN and DRAIN are cleared when Slurm suspends an idle node (idle_on_node_suspend,
    so a bad pod is replaced); state=FAIL is the operator's way to keep a node out, and it sticks:
    SuspendExcStates=FAIL keeps it from being suspended, its worker stays for inspection, and no
    job lands on it until state=RESUME."""
    _, good = bed.node_names
    bed.render(Health(interval=10))  # the test above left a /dev/shm threshold every worker fails
    bed.exec(bed.ctld, ["scontrol", "reconfigure"])
    # idle since the test above, it may be suspended or on its way: a job brings it (back) up
    assert bed.wait_job(bed.sbatch("-w", good, "--wrap", "true"), {"COMPLETED"}, 150) == "COMPLETED"
    assert is_up(bed.nodes()[good]) and good in bed.workers(), bed.nodes()[good]
    bed.exec(bed.ctld, ["scontrol", "update", f"nodename={good}", "state=FAIL", "reason=operator: bad DIMM"])
    job = bed.sbatch("-w", good, "--wrap", "hostname")
    taken_out = time.monotonic()
    # SuspendTime 30 s + SuspendTimeout 5 s + power-save passes: well past the point a DRAIN is cleared
    while time.monotonic() - taken_out < 50:
        node = bed.nodes()[good]
        assert "FAIL" in node.state and node.reason == "operator: bad DIMM", node
        assert not {"POWERING_DOWN", "POWERED_DOWN"} & set(node.state), node
        assert good in bed.workers(), f"{good}'s worker was removed while the node is FAIL"
        assert bed.job_state(job) == "PENDING"
        time.sleep(2)
    print(f"{good} after {time.monotonic() - taken_out:.0f}s: {bed.nodes()[good].state}, job {job} PENDING")
    bed.exec(bed.ctld, ["scontrol", "update", f"nodename={good}", "state=RESUME"])
    assert bed.wait_job(job, {"COMPLETED"}, 60) == "COMPLETED"
    assert "FAIL" not in bed.nodes()[good].state
