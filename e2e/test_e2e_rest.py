"""Programs submit too (#18): Slurm's REST API (slurmrestd) with per-user JWTs, on the session
cluster (helpers.e2e_spec sets rest.enabled).

A token from `slurmk8s token --user alice` submits a 2-node job from zero workers over REST and
polls it to COMPLETED (submit -> RUNNING measured beside a plain sbatch's, submitted at the same
moment); another REST job is cancelled with DELETE. Refused, with nothing done: no token, a garbage
token, an expired one (--lifetime 1s), alice's token under bob's name, alice's token cancelling
bob's job, and `slurmk8s token` for a user not in the spec. A researcher's own `scontrol token` on
the login pod works too. The JWT key is on slurmctld only (SlurmUser, 0400), not on slurmrestd or
login. Every token issued here goes to the secret scan (test_e2e_security.py). ~1-2 min.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from helpers import (FINAL, ISSUED_TOKENS, NAMESPACE, SLURMK8S, TOOLCHAIN_BIN, Cluster, kjson, kubeconfig, kubectl, submit,
                     wait_for, worker_pods)

pytestmark = pytest.mark.e2e

# the newest OpenAPI plugin version Debian trixie's slurmrestd 24.11 serves (`slurmrestd -d list`)
API = "v0.0.42"


def base_url() -> str:
    svc = kjson("get", "service", "-n", NAMESPACE, "slurmrestd")
    return f"http://{svc['spec']['clusterIP']}:6820"


def call(method: str, path: str, user: str | None = None, token: str | None = None,
         body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One HTTP request to slurmrestd: (status, JSON body or {'text': ...})."""
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["X-SLURM-USER-NAME"] = user
    if token is not None:
        headers["X-SLURM-USER-TOKEN"] = token
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base_url() + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw) if raw else {}
    except ValueError:
        return status, {"text": raw.decode(errors="replace")[:500]}


def token(cluster: Cluster, user: str, lifetime: str = "10m") -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [SLURMK8S, "token", "--user", user, "--lifetime", lifetime, "--spec", str(cluster.spec_path)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": kubeconfig(), "PATH": f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}"})
    found = re.fullmatch(r"SLURM_JWT=(\S+)\n", proc.stdout)
    if found:
        ISSUED_TOKENS.append((user, found.group(1)))
    return proc


def jwt(cluster: Cluster, user: str, lifetime: str = "10m") -> str:
    proc = token(cluster, user, lifetime)
    assert proc.returncode == 0 and proc.stdout.startswith("SLURM_JWT="), (proc.stdout[:20], proc.stderr)
    return ISSUED_TOKENS[-1][1]


def rest_submit(user: str, tok: str, script: str, name: str, nodes: int = 1) -> int:
    status, doc = call("POST", f"/slurm/{API}/job/submit", user, tok, {"job": {
        "script": script, "name": name, "current_working_directory": f"/home/{user}",
        "environment": ["PATH=/usr/local/bin:/usr/bin:/bin", f"HOME=/home/{user}"],
        "minimum_nodes": nodes, "maximum_nodes": nodes, "standard_output": f"/home/{user}/{name}-%j.out"}})
    assert status == 200 and not doc.get("errors") and doc.get("job_id"), (status, doc)
    return int(doc["job_id"])


def rest_job(user: str, tok: str, job: int) -> dict[str, Any]:
    status, doc = call("GET", f"/slurm/{API}/job/{job}", user, tok)
    assert status == 200 and doc.get("jobs"), (status, doc)
    return doc["jobs"][0]


def _number(value: Any) -> float:
    return float(value["number"] if isinstance(value, dict) else value)


def started_at(user: str, tok: str, job: int) -> float | None:
    """When the job was first seen running on booted nodes (RUNNING without CONFIGURING; polled),
    host clock."""
    states = set(rest_job(user, tok, job)["job_state"])
    if states & {"RUNNING", "COMPLETING", "COMPLETED"} and "CONFIGURING" not in states:
        return time.time()
    return None


