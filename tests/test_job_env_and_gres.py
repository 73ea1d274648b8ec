"""Job environments and GPU device files (issue #15, item 5), unit level.

- A pool's job environment (``network.nccl_env``) reaches every task through Slurm's TaskProlog:
  slurm.conf names it, the worker pod carries the rendered ``export`` lines, the TaskProlog script
  of the slurmd image prints them back, and Slurm's parser of that output (modelled below on
  slurmstepd's ``_proc_stdout``) yields exactly the pool's values.
- gres.conf names the device files the pod really has: the rendered gres.conf only includes a file
  of each host, which the worker's entrypoint writes with ``images/slurmd/node-gres`` from the pod's
  ``/dev/nvidia<N>`` (a pod given GPUs 4-7 of 8 gets File=.../nvidia4..7) and which on slurmctld is
  the rendered gres-slurmctld.conf (the counts); the GPU health check verifies each configured file
  exists.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from factories import node
from provisioner import health
from provisioner import manifests as m
from provisioner.config import parse_spec
from provisioner.elastic.docker_backend import DockerConfig, container_spec
from provisioner.generate import generate
from provisioner.health import FAIL, OK, Proc, SlurmNode
from provisioner.inventory import nodes_from_api
from provisioner.render import (
    GRES_SLURMCTLD_CONF,
    NODE_GRES_CONF,
    TASK_PROLOG,
    validate_rendered,
)

ROOT = Path(__file__).resolve().parents[1]
TASK_PROLOG_SCRIPT = ROOT / "images" / "slurmd" / "task-prolog"
NODE_GRES = ROOT / "images" / "slurmd" / "node-gres"

NCCL_ENV = {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "^lo,docker",
            "UCX_TLS": "rc x"}


def spec(nccl_env=None, extra_conf=None, gpus=4):
    """Two pools: 'gpu' (slots of 4 GPUs on 8-GPU machines: each machine holds two pods, one given
    GPUs 0-3, the other 4-7) with a job environment, 'cpu' without one."""
    return parse_spec({
        "name": "je",
        "pools": [
            {"name": "gpu", "mode": "slots", "cpus": 8, "memory": "64Gi", "gpus": gpus,
             **({"gpu_type": "h100"} if gpus else {}),
             "domains": [{"name": "rack-a", "count": 2}],
             "network": {"nccl_env": NCCL_ENV if nccl_env is None else nccl_env}},
            {"name": "cpu", "node_selector": {"pool": "cpu"}},
        ],
        "users": [{"name": "alice", "uid": 2001}],
        "slurm": {"extra_conf": extra_conf or {}},
    })


def generated(s):
    return generate(s, nodes_from_api([node("c1", {"pool": "cpu"}, cpu="16", memory="64Gi")]))


def slurmstepd_env(prolog_stdout: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """What slurmstepd (24.11, src/slurmd/slurmstepd/task.c _proc_stdout) makes of a TaskProlog's
    stdout: "export NAME=value" sets NAME to everything after the first '=' up to the line's end
    (spaces before '=' trimmed from the name); "unset NAME" removes it; other lines are ignored."""
    env = dict(env or {})
    for line in prolog_stdout.split("\n"):
        if line.startswith("export "):
            name, eq, value = line[7:].lstrip().partition("=")
            if eq:
                env[name.rstrip()] = value
        elif line.startswith("unset "):
            env.pop(line[6:].strip(), None)
    return env


def run_task_prolog(job_env_file: Path | None) -> subprocess.CompletedProcess[str]:
    args = ["sh", str(TASK_PROLOG_SCRIPT)] + ([str(job_env_file)] if job_env_file else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=10)


# ---------------------------------------------------------------- the job environment


def test_slurm_conf_names_the_task_prolog_when_a_pool_has_a_job_environment():
    conf = generated(spec()).files["slurm.conf"]
    assert f"\nTaskProlog={TASK_PROLOG}\n" in conf
    assert "TaskProlog" not in generated(spec(nccl_env={})).files["slurm.conf"]


def test_a_task_prolog_of_the_users_own_replaces_ours():
    conf = generated(spec(extra_conf={"TaskProlog": "/home/shared/prolog.sh"})).files["slurm.conf"]
    assert conf.count("TaskProlog=") == 1 and "TaskProlog=/home/shared/prolog.sh" in conf


def test_worker_pod_carries_the_pools_export_lines_and_no_other_pool_does():
    s = spec()
    env = {e["name"]: e["value"] for e in m.worker_pod_template(s, s.pool("gpu"))["spec"]["containers"][0]["env"]}
    assert env["SLURMK8S_JOB_ENV"] == ("export NCCL_DEBUG=WARN\nexport NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n"
                                       "export NCCL_SOCKET_IFNAME=^lo,docker\nexport UCX_TLS=rc x\n")
    assert all(env[k] == v for k, v in NCCL_ENV.items())  # slurmd's own environment, as before
    cpu = m.worker_pod_template(s, s.pool("cpu"))["spec"]["containers"][0]["env"]
    assert "SLURMK8S_JOB_ENV" not in {e["name"] for e in cpu}


def test_task_prolog_output_gives_every_task_exactly_the_pools_values(tmp_path: Path):
    s = spec()
    job_env = tmp_path / "job-env"
    job_env.write_text(m.task_prolog_env(s.pool("gpu")))
    proc = run_task_prolog(job_env)
    assert proc.returncode == 0 and proc.stderr == ""
    # the pool's values win over what the submitter's environment had
    task = slurmstepd_env(proc.stdout, {"NCCL_DEBUG": "INFO", "HOME": "/home/alice"})
    assert task == {**NCCL_ENV, "HOME": "/home/alice"}


def test_task_prolog_prints_only_export_lines_and_never_fails(tmp_path: Path):
    job_env = tmp_path / "job-env"
    job_env.write_text("export A=1\nprint hello\nunset HOME\nexport NOVALUE\n\nexport B=x=y")  # no final newline
    proc = run_task_prolog(job_env)
    assert (proc.returncode, proc.stdout) == (0, "export A=1\nexport B=x=y\n")
    missing = run_task_prolog(tmp_path / "absent")  # a pool without a job environment, an older image
    assert (missing.returncode, missing.stdout) == (0, "")


# ---------------------------------------------------------------- GPU device files


def test_gres_conf_only_includes_each_hosts_file_and_slurmctld_keeps_the_counts():
    files = generated(spec()).files
    lines = [ln for ln in files["gres.conf"].splitlines() if ln and not ln.startswith("#")]
    assert lines == [f"Include {NODE_GRES_CONF}"]
    assert "NodeName=gpu-[0-1] State=CLOUD CPUs=8 RealMemory=65536 Gres=gpu:h100:4 " in files["slurm.conf"]
    assert "GresTypes=gpu" in files["slurm.conf"]
    # slurmctld's include: 4 GPUs per node by index (it loads them before a CLOUD node registers)
    lines = [ln for ln in files[GRES_SLURMCTLD_CONF].splitlines() if ln and not ln.startswith("#")]
    assert lines == ["NodeName=gpu-[0-1] Name=gpu Type=h100 File=/dev/nvidia[0-3]"]
    ctld = health.parse_gres_conf(files["gres.conf"], {NODE_GRES_CONF: files[GRES_SLURMCTLD_CONF]}.get)
    assert len(health.gpu_device_files(ctld, "gpu-1")) == 4
    assert m.slurm_config_map(spec(), files)["data"][GRES_SLURMCTLD_CONF] == files[GRES_SLURMCTLD_CONF]
    cpu_only = generated(spec(gpus=0)).files
    assert "gres.conf" not in cpu_only and GRES_SLURMCTLD_CONF not in cpu_only


def test_validation_refuses_node_lines_in_gres_conf():
    gen = generated(spec())
    bad = dict(gen.files, **{"gres.conf": gen.files["gres.conf"] + "NodeName=gpu-0 Name=gpu File=/dev/nvidia0\n"})
    issues = validate_rendered(bad, gen.inventory, gen.topology)
    assert [i.field for i in issues] == ["gres.conf"]
    without = {k: v for k, v in gen.files.items() if k != "gres.conf"}
    assert [i.field for i in validate_rendered(without, gen.inventory, gen.topology)] == ["gres.conf"]
    short = dict(gen.files, **{GRES_SLURMCTLD_CONF: "NodeName=gpu-0 Name=gpu File=/dev/nvidia[0-3]\n"})
    assert [i.field for i in validate_rendered(short, gen.inventory, gen.topology)] == [GRES_SLURMCTLD_CONF]


def test_gpu_worker_pods_and_containers_are_told_the_nodes_gres():
    s = spec()
    gen = generated(s)
    gpu_node = gen.inventory["gpu-1"]
    pod_env = {e["name"]: e["value"] for e in m.worker_pod(s, gpu_node)["spec"]["containers"][0]["env"]}
    assert (pod_env["SLURMK8S_GPUS"], pod_env["SLURMK8S_GPU_TYPE"]) == ("4", "h100")
    cpu_env = {e["name"] for e in m.worker_pod(s, gen.inventory["cpu-c1"])["spec"]["containers"][0]["env"]}
    assert not cpu_env & {"SLURMK8S_GPUS", "SLURMK8S_GPU_TYPE"}
    docker_env = container_spec(DockerConfig(cluster="c", network="n", controller="ctl"), gpu_node, "img")["Env"]
    assert {"SLURMK8S_GPUS=4", "SLURMK8S_GPU_TYPE=h100"} <= set(docker_env)


def fake_dev(tmp_path: Path, minors) -> Path:
    """A pod's /dev: the GPUs it was given plus the driver's other nvidia files."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [f"nvidia{i}" for i in minors] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]:
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    return dev


