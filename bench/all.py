"""One table of the benchmarks (issue #17 item 6): runs the fast benches, each as a subprocess with
--json, and prints P1, P3, P4, P4b, P5, P6, P7 and the render bench in one table: what, the result, the
floor measured in the same run, the ratio, the goal, and met / not met / not measured (why) / failed.

Usage: python bench/all.py [--only NAME,...] [--skip NAME,...] [--slow] [--use NAME=JSON ...]
           [--timeout [NAME=]SECONDS ...] [--markdown OUT] [--out DIR] [--list]
NAME is a bench's script name or one of its rows' ids (case does not matter):

  script               arguments      rows      needs
  render_scale         --nodes 10000  render    nothing (pure Python)
  resume_500                          P4b       the local cluster, the toolchain's kwok
  queue_32k                           P4        a cluster at KUBECONFIG
  k8s_submit_latency   --runs 5       P1, P5    a cluster at KUBECONFIG (default the local one)
  wake_submit          --runs 3       P7        a cluster at KUBECONFIG
  mpi_p6                              P6        the local cluster, Docker (the host-process floor)
  bursty_day (slow)                   P3        a cluster at KUBECONFIG, ~20 min: run only when --only
                                                names it, or with --slow

P3's floor is the busy node-seconds (a node is paid for at least while it works), its ratio the
provisioned over them, both from the product's metrics; its result gives the jobs COMPLETED and not,
and the median wait beside an always-on cluster's (simulated from the same trace, not measured).
bursty_day exits 1 after writing its JSON when a goal is missed: its rows come from that JSON.

--use NAME=JSON (repeatable) takes NAME's rows from JSON, the file a run of its own wrote with
--json (bursty_day's 20 minutes, or a P4 run earlier that day), instead of running it; the rows are
built as if it had run here, marked † in the table, with the file and when it was written below it.
An unknown NAME, or a file that cannot be read or is not that bench's JSON, is an error (exit 2).

resume_500 starts the kwok controller itself (`slurmk8s cluster kwok-node`), which needs kwok in the
toolchain (`slurmk8s toolchain build`; `slurmk8s cluster up --kwok` also starts it). A bench whose
need is missing is not run: its rows say "not measured" and why. So do the rows of a bench left out
by --only / --skip, or for being slow: every row is always in the table.

Each bench runs in its own process group under its own timeout (`--list` shows them; --timeout 900
sets all, --timeout mpi_p6=2400 one). On a timeout it gets SIGINT, so its clean-up (`finally`) runs,
and SIGKILL 120 s later. A bench that exits non-zero (bursty_day: and whose JSON shows no goal
missed), times out or writes no readable JSON is a "failed" row with its exit code and the last
lines of its output, and all.py exits 1.
Every bench's output and JSON are kept in DIR (default /tmp/slurmk8s-bench-all/<UTC time>), with
results.json (every row).

--markdown OUT writes the same table as Markdown, with the date (UTC), the machine (CPUs and their
model, memory, kernel, Kubernetes and Slurm versions as the benches report them, load average) and
the command above it; given again, to more files; a file holding the BEGIN and END marker lines
gets the table between them, the rest of it kept: `python bench/all.py --markdown
docs/benchmarks-table.md --markdown README.md` makes the table docs/benchmarks.md points to and the
README's Benchmarks section. The rows are built from the JSON by pure functions in
bench/all_rows.py (tests/test_bench_all.py).
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

from all_rows import (GOAL, NONE, ORDER, WHAT, Row, p1_rows, p3_rows, p4_rows, p4b_rows, p6_rows,  # noqa: E402
                      p7_rows, render_rows)
from helpers import LOCAL_KUBECONFIG, TOOLCHAIN_BIN, kubeconfig, server_version  # noqa: E402

TAIL = 30  # lines of a failed bench's output in the table's notes
GRACE = 120.0  # s between SIGINT and SIGKILL for a bench past its timeout

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
    slow: bool = False  # run only when --only names it, or with --slow
    json_on_miss: bool = False  # it writes its JSON, then exits 1 if a goal is missed: rows from the JSON


    @property
    def path(self) -> Path:
        return self.script or BENCH / f"{self.name}.py"


BENCHES = (
    Bench("render_scale", ("render",), ("--nodes", "10000"), 300, (), render_rows),
    Bench("resume_500", ("P4b",), (), 600, ("cluster", "local", "kwok"), p4b_rows),
    Bench("queue_32k", ("P4",), (), 1800, ("cluster",), p4_rows),
    Bench("k8s_submit_latency", ("P1", "P5"), ("--runs", "5"), 1800, ("cluster",), p1_rows),
    Bench("wake_submit", ("P7",), ("--runs", "3"), 1200, ("cluster",), p7_rows),
    Bench("mpi_p6", ("P6",), (), 1800, ("cluster", "local", "docker"), p6_rows),
    Bench("bursty_day", ("P3",), (), 3600, ("cluster",), p3_rows, slow=True, json_on_miss=True),
)


def select(benches: Sequence[Bench], only: Iterable[str] = (), skip: Iterable[str] = (),
           slow: bool = False) -> list[Bench]:
    """The benches --only / --skip leave, by script name or row id (any case); an unknown name is an error.
    A slow bench is left out unless --only names it or `slow` (--slow)."""
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
    return [b for b in benches if (b.name in only_set if only_set else slow or not b.slow) and b.name not in skip_set]


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
    source: str = ""  # not run: its JSON given with --use, "FILE (written DATE)"


def use_outcomes(benches: Sequence[Bench], given: Iterable[str]) -> dict[str, Outcome]:
    """--use NAME=JSON values (NAME as in select): each bench's JSON from a run of its own, read and
    checked here (its rows build), so that a wrong file is an error before anything runs."""
    out: dict[str, Outcome] = {}
    for item in given:
        name, sep, file = item.partition("=")
        if not sep or not name.strip() or not file:
            raise ValueError(f"--use {item}: give NAME=JSON, a bench (script name or row id) and the file it wrote "
                             "with --json, e.g. --use bursty_day=/tmp/p3.json")
        try:
            [b] = select(benches, [name])
        except ValueError as err:
            raise ValueError(f"--use {item}: {err}") from None
        fix = f"give the file `{b.path.name} --json FILE` wrote"
        if b.name in out:
            raise ValueError(f"--use {item}: {b.name} given twice; give one file per bench")
        path = Path(file)
        try:
            doc = json.loads(path.read_text())
            written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
        except OSError as err:
            raise ValueError(f"--use {item}: cannot read {file} ({err.strerror or err}): {fix}") from None
        except ValueError as err:
            raise ValueError(f"--use {item}: {file} is not JSON ({err}): {fix}") from None
        try:
            if not isinstance(doc, dict):
                raise TypeError(f"a JSON {type(doc).__name__}, not an object")
            b.rows(doc)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as err:
            raise ValueError(f"--use {item}: {file} is not what {b.path.name} writes ({type(err).__name__}: {err}): "
                             f"{fix}") from None
        # the file's name only: the table is published (README), its machine's paths are not
        out[b.name] = Outcome(b.name, "ok", doc=doc, log=file, source=f"`{Path(file).name}` (written {written})")
    return out


def rows_for(bench: Bench, outcome: Outcome | None) -> list[Row]:
    """A bench's rows: from its JSON, or one per id saying why there is none. Never none."""
    def each(result: str, verdict_: str, note: str, tail: Sequence[str] = ()) -> list[Row]:
        return [Row(i, WHAT[i], result, NONE, NONE, GOAL[i], verdict_, note, list(tail)) for i in bench.ids]

    if outcome is None and bench.slow:
        return each(NONE, "not measured", f"{bench.name} not run: slow (run it with --only {bench.name} or --slow, "
                    f"or give the JSON of a run of its own with --use {bench.name}=FILE)")
    if outcome is None:
        return each(NONE, "not measured", f"{bench.name} not run (left out by --only / --skip)")
    if outcome.status == "skipped":
        return each(NONE, "not measured", f"{bench.name} not run: {outcome.reason}")
    if outcome.status == "timeout":
        return each(f"timed out after {outcome.seconds:.0f} s", "failed",
                    f"{bench.name} timed out after {outcome.seconds:.0f} s (exit {outcome.code}); "
                    f"last lines of its output ({outcome.log}):", outcome.tail)
    reason = outcome.reason
    if outcome.status == "ok" and outcome.doc is not None:
        try:
            rows = bench.rows(outcome.doc)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as err:
            rows, reason = [], f"its JSON could not be read ({type(err).__name__}: {err})"
        if rows and outcome.code and any(r.verdict != "not met" for r in rows):  # json_on_miss: but none missed
            reason = "it wrote its JSON, and the JSON shows no goal missed"
        elif rows:
            for r in rows:
                r.source = outcome.source
                if outcome.code:
                    exit_ = f"{bench.name} exit {outcome.code} after writing its JSON ({outcome.log})"
                    r.note = f"{r.note}; {exit_}" if r.note else exit_
            return rows
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
        cells.append([r.id + (" †" if r.source else ""), r.what, r.result, r.floor, r.ratio, r.goal, v])
    return cells, notes


