"""The phases of one P1 run from zero workers, from the timestamps its parts leave behind.

Pure functions (no I/O, standard library only) used by bench/k8s_submit_latency.py and tested in
tests/test_bench_phases.py; that script's docstring says where each phase comes from, its clock and
its resolution. Every time here is seconds since the epoch (float: about 0.2 us apart at today's
epoch) until :func:`phases` makes it seconds after the run's t0 (just before `sbatch`), rounded to
the microsecond.
"""

from __future__ import annotations

import calendar
import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

# (key, label, resolution) in the order of a run; the summary prints one row each
PHASES: tuple[tuple[str, str, str], ...] = (
    ("sbatch_returned", "sbatch returned", "ns"),
    ("allocated", "job allocated (slurmctld)", "ns"),
    ("resume_started", "resume program started", "1 ms"),
    ("create_returned", "pod create call returned", "1 ms"),
    ("pod_created", "pod created", "1 s"),
    ("pod_scheduled", "pod scheduled", "1 us event / 1 s condition"),
    ("container_started", "container started", "1 s"),
    ("slurmd_registered", "slurmd registered", "ns"),
    ("prolog_released", "prolog saw node booted", "1 ms"),
    ("job_started", "job started (slurmctld)", "ns"),
    ("start_time", "Slurm start_time", "1 s"),
    ("running_seen", "job RUNNING (seen)", "ns, 50 ms poll"),
)
PHASE_KEYS = tuple(k for k, _, _ in PHASES)

_RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?$")


def parse_rfc3339(text: str | None) -> float | None:
    """RFC 3339 with any number of fraction digits (Kubernetes' 1 s, events' us, containerd's ns;
    Go trims trailing zeros) and Z or an offset -> epoch seconds; None when absent or unreadable."""
    if not text:
        return None
    m = _RFC3339.match(text.strip())
    if not m:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    offset = 0
    tz = m.group(8)
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) - offset + frac


# ---------------------------------------------------------------- the login loop's lines


@dataclass(frozen=True)
class Run:
    """One submit as the login loop printed it: `run I job J t0 NS sbatch NS running NS start S nodes N`."""

    index: int
    job: str
    t0: float
    sbatch: float
    running: float
    start_time: float | None = None  # Slurm's start_time (1 s), None when squeue no longer had the job
    nodes: str = ""

    @property
    def seconds(self) -> float:
        """submit -> RUNNING seen, as the benchmark always reported it."""
        return self.running - self.t0


def parse_run_line(line: str) -> Run | None:
    """One `run ...` line of the login loop -> Run; None for any other line."""
    words = line.split()
    if not words or words[0] != "run" or len(words) % 2:
        return None
    kv = dict(zip(words[::2], words[1::2]))
    try:
        start = kv.get("start", "-")
        return Run(index=int(kv["run"]), job=kv["job"].split(";")[0], t0=int(kv["t0"]) / 1e9,
                   sbatch=int(kv["sbatch"]) / 1e9, running=int(kv["running"]) / 1e9,
                   start_time=float(start) if start.isdigit() else None,  # '-' or N/A: not known
                   nodes="" if kv.get("nodes", "-") == "-" else kv["nodes"])
    except (KeyError, ValueError):
        return None


def parse_runs(text: str) -> list[Run]:
    return [r for r in map(parse_run_line, text.splitlines()) if r is not None]


# ---------------------------------------------------------------- elastic.log (provisioner/logs.py)

_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ([\w.-]+)\[(\d+)\] (.*)$")


@dataclass(frozen=True)
class LogLine:
    at: float
    program: str
    pid: int
    message: str


def parse_log_line(line: str) -> LogLine | None:
    """`2026-12-01T20:13:30.100Z resume[851] message` -> LogLine; None for anything else."""
    m = _LOG_LINE.match(line.rstrip("\n"))
    if not m:
        return None
    at = parse_rfc3339(m.group(1))
    return None if at is None else LogLine(at, m.group(2), int(m.group(3)), m.group(4))


@dataclass
class ResumeCall:
    """One run of the resume program, from its lines in elastic.log."""

    pid: int
    started: float  # the time of its first line
    nodes: list[str] = field(default_factory=list)  # `resume N nodes: a,b`
    jobs: dict[int, list[str]] = field(default_factory=dict)  # `resume file: job J resumes a,b of a,b; ...`
    created: dict[str, float] = field(default_factory=dict)  # node -> `N create|replace ok (..s)` line time
    done: float | None = None  # `done in X.XXs: ...` line time
    program: str = "resume"  # or early-resume: PrologSlurmctld's head start


