"""The rows of bench/all.py's one table, each built by a pure function from the JSON document a
bench writes with --json (tests/test_bench_all.py): what was measured, the floor measured in the
same run, the ratio, the goal, and met / not met / not measured, with why.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from p1_phases import pct

LARGE = ("1048576", "16777216")  # P6's "large messages" (mpi_p6.LARGE), as its JSON keys them


@dataclass(frozen=True)
class Check:
    """One part of a goal: ok True (met) / False (not met) / None (not measured: `why`)."""
    goal: str
    ok: bool | None
    why: str = ""


@dataclass
class Row:
    id: str
    what: str
    result: str
    floor: str
    ratio: str
    goal: str
    verdict: str  # met | not met | not measured | failed
    note: str = ""  # why not measured, which part is not met, or how it failed
    tail: list[str] = field(default_factory=list)  # a failed bench's last lines of output
    source: str = ""  # a row from a JSON given with --use: that file and when it was written


WHAT = {
    "P1": "`sbatch` -> job RUNNING, 1 node, from zero workers",
    "P3": "a bursty day: 1,000 jobs of 1-8 nodes, in bursts and 5 quiet spells past SuspendTime, on an elastic "
          "pool of 8 nodes (time compressed ~90x)",
    "P4": "4,096 Slurm nodes, 32,768 pending jobs: sbatch, squeue, `slurmk8s status`, the reconcile pass",
    "P4b": "one resume of 500 nodes -> 500 worker pods Running (kwok nodes)",
    "P5": "`slurmk8s up` from nothing -> login answers SSH",
    "P6": "MPI, 2 ranks on 2 Kubernetes nodes, large messages (1 MiB, 16 MiB), host_network",
    "P7": "control tier asleep (accounting on): `slurmk8s submit` -> job RUNNING; a plain `sbatch` on the login "
          "pod -> job id",
    "render": "inventory + topology + every generated file, 10,000 nodes, 3 levels",
}
GOAL = {
    "P1": "p50 <= 2.5 s and <= 2.5x the bare pod start",
    "P3": "provisioned <= 1.3x busy node-seconds (the product's metrics); every job COMPLETED, none interrupted",
    "P4": "sbatch p99 <= 500 ms, squeue p99 <= 2 s, status <= 3 s, reconcile pass <= 2 s",
    "P4b": "<= 5 s and <= 1.3x the floor (direct pod creation)",
    "P5": "<= 60 s",
    "P6": ">= 0.9x the host processes (ping-pong bandwidth, allreduce time)",
    "P7": "submit -> RUNNING <= 6 s; plain sbatch -> job id <= 3 s",
    "render": "<= 1 s (median)",
}
ORDER = ("P1", "P3", "P4", "P4b", "P5", "P6", "P7", "render")
NONE = "—"


def verdict(checks: Sequence[Check]) -> tuple[str, str]:
    """(verdict, note): not met if a measured part is not met, else not measured if a part was not
    measured, else met. The note names the parts not met and why the others were not measured."""
    missed = [c for c in checks if c.ok is False]
    unknown = [c for c in checks if c.ok is None]
    parts = [f"{c.goal}: not met" for c in missed] + [f"{c.goal}: not measured ({c.why})" for c in unknown]
    if missed:
        return "not met", "; ".join(parts) if len(checks) > 1 else ""
    if unknown:
        return "not measured", "; ".join(parts)
    return "met", ""


def _row(id: str, result: str, floor: str, ratio: str, checks: Sequence[Check]) -> Row:
    v, note = verdict(checks)
    return Row(id, WHAT[id], result, floor, ratio, GOAL[id], v, note)


def render_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/render_scale.py --json."""
    n, best, median = doc["k8s_nodes"], doc["best"], doc["median"]
    result = (f"{n:,} nodes: median {median:.3f} s, best {best:.3f} s ({doc['repeat']} runs); "
              f"peak RSS {doc['peak_rss_mib']:.0f} MiB")
    check = (Check("<= 1 s", median <= 1.0) if n == 10_000
             else Check("<= 1 s for 10,000 nodes", None, f"it ran {n:,} nodes"))
    return [_row("render", result, NONE, NONE, [check])]


