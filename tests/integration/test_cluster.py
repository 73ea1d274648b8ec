"""Real daemons in containers: SSH + sbatch, MPI across worker nodes, scale from zero and back,
a failed worker start, drain before removal, and the security basics.

Run with `pytest -m integration tests/integration` (needs Docker and the images from
images/build.sh). One cluster serves the whole module; tests run in file order.
"""

from __future__ import annotations

import calendar
import re
import time

import asyncssh
import pytest

from testbed import UID, USER, Testbed, wait_for

pytestmark = pytest.mark.integration

ALLREDUCE_C = r"""
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, len;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    long mine[2] = {rank + 1, (long)(rank + 1) * (rank + 1)}, sum[2] = {0, 0};
    MPI_Allreduce(mine, sum, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank=%d size=%d host=%s sum=%ld sumsq=%ld\n", rank, size, host, sum[0], sum[1]);
    MPI_Finalize();
    return 0;
}
"""


def home(path: str) -> str:
    return f"/home/{USER}/{path}"


def read_home(cluster: Testbed, path: str) -> str:
    return str(cluster.ssh(["cat", home(path)]).stdout)


def run_job(cluster: Testbed, *args: str, timeout: float = 150) -> int:
    job = cluster.sbatch(*args)
    state = cluster.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"},
                             timeout)
    assert state == "COMPLETED", f"job {job} ended {state}: {cluster.job(job).get('state_reason')}"
    return job


# ---------------------------------------------------------------- elasticity


def test_scale_from_zero_and_back_to_zero(cluster: Testbed):
    cluster.wait_all_powered_down(timeout=60)
    assert cluster.workers() == {}, "a fresh cluster has no worker containers"
    log_before = len(cluster.elastic_log())

    job = cluster.sbatch("-N2", "--ntasks-per-node=1", "-o", home("zero-%j.out"), "--wrap", "srun hostname; sleep 2")
    cluster.wait_job(job, {"RUNNING", "COMPLETED"}, 90)
    nodes = cluster.hosts(cluster.job(job)["nodes"])
    assert len(nodes) == 2
    assert set(cluster.workers()) == set(nodes), "exactly the job's nodes got containers"
    cluster.wait_job(job, {"COMPLETED"}, 60)
    assert sorted(read_home(cluster, f"zero-{job}.out").split()) == sorted(nodes)

    log = cluster.elastic_log()[log_before:]
    assert re.search(r"resume\[\d+\] resume 2 nodes: ", log), log
    for name in nodes:
        assert re.search(rf"decide {name} create \(resume\) jobs={job}", log), log
        assert re.search(rf"{name} create ok", log), log

    # idle for SuspendTime (15 s): Slurm calls our suspend program, the containers go
    cluster.wait_all_powered_down(timeout=15 + 5 + 40)
    # the suspend program logs its deletes once they have all returned: the containers can be gone
    # (and the nodes powered down, SuspendTimeout after the program started) just before it does
    wait_for(f"the suspend program's 'delete ok' lines for {', '.join(nodes)}",
             lambda: cluster.elastic_log()[log_before:], 15,
             until=lambda log: all(re.search(rf"{name} delete ok", log) for name in nodes))
    states = cluster.sinfo_states()
    assert all(states[n] == "idle~" for n in nodes), states


