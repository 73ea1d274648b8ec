"""A second, small cluster for the idle sleep of the control tier: `sleepy` in namespace
slurm-sleepy, with `elasticity.idle_teardown` short, its own static volumes, deployed beside the
session's cluster and removed afterwards (`down --purge`). Used by e2e/test_e2e_sleep.py and
bench/wake_submit.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml

from helpers import (LOCAL_KUBECONFIG, SLURMK8S, TOOLCHAIN_BIN, Login, apply_static_volumes, clear_leftover, e2e_spec,
                     kjson, kubeconfig, kubectl, login_in, mark_made_by, slurmk8s, wait_for)

NAME = "sleepy"
NS = f"slurm-{NAME}"
VOLUMES = f"/var/lib/slurmk8s/volumes/{NAME}"
SUSPEND = 10
IDLE_TEARDOWN = 20


def spec(public_key: str, login_sleeps: bool = False) -> dict[str, Any]:
    doc = e2e_spec(public_key)
    doc["name"] = NAME
    doc["elasticity"] = {"suspend_time": SUSPEND, "resume_timeout": 120, "idle_teardown": IDLE_TEARDOWN}
    if login_sleeps:
        doc.setdefault("login", {})["sleeps_with_control_tier"] = True
    # a slurmctld image built from the tree under test (the reconcile loop, the wake agent and the
    # REST front run its provisioner), loaded with `slurmk8s cluster load-image` under its own tag,
    # where the shared cluster's slurmk8s/slurmctld:dev is another tree's
    controller = os.environ.get("SLURMK8S_E2E_CONTROLLER_IMAGE")
    if controller:
        doc.setdefault("images", {})["controller"] = controller
    return doc


@dataclass
class Sleepy:
    spec_path: Path
    state: Path
    log: Path
    key: asyncssh.SSHKey
    key_path: Path

    def login(self, user: str = "alice") -> Login:
        return login_in(NS, user, self.key)

    def submit(self, script: Path, *sbatch: str) -> tuple[subprocess.CompletedProcess[str], float, float]:
        """`slurmk8s submit` as a researcher runs it; (process, wall-clock start, seconds it took)."""
        wall = time.time()
        t0 = time.monotonic()
        proc = subprocess.run(
            [SLURMK8S, "submit", str(script), "--namespace", NS, "--user", "alice",
             "--key", str(self.key_path), "--insecure-host-key", "--timeout", "240", *(["--", *sbatch] if sbatch else [])],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "KUBECONFIG": kubeconfig(), "PATH": f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}"})
        with self.log.open("a") as fh:
            fh.write(f"\n$ slurmk8s submit {script}\n{proc.stdout}{proc.stderr}")
        return proc, wall, time.monotonic() - t0


def deploy(work: Path, login_sleeps: bool = False, made_by: str = "e2e") -> Sleepy:
    """Deploy the sleepy cluster from nothing. A slurm-sleepy namespace that an earlier `made_by` run
    left is removed first; any other (a bench's while the e2e suite runs, or the reverse) is refused
    (helpers.NotOurs), never touched."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = work / "id_ed25519"
    key.write_private_key(str(key_path))
    key_path.chmod(0o600)
    spec_path = work / "sleepy.yaml"
    spec_path.write_text(yaml.safe_dump(spec(key.export_public_key().decode().strip() + " e2e-sleep", login_sleeps)))
    state = work / "state"
    log = work / "slurmk8s-sleepy.log"
    clear_leftover(NS, made_by)
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={NAME}", "--ignore-not-found", "--wait=true", timeout=120)
    if kubeconfig() == LOCAL_KUBECONFIG:
        shutil.rmtree(VOLUMES, ignore_errors=True)
    apply_static_volumes(NAME, NS, work / "volumes.json")  # no dynamic provisioner here
    try:
        proc = slurmk8s("up", "--spec", str(spec_path), "--state", str(state), log=log)
    finally:
        mark_made_by(NS, made_by)
    if proc.returncode != 0:
        pytest.fail(f"`slurmk8s up` of {NAME} failed (exit {proc.returncode}):\n{log.read_text()[-6000:]}")
    return Sleepy(spec_path, state, log, key, key_path)


def remove(state: Path, spec_path: Path, log: Path, made_by: str = "e2e") -> None:
    """Everything of the sleepy cluster this run deployed: stack, namespace, volumes and their data."""
    if state.exists():
        slurmk8s("down", "--spec", str(spec_path), "--state", str(state), "--purge", "--yes", log=log)
    clear_leftover(NS, made_by)  # what `down --purge` left, if it failed
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={NAME}", "--ignore-not-found", "--wait=true", timeout=120)
    if kubeconfig() == LOCAL_KUBECONFIG:
        shutil.rmtree(VOLUMES, ignore_errors=True)


# ---------------------------------------------------------------- observing the tier


def controller() -> dict[str, Any]:
    return kjson("get", "statefulset", "-n", NS, "slurmctld")


def tier_pods(component: str) -> list[str]:
    pods = kjson("get", "pods", "-n", NS, "-l", f"app.kubernetes.io/component={component}")["items"]
    return [p["metadata"]["name"] for p in pods]


def recorded() -> dict[str, str]:
    """The tier's recorded state: the annotations of the ConfigMap slurmk8s-tier-state."""
    return kjson("get", "configmap", "-n", NS, "slurmk8s-tier-state")["metadata"].get("annotations") or {}


def asleep() -> dict[str, str] | None:
    """The recorded state once the tier is asleep: slurmctld at 0 replicas, recorded asleep, its pod gone."""
    ann = recorded()
    if controller()["spec"].get("replicas") == 0 and ann.get("slurmk8s.io/state") == "asleep" \
            and not tier_pods("slurmctld"):
        return ann
    return None


def awake_recorded() -> dict[str, str] | None:
    ann = recorded()
    return ann if ann.get("slurmk8s.io/state") == "awake" and ann.get("slurmk8s.io/state-reason", "").startswith(
        "woken") else None


def events(reason: str) -> list[dict[str, Any]]:
    return [e for e in kjson("get", "events", "-n", NS)["items"] if e.get("reason") == reason]


def running_at(login: Login, job: str) -> float | None:
    """The job's start_time (epoch s) once Slurm has it RUNNING or done."""
    doc = login.json(f"scontrol show job {job} --json")["jobs"][0]
    states = set(doc["job_state"])
    if states & {"RUNNING", "COMPLETING", "COMPLETED"}:
        start = doc.get("start_time")
        return float(start["number"] if isinstance(start, dict) else start)
    return None


def wait_asleep(timeout: float = 150) -> dict[str, str]:
    return wait_for("the control tier to fall asleep on its own", asleep, timeout, interval=2)


def job_id(stdout: str) -> str:
    out = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    assert re.fullmatch(r"\d+", out), f"slurmk8s submit printed {stdout!r}"
    return out