def p1_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/k8s_submit_latency.py --json: P1, and P5 (p5_row)."""
    zero = [r["seconds"] for r in doc["zero"]]
    idle = [r["seconds"] for r in doc["idle"]]
    bare = doc["bare_pod_start"]
    p50, floor = statistics.median(zero), statistics.median(bare)
    ratio = p50 / floor
    result = f"p50 {p50:.2f} s, p95 {pct(zero, 0.95):.2f} s ({len(zero)} runs)"
    if idle:
        result += f"; from idle workers p50 {statistics.median(idle):.2f} s"
    p1 = _row("P1", result, f"bare pod start p50 {floor:.2f} s ({len(bare)} pods)", f"{ratio:.2f}x",
              [Check("p50 <= 2.5 s", p50 <= 2.5), Check("<= 2.5x the bare pod start", ratio <= 2.5)])
    return [p1, p5_row(doc)]


def p5_row(doc: Mapping[str, Any]) -> Row:
    """bench/k8s_submit_latency.py --json: P5, measured when its `up` started from nothing."""
    up, login = doc.get("up_seconds"), doc.get("login_ssh_seconds")
    if login is not None and doc.get("from_nothing"):
        return _row("P5", f"login answered SSH {login:.1f} s after `slurmk8s up` of bench-p1 started from nothing "
                          f"(no namespace, volume data or Pulumi state; images cached on the nodes); `up` returned "
                          f"after {up:.1f} s", NONE, NONE, [Check("<= 60 s", login <= 60.0)])
    why = ("its volumes' data could not be emptied (not the local cluster): an earlier run's may remain"
           if login is not None else "this JSON was written before the bench timed the login's first SSH answer")
    return _row("P5", NONE if up is None else f"`slurmk8s up` of bench-p1 returned after {up:.1f} s", NONE, NONE,
                [Check("<= 60 s", None, why)])


def p4b_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/resume_500.py --json."""
    n, running = doc["nodes"], doc["running_s"]
    result = (f"all {n} pods Running {running:.2f} s (resume program returned {doc['created_s']:.2f} s, "
              f"exit {doc['resume_exit']}, {doc['set_down']} nodes DOWN; suspend {doc['deleted_s']:.2f} s)")
    checks = [Check("<= 5 s", running <= 5.0) if n == 500 else Check("<= 5 s for 500 nodes", None, f"it ran {n}")]
    if n == 4096:  # P4: one resume of 4,096 nodes creates every pod within 20 s
        checks.append(Check("every pod created <= 20 s (4,096 nodes)", doc["created_s"] <= 20.0))
    passes = doc.get("reconcile_pass_s") or []
    if passes:
        mean = sum(passes) / len(passes)
        result += f"; reconcile pass at {n} pods mean {mean:.2f} s ({len(passes)} passes"
        if "reconcile_watch_sync_s" in doc:
            result += (f"; the pod watch's first list {doc['reconcile_watch_sync_s']:.2f} s, a pass listing "
                       f"every pod {doc['reconcile_listed_pass_s']:.2f} s")
        result += ")"
        if n == 4096:  # P4: the reconcile pass at 4,096 pods within 2 s
            checks.append(Check("reconcile pass <= 2 s (4,096 pods)", mean <= 2.0))
    floor_running = doc.get("floor_running_s")
    if floor_running:  # measured in the same run since issue #17 item 3
        ratio = running / floor_running
        floor = (f"the same {n} pods created straight through the API: all Running {floor_running:.2f} s "
                 f"(created {doc['floor_created_s']:.2f} s), {doc['parallel']} calls in flight")
        checks.append(Check("<= 1.3x the floor", ratio <= 1.3))
    else:
        ratio, floor = None, "not measured"
        checks.append(Check("<= 1.3x the floor", None, "this resume_500 run did not time direct pod creation"))
    if doc["resume_exit"] != 0 or doc["set_down"]:
        checks.append(Check("every node resumed (exit 0, none DOWN)", False))
    return [_row("P4b", result, floor, NONE if ratio is None else f"{ratio:.2f}x", checks)]


def p6_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/mpi_p6.py --json (message sizes are strings there)."""
    host, ratios = doc["host"], doc.get("ratios") or {}

    def worst(variant: str) -> float:
        return min(ratios[variant][kind][n] for kind in ("pingpong", "allreduce") for n in LARGE)

    def state(variant: str, title: str) -> str:
        if variant in ratios:
            return f"{title} worst {worst(variant):.2f}x host"
        failed = (doc.get(variant) or {}).get("failed")
        return f"{title} failed" if failed else f"{title} not run"

    result = f"{state('hostnet', 'host_network')}; {state('pod', 'pod network')}"
    big = LARGE[-1]
    floor = (f"host processes, 16 MiB: ping-pong {host['pingpong'][big]['mb_s']:.0f} MB/s, "
             f"allreduce {host['allreduce'][big]['us']:.0f} us")
    ratio = "; ".join(f"{title} {worst(v):.2f}x" for v, title in (("hostnet", "host_network"), ("pod", "pod"))
                      if v in ratios) or NONE
    if "hostnet" in ratios:
        check = Check(">= 0.9x host", worst("hostnet") >= 0.9)
    else:
        why = doc.get("hostnet_skipped") or (doc.get("hostnet") or {}).get("failed") or "host_network not run"
        check = Check(">= 0.9x host", None, f"host_network: {why}")
    return [_row("P6", result, floor, ratio, [check])]


def p3_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/bursty_day.py --json: the elastic pool's provisioned node-seconds over its busy ones (the
    floor: a node is paid for at least while it works), the jobs' fates and waits beside an always-on
    cluster's (simulated from the same trace)."""
    jobs, done, u = doc["jobs"], doc["completed"], doc["node_seconds"]
    prov, busy, r = u.get("provisioned"), u.get("busy"), u.get("ratio")
    states = {k: len(v) for k, v in doc["not_completed"].items()}
    if doc["sbatch_failed"]:
        states["sbatch failed"] = doc["sbatch_failed"]
    interrupted = len(doc["interrupted"])
    wait = lambda s: NONE if s is None else f"{s:.1f} s"  # noqa: E731
    lost = f" ({', '.join(f'{k} {n}' for k, n in states.items())})" if states else ""
    result = (f"{jobs:,} jobs on {doc['nodes']} nodes"
              + (f" (time scale {doc['time_scale']:g})" if doc["time_scale"] != 1 else "")
              + f": {done:,} COMPLETED, {jobs - done:,} not COMPLETED{lost}"
              + (f", {interrupted} interrupted and requeued" if interrupted else "")
              + f"; wait median {wait(doc['waits']['median'])} (always-on, simulated: "
              f"{wait(doc['always_on_simulated']['median'])}); "
              + ("node-seconds not measured" if prov is None else f"provisioned {prov:,.0f} node-s"))
    floor = ("not measured" if busy is None else
             f"busy {busy:,.0f} node-s (the product's metrics, {u.get('window') or 'window not given'}; "
             f"by sacct {u['busy_sacct']:,.0f})")
    goal = "provisioned <= 1.3x busy"
    if doc["always_on"]:
        check = Check(goal, None, "an --always-on run (suspend_time 1 day): the comparison, not the elastic pool")
    elif jobs != 1000:
        check = Check(f"{goal} for 1,000 jobs", None, f"it ran {jobs:,} jobs")
    elif r is None:
        check = Check(goal, None, "no node-seconds: `slurmk8s status --json` gave no usage before or after the day")
    else:
        check = Check(goal, r <= 1.3)
    checks = [check, Check("every job COMPLETED", done == jobs), Check("none interrupted", not interrupted)]
    return [_row("P3", result, floor, NONE if r is None else f"{r:.2f}x", checks)]