def test_worker_that_fails_to_start_goes_down_with_reason_and_job_is_requeued(clean_overrides: Testbed):
    cluster = clean_overrides
    bad = cluster.node_names[-1]
    cluster.wait_all_powered_down(timeout=60)
    cluster.set_overrides({"images": {bad: "slurmk8s/does-not-exist:none"}})

    job = cluster.sbatch("-N1", "-w", bad, "-o", home("fail-%j.out"), "--wrap", "hostname")

    def down() -> bool:
        node = cluster.nodes()[bad]
        return "DOWN" in node.state and node
    node = wait_for(f"{bad} to go DOWN", down, 60)
    assert "not found" in node.reason and "does-not-exist" in node.reason, node.reason
    assert bad not in cluster.workers(), "no container is left behind for a failed node"

    # the job is requeued, not lost
    def requeued() -> dict | None:
        info = cluster.job(job)
        return info if info["job_state"][0] == "PENDING" and info["restart_cnt"] >= 1 else None
    info = wait_for(f"job {job} to be requeued", requeued, 60)
    assert info["job_state"] == ["PENDING"]

    # once the cause is fixed, the job runs on that same node without anyone touching Slurm:
    # at ResumeTimeout our resume-fail program returns the node to powered-down idle, and the
    # requeued job (eligible again cred_expire + 1 = 31 s after its requeue, the test bed's AuthInfo)
    # resumes it
    cluster.set_overrides({})
    cluster.wait_job(job, {"COMPLETED"}, 60 + 31 + 90)
    assert read_home(cluster, f"fail-{job}.out").split() == [bad]
    assert re.search(rf"resume-fail\[\d+\] returned {bad} to service", cluster.elastic_log())


@pytest.mark.parametrize("scale_in", ["POWER_DOWN_ASAP", "DRAIN"])
def test_busy_node_marked_for_scale_in_finishes_its_job_first(cluster: Testbed, scale_in: str):
    """POWER_DOWN_ASAP: drain, then power down once idle; DRAIN: the drained node, idle, is
    suspended after SuspendTime (SuspendExcStates does not exclude DRAIN by default)."""
    job = cluster.sbatch("-N1", "-o", home("drain-%j.out"), "--wrap", "sleep 12; echo finished")
    cluster.wait_job(job, {"RUNNING"}, 90)
    name = cluster.job(job)["nodes"]
    log_before = len(cluster.elastic_log())  # the node's container runs: its removal is logged after this
    cluster.exec(cluster.ctld, ["scontrol", "update", f"nodename={name}", f"state={scale_in}",
                                "reason=scale-in test"])
    try:
        # while the job runs, its container stays
        while cluster.job_state(job) == "RUNNING":
            assert name in cluster.workers(), f"{name}'s container went away under a running job"
            assert "DRAIN" in cluster.nodes()[name].state
            time.sleep(1)
        assert cluster.job_state(job) == "COMPLETED"
        assert read_home(cluster, f"drain-{job}.out").strip() == "finished"
        end = cluster.job(job)["end_time"]["number"]
        # then Slurm suspends it and our suspend program removes the container
        wait_for(f"{name}'s container to be removed", lambda: name not in cluster.workers(), 15 + 60)
        wait_for(f"{name} powered down", lambda: cluster.nodes()[name].powered_down, 60)
        # the suspend program logs the delete once it has returned, possibly just after the two
        # waits above saw its effects; a line from before the job would say nothing about this one
        log = wait_for(f"the suspend program's '{name} delete ok' line", lambda: cluster.elastic_log()[log_before:],
                       15, until=lambda log: f"{name} delete ok" in log)
        removed = [line for line in log.splitlines() if f"{name} delete ok" in line]
        stamp = calendar.timegm(time.strptime(removed[-1].split(".")[0], "%Y-%m-%dT%H:%M:%S"))
        assert stamp >= end, f"container removed at {stamp}, before the job ended at {end}"
    finally:
        if scale_in == "DRAIN":  # undrain for the tests that follow
            cluster.exec(cluster.ctld, ["scontrol", "update", f"nodename={name}", "state=RESUME"], check=False)


# ---------------------------------------------------------------- users, SSH and MPI


def test_user_submits_over_ssh_and_two_node_job_writes_to_shared_home(cluster: Testbed):
    who = cluster.ssh(["id", "-un"]).stdout.strip()
    assert who == USER
    job = run_job(cluster, "-N2", "--ntasks-per-node=1", "-o", home("two-%j.out"), "--wrap",
                  "srun bash -c 'echo $(hostname) $SLURM_PROCID $(id -un) $(id -u)'")
    lines = sorted(read_home(cluster, f"two-{job}.out").splitlines())
    nodes = cluster.hosts(cluster.job(job)["nodes"])
    assert [line.split()[1] for line in lines] == ["0", "1"]
    assert {tuple(line.split()[2:]) for line in lines} == {(USER, str(UID))}  # same user, same uid on every worker
    assert sorted(line.split()[0] for line in lines) == sorted(nodes)
    assert len(set(nodes)) == 2


