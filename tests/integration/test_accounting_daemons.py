"""The accounting images for real, in Docker: MariaDB (slurmk8s/mariadb) and slurmdbd
(slurmk8s/slurmdbd) start from their entrypoints, slurmdbd.conf is SlurmUser's and 0600,
`check-db` tells a wrong password and an unreachable host apart, and `slurmk8s-accounting` (in the
slurmctld image, as SlurmUser) brings the database in step with a spec and then plans nothing."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provisioner import manifests as m  # noqa: E402
from provisioner.config import parse_spec  # noqa: E402

pytestmark = pytest.mark.integration
IMAGES = {"db": "slurmk8s/mariadb:dev", "dbd": "slurmk8s/slurmdbd:dev", "ctld": "slurmk8s/slurmctld:dev"}


def docker(*args: str, check: bool = True, timeout: float = 120, input: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout, input=input)


SPEC = {"name": "acct-it", "pools": [{"name": "cpu"}],
        "users": [{"name": "alice", "uid": 2001, "account": "research"}, {"name": "bob", "uid": 2002}],
        "accounting": {"accounts": [{"name": "research", "fairshare": 10}, {"name": "teaching", "fairshare": 2}],
                       "default_account": "teaching"}}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if docker("info", check=False).returncode != 0:
        pytest.skip("no Docker engine answers (run images/ensure-docker.sh)")
    for image in IMAGES.values():
        if docker("image", "inspect", image, check=False).returncode != 0:
            pytest.skip(f"image {image} is not built (run images/build.sh)")
    tag = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("acct")
    net, db, dbd = f"acct-{tag}", f"mariadb-{tag}", f"slurmdbd-{tag}"
    (work / "secret").mkdir()
    (work / "secret" / "munge.key").write_bytes(secrets.token_bytes(1024))
    (work / "db").mkdir()
    (work / "db" / "password").write_text(secrets.token_hex(16))
    (work / "conf").mkdir()
    spec = parse_spec(SPEC)
    (work / "conf" / "slurmdbd.conf").write_text(
        m.slurmdbd_conf(spec).replace("DbdHost=slurmdbd", f"DbdHost={dbd}").replace(
            "StorageHost=mariadb.slurm-acct-it.svc.cluster.local", f"StorageHost={db}"))
    (work / "etc-slurm").mkdir()
    (work / "etc-slurm" / "slurm.conf").write_text(
        f"ClusterName=acct_it\nSlurmctldHost=nowhere\nAuthType=auth/munge\nSlurmUser=slurm\n"
        f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost={dbd}\n")
    (work / "spec").mkdir()
    (work / "spec" / "spec.json").write_text(json.dumps(spec.model_dump(mode="json")))
    for p in work.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    docker("network", "create", net)
    try:
        docker("run", "-d", "--name", db, "--network", net, "-v", f"{work}/db:/etc/slurmk8s/db:ro", IMAGES["db"])
        docker("run", "-d", "--name", dbd, "--hostname", dbd, "--network", net,
               "-v", f"{work}/db:/etc/slurmk8s/db:ro", "-v", f"{work}/secret:/etc/slurmk8s/secret:ro",
               "-v", f"{work}/conf:/etc/slurmk8s/slurmdbd:ro", IMAGES["dbd"])
        deadline = time.monotonic() + 120
        while "slurmdbd version" not in docker("logs", dbd, check=False).stderr:
            if time.monotonic() > deadline:
                logs = docker("logs", dbd, check=False)
                pytest.fail(f"slurmdbd did not start:\n{logs.stdout}{logs.stderr}\n{docker('logs', db).stderr[-2000:]}")
            time.sleep(1)
        yield {"net": net, "db": db, "dbd": dbd, "work": str(work)}
    finally:
        docker("rm", "-f", db, dbd, check=False)
        docker("network", "rm", net, check=False)


def test_slurmdbd_conf_is_slurmusers_and_private(daemons):
    out = docker("exec", daemons["dbd"], "stat", "-c", "%u %a", "/etc/slurm/slurmdbd.conf").stdout.split()
    assert out == [str(m.SLURM_UID), "600"]
    conf = docker("exec", daemons["dbd"], "cat", "/etc/slurm/slurmdbd.conf").stdout
    assert conf.count("StoragePass=") == 1


def _check_db(daemons, host: str, password_dir: str) -> subprocess.CompletedProcess[str]:
    return docker("run", "--rm", "--user", f"{m.SLURM_UID}:{m.SLURM_UID}", "--network", daemons["net"],
                  "-v", f"{password_dir}:/etc/slurmk8s/db:ro", "-e", f"SLURMK8S_DB_HOST={host}",
                  "-e", "SLURMK8S_DB_USER=slurm", "-e", "SLURMK8S_DB_NAME=slurm_acct_db", IMAGES["dbd"], "check-db",
                  check=False)


def test_check_db_tells_wrong_password_and_unreachable_apart(daemons, tmp_path: Path):
    ok = _check_db(daemons, daemons["db"], f"{daemons['work']}/db")
    assert ok.returncode == 0 and ok.stdout.startswith("ok: slurm@"), ok.stdout + ok.stderr
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "password").write_text("NotThePassword1")
    wrong.chmod(0o755)
    (wrong / "password").chmod(0o644)
    denied = _check_db(daemons, daemons["db"], str(wrong))
    assert denied.returncode == 1 and denied.stdout.startswith("error credentials: ERROR 1045"), denied.stdout
    gone = _check_db(daemons, "no-such-host", f"{daemons['work']}/db")
    assert gone.returncode == 1 and gone.stdout.startswith("error host:"), gone.stdout


def _sync(daemons, *args: str) -> subprocess.CompletedProcess[str]:
    """slurmk8s-accounting --once in the slurmctld image, as SlurmUser, with its own munged."""
    work = daemons["work"]
    script = ("install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge; "
              "install -d -o munge -g munge -m 0755 /run/munge; "
              "install -o munge -g munge -m 0400 /etc/slurmk8s/secret/munge.key /etc/munge/munge.key; "
              "setpriv --reuid munge --regid munge --init-groups munged; sleep 0.5; "
              "exec setpriv --reuid slurm --regid slurm --init-groups -- slurmk8s-accounting --once "
              "--spec /etc/slurmk8s/spec/spec.json \"$@\"")
    return docker("run", "--rm", "--network", daemons["net"], "--entrypoint", "bash",
                  "-v", f"{work}/secret:/etc/slurmk8s/secret:ro", "-v", f"{work}/etc-slurm:/etc/slurm:ro",
                  "-v", f"{work}/spec:/etc/slurmk8s/spec:ro", IMAGES["ctld"], "-c", script, "_", *args, check=False)


def test_accounting_sync_against_a_real_slurmdbd_is_idempotent(daemons):
    first = _sync(daemons)
    assert first.returncode == 0, first.stdout + first.stderr
    applied = [line for line in first.stdout.splitlines() if " applied " in line]
    assert [line.split(" applied ", 1)[1].split(":", 1)[0] for line in applied] == [
        "cluster-missing", "account-missing", "account-missing", "user-missing", "user-missing"], first.stdout
    conf = Path(daemons["work"], "etc-slurm", "slurm.conf").read_text()
    docker("exec", "-i", daemons["dbd"], "bash", "-c", "cat > /tmp/slurm.conf", input=conf)
    assoc = docker("exec", "-e", "SLURM_CONF=/tmp/slurm.conf", daemons["dbd"], "sacctmgr", "-n", "-P", "show",
                   "assoc", "cluster=acct_it", "format=Account,User,Share").stdout.split()
    assert sorted(assoc) == sorted(["root||1", "root|root|1", "research||10", "research|alice|1",
                                    "teaching||2", "teaching|bob|1"]), assoc
    second = _sync(daemons)
    assert second.returncode == 0 and " applied " not in second.stdout, second.stdout
    assert "database matches the spec (cluster acct_it, 2 account(s), 2 user(s))" in second.stdout


def test_accounting_container_stops_at_once_on_sigterm(daemons):
    """The container exactly as the manifest builds it (command, SlurmUser): it waits for the Slurm
    configuration until the slurmctld container's `.ready` is there (as in the pod), then for a
    slurmdbd it cannot reach (no munged): `docker stop` (SIGTERM, as a pod deletion sends) must end
    it at once. A Python PID 1 ignores SIGTERM and would hold the slurmctld pod for its whole grace period."""
    work = daemons["work"]
    container = m.accounting_container(parse_spec(SPEC))
    name = f"acct-loop-{uuid.uuid4().hex[:8]}"
    uid = container["securityContext"]["runAsUser"]
    docker("run", "-d", "--name", name, "--network", daemons["net"], "--user", f"{uid}:{uid}",
           "--entrypoint", container["command"][0], "-v", f"{work}/etc-slurm:/etc/slurm:ro",
           "-v", f"{work}/spec:/etc/slurmk8s/spec:ro", IMAGES["ctld"], *container["command"][1:])
    try:
        deadline = time.monotonic() + 60
        while "waiting for the Slurm configuration in /etc/slurm" not in (
                logs := docker("logs", name, check=False)).stdout + logs.stderr:
            assert time.monotonic() < deadline, f"the container never waited for .ready:\n{logs.stdout}{logs.stderr}"
            time.sleep(0.5)
        assert "waiting for slurmdbd" not in logs.stdout + logs.stderr  # nothing read before .ready
        (Path(work) / "etc-slurm" / m.CONFIG_READY).write_text("")  # what the slurmctld container writes last
        while "waiting for slurmdbd" not in (logs := docker("logs", name, check=False)).stdout + logs.stderr:
            assert time.monotonic() < deadline, f"the loop never started:\n{logs.stdout}{logs.stderr}"
            time.sleep(0.5)
        t0 = time.monotonic()
        docker("stop", "-t", "30", name, timeout=60)
        took = time.monotonic() - t0
        assert took < 5, f"the accounting container took {took:.1f} s to stop on SIGTERM (PID 1 ignores it)"
    finally:
        docker("rm", "-f", name, check=False)
