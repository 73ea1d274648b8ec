"""One user environment, login and workers alike; job environments and GPU device files as promised
(issue #15, items 1 and 5), on real daemons in containers (tests/integration/testbed.py).

- The login and slurmd images share one Python (the `userenv` stage): the same build on both, and
  a venv made in /home on the login node (with a C extension compiled there) runs unchanged in
  jobs on the workers.
- The pool's `network.nccl_env` reaches the batch step and every srun step through Slurm's
  TaskProlog, over what the submitter's environment had.
- GPU nodes: a worker given GPUs 4-7 of 8 (fake device files at /dev/nvidia4..7) names exactly
  those in its gres.conf line; slurmctld, whose include is empty, accepts the rendered gres.conf
  and counts the GPUs from slurm.conf; a job asking for 2 GPUs gets 2; the health check finds each
  configured device file.

Run: `pytest -m integration tests/integration/test_user_env.py` (Docker; the images of the current
sources, SLURMK8S_{CTLD,SLURMD,LOGIN}_IMAGE to choose them). Its own small cluster (2 nodes).
"""

from __future__ import annotations

import re
import shlex
from typing import Iterator

import pytest

from testbed import USER, Testbed, docker, wait_for

pytestmark = pytest.mark.integration

NCCL_ENV = {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "^lo,docker",
            "UCX_TLS": "rc x"}
GPU_TYPE = "nvidia_h100_80gb_hbm3"

