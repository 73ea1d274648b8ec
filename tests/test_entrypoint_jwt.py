"""The JWT key step of the slurmctld and slurmdbd entrypoints (``install_jwt_key`` in
images/entrypoint/jwt.sh), run with bash in a subprocess: the mounted key is installed where the
config's AuthAltParameters=jwt_key= points, owned by SlurmUser, mode 0400; nothing happens without
jwt_key=; a missing key stops the daemon saying which Secret to mount; the key is never printed."""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path

import pytest

ENTRYPOINTS = Path(__file__).resolve().parents[1] / "images" / "entrypoint"


def _run(tmp_path: Path, conf_line: str, key: bytes | None) -> subprocess.CompletedProcess:
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=x\n{conf_line}\n")
    src = tmp_path / "mounted" / "jwt_hs256.key"
    src.parent.mkdir(exist_ok=True)
    if key is not None:
        src.write_bytes(key)
    user = getpass.getuser()  # SlurmUser in the images; here whoever runs the tests
    script = (f". {ENTRYPOINTS / 'lib.sh'}; . {ENTRYPOINTS / 'jwt.sh'}; SLURMK8S_ROLE=slurmctld; "
              f"install_jwt_key {conf} {user}")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SLURMK8S_JWT_KEY": str(src)})


def test_the_key_goes_where_slurm_conf_says_owned_and_0400(tmp_path):
    key = os.urandom(64)
    dst = tmp_path / "run" / "jwt" / "jwt_hs256.key"
    r = _run(tmp_path, f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={dst}", key)
    assert r.returncode == 0, r.stderr
    assert dst.read_bytes() == key
    assert oct(dst.stat().st_mode & 0o777) == "0o400" and oct(dst.parent.stat().st_mode & 0o777) == "0o700"
    assert dst.stat().st_uid == os.getuid()
    assert f"jwt: key installed at {dst}" in r.stderr and key.hex()[:16] not in r.stderr + r.stdout


def test_without_jwt_key_nothing_happens(tmp_path):
    r = _run(tmp_path, "AuthType=auth/munge", None)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_missing_key_stops_the_daemon_naming_the_secret(tmp_path):
    r = _run(tmp_path, f"AuthAltParameters=jwt_key={tmp_path / 'k'}", None)
    assert r.returncode == 1
    assert "no JWT key is mounted" in r.stderr and "Secret slurm-jwt (key jwt_hs256.key)" in r.stderr


@pytest.mark.parametrize("name", ["slurmctld.sh", "slurmdbd.sh"])
def test_slurmctld_and_slurmdbd_entrypoints_install_it(name):
    text = (ENTRYPOINTS / name).read_text()
    assert ". /usr/local/lib/slurmk8s/jwt.sh\n" in text and '\ninstall_jwt_key "$CONF" "$SLURM_USER"\n' in text
