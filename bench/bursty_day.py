"""P3 (issue #17 item 5), a bursty day: 1,000 jobs replayed on an elastic pool, node-seconds and waits.

Goals: provisioned / busy node-seconds <= 1.3 from the product's own metrics, every job COMPLETED by
sacct, none interrupted (killed by scale-in); the median wait beside an always-on cluster's.

Deploys the e2e cluster shape (e2e_spec, with the product's health-check interval and no REST API) as
its own cluster `bench-day` (namespace slurm-bench-day, own static volumes; a namespace of that name
it did not make is refused, never touched: bench/deploy.py) plus a slot pool `day` of --nodes one-CPU
nodes (pods request 10m CPU, 64Mi), suspend_time --suspend-time. Inside one SSH session on the login
pod as alice, a shell loop sleeps until each job's offset and submits it (`sbatch -p day -N n
--exclusive -t LIMIT -J bursty-<tag> --wrap "sleep D"`), then waits until none is queued or running.

The trace (make_trace, fixed by --seed; --dry-run prints it and its simulation, no cluster needed):
arrival events with exponential gaps of mean 0.8 s, each a burst of 5-15 jobs within 1 s with
probability 0.05, else one job; five quiet spells of 45-75 s (longer than SuspendTime: the pool scales
in mid-run and must scale out under the next arrivals); sizes 1-8 nodes weighted 64/16/4/8/2/2/1/3 %
(mean 2.0); durations log-normal, median 2.5 s, sigma 0.7, clipped to 1-30 s (mean 3.2 s). Seed 17:
arrivals over 898 s, 6,165 node-s of work (83 % of 8 nodes until the simulated always-on end). Time
compression: a day of 1,000 such jobs on 8 nodes has jobs of a few minutes; in ~16 minutes that is
~90x (SuspendTime 20 s stands for ~30 min). Pod start (~3 s) and Slurm's per-job start and end (~1 s on a warm node)
are not compressed: they weigh ~90x more than on a real day, so the figures are pessimistic for
elasticity. Jobs of tens of seconds do not fit the time (1,000 jobs x 2 nodes x 20 s on 8 nodes is
over 80 minutes): --time-scale S multiplies every gap, spell and duration (S=8: median 16 s, ~2.5 h).

Sources: final states and earlier runs from `sacct -X -D` (a job requeued after a node failure keeps
its NODE_FAIL record; sacct does not say why a node failed: the suspend calls are in slurmctld-0's
/var/log/slurmk8s/elastic.log). Waits: Start - Submit from sacct (1 s resolution; Start is reset once
powered-up nodes booted, so a wait includes the pod start). Node-seconds of pool `day`, provisioned
(a worker pod exists) and busy (its node allocated and booted): `slurmk8s status --json` usage.by_pool
(the reconcile loop's counters, sampled each 10 s pass) before the first job and once the pool is back
at zero pods, so the last SuspendTime is paid for; busy from sacct (NNodes x ElapsedRaw) beside it.
The always-on figures are simulated (simulate_always_on: FIFO with EASY backfill, durations known
exactly, instant starts), not deployed: a second run would take as long again, and the simulation is
the floor of a cluster paying for every node all day (Slurm's backfill sees time limits, not
durations). --always-on runs the trace on such a cluster instead: suspend_time 1 day, every node
booted by one job first.

Usage: KUBECONFIG=... python bench/bursty_day.py [--jobs 1000] [--seed 17] [--nodes 8]
           [--suspend-time 20] [--time-scale 1] [--always-on] [--dry-run] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import SLURMK8S, e2e_spec, kjson, kubeconfig, server_version  # noqa: E402
from deploy import down, up  # noqa: E402
from load_10k import pct  # noqa: E402

NAME = "bench-day"  # its own cluster: never the quickstart's or the e2e suite's `local`
NAMESPACE = f"slurm-{NAME}"
POOL = "day"
GOAL_RATIO = 1.3
RECONCILE_PERIOD = 10.0  # s between the reconcile loop's passes (provisioner/reconcile/main.py)
ALWAYS_ON_SUSPEND = "1d"
SIZE_WEIGHTS = (64, 16, 4, 8, 2, 2, 1, 3)  # % of jobs of 1, 2, ... 8 nodes (past the last: the last)
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                      "DEADLINE", "PREEMPTED", "REVOKED"})
SACCT_FIELDS = "JobID,State,NNodes,Submit,Start,End,ElapsedRaw"

# ---------------------------------------------------------------- the trace (pure)


class TraceJob(NamedTuple):
    offset: float  # s after the replay's start
    nodes: int
    duration: float  # s: the job is `sleep duration`


def make_trace(jobs: int = 1000, seed: int = 17, mean_gap: float = 0.8, burst_prob: float = 0.05,
               burst_size: tuple[int, int] = (5, 15), max_nodes: int = 8, *, burst_spread: float = 1.0,
               size_weights: Sequence[float] = SIZE_WEIGHTS, duration_median: float = 2.5,
               duration_sigma: float = 0.7, duration_range: tuple[float, float] = (1.0, 30.0), lulls: int = 5,
               lull_range: tuple[float, float] = (45.0, 75.0)) -> list[TraceJob]:
    """`jobs` jobs by offset (s, to the ms), the same for the same arguments. Arrival events: exponential gaps of
    mean `mean_gap`, a burst of `burst_size` (inclusive) jobs over `burst_spread` s with probability
    `burst_prob`, else one job; `lulls` quiet spells of `lull_range` s more, evenly through. Sizes
    1..max_nodes by `size_weights`; durations (0.1 s) log-normal, clipped to `duration_range`."""
    if (jobs < 0 or mean_gap <= 0 or max_nodes < 1 or not 0 <= burst_prob <= 1 or lulls < 0
            or not 1 <= burst_size[0] <= burst_size[1] or not 0 < duration_range[0] <= duration_range[1]):
        raise ValueError("make_trace: a count or a range out of bounds")
    rng = random.Random(seed)
    sizes = list(range(1, max_nodes + 1))
    weights = [size_weights[min(i, len(size_weights) - 1)] for i in range(max_nodes)]
    lull_after = [round(jobs * k / (lulls + 1)) for k in range(1, lulls + 1)]
    out: list[TraceJob] = []
    t = 0.0
    while len(out) < jobs:
        t += rng.expovariate(1.0 / mean_gap)
        if lull_after and len(out) >= lull_after[0]:
            lull_after.pop(0)
            t += rng.uniform(*lull_range)
        burst = rng.random() < burst_prob
        at = sorted(t + rng.uniform(0, burst_spread) for _ in range(rng.randint(*burst_size))) if burst else [t]
        for offset in at[:jobs - len(out)]:
            nodes = rng.choices(sizes, weights)[0]
            d = rng.lognormvariate(math.log(duration_median), duration_sigma)
            out.append(TraceJob(round(offset, 3), nodes, round(min(max(d, duration_range[0]), duration_range[1]), 1)))
        t = at[-1]
    return sorted(out, key=lambda j: j.offset)


def scale_trace(trace: Sequence[TraceJob], factor: float) -> list[TraceJob]:
    """Every offset and duration times `factor` (--time-scale)."""
    return [TraceJob(round(j.offset * factor, 3), j.nodes, round(j.duration * factor, 1)) for j in trace]


def time_limit_minutes(duration: float) -> int:
    """The job's -t: twice its duration plus a minute, in whole minutes (Slurm's unit), so a job is
    never timed out while its backfill still sees a finite limit."""
    return math.ceil((2 * duration + 60) / 60)


# ---------------------------------------------------------------- an always-on cluster (pure)


def simulate_always_on(trace: Sequence[TraceJob], nodes: int) -> list[float]:
    """Each job's wait (start - offset), in trace order, on `nodes` always-on nodes under FIFO with
    EASY backfill: at every arrival and end, queued jobs start in order while the first fits; then
    the first that does not fit gets a reservation (the earliest time enough nodes are free), and a
    later job that fits now starts if it ends by then or uses only nodes the reservation leaves over.
    Durations are known exactly and starts are instant: the floor of any real scheduler."""
    if any(j.nodes > nodes or j.nodes < 1 for j in trace):
        raise ValueError(f"a job needs more nodes than the {nodes} of the cluster (or none)")
    order = sorted(range(len(trace)), key=lambda i: (trace[i].offset, i))
    waits = [0.0] * len(trace)
    queue: list[int] = []
    running: list[tuple[float, int]] = []  # heap of (end, nodes)
    free, k = nodes, 0

    def start(i: int, now: float) -> None:
        nonlocal free
        waits[i] = now - trace[i].offset
        free -= trace[i].nodes
        heapq.heappush(running, (now + trace[i].duration, trace[i].nodes))

    while k < len(order) or queue:
        now = min(trace[order[k]].offset if k < len(order) else math.inf, running[0][0] if running else math.inf)
        while running and running[0][0] <= now:
            free += heapq.heappop(running)[1]
        while k < len(order) and trace[order[k]].offset <= now:
            queue.append(order[k])
            k += 1
        while queue and trace[queue[0]].nodes <= free:
            start(queue.pop(0), now)
        if not queue:
            continue
        need, avail, shadow, extra = trace[queue[0]].nodes, free, math.inf, 0
        for end, n in sorted(running):
            avail += n
            if avail >= need:
                shadow, extra = end, avail - need
                break
        for i in list(queue[1:]):
            job = trace[i]
            if job.nodes > free:
                continue
            if now + job.duration <= shadow or job.nodes <= extra:
                if now + job.duration > shadow:
                    extra -= job.nodes
                queue.remove(i)
                start(i, now)
    return waits


# ---------------------------------------------------------------- the replay on the login pod

# $1 trace file (lines "<offset ms> <nodes> <sleep s> <limit min>"), $2 tag (job name), $3 partition.
# Lines: "since <-S for sacct>", "start <epoch ms>", per job "j <index> <offset ms> <sbatch began, ms
# after start> <sbatch took ms> <exit> <sbatch output>", "submitted <ms>", "drained <ms>".
REPLAY = r"""
set -u
trace=$1; tag=$2; pool=$3
now_ms() { date +%s%3N; }
echo "since $(date -d @$(( $(date +%s) - 60 )) +%FT%T)"
t0=$(now_ms)
echo "start $t0"
i=0
while read -r at nodes dur limit; do
  left=$(( t0 + at - $(now_ms) ))
  if [ "$left" -gt 0 ]; then sleep "$((left / 1000)).$(printf %03d $((left % 1000)))"; fi
  s=$(now_ms)
  out=$(sbatch --parsable -p "$pool" -N "$nodes" --exclusive -t "$limit" -J "$tag" -o /dev/null \
    --wrap "sleep $dur" </dev/null 2>&1); rc=$?
  echo "j $i $at $((s - t0)) $(( $(now_ms) - s )) $rc ${out//[$'\n']/ }"
  i=$((i + 1))
