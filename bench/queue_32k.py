"""P4 (issue #17 item 4): slurmctld and slurmk8s with a deep queue on a large cluster: 4,096 Slurm
nodes and 32,768 pending jobs.

Deploys the e2e cluster shape as its own cluster `bench-queue` (namespace slurm-bench-queue, its own
static volumes; a namespace of that name it did not make is refused, never touched) plus a slot pool
`q` of --nodes one-CPU Slurm nodes, powered down (no pod exists until a job runs). Then, inside one
SSH session on the login pod as a researcher: --jobs jobs are queued held (`sbatch --hold`, job
arrays of at most 1,000 tasks), so they stay pending and no worker pod is made; with that queue it
times --sbatch single `sbatch --hold` calls and --squeue full `squeue -r` listings (every array task a line of its own: the default folds a pending array into one). From the bench host:
`slurmk8s status` (timed, --status times), and the reconcile loop at that queue: its pass duration
(the loop's own histogram slurmk8s_reconcile_duration_seconds, passes made after the queue was full)
and its peak memory (VmHWM of the reconcile process). The jobs are cancelled and the cluster removed
at the end (--keep to leave it).

Goals: sbatch p99 <= 500 ms, squeue p99 <= 2 s, `slurmk8s status` <= 3 s, the reconcile pass <= 2 s.

Usage: KUBECONFIG=... python bench/queue_32k.py [--nodes 4096] [--jobs 32768] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from helpers import SLURMK8S, TOOLCHAIN_BIN, e2e_spec, kjson, kubeconfig, kubectl  # noqa: E402
from deploy import down, up  # noqa: E402
from load_10k import pct  # noqa: E402

NAME = "bench-queue"
NAMESPACE = f"slurm-{NAME}"
MADE_BY = "bench"
POOL = "q"
CONTROLLER = "slurmctld-0"

# runs on the login pod as alice: queue the held arrays, then time sbatch and squeue with that queue
QUEUE = r"""
set -u
jobs=$1; sbatches=$2; squeues=$3; pool=$4
left=$jobs
while [ "$left" -gt 0 ]; do
  n=$(( left < 1000 ? left : 1000 ))
  sbatch --hold --parsable -p "$pool" --array=0-$((n - 1)) -o /dev/null --wrap true >/dev/null || echo "fail array"
  left=$(( left - n ))
done
echo "queued $(squeue -h -u $USER -r -t PD | wc -l)"
for i in $(seq 1 "$sbatches"); do
  s=$(date +%s%N); sbatch --hold --parsable -p "$pool" -o /dev/null --wrap true >/dev/null; rc=$?; e=$(date +%s%N)
  echo "s $(( (e - s) / 1000 )) $rc"
done
for i in $(seq 1 "$squeues"); do
  s=$(date +%s%N); n=$(squeue -h -r | wc -l); e=$(date +%s%N)
  echo "q $(( (e - s) / 1000 )) $n"
done
"""


def metrics_text() -> str:
    code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9410/metrics', timeout=20).read().decode())"
    return kubectl("exec", "-n", NAMESPACE, CONTROLLER, "-c", "reconcile", "--", "/opt/slurmk8s/bin/python", "-c",
                   code, check=False, timeout=60).stdout


def pass_totals() -> tuple[float, float]:
    """(sum, count) of the loop's pass-duration histogram."""
    text = metrics_text()
    total = re.search(r"^slurmk8s_reconcile_duration_seconds_sum (\S+)", text, re.M)
    count = re.search(r"^slurmk8s_reconcile_duration_seconds_count (\S+)", text, re.M)
    return (float(total.group(1)) if total else 0.0), (float(count.group(1)) if count else 0.0)