EXT_C = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "fastext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_fastext(void) { return PyModule_Create(&mod); }
"""

PROBE = ("import sys, fastext, hello_venv; "
         "print(sys.version.replace(chr(10), ' ')); print(sys.prefix); print(hello_venv.WHERE, fastext.answer())")


@pytest.fixture(scope="module")
def bed(testbed_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    yield from Testbed(tmp_path_factory.mktemp("userenv"), node_count=2, suspend_time=30, nccl_env=NCCL_ENV,
                       gpus=4).running()


def sh(bed: Testbed, script: str, timeout: float = 120) -> str:
    return str(bed.ssh(["bash", "-c", script], timeout=timeout).stdout)


def run_job(bed: Testbed, *args: str, timeout: float = 150, env: tuple[str, ...] = ()) -> int:
    """sbatch (with `env` NAME=value set in the submitting shell) and wait for COMPLETED."""
    out = bed.ssh(["env", *env, "sbatch", "--parsable", *args]).stdout
    job = int(str(out).strip().split(";")[0])
    state = bed.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}, timeout)
    assert state == "COMPLETED", f"job {job} ended {state}: {bed.job(job).get('state_reason')}"
    return job


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_login_and_workers_run_the_same_python(bed: Testbed):
    login = sh(bed, "python3 -c 'import sys; print(sys.version)'; python3 -m pip --version; "
                    "sha256sum /usr/bin/python3.*[0-9]")
    job = run_job(bed, "-N1", "-o", f"/home/{USER}/py-%j.out", "--wrap",
                  "python3 -c 'import sys; print(sys.version)'; python3 -m pip --version; "
                  "sha256sum /usr/bin/python3.*[0-9]")
    worker = sh(bed, f"cat ~/py-{job}.out")
    print(f"login: {login}\nworker: {worker}")
    assert re.match(r"3\.\d+\.\d+ ", login), login
    assert worker == login, "the Python of the login and the worker images differ"


def test_venv_made_on_login_runs_in_jobs_on_the_workers(bed: Testbed):
    venv = f"/home/{USER}/venv"
    bed.put_file(f"/home/{USER}/fastext.c", EXT_C)
    sh(bed, f"set -e; python3 -m venv {venv}; {venv}/bin/pip --version; "
            f"site=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))'); "
            "echo \"WHERE = 'made on login'\" > $site/hello_venv.py; "
            "gcc -shared -fPIC -O2 $(python3-config --includes) ~/fastext.c "
            "-o $site/fastext$(python3-config --extension-suffix)", timeout=180)
    on_login = sh(bed, f"{venv}/bin/python -c {shlex.quote(PROBE)}")
    job = run_job(bed, "-N1", "-o", f"/home/{USER}/venv-%j.out", "--wrap",
                  f"{venv}/bin/python -c {shlex.quote(PROBE)} && srun {venv}/bin/pip --version")
    out = sh(bed, f"cat ~/venv-{job}.out").splitlines()
    assert out[:3] == on_login.splitlines(), (on_login, out)
    assert out[1] == venv and out[2] == "made on login 42"
    assert out[3].startswith("pip ") and f"{venv}/lib/python3" in out[3], out


def test_every_job_step_gets_the_pools_job_environment(bed: Testbed):
    # the submitter's own NCCL_DEBUG does not win over the pool's: the TaskProlog sets it in each task.
    # (set in the submitting shell: the --export forms have their own test below)
    job = run_job(bed, "-N1", "-o", f"/home/{USER}/env-%j.out", "--wrap", "env | sort; echo ---; srun env | sort",
                  env=("NCCL_DEBUG=INFO",))
    batch, _, step = sh(bed, f"cat ~/env-{job}.out").partition("---\n")
    for name, text in (("batch step", batch), ("srun step", step)):
        env = env_of(text)
        assert {k: env.get(k) for k in NCCL_ENV} == NCCL_ENV, f"{name}: {text}"
        assert env.get("SLURM_JOB_ID") == str(job), name


def test_gpu_worker_names_the_device_files_it_has(bed: Testbed):
    job = run_job(bed, "-N1", "--gres=gpu:2", "-o", f"/home/{USER}/gpu-%j.out", "--wrap",
                  "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; cat /run/slurmk8s/node-gres.conf; "
                  "srun --gres=gpu:1 bash -c 'echo STEP_CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'")
    out = sh(bed, f"cat ~/gpu-{job}.out")
    node = bed.job(job)["nodes"]
    files = ",".join(f"/dev/nvidia{i}" for i in (4, 5, 6, 7))
    assert f"NodeName={node} Name=gpu Type={GPU_TYPE} File={files}" in out, out
    assert "CUDA_VISIBLE_DEVICES=0,1" in out, out  # 2 of the node's 4 GPUs, by index
    assert re.search(r"STEP_CUDA_VISIBLE_DEVICES=\d", out), out
    info = bed.scontrol_json("show", "node", node)["nodes"][0]
    assert info["gres"].startswith(f"gpu:{GPU_TYPE}:4"), info["gres"]
    assert not {"DRAIN", "INVALID"} & set(info["state"]), (info["state"], info.get("reason"))

    def health_ok() -> str | None:
        log = docker("exec", node, "cat", "/var/log/slurm/healthcheck.log", check=False).stdout
        return log if "gpu: ok:" in log else None

    log = wait_for(f"the GPU health check on {node}", health_ok, 60)
    assert "device files nvidia4,nvidia5,nvidia6,nvidia7 present" in log, log


def test_export_none_and_get_user_env_run_with_the_login_environment_and_slurmd_lives(bed: Testbed):
    """Any --export but ALL makes slurmd load the user's login environment. Live, that needs a pid
    namespace an unprivileged worker cannot create: slurmd 24.11 died ("fatal: clone: Operation not
    permitted") and took the node with it. GetEnvTimeout=0 + the worker's env cache instead."""
    forms = {"none": ("--export=NONE",), "named": ("--export=FOO=bar",), "all-plus": ("--export=ALL,FOO=bar",),
             "get-user-env": ("--get-user-env",)}
    for label, opts in forms.items():
        job = run_job(bed, "-N1", *opts, "-o", f"/home/{USER}/export-{label}-%j.out", "--wrap", "env | sort",
                      env=("SUBMITTER_ONLY=1",), timeout=120)
        env = env_of(sh(bed, f"cat ~/export-{label}-{job}.out"))
        assert (env.get("HOME"), env.get("USER"), env.get("SLURM_JOB_ID")) == (f"/home/{USER}", USER, str(job)), label
        assert "/usr/bin" in env.get("PATH", ""), (label, env.get("PATH"))
        assert {k: env.get(k) for k in NCCL_ENV} == NCCL_ENV, label  # the pool's, through the TaskProlog
        if label in ("named", "all-plus"):
            assert env.get("FOO") == "bar", label
        if label in ("none", "named"):
            assert "SUBMITTER_ONLY" not in env, label  # not exported: the login environment, not the submitter's
    nodes = bed.nodes()
    assert not any({"DOWN", "NOT_RESPONDING"} & set(n.state) for n in nodes.values()), nodes