done < "$trace"
echo "submitted $(( $(now_ms) - t0 ))"
while :; do
  if queued=$(squeue -h -n "$tag" -t PD,R,CG,CF,RQ,RS,S -o %i 2>/dev/null) && [ -z "$queued" ]; then break; fi
  sleep 1
done
echo "drained $(( $(now_ms) - t0 ))"
"""


def trace_lines(trace: Sequence[TraceJob]) -> str:
    """The trace as REPLAY reads it."""
    return "".join(f"{round(j.offset * 1000)} {j.nodes} {j.duration:g} {time_limit_minutes(j.duration)}\n"
                   for j in trace)


@dataclass(frozen=True)
class Submission:
    index: int  # in the trace
    planned_ms: int
    at_ms: int  # when sbatch began, ms after start
    took_ms: int
    rc: int
    job: str | None  # the job id, None when sbatch failed
    output: str


@dataclass
class Replay:
    since: str = ""  # sacct's -S
    start_ms: int = 0  # epoch ms on the login pod; the others ms after it
    submitted_ms: int | None = None
    drained_ms: int | None = None
    submissions: list[Submission] = field(default_factory=list)


def parse_replay(out: str) -> Replay:
    r = Replay()
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        parts = rest.split(" ", 5)
        if word == "since":
            r.since = rest.strip()
        elif word in ("start", "submitted", "drained") and rest.strip().isdigit():
            setattr(r, f"{word}_ms", int(rest))
        elif word == "j" and len(parts) >= 5 and all(p.lstrip("-").isdigit() for p in parts[:5]):
            index, planned, at, took, rc = map(int, parts[:5])
            text = parts[5].strip() if len(parts) > 5 else ""
            job = text.split(";")[0]  # a federated id: "12;cluster"
            ok = rc == 0 and job.isdigit()
            r.submissions.append(Submission(index, planned, at, took, rc, job if ok else None, text))
    return r


# ---------------------------------------------------------------- accounting (pure)


@dataclass(frozen=True)
class Record:
    """One line of `sacct -X -D -P -n -o JobID,State,NNodes,Submit,Start,End,ElapsedRaw`."""
    job: str
    state: str  # the first word ("CANCELLED by 2001" -> CANCELLED)
    nodes: int
    submit: float | None
    start: float | None
    end: float | None
    elapsed: int


def _when(text: str) -> float | None:
    """A sacct time: epoch seconds (SLURM_TIME_FORMAT=%s) or ISO 8601 (as UTC); Unknown / None -> None."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    try:
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def parse_sacct(text: str) -> list[Record]:
    out = []
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) != 7 or not f[0]:
            continue
        state = (f[1].split() or ["?"])[0]
        nodes = int(f[2]) if f[2].isdigit() else 0
        elapsed = int(f[6]) if f[6].isdigit() else 0
        out.append(Record(f[0], state, nodes, _when(f[3]), _when(f[4]), _when(f[5]), elapsed))
    return out


