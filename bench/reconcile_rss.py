"""The reconcile loop's memory over many passes: its RSS must stay flat (issue 40 item 5), so that
the container's memory limit (names.RECONCILE_MEMORY_LIMIT) is never reached by a slow leak.

Runs what slurmk8s-reconcile (provisioner/reconcile/main.py) does each period, --passes times, on a
simulated cluster that churns (no Kubernetes, no Slurm: the state lives in this script):

- the inventory of --nodes nodes in three pools, read from its file each pass, as the loop does;
- one pass: run_once (provisioner/reconcile/act.py) with a real FileLedger and the loop's restart /
  lost watches, then the metrics (Metrics.observe_pass, observe_events on the programs' events file
  through EventTail, the usage tally saved through UsageFile, one scrape of the exposition), its log
  lines through provisioner.logs.Log with its bound (--log-bytes per file, rotated);
- between passes, the power-saving programs Slurm starts, run warm by the loop as in the pod: each
  call over the loop's Unix socket (elastic/warm.py's ProgramServer and delegate: one thread and one
  program Log per call), resume for the nodes of the jobs started, suspend for nodes idle a while;
- the cluster: jobs arrive and end (job ids never reused; a finished job stays listed MinJobAge),
  workers come up, some fail (Failed, ErrImagePull stuck Pending), some vanish under their job, some
  lose their host, orphans with new names appear; the loop's SET_DOWN / POWER_DOWN / RESUME updates
  are applied to the simulated Slurm, so nodes it takes out come back. The clock advances one
  RECONCILE_PERIOD a pass (the loop's timeouts and graces apply as in the pod).

Not driven: the pinned pools' LiveNodes and the idle sleep (they need the Kubernetes API), the pod
watch (elastic/podwatch.py: the fake backend lists).

RSS is VmRSS of /proc/self/status, every --sample passes. Floor: growth after the warm-up (--warmup
passes, by default 1,000) <= --floor-mib (5 MiB); exit 1 when over it, or when the churn did not
reach every kind of finding it means to (the run would not measure what it says).

Usage: python bench/reconcile_rss.py [--passes 10000] [--nodes 300] [--sample 500] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fakes package

from fakes.backend import FakeBackend  # noqa: E402

from provisioner.elastic.backend import Worker  # noqa: E402
from provisioner.elastic.events import EventTail  # noqa: E402
from provisioner.elastic.ledger import FileLedger, Policy  # noqa: E402
from provisioner.elastic import programs  # noqa: E402
from provisioner.elastic.warm import ProgramServer, runner_for, runs  # noqa: E402
from provisioner.elastic.warmcall import delegate  # noqa: E402
from provisioner.inventory import Inventory, SlurmNode  # noqa: E402
from provisioner.logs import Log  # noqa: E402
from provisioner.names import RECONCILE_PERIOD  # noqa: E402
from provisioner.reconcile.act import run_once  # noqa: E402
from provisioner.reconcile.classify import Kind  # noqa: E402
from provisioner.reconcile.metrics import Metrics  # noqa: E402
from provisioner.reconcile.usage import UsageFile, resume_usage  # noqa: E402

import hostlist  # noqa: E402

POOLS = ("cpu", "gpu", "mem")
MIN_JOB_AGE = 30  # passes a finished job stays listed (Slurm's MinJobAge 300 s)
SUSPEND_AFTER = 3  # passes a node stays idle before Slurm calls the suspend program
# every kind the churn must make the loop find, or the run does not measure what it says
EXPECTED = {Kind.WORKER_FAILED, Kind.STUCK_PENDING, Kind.MISSING_WORKER, Kind.HOST_LOST, Kind.ORPHAN_WORKER,
            Kind.DOWN_WORKER_GONE, Kind.DOWN_POWERED_DOWN, Kind.POOL_RECOVERED}


def rss_kib() -> int:
    """VmRSS of this process, KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def _num(value: float | None) -> dict[str, Any]:
    return {"set": value is not None, "infinite": False, "number": int(value or 0)}


