"""stacks/Pulumi.yaml's declared config, judged by the real Pulumi CLI (the toolchain's, as `slurmk8s
up` finds it) before any program runs: a stack missing a required value, holding a secret in plain
text or a value of the wrong type is refused, naming the key; a complete one gets past validation
(this machine has no Python language host, so `pulumi preview` then stops there, which the test
takes as the sign that the config passed). Needs no cluster: in this tier because it needs the
Pulumi CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner.deploy.automation import find_toolchain
from provisioner.deploy.keys import DB_PASSWORD, HOST_KEYS, MUNGE_KEY

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
# the stack's required secrets (the JWT key is optional: stacks without REST lack it)
SECRETS = (MUNGE_KEY, DB_PASSWORD, *HOST_KEYS.values())


@pytest.fixture
def stack(tmp_path: Path):
    project = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", project, ignore=shutil.ignore_patterns("Pulumi.*.yaml", "__pycache__"))
    (tmp_path / "state").mkdir()
    env = {**os.environ, "PULUMI_HOME": str(tmp_path / "home"), "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
           "PULUMI_CONFIG_PASSPHRASE": "test", "PULUMI_SKIP_UPDATE_CHECK": "1"}
    cli = str(find_toolchain().pulumi)

    def pulumi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, *args, "--stack", "t", "--non-interactive"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    done = subprocess.run([cli, "stack", "init", "t", "--secrets-provider", "passphrase", "--non-interactive"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return pulumi


def _set(pulumi, key: str, value: str, secret: bool = False) -> None:
    done = pulumi("config", "set", f"slurmk8s:{key}", value, *(["--secret"] if secret else []))
    assert done.returncode == 0, done.stderr


def test_the_pulumi_cli_refuses_incomplete_or_wrong_stack_config(stack):
    missing = stack("preview")
    assert missing.returncode != 0
    out = missing.stdout + missing.stderr
    assert "missing configuration values" in out, out
    assert all(f"'slurmk8s:{k}'" in out for k in (*SECRETS, "spec")), out
    _set(stack, "spec", "../examples/local.yaml")
    for key in SECRETS[1:]:
        _set(stack, key, "x", secret=True)
    _set(stack, SECRETS[0], "plain")  # a secret in plain text
    plain = stack("preview")
    assert f"'slurmk8s:{MUNGE_KEY}' must be encrypted" in plain.stdout + plain.stderr, plain.stdout + plain.stderr
    _set(stack, SECRETS[0], "x", secret=True)
    _set(stack, "wait", "sometimes")
    typed = stack("preview")
    assert "'slurmk8s:wait' must be of type 'boolean'" in typed.stdout + typed.stderr, typed.stdout + typed.stderr
    _set(stack, "wait", "false")
    ok = stack("preview")
    out = ok.stdout + ok.stderr
    assert "validating stack config" not in out, out
    assert "language plugin python" in out or ok.returncode == 0, out
