"""A researcher's own work on the real cluster (issue #15 items 3 and 4), as alice over SSH on the
login pod, with worker pods created by power saving:

- interactive work: `srun --pty bash` (prompt, output and exit status come back), `salloc -N2`
  (its shell on the first worker: Slurm's interactive step) then `srun hostname` inside the
  allocation, `sattach` to the running step of a batch job;
- `scancel` of a running job: CANCELLED, none of alice's processes left in its worker pod, and the
  pod deleted after SuspendTime;
- a job array and a job that depends on it (`--dependency=afterok:<array>`);
- `--mail-type=END` accepted (MailProg is the documented no-op: no mail server in the cluster);
- submitit and dask-jobqueue installed by alice into a venv in her home from wheels copied in
  (there is no network inside the cluster: the wheels are downloaded on this machine once, cached
  under /var/cache/slurmk8s/wheels, SLURMK8S_WHEEL_CACHE to move it), used as their docs say: a
  submitit job array of Python functions whose results come back (submitit follows jobs with sacct,
  the session cluster has accounting), a dask-jobqueue SLURMCluster whose 2 workers run as Slurm
  jobs on 2 worker pods and connect back to the scheduler in alice's Python on the login pod;
- container jobs (`srun --container`) in a side cluster `oci` whose pool `box` sets
  `containers: true`: a job step runs in a BusyBox userland made from a local image (no registry),
  as alice; the namespace's Pod Security level is `privileged` and only `box`'s pods run seccomp
  Unconfined; on pool `plain` (RuntimeDefault, like every other worker) the same step is refused by
  the kernel, which is why the pool must opt in.
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
from typing import Any, Iterator

import pytest

from helpers import (FINAL, NAMESPACE, SUSPEND_TIME, Cluster, Login, kjson, kubectl, side_cluster, side_spec, submit,
                     wait_for, worker_pods)

pytestmark = pytest.mark.e2e

HOME = "/home/alice"
PARTITION = "cpu"  # the session cluster's slot pool: 3 Slurm nodes of 1 CPU and 1 GiB
PROMPT = r"\$ $"  # bash waiting for input

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
def alice(cluster: Cluster) -> Login:
    return cluster.login()


@pytest.fixture(scope="module")
def nodes(alice: Login) -> list[str]:
    return alice.run(f"sinfo -h -p {PARTITION} -N -o %N").stdout.split()


@pytest.fixture(scope="module")
def venv(alice: Login) -> str:
    """alice's venv with submitit and dask-jobqueue, installed from wheels copied into her home."""
    alice.put_files(wheels(), f"{HOME}/wheels")
    t0 = time.monotonic()
    alice.run("set -e; rm -rf ~/venv; python3 -m venv ~/venv; PIP_DISABLE_PIP_VERSION_CHECK=1 ~/venv/bin/pip install "
              "-q --no-index --find-links ~/wheels submitit dask-jobqueue", timeout=300)
    print(f"venv with submitit and dask-jobqueue on the login pod: {time.monotonic() - t0:.1f} s")
    return f"{HOME}/venv"


def _sbatch(login: Login, *args: str) -> str:
    out = login.run("sbatch --parsable " + " ".join(args)).stdout.strip().split(";")[0]
    assert re.fullmatch(r"\d+", out), f"sbatch printed {out!r}"
    return out


def _state(login: Login, job: str) -> str:
    return login.json(f"scontrol show job {job} --json")["jobs"][0]["job_state"][0]


def _ended(login: Login, job: str, timeout: float = 180) -> str:
    return wait_for(f"job {job} to end", lambda: (s := _state(login, job)) in FINAL and s, timeout, interval=1)


def _user_processes(pod: str, namespace: str = NAMESPACE) -> str:
    return kubectl("exec", "-n", namespace, pod, "-c", "slurmd", "--", "ps", "-u", "alice", "-o", "pid=,args=",
                   check=False).stdout.strip()