class SimBackend(FakeBackend):
    """FakeBackend on the simulated clock; its records of calls are not kept (they would be the
    only thing growing, and they are the fake's, not the loop's)."""

    def __init__(self, clock) -> None:
        super().__init__()
        self.clock = clock

    def create(self, node: SlurmNode, group=None) -> None:
        super().create(node, group)
        w = self.workers[node.name]
        if w.created_at != self.clock():
            self.workers[node.name] = replace(w, created_at=self.clock(), phase="Pending", version="1")

    def forget_calls(self) -> None:
        self.calls.clear()
        self.lists.clear()


class SimSlurm:
    """slurmctld's side: the nodes and the queue as `scontrol show nodes --json` / `squeue --json`
    give them to the loop (SlurmClient), and what the programs ask of it (SlurmControl). Updates
    change the state; nothing is recorded."""

    def __init__(self, names: Sequence[str], partition_of: dict[str, str], clock) -> None:
        self.clock = clock
        self.partition_of = partition_of
        self.state = {n: {"IDLE", "CLOUD", "POWERED_DOWN"} for n in names}
        self.reason = {n: "" for n in names}
        self.boot: dict[str, float | None] = {n: None for n in names}
        self.jobs: dict[int, dict[str, Any]] = {}  # job id -> squeue's fields
        self.idle_since: dict[str, float] = {}

    # -- SlurmClient (the loop)
    def show_nodes(self) -> dict[str, Any]:
        return {"nodes": [{"name": n, "state": sorted(s), "reason": self.reason[n],
                           "partitions": [self.partition_of[n]], "boot_time": _num(self.boot[n]),
                           "slurmd_start_time": _num(self.boot[n])} for n, s in self.state.items()]}

    def jobs_doc(self) -> dict[str, Any]:
        return {"jobs": list(self.jobs.values())}

    def update(self, argv: Sequence[str]) -> None:
        words = dict(a.split("=", 1) for a in argv[2:])
        names = hostlist.expand_hostlist(words["nodename"])
        what = words["state"]
        for n in names:
            if n not in self.state:
                continue
            if what == "DOWN":
                self.state[n] = (self.state[n] - {"IDLE", "ALLOCATED"}) | {"DOWN"}
                self.reason[n] = words.get("reason", "")
                self._end_jobs_on(n, "NODE_FAIL")
            elif what == "POWER_DOWN_FORCE":
                self.state[n] = (self.state[n] - {"POWERING_UP", "ALLOCATED"}) | {"POWERED_DOWN"}
                self.boot[n] = None
                self._end_jobs_on(n, "NODE_FAIL")
            elif what == "RESUME":
                self.state[n] = {"IDLE", "CLOUD", "POWERED_DOWN"} if "POWERED_DOWN" in self.state[n] else {"IDLE", "CLOUD"}
                self.reason[n] = ""

    # -- SlurmControl (the programs)
    def set_down(self, names: Sequence[str], reason: str) -> None:
        self.update(["scontrol", "update", f"nodename={','.join(names)}", "state=DOWN", f"reason={reason}"])

    def return_to_service(self, names: Sequence[str]) -> None:
        self.update(["scontrol", "update", f"nodename={','.join(names)}", "state=RESUME"])

    def power_down(self, names: Sequence[str]) -> None:
        self.update(["scontrol", "update", f"nodename={','.join(names)}", "state=POWER_DOWN_FORCE"])

    def end_power_down(self, names: Sequence[str]) -> None:
        for n in names:
            self.state[n] = {"IDLE", "CLOUD", "POWERED_DOWN"}
            self.reason[n] = ""
            self.boot[n] = None

    def node_states(self, names: Sequence[str]) -> list[str] | None:
        return ["idle%" if "POWERING_DOWN" in self.state.get(n, ()) else "idle~" for n in names]

    def _end_jobs_on(self, node: str, how: str) -> None:
        for job in self.jobs.values():
            if job["job_state"] == ["RUNNING"] and node in job["_nodes"]:
                job["job_state"], job["end_time"] = [how], _num(self.clock())


