"""Smoke test of the images (images/): slurmctld + one slurmd + login as plain, unprivileged
Docker containers on a user-defined network, wired only through the entrypoint contract of
images/README.md (mounted munge key, users, authorized keys, slurm.conf; SLURMK8S_* env).

A user logs into login over SSH with a key (host's ssh client) and runs `srun -N1 hostname`;
password and root logins are refused; no secret is baked into an image.

Integration tier: `pytest -m integration tests/test_images.py`. Needs a Docker engine
(images/ensure-docker.sh) and the images built from the current sources (images/build.sh);
SLURMK8S_{CTLD,SLURMD,LOGIN}_IMAGE override the images used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
BUILD_SH = REPO / "images" / "build.sh"
ENV_OVERRIDE = {"slurmctld": "SLURMK8S_CTLD_IMAGE", "slurmd": "SLURMK8S_SLURMD_IMAGE", "login": "SLURMK8S_LOGIN_IMAGE"}
USER, UID = "smokeuser", 23456

SLURM_CONF = """\
ClusterName=imgsmoke
SlurmctldHost=ctl
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
SlurmctldParameters=enable_configless
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=pmix
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SelectType=select/cons_tres
NodeName=node1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=node1 Default=YES MaxTime=INFINITE State=UP
"""


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def engine_unavailable() -> str | None:
    if not shutil.which("docker"):
        return "no docker CLI on PATH (run images/ensure-docker.sh)"
    try:
        if subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode != 0:
            return "no Docker engine answers (run images/ensure-docker.sh)"
    except subprocess.TimeoutExpired:
        return "`docker info` timed out (run images/ensure-docker.sh)"
    return None


def image_exists(image: str) -> bool:
    return docker("image", "inspect", image, check=False).returncode == 0


def resolve_images() -> dict[str, str]:
    """Images to test: the env overrides, else the content-hash tags of the current sources,
    else (with a warning: they may be stale) the :dev tags."""
    tags = {}
    proc = subprocess.run(["bash", str(BUILD_SH), "--tags"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        name, _, tag = line.partition("=")
        tags[name] = tag
    images: dict[str, str] = {}
    for name, env in ENV_OVERRIDE.items():
        image = os.environ.get(env) or tags[name]
        if not image_exists(image) and not os.environ.get(env):
            dev = tags[name].rsplit(":", 1)[0] + ":dev"
            if image_exists(dev):
                warnings.warn(f"{image} (current sources) not built: testing {dev}, which may be stale "
                              "(run images/build.sh)", stacklevel=1)
                image = dev
        if not image_exists(image):
            pytest.skip(f"image {image} not built (run images/build.sh)")
        images[name] = image
    return images


@dataclass
class Smoke:
    token: str
    work: Path
    images: dict[str, str]
    containers: list[str] = field(default_factory=list)
    network: str = ""
    volume: str = ""
    ssh_port: int = 0

    def name(self, role: str) -> str:
        return f"slurmk8s-imgsmoke-{self.token}-{role}"

    def run(self, role: str, image: str, *args: str, mounts: tuple[tuple[str, str], ...] = (),
            env: dict[str, str] | None = None, alias: str | None = None) -> str:
        name = self.name(role)
        argv = ["run", "-d", "--name", name, "--hostname", alias or role, "--network", self.network,
                "--network-alias", alias or role, "--label", f"slurmk8s.test={self.token}"]
        for src, dst in mounts:
            argv += ["-v", f"{src}:{dst}"]
        for key, value in (env or {}).items():
            argv += ["-e", f"{key}={value}"]
        docker(*argv, *args, image)
        self.containers.append(name)
        return name

    def exec(self, role: str, *cmd: str, user: str | None = None, timeout: float = 60,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["exec", *(["-u", user] if user else []), self.name(role), *cmd]
        return docker(*argv, timeout=timeout, check=check)

    def ssh(self, user: str, command: str, *opts: str, key: Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", "-p", str(self.ssh_port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                "-o", "IdentitiesOnly=yes", "-F", "/dev/null"]
        argv += ["-i", str(key)] if key else ["-o", "PubkeyAuthentication=no"]
        argv += [*opts, f"{user}@127.0.0.1", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def logs(self) -> str:
        out = []
        for name in self.containers:
            proc = docker("logs", "--tail", "60", name, check=False)
            out.append(f"===== {name}\n{proc.stdout}{proc.stderr}")
        return "\n".join(out)

    def cleanup(self) -> None:
        for name in self.containers:
            docker("rm", "-f", "-v", name, check=False)
        if self.network:
            docker("network", "rm", self.network, check=False)
        if self.volume:
            docker("volume", "rm", "-f", self.volume, check=False)


def wait_for(what: str, probe, timeout: float, smoke: Smoke) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{smoke.logs()}")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Smoke]:
    reason = engine_unavailable()
    if reason:
        pytest.skip(reason)
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip("no OpenSSH client (ssh, ssh-keygen) on this machine")
    images = resolve_images()

    work = tmp_path_factory.mktemp("imgsmoke")
    s = Smoke(token=uuid.uuid4().hex[:10], work=work, images=images)
    (work / "secret").mkdir()
    (work / "secret" / "munge.key").write_bytes(os.urandom(1024))
    (work / "secret" / "munge.key").chmod(0o600)
    (work / "users").mkdir()
    (work / "users" / "passwd").write_text(f"{USER}:x:{UID}:{UID}:Smoke User:/home/{USER}:/bin/bash\n")
    (work / "users" / "group").write_text(f"{USER}:x:{UID}:\n")
    (work / "conf").mkdir()
    (work / "conf" / "slurm.conf").write_text(SLURM_CONF)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "imgsmoke", "-f", str(work / "id_user")],
                   check=True, timeout=30)
    (work / "authorized_keys").mkdir()
    shutil.copy(work / "id_user.pub", work / "authorized_keys" / USER)

    common = ((str(work / "secret"), "/etc/slurmk8s/secret:ro"), (str(work / "users"), "/etc/slurmk8s/users:ro"))
    try:
        s.network = f"slurmk8s-imgsmoke-{s.token}"
        docker("network", "create", "--label", f"slurmk8s.test={s.token}", s.network)
        s.volume = f"slurmk8s-imgsmoke-{s.token}-home"
        docker("volume", "create", "--label", f"slurmk8s.test={s.token}", s.volume)
        home = ((s.volume, "/home"),)

        s.run("ctl", images["slurmctld"], mounts=common + ((str(work / "conf"), "/etc/slurm:ro"),))
        s.run("node1", images["slurmd"], mounts=common + home, env={"SLURMK8S_CONTROLLER": "ctl"})
        s.run("login", images["login"], "-p", "127.0.0.1::22",
              mounts=common + home + ((str(work / "authorized_keys"), "/etc/slurmk8s/authorized_keys:ro"),),
              env={"SLURMK8S_CONTROLLER": "ctl:6817"})
        port = docker("port", s.name("login"), "22/tcp").stdout.split()[0].rsplit(":", 1)[1]
        s.ssh_port = int(port)

        def node_idle() -> bool:
            proc = s.exec("login", "sinfo", "-h", "-N", "-n", "node1", "-o", "%T", check=False, timeout=20)
            return proc.returncode == 0 and proc.stdout.strip() == "idle"

        wait_for("node1 idle in sinfo on login", node_idle, 90, s)
        wait_for("sshd on login", lambda: s.ssh(USER, "true", key=work / "id_user").returncode == 0, 30, s)
        yield s
    finally:
        s.cleanup()


def test_ssh_key_login_and_srun(smoke: Smoke) -> None:
    proc = smoke.ssh(USER, "id -u; stat -c '%U %a' \"$HOME\"; srun --immediate=30 -N1 hostname",
                     key=smoke.work / "id_user", timeout=90)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{smoke.logs()}"
    assert proc.stdout.split() == [str(UID), USER, "700", "node1"], proc.stdout


def test_mpi_pmix_job(smoke: Smoke) -> None:
    src = (
        "#include <mpi.h>\n#include <stdio.h>\n"
        "int main(int c, char **v) { int r, n, x, s; MPI_Init(&c, &v);"
        " MPI_Comm_rank(MPI_COMM_WORLD, &r); MPI_Comm_size(MPI_COMM_WORLD, &n); x = r + 41;"
        " MPI_Allreduce(&x, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);"
        " printf(\"sum=%d size=%d\\n\", s, n); MPI_Finalize(); return 0; }\n"
    )
    cmd = f"cat > hello.c <<'EOF'\n{src}EOF\nmpicc -o hello hello.c && srun --immediate=30 --mpi=pmix -N1 -n1 ./hello"
    proc = smoke.ssh(USER, cmd, key=smoke.work / "id_user", timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{smoke.logs()}"
    assert "sum=41 size=1" in proc.stdout


def test_password_login_refused(smoke: Smoke) -> None:
    proc = smoke.ssh(USER, "true", "-o", "PreferredAuthentications=password,keyboard-interactive", "-v")
    assert proc.returncode == 255
    assert "Authentications that can continue: publickey\n" in proc.stderr, proc.stderr


def test_root_login_refused_even_with_key(smoke: Smoke) -> None:
    smoke.exec("login", "cp", f"/etc/ssh/authorized_keys/{USER}", "/etc/ssh/authorized_keys/root")
    try:
        proc = smoke.ssh("root", "true", key=smoke.work / "id_user")
    finally:
        smoke.exec("login", "rm", "-f", "/etc/ssh/authorized_keys/root")
    assert proc.returncode == 255
    assert "ROOT LOGIN REFUSED" in docker("logs", smoke.name("login")).stderr


def test_daemons_users_and_key_permissions(smoke: Smoke) -> None:
    for role in ("ctl", "node1", "login"):
        stat = smoke.exec(role, "stat", "-c", "%U:%G %a", "/etc/munge/munge.key").stdout.strip()
        assert stat == "munge:munge 400", (role, stat)
        assert smoke.exec(role, "getent", "passwd", USER).stdout.split(":")[2] == str(UID)
        inspect = docker("inspect", "-f", "{{.HostConfig.Privileged}} {{.HostConfig.CapAdd}}", smoke.name(role))
        assert inspect.stdout.strip() in ("false []", "false <nil>"), inspect.stdout
    ps = smoke.exec("ctl", "ps", "-o", "user=,comm=", "-e").stdout
    assert any(line.split() == ["slurm", "slurmctld"] for line in ps.splitlines()), ps
    assert smoke.exec("ctl", "stat", "-c", "%U", "/var/spool/slurmctld").stdout.strip() == "slurm"


def test_login_with_mounted_slurm_conf(smoke: Smoke) -> None:
    """The other client-config mode: slurm.conf mounted at /etc/slurm, no sackd."""
    work = smoke.work
    name = smoke.run("login2", smoke.images["login"], mounts=(
        (str(work / "secret"), "/etc/slurmk8s/secret:ro"), (str(work / "users"), "/etc/slurmk8s/users:ro"),
        (str(work / "conf"), "/etc/slurm:ro")))
    wait_for("login2 entrypoint", lambda: "exec sshd" in docker("logs", name, check=False).stderr, 30, smoke)
    assert "clients use the mounted /etc/slurm/slurm.conf" in docker("logs", name).stderr
    proc = smoke.exec("login2", "srun", "--immediate=30", "-N1", "hostname", user=USER, timeout=90)
    assert proc.stdout.strip() == "node1"
    started = time.monotonic()
    docker("stop", "-t", "20", name)
    assert time.monotonic() - started < 5, "login container took long to stop: signals not forwarded?"


@pytest.mark.parametrize("role", ["slurmctld", "slurmd", "login"])
def test_no_secret_baked_in(smoke: Smoke, role: str) -> None:
    proc = docker("run", "--rm", "--entrypoint", "sh", smoke.images[role], "-c",
                  "ls /etc/munge/munge.key /etc/ssh/ssh_host_* 2>/dev/null; "
                  "find / -xdev \\( -name '*.key' -o -name 'id_rsa' -o -name 'id_ed25519' \\) -type f 2>/dev/null",
                  check=False)
    assert proc.stdout.strip() == "", f"secret-like files in {smoke.images[role]}:\n{proc.stdout}"


def test_missing_munge_key_fails_clearly(smoke: Smoke) -> None:
    proc = docker("run", "--rm", "-e", "SLURMK8S_CONTROLLER=ctl", smoke.images["slurmd"], check=False, timeout=60)
    assert proc.returncode != 0
    assert "munge key not found at /etc/slurmk8s/secret/munge.key" in proc.stderr
