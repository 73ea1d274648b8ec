"""Idle sleep with `login.sleeps_with_control_tier: true` (e2e/sleepy.py, after test_e2e_sleep.py,
which removes its cluster first): the login pod sleeps too, login first; `slurmk8s submit` wakes
slurmctld, then the login pod, logs in and submits; the job completes."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

import sleepy
from helpers import kjson, wait_for, wait_job

pytestmark = pytest.mark.e2e
NAMESPACE = sleepy.NS  # conftest's failure report collects this namespace's pod logs


@pytest.fixture(scope="module")
def sleepy_login(cluster_reachable, tmp_path_factory) -> Iterator[sleepy.Sleepy]:
    work = tmp_path_factory.mktemp("sleepy-login")
    c = sleepy.deploy(work, login_sleeps=True)
    try:
        yield c
    finally:
        sleepy.remove(c.state, c.spec_path, c.log)


def test_the_login_pod_sleeps_with_the_tier_and_slurmk8s_submit_wakes_both(sleepy_login: sleepy.Sleepy, tmp_path):
    c = sleepy_login
    assert c.login().run("id -un").stdout.strip() == "alice"
    ann = sleepy.wait_asleep()

    def login_gone():
        dep = kjson("get", "deployment", "-n", sleepy.NS, "login")
        return dep if dep["spec"]["replicas"] == 0 and not sleepy.tier_pods("login") else None

    wait_for("the login pod to be gone too", login_gone, 30)
    print(f"asleep: {ann['slurmk8s.io/state-reason']}")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1 -o both-%j.out\necho both woken\n")
    proc, wall, seconds = c.submit(script)
    assert proc.returncode == 0, f"slurmk8s submit failed:\n{proc.stdout}\n{proc.stderr}"
    order = [line.split("scaling ", 1)[1] for line in proc.stderr.splitlines() if "scaling " in line]
    # wake order: the database, slurmdbd, slurmctld, then the login pod (accounting is on by default)
    assert order == ["statefulset/mariadb to 1", "deployment/slurmdbd to 1", "statefulset/slurmctld to 1",
                     "deployment/login to 1"], proc.stderr
    job = sleepy.job_id(proc.stdout)
    login = c.login()
    started = wait_for(f"job {job} to start", lambda: sleepy.running_at(login, job), 120, interval=0.5)
    print(f"P7 (login asleep too): slurmk8s submit -> job id {seconds:.1f}s, -> job RUNNING {started - wall:.0f}s")
    assert wait_job(login, job, 180)["job_state"] == ["COMPLETED"]
    assert login.run(f"cat ~/both-{job}.out").stdout.strip() == "both woken"
    assert time.time() - wall < 300