def node_gres(dev: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(NODE_GRES), *args], capture_output=True, text=True, timeout=10,
                          env={"PATH": "/usr/bin:/bin", "SLURMK8S_DEV_DIR": str(dev)})


def test_pod_given_gpus_4_to_7_of_8_names_those_device_files(tmp_path: Path):
    s = spec()
    gen = generated(s)
    gpu_node = gen.inventory["gpu-1"]
    pod_env = {e["name"]: e["value"] for e in m.worker_pod(s, gpu_node)["spec"]["containers"][0]["env"]}
    dev = fake_dev(tmp_path, [4, 5, 6, 7])
    proc = node_gres(dev, gpu_node.name, pod_env["SLURMK8S_GPUS"], pod_env["SLURMK8S_GPU_TYPE"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    files = ",".join(str(dev / f"nvidia{i}") for i in (4, 5, 6, 7))
    assert [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")] == [
        f"NodeName=gpu-1 Name=gpu Type=h100 File={files}"]

    # what slurmd and the health check read: the rendered gres.conf with the pod's file included
    node_conf = proc.stdout
    records = health.parse_gres_conf(gen.files["gres.conf"], {NODE_GRES_CONF: node_conf}.get, "/etc/slurm")
    configured = health.gpu_device_files(records, "gpu-1")
    assert configured == [str(dev / f"nvidia{i}") for i in (4, 5, 6, 7)]
    assert health.gpu_device_files(records, "gpu-0") == []  # another node's line is not ours
    slurm_node = SlurmNode("gpu-1", 65536, 0, 4, ("IDLE",), "")
    smi = Proc(0, "".join(f"GPU {i}: NVIDIA H100 (UUID: GPU-{i})\n" for i in range(4)))
    result = health.check_gpu(True, slurm_node, smi, Proc(0, "table"), {p: Path(p).exists() for p in configured})
    assert result.status == OK, result
    assert "nvidia4,nvidia5,nvidia6,nvidia7 present" in result.detail

    # the fixed File=/dev/nvidia[0-3] gres.conf used to say names files this pod does not have
    old = health.gpu_device_files(health.parse_gres_conf(
        "NodeName=gpu-[0-1] Name=gpu Type=h100 File=/dev/nvidia[0-3]\n", lambda p: None), "gpu-1")
    old_files = {p.replace("/dev", str(dev)): Path(p.replace("/dev", str(dev))).exists() for p in old}
    bad = health.check_gpu(True, slurm_node, smi, Proc(0, "table"), old_files)
    assert bad.status == FAIL and "4 of the 4 GPU device files in gres.conf missing" in bad.detail


def test_node_gres_counts_only_gpu_device_files_and_reports_a_mismatch(tmp_path: Path):
    dev = fake_dev(tmp_path, [0, 1, 10])
    proc = node_gres(dev, "n", "2")
    assert f"File={dev}/nvidia0,{dev}/nvidia1,{dev}/nvidia10" in proc.stdout  # numeric order, no Type
    assert "Type=" not in proc.stdout
    assert "slurm.conf gives n 2 GPU(s) but the pod has 3" in proc.stderr
    none = node_gres(tmp_path / "empty", "n", "4", "h100")
    assert none.returncode == 0 and "NodeName" not in none.stdout and "no nvidia<N> device file" in none.stderr
    cpu = node_gres(dev, "n", "0")
    assert cpu.returncode == 0 and [ln for ln in cpu.stdout.splitlines() if not ln.startswith("#")] == []
    assert node_gres(dev, "n", "four").returncode == 2


@pytest.mark.parametrize("files,expect", [
    ({}, "gres.conf names no GPU device file for this node, Gres expects 4"),
    ({"/dev/nvidia4": True, "/dev/nvidia5": False}, "1 of the 2 GPU device files in gres.conf missing: /dev/nvidia5"),
    ({f"/dev/nvidia{i}": True for i in range(3)}, "gres.conf names 3 GPU device files, Gres expects 4"),
])
def test_gpu_check_fails_on_missing_or_miscounted_device_files(files, expect):
    slurm_node = SlurmNode("g", 1024, 0, 4, ("IDLE",), "")
    result = health.check_gpu(True, slurm_node, Proc(0, "GPU 0\nGPU 1\nGPU 2\nGPU 3\n"), Proc(0, "ok"), files)
    assert (result.status, result.detail) == (FAIL, expect)


def test_health_reads_the_gres_conf_beside_slurm_conf_with_its_include(tmp_path: Path, monkeypatch):
    conf_dir = tmp_path / "conf-cache"
    conf_dir.mkdir()
    (conf_dir / "slurm.conf").write_text("ClusterName=x\n")
    node_file = tmp_path / "node-gres.conf"
    node_file.write_text("# written by the entrypoint\nNodeName=g Name=gpu File=/dev/nvidia[6-7]\n")
    (conf_dir / "gres.conf").write_text(f"# rendered\nInclude {node_file}\n")
    monkeypatch.setattr(health, "CONF_PATHS", (str(conf_dir / "slurm.conf"),))
    assert health.configured_gpu_files({}, "g") == ["/dev/nvidia6", "/dev/nvidia7"]
    assert health.configured_gpu_files({}, "other") == []


def test_hostlist_expansion_as_slurm_writes_it():
    assert health.expand_hostlist("gpu-[0-2,5],x") == ["gpu-0", "gpu-1", "gpu-2", "gpu-5", "x"]
    assert health.expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert health.expand_hostlist("/dev/nvidia[0-1],/dev/nvidia4") == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia4"]
    with pytest.raises(ValueError):
        health.expand_hostlist("n[1-")


# ---------------------------------------------------------------- the login environment of a job


def test_slurmd_reads_the_login_environment_from_the_cache_the_worker_writes():
    """--export=NONE / --get-user-env: GetEnvTimeout=0 makes slurmd read
    <StateSaveLocation>/env_cache/<user> (slurmd dies in an unprivileged pod otherwise), and the
    slurmd entrypoint writes exactly that directory."""
    spec = parse_spec({"name": "zz", "pools": [{"name": "cpu", "node_selector": {"kubernetes.io/os": "linux"}}]})
    conf = generate(spec, nodes_from_api([node("n1", {"kubernetes.io/os": "linux"})])).files["slurm.conf"]
    settings = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["GetEnvTimeout"] == "0"
    entrypoint = (ROOT / "images" / "entrypoint" / "slurmd.sh").read_text()
    assert f"write_env_cache {settings['StateSaveLocation']}/env_cache " in entrypoint


@pytest.mark.skipif(subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0",
                    reason="setpriv needs root (the entrypoint runs as root)")
def test_env_cache_gives_each_user_the_system_login_environment_with_their_own_names(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "passwd").write_text("alice:x:2001:2001:Alice:/home/alice:/bin/bash\n"
                                  "bob:x:2002:2002::/home/bob:/bin/sh\n# a comment\n\n../x:x:1:1::/:/bin/sh\n")
    cache = tmp_path / "spool" / "env_cache"
    proc = subprocess.run(["bash", "-c", f'set -euo pipefail; . {ROOT}/images/entrypoint/lib.sh; write_env_cache "$1"',
                           "_", str(cache)], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURMK8S_USERS_DIR": str(users)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "the login environment for 2 user(s)" in proc.stderr
    assert sorted(p.name for p in cache.iterdir()) == ["alice", "bob"]
    assert oct(cache.stat().st_mode & 0o777) == "0o700" and oct((cache / "alice").stat().st_mode & 0o777) == "0o600"
    alice = dict(line.split("=", 1) for line in (cache / "alice").read_text().splitlines())
    bob = dict(line.split("=", 1) for line in (cache / "bob").read_text().splitlines())
    assert (alice["HOME"], alice["USER"], alice["LOGNAME"], alice["SHELL"]) == ("/home/alice", "alice", "alice", "/bin/bash")
    assert (bob["HOME"], bob["USER"], bob["SHELL"]) == ("/home/bob", "bob", "/bin/sh")
    assert "/usr/bin" in alice["PATH"] and "sbin" not in alice["PATH"]  # a user's login PATH, not root's
    assert not {"PWD", "SHLVL", "_"} & set(alice)
