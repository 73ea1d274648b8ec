"""Submit-to-start latency of a batch job on the Docker test bed, from zero workers and from idle
workers, with `elasticity.fast_start` off (Slurm's power-saving defaults) and on (PrologSlurmctld
that releases the job once its nodes booted + power_save_interval=1).

    python bench/submit_latency.py                      # 20 runs per case, both modes
    python bench/submit_latency.py --runs 5 --modes fast --nodes 2 --json out.json

What is measured: the user (alice) submits with `sbatch` over an open SSH connection to the login
container; t0 is taken on this machine right before the command is sent, t1 is the first thing
the batch script does (`date +%s.%N` on the worker). Containers share this machine's clock, so
t1 - t0 is submit-to-start as the user sees it: slightly more than submit-to-RUNNING (it includes
sbatch itself, the SSH round trip and the batch step's launch).

"From zero": before each run every node is forced to power down (scontrol ... POWER_DOWN_FORCE);
once no worker container exists, the bench waits a random 0..--jitter seconds (so submits do not
all land at the same phase of Slurm's 1/10/30 s timers) and submits. "From idle": the job's nodes are up and idle.
Needs Docker and the images (images/build.sh). CPU-light, but long: the defaults take ~30 s per
from-zero run with fast_start off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from testbed import USER, Testbed, unavailable_reason  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "min": min(values), "max": max(values), "mean": statistics.fmean(values)}


class Bench:
    def __init__(self, bed: Testbed, nodes: int, jitter: float, seed: int) -> None:
        self.bed = bed
        self.nodes = nodes
        self.jitter = jitter
        self.rng = random.Random(seed)

    async def submit_and_time(self, conn: asyncssh.SSHClientConnection, timeout: float = 180) -> float:
        argv = ["sbatch", "--parsable", f"-N{self.nodes}", "--ntasks-per-node=1", "-o", f"/home/{USER}/lat-%j.out",
                "--wrap", "date +%s.%N"]
        t0 = time.time()
        result = await conn.run(shlex.join(argv), check=True)
        job = int(str(result.stdout).strip().split(";")[0])
        out = f"/home/{USER}/lat-{job}.out"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cat = await conn.run(shlex.join(["cat", out]), check=False)
            text = str(cat.stdout).strip()
            if text:
                return float(text.splitlines()[0]) - t0
            await asyncio.sleep(0.2)
        raise TimeoutError(f"job {job} did not start within {timeout}s")

    async def wait_idle(self, conn: asyncssh.SSHClientConnection) -> None:
        """Until the previous job has ended and its nodes are idle again (not completing)."""
        while True:
            q = await conn.run(shlex.join(["squeue", "-h", "-u", USER, "-o", "%i"]), check=False)
            if not str(q.stdout).strip():
                return
            await asyncio.sleep(0.1)

    async def run(self, runs: int, cases: list[str]) -> dict[str, list[float]]:
        results: dict[str, list[float]] = {case: [] for case in cases}
        async with asyncssh.connect(self.bed.login_ip, username=USER, client_keys=[self.bed.key],
                                    known_hosts=None) as conn:
            if "zero" in cases:
                for i in range(runs):
                    await asyncio.to_thread(self.bed.power_down_all, 180)
                    # submit at a random phase of Slurm's periodic timers (power-save scan 1 s / 10 s,
                    # the 30 s job tick); right after the power-down wait the phase would be fixed
                    await asyncio.sleep(self.rng.uniform(0, self.jitter))
                    latency = await self.submit_and_time(conn)
                    results["zero"].append(latency)
                    print(f"  zero run {i + 1}/{runs}: {latency:.2f}s", flush=True)
                    await self.wait_idle(conn)
            if "idle" in cases:
                await self.submit_and_time(conn)  # bring the nodes up (not counted)
                await self.wait_idle(conn)
                for i in range(runs):
                    latency = await self.submit_and_time(conn)
                    results["idle"].append(latency)
                    print(f"  idle run {i + 1}/{runs}: {latency:.2f}s", flush=True)
                    await self.wait_idle(conn)
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="runs per case (default 20)")
    parser.add_argument("--modes", default="default,fast", help="comma list of: default (fast_start off), fast")
    parser.add_argument("--cases", default="zero,idle", help="comma list of: zero, idle")
    parser.add_argument("--nodes", type=int, default=1, help="nodes per job (default 1)")
    parser.add_argument("--jitter", type=float, default=30.0,
                        help="from zero: wait a random 0..JITTER s before each submit (default 30)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the jitter")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    cases = args.cases.split(",")
    report: dict[str, dict[str, dict[str, float]]] = {}
    raw: dict[str, dict[str, list[float]]] = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-") as tmp:
            bed = Testbed(Path(tmp), node_count=max(2, args.nodes), fast_start=(mode == "fast"),
                          suspend_time=20, resume_timeout=60, suspend_timeout=5)
            print(f"mode {mode}: cluster {bed.token} (fast_start={bed.fast_start}), {args.runs} runs per case, "
                  f"{args.nodes}-node jobs", flush=True)
            bed.up()
            try:
                raw[mode] = asyncio.run(Bench(bed, args.nodes, args.jitter, args.seed).run(args.runs, cases))
            finally:
                bed.down()
        report[mode] = {case: summary(values) for case, values in raw[mode].items() if values}

    print(f"\nsubmit-to-start latency, {args.nodes}-node batch job, seconds")
    print(f"{'mode':<8} {'case':<5} {'n':>3} {'p50':>7} {'p95':>7} {'min':>7} {'max':>7} {'mean':>7}")
    for mode, cases_ in report.items():
        for case, s in cases_.items():
            print(f"{mode:<8} {case:<5} {s['n']:>3} {s['p50']:>7.2f} {s['p95']:>7.2f} {s['min']:>7.2f} "
                  f"{s['max']:>7.2f} {s['mean']:>7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"nodes": args.nodes, "jitter": args.jitter, "seed": args.seed,
                                         "summary": report, "raw": raw}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