def reconcile_peak_kib() -> int | None:
    out = kubectl("exec", "-n", NAMESPACE, CONTROLLER, "-c", "reconcile", "--", "sh", "-c",
                  "grep -h VmHWM /proc/[0-9]*/status 2>/dev/null", check=False).stdout
    values = [int(v) for v in re.findall(r"VmHWM:\s+(\d+) kB", out)]
    return max(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--jobs", type=int, default=32768)
    parser.add_argument("--sbatch", type=int, default=200, help="single sbatch calls timed")
    parser.add_argument("--squeue", type=int, default=20, help="full squeue listings timed")
    parser.add_argument("--status", type=int, default=3, help="`slurmk8s status` runs timed")
    parser.add_argument("--passes", type=int, default=3, help="reconcile passes to wait for at the full queue")
    parser.add_argument("--json", type=Path, metavar="OUT")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    work = Path("/tmp/slurmk8s-bench-queue")
    work.mkdir(exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec = e2e_spec(key.export_public_key().decode().strip() + " bench")
    spec["name"] = NAME
    spec["rest"] = {"enabled": False}
    spec["pools"].append({"name": POOL, "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "10m",
                          "pod_memory_request": "64Mi", "domains": [{"name": "local", "count": args.nodes}]})
    up_s = up(spec, work, MADE_BY)
    print(f"slurmk8s up with {args.nodes} nodes in pool {POOL}: {up_s:.1f} s")
    host = kjson("get", "service", "-n", NAMESPACE, "login")["spec"]["clusterIP"]

    async def queue() -> str:
        async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None) as conn:
            await conn.run(f"cat > queue.sh <<'EOF'\n{QUEUE}\nEOF", check=True)
            res = await conn.run(f"bash queue.sh {args.jobs} {args.sbatch} {args.squeue} {POOL}", check=True,
                                 timeout=3600)
            return res.stdout

    t1 = time.monotonic()
    out = asyncio.run(queue())
    queue_s = time.monotonic() - t1
    lines = [line.split() for line in out.splitlines() if line.strip()]
    queued = next((int(line[1]) for line in lines if line[0] == "queued"), 0)
    sb = [int(line[1]) / 1e6 for line in lines if line[0] == "s"]
    sb_failed = sum(1 for line in lines if line[0] == "s" and line[2] != "0")
    sq = [int(line[1]) / 1e6 for line in lines if line[0] == "q"]
    listed = max((int(line[2]) for line in lines if line[0] == "q"), default=0)

    env = {"KUBECONFIG": kubeconfig(), "PATH": f"{TOOLCHAIN_BIN}:/usr/bin:/bin"}
    status_s = []
    for _ in range(args.status):
        s = time.monotonic()
        proc = subprocess.run([SLURMK8S, "status", "--spec", str(work / "spec.yaml")], capture_output=True,
                              text=True, env=env, timeout=120, check=False)
        status_s.append(time.monotonic() - s)
        if proc.returncode != 0:
            print(f"slurmk8s status exit {proc.returncode}: {proc.stderr[-500:]}")
    sum0, count0 = pass_totals()
    deadline = time.monotonic() + 60 * args.passes
    while time.monotonic() < deadline:
        time.sleep(5)
        total, count = pass_totals()
        if count - count0 >= args.passes:
            break
    total, count = pass_totals()
    passes = int(count - count0)
    pass_mean = (total - sum0) / passes if passes else float("nan")
    peak = reconcile_peak_kib()

    print(f"queue: {queued} jobs pending (held) on {args.nodes} nodes, queued in {queue_s:.1f} s with the timing")
    print(f"sbatch --hold (single, queue of {queued}): p50 {pct(sb, .5) * 1000:.0f} ms  p99 {pct(sb, .99) * 1000:.0f} ms"
          f"  max {max(sb, default=0) * 1000:.0f} ms  (n={len(sb)}, {sb_failed} failed; goal p99 <= 500 ms)")
    print(f"squeue -r (all {listed} jobs): p50 {pct(sq, .5):.2f} s  p99 {pct(sq, .99):.2f} s  max {max(sq, default=0):.2f} s"
          f"  (n={len(sq)}; goal p99 <= 2 s)")
    print(f"slurmk8s status: {', '.join(f'{s:.2f}' for s in status_s)} s (goal <= 3 s)")
    print(f"reconcile pass at that queue: mean {pass_mean:.2f} s over {passes} passes (goal <= 2 s); "
          f"reconcile peak RSS {peak / 1024 if peak else float('nan'):.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps({
            "nodes": args.nodes, "jobs": args.jobs, "queued": queued, "up_s": round(up_s, 3),
            "sbatch_s": sb, "sbatch_failed": sb_failed, "squeue_s": sq, "squeue_listed": listed,
            "status_s": status_s, "reconcile_pass_mean_s": pass_mean, "reconcile_passes": passes,
            "reconcile_peak_kib": peak}, indent=2) + "\n")
    if not args.keep:
        kubectl("exec", "-n", NAMESPACE, CONTROLLER, "-c", "slurmctld", "--", "scancel", "-u", "alice",
                check=False, timeout=120)
        down(NAME, work, MADE_BY)


if __name__ == "__main__":
    main()