def test_srun_pty_gives_an_interactive_shell_on_a_worker(alice: Login, nodes: list[str]):
    out, status = alice.pty(f"srun -p {PARTITION} -N1 --pty bash",
                            [(PROMPT, 'echo "on $(hostname) tty $(tty)"; exit 3')], timeout=150)
    print(out)
    found = re.search(r"on (\S+) tty (/dev/pts/\d+)", out)
    assert found, out
    node = found.group(1)
    assert node in nodes, out
    assert re.search(rf"alice@{re.escape(node)}\S*[$] ", out), f"no prompt of alice on {node}:\n{out}"
    assert status == 3, f"exit status {status}, not bash's 3:\n{out}"
    assert node in worker_pods(), "the shell ran on a Slurm node without its worker pod"


def test_salloc_then_srun_inside_the_allocation(alice: Login, nodes: list[str]):
    try:
        out, status = alice.pty(f"salloc -J e2e-salloc -p {PARTITION} -N2",
                                [(PROMPT, "srun hostname; echo JOB=$SLURM_JOB_ID NODES=$SLURM_NNODES; exit")],
                                timeout=180)
    except BaseException:  # pytest.fail: a salloc left waiting would hold 2 of the 3 nodes for the tests after
        alice.run("scancel -n e2e-salloc", check=False)
        raise
    print(out)
    assert status == 0, out
    job = re.search(r"JOB=(\d+) NODES=2", out)
    assert job, out
    hosts = [line.strip() for line in out.splitlines() if line.strip() in nodes]
    assert len(hosts) == 2 and len(set(hosts)) == 2, f"srun ran on {hosts}, not once on each of 2 nodes:\n{out}"
    assert f"Granted job allocation {job.group(1)}" in out, out
    # the shell opened on the allocation's first worker (LaunchParameters=use_interactive_step)
    prompt = re.search(rf"alice@({'|'.join(map(re.escape, nodes))}):\S*[$] ", out)
    assert prompt and prompt.group(1) in hosts, f"no prompt of alice on a node of the allocation:\n{out}"
    assert _ended(alice, job.group(1), 60) == "COMPLETED"


def test_sattach_to_a_running_step(alice: Login):
    ticks_in_all = 15
    job = _sbatch(alice, f"-p {PARTITION} -N1 -o /dev/null --wrap",
                  f"\"srun bash -c 'for i in \\$(seq 1 {ticks_in_all}); do echo tick \\$i; sleep 1; done'\"")

    def step_running() -> bool:
        return f"{job}.0" in alice.run(f"squeue -h -s -j {job} -o %i", check=False).stdout

    wait_for(f"step {job}.0 to run", step_running, 150, interval=0.5)

    def attached() -> Any:
        # squeue lists a step once slurmctld made it, a moment before slurmd has its tasks
        # ("sattach: Node cpu-0: no tasks running"): attach again until it has
        result = alice.run(f"sattach {job}.0", timeout=60, check=False)
        return None if "no tasks running" in str(result.stderr) and not result.stdout else result
    result = wait_for(f"sattach to step {job}.0", attached, 10, interval=0.5)
    print(result.stdout, result.stderr)
    ticks = [int(n) for n in re.findall(r"^tick (\d+)\r?$", str(result.stdout), re.M)]
    assert ticks and ticks[-1] == ticks_in_all, (result.exit_status, result.stdout, result.stderr)
    assert ticks == list(range(ticks[0], ticks_in_all + 1)), ticks  # from where it attached to the step's end
    assert result.exit_status == 0, result.stderr
    assert _ended(alice, job, 60) == "COMPLETED"


