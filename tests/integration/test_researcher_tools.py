"""The researchers' own tools run (issue #15, item 3), as alice over SSH on the login node, on real
daemons in containers (tests/integration/testbed.py), with workers created from zero by power saving:

- interactive work: `srun --pty bash` (the prompt, the command's output and its exit status come
  back), `salloc -N2` then `srun hostname` inside the allocation (two distinct workers), `sattach`
  to the running step of a batch job;
- `scancel` of a running job: CANCELLED, and none of the user's processes left on its worker;
- a job array with a job depending on it (`--dependency=afterok:<array>`), which starts only after
  every task has ended (timestamps in /home: the test bed has no slurmdbd, so no sacct);
- `--mail-type=END --mail-user=alice` accepted: MailProg is the documented no-op /bin/true (no MTA
  in the cluster), the job completes and slurmctld logs no mail error;
- submitit and dask-jobqueue, installed by alice into a venv in her home from wheels (the containers
  cannot reach PyPI: the wheels are downloaded on the host once, cached under
  /var/cache/slurmk8s/wheels, SLURMK8S_WHEEL_CACHE to move it): a submitit job returns 6*7; a
  dask-jobqueue SLURMCluster of 2 jobs computes a sum over 2 workers, whose dask workers connect
  back to the scheduler in alice's Python process on the login node (its default address).

Run: `pytest -m integration tests/integration/test_researcher_tools.py` (Docker; the images of the
current sources, SLURMK8S_{CTLD,SLURMD,LOGIN}_IMAGE to choose them). Its own small cluster (2 nodes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from testbed import USER, Testbed, docker, wait_for

pytestmark = pytest.mark.integration

HOME = f"/home/{USER}"
PROMPT = r"\$ $"  # bash's prompt, waiting for input (the output so far ends with it)
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}

# What alice installs. Pinned, so the wheel cache stays valid; the images' Python is 3.13 on x86_64.
REQUIREMENTS = ("submitit==1.5.4", "dask-jobqueue==0.9.0", "dask==2026.8.0", "distributed==2026.8.0")
WHEEL_TARGET = ("--python-version", "3.13", "--implementation", "cp", "--abi", "cp313",
                "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                "--platform", "manylinux_2_28_x86_64", "--platform", "any")
WHEEL_CACHE = Path(os.environ.get("SLURMK8S_WHEEL_CACHE", "/var/cache/slurmk8s/wheels"))


def wheels() -> list[Path]:
    """The wheels of REQUIREMENTS and their dependencies, downloaded once into the cache. Fails
    (never skips) when they are not cached and cannot be downloaded."""
    key = hashlib.sha256(json.dumps([REQUIREMENTS, WHEEL_TARGET]).encode()).hexdigest()[:12]
    folder = WHEEL_CACHE / f"researcher-tools-{key}"
    if not (folder / "complete").exists():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=WHEEL_CACHE))
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
               *WHEEL_TARGET, "-d", str(tmp), *REQUIREMENTS]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail(f"the wheels of {', '.join(REQUIREMENTS)} are not in {folder} and could not be downloaded "
                        f"(is PyPI reachable? pre-fill the cache with: {' '.join(cmd[:-len(REQUIREMENTS) - 2])} "
                        f"-d {folder} {' '.join(REQUIREMENTS)} && touch {folder}/complete):\n"
                        f"{proc.stderr[-3000:]}")
        (tmp / "complete").write_text(" ".join(REQUIREMENTS) + "\n")
        tmp.chmod(0o755)
        try:
            tmp.rename(folder)  # atomic: a folder in the cache is complete
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (folder / "complete").exists():  # not a concurrent run's download
                raise
    return sorted(folder.glob("*.whl"))


@pytest.fixture(scope="module")
def bed(testbed_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    yield from Testbed(tmp_path_factory.mktemp("tools"), node_count=2, suspend_time=60).running()


@pytest.fixture(scope="module")
def partition(bed: Testbed) -> str:
    return str(bed.ssh(["sinfo", "-h", "-o", "%R"]).stdout).split()[0]


@pytest.fixture(scope="module")
def venv(bed: Testbed) -> str:
    """alice's venv with submitit and dask-jobqueue, installed from wheels copied into her home."""
    bed.put_files(wheels(), f"{HOME}/wheels")
    sh(bed, "set -e; python3 -m venv ~/venv; "
            "PIP_DISABLE_PIP_VERSION_CHECK=1 ~/venv/bin/pip install -q --no-index --find-links ~/wheels "
            "submitit dask-jobqueue", timeout=300)
    return f"{HOME}/venv"


def sh(bed: Testbed, script: str, timeout: float = 120) -> str:
    return str(bed.ssh(["bash", "-c", script], timeout=timeout).stdout)


