"""The images' identity as `slurmk8s up`'s image check sees it (provisioner/deploy/imagecheck.py), on
the real images in Docker: each runs with its own ENTRYPOINT and CMD plus SLURMK8S_IDENTIFY=1, as
the check pod runs it, and its output goes through the same decision as the pod's log.

- slurmk8s/slurmd:dev is a worker image, slurmk8s/login:dev a login image; slurmk8s/mariadb:dev is
  refused as a pool image, slurmd as images.login, plain Debian as either;
- images derived FROM slurmd (a file added, no network needed): accepted; with a CMD, with their own
  ENTRYPOINT, or without python3: refused, each saying why.

Images built before the identity (no org.slurmk8s.interface label) go the older way (their entrypoint
logs as slurmk8s-<role> and stops at the missing munge key / controller); both are covered.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess

import pytest

from provisioner.deploy import imagecheck as ic

pytestmark = pytest.mark.integration

IMAGES = {
    "slurmd": os.environ.get("SLURMK8S_SLURMD_IMAGE", "slurmk8s/slurmd:dev"),
    "login": os.environ.get("SLURMK8S_LOGIN_IMAGE", "slurmk8s/login:dev"),
    "mariadb": os.environ.get("SLURMK8S_MARIADB_IMAGE", "slurmk8s/mariadb:dev"),
}


def docker(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def engine() -> None:
    if not shutil.which("docker") or docker("info", timeout=20).returncode != 0:
        pytest.skip("no Docker engine answers")
    missing = [i for i in IMAGES.values() if docker("image", "inspect", i).returncode != 0]
    if missing:
        pytest.skip(f"images not built: {', '.join(missing)} (images/build.sh)")


def labels(image: str) -> dict[str, str]:
    return json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", image).stdout) or {}


def judge(image: str, role: str = "slurmd", field: str = "pools[p].image"):
    """Run `image` as the check pod does and decide as `up` does: (issue, line, outcome kind)."""
    proc = docker("run", "--rm", "-e", "SLURMK8S_IDENTIFY=1", image, timeout=60)
    out = ic.outcome("done", f"exit {proc.returncode}", 0, waited=1, log=proc.stdout + proc.stderr)
    issue, line = ic.verdict(ic.Want(image, role, (field,)), out, base=IMAGES["slurmd"], local=True)
    return issue, line, out.kind


def test_the_product_images_identify_as_their_role(engine):
    for role in ("slurmd", "login"):
        image = IMAGES[role]
        issue, line, kind = judge(image, role, "images.worker" if role == "slurmd" else "images.login")
        assert issue is None, str(issue)
        if ic.INTERFACE_LABEL in labels(image):
            want = f"{image}: slurmk8s {role} image (interface {ic.IMAGE_INTERFACE}, "
            assert kind == "identified" and line.startswith(want), line
        else:
            assert "from before image identity" in line, line
    issue, _, _ = judge(IMAGES["mariadb"])
    assert issue.message.startswith(f"{IMAGES['mariadb']} is not a slurmk8s worker image") and \
        "the slurmk8s mariadb image" in issue.message, issue.message
    issue, _, _ = judge(IMAGES["slurmd"], "login", "images.login")
    assert "is not a slurmk8s login image" in issue.message and "slurmd" in issue.message, issue.message


@pytest.fixture(scope="module")
def derived(engine, tmp_path_factory):
    """Images FROM slurmd, built without network (COPY and RUN only); removed afterwards."""
    made: dict[str, str] = {}
    base = IMAGES["slurmd"]
    variants = {
        "plain": f"FROM {base}\nCOPY tool /opt/lab/bin/tool\n",
        "cmd": f"FROM {base}\nCMD [\"bash\"]\n",
        "entrypoint": f"FROM {base}\nENTRYPOINT [\"/bin/sh\", \"-c\", \"echo lab entrypoint\"]\n",
        "nopython": f"FROM {base}\nRUN rm -f /usr/bin/python3\n",
    }
    token = secrets.token_hex(4)
    env = {**os.environ} if docker("buildx", "version").returncode == 0 else {**os.environ, "DOCKER_BUILDKIT": "0"}
    for name, text in variants.items():
        ctx = tmp_path_factory.mktemp(name)
        (ctx / "Containerfile").write_text(text)
        (ctx / "tool").write_text("#!/bin/sh\necho lab tool\n")
        tag = f"slurmk8s-it/derived-{name}:{token}"
        subprocess.run(["docker", "build", "-q", "-f", str(ctx / "Containerfile"), "-t", tag, str(ctx)],
                       capture_output=True, text=True, timeout=300, check=True, env=env)
        made[name] = tag
    yield made
    docker("image", "rm", "-f", *made.values())


def test_derived_images_keep_the_identity_unless_they_break_the_contract(derived):
    identified = ic.INTERFACE_LABEL in labels(IMAGES["slurmd"])
    assert labels(derived["plain"]).get(ic.ROLE_LABEL) == "slurmd", "the labels are inherited"
    issue, line, _ = judge(derived["plain"])
    assert issue is None, str(issue)
    issue, _, _ = judge(derived["entrypoint"])
    assert issue is not None and "is not a slurmk8s worker image (no /usr/local/sbin/slurmk8s-identify answered" \
        in issue.message and "lab entrypoint" in issue.message, issue.message
    if not identified:
        pytest.skip(f"{IMAGES['slurmd']} predates the identity: CMD and lost files are told apart only by it")
    issue, _, _ = judge(derived["cmd"])
    assert issue.message == f"{derived['cmd']} sets CMD ('bash'), which the entrypoint would append to slurmd's command line"
    issue, _, _ = judge(derived["nopython"])
    assert issue.message == (f"{derived['nopython']} is a slurmk8s slurmd image but lacks what a worker needs: "
                             "/usr/bin/python3")