def p4_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/queue_32k.py --json."""
    sb, sq, st = doc["sbatch_s"], doc["squeue_s"], doc["status_s"]

    def p99(values: Sequence[float]) -> float | None:
        return sorted(values)[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))] if values else None

    def seconds(value: float | None, scale: float = 1.0, unit: str = "s", digits: int = 2) -> str:
        return NONE if value is None else f"{value * scale:.{digits}f} {unit}"

    def timed(goal: str, value: float | None, limit: float, what: str, ok: bool = True) -> Check:
        if not ok:
            return Check(goal, False)
        return Check(goal, None, f"no {what} call timed") if value is None else Check(goal, value <= limit)

    pass_s = doc["reconcile_pass_mean_s"]
    status_max = max(st) if st else None
    result = (f"{doc['queued']} jobs pending on {doc['nodes']} nodes: sbatch p99 {seconds(p99(sb), 1000, 'ms', 0)} "
              f"({len(sb)} calls, {doc['sbatch_failed']} failed), squeue p99 {seconds(p99(sq))}, status max "
              f"{seconds(status_max)}, reconcile pass mean {pass_s:.2f} s ({doc['reconcile_passes']} passes"
              + (f", peak RSS {doc['reconcile_peak_kib'] / 1024:.0f} MiB)" if doc.get("reconcile_peak_kib") else ")"))
    checks = [timed("sbatch p99 <= 500 ms", p99(sb), 0.5, "sbatch", ok=not doc["sbatch_failed"]),
              timed("squeue p99 <= 2 s", p99(sq), 2.0, "squeue"), timed("status <= 3 s", status_max, 3.0, "status"),
              Check("reconcile pass <= 2 s", pass_s <= 2.0) if doc["reconcile_passes"] else
              Check("reconcile pass <= 2 s", None, "no pass finished at the full queue")]
    if doc["queued"] < doc["jobs"]:
        checks.append(Check(f"{doc['jobs']} jobs queued", False))
    return [_row("P4", result, NONE, NONE, checks)]


def p7_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/wake_submit.py --json."""
    seen = doc["to_seen_running"]
    med = statistics.median(seen)
    result = (f"RUNNING seen: median {med:.1f} s, max {max(seen):.1f} s ({len(seen)} runs"
              f"{', login asleep too' if doc.get('login_sleeps') else ''}); Slurm start_time median "
              f"{statistics.median(doc['to_start_time']):.0f} s; job id median {statistics.median(doc['to_job_id']):.1f} s")
    checks = [Check("submit -> RUNNING <= 6 s", med <= 6.0)]
    plain = doc.get("plain_to_job_id") or []
    if plain:
        plain_med = statistics.median(plain)
        result += (f". Plain sbatch: job id median {plain_med:.1f} s, max {max(plain):.1f} s ({len(plain)} runs), "
                   f"RUNNING seen median {statistics.median(doc['plain_to_seen_running']):.1f} s")
        checks.append(Check("plain sbatch -> job id <= 3 s", plain_med <= 3.0))
    else:
        checks.append(Check("plain sbatch -> job id <= 3 s", None, "this run did not time it (--no-plain)"))
    return [_row("P7", result, NONE, NONE, checks)]
