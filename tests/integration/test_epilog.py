"""The worker's Epilog (images/slurmd/epilog) in a container confined like a worker pod (the base
capabilities only, no new privileges): it kills what job 77 left behind (a daemon of its user,
reparented away from the job), and leaves the same user's job 78 and a root process that carries
job 77's id alone. The script is the repository's, mounted over the image's."""

from __future__ import annotations

import re

import pytest

from testbed import IMAGES, REPO, docker

from provisioner.names import BASE_CAPS

pytestmark = pytest.mark.integration

SCENE = r"""
set -e
useradd -u 2001 alice
as_alice() { setpriv --reuid=2001 --regid=2001 --clear-groups "$@"; }
(as_alice env SLURM_JOB_ID=77 setsid sleep 4242 </dev/null >/dev/null 2>&1 &)
(as_alice env SLURM_JOB_ID=78 setsid sleep 4343 </dev/null >/dev/null 2>&1 &)
(env SLURM_JOB_ID=77 setsid sleep 4444 </dev/null >/dev/null 2>&1 &)
sleep 0.5
echo "before: $(pgrep -c -x sleep)"
SLURM_JOB_ID=77 SLURM_JOB_UID=2001 /usr/local/lib/slurmk8s/epilog; echo "rc=$?"
sleep 0.3
echo "left: $(ps -C sleep -o user=,args= | sort | tr -s ' ' | tr '\n' ';')"
SLURM_JOB_ID=79 SLURM_JOB_UID=0 /usr/local/lib/slurmk8s/epilog; echo "root rc=$?"
SLURM_JOB_UID=2001 /usr/local/lib/slurmk8s/epilog; echo "no job rc=$?"
"""


def test_epilog_kills_only_what_the_job_left_behind(testbed_available):
    caps = [arg for cap in BASE_CAPS for arg in ("--cap-add", cap)]
    out = docker("run", "--rm", "--cap-drop", "ALL", *caps, "--security-opt", "no-new-privileges",
                 "-v", f"{REPO / 'images/slurmd/epilog'}:/usr/local/lib/slurmk8s/epilog:ro",
                 "--entrypoint", "bash", IMAGES["slurmd"], "-c", SCENE, timeout=60).stdout
    assert "before: 3" in out, out
    # its line goes to the container's log (PID 1's stdout), here the docker run's output
    assert re.search(r"^slurmk8s epilog: job 77: killed what it left behind: \d+\(sleep\)$", out, re.M), out
    assert "rc=0" in out and "root rc=0" in out and "no job rc=0" in out, out
    assert re.search(r"^left: alice sleep 4343;root sleep 4444;$", out, re.M), out
