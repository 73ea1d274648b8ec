"""A slurmk8s cluster in Docker containers, from the same images and rendered files as the pods.

slurmctld, login and the shared /home volume start with the cluster; worker (slurmd) containers
exist only while Slurm has their nodes resumed: slurmctld runs our resume / suspend programs with
the Docker backend, which reaches the engine through its socket (mounted into slurmctld for this
test bed only).

Everything a cluster creates carries the label org.slurmk8s.cluster=<token> and a unique name,
so clusters of concurrent test runs do not meet. Used by tests/integration/conftest.py and by
bench/submit_latency.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factories import node  # noqa: E402
from waiting import wait_for  # noqa: E402,F401  (the tests import it from here)

from provisioner.config import ClusterSpec, parse_spec  # noqa: E402
from provisioner.controltier.activity import port_open  # noqa: E402
from provisioner.elastic.docker_backend import LABEL_CLUSTER  # noqa: E402
from provisioner.generate import Generated, generate  # noqa: E402
from provisioner.inventory import nodes_from_api  # noqa: E402
from provisioner.manifests import worker_pod_template  # noqa: E402
from provisioner.render import Site, compress, expand, write_files  # noqa: E402

IMAGES = {
    "slurmctld": os.environ.get("SLURMK8S_CTLD_IMAGE", "slurmk8s/slurmctld:dev"),
    "slurmd": os.environ.get("SLURMK8S_SLURMD_IMAGE", "slurmk8s/slurmd:dev"),
    "login": os.environ.get("SLURMK8S_LOGIN_IMAGE", "slurmk8s/login:dev"),
}
DOCKER_SOCKET = "/var/run/docker.sock"
REPO = Path(__file__).resolve().parents[2]
USER = "alice"
UID = 2001


class TestbedError(RuntimeError):
    pass


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise TestbedError(f"docker {' '.join(args[:3])}...: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why the test bed cannot run here (None when it can)."""
    if shutil.which("docker") is None:
        return "no docker CLI (run images/ensure-docker.sh)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine answers (run images/ensure-docker.sh)"
    missing = [img for img in IMAGES.values() if docker("image", "inspect", img, check=False).returncode != 0]
    if missing:
        return f"images not built: {', '.join(missing)} (run images/build.sh)"
    if not os.path.exists(DOCKER_SOCKET):
        return f"{DOCKER_SOCKET} not found (the Docker backend in slurmctld needs it)"
    return None


@dataclass(frozen=True)
class NodeState:
    name: str
    state: tuple[str, ...]  # e.g. ("IDLE", "CLOUD", "POWERED_DOWN")
    reason: str

    @property
    def powered_down(self) -> bool:
        return "POWERED_DOWN" in self.state and "POWERING_DOWN" not in self.state


def cluster_spec(token: str, *, fast_start: bool = True, suspend_time: int = 15,
              resume_timeout: int = 60, suspend_timeout: int = 5, pubkey: str = "",
              nccl_env: dict[str, str] | None = None) -> ClusterSpec:
    return parse_spec({
        "name": f"it-{token}",
        # a requeued job may start again cred_expire + 1 s after its requeue (Slurm's default 120 s)
        "slurm": {"cluster_name": f"it_{token}", "extra_conf": {"AuthInfo": "cred_expire=30"}},
        "pools": [{"name": "cpu", "node_selector": {"pool": "cpu"}, "name_prefix": f"{token}-",
                   "reserve_cpu": "500m", "reserve_memory": "1Gi", "network": {"nccl_env": nccl_env or {}}}],
        "users": [{"name": USER, "uid": UID, "ssh_keys": [pubkey] if pubkey else []}],
        "elasticity": {"suspend_time": suspend_time, "resume_timeout": resume_timeout,
                       "suspend_timeout": suspend_timeout, "fast_start": fast_start},
        # the container test bed runs no slurmdbd (accounting is shown on Kubernetes: e2e/)
        "accounting": {"enabled": False},
    })


GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"  # Slurm GRES type nvidia_h100_80gb_hbm3


def fake_k8s_nodes(nodes: int, gpus: int = 0) -> list[dict[str, Any]]:
    # 2.5 CPUs - 0.5 reserve = 2 Slurm CPUs; 2Gi - 1Gi reserve = 1024 MiB
    labels = {"pool": "cpu", **({"nvidia.com/gpu.product": GPU_PRODUCT} if gpus else {})}
    return [node(f"n{i}", labels, cpu="2500m", memory="2Gi", gpus=gpus) for i in range(nodes)]


# TEST BED ONLY: what a GPU worker's health check needs of nvidia-smi (it lists the pod's GPUs)
FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$1" = -L ]; then
    for f in /dev/nvidia[0-9]*; do n="${f#/dev/nvidia}"; echo "GPU $n: Fake GPU (UUID: GPU-fake-$n)"; done
else
    echo "fake nvidia-smi: all GPUs healthy"
fi
"""


@dataclass
class Testbed:
    __test__ = False  # not a test class (pytest collects names starting with "Test")

    workdir: Path
    node_count: int = 4
    fast_start: bool = True
    suspend_time: int = 15
    resume_timeout: int = 60
    suspend_timeout: int = 5
    mount_source: bool = field(default_factory=lambda: os.environ.get("SLURMK8S_TEST_MOUNT_SOURCE") == "1")
    # the pool's job environment (pools[].network.nccl_env)
    nccl_env: dict[str, str] = field(default_factory=dict)
    # GPUs per node: each worker container gets the last `gpus` of 8 fake GPU device files (the host's
    # /dev/null bind-mounted at /dev/nvidia<N>: a pod given GPUs 4-7 of 8 when gpus=4) and a fake nvidia-smi
    gpus: int = 0
    token: str = field(default_factory=lambda: "t" + secrets.token_hex(3))
    started: list[str] = field(default_factory=list)

    # ------------------------------------------------------------ names

    @property
    def ctld(self) -> str:
        return f"{self.token}-ctld"

    @property
    def login(self) -> str:
        return f"{self.token}-login"

    @property
    def network(self) -> str:
        return f"{self.token}-net"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "log"

    @property
    def home_volume(self) -> str:
        return f"{self.token}-home"

    @property
    def node_names(self) -> list[str]:
        return self.generated.inventory.names

    # ------------------------------------------------------------ lifecycle

    def up(self) -> "Testbed":
        try:
            self._prepare()
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key = asyncssh.generate_private_key("ssh-ed25519")
        pubkey = self.key.export_public_key().decode().strip()
        self.spec = cluster_spec(self.token, fast_start=self.fast_start, suspend_time=self.suspend_time,
                              resume_timeout=self.resume_timeout, suspend_timeout=self.suspend_timeout, pubkey=pubkey,
                              nccl_env=self.nccl_env)
        self.generated: Generated = generate(self.spec, nodes_from_api(fake_k8s_nodes(self.node_count, self.gpus)),
                                             Site(controller_host=self.ctld))
        files = self.generated.files
        write_files(files, self.workdir / "etc-slurm")
        # per-cluster munge key, generated here, never committed; root-only on the host and in mounts
        secret = self.workdir / "secret"
        secret.mkdir(mode=0o700, exist_ok=True)
        key = secret / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        users = {"passwd": files["passwd"], "group": files["group"]}
        write_files(users, self.workdir / "users")
        # TEST BED ONLY: slurmctld's SlurmUser may use the Docker socket through a group with the
        # socket's gid (ResumeProgram runs as SlurmUser). A Kubernetes cluster uses a
        # ServiceAccount instead; no image carries this.
        sock_gid = os.stat(DOCKER_SOCKET).st_gid
        existing = docker("run", "--rm", "--entrypoint", "getent", IMAGES["slurmctld"], "group", str(sock_gid),
                          check=False).stdout.strip()
        group_name = existing.split(":", 1)[0] if existing else "slurmk8s-docker"
        write_files({"passwd": files["passwd"], "group": files["group"] + f"{group_name}:x:{sock_gid}:slurm\n"},
                    self.workdir / "users-ctld")
        keys = self.workdir / "authorized_keys"
        keys.mkdir(exist_ok=True)
        (keys / USER).write_text(pubkey + "\n")
        # the same key for root: sshd must still refuse root (PermitRootLogin no)
        (keys / "root").write_text(pubkey + "\n")
        test_dir = self.workdir / "test"
        test_dir.mkdir(exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        worker_mounts = [
            {"type": "bind", "source": str(secret), "target": "/etc/slurmk8s/secret", "read_only": True},
            {"type": "bind", "source": str(self.workdir / "users"), "target": "/etc/slurmk8s/users", "read_only": True},
            {"type": "volume", "source": self.home_volume, "target": "/home"},
        ]
        if self.gpus:
            fake = self.workdir / "fake-gpu"
            fake.mkdir(exist_ok=True)
            for minor in range(8 - self.gpus, 8):
                # a character device, as slurmd wants one (it only stats it): the host's /dev/null
                worker_mounts.append({"type": "bind", "source": "/dev/null", "target": f"/dev/nvidia{minor}",
                                      "read_only": True})
            (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
            (fake / "nvidia-smi").chmod(0o755)
            worker_mounts.append({"type": "bind", "source": str(fake / "nvidia-smi"),
                                  # where the NVIDIA runtime puts it (the check runs with no PATH)
                                  "target": "/usr/bin/nvidia-smi", "read_only": True})
        # the worker pod's environment (the pool's job environment included), as a pod would have it
        pod_container = worker_pod_template(self.spec, self.spec.pools[0])["spec"]["containers"][0]
        pod_env = pod_container["env"]
        worker_env = {e["name"]: e["value"] for e in pod_env if e["name"] != "SLURMK8S_CONTROLLER"}
        env = {
            "SLURMK8S_BACKEND": "docker",
            "SLURMK8S_DOCKER_CLUSTER": self.token,
            "SLURMK8S_DOCKER_NETWORK": self.network,
            "SLURMK8S_DOCKER_IMAGE": IMAGES["slurmd"],
            "SLURMK8S_DOCKER_MOUNTS": json.dumps(worker_mounts),
            "SLURMK8S_DOCKER_ENV": json.dumps(worker_env),
            "SLURMK8S_CONTROLLER": f"{self.ctld}:6817",
            "SLURMK8S_DOCKER_OVERRIDES": "/etc/slurmk8s/test/overrides.json",
        }
        (self.workdir / "elastic.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))

    def _run(self, name: str, image: str, *args: str) -> None:
        docker("run", "-d", "--name", name, "--hostname", name, "--network", self.network,
               "--label", f"{LABEL_CLUSTER}={self.token}", *args, image)
        self.started.append(name)

    def _start(self) -> None:
        w = self.workdir
        docker("network", "create", "--label", f"{LABEL_CLUSTER}={self.token}", self.network)
        docker("volume", "create", "--label", f"{LABEL_CLUSTER}={self.token}", self.home_volume)
        source = []
        if self.mount_source:  # develop without rebuilding the slurmctld image
            site = docker("run", "--rm", "--entrypoint", "/opt/slurmk8s/bin/python", IMAGES["slurmctld"], "-c",
                          "import provisioner, os; print(os.path.dirname(provisioner.__file__))").stdout.strip()
            source = ["-v", f"{REPO / 'provisioner'}:{site}:ro"]
        self._run(self.ctld, IMAGES["slurmctld"],
                  "-v", f"{w / 'etc-slurm'}:/etc/slurm:ro",
                  "-v", f"{w / 'secret'}:/etc/slurmk8s/secret:ro",
                  "-v", f"{w / 'users-ctld'}:/etc/slurmk8s/users:ro",
                  "-v", f"{w / 'elastic.env'}:/etc/slurmk8s/elastic.env:ro",
                  "-v", f"{w / 'test'}:/etc/slurmk8s/test:ro",
                  "-v", f"{self.log_dir}:/var/log/slurmk8s",
                  "-v", f"{DOCKER_SOCKET}:/var/run/docker.sock",  # TEST BED ONLY, see _prepare
                  *source)
        wait_for("slurmctld to answer", lambda: self.ctld_ok(), 60)
        self._run(self.login, IMAGES["login"],
                  "-e", f"SLURMK8S_CONTROLLER={self.ctld}:6817",
                  "-v", f"{w / 'secret'}:/etc/slurmk8s/secret:ro",
                  "-v", f"{w / 'users'}:/etc/slurmk8s/users:ro",
                  "-v", f"{w / 'authorized_keys'}:/etc/slurmk8s/authorized_keys:ro",
                  "-v", f"{self.home_volume}:/home")
        self.login_ip = wait_for("the login container's address", lambda: self.ip(self.login), 30)
        wait_for("sshd on the login node", lambda: port_open(self.login_ip, 22, timeout=2), 60)
        wait_for("Slurm clients on the login node",
                 lambda: self.exec(self.login, ["sinfo", "-h"], check=False).returncode == 0, 60)

    def ctld_ok(self) -> bool:
        state = docker("inspect", "-f", "{{.State.Running}}", self.ctld, check=False).stdout.strip()
        if state == "false":
            raise TestbedError(f"slurmctld exited:\n{docker('logs', self.ctld, check=False).stderr[-3000:]}")
        return self.exec(self.ctld, ["scontrol", "ping"], check=False).returncode == 0

    def ip(self, container: str) -> str | None:
        out = docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", container, check=False).stdout
        try:
            return (json.loads(out).get(self.network) or {}).get("IPAddress") or None
        except json.JSONDecodeError:
            return None

    def save_logs(self) -> None:
        """Container logs next to the elastic log, for after-the-fact debugging."""
        if not self.log_dir.is_dir():
            return
        for name in self.started:
            proc = docker("logs", name, check=False)
            (self.log_dir / f"{name}.docker.log").write_text(proc.stdout + proc.stderr)

    def down(self) -> None:
        try:
            self.save_logs()
        except (OSError, subprocess.SubprocessError, TestbedError) as err:
            print(f"testbed {self.token}: could not save logs: {err}", file=sys.stderr)
        # slurmctld first: its resume program may still be creating workers
        docker("rm", "-f", "-v", self.ctld, check=False)
        ids = docker("ps", "-aq", "--filter", f"label={LABEL_CLUSTER}={self.token}", check=False).stdout.split()
        if ids:
            docker("rm", "-f", "-v", *ids, check=False)
        docker("network", "rm", self.network, check=False)
        docker("volume", "rm", "-f", self.home_volume, check=False)
        shutil.rmtree(self.workdir / "secret", ignore_errors=True)

    def running(self) -> Iterator["Testbed"]:
        """Up for the body of a fixture, down afterwards (logs kept): `yield from bed.running()`."""
        self.up()
        try:
            yield self
        finally:
            self.down()
            print(f"\ntestbed {self.token}: logs kept in {self.log_dir}")

    # ------------------------------------------------------------ observing

    def exec(self, container: str, argv: Sequence[str], *, user: str | None = None, check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        args = ["exec"] + (["-u", user] if user else []) + [container, *argv]
        return docker(*args, check=check, timeout=timeout)

    def scontrol_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.exec(self.ctld, ["scontrol", *args, "--json"]).stdout)

    def nodes(self) -> dict[str, NodeState]:
        data = self.scontrol_json("show", "nodes")
        return {n["name"]: NodeState(n["name"], tuple(n["state"]), n.get("reason") or "") for n in data["nodes"]}

    def job(self, job_id: int) -> dict[str, Any]:
        return self.scontrol_json("show", "job", str(job_id))["jobs"][0]

    def job_state(self, job_id: int) -> str:
        """The base state, except that a job still waiting for its nodes to boot is CONFIGURING
        (Slurm's JSON says ["RUNNING", "CONFIGURING"] then)."""
        states = self.job(job_id)["job_state"]
        return "CONFIGURING" if "CONFIGURING" in states else states[0]

    def workers(self) -> dict[str, str]:
        """Worker containers of this cluster: name -> docker state."""
        out = docker("ps", "-a", "--filter", f"label={LABEL_CLUSTER}={self.token}",
                     "--filter", "label=org.slurmk8s.role=slurmd", "--format", "{{.Names}} {{.State}}").stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if line.strip())

    def sinfo_states(self) -> dict[str, str]:
        out = self.exec(self.ctld, ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def elastic_log(self) -> str:
        path = self.log_dir / "elastic.log"
        return path.read_text() if path.exists() else ""

    def set_overrides(self, overrides: dict[str, Any]) -> None:
        path = self.workdir / "test" / "overrides.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(overrides))
        tmp.chmod(0o644)
        os.replace(tmp, path)

    def wait_all_powered_down(self, timeout: float = 120) -> None:
        def done() -> bool:
            nodes = self.nodes()
            return all(n.powered_down for n in nodes.values()) and not self.workers()

        wait_for("every node powered down and no worker container", done, timeout, interval=1)

    def power_down_all(self, timeout: float = 120) -> None:
        """Force every node to power down now (Slurm runs our suspend program) and wait for it."""
        names = [n.name for n in self.nodes().values() if not n.powered_down]
        if names:
            self.exec(self.ctld, ["scontrol", "update", f"nodename={compress(names)}", "state=POWER_DOWN_FORCE"],
                      check=False)
        self.wait_all_powered_down(timeout)

    # ------------------------------------------------------------ as the user, over SSH

    async def _ssh_run(self, argv: Sequence[str], timeout: float, username: str) -> asyncssh.SSHCompletedProcess:
        async with asyncssh.connect(self.login_ip, username=username, client_keys=[self.key], known_hosts=None,
                                    password=None, preferred_auth=("publickey",)) as conn:
            return await asyncio.wait_for(conn.run(shlex.join(argv), check=False), timeout)

    def ssh(self, argv: Sequence[str], *, timeout: float = 60, check: bool = True,
            username: str = USER) -> asyncssh.SSHCompletedProcess:
        """Run argv on the login node as `username`, logged in with the user's SSH key."""
        result = asyncio.run(self._ssh_run(argv, timeout, username))
        if check and result.exit_status != 0:
            raise TestbedError(f"ssh {username}@login {shlex.join(argv)}: exit {result.exit_status}: "
                               f"{str(result.stderr).strip()}")
        return result

    def put_file(self, path: str, text: str) -> None:
        """Write a file as the user (through SFTP)."""
        async def go() -> None:
            async with asyncssh.connect(self.login_ip, username=USER, client_keys=[self.key], known_hosts=None) as conn:
                async with conn.start_sftp_client() as sftp:
                    async with sftp.open(path, "w") as fh:
                        await fh.write(text)

        asyncio.run(go())

    def sbatch(self, *args: str) -> int:
        out = self.ssh(["sbatch", "--parsable", *args]).stdout
        return int(str(out).strip().split(";")[0])

    def wait_job(self, job_id: int, states: set[str], timeout: float) -> str:
        def reached() -> str | None:
            state = self.job_state(job_id)
            return state if state in states else None

        return wait_for(f"job {job_id} to reach {sorted(states)}", reached, timeout)

    def hosts(self, expr: str) -> list[str]:
        return expand(expr)
