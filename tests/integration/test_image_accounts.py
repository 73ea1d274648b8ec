"""Every account of every image is one the spec validation knows (provisioner/accounts.py IMAGE_USERS,
IMAGE_GROUPS): a spec user or group that reused one would be merged into it by the entrypoint. A
new package that adds a system account to an image fails here until the names list it."""

from __future__ import annotations

import subprocess

import pytest

from provisioner.accounts import IMAGE_GROUPS, IMAGE_USERS

pytestmark = pytest.mark.integration

IMAGES = [f"slurmk8s/{name}:dev" for name in ("slurmctld", "slurmd", "login", "slurmdbd", "mariadb", "slurmrestd")]


def _entries(image: str, path: str) -> dict[str, int]:
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", image, path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"docker run {image} cat {path}: {proc.stderr.strip()} (build the images: images/build.sh)"
    return {f[0]: int(f[2]) for f in (line.split(":") for line in proc.stdout.splitlines() if line)}


@pytest.mark.parametrize("image", IMAGES)
def test_the_spec_validation_knows_every_account_of_the_image(image: str):
    users, groups = _entries(image, "/etc/passwd"), _entries(image, "/etc/group")
    assert {n: i for n, i in users.items() if IMAGE_USERS.get(n) != i} == {}, "add to accounts.IMAGE_USERS"
    assert {n: i for n, i in groups.items() if IMAGE_GROUPS.get(n) != i} == {}, "add to accounts.IMAGE_GROUPS"