_RESUME_FILE_JOB = re.compile(r"job (\d+) resumes (\S+) of (\S+)")
_RESUME_NODES = re.compile(r"^resume \d+ nodes: (\S*)$")
_EARLY = re.compile(r"^early resume for job (\d+): (\S+)$")  # PrologSlurmctld's head start (run_early_resume)
_CREATED = re.compile(r"^(\S+) (?:create|replace) ok \(")


def resume_calls(lines: Iterable[str]) -> list[ResumeCall]:
    """The resume program's calls in elastic.log, in order, with the early resumes PrologSlurmctld
    asks for (program `early-resume`: they create the pods before Slurm's resume call). Lines of one
    call share the program and pid; a call ends with its `done in` line (so a pid used again later
    starts a new call)."""
    calls: list[ResumeCall] = []
    open_: dict[tuple[str, int], ResumeCall] = {}
    for raw in lines:
        line = parse_log_line(raw)
        if line is None or line.program not in ("resume", "early-resume"):
            continue
        key = (line.program, line.pid)
        call = open_.get(key)
        if call is None:
            call = open_[key] = ResumeCall(line.pid, line.at, program=line.program)
            calls.append(call)
        msg = line.message
        if msg.startswith("resume file: "):
            for job, resumes, _alloc in _RESUME_FILE_JOB.findall(msg):
                call.jobs[int(job)] = resumes.split(",")
        elif m := _RESUME_NODES.match(msg):
            call.nodes = [n for n in m.group(1).split(",") if n]
        elif m := _EARLY.match(msg):
            call.nodes = [n for n in m.group(2).split(",") if n]
            call.jobs[int(m.group(1))] = call.nodes
        elif m := _CREATED.match(msg):
            call.created.setdefault(m.group(1), line.at)
        elif msg.startswith("done in "):
            call.done = line.at
            del open_[key]
    return calls


@dataclass(frozen=True)
class PrologWait:
    job: int
    nodes: str
    outcome: str  # booted | gave-up | timeout
    waited: float  # seconds the prolog polled
    at: float  # when it logged (right before returning)


_PROLOG = re.compile(r"^job (\d+) nodes (\S+): (booted|gave-up|timeout) after ([0-9.]+)s")


def prolog_waits(lines: Iterable[str]) -> dict[int, PrologWait]:
    """job -> its PrologSlurmctld wait. The prolog logs only when it had to wait (a poll or more)."""
    out: dict[int, PrologWait] = {}
    for raw in lines:
        line = parse_log_line(raw)
        if line is None or line.program != "prolog":
            continue
        if m := _PROLOG.match(line.message):
            out[int(m.group(1))] = PrologWait(int(m.group(1)), m.group(2), m.group(3), float(m.group(4)), line.at)
    return out


# ---------------------------------------------------------------- slurmctld's stderr (kubectl logs --timestamps)


@dataclass
class CtldLog:
    registered: dict[str, list[float]] = field(default_factory=dict)  # node -> `Node N now responding` times
    allocated: dict[int, float] = field(default_factory=dict)  # job -> `sched: Allocate JobId=J` (or backfill's)
    started: dict[int, float] = field(default_factory=dict)  # job -> `Resetting JobId=J start time ...`


_RESPONDING = re.compile(r"\bNode (\S+) now responding\b")
# the main scheduler's line (job_scheduler.c), or the backfill scheduler's (backfill.c)
_ALLOCATE = re.compile(r"\bsched: Allocate JobId=(\d+) |\bStarted JobId=(\d+) in \S+ on ")
_RESET_START = re.compile(r"\bResetting JobId=(\d+) start time for node power up\b")


def slurmctld_events(text: str) -> CtldLog:
    """The lines of `kubectl logs --timestamps` of the slurmctld container that time a run: each
    starts with containerd's RFC 3339 stamp, then slurmctld's own `slurmctld: ...` text."""
    out = CtldLog()
    for raw in text.splitlines():
        stamp, _, msg = raw.partition(" ")
        at = parse_rfc3339(stamp)
        if at is None:
            continue
        if m := _RESPONDING.search(msg):
            out.registered.setdefault(m.group(1), []).append(at)
        elif m := _ALLOCATE.search(msg):
            out.allocated.setdefault(int(m.group(1) or m.group(2)), at)
        elif m := _RESET_START.search(msg):
            out.started.setdefault(int(m.group(1)), at)
    return out


# ---------------------------------------------------------------- worker pods (watch stream) and events