def test_scancel_ends_a_running_job_its_processes_and_then_its_pod(alice: Login):
    """Its daemon too: `sleep 4242` double-forks away from the job (reparented to the container's
    init, out of proctrack/linuxproc's sight); the worker's Epilog kills it by its SLURM_JOB_ID."""
    daemon = "(setsid sleep 4242 </dev/null >/dev/null 2>&1 &)"
    job = _sbatch(alice, f"-p {PARTITION} -N1 -o /dev/null --wrap '{daemon}; srun sleep 600'")
    wait_for(f"job {job} to run", lambda: _state(alice, job) == "RUNNING", 150, interval=1)
    node = alice.json(f"scontrol show job {job} --json")["jobs"][0]["nodes"]
    procs = wait_for(f"sleep 600 in the pod of {node}", lambda: (p := _user_processes(node)) and "sleep 600" in p and p,
                     60)
    assert "sleep 4242" in procs, procs
    uid = worker_pods()[node]["metadata"]["uid"]
    alice.run(f"scancel {job}")
    assert _ended(alice, job, 60) == "CANCELLED"
    left = wait_for(f"alice's processes in {node} to end", lambda: _user_processes(node), 60,
                    until=lambda procs: procs == "")
    assert left == ""
    log = kubectl("logs", "-n", NAMESPACE, node, "-c", "slurmd", check=False).stdout
    assert re.search(rf"slurmk8s epilog: job {job}: killed what it left behind: \d+\(sleep\)", log), log[-2000:]
    t0 = time.monotonic()
    # idle for SuspendTime, then powered down: the pod goes (a later job on the node makes a new pod)
    wait_for(f"the worker pod of {node} to be deleted", lambda: worker_pods().get(node, {}).get("metadata", {})
             .get("uid") != uid, SUSPEND_TIME + 90, interval=1)
    print(f"scancel -> pod of {node} deleted: {time.monotonic() - t0:.1f} s (SuspendTime {SUSPEND_TIME} s)")


# Every Slurm user command Debian 13 ships (slurm-client), and sgather, which Debian does not ship
# (ours: images/userenv/sgather). Left out: sview (a GTK program; the login pod forwards no X11) and
# sh5util (reads the HDF5 job profiles of acct_gather_profile/hdf5, which the cluster does not record).
USER_COMMANDS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab",
                 "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger", "sgather")


def test_sgather_fetches_a_file_from_every_node_of_the_job(alice: Login):
    where = alice.run("for c in " + " ".join(USER_COMMANDS) + "; do command -v $c >/dev/null || echo $c; done").stdout
    assert where.strip() == "", f"missing on the login pod: {where.split()}"
    alice.run("rm -rf ~/sg; mkdir ~/sg")
    job = submit(alice, f"""#!/bin/bash
#SBATCH -p {PARTITION} -N2 -o /dev/null
srun bash -c 'hostname > /tmp/where-$SLURM_JOB_ID'
sgather /tmp/where-$SLURM_JOB_ID $HOME/sg/where; echo rc=$? > $HOME/sg/rc
srun bash -c 'test -e /tmp/where-$SLURM_JOB_ID && echo kept || echo removed' > $HOME/sg/after""")
    assert _ended(alice, job, 180) == "COMPLETED"
    got = alice.run("cd ~/sg && cat rc && for f in where.*; do echo \"$f $(cat $f)\"; done && sort after").stdout.split("\n")
    assert got[0] == "rc=0", got
    pairs = [line.split() for line in got[1:3]]
    assert len(pairs) == 2 and all(name == f"where.{host}" for name, host in pairs), got
    assert got[3:5] == ["removed", "removed"], f"sgather removes the source unless -k: {got}"


def test_array_with_a_dependent_job(alice: Login):
    alice.run("rm -rf ~/arr; mkdir ~/arr")
    array = _sbatch(alice, f"-p {PARTITION} --array=1-4 -N1 -o /dev/null --wrap",
                    "'t=$SLURM_ARRAY_TASK_ID; date +%s.%N > $HOME/arr/start-$t; sleep 3; date +%s.%N > $HOME/arr/end-$t'")
    after = _sbatch(alice, f"-p {PARTITION} --dependency=afterok:{array} -N1 -o /dev/null --wrap",
                    "'date +%s.%N > $HOME/arr/after; ls $HOME/arr > $HOME/arr/after-saw'")
    waiting = alice.json(f"scontrol show job {after} --json")["jobs"][0]
    assert (waiting["job_state"], waiting["state_reason"]) == (["PENDING"], "Dependency"), waiting["job_state"]
    assert _ended(alice, after, 240) == "COMPLETED"
    tasks = alice.json(f"scontrol show job {array} --json")["jobs"]
    states = {t["array_task_id"]["number"]: t["job_state"] for t in tasks}
    assert states == {i: ["COMPLETED"] for i in range(1, 5)}, states
    times = {}
    for line in alice.run("cd ~/arr && grep . start-* end-* after").stdout.splitlines():
        name, value = line.split(":", 1)
        times[name] = float(value)
    assert times["after"] >= max(times[f"end-{i}"] for i in range(1, 5)), times
    assert alice.run("cat ~/arr/after-saw").stdout.split().count("end-4") == 1