class Cluster:
    """The churn around the loop: jobs, workers coming and going, failures; the programs called."""

    def __init__(self, nodes: int, seed: int, work: Path) -> None:
        self.rng = random.Random(seed)
        self.now = 1_800_000_000.0
        per = max(1, nodes // len(POOLS))
        inv = [SlurmNode(f"{p}-{i}", p, p, 4, 8192) for p in POOLS for i in range(per)]
        self.inventory_path = work / "inventory.json"
        self.inventory_path.write_text(json.dumps(Inventory(tuple(inv)).to_json()))
        self.names = [n.name for n in inv]
        self.backend = SimBackend(lambda: self.now)
        self.slurm = SimSlurm(self.names, {n.name: n.partition for n in inv}, lambda: self.now)
        self.next_job = 1
        self.orphans = 0
        self.env = {"SLURMK8S_LEDGER": str(work / "ledger.json"), "SLURMK8S_EVENTS": str(work / "events.jsonl"),
                    "SLURMK8S_LOG": str(work / "elastic.log"), "SLURMK8S_INVENTORY": str(self.inventory_path),
                    "SLURM_CONF": str(work / "slurm.conf")}  # absent: Slurm's default timeouts
        inventory = Inventory.read(str(self.inventory_path))

        def make_context(program: str, pid: int) -> programs.Context:
            penv = programs.with_program_defaults(self.env)
            return programs.Context(penv, programs.program_log(program, penv, pid), backend=self.backend,
                                    slurm=self.slurm, inventory=inventory, sleep=lambda _s: None)

        self.socket = str(work / "programs.sock")
        self.server = ProgramServer(self.socket, runner_for(make_context, runs(None)), Log("reconcile", stream=_Sink()))
        if not self.server.start():
            sys.exit(f"cannot serve the programs on {self.socket}")
        self.program_calls = 0

    def call(self, program: str, names: Sequence[str]) -> None:
        delegate(self.socket, program, [hostlist.collect_hostlist(list(names))], None)
        self.program_calls += 1

    def churn(self) -> None:
        """What happens in the cluster during one period, before the loop's next pass."""
        rng, s, b, now = self.rng, self.slurm, self.backend, self.now
        # workers come up: Pending -> Running, slurmd registers (a missing image stays Pending)
        for name, w in list(b.workers.items()):
            if w.phase == "Pending" and not w.reason and now - (w.created_at or now) >= RECONCILE_PERIOD:
                if rng.random() < 0.004:
                    b.workers[name] = replace(w, reason="ErrImagePull: pull access denied", version="2")
                else:
                    b.workers[name] = replace(w, phase="Running", ready_at=now, version="2")
                    if name in s.state and "POWERING_UP" in s.state[name]:
                        s.state[name] = (s.state[name] - {"POWERING_UP", "POWERED_DOWN"})
                        s.boot[name] = now
            elif w.phase == "Running" and name in s.state:
                r = rng.random()
                if r < 0.0003:
                    b.workers[name] = replace(w, phase="Failed", reason="Error (exit 1)", version="3")
                elif r < 0.0013:
                    del b.workers[name]  # deleted by hand, evicted: the loop sets it DOWN after its grace
                elif r < 0.0023 and not w.host_lost:
                    b.workers[name] = replace(w, host_lost=True, version="3")
        if rng.random() < 0.05:  # a pod with our labels for no node of the inventory
            self.orphans += 1
            ghost = f"ghost-{self.orphans}"
            b.workers[ghost] = Worker(ghost, "Running", created_at=now, uid=f"{ghost}-uid", version="1")
        # jobs end; finished ones leave the listing after MinJobAge
        for job_id, job in list(s.jobs.items()):
            if job["job_state"] == ["RUNNING"] and now >= job["_ends"]:
                job["job_state"], job["end_time"] = ["COMPLETED"], _num(now)
                for n in job["_nodes"]:
                    if n in s.state and "ALLOCATED" in s.state[n]:
                        s.state[n] = (s.state[n] - {"ALLOCATED"}) | {"IDLE"}
            if job["job_state"] != ["RUNNING"] and now - job["end_time"]["number"] > MIN_JOB_AGE * RECONCILE_PERIOD:
                del s.jobs[job_id]
        # jobs arrive: Slurm powers up idle~ nodes and calls the resume program for them
        for _ in range(rng.randint(0, 3)):
            pool = rng.choice(POOLS)
            free = [n for n in self.names if n.startswith(pool + "-") and s.state[n] == {"IDLE", "CLOUD", "POWERED_DOWN"}]
            want = rng.choice((1, 1, 2, 4, 8))
            if len(free) < want:
                continue
            nodes = rng.sample(free, want)
            for n in nodes:
                s.state[n] = {"ALLOCATED", "CLOUD", "POWERED_DOWN", "POWERING_UP"}
                s.idle_since.pop(n, None)
            job_id, self.next_job = self.next_job, self.next_job + 1
            s.jobs[job_id] = {"job_id": job_id, "partition": pool, "job_state": ["RUNNING"],
                              "submit_time": _num(now), "start_time": _num(now + 5), "end_time": _num(now + 3600),
                              "nodes": hostlist.collect_hostlist(nodes), "_nodes": set(nodes),
                              "_ends": now + RECONCILE_PERIOD * rng.randint(3, 40)}
            self.call("resume", nodes)
        # nodes idle a while: Slurm calls the suspend program (POWERING_DOWN meanwhile)
        idle = [n for n in self.names if s.state[n] == {"IDLE", "CLOUD"}]
        for n in idle:
            s.idle_since.setdefault(n, now)
        due = [n for n in idle if now - s.idle_since[n] >= SUSPEND_AFTER * RECONCILE_PERIOD]
        if due:
            for n in due:
                s.state[n] = {"IDLE", "CLOUD", "POWERING_DOWN"}
                s.idle_since.pop(n, None)
            self.call("suspend", due)
        # a node still powering up long after its resume: Slurm's ResumeTimeout calls resume-fail
        stuck = [n for n in self.names if "POWERING_UP" in s.state[n] and n not in b.workers]
        if stuck:
            for n in stuck:
                s.state[n] = {"IDLE", "CLOUD", "POWERED_DOWN"}
            self.call("resume-fail", stuck)


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def run(passes: int, nodes: int, sample: int, warmup: int, log_bytes: int, seed: int = 40) -> dict[str, Any]:
    """The loop's passes over the churning cluster; RSS samples and what the loop found."""
    with tempfile.TemporaryDirectory(prefix="reconcile-rss-") as tmp:
        work = Path(tmp)
        cluster = Cluster(nodes, seed, work)
        policy = Policy()
        log = Log("reconcile", str(work / "reconcile.log"), max_bytes=log_bytes)
        ledger = FileLedger(str(work / "ledger.json"), policy, log=log.write)
        metrics = Metrics()
        events = EventTail(cluster.env["SLURMK8S_EVENTS"])
        events.read()
        usage_file = UsageFile(str(work / "usage.json"))
        restored, why = resume_usage(None, "bench", cluster.now)
        metrics.restore_usage(restored)
        log.write(why)
        restart_watch: dict = {}
        lost_watch: dict = {}
        started = cluster.now
        found: dict[str, int] = {}
        samples: list[tuple[int, int]] = []
        rotations = 0
        client = _Client(cluster.slurm)
        t0 = time.monotonic()
        for i in range(1, passes + 1):
            cluster.churn()
            tick = time.monotonic()
            now = cluster.now
            inventory = Inventory.read(str(cluster.inventory_path))
            report = run_once(client, cluster.backend, inventory, ledger, now, log, policy, "scontrol",
                              restart_watch, lost_watch)
            jobs = report.jobs
            pools = [f.pool for f in report.findings if f.kind is Kind.POOL_BACKOFF]
            metrics.observe_pass(report, jobs, now, started, time.monotonic() - tick, pools)
            metrics.observe_events(events.read())
            usage_file.save(metrics.usage("bench"))
            metrics.exposition()  # Prometheus' scrape
            for f in report.findings:
                if f.kind is not Kind.OK:
                    found[f.kind.value] = found.get(f.kind.value, 0) + 1
            cluster.backend.forget_calls()
            if os.path.exists(str(work / "reconcile.log.1")):
                rotations += 1
                os.unlink(str(work / "reconcile.log.1"))  # the next rotation is counted too
            if i % sample == 0:
                samples.append((i, rss_kib()))
            cluster.now += RECONCILE_PERIOD
        seconds = time.monotonic() - t0
        cluster.server.close()
        log.close()
    after = [kib for at, kib in samples if at >= warmup] or [kib for _, kib in samples]
    base = after[0]
    return {"passes": passes, "nodes": len(cluster.names), "seconds": round(seconds, 1),
            "samples": samples, "first_kib": samples[0][1], "last_kib": samples[-1][1],
            "max_kib": max(k for _, k in samples), "warmup": warmup, "base_kib": base,
            "growth_kib": samples[-1][1] - base, "max_growth_kib": max(after) - base,
            "jobs": cluster.next_job - 1, "program_calls": cluster.program_calls, "orphans": cluster.orphans,
            "log_rotations": rotations, "found": dict(sorted(found.items())),
            "missing_kinds": sorted(k.value for k in EXPECTED if k.value not in found)}


class _Client:
    """SimSlurm as the loop's SlurmClient (`jobs()` is squeue's document there)."""

    def __init__(self, slurm: SimSlurm) -> None:
        self._slurm = slurm

    def show_nodes(self) -> dict[str, Any]:
        return self._slurm.show_nodes()

    def jobs(self) -> dict[str, Any]:
        doc = self._slurm.jobs_doc()
        return {"jobs": [{k: v for k, v in j.items() if not k.startswith("_")} for j in doc["jobs"]]}

    def update(self, argv: Sequence[str]) -> None:
        self._slurm.update(argv)


def report_lines(r: dict[str, Any], floor_mib: float) -> tuple[list[str], bool]:
    """The lines printed, and whether the run is within its floor and churned as meant."""
    mib = lambda kib: kib / 1024  # noqa: E731
    growth, ok_growth = mib(r["max_growth_kib"]), mib(r["max_growth_kib"]) <= floor_mib
    churned = not r["missing_kinds"]
    lines = [
        f"{r['passes']} reconcile passes over {r['nodes']} nodes in {r['seconds']:.1f} s: {r['jobs']} jobs, "
        f"{r['program_calls']} warm program calls, {r['orphans']} orphans, {r['log_rotations']} log rotations",
        "findings: " + ", ".join(f"{k} {v}" for k, v in r["found"].items()),
        "RSS every sample: " + " ".join(f"{at}:{kib / 1024:.1f}" for at, kib in r["samples"]) + " (pass:MiB)",
        f"RSS first {mib(r['first_kib']):.1f} MiB, last {mib(r['last_kib']):.1f} MiB, max {mib(r['max_kib']):.1f} MiB",
        f"growth after {r['warmup']} passes of warm-up: {growth:+.1f} MiB at most "
        f"({mib(r['growth_kib']):+.1f} MiB at the end) (floor <= {floor_mib:g} MiB: {'met' if ok_growth else 'NOT met'})",
    ]
    if not churned:
        lines.append("the churn never made the loop find: " + ", ".join(r["missing_kinds"]) + " (not measured as meant)")
    return lines, ok_growth and churned


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--sample", type=int, default=500, help="passes between RSS samples")
    parser.add_argument("--warmup", type=int, default=1000, help="passes before the growth is counted from")
    parser.add_argument("--floor-mib", type=float, default=5.0)
    parser.add_argument("--log-bytes", type=int, default=1 << 20, help="the log file's bound (rotated past it)")
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to OUT")
    args = parser.parse_args(argv)
    if args.passes < args.sample or args.sample < 1:
        parser.error("--passes must be at least --sample (one RSS sample), --sample at least 1")
    r = run(args.passes, args.nodes, args.sample, min(args.warmup, args.passes), args.log_bytes, args.seed)
    lines, ok = report_lines(r, args.floor_mib)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({**r, "floor_mib": args.floor_mib, "ok": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
