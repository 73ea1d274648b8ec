"""Container jobs (issue #15 item 4) on real daemons in containers (tests/integration/testbed.py):
a pool with `containers: true`, its worker containers confined as the worker pod is (capabilities
drop ALL + the base ones, no-new-privileges, the pod's seccomp profile: Unconfined), and alice, over
SSH on the login node, runs a job step in another userland than the worker's:

- the image is local, no registry: a BusyBox userland built here with `docker build`, exported
  with `docker export` into a rootfs tarball and copied into alice's home (as a researcher copies
  a file with scp);
- on a worker, as alice: `slurmk8s-bundle ~/busybox.tar ~/busybox` unpacks it into an OCI bundle
  (rootfs + a rootless config.json fit for a worker pod);
- `srun --container=$HOME/busybox cat /etc/os-release` prints BusyBox's os-release, not Debian's;
  the step runs as alice (uid 2001 in the container's user namespace).

And the measure behind the seccomp profile: in a worker confined with RuntimeDefault (Docker's
default profile, like containerd's), the same step fails: crun cannot create the user namespace.

Run: `pytest -m integration tests/integration/test_container_jobs.py` (Docker; the slurmd image of
the current sources, SLURMK8S_SLURMD_IMAGE to choose it; BUSYBOX_IMAGE is built once from Debian's
busybox-static, which needs Debian's mirror the first time). Its own cluster (1 node).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from testbed import USER, Testbed, docker

pytestmark = pytest.mark.integration

HOME = f"/home/{USER}"
BUSYBOX_IMAGE = "slurmk8s-test/busybox-userland:3"
BUSYBOX_DOCKERFILE = """\
FROM debian:trixie-slim AS src
RUN apt-get update && apt-get install -y --no-install-recommends busybox-static
FROM scratch
COPY --from=src /bin/busybox /bin/busybox
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox mkdir -p /usr /sbin && /bin/busybox ln -s /bin /usr/bin && /bin/busybox ln -s /sbin /usr/sbin && /bin/busybox --install -s"]
RUN ["/bin/sh", "-c", "mkdir -p /etc /tmp /proc /sys /dev /home /run && printf 'NAME=\\"BusyBox\\"\\\\nID=busybox\\\\nPRETTY_NAME=\\"BusyBox userland (slurmk8s test)\\"\\\\n' >/etc/os-release"]
"""


def busybox_rootfs(tmp: Path) -> Path:
    """The BusyBox image (built once, kept) exported as a flat rootfs tarball."""
    if docker("image", "inspect", BUSYBOX_IMAGE, check=False).returncode != 0:
        (tmp / "Dockerfile").write_text(BUSYBOX_DOCKERFILE)
        proc = subprocess.run(["docker", "build", "-t", BUSYBOX_IMAGE, str(tmp)], capture_output=True, text=True,
                              timeout=600, env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin:/usr/local/bin"})
        if proc.returncode != 0:
            pytest.fail(f"cannot build {BUSYBOX_IMAGE} (needs Debian's mirror once):\n{proc.stderr[-3000:]}")
    cid = docker("create", BUSYBOX_IMAGE, "/bin/sh").stdout.strip()
    try:
        tar = tmp / "busybox.tar"
        with tar.open("wb") as fh:
            subprocess.run(["docker", "export", cid], stdout=fh, check=True, timeout=120)
    finally:
        docker("rm", "-f", cid, check=False)
    return tar


def _bed(tmp_path_factory, name: str, **kw) -> Iterator[Testbed]:
    bed = Testbed(tmp_path_factory.mktemp(name), node_count=1, suspend_time=60, resume_timeout=90,
                  pod_security=True, **kw)
    yield from bed.running()


@pytest.fixture(scope="module")
def oci_bed(testbed_available, tmp_path_factory) -> Iterator[Testbed]:
    # mount_source: the Docker backend that confines workers (SLURMK8S_DOCKER_SECURITY) is this checkout's
    yield from _bed(tmp_path_factory, "oci", containers=True, mount_source=True)


def _put_bundle(bed: Testbed, tmp: Path) -> None:
    bed.put_files([busybox_rootfs(tmp)], HOME)
    out = bed.ssh(["srun", "-N1", "slurmk8s-bundle", f"{HOME}/busybox.tar", f"{HOME}/busybox"], timeout=180)
    assert "bundle ready" in str(out.stdout), out


def test_a_step_runs_in_another_userland(oci_bed: Testbed, tmp_path: Path):
    bed = oci_bed
    assert "oci.conf" in bed.generated.files
    _put_bundle(bed, tmp_path)
    # the worker's own userland first: Debian
    assert 'ID=debian' in str(bed.ssh(["srun", "-N1", "cat", "/etc/os-release"], timeout=120).stdout)
    out = bed.ssh(["srun", "-N1", f"--container={HOME}/busybox", "cat", "/etc/os-release"], timeout=120, check=False)
    assert out.exit_status == 0, (out.stdout, out.stderr)
    assert 'NAME="BusyBox"' in str(out.stdout) and "debian" not in str(out.stdout).lower(), out.stdout
    # BusyBox's tools, not coreutils; as alice
    out = bed.ssh(["srun", "-N1", f"--container={HOME}/busybox", "sh", "-c", "ls --help 2>&1 | head -n1; id -u"],
                  timeout=120)
    lines = str(out.stdout).split()
    assert "BusyBox" in str(out.stdout) and lines[-1] == "2001", out.stdout  # alice is alice inside too


def test_runtime_default_seccomp_refuses_the_user_namespace(testbed_available, tmp_path_factory, tmp_path: Path):
    """The measure behind seccomp Unconfined: a worker confined with RuntimeDefault (Docker's default
    profile) cannot run the same step; crun fails creating the user namespace."""
    gen = _bed(tmp_path_factory, "oci-default", containers=True, mount_source=True, seccomp_override="RuntimeDefault")
    bed = next(gen)
    try:
        _put_bundle(bed, tmp_path)
        out = bed.ssh(["srun", "-N1", f"--container={HOME}/busybox", "cat", "/etc/os-release"], timeout=120,
                      check=False)
        assert out.exit_status != 0
        # crun (1.21) creating the user namespace under Docker's default profile
        assert "clone: Operation not permitted" in str(out.stderr), (out.stdout, out.stderr)
    finally:
        gen.close()