def test_mail_options_are_accepted_and_mail_is_dropped(alice: Login):
    config = alice.run("scontrol show config | grep -i '^MailProg'").stdout
    assert re.match(r"MailProg\s*=\s*/bin/true$", config.strip()), config
    job = _sbatch(alice, f"-p {PARTITION} -N1 --mail-type=END --mail-user=alice -o /dev/null --wrap true")
    assert _ended(alice, job) == "COMPLETED"
    info = alice.json(f"scontrol show job {job} --json")["jobs"][0]
    assert "END" in info["mail_type"] and info["mail_user"] == "alice", (info["mail_type"], info["mail_user"])
    log = kubectl("logs", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--since=10m", check=False).stdout
    mail_errors = [line for line in log.splitlines()
                   if re.search(r"mail", line, re.I) and re.search(r"error|fail|fatal", line, re.I)]
    assert not mail_errors, mail_errors


SUBMITIT = """
import socket, sys, time
import submitit

def answer(x):
    return x * 7, socket.gethostname()

executor = submitit.AutoExecutor(folder="~/submitit/%j")
executor.update_parameters(slurm_partition=sys.argv[1], timeout_min=5, nodes=1, tasks_per_node=1,
                           slurm_array_parallelism=3)
jobs = executor.map_array(answer, [1, 2, 3, 6])
print("JOBS", " ".join(job.job_id for job in jobs), flush=True)
for job in jobs:
    value, host = job.result()
    print("RESULT", job.job_id, value, host, flush=True)
# submitit follows a job's state through sacct: wait until it has every task COMPLETED there
deadline = time.time() + 120
while True:
    states = [job.get_info(mode="force").get("State", "UNKNOWN") for job in jobs]
    if all(state == "COMPLETED" for state in states) or time.time() > deadline:
        break
    time.sleep(2)
print("STATES", " ".join(states), flush=True)
"""


def test_submitit_job_array_of_python_functions(alice: Login, venv: str, nodes: list[str]):
    alice.put_file(f"{HOME}/submitit_job.py", SUBMITIT)
    t0 = time.monotonic()
    result = alice.run(f"cd ~ && {venv}/bin/python submitit_job.py {PARTITION}", timeout=300, check=False)
    print(result.stdout, str(result.stderr)[-3000:])
    assert result.exit_status == 0, str(result.stderr)[-3000:]
    results = re.findall(r"^RESULT (\S+) (\d+) (\S+)$", str(result.stdout), re.M)
    assert [int(r[1]) for r in results] == [7, 14, 21, 42], result.stdout
    assert all(r[2] in nodes for r in results), result.stdout
    # submitit read each task's final state from sacct (the session cluster has accounting)
    assert re.search(r"^STATES COMPLETED COMPLETED COMPLETED COMPLETED$", str(result.stdout), re.M), result.stdout
    array = results[0][0].split("_")[0]
    assert all(r[0].startswith(f"{array}_") for r in results), results
    print(f"submitit: 4 functions as job array {array}, results back in {time.monotonic() - t0:.1f} s")


DASK = """
import socket, sys
from dask.distributed import Client
from dask_jobqueue import SLURMCluster

cluster = SLURMCluster(cores=1, memory="1GB", processes=1, queue=sys.argv[1], walltime="00:05:00",
                       job_extra_directives=["--output=dask-worker-%j.out"])
cluster.scale(jobs=2)  # --mem=954M each: one per Slurm node (1 GiB), so one on each of 2 worker pods
client = Client(cluster)
client.wait_for_workers(2, timeout=240)
hosts = sorted(set(client.run(socket.gethostname).values()))
squares = client.map(lambda x: x * x, range(100))
total = client.submit(sum, squares).result()
print("SCHEDULER", cluster.scheduler_address, flush=True)
print("WORKERS", " ".join(hosts), flush=True)
print("SUM", total, flush=True)
client.close()
cluster.close()
"""


def test_dask_jobqueue_workers_are_slurm_jobs_that_connect_back(alice: Login, venv: str, nodes: list[str]):
    alice.put_file(f"{HOME}/dask_job.py", DASK)
    t0 = time.monotonic()
    result = alice.run(f"cd ~ && {venv}/bin/python dask_job.py {PARTITION}", timeout=360, check=False)
    print(result.stdout, str(result.stderr)[-4000:])
    if result.exit_status != 0:
        print(alice.run("tail -n 30 ~/dask-worker-*.out", check=False).stdout)
    assert result.exit_status == 0, str(result.stderr)[-4000:]
    out = str(result.stdout)
    assert re.search(r"^SUM 328350$", out, re.M), out
    workers = re.search(r"^WORKERS (.*)$", out, re.M)
    assert workers and len(set(workers.group(1).split())) == 2 and set(workers.group(1).split()) <= set(nodes), out
    (login_ip,) = [p["status"]["podIP"] for p in kjson("get", "pods", "-n", NAMESPACE, "-l",
                                                         "app.kubernetes.io/component=login")["items"]
                   if not p["metadata"].get("deletionTimestamp")]
    scheduler = re.search(r"^SCHEDULER tcp://([\d.]+):\d+$", out, re.M)
    assert scheduler and scheduler.group(1) == login_ip, out  # the login pod's address, by default
    wait_for("no dask-worker job left", lambda: alice.run("squeue -h -u alice -n dask-worker -o %i").stdout, 60,
             until=lambda left: left.strip() == "")  # cluster.close() cancelled them
    print(f"dask-jobqueue: 2 workers as Slurm jobs, sum over them in {time.monotonic() - t0:.1f} s")


# ---------------------------------------------------------------- container jobs (item 4)

OCI = "oci"
BUSYBOX_IMAGE = "slurmk8s-test/busybox-userland:3"
BUSYBOX_DOCKERFILE = """\
FROM debian:trixie-slim AS src
RUN apt-get update && apt-get install -y --no-install-recommends busybox-static
FROM scratch
COPY --from=src /bin/busybox /bin/busybox
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox mkdir -p /usr /sbin && /bin/busybox ln -s /bin /usr/bin && /bin/busybox ln -s /sbin /usr/sbin && /bin/busybox --install -s"]
RUN ["/bin/sh", "-c", "mkdir -p /etc /tmp /proc /sys /dev /home /run && printf 'NAME=\\"BusyBox\\"\\\\nID=busybox\\\\nPRETTY_NAME=\\"BusyBox userland (slurmk8s test)\\"\\\\n' >/etc/os-release"]
"""


def _docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def busybox_rootfs(tmp: Path) -> Path:
    """A researcher's local image (a BusyBox userland, built here once and kept) exported as a rootfs
    tarball, as `docker export` makes it on a workstation."""
    if _docker("image", "inspect", BUSYBOX_IMAGE, check=False).returncode != 0:
        (tmp / "Dockerfile").write_text(BUSYBOX_DOCKERFILE)
        proc = subprocess.run(["docker", "build", "-t", BUSYBOX_IMAGE, str(tmp)], capture_output=True, text=True,
                              timeout=600, env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin:/usr/local/bin"})
        if proc.returncode != 0:
            pytest.fail(f"cannot build {BUSYBOX_IMAGE} (needs Debian's mirror once):\n{proc.stderr[-3000:]}")
    cid = _docker("create", BUSYBOX_IMAGE, "/bin/sh").stdout.strip()
    try:
        tar = tmp / "busybox.tar"
        with tar.open("wb") as fh:
            subprocess.run(["docker", "export", cid], stdout=fh, check=True, timeout=120)
    finally:
        _docker("rm", "-f", cid, check=False)
    return tar


def _oci_spec(public_key: str) -> dict[str, Any]:
    doc = side_spec(public_key, OCI)
    small = {"mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m", "pod_memory_request": "128Mi",
             "domains": [{"name": "local", "count": 1}]}
    doc["pools"] = [{"name": "box", **small, "containers": True}, {"name": "plain", **small}]
    return doc


@pytest.fixture(scope="module")
def oci(cluster_reachable, tmp_path_factory) -> Iterator[Login]:
    with side_cluster(OCI, _oci_spec, tmp_path_factory.mktemp(OCI)) as login:
        yield login


def test_a_container_step_runs_in_another_userland_from_a_local_image(oci: Login, tmp_path: Path):
    namespace = f"slurm-{OCI}"
    labels = kjson("get", "namespace", namespace)["metadata"]["labels"]
    assert labels.get("pod-security.kubernetes.io/enforce") == "privileged", labels
    oci.put_files([busybox_rootfs(tmp_path)], HOME)
    t0 = time.monotonic()
    out = oci.run(f"srun -p box slurmk8s-bundle {HOME}/busybox.tar {HOME}/busybox", timeout=180)
    assert "bundle ready" in out.stdout, out
    assert "ID=debian" in oci.run("srun -p box cat /etc/os-release", timeout=120).stdout  # the worker's own
    out = oci.run(f"srun -p box --container={HOME}/busybox cat /etc/os-release", timeout=120, check=False)
    assert out.exit_status == 0, (out.stdout, out.stderr)
    assert 'NAME="BusyBox"' in out.stdout and "debian" not in out.stdout.lower(), out.stdout
    out = oci.run(f"srun -p box --container={HOME}/busybox sh -c 'ls --help 2>&1 | head -n1; id -u'", timeout=120)
    assert "BusyBox" in out.stdout and out.stdout.split()[-1] == "2001", out.stdout  # alice is alice inside too
    print(f"container job: bundle made and 3 steps in {time.monotonic() - t0:.1f} s")
    pods = {p["metadata"]["name"]: p for p in kjson("get", "pods", "-n", namespace, "-l",
                                                    "app.kubernetes.io/component=worker")["items"]}
    box = [p for name, p in pods.items() if name.startswith("box-")]
    assert box and all(p["spec"]["securityContext"]["seccompProfile"]["type"] == "Unconfined" for p in box), box
    for pod in box:
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "slurmd"]
        ctx = container["securityContext"]
        assert not ctx.get("privileged") and ctx.get("allowPrivilegeEscalation") is False, ctx
        assert ctx["capabilities"]["drop"] == ["ALL"], ctx


def test_a_pool_without_containers_cannot_and_runtime_default_seccomp_is_why(oci: Login):
    """The measure behind the opt-in, on a real Kubernetes node: pool `plain` (seccomp RuntimeDefault,
    as every worker without `containers`) refuses `--container`; and the very crun command of
    oci.conf, run by alice by hand with its state in /tmp, is refused by the kernel on `plain`
    (crun cannot create its user namespace) and runs on `box` (seccomp Unconfined)."""
    out = oci.run(f"srun -p plain --container={HOME}/busybox cat /etc/os-release", timeout=150, check=False)
    assert out.exit_status != 0 and "BusyBox" not in out.stdout, (out.stdout, out.stderr)
    plain = [p for p in kjson("get", "pods", "-n", f"slurm-{OCI}", "-l", "app.kubernetes.io/component=worker")["items"]
             if p["metadata"]["name"].startswith("plain-")]
    assert plain and all(p["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault" for p in plain)
    # the same rootfs, the command set in config.json (as Slurm sets it for each step)
    oci.run("mkdir -p ~/by-hand && python3 -c 'import json; c = json.load(open(\"busybox/config.json\")); "
            "c[\"root\"][\"path\"] = \"" + HOME + "/busybox/rootfs\"; c[\"process\"][\"args\"] = "
            "[\"cat\", \"/etc/os-release\"]; json.dump(c, open(\"by-hand/config.json\", \"w\"))'")
    crun = (f"crun --rootless=true --cgroup-manager=disabled --root=/tmp/crun-$USER run --no-new-keyring "
            f"--bundle {HOME}/by-hand by-hand-$SLURM_JOB_ID")
    refused = oci.run(f"srun -p plain bash -c '{crun}'", timeout=150, check=False)
    print(f"pool plain, --container: {out.stderr.strip()}; crun by hand: {refused.stderr.strip()}")
    assert refused.exit_status != 0 and "Operation not permitted" in refused.stderr, (refused.stdout, refused.stderr)
    ran = oci.run(f"srun -p box bash -c '{crun}'", timeout=150, check=False)
    assert ran.exit_status == 0 and 'NAME="BusyBox"' in ran.stdout, (ran.stdout, ran.stderr)
