"""One table of the benchmarks (issue #17 item 6): runs the fast benches, each as a subprocess with
--json, and prints P1, P4, P4b, P5, P6, P7 and the render bench in one table: what, the result, the floor
measured in the same run, the ratio, the goal, and met / not met / not measured (why) / failed.

Usage: python bench/all.py [--only NAME,...] [--skip NAME,...] [--timeout [NAME=]SECONDS ...]
           [--markdown OUT] [--out DIR] [--list]
NAME is a bench's script name or one of its rows' ids (case does not matter):

  script               arguments      rows      needs
  render_scale         --nodes 10000  render    nothing (pure Python)
  resume_500                          P4b       the local cluster, the toolchain's kwok
  queue_32k                           P4        a cluster at KUBECONFIG
  k8s_submit_latency   --runs 5       P1, P5    a cluster at KUBECONFIG (default the local one)
  wake_submit          --runs 1       P7        a cluster at KUBECONFIG
  mpi_p6                              P6        the local cluster, Docker (the host-process floor)

resume_500 starts the kwok controller itself (`slurmk8s cluster kwok-node`), which needs kwok in the
toolchain (`slurmk8s toolchain build`; `slurmk8s cluster up --kwok` also starts it). A bench whose
need is missing is not run: its rows say "not measured" and why. So do the rows of a bench left out
by --only / --skip: every row is always in the table.

Each bench runs in its own process group under its own timeout (`--list` shows them; --timeout 900
sets all, --timeout mpi_p6=2400 one). On a timeout it gets SIGINT, so its clean-up (`finally`) runs,
and SIGKILL 120 s later. A bench that exits non-zero, times out or writes no readable JSON is a
"failed" row with its exit code and the last lines of its output, and all.py exits 1.
Every bench's output and JSON are kept in DIR (default /tmp/slurmk8s-bench-all/<UTC time>), with
results.json (every row).

--markdown OUT writes the same table as Markdown, with the date (UTC), the machine (CPUs and their
model, memory, kernel, Kubernetes and Slurm versions as the benches report them, load average) and
the command above it: `python bench/all.py --markdown docs/benchmarks-table.md` makes the table
docs/benchmarks.md points to. The rows are built from the JSON by pure functions
(tests/test_bench_all.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(BENCH))

from helpers import LOCAL_KUBECONFIG, TOOLCHAIN_BIN, kubeconfig, kubectl_exe  # noqa: E402
from p1_phases import pct  # noqa: E402

TAIL = 30  # lines of a failed bench's output in the table's notes
GRACE = 120.0  # s between SIGINT and SIGKILL for a bench past its timeout
LARGE = ("1048576", "16777216")  # P6's "large messages" (mpi_p6.LARGE), as its JSON keys them

# ---------------------------------------------------------------- the rows


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


WHAT = {
    "P1": "`sbatch` -> job RUNNING, 1 node, from zero workers",
    "P4": "4,096 Slurm nodes, 32,768 pending jobs: sbatch, squeue, `slurmk8s status`, the reconcile pass",
    "P4b": "one resume of 500 nodes -> 500 worker pods Running (kwok nodes)",
    "P5": "`slurmk8s up` from nothing -> login answers SSH",
    "P6": "MPI, 2 ranks on 2 Kubernetes nodes, large messages (1 MiB, 16 MiB), host_network",
    "P7": "`slurmk8s submit`, control tier asleep -> job RUNNING",
    "render": "inventory + topology + every generated file, 10,000 nodes, 3 levels",
}
GOAL = {
    "P1": "p50 <= 2.5 s and <= 2.5x the bare pod start",
    "P4": "sbatch p99 <= 500 ms, squeue p99 <= 2 s, status <= 3 s, reconcile pass <= 2 s",
    "P4b": "<= 5 s and <= 1.3x the floor (direct pod creation)",
    "P5": "<= 60 s",
    "P6": ">= 0.9x the host processes (ping-pong bandwidth, allreduce time)",
    "P7": "<= 6 s",
    "render": "<= 1 s (median)",
}
ORDER = ("P1", "P4", "P4b", "P5", "P6", "P7", "render")
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
    """bench/k8s_submit_latency.py --json: P1, and P5 (not measured by it)."""
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
    up = doc.get("up_seconds")
    p5 = _row("P5", NONE if up is None else f"`slurmk8s up` of bench-p1 returned after {up:.1f} s", NONE, NONE,
              [Check("<= 60 s", None, "no bench here times `up` from nothing to the login's SSH answer; the "
                     "e2e test test_up_from_nothing_and_login_answers does, and k8s_submit_latency's `up` may "
                     "reuse its cluster's state")])
    return [p1, p5]


def p4b_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/resume_500.py --json."""
    n, running = doc["nodes"], doc["running_s"]
    result = (f"all {n} pods Running {running:.2f} s (resume program returned {doc['created_s']:.2f} s, "
              f"exit {doc['resume_exit']}, {doc['set_down']} nodes DOWN; suspend {doc['deleted_s']:.2f} s)")
    checks = [Check("<= 5 s", running <= 5.0) if n == 500 else Check("<= 5 s for 500 nodes", None, f"it ran {n}")]
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


