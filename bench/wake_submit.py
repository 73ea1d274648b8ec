"""P7: `slurmk8s submit` with the control tier asleep -> job RUNNING (issue #17: <= 6 s), and a plain
`sbatch` on the awake login pod of an asleep tier -> job id (<= 3 s).

Deploys the small `sleepy` cluster of e2e/sleepy.py (namespace slurm-sleepy, idle_teardown 20 s,
SuspendTime 10 s, its own static volumes) beside whatever else runs, then per run: wait until the
tier has fallen asleep on its own (0 replicas), run `slurmk8s submit` as a researcher does
(the wake scales the tier up while the CLI logs in over SSH and polls `scontrol ping`; then
`sbatch`), and time
submit start -> job id and submit start -> job RUNNING (Slurm's start_time, 1 s resolution, and
the first time a poll over one SSH connection saw it RUNNING). Then, asleep again, a plain `sbatch`
typed on the login pod (over SSH as alice; the login pod's Slurm commands wake the tier through its
agent): the command's own time to the job id, stamped in the pod, and to RUNNING seen (--no-plain:
skip it). Removes the cluster at the end (--keep: leave it). Refuses to run over a slurm-sleepy
namespace it did not make (the e2e suite's).

Usage: KUBECONFIG=... python bench/wake_submit.py [--runs 3] [--login-sleeps] [--keep] [--json OUT]
--json also writes every run's figures to OUT (bench/all.py reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

import sleepy  # noqa: E402
from helpers import NotOurs, server_version  # noqa: E402

MADE_BY = "bench"  # the label this benchmark puts on the namespace it deploys (helpers.MADE_BY)

POLL = r"""
j=$1
until s=$(squeue -h -j "$j" -o %T) && [ "$s" = RUNNING ] || [ -z "$s" ]; do sleep 0.1; done
date +%s.%N
"""


# sbatch as typed on the login pod, between two stamps taken there; then the poll above
PLAIN = r"""
s=$(date +%s.%N)
j=$(sbatch --parsable -N1 -o /dev/null --wrap 'sleep 2')
e=$(date +%s.%N)
echo "$s $e $j"
"""


def connect(c: sleepy.Sleepy) -> Any:
    """An SSH connection to the login pod as alice (an async context manager)."""
    return asyncssh.connect(c.login().host, port=22, username="alice", client_keys=[c.key], known_hosts=None)


async def seen_running(c: sleepy.Sleepy, job: str) -> float:
    async with connect(c) as conn:
        res = await conn.run(f"bash -s {job}", input=POLL, check=True, timeout=300)
    return float(str(res.stdout).strip())


async def plain_sbatch(c: sleepy.Sleepy) -> tuple[str, float, float]:
    """-> (job id, sbatch's seconds to the job id, seconds from sbatch's start to RUNNING seen), in
    the login pod's clock; the SSH login is made before the first stamp."""
    async with connect(c) as conn:
        res = await conn.run("bash -s", input=PLAIN, check=True, timeout=300)
        start, end, job = str(res.stdout).split()[-3:]
        seen = await conn.run(f"bash -s {job}", input=POLL, check=True, timeout=300)
    return job, float(end) - float(start), float(str(seen.stdout).strip()) - float(start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--login-sleeps", action="store_true", help="login.sleeps_with_control_tier: true")
    ap.add_argument("--keep", action="store_true", help="leave the cluster deployed")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain sbatch on the login pod")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write every run's figures to OUT")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wake-bench-"))
    script = work / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1 -o /dev/null\nsleep 2\n")
    t = time.monotonic()
    try:  # never over a slurm-sleepy this benchmark did not make (the e2e suite's, someone's)
        c = sleepy.deploy(work, login_sleeps=args.login_sleeps, made_by=MADE_BY)
    except NotOurs as err:
        print(f"cannot run: {err}", file=sys.stderr)
        return 2
    print(f"deployed {sleepy.NS} in {time.monotonic() - t:.0f}s (login sleeps: {args.login_sleeps})", flush=True)
    to_id, to_start, to_seen, jobs = [], [], [], []
    plain_id: list[float] = []
    plain_seen: list[float] = []
    try:
        for i in range(args.runs):
            t = time.monotonic()
            sleepy.wait_asleep(300)
            print(f"run {i + 1}: asleep after {time.monotonic() - t:.0f}s", flush=True)
            proc, wall, seconds = c.submit(script)
            if proc.returncode != 0:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            job = sleepy.job_id(proc.stdout)
            seen = asyncio.run(seen_running(c, job))
            start = None
            while start is None:
                start = sleepy.running_at(c.login(), job)
                time.sleep(0.5)
            to_id.append(seconds)
            to_start.append(start - wall)
            to_seen.append(seen - wall)
            jobs.append(job)
            print(f"run {i + 1}: job {job}: submit -> job id {seconds:.1f}s, -> RUNNING (Slurm start_time) "
                  f"{start - wall:.0f}s, -> seen RUNNING {seen - wall:.1f}s", flush=True)
            for line in proc.stderr.splitlines():
                print(f"    {line}")
            if args.no_plain:
                continue
            t = time.monotonic()
            sleepy.wait_asleep(300)
            print(f"run {i + 1}: asleep again after {time.monotonic() - t:.0f}s", flush=True)
            job, took, seen_s = asyncio.run(plain_sbatch(c))
            plain_id.append(took)
            plain_seen.append(seen_s)
            jobs.append(job)
            print(f"run {i + 1}: plain sbatch on the login pod: job {job}: job id {took:.1f}s, "
                  f"-> seen RUNNING {seen_s:.1f}s", flush=True)
    finally:
        if not args.keep:
            sleepy.remove(c.state, c.spec_path, c.log, made_by=MADE_BY)
    print(f"P7 wake+submit from asleep ({args.runs} runs): submit -> RUNNING median {statistics.median(to_seen):.1f}s "
          f"(max {max(to_seen):.1f}s; Slurm start_time median {statistics.median(to_start):.0f}s); "
          f"-> job id median {statistics.median(to_id):.1f}s; target <= 6 s")
    if plain_id:
        print(f"P7 plain sbatch on the login pod from asleep ({len(plain_id)} runs): job id median "
              f"{statistics.median(plain_id):.1f}s (max {max(plain_id):.1f}s; target <= 3 s), RUNNING seen median "
              f"{statistics.median(plain_seen):.1f}s")
    if args.json:
        server = server_version()
        args.json.write_text(json.dumps({
            "kubernetes": server, "runs": args.runs, "login_sleeps": args.login_sleeps, "jobs": jobs,
            "to_job_id": [round(x, 3) for x in to_id], "to_start_time": [round(x, 3) for x in to_start],
            "to_seen_running": [round(x, 3) for x in to_seen],
            "plain_to_job_id": [round(x, 3) for x in plain_id],
            "plain_to_seen_running": [round(x, 3) for x in plain_seen],
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
