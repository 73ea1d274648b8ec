"""P-load (issue #8 part 5): a burst of short jobs, arrays and singles of mixed sizes, queued at once on
a pool of real worker pods that starts from zero; slurmctld must stay responsive and every job must end.

Deploys the e2e cluster shape (examples/local.yaml as e2e/helpers.py changes it) as its own cluster
`bench-load` (namespace slurm-bench-load, its own static volumes, beside whatever else runs; a
slurm-bench-load namespace this benchmark did not make is refused, never touched) plus a pool `load`
of --nodes one-slot nodes with --cpus Slurm CPUs each (overcommitted on purpose: the pods request
10m CPU and 64Mi), then runs everything *inside one SSH session* on the login pod:

- a prober times `squeue` every 0.5 s for the whole burst (p50 / p99 / max latency);
- arrays are submitted first (one sbatch each), then the singles one by one, each sbatch timed
  (the sbatch latency under load: the queue grows while it is measured);
- it waits until no job of the burst is pending, running or completing.

From the bench host it samples the pool's pods every 2 s (peak pods, back to zero afterwards) and
reads the slurmctld container's CPU time (cgroup cpu.stat) before and after: the controller CPU per
job covers slurmctld and every program it ran (ResumeProgram, SuspendProgram, PrologSlurmctld).
The resume / suspend runs and their durations come from the programs' log (elastic.log).

Usage: KUBECONFIG=... python bench/load_10k.py [--jobs 10000] [--nodes 8] [--singles 0.2] [--keep]
On the 2-core development machine use a scaled run, e.g. --jobs 2000; say which in the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import threading
import time
from pathlib import Path

import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from helpers import e2e_spec, kjson, kubectl, slurmk8s  # noqa: E402
from deploy import up  # noqa: E402

NAME = "bench-load"  # its own cluster: never the quickstart's or the e2e suite's `local`
NAMESPACE = f"slurm-{NAME}"
MADE_BY = "bench"

POOL = "load"
CONTROLLER = "slurmctld-0"

# $1 arrays spec file (one line: "<size> <sbatch args>"), $2 singles count, $3 tag, $4 jobs in all
BURST = r"""
set -u
arrays=$1; singles=$2; tag=$3; total=$4
now_ms() { date +%s%3N; }
stop=~/.load-$tag.stop; rm -f "$stop"
( while [ ! -e "$stop" ]; do
    t0=$(now_ms); n=$(squeue -h -t PD,R,CG,CF -o %i 2>/dev/null | wc -l); t1=$(now_ms)
    echo "q $((t1 - t0)) $n"; sleep 0.5
  done ) &
prober=$!
echo "start $(now_ms)"
while read -r size args; do
  t0=$(now_ms); out=$(sbatch --parsable -p load --array=0-$((size - 1)) -o /dev/null $args --wrap true 2>&1); rc=$?
  echo "a $(( $(now_ms) - t0 )) $rc $size ${out//[$'\n']/ }"
done < "$arrays"
sizes=("-n1 --mem=32M" "-n2 --mem=64M" "-n1 --mem=32M" "-N2 -n2 --mem=32M")
for i in $(seq "$singles"); do
  t0=$(now_ms); out=$(sbatch --parsable -p load -o /dev/null ${sizes[$((i % 4))]} --wrap true 2>&1); rc=$?
  echo "s $(( $(now_ms) - t0 )) $rc ${out//[$'\n']/ }"