def p4_rows(doc: Mapping[str, Any]) -> list[Row]:
    """bench/queue_32k.py --json."""
    sb, sq, st = doc["sbatch_s"], doc["squeue_s"], doc["status_s"]
    p99 = lambda values: sorted(values)[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]  # noqa: E731
    pass_s = doc["reconcile_pass_mean_s"]
    result = (f"{doc['queued']} jobs pending on {doc['nodes']} nodes: sbatch p99 {p99(sb) * 1000:.0f} ms "
              f"({len(sb)} calls, {doc['sbatch_failed']} failed), squeue p99 {p99(sq):.2f} s, status max "
              f"{max(st):.2f} s, reconcile pass mean {pass_s:.2f} s ({doc['reconcile_passes']} passes"
              + (f", peak RSS {doc['reconcile_peak_kib'] / 1024:.0f} MiB)" if doc.get("reconcile_peak_kib") else ")"))
    checks = [Check("sbatch p99 <= 500 ms", p99(sb) <= 0.5 and not doc["sbatch_failed"]),
              Check("squeue p99 <= 2 s", p99(sq) <= 2.0), Check("status <= 3 s", max(st) <= 3.0),
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
    return [_row("P7", result, NONE, NONE, [Check("<= 6 s", med <= 6.0)])]


# ---------------------------------------------------------------- the benches


@dataclass(frozen=True)
class Bench:
    name: str
    ids: tuple[str, ...]
    args: tuple[str, ...]
    timeout: float
    needs: tuple[str, ...]
    rows: Callable[[Mapping[str, Any]], list[Row]]
    script: Path | None = None  # default bench/<name>.py

    @property
    def path(self) -> Path:
        return self.script or BENCH / f"{self.name}.py"


BENCHES = (
    Bench("render_scale", ("render",), ("--nodes", "10000"), 300, (), render_rows),
    Bench("resume_500", ("P4b",), (), 600, ("cluster", "local", "kwok"), p4b_rows),
    Bench("queue_32k", ("P4",), (), 1800, ("cluster",), p4_rows),
    Bench("k8s_submit_latency", ("P1", "P5"), ("--runs", "5"), 1800, ("cluster",), p1_rows),
    Bench("wake_submit", ("P7",), ("--runs", "1"), 1200, ("cluster",), p7_rows),
    Bench("mpi_p6", ("P6",), (), 1800, ("cluster", "local", "docker"), p6_rows),
)


def select(benches: Sequence[Bench], only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Bench]:
    """The benches --only / --skip leave, by script name or row id (any case); an unknown name is an error."""
    def named(names: Iterable[str]) -> set[str]:
        out = set()
        for name in (n.strip() for n in names if n.strip()):
            hit = {b.name for b in benches if name.lower() in {b.name.lower(), *(i.lower() for i in b.ids)}}
            if not hit:
                known = ", ".join(sorted({b.name for b in benches} | {i for b in benches for i in b.ids}))
                raise ValueError(f"unknown bench {name!r} (known: {known})")
            out |= hit
        return out
    only_set, skip_set = named(only), named(skip)
    return [b for b in benches if (not only_set or b.name in only_set) and b.name not in skip_set]


def timeouts(benches: Sequence[Bench], given: Iterable[str]) -> dict[str, float]:
    """--timeout values: SECONDS (every bench) or NAME=SECONDS (NAME as in select), later ones win."""
    out = {b.name: float(b.timeout) for b in benches}
    for item in given:
        name, _, value = item.rpartition("=")
        seconds = float(value)
        if seconds <= 0:
            raise ValueError(f"--timeout {item}: must be > 0")
        for b in (select(benches, [name]) if name else benches):
            out[b.name] = seconds
    return out


@dataclass
class Outcome:
    name: str
    status: str  # ok | failed | timeout | skipped
    code: int | None = None
    seconds: float = 0.0
    doc: dict[str, Any] | None = None
    reason: str = ""  # skipped: why; failed: what was wrong besides the exit code
    tail: list[str] = field(default_factory=list)
    log: str = ""


def rows_for(bench: Bench, outcome: Outcome | None) -> list[Row]:
    """A bench's rows: from its JSON, or one per id saying why there is none. Never none."""
    def each(result: str, verdict_: str, note: str, tail: Sequence[str] = ()) -> list[Row]:
        return [Row(i, WHAT[i], result, NONE, NONE, GOAL[i], verdict_, note, list(tail)) for i in bench.ids]

    if outcome is None:
        return each(NONE, "not measured", f"{bench.name} not run (left out by --only / --skip)")
    if outcome.status == "skipped":
        return each(NONE, "not measured", f"{bench.name} not run: {outcome.reason}")
    if outcome.status == "timeout":
        return each(f"timed out after {outcome.seconds:.0f} s", "failed",
                    f"{bench.name} timed out after {outcome.seconds:.0f} s (exit {outcome.code}); "
                    f"last lines of its output ({outcome.log}):", outcome.tail)
    if outcome.status == "ok" and outcome.doc is not None:
        try:
            return bench.rows(outcome.doc)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as err:
            reason = f"its JSON could not be read ({type(err).__name__}: {err})"
    else:
        reason = outcome.reason
    return each(f"failed (exit {outcome.code})", "failed",
                f"{bench.name} exit {outcome.code}{': ' + reason if reason else ''}; last lines of its output "
                f"({outcome.log}):", outcome.tail)


def table_rows(outcomes: Mapping[str, Outcome], benches: Sequence[Bench] = BENCHES) -> list[Row]:
    """Every bench's rows (a bench not in `outcomes` was left out), in ORDER."""
    rows = [r for b in benches for r in rows_for(b, outcomes.get(b.name))]
    return sorted(rows, key=lambda r: ORDER.index(r.id) if r.id in ORDER else len(ORDER))


# ---------------------------------------------------------------- text and Markdown

COLUMNS = ("id", "what", "result", "floor (same run)", "ratio", "goal", "verdict")


def _notes(rows: Sequence[Row]) -> tuple[list[list[str]], list[tuple[str, list[str]]]]:
    """The cells of each row, the verdict with its note's number, and the notes (the same note once)."""
    notes: list[tuple[str, list[str]]] = []
    cells = []
    for r in rows:
        v = r.verdict
        if r.note:
            key = (r.note, r.tail)
            if key not in notes:
                notes.append(key)
            v += f" ({notes.index(key) + 1})"
        cells.append([r.id, r.what, r.result, r.floor, r.ratio, r.goal, v])
    return cells, notes


def text_table(rows: Sequence[Row]) -> str:
    cells, notes = _notes(rows)
    widths = [max(len(x) for x in col) for col in zip(COLUMNS, *cells)]
    out = ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [list(COLUMNS), *cells]]
    out.insert(1, "  ".join("-" * w for w in widths))
    for n, (note, tail) in enumerate(notes, 1):
        out.append(f"({n}) {note}")
        out += [f"      {line}" for line in tail]
    return "\n".join(out)