def my_jobs(login, name: str) -> list[str]:
    return [j for j in login.run(f"squeue -h -a -n {name} -o %i", check=False).stdout.split() if j]


def test_rest_submits_polls_and_cancels_with_a_users_token(cluster: Cluster):
    t0 = time.monotonic()
    login = cluster.login()
    alice = jwt(cluster, "alice")
    # from zero workers: wait until the earlier tests' workers are suspended (SuspendTime 20 s)
    wait_for("no worker pods of pool cpu", lambda: not [p for p in worker_pods() if p.startswith("cpu-")], 120,
             interval=2)

    # a 2-node job over REST and a 1-node sbatch job at the same moment (the pool has 3 slots)
    wall = time.time()
    job = rest_submit("alice", alice, "#!/bin/bash\nsrun hostname\n", "rest2", nodes=2)
    sb_wall = time.time()
    sb_job = submit(login, "#!/bin/bash\n#SBATCH -N1 -o /dev/null\nhostname")
    seen: dict[int, float] = {}

    def both_running() -> bool:  # one loop for both, so neither is seen late for waiting on the other
        for j in (job, int(sb_job)):
            if j not in seen and (at := started_at("alice", alice, j)) is not None:
                seen[j] = at
        return len(seen) == 2
    wait_for(f"REST job {job} and sbatch job {sb_job} RUNNING", both_running, 180, interval=0.5)
    rest_start, sb_doc = seen[job], seen[int(sb_job)]
    print(f"REST submit -> RUNNING {rest_start - wall:.1f}s (2 nodes from zero workers); sbatch submit -> RUNNING "
          f"{sb_doc - sb_wall:.1f}s (1 node, submitted at the same moment; both polled every 0.5 s)")
    done = wait_for(f"REST job {job} to finish", lambda: rest_job("alice", alice, job), 180, interval=1,
                    until=lambda d: bool(set(d["job_state"]) & FINAL)
                    and "COMPLETING" not in d["job_state"], show=lambda d: d.get("job_state"))
    assert done["job_state"] == ["COMPLETED"] and done["user_name"] == "alice", (done["job_state"], done["user_name"])
    assert _number(done["node_count"]) == 2
    assert len(set(login.run(f"cat ~/rest2-{job}.out").stdout.split())) == 2, "srun ran on 2 nodes"

    # another one, cancelled with DELETE (pending or already running)
    victim = rest_submit("alice", alice, "#!/bin/bash\nsleep 300\n", "rest-cancel")
    status, doc = call("DELETE", f"/slurm/{API}/job/{victim}", "alice", alice)
    assert status == 200 and not doc.get("errors"), (status, doc)
    wait_for(f"job {victim} CANCELLED", lambda: rest_job("alice", alice, victim)["job_state"], 60, interval=1,
             until=lambda s: "CANCELLED" in s)
    print(f"REST test took {time.monotonic() - t0:.0f}s")


def test_rest_refuses_without_a_valid_token_and_does_nothing(cluster: Cluster):
    login = cluster.login()
    alice, bob = jwt(cluster, "alice"), jwt(cluster, "bob")
    script = "#!/bin/bash\nhostname\n"
    body = {"job": {"script": script, "name": "rest-refused", "current_working_directory": "/tmp",
                    "environment": ["PATH=/usr/bin:/bin"]}}
    short = jwt(cluster, "alice", "1s")
    time.sleep(2)
    cases = {
        "no token": (None, None),
        "a user name but no token": ("alice", None),
        "a garbage token": ("alice", "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJhbGljZSJ9.bm90LWEtc2lnbmF0dXJl"),
        "an expired token": ("alice", short),
        "alice's token under bob's name": ("bob", alice),
    }
    for what, (user, tok) in cases.items():
        status, doc = call("POST", f"/slurm/{API}/job/submit", user, tok, body)
        assert status >= 400, f"{what}: {status} {doc}"
        status, doc = call("GET", f"/slurm/{API}/jobs", user, tok)
        assert status >= 400, f"{what}: GET jobs answered {status}"
    assert my_jobs(login, "rest-refused") == [], "a refused request queued a job"

    # alice's token cannot cancel bob's job; bob's can
    bobs = rest_submit("bob", bob, "#!/bin/bash\nsleep 60\n", "rest-bob")
    try:
        status, doc = call("DELETE", f"/slurm/{API}/job/{bobs}", "alice", alice)
        # 24.11 answers 200 with the refusal in the job's own status entry
        refused = [st["error"]["string"] for st in doc.get("status") or () if (st.get("error") or {}).get("code")]
        assert status >= 400 or doc.get("errors") or refused == ["Access/permission denied"], (status, doc)
        assert "CANCELLED" not in rest_job("bob", bob, bobs)["job_state"]
    finally:
        status, doc = call("DELETE", f"/slurm/{API}/job/{bobs}", "bob", bob)
    assert status == 200, (status, doc)

    # a user not in the spec gets no token at all
    proc = token(cluster, "mallory")
    assert proc.returncode == 2 and proc.stdout == "" and "not in the spec" in proc.stderr, proc.stderr