def json_stream(text: str) -> list[Any]:
    """Concatenated JSON documents (`kubectl get -w -o json` prints one indented object after the
    other) -> the documents. A document cut short (kubectl stopped mid-write, then restarted) is
    skipped up to the next line that opens a top-level object."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        try:
            doc, i = decoder.raw_decode(text, i)
            docs.append(doc)
        except json.JSONDecodeError:
            nxt = text.find("\n{", i + 1)
            if nxt < 0:
                break
            i = nxt + 1
    return docs


@dataclass
class PodTimes:
    uid: str
    name: str
    node: str  # the Slurm node (label slurmk8s.io/node), else the pod's name
    created: float | None = None
    scheduled: float | None = None  # PodScheduled True lastTransitionTime
    started: float | None = None  # the container's startedAt
    host: str = ""


def pod_times(docs: Iterable[Any]) -> dict[str, PodTimes]:
    """uid -> the times a pod's objects showed, merged over every watch event (ADDED, MODIFIED,
    DELETED) or plain object of it: the first non-empty value of each wins."""
    out: dict[str, PodTimes] = {}
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        pod = doc.get("object") if "object" in doc and "type" in doc else doc
        if not isinstance(pod, Mapping) or pod.get("kind", "Pod") != "Pod":
            continue
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            continue
        name = str(meta.get("name") or "")
        times = out.setdefault(uid, PodTimes(uid, name, (meta.get("labels") or {}).get("slurmk8s.io/node") or name))
        status = pod.get("status") or {}
        times.created = times.created or parse_rfc3339(meta.get("creationTimestamp"))
        times.host = times.host or str((pod.get("spec") or {}).get("nodeName") or "")
        for cond in status.get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "True" and times.scheduled is None:
                times.scheduled = parse_rfc3339(cond.get("lastTransitionTime"))
        for cs in status.get("containerStatuses") or ():
            state = cs.get("state") or {}
            began = (state.get("running") or state.get("terminated") or {}).get("startedAt")
            if began and times.started is None:
                times.started = parse_rfc3339(began)
    return out


def scheduled_events(events: Mapping[str, Any]) -> dict[str, tuple[float, bool]]:
    """pod uid -> (when the scheduler bound it, whether that is finer than 1 s), from `kubectl get
    events -o json` (core/v1 view): the `Scheduled` event's eventTime (microseconds: the scheduler
    writes through the events API), else its firstTimestamp (1 s)."""
    out: dict[str, tuple[float, bool]] = {}
    for ev in events.get("items") or ():
        obj = ev.get("involvedObject") or ev.get("regarding") or {}
        if ev.get("reason") != "Scheduled" or obj.get("kind") != "Pod" or not obj.get("uid"):
            continue
        fine = parse_rfc3339(ev.get("eventTime"))
        at = fine if fine is not None else parse_rfc3339(ev.get("firstTimestamp"))
        if at is not None:
            out.setdefault(str(obj["uid"]), (at, fine is not None))
    return out


# ---------------------------------------------------------------- one run's phases


@dataclass
class Sources:
    """Everything read for the from-zero runs."""

    calls: Sequence[ResumeCall] = ()
    prolog: Mapping[int, PrologWait] = field(default_factory=dict)
    ctld: CtldLog = field(default_factory=CtldLog)
    pods: Mapping[str, PodTimes] = field(default_factory=dict)
    scheduled: Mapping[str, tuple[float, bool]] = field(default_factory=dict)  # pod uid -> scheduled_events()


SLACK = 1.0  # a 1 s stamp may read up to 1 s before the event it marks


def _job_id(run: Run) -> int | None:
    try:
        return int(run.job)
    except ValueError:
        return None


def phases(run: Run, src: Sources) -> dict[str, Any]:
    """One run -> {"job", "node", "t0" (epoch), "phases": key -> seconds after t0 or None,
    "sources": key -> where the value came from, "coarse": the keys whose value has 1 s
    resolution}. Everything is matched by job id or node name and must fall between t0 (less SLACK
    for 1 s stamps) and the moment RUNNING was seen (plus SLACK)."""
    job, node = _job_id(run), run.nodes
    lo, hi = run.t0 - SLACK, run.running + SLACK
    at: dict[str, float | None] = dict.fromkeys(PHASE_KEYS)
    how: dict[str, str] = {}
    coarse: list[str] = []

    def put(key: str, value: float | None, source: str, *, fine: bool = True) -> bool:
        if value is None or not lo <= value <= hi or (fine and value < run.t0):
            return False
        at[key], how[key] = value, source
        if not fine:
            coarse.append(key)
        return True

    put("sbatch_returned", run.sbatch, "login pod date +%s%N")
    put("running_seen", run.running, "login pod date +%s%N after squeue said RUNNING")
    put("start_time", run.start_time, "squeue %S (Slurm start_time)", fine=False)
    if job is not None:
        put("allocated", src.ctld.allocated.get(job), "slurmctld: sched: Allocate")
        put("job_started", src.ctld.started.get(job), "slurmctld: Resetting start time for node power up")
        wait = src.prolog.get(job)
        if wait is not None:
            put("prolog_released", wait.at, f"elastic.log prolog: {wait.outcome} after {wait.waited:.2f}s")
    for t in sorted(src.ctld.registered.get(node, ())):
        if put("slurmd_registered", t, "slurmctld: Node now responding"):
            break
    calls = [c for c in src.calls if job in c.jobs and lo <= c.started <= hi]
    if not calls:  # no resume file, or it did not name the job: by node and time
        calls = [c for c in src.calls if node in c.nodes and run.t0 <= c.started <= hi]
    # the first call that created the node's pod (the early resume, when it did), else the first
    call = next((c for c in calls if node in c.created), calls[0] if calls else None)
    if call is not None:
        put("resume_started", call.started, f"elastic.log {call.program}[{call.pid}] first line")
        put("create_returned", call.created.get(node), f"elastic.log {call.program}[{call.pid}] {node} create ok")
    pods = sorted((p for p in src.pods.values() if p.node == node and p.created is not None and lo <= p.created <= hi),
                  key=lambda p: p.created or 0.0)
    if pods:
        pod = pods[0]
        put("pod_created", pod.created, f"pod {pod.uid} creationTimestamp", fine=False)
        event = src.scheduled.get(pod.uid)
        if not (event is not None and put("pod_scheduled", event[0], "Scheduled event " +
                                          ("eventTime" if event[1] else "firstTimestamp"), fine=event[1])):
            put("pod_scheduled", pod.scheduled, "PodScheduled condition lastTransitionTime", fine=False)
        put("container_started", pod.started, "containerStatuses[].state startedAt", fine=False)
    return {"job": run.job, "node": node, "t0": run.t0,
            "phases": {k: (None if v is None else round(v - run.t0, 6)) for k, v in at.items()},
            "sources": how, "coarse": coarse}


# ---------------------------------------------------------------- the summary


def pct(values: Sequence[float], p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def steps(phased: Mapping[str, Any]) -> dict[str, float]:
    """key -> seconds since the previous fine (sub-second) phase, in PHASES order, that this run
    has (t0 for the first): what that phase adds. A 1 s phase is never the base of the next step,
    so its truncation stays in its own step."""
    out: dict[str, float] = {}
    coarse = set(phased.get("coarse") or ())
    base = 0.0
    for key in PHASE_KEYS:
        value = phased["phases"].get(key)
        if value is None:
            continue
        out[key] = value - base
        if key not in coarse:
            base = value
    return out


def phase_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary: per phase, p50 / p95 of seconds after t0 over the runs that have it, the p50 of
    its step (see :func:`steps`), the runs it was found in and the resolution of its stamp; 1 s
    phases are marked *."""
    lines = [f"{'phase (s after t0 = sbatch start)':36s} {'p50':>7s} {'p95':>7s} {'step p50':>9s} {'runs':>5s}  resolution"]
    all_steps = [steps(r) for r in runs]
    for key, label, resolution in PHASES:
        values = [r["phases"][key] for r in runs if r["phases"].get(key) is not None]
        step = [s[key] for s in all_steps if key in s]
        mark = "*" if any(key in (r.get("coarse") or ()) for r in runs) else " "
        if not values:
            lines.append(f"{label:34s} {mark} {'-':>7s} {'-':>7s} {'-':>9s} {0:5d}  {resolution}")
            continue
        lines.append(f"{label:34s} {mark} {statistics.median(values):7.3f} {pct(values, 0.95):7.3f} "
                     f"{statistics.median(step):+9.3f} {len(values):5d}  {resolution}")
    lines.append("* 1 s stamps (truncated: up to 1 s early); a step counts from the previous sub-second phase")
    return lines


RUN_COLUMNS = (("sbatch_returned", "sbatch"), ("allocated", "alloc"), ("resume_started", "resume"),
               ("create_returned", "create"), ("pod_created", "pod*"), ("pod_scheduled", "sched"),
               ("container_started", "start*"), ("slurmd_registered", "slurmd"), ("prolog_released", "prolog"),
               ("job_started", "job"), ("start_time", "st_time*"), ("running_seen", "RUNNING"))


def run_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per run: each phase in seconds after its t0 ('-': not found)."""
    lines = [f"{'job':>6s} {'node':14s} " + " ".join(f"{h:>8s}" for _, h in RUN_COLUMNS)]
    for r in runs:
        cells = []
        for key, _ in RUN_COLUMNS:
            v = r["phases"].get(key)
            cells.append(f"{'-':>8s}" if v is None else f"{v:8.3f}")
        lines.append(f"{str(r['job']):>6s} {str(r['node'])[:14]:14s} " + " ".join(cells))
    return lines