def by_job(records: Sequence[Record]) -> dict[str, list[Record]]:
    """Each job's records in sacct's order (a requeued job's earlier runs first)."""
    jobs: dict[str, list[Record]] = {}
    for r in records:
        jobs.setdefault(r.job, []).append(r)
    return jobs


def accounting_complete(records: Sequence[Record], expected: Sequence[str]) -> bool:
    """Every expected job is in accounting with a final state (slurmdbd gets them asynchronously)."""
    jobs = by_job(records)
    return all(j in jobs and jobs[j][-1].state in TERMINAL for j in expected)


@dataclass
class Outcome:
    completed: int
    not_completed: dict[str, list[str]]  # final state (MISSING: not in accounting) -> jobs
    interrupted: dict[str, list[str]]  # job -> states of its earlier, interrupted runs
    waits: list[float]  # Start of its last run - first Submit, jobs that started
    busy_node_seconds: float  # NNodes x ElapsedRaw over every run

    @property
    def failed_jobs(self) -> list[str]:
        """Not COMPLETED, or COMPLETED only after an interrupted run."""
        return sorted({j for js in self.not_completed.values() for j in js} | set(self.interrupted),
                      key=lambda j: (len(j), j))


def outcome(records: Sequence[Record], expected: Sequence[str]) -> Outcome:
    jobs = by_job(records)
    completed, not_completed, interrupted, waits = 0, {}, {}, []
    for job in expected:
        runs = jobs.get(job)
        if not runs:
            not_completed.setdefault("MISSING", []).append(job)
            continue
        last = runs[-1]
        if last.state == "COMPLETED":
            completed += 1
        else:
            not_completed.setdefault(last.state, []).append(job)
        if len(runs) > 1:  # it ran before: requeued (after a node failure, or by hand)
            interrupted[job] = [r.state for r in runs[:-1]]
        submits = [r.submit for r in runs if r.submit is not None]
        if last.start is not None and submits:
            waits.append(max(0.0, last.start - min(submits)))
    busy = sum(r.nodes * r.elapsed for j in expected for r in jobs.get(j, []))
    return Outcome(completed, not_completed, interrupted, waits, float(busy))