def ended(bed: Testbed, job: int, timeout: float = 150) -> str:
    return bed.wait_job(job, FINAL, timeout)


def user_processes(bed: Testbed, node: str) -> str:
    return docker("exec", node, "ps", "-u", USER, "-o", "pid=,args=", check=False).stdout.strip()


def test_srun_pty_is_interactive_from_zero_workers(bed: Testbed):
    assert not bed.workers(), bed.workers()  # nothing runs before the first job: power saving creates them
    out, status = bed.ssh_pty("srun -N1 --pty bash", [(PROMPT, 'echo "on $(hostname) tty $(tty)"; exit 3')],
                              timeout=120)
    print(out)
    found = re.search(r"on (\S+) tty (/dev/pts/\d+)", out)
    assert found, out
    node = found.group(1)
    assert node in bed.node_names, out
    assert re.search(rf"{USER}@{node}\S*[$] ", out), f"no prompt of {USER} on {node}:\n{out}"
    assert status == 3, f"exit status {status}, not bash's 3:\n{out}"
    assert node in bed.workers()


def test_salloc_then_srun_inside_the_allocation(bed: Testbed):
    out, status = bed.ssh_pty("salloc -N2", [(PROMPT, "srun hostname; echo JOB=$SLURM_JOB_ID NODES=$SLURM_NNODES; "
                                                      "exit")], timeout=150)
    print(out)
    assert status == 0, out
    job = re.search(r"JOB=(\d+) NODES=2", out)
    assert job, out
    hosts = [line.strip() for line in out.splitlines() if line.strip() in bed.node_names]
    assert sorted(hosts) == sorted(bed.node_names), f"srun ran on {hosts}, not once on each of the 2 nodes:\n{out}"
    assert re.search(rf"Granted job allocation {job.group(1)}", out), out
    assert ended(bed, int(job.group(1)), 30) == "COMPLETED"


def test_sattach_to_a_running_step(bed: Testbed):
    job = bed.sbatch("-N1", "-o", f"{HOME}/sattach-%j.out", "--wrap",
                     "srun bash -c 'for i in $(seq 1 8); do echo tick $i; sleep 1; done'")

    def step_running() -> bool:
        return f"{job}.0" in str(bed.ssh(["squeue", "-h", "-s", "-j", str(job), "-o", "%i"], check=False).stdout)

    wait_for(f"step {job}.0 to run", step_running, 120, interval=0.5)
    result = bed.ssh(["sattach", f"{job}.0"], timeout=60, check=False)
    print(result.stdout, result.stderr)
    ticks = [int(n) for n in re.findall(r"^tick (\d+)\r?$", str(result.stdout), re.M)]
    assert ticks and ticks[-1] == 8, (result.exit_status, result.stdout, result.stderr)
    assert ticks == list(range(ticks[0], 9)), ticks  # from where it attached to the step's end
    assert result.exit_status == 0, result.stderr
    assert ended(bed, job, 30) == "COMPLETED"


def test_scancel_ends_a_running_job_and_its_processes(bed: Testbed):
    job = bed.sbatch("-N1", "-o", "/dev/null", "--wrap", "srun sleep 600")
    bed.wait_job(job, {"RUNNING"}, 120)
    node = bed.job(job)["nodes"]
    wait_for(f"sleep 600 on {node}", lambda: "sleep 600" in user_processes(bed, node), 60)
    bed.ssh(["scancel", str(job)])
    assert ended(bed, job, 60) == "CANCELLED"
    left = wait_for(f"{USER}'s processes on {node} to end", lambda: user_processes(bed, node), 60,
                    until=lambda procs: procs == "")
    assert left == ""
    assert not docker("exec", node, "pgrep", "-f", f"slurmstepd: \\[{job}\\.", check=False).stdout.strip()


def test_array_with_a_dependent_job(bed: Testbed):
    sh(bed, "rm -rf ~/arr; mkdir ~/arr")
    array = bed.sbatch("--array=1-4", "-N1", "-o", "/dev/null", "--wrap",
                       "t=$SLURM_ARRAY_TASK_ID; date +%s.%N > $HOME/arr/start-$t; sleep 3; "
                       "date +%s.%N > $HOME/arr/end-$t")
    after = bed.sbatch(f"--dependency=afterok:{array}", "-N1", "-o", "/dev/null", "--wrap",
                       "date +%s.%N > $HOME/arr/after; ls $HOME/arr > $HOME/arr/after-saw")
    waiting = bed.job(after)
    assert (waiting["job_state"], waiting["state_reason"]) == (["PENDING"], "Dependency"), waiting["job_state"]
    assert ended(bed, after, 180) == "COMPLETED", bed.job(after).get("state_reason")
    tasks = bed.scontrol_json("show", "job", str(array))["jobs"]
    states = {t["array_task_id"]["number"]: t["job_state"] for t in tasks}
    assert states == {i: ["COMPLETED"] for i in range(1, 5)}, states
    times = {}
    for line in sh(bed, "cd ~/arr && grep . start-* end-* after").splitlines():
        name, value = line.split(":", 1)
        times[name] = float(value)
    print(json.dumps(times, indent=1))
    last_end = max(times[f"end-{i}"] for i in range(1, 5))
    assert times["after"] >= last_end, times
    assert sh(bed, "cat ~/arr/after-saw").split().count("end-4") == 1