def _md(cell: str) -> str:
    return cell.replace("|", "\\|")


def markdown(rows: Sequence[Row], header: str) -> str:
    cells, notes = _notes(rows)
    out = ["<!-- generated by bench/all.py (issue #17 item 6); do not edit: run it again -->", "", header, "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(_md(c) for c in line) + " |" for line in cells]
    if notes:
        out.append("")
    for n, (note, tail) in enumerate(notes, 1):
        out.append(f"({n}) {note}")
        if tail:
            out += ["", "```", *(t.replace("```", "'''") for t in tail), "```"]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return "model unknown"


def mem_gib(meminfo: str) -> float | None:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20  # kB
    return None


def versions(docs: Iterable[Mapping[str, Any]], key: str) -> list[str]:
    """The distinct `key` values the benches' JSON report ("?" and empty left out), in order."""
    out: list[str] = []
    for doc in docs:
        v = str(doc.get(key) or "").strip()
        if v and not v.startswith("?") and v not in out:
            out.append(v)
    return out


def machine_line(*, date: str, cpus: int | None, cpuinfo: str, meminfo: str, kernel: str, python: str,
                 kubernetes: Sequence[str], slurm: Sequence[str], load: tuple[float, float], command: str) -> str:
    mem = mem_gib(meminfo)
    parts = [f"{cpus or '?'} CPUs ({cpu_model(cpuinfo)})", f"{mem:.1f} GiB memory" if mem else "memory unknown",
             f"Linux {kernel}", f"Python {python}",
             f"Kubernetes {', '.join(kubernetes)}" if kubernetes else "Kubernetes not reported",
             f"Slurm {', '.join(s.removeprefix('slurm ') for s in slurm)}" if slurm else "Slurm not reported",
             f"load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end"]
    return f"Measured {date} on {', '.join(parts)}; `{command}`."


def this_machine(outcomes: Mapping[str, Outcome], probed_k8s: str, load: tuple[float, float], command: str,
                 date: str) -> str:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""
    docs = [o.doc for o in outcomes.values() if o.doc]
    kube = versions(docs, "kubernetes") or ([probed_k8s] if probed_k8s else [])
    return machine_line(date=date, cpus=os.cpu_count(), cpuinfo=read("/proc/cpuinfo"), meminfo=read("/proc/meminfo"),
                        kernel=platform.release(), python=platform.python_version(), kubernetes=kube,
                        slurm=versions(docs, "slurm"), load=load, command=command)


# ---------------------------------------------------------------- running them


def run_bench(bench: Bench, out_dir: Path, timeout: float, *, grace: float = GRACE, echo: bool = True) -> Outcome:
    """Run one bench with --json into out_dir, its output to out_dir/NAME.log (and ours, prefixed)."""
    json_path, log_path = out_dir / f"{bench.name}.json", out_dir / f"{bench.name}.log"
    json_path.unlink(missing_ok=True)
    argv = [sys.executable, "-u", str(bench.path), *bench.args, "--json", str(json_path)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    tail: collections.deque[str] = collections.deque(maxlen=TAIL)
    # an ignored SIGINT is inherited through exec (nohup, `cmd &`): the bench's Python would then
    # ignore it too, and a timeout could not stop it through its clean-up
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if log.closed:  # given up on below: a child the bench left holds the pipe
                    return
                log.write(line)
                log.flush()
                tail.append(line.rstrip("\n"))
                if echo:
                    print(f"[{bench.name}] {line}", end="", flush=True)

        reader = threading.Thread(target=pump, name=f"out-{bench.name}", daemon=True)
        reader.start()
        timed_out = False
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _stop(proc, grace)
        except KeyboardInterrupt:  # Ctrl-C reaches all.py only (the bench has its own session): pass it on
            _stop(proc, grace)
            raise
        reader.join(10)  # a child it left may hold the pipe: its lines after this are not waited for
    seconds = time.monotonic() - t0
    base = Outcome(bench.name, "ok", code, seconds, tail=list(tail), log=str(log_path))
    if timed_out:
        base.status, base.seconds = "timeout", timeout
        return base
    if code != 0:
        base.status = "failed"
        return base
    try:
        base.doc = json.loads(json_path.read_text())
    except (OSError, ValueError) as err:
        base.status, base.reason = "failed", f"no readable JSON at {json_path} ({err})"
    return base


def _stop(proc: subprocess.Popen[str], grace: float) -> int:
    """SIGINT to the bench's process group (its clean-up runs), SIGKILL to it `grace` s later."""
    _signal_group(proc.pid, signal.SIGINT)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        return proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def probe(needs: set[str]) -> tuple[dict[str, str], str]:
    """Each need that is missing -> why; and the Kubernetes server version when a cluster answered."""
    missing: dict[str, str] = {}
    server = ""
    if "cluster" in needs:
        try:
            got = subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), "version", "-o", "json",
                                  "--request-timeout=10s"], capture_output=True, text=True, timeout=30, check=False)
            server = json.loads(got.stdout or "{}").get("serverVersion", {}).get("gitVersion", "")
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        if not server:
            missing["cluster"] = (f"no Kubernetes API answered at KUBECONFIG={kubeconfig()} "
                                  "(the local one: `slurmk8s cluster up`)")
    if "local" in needs and kubeconfig() != LOCAL_KUBECONFIG:
        missing["local"] = f"it adds nodes to the local cluster, and KUBECONFIG={kubeconfig()} is another one"
    if "kwok" in needs and not os.access(Path(TOOLCHAIN_BIN) / "kwok", os.X_OK):
        missing["kwok"] = (f"no kwok in {TOOLCHAIN_BIN} (`slurmk8s toolchain build`, then "
                           "`slurmk8s cluster up --kwok`)")
    if "docker" in needs and not shutil.which("docker"):
        missing["docker"] = "no docker on PATH (its floor runs the host processes in the worker image)"
    return missing, server