def test_a_researcher_gets_a_token_with_scontrol_and_the_key_stays_on_slurmctld(cluster: Cluster):
    login = cluster.login()
    out = login.run("scontrol token lifespan=120").stdout.strip()
    assert out.startswith("SLURM_JWT="), out[:12]
    tok = out.split("=", 1)[1]
    ISSUED_TOKENS.append(("alice (scontrol token)", tok))
    status, doc = call("GET", f"/slurm/{API}/jobs", "alice", tok)
    assert status == 200 and "jobs" in doc, (status, doc)

    got = kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "stat", "-c", "%U %a",
                  "/run/slurmk8s-jwt/jwt_hs256.key").stdout.strip()
    assert got == "slurm 400", got
    for target in ("deployment/slurmrestd", "deployment/login"):
        probe = kubectl("exec", "-n", NAMESPACE, target, "--", "sh", "-c",
                        "ls /etc/slurmk8s/jwt /run/slurmk8s-jwt 2>/dev/null | wc -l", check=False)
        assert probe.returncode == 0 and probe.stdout.strip() == "0", (target, probe.stdout, probe.stderr)
    who = kubectl("exec", "-n", NAMESPACE, "deployment/slurmrestd", "--", "id", "-u").stdout.strip()
    assert who == "6820", who


def _claims(tok: str) -> dict[str, Any]:
    payload = tok.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_a_users_token_lifespan_is_capped_at_rest_max_token_lifespan(cluster: Cluster):
    """Issue 40 item 11: without AuthAltParameters=max_token_lifespan= any user (or job) could mint a
    ten-year token. The session spec leaves rest.max_token_lifespan at its default, 24 h."""
    login = cluster.login()
    conf = login.run("scontrol show config | grep -i '^AuthAltParameters'").stdout
    assert "max_token_lifespan=86400" in conf, conf
    # 24.11 refuses (does not shorten) it: "slurm_fetch_token: error with request: Requested time limit is
    # invalid (missing or exceeds some limit)"; slurmctld logs "rejecting token lifespan ... exceeds limit"
    long = login.run("scontrol token lifespan=315360000", check=False)
    assert long.exit_status == 1 and "SLURM_JWT" not in long.stdout, (long.exit_status, long.stdout[:12], long.stderr)
    assert "Requested time limit is invalid" in long.stderr, long.stderr
    short = login.run("scontrol token lifespan=3600", check=False)
    assert short.exit_status == 0 and short.stdout.startswith("SLURM_JWT="), (short.stdout[:12], short.stderr)
    tok = short.stdout.strip().split("=", 1)[1]
    ISSUED_TOKENS.append(("alice (scontrol token, 1 h)", tok))
    claims = _claims(tok)
    assert claims["sun"] == login.user and claims["exp"] - claims["iat"] == 3600, claims
    status, doc = call("GET", f"/slurm/{API}/jobs", login.user, tok)
    assert status == 200 and "jobs" in doc, (status, doc)