def test_mail_options_are_accepted_and_mail_is_dropped(bed: Testbed):
    config = sh(bed, "scontrol show config | grep -i '^MailProg'")
    assert re.match(r"MailProg\s*=\s*/bin/true$", config.strip()), config
    job = bed.sbatch("-N1", "--mail-type=END", "--mail-user=alice", "-o", "/dev/null", "--wrap", "true")
    assert ended(bed, job) == "COMPLETED"
    info = bed.job(job)
    assert "END" in info["mail_type"] and info["mail_user"] == USER, (info["mail_type"], info["mail_user"])
    time.sleep(1)
    log = docker("logs", bed.ctld, check=False)
    mail_errors = [line for line in (log.stdout + log.stderr).splitlines()
                   if re.search(r"mail", line, re.I) and re.search(r"error|fail|fatal", line, re.I)]
    assert not mail_errors, mail_errors


SUBMITIT = """
import socket, sys
import submitit

def answer():
    return 6 * 7, socket.gethostname()

executor = submitit.AutoExecutor(folder="~/submitit/%j")
executor.update_parameters(slurm_partition=sys.argv[1], timeout_min=5, nodes=1, tasks_per_node=1)
job = executor.submit(answer)
print("JOB", job.job_id, flush=True)
value, host = job.result()
print("RESULT", value, host, flush=True)
"""


def test_submitit(bed: Testbed, venv: str, partition: str):
    bed.put_file(f"{HOME}/submitit_job.py", SUBMITIT)
    result = bed.ssh([f"{venv}/bin/python", f"{HOME}/submitit_job.py", partition], timeout=240, check=False)
    print(result.stdout, result.stderr[-3000:])
    assert result.exit_status == 0, result.stderr
    found = re.search(r"^RESULT (\d+) (\S+)$", str(result.stdout), re.M)
    assert found and found.group(1) == "42" and found.group(2) in bed.node_names, result.stdout
    job = int(re.search(r"^JOB (\d+)$", str(result.stdout), re.M).group(1))  # type: ignore[union-attr]
    assert ended(bed, job, 30) == "COMPLETED"


DASK = """
import socket, sys
from dask.distributed import Client
from dask_jobqueue import SLURMCluster

cluster = SLURMCluster(cores=1, memory="1GB", processes=1, queue=sys.argv[1], walltime="00:05:00",
                       job_extra_directives=["--output=dask-worker-%j.out"])
print(cluster.job_script(), flush=True)
cluster.scale(jobs=2)  # --mem=954M each: one per node (1024 MiB), so one on each worker
client = Client(cluster)
client.wait_for_workers(2, timeout=180)
hosts = sorted(set(client.run(socket.gethostname).values()))
squares = client.map(lambda x: x * x, range(100))
total = client.submit(sum, squares).result()
print("SCHEDULER", cluster.scheduler_address, flush=True)
print("WORKERS", " ".join(hosts), flush=True)
print("SUM", total, flush=True)
client.close()
cluster.close()
"""


def test_dask_jobqueue(bed: Testbed, venv: str, partition: str):
    bed.put_file(f"{HOME}/dask_job.py", DASK)
    result = bed.ssh(["bash", "-c", f"cd ~ && {venv}/bin/python dask_job.py {partition}"], timeout=300, check=False)
    print(result.stdout, str(result.stderr)[-4000:])
    if result.exit_status != 0:
        print(sh(bed, "tail -n 30 ~/dask-worker-*.out || true"))
    assert result.exit_status == 0, str(result.stderr)[-4000:]
    out = str(result.stdout)
    assert re.search(r"^SUM 328350$", out, re.M), out
    workers = re.search(r"^WORKERS (.*)$", out, re.M)
    assert workers and sorted(workers.group(1).split()) == sorted(bed.node_names), out
    scheduler = re.search(r"^SCHEDULER tcp://([\d.]+):\d+$", out, re.M)
    assert scheduler and scheduler.group(1) == bed.login_ip, out  # the login node's address, by default
    # cluster.close() cancelled the workers' jobs
    wait_for("no dask-worker job left", lambda: sh(bed, "squeue -h -u $USER -n dask-worker -o %i"), 60,
             until=lambda left: left.strip() == "")