def main(argv: Sequence[str] | None = None, benches: Sequence[Bench] = BENCHES) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", metavar="NAME,...", help="run only these (script names or row ids)")
    parser.add_argument("--skip", default="", metavar="NAME,...", help="do not run these")
    parser.add_argument("--timeout", action="append", default=[], metavar="[NAME=]SECONDS",
                        help="per-bench timeout, for all or one bench (repeatable)")
    parser.add_argument("--markdown", type=Path, metavar="OUT", help="also write the table as Markdown to OUT")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where each bench's output and JSON go")
    parser.add_argument("--list", action="store_true", help="list the benches, their arguments and timeouts")
    args = parser.parse_args(argv)
    try:
        chosen = select(benches, args.only.split(","), args.skip.split(","))
        limits = timeouts(benches, args.timeout)
    except ValueError as err:
        parser.error(str(err))
    if args.list:
        for b in benches:
            print(f"{b.name:20s} {' '.join(b.args) or '-':14s} rows {', '.join(b.ids):8s} timeout {limits[b.name]:5.0f} s"
                  f"  needs {', '.join(b.needs) or 'nothing'}{'' if b in chosen else '  (not chosen)'}")
        return 0
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = args.out or Path("/tmp/slurmk8s-bench-all") / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "bench/all.py", *(argv if argv is not None else sys.argv[1:])])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = os.getloadavg()[0]
    missing, server = probe({n for b in chosen for n in b.needs})
    outcomes: dict[str, Outcome] = {}
    for b in chosen:
        why = [missing[n] for n in b.needs if n in missing]
        if why:
            outcomes[b.name] = Outcome(b.name, "skipped", reason="; ".join(why))
            print(f"[all] {b.name}: not run: {outcomes[b.name].reason}", flush=True)
            continue
        print(f"[all] {b.name}: running (timeout {limits[b.name]:.0f} s; output {out_dir / (b.name + '.log')})",
              flush=True)
        o = outcomes[b.name] = run_bench(b, out_dir, limits[b.name])
        print(f"[all] {b.name}: {o.status} (exit {o.code}) after {o.seconds:.0f} s", flush=True)
    rows = table_rows(outcomes, benches)
    header = this_machine(outcomes, server, (load_start, os.getloadavg()[0]), command, date)
    print("\n" + header + "\n\n" + text_table(rows))
    (out_dir / "results.json").write_text(json.dumps({
        "header": header, "command": command,
        "outcomes": {k: {kk: vv for kk, vv in asdict(o).items() if kk != "doc"} for k, o in outcomes.items()},
        "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows, header))
        print(f"\nwrote {args.markdown}")
    print(f"each bench's output and JSON: {out_dir}")
    failed = [o.name for o in outcomes.values() if o.status in ("failed", "timeout")]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