def sources(rows: Sequence[Row]) -> list[str]:
    """One line per --use file, under the table: its rows were not measured by this command."""
    ids: dict[str, list[str]] = {}
    for r in rows:
        if r.source:
            ids.setdefault(r.source, []).append(r.id)
    return [f"† {', '.join(i)}: not run by this command; from {src}, given with --use" for src, i in ids.items()]


def text_table(rows: Sequence[Row]) -> str:
    cells, notes = _notes(rows)
    widths = [max(len(x) for x in col) for col in zip(COLUMNS, *cells)]
    out = ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [list(COLUMNS), *cells]]
    out.insert(1, "  ".join("-" * w for w in widths))
    out += sources(rows)
    for n, (note, tail) in enumerate(notes, 1):
        out.append(f"({n}) {note}")
        out += [f"      {line}" for line in tail]
    return "\n".join(out)


def _md(cell: str) -> str:
    return cell.replace("|", "\\|")


def markdown(rows: Sequence[Row], header: str) -> str:
    cells, notes = _notes(rows)
    out = [GENERATED, "", header, "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(_md(c) for c in line) + " |" for line in cells]
    for line in sources(rows):
        out += ["", _md(line)]
    if notes:
        out.append("")
    for n, (note, tail) in enumerate(notes, 1):
        out.append(f"({n}) {note}")
        if tail:
            out += ["", "```", *(t.replace("```", "'''") for t in tail), "```"]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def public_args(argv: Sequence[str]) -> list[str]:
    """The command line as the published table shows it: --use files by name, no --out directory
    (paths of the machine that ran it mean nothing to a reader)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--out":
            skip = True
            continue
        if arg.startswith("--out="):
            continue
        if i and argv[i - 1] == "--use" and "=" in arg:
            name, _, file = arg.partition("=")
            arg = f"{name}={Path(file).name}"
        elif arg.startswith("--use="):
            name, _, file = arg[len("--use="):].partition("=")
            arg = f"--use={name}={Path(file).name}"
        out.append(arg)
    return out


GENERATED = "<!-- generated by bench/all.py; do not edit: run it again -->"  # GENERATED.split(";")[0] marks its tables
BEGIN = "<!-- bench/all.py table: begin -->"
END = "<!-- bench/all.py table: end -->"


def write_markdown(path: Path, table: str) -> None:
    """The table into `path`: between its BEGIN and END lines where it has them (the README's
    Benchmarks section), else as the whole file."""
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text.partition(BEGIN)[2]:
        head, _, rest = text.partition(BEGIN)
        tail = rest.partition(END)[2]
        path.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
    elif not text.strip() or text.startswith(GENERATED.split(";")[0]):  # a table it wrote (older wording too)
        path.write_text(table)
    else:  # a file of its own (a README whose markers were lost): never overwritten
        raise SystemExit(f"--markdown {path}: it has text of its own and no {BEGIN} / {END} lines to write "
                         "between; add them where the table goes, or name another file")


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
                 kubernetes: Sequence[str], slurm: Sequence[str], load: tuple[float, float], command: str,
                 ran: bool = True) -> str:
    """The table's first line; `ran` False: every row came from --use, so nothing was measured now
    (each row's † note says when its JSON was written) and the load average says nothing."""
    mem = mem_gib(meminfo)
    parts = [f"{cpus or '?'} CPUs ({cpu_model(cpuinfo)})", f"{mem:.1f} GiB memory" if mem else "memory unknown",
             f"Linux {kernel}", f"Python {python}",
             f"Kubernetes {', '.join(kubernetes)}" if kubernetes else "Kubernetes not reported",
             f"Slurm {', '.join(s.removeprefix('slurm ') for s in slurm)}" if slurm else "Slurm not reported"]
    if not ran:
        return (f"Assembled {date}, running no bench (every row from an earlier run's JSON, marked †), on "
                f"{', '.join(parts)}; `{command}`.")
    parts.append(f"load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end")
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
                        slurm=versions(docs, "slurm"), load=load, command=command,
                        ran=any(not o.source and o.status != "skipped" for o in outcomes.values()))


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
    if code != 0 and not (bench.json_on_miss and json_path.exists()):
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
        server = server_version("")
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
    parser.add_argument("--markdown", type=Path, metavar="OUT", action="append", default=[],
                        help="also write the table as Markdown to OUT (again for more files; into a file with "
                             "the begin / end marker lines, between them)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where each bench's output and JSON go")
    parser.add_argument("--list", action="store_true", help="list the benches, their arguments and timeouts")
    parser.add_argument("--slow", action="store_true", help="also run the slow benches (bursty_day: ~20 min)")
    parser.add_argument("--use", action="append", default=[], metavar="NAME=JSON",
                        help="NAME's rows from JSON, the file it wrote with --json in a run of its own; NAME is "
                             "not run (repeatable)")
    args = parser.parse_args(argv)
    try:
        chosen = select(benches, args.only.split(","), args.skip.split(","), slow=args.slow)
        limits = timeouts(benches, args.timeout)
        used = use_outcomes(benches, args.use)
    except ValueError as err:
        parser.error(str(err))
    if args.list:
        for b in benches:
            state = (f"  (from {used[b.name].source})" if b.name in used else "" if b in chosen else
                     f"  (slow: not chosen; --only {b.name} or --slow)" if b.slow else "  (not chosen)")
            print(f"{b.name:20s} {' '.join(b.args) or '-':14s} rows {', '.join(b.ids):8s} timeout {limits[b.name]:5.0f} s"
                  f"  needs {', '.join(b.needs) or 'nothing'}{state}")
        return 0
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = args.out or Path("/tmp/slurmk8s-bench-all") / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "bench/all.py", *public_args(argv if argv is not None else sys.argv[1:])])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = os.getloadavg()[0]
    to_run = [b for b in chosen if b.name not in used]
    missing, server = probe({n for b in to_run for n in b.needs})
    outcomes: dict[str, Outcome] = dict(used)
    for o in used.values():
        print(f"[all] {o.name}: not run: its rows from {o.source}", flush=True)
    for b in to_run:
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
    for path in args.markdown:
        write_markdown(path, markdown(rows, header))
        print(f"\nwrote {path}")
    print(f"each bench's output and JSON: {out_dir}")
    failed = [b.name for b in benches if any(r.verdict == "failed" for r in rows_for(b, outcomes.get(b.name)))]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