done
echo "submitted $(now_ms)"
while [ "$(squeue -h -t PD,R,CG,CF,RQ,RS,S -p load -o %i 2>/dev/null | wc -l)" != 0 ]; do sleep 1; done
echo "drained $(now_ms)"
touch "$stop"; wait "$prober"
echo "states $(squeue -h -p load -t all -o %T | sort | uniq -c | tr '\n' ' ')"
# every job's final state from accounting (slurmdbd gets the records asynchronously: wait for all)
final() { sacct -a -X -n -P -r load -S "$(date -d @$(( $(now_ms) / 1000 - 7200 )) +%FT%T)" -o State 2>/dev/null; }
for _ in $(seq 90); do [ "$(final | wc -l)" -ge "$total" ] && break; sleep 2; done
echo "sacct $(final | cut -d' ' -f1 | sort | uniq -c | tr '\n' ' ')"
"""


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def arrays_for(total: int) -> list[tuple[int, str]]:
    """Array jobs adding up to `total` tasks, in sizes 1000 / 500 / 250 with mixed shapes."""
    shapes = ["-n1 --mem=32M", "-n2 --mem=64M", "-n1 --mem=32M", "-N2 -n2 --mem=32M"]
    out, left, i = [], total, 0
    while left > 0:
        size = min(left, (1000, 500, 250)[i % 3])
        out.append((size, shapes[i % len(shapes)]))
        left -= size
        i += 1
    return out


def controller_cpu_seconds() -> float | None:
    """CPU time of the slurmctld container so far (cgroup v2 cpu.stat, else v1 cpuacct.usage)."""
    proc = kubectl("exec", "-n", NAMESPACE, CONTROLLER, "-c", "slurmctld", "--", "sh", "-c",
                   "cat /sys/fs/cgroup/cpu.stat 2>/dev/null || echo v1 $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage "
                   "2>/dev/null || cat /sys/fs/cgroup/cpu,cpuacct/cpuacct.usage)", check=False)
    if m := re.search(r"^usage_usec (\d+)", proc.stdout, re.M):
        return int(m.group(1)) / 1e6
    if m := re.search(r"^v1 (\d+)", proc.stdout, re.M):
        return int(m.group(1)) / 1e9
    return None


def load_pods() -> int:
    pods = kjson("get", "pods", "-n", NAMESPACE, "-l", f"slurmk8s.io/pool={POOL}")["items"]
    return len(pods)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000, help="jobs in the burst (array tasks + singles)")
    parser.add_argument("--singles", type=float, default=0.2, help="fraction submitted as single sbatch calls")
    parser.add_argument("--nodes", type=int, default=8, help="Slurm nodes (worker pods at most) in the pool")
    parser.add_argument("--cpus", type=int, default=4, help="Slurm CPUs per node (overcommitted)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    args = parser.parse_args()
    singles = int(args.jobs * args.singles)
    arrays = arrays_for(args.jobs - singles)

    work = Path("/tmp/slurmk8s-bench-load")
    work.mkdir(exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec = e2e_spec(key.export_public_key().decode().strip() + " bench")
    spec["name"] = NAME
    spec["elasticity"] = {"suspend_time": 10, "resume_timeout": 180}
    spec["pools"].append({"name": POOL, "mode": "slots", "cpus": args.cpus, "memory": "2Gi",
                          "pod_cpu_request": "10m", "pod_memory_request": "64Mi",
                          "domains": [{"name": "local", "count": args.nodes}]})
    # the burst runs under the product's own limits (MaxJobCount 50000, MaxArraySize 10001);
    # a bigger burst raises them the way a user would
    if args.jobs > 15000:
        spec.setdefault("slurm", {})["extra_conf"] = {"MaxJobCount": str(3 * args.jobs)}
    print(f"slurmk8s up: {up(spec, work, MADE_BY):.1f} s")
    log = work / "slurmk8s.log"
    host = kjson("get", "service", "-n", NAMESPACE, "login")["spec"]["clusterIP"]
    while load_pods():  # from zero
        time.sleep(2)

    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample_pods() -> None:
        while not done.is_set():
            try:
                samples.append((time.monotonic(), load_pods()))
            except Exception:  # noqa: BLE001 -- a missed sample is not a result
                pass
            done.wait(2)

    cpu0 = controller_cpu_seconds()
    elastic0 = len(kubectl("exec", "-n", NAMESPACE, CONTROLLER, "-c", "slurmctld", "--", "cat",
                           "/var/log/slurmk8s/elastic.log", check=False).stdout.splitlines())
    sampler = threading.Thread(target=sample_pods, daemon=True)
    sampler.start()
    tag = str(int(time.time()))

    async def burst() -> str:
        async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None) as conn:
            await conn.run(f"cat > load-burst.sh <<'EOF'\n{BURST}\nEOF", check=True)
            spec_lines = "\n".join(f"{size} {shape}" for size, shape in arrays) + "\n"
            await conn.run(f"cat > load-arrays.txt <<'EOF'\n{spec_lines}EOF", check=True)
            res = await conn.run(f"bash load-burst.sh load-arrays.txt {singles} {tag} {args.jobs}", check=True, timeout=7200)
            return res.stdout

    out = asyncio.run(burst())
    t_drained = time.monotonic()
    cpu1 = controller_cpu_seconds()
    while load_pods():
        time.sleep(2)
    to_zero = time.monotonic() - t_drained
    done.set()
    sampler.join()
    (work / "burst.out").write_text(out)

    lines = [l.split() for l in out.splitlines() if l.strip()]
    start = next(int(l[1]) for l in lines if l[0] == "start")
    submitted = next(int(l[1]) for l in lines if l[0] == "submitted")
    drained = next(int(l[1]) for l in lines if l[0] == "drained")
    sb = [int(l[1]) / 1000 for l in lines if l[0] == "s"]
    arr = [int(l[1]) / 1000 for l in lines if l[0] == "a"]
    failed = [l for l in lines if l[0] in ("s", "a") and l[2] != "0"]
    sq = [int(l[1]) / 1000 for l in lines if l[0] == "q"]
    peak_queue = max((int(l[2]) for l in lines if l[0] == "q"), default=0)
    states = next((" ".join(l[1:]) for l in lines if l[0] == "states"), "")
    accounted = next((l[1:] for l in lines if l[0] == "sacct"), [])
    final = {state: int(count) for count, state in zip(accounted[::2], accounted[1::2])}
    elastic = kubectl("exec", "-n", NAMESPACE, CONTROLLER, "-c", "slurmctld", "--", "cat",
                      "/var/log/slurmk8s/elastic.log", check=False).stdout.splitlines()[elastic0:]
    runs = {p: [float(m.group(1)) for l in elastic if (m := re.search(rf" {p}\[\d+\] done in ([0-9.]+)s", l))]
            for p in ("resume", "suspend")}
    prolog_waits = [float(m.group(1)) for l in elastic if (m := re.search(r"prolog\[\d+\] job \d+ .*after ([0-9.]+)s", l))]

    total = args.jobs
    wall = (drained - start) / 1000
    print(f"burst: {total} jobs ({total - singles} array tasks in {len(arrays)} arrays, {singles} single sbatch "
          f"calls; shapes -n1 / -n2 / -N2), pool {POOL}: {args.nodes} nodes x {args.cpus} Slurm CPUs, pods from zero")
    print(f"submitted in {(submitted - start) / 1000:.1f} s; all ended {wall:.1f} s after the first sbatch: "
          f"{total / wall:.1f} jobs/s; sbatch failures: {len(failed)}")
    print(f"sbatch (single, under load): p50 {pct(sb, .5) * 1000:.0f} ms  p99 {pct(sb, .99) * 1000:.0f} ms  "
          f"max {max(sb, default=0) * 1000:.0f} ms  (n={len(sb)}); array sbatch p50 {pct(arr, .5) * 1000:.0f} ms")
    print(f"squeue during the burst: p50 {pct(sq, .5) * 1000:.0f} ms  p99 {pct(sq, .99) * 1000:.0f} ms  "
          f"max {max(sq, default=0) * 1000:.0f} ms  (n={len(sq)}, queue peak {peak_queue} jobs)")
    peak = max((n for _, n in samples), default=0)
    print(f"worker pods: peak {peak} of {args.nodes}; back to zero {to_zero:.1f} s after the queue drained")
    for p, vals in runs.items():
        print(f"{p} program: {len(vals)} runs, mean {sum(vals) / max(1, len(vals)):.2f} s, max {max(vals, default=0):.2f} s")
    print(f"PrologSlurmctld: {len(prolog_waits)} jobs waited for a boot (the others returned at the first poll)")
    if cpu0 is not None and cpu1 is not None:
        print(f"slurmctld container CPU (slurmctld + programs): {cpu1 - cpu0:.1f} s = "
              f"{(cpu1 - cpu0) / total * 1000:.1f} ms per job")
    print(f"final states still listed (MinJobAge): {states}")
    ok = final.get("COMPLETED", 0) == total and sum(final.values()) == total
    print(f"final states in accounting (sacct, every job): {final or 'none'}"
          + ("" if ok else f"  <-- expected {total} COMPLETED"))
    if failed:
        print("failed sbatch calls:", *[" ".join(l) for l in failed[:5]], sep="\n  ")
    if not args.keep:
        slurmk8s("down", "--spec", str(work / "spec.yaml"), "--state", str(work / "state"), log=log)
    if failed or not ok:
        sys.exit("not every job was submitted and COMPLETED: see above")


if __name__ == "__main__":
    main()