@pytest.fixture(scope="module")
def allreduce(cluster: Testbed) -> str:
    cluster.put_file(home("allreduce.c"), ALLREDUCE_C)
    cluster.ssh(["mpicc", "-O2", "-o", home("allreduce"), home("allreduce.c")])
    return home("allreduce")


def check_allreduce(output: str, nodes: list[str]) -> None:
    ranks = [dict(kv.split("=") for kv in line.split()) for line in output.splitlines() if line.startswith("rank=")]
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1], output
    for r in ranks:
        assert (r["size"], r["sum"], r["sumsq"]) == ("2", "3", "5"), output  # 1+2, 1+4
    assert sorted(r["host"] for r in ranks) == sorted(nodes), output


def test_mpi_allreduce_with_srun_pmix(cluster: Testbed, allreduce: str):
    job = run_job(cluster, "-N2", "--ntasks-per-node=1", "-o", home("srun-%j.out"), "--wrap",
                  f"srun --mpi=pmix {allreduce}")
    check_allreduce(read_home(cluster, f"srun-{job}.out"), cluster.hosts(cluster.job(job)["nodes"]))


def test_mpi_allreduce_with_mpirun_inside_an_allocation(cluster: Testbed, allreduce: str):
    job = run_job(cluster, "-N2", "--ntasks-per-node=1", "-o", home("mpirun-%j.out"), "--wrap",
                  f"mpirun {allreduce}")
    check_allreduce(read_home(cluster, f"mpirun-{job}.out"), cluster.hosts(cluster.job(job)["nodes"]))


# ---------------------------------------------------------------- security


def test_no_password_login_and_no_root_ssh(cluster: Testbed):
    with pytest.raises(asyncssh.PermissionDenied):
        import asyncio

        async def password_login() -> None:
            async with asyncssh.connect(cluster.login_ip, username=USER, password="alice", known_hosts=None,
                                        client_keys=None, preferred_auth=("password", "keyboard-interactive")):
                pass
        asyncio.run(password_login())
    # root's key file exists (the fixture put the user's key there): sshd must refuse root anyway
    with pytest.raises(asyncssh.PermissionDenied):
        cluster.ssh(["true"], username="root")
    effective = cluster.exec(cluster.login, ["sshd", "-T"]).stdout.lower()
    for setting in ("passwordauthentication no", "permitrootlogin no", "kbdinteractiveauthentication no"):
        assert setting in effective.splitlines(), setting


def test_munge_key_readable_only_by_munge(cluster: Testbed):
    for container in (cluster.ctld, cluster.login):
        assert cluster.exec(container, ["stat", "-c", "%U %a", "/etc/munge/munge.key"]).stdout.split() == ["munge", "400"]
    # the user can read neither the installed key nor the mounted Secret, on login ...
    for path in ("/etc/munge/munge.key", "/etc/slurmk8s/secret/munge.key"):
        assert cluster.ssh(["cat", path], check=False).exit_status != 0, path
    # ... nor on a worker, inside a job; there the key is munge's alone too
    job = cluster.sbatch("-N1", "-o", home("key-%j.out"), "--wrap",
                         "cat /etc/munge/munge.key >/dev/null 2>&1 || echo denied1; "
                         "cat /etc/slurmk8s/secret/munge.key >/dev/null 2>&1 || echo denied2; sleep 5")
    cluster.wait_job(job, {"RUNNING"}, 90)
    worker = cluster.job(job)["nodes"]
    assert cluster.exec(worker, ["stat", "-c", "%U %a", "/etc/munge/munge.key"]).stdout.split() == ["munge", "400"]
    assert cluster.wait_job(job, {"COMPLETED", "FAILED"}, 60) == "COMPLETED"
    assert read_home(cluster, f"key-{job}.out").split() == ["denied1", "denied2"]