# ---------------------------------------------------------------- node-seconds (pure)


def pool_usage(status: Mapping[str, Any] | None, pool: str) -> tuple[float, float] | None:
    """(provisioned, busy) node-seconds of `pool` since `up` in a `slurmk8s status --json` document
    (0, 0 when it never had a pod); None without usage (controller asleep, metrics unreadable)."""
    usage = (status or {}).get("usage")
    if not usage:
        return None
    row = (usage.get("by_pool") or {}).get(pool) or {}
    return float(row.get("provisioned", 0.0)), float(row.get("busy", 0.0))


def usage_delta(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None,
                pool: str) -> tuple[float, float] | None:
    """(provisioned, busy) node-seconds of `pool` between two status documents."""
    b, a = pool_usage(before, pool), pool_usage(after, pool)
    if a is None or b is None:
        return None
    return round(a[0] - b[0], 1), round(a[1] - b[1], 1)


def ratio(provisioned: float, busy: float) -> float | None:
    return provisioned / busy if busy > 0 else None


# ---------------------------------------------------------------- the report (pure)


def _s(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def waits_summary(waits: Sequence[float]) -> dict[str, float | None]:
    if not waits:
        return {"median": None, "p95": None, "max": None}
    return {"median": statistics.median(waits), "p95": pct(list(waits), 0.95), "max": max(waits)}


def report_lines(doc: Mapping[str, Any]) -> list[str]:
    """The table printed at the end, from the --json document."""
    m, s, u = doc["waits"], doc["always_on_simulated"], doc["node_seconds"]
    kind = "always-on (suspend_time 1 day, every node booted first)" if doc["always_on"] else (
        f"elastic (suspend_time {doc['suspend_time']} s)")
    states = ", ".join(f"{k} {len(v)}" for k, v in doc["not_completed"].items()) or "none"
    r = u.get("ratio")
    goal = "" if doc["always_on"] else f"goal <= {GOAL_RATIO}: " + ("not measured" if r is None else
                                                                     "met" if r <= GOAL_RATIO else "NOT met")
    rows = [
        ("jobs submitted", f"{doc['submitted']} of {doc['jobs']}", f"{doc['sbatch_failed']} sbatch failures; "
         f"submit lag p95 {_s(doc['submit_lag_p95_s'], 2)} s"),
        ("COMPLETED (sacct)", str(doc["completed"]), f"goal: all {doc['jobs']}"),
        ("not COMPLETED, by state", states, "goal: none"),
        ("interrupted and requeued", str(len(doc["interrupted"])), "goal: none (NODE_FAIL = killed by scale-in)"),
        ("wait median / p95", f"{_s(m['median'])} / {_s(m['p95'])} s",
         f"always-on {doc['nodes']} nodes, simulated: {_s(s['median'])} / {_s(s['p95'])} s"),
        ("provisioned node-s (metrics)", _s(u.get("provisioned"), 0), u.get("window", "")),
        ("busy node-s (metrics / sacct)", f"{_s(u.get('busy'), 0)} / {_s(u.get('busy_sacct'), 0)}",
         "sacct: NNodes x ElapsedRaw"),
        ("provisioned / busy", _s(r, 2), goal),
        ("replay wall time", f"{_s(doc['replay_s'], 0)} s", f"trace span {_s(doc['trace_span_s'], 0)} s; always-on "
         f"simulated makespan {_s(s['makespan'], 0)} s"),
    ]
    width = max(len(a) for a, _, _ in rows)
    value = max(len(b) for _, b, _ in rows)
    return [f"P3 a bursty day: {doc['jobs']} jobs (seed {doc['seed']}, time scale {doc['time_scale']:g}) on pool "
            f"{POOL}, {doc['nodes']} nodes, {kind}"] + \
        [f"  {a:<{width}}  {b:<{value}}  {c}".rstrip() for a, b, c in rows] + \
        ["  the always-on figures are simulated (FIFO + EASY backfill, exact durations, instant starts), not a "
         "second cluster run: that would take as long again, and the simulation is the floor of a cluster that "
         "pays for every node all day"]


def makespan(trace: Sequence[TraceJob], waits: Sequence[float]) -> float:
    """When the last job ends, s after the replay's start."""
    return max((j.offset + w + j.duration for j, w in zip(trace, waits)), default=0.0)


def trace_summary(trace: Sequence[TraceJob], nodes: int) -> list[str]:
    """The trace and its always-on simulation (printed first; all --dry-run prints)."""
    waits = simulate_always_on(trace, nodes)
    end = makespan(trace, waits)
    work = sum(j.nodes * j.duration for j in trace)
    sizes = {n: sum(1 for j in trace if j.nodes == n) for n in sorted({j.nodes for j in trace})}
    slow = [j._replace(duration=j.duration + 1) for j in trace]
    rough = simulate_always_on(slow, nodes)
    rough_end = makespan(slow, rough)
    return [f"trace: {len(trace)} jobs over {trace[-1].offset if trace else 0:.0f} s; sizes {sizes}; durations "
            f"median {statistics.median(j.duration for j in trace):.1f} s, mean "
            f"{statistics.mean(j.duration for j in trace):.1f} s, max {max(j.duration for j in trace):.1f} s",
            f"work {work:.0f} node-s = {work / (nodes * end) * 100:.0f} % of {nodes} nodes until the simulated end",
            f"always-on {nodes} nodes, simulated: waits median {statistics.median(waits):.1f} s, p95 "
            f"{pct(waits, 0.95):.1f} s, max {max(waits):.1f} s; all done {end:.0f} s after the first offset",
            f"the same with 1 s more per job (a guess at Slurm's start and end on a warm node): waits median "
            f"{statistics.median(rough):.1f} s, all done {rough_end:.0f} s (a rough replay time)"]


# ---------------------------------------------------------------- the cluster


def wait_zero_pods(timeout: float) -> bool:
    """Until pool `day` has no worker pod (Terminating ones included); False after `timeout` s."""
    deadline = time.monotonic() + timeout
    while kjson("get", "pods", "-n", NAMESPACE, "-l", f"slurmk8s.io/pool={POOL}")["items"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(2)
    return True


def status_json() -> dict[str, Any] | None:
    """`slurmk8s status --json` of the cluster, as a script runs it; None (and why, printed) on failure."""
    try:
        proc = subprocess.run([SLURMK8S, "status", "--namespace", NAMESPACE, "--json"], capture_output=True,
                              text=True, env=dict(os.environ, KUBECONFIG=kubeconfig()), timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"slurmk8s status --json: {err}")
        return None
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        print(f"slurmk8s status --json exit {proc.returncode}, no JSON: {proc.stderr.strip()[-500:]}")
        return None
    if doc.get("errors"):
        print(f"slurmk8s status --json reports: {doc['errors']}")
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--nodes", type=int, default=8, help="Slurm nodes (worker pods at most) in the pool")
    parser.add_argument("--suspend-time", type=int, default=20, help="elasticity.suspend_time, s")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplies every gap and duration")
    parser.add_argument("--always-on", action="store_true", help="suspend_time 1 day, every node booted first")
    parser.add_argument("--dry-run", action="store_true", help="print the trace and its simulation; no cluster")
    parser.add_argument("--json", type=Path, metavar="OUT")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    args = parser.parse_args()
    if args.jobs < 1 or args.nodes < 1 or args.time_scale <= 0:
        parser.error("--jobs and --nodes must be >= 1, --time-scale > 0")
    trace = scale_trace(make_trace(args.jobs, args.seed, max_nodes=min(8, args.nodes)), args.time_scale)
    print("\n".join(trace_summary(trace, args.nodes)))
    if args.dry_run:
        return
    work = Path("/tmp/slurmk8s-bench-day")
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec = e2e_spec(key.export_public_key().decode().strip() + " bench")
    spec["name"] = NAME
    spec["rest"] = {"enabled": False}
    spec.pop("health", None)  # the product's interval (300 s), not the e2e suite's 15 s
    spec["elasticity"] = {"suspend_time": ALWAYS_ON_SUSPEND if args.always_on else args.suspend_time,
                          "resume_timeout": 180}
    spec["pools"].append({"name": POOL, "mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "10m",
                          "pod_memory_request": "64Mi", "domains": [{"name": "local", "count": args.nodes}]})
    up_s = up(spec, work)
    print(f"slurmk8s up: {up_s:.1f} s")
    try:
        run(args, trace, key, work, up_s)
    finally:
        if not args.keep:
            down(NAME, work)


def run(args: argparse.Namespace, trace: list[TraceJob], key: asyncssh.SSHKey, work: Path, up_s: float) -> None:
    """The replay and its accounting in one SSH session, node-seconds around it, the report."""
    host = kjson("get", "service", "-n", NAMESPACE, "login")["spec"]["clusterIP"]
    tag = f"bursty-{int(time.time())}"
    if not args.always_on:
        wait_zero_pods(300)
    status: dict[str, dict[str, Any] | None] = {}

    async def session() -> tuple[str, str, list[Record]]:
        async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None) as conn:
            await conn.run(f"cat > bursty-replay.sh <<'EOF'\n{REPLAY}\nEOF", check=True)
            await conn.run("cat > bursty-trace.txt", input=trace_lines(trace), check=True)
            slurm = str((await conn.run("sinfo --version", check=False)).stdout).strip() or "?"
            if args.always_on:  # boot every node with one job; nothing is suspended for a day
                await conn.run(f"srun -p {POOL} -N {args.nodes} --exclusive -J bursty-warm true", check=True,
                               timeout=600)
            status["before"] = status_json()
            res = await conn.run(f"bash bursty-replay.sh bursty-trace.txt {tag} {POOL}", check=True,
                                 timeout=trace[-1].offset + 7200)
            status["drained"] = status_json()
            replay = parse_replay(str(res.stdout))
            ids = [s.job for s in replay.submissions if s.job]
            records: list[Record] = []
            for _ in range(60):  # slurmdbd gets the records asynchronously
                got = await conn.run(f"SLURM_TIME_FORMAT=%s sacct -X -D -P -n --name={tag} -S {replay.since} "
                                     f"-o {SACCT_FIELDS}", check=False)
                records = parse_sacct(str(got.stdout))
                if accounting_complete(records, ids):
                    break
                await asyncio.sleep(3)
            return str(res.stdout), slurm, records

    out, slurm, records = asyncio.run(session())
    (work / "replay.out").write_text(out)
    if args.always_on:
        after, window = status["drained"], "first job to queue drained (nodes stay up)"
    else:
        zero = wait_zero_pods(args.suspend_time + 300)
        time.sleep(RECONCILE_PERIOD + 2)  # one more pass counts the last pod's end
        after = status_json()
        late = f" (NOT reached: read after SuspendTime + 300 s = {args.suspend_time + 300} s)"
        window = "first job to pool back at zero pods" + ("" if zero else late)
    replay = parse_replay(out)
    ids = [s.job for s in replay.submissions if s.job]
    result = outcome(records, ids)
    delta, at_drain = usage_delta(status["before"], after, POOL), usage_delta(status["before"], status["drained"], POOL)
    sim = simulate_always_on(trace, args.nodes)
    lags = [(s.at_ms - s.planned_ms) / 1000 for s in replay.submissions]
    doc = {
        "kubernetes": server_version(), "slurm": slurm, "up_seconds": round(up_s, 3),
        "jobs": len(trace), "seed": args.seed,
        "nodes": args.nodes, "suspend_time": None if args.always_on else args.suspend_time,
        "time_scale": args.time_scale, "always_on": args.always_on, "tag": tag, "trace_span_s": trace[-1].offset,
        "submitted": len(ids), "sbatch_failed": len(replay.submissions) - len(ids),
        "sbatch_errors": [s.output for s in replay.submissions if s.job is None][:5],
        "submit_lag_p95_s": pct(lags, 0.95) if lags else None,
        "replay_s": None if replay.drained_ms is None else replay.drained_ms / 1000,
        "completed": result.completed, "not_completed": result.not_completed, "interrupted": result.interrupted,
        "waits": {**waits_summary(result.waits), "values": result.waits},
        "always_on_simulated": {**waits_summary(sim), "makespan": makespan(trace, sim)},
        "node_seconds": {"provisioned": delta and delta[0], "busy": delta and delta[1],
                         "ratio": ratio(*delta) if delta else None, "busy_sacct": result.busy_node_seconds,
                         "window": window, "at_drain": at_drain and dict(zip(("provisioned", "busy"), at_drain)),
                         "goal_ratio": GOAL_RATIO},
    }
    print("\n".join(report_lines(doc)))
    if result.failed_jobs:
        print(f"jobs not COMPLETED or interrupted (first 20): {result.failed_jobs[:20]}; why: sacct -j ID, and "
              f"/var/log/slurmk8s/elastic.log in {NAMESPACE}/slurmctld-0")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if doc["sbatch_failed"] or result.failed_jobs or result.completed < len(trace):
        sys.exit("not every job was submitted and COMPLETED without interruption: see above")


if __name__ == "__main__":
    main()
