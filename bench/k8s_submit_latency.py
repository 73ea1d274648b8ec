"""P1 on Kubernetes: `sbatch` -> job RUNNING, from zero workers and from idle workers, beside a bare
pod start (same slurmd image, cached) measured in the same run; each from-zero run split in phases.

Deploys from nothing the e2e cluster shape of examples/local.yaml with a short SuspendTime as its
own cluster `bench-p1` (namespace slurm-bench-p1, its own static volumes), beside whatever else runs,
then runs the measuring loop *inside one SSH session* on the login pod so SSH set-up never counts.
A slurm-bench-p1 namespace this benchmark did not make is never touched (refused before anything
runs; `slurmk8s up` also refuses a namespace another stack owns); one an earlier run left (--keep,
or a run stopped midway) is deleted first, with its volumes and its Pulumi state.

P5 comes first: `slurmk8s up` from nothing (no namespace, no volume data, no state; the images
cached on the nodes, as the quickstart leaves them) until the login pod answers SSH (a session that
runs `true`, tried every 0.1 s once `up` returned). Only on the local cluster, whose hostPath
volumes are this machine's directories and are emptied first; elsewhere their data may be an
earlier run's, and the JSON says so (`from_nothing` false).

Usage: KUBECONFIG=... python bench/k8s_submit_latency.py [--runs 10] [--keep] [--json OUT]
(--json also writes `slurmk8s up`'s time, P5's and `sinfo --version`, asked after the measuring.)
At the end `slurmk8s down --purge` (unless --keep): nothing of the run stays.
Target (issue #6): p50 <= 8 s and <= 3x the bare pod start.

Phases of a run from zero workers (issue #17), each in seconds after t0, so what is left is visible.
All the clocks below are CLOCK_REALTIME of one kernel: the local cluster (API server, scheduler,
kubelet, containerd) and every pod run on this host, so the stamps compare directly. The worker
pods are watched (`kubectl get pods --watch`) for the whole from-zero loop, since a worker pod is
deleted SuspendTime after its job; elastic.log, slurmctld's log and the Scheduled events are read
once after it. Matching is by job id or node name, within t0 .. RUNNING seen (1 s of slack for
1 s stamps).

  phase                 source                                                      resolution
  t0                    login pod, `date +%s%N` just before `sbatch`                ns
  sbatch returned       login pod, `date +%s%N` right after `sbatch --parsable`     ns
  job allocated         slurmctld: `sched: Allocate JobId=J NodeList=N ...`         ns (a)
  resume program        elastic.log (provisioner/logs.py): the first line of the    1 ms (b)
    started             resume[pid] call whose `resume file:` line names job J (the
                        node and time window when it does not)
  pod create call       elastic.log, that call's `N create ok (0.09s)` line: the    1 ms (b)
    returned            API server answered the create
  pod created           the pod's metadata.creationTimestamp (API server)            1 s (c)
  pod scheduled         the scheduler's `Scheduled` event, eventTime (it writes      1 us
                        through the events API); else the pod's PodScheduled        1 s (c)
                        condition lastTransitionTime
  container started     the pod's containerStatuses[].state.*.startedAt (kubelet)   1 s (c)
  slurmd registered     slurmctld: `Node N now responding`, logged as it handles    ns (a)
                        the registration of the powering-up node. Chosen over the
                        prolog's line (it polls sinfo every 0.1 s, below) and the
                        node record's BootTime (now less the uptime slurmd
                        reports: a container's is the host's) and SlurmdStartTime
                        (slurmd's own start, not its registration; both 1 s)
  prolog saw node       elastic.log: `prolog[pid] job J nodes N: booted after Xs`   1 ms (b)
    booted              (PrologSlurmctld returns right after; slurmctld may then
                        start the job)
  job started           slurmctld: `Resetting JobId=J start time for node power     ns (a)
                        up` (the job leaves CONFIGURING; Slurm's start_time is set
                        to this second)
  Slurm start_time      `SLURM_TIME_FORMAT=%s squeue -o %S` on the login pod once   1 s (c)
                        RUNNING
  job RUNNING seen      login pod, `date +%s%N` once `squeue` said RUNNING (polled  ns
                        every 50 ms); t0 to this is the reported submit -> RUNNING

(a) slurmctld has no SlurmctldLogFile and writes no time on stderr; the stamp is containerd's as it
    read the line from the container's pipe (`kubectl logs --timestamps`, RFC 3339, ns): slurmctld
    flushes every line, so the stamp trails the event by the pipe's hand-over (normally well under a
    millisecond; more when the CPUs are contended).
(b) UTC, milliseconds, truncated; the time the program wrote the line (Python's time.time()). The
    resume program's first line comes after its interpreter started and imported its modules (tens
    of ms after slurmctld's power-save thread started it), before any backend call.
(c) Kubernetes' metav1.Time: truncated to the second, so up to 1 s early; marked * in the output.
    In the summary a phase's step counts from the previous sub-second phase, never from a 1 s one.
    The kubelet's Pulled / Created / Started events are not used: they carry 1 s stamps too.

The parsing is in bench/p1_phases.py (pure functions, tests/test_bench_phases.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import asyncssh
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import (LOCAL_KUBECONFIG, NotOurs, clear_leftover, e2e_spec, kjson, kubeconfig, kubectl,  # noqa: E402
                     kubectl_exe, mark_made_by, server_version, slurmk8s, static_volumes)
from p1_phases import (PHASES, Sources, json_stream, parse_runs, pct, phase_table, phases,  # noqa: E402
                       pod_times, prolog_waits, resume_calls, run_table, scheduled_events, slurmctld_events)

NAME = "bench-p1"  # its own cluster: never the quickstart's or the e2e suite's `local`
NAMESPACE = f"slurm-{NAME}"
MADE_BY = "bench"
WORKERS = f"slurmk8s.io/cluster={NAME},app.kubernetes.io/component=worker"
ELASTIC_LOG = "/var/log/slurmk8s/elastic.log"
HOST_VOLUMES = Path("/var/lib/slurmk8s/volumes") / NAME  # static_volumes' hostPath directories
SSH_TRY_EVERY = 0.1  # P5: how often the login pod's sshd is tried once `up` returned

# one line per run: `run I job J t0 NS sbatch NS running NS start S nodes N` (p1_phases.parse_run_line)
LOOP = r"""
set -e
mode=$1; runs=$2
for i in $(seq "$runs"); do
  if [ "$mode" = zero ]; then   # wait until every node is powered down (no worker pod)
    until [ -z "$(sinfo -h -N -o '%T' | grep -v '~$')" ]; do sleep 0.2; done
  fi
  t0=$(date +%s%N)
  j=$(sbatch --parsable -N1 -o /dev/null --wrap 'sleep 1')
  ts=$(date +%s%N)
  j=${j%%;*}
  until [ "$(squeue -h -j "$j" -o %T)" = RUNNING ]; do sleep 0.05; done
  t1=$(date +%s%N)
  read -r st nl <<< "$(SLURM_TIME_FORMAT=%s squeue -h -j "$j" -o '%S %N')" || true
  echo "run $i job $j t0 $t0 sbatch $ts running $t1 start ${st:--} nodes ${nl:--}"
  while squeue -h -j "$j" | grep -q .; do sleep 0.2; done
done
"""


def bare_pod_start(image: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        name = f"bench-bare-{uuid.uuid4().hex[:6]}"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
               "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                                        "command": ["/usr/bin/tini", "--", "sleep", "60"],
                                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}
        t0 = time.monotonic()
        subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), "create", "-f", "-"],
                       input=json.dumps(pod), text=True, capture_output=True, check=True)
        while kjson("get", "pod", "-n", NAMESPACE, name)["status"].get("phase") != "Running":
            time.sleep(0.05)
        times.append(time.monotonic() - t0)
        kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")
    return times


class PodWatch:
    """`kubectl get pods --watch` of the cluster's worker pods while the from-zero loop runs: every
    version of every worker pod object is appended to `path` as the API server sends it (a worker
    pod is deleted SuspendTime after its job, so its timestamps are caught while it exists).
    Restarted if kubectl exits early (its stderr: `path` with suffix .err); p1_phases.json_stream
    reads the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def _run(self) -> None:
        with self.path.open("a") as out, self.path.with_suffix(".err").open("a") as err:
            while True:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._proc = subprocess.Popen(
                        [kubectl_exe(), "--kubeconfig", kubeconfig(), "get", "pods", "-n", NAMESPACE, "-l", WORKERS,
                         "--watch", "--output-watch-events", "-o", "json"],
                        stdout=out, stderr=err)
                self._proc.wait()
                if self._stop.wait(0.5):
                    return

    def __enter__(self) -> "PodWatch":
        self._thread.start()
        time.sleep(1.0)  # the watch is open before the first submit
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._stop.set()
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
        self._thread.join(timeout=10)


def read_sources(watch_file: Path, since: float) -> Sources:
    """What the from-zero runs left behind, read once after the loop."""
    elastic = kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "sh", "-c",
                      f"cat {ELASTIC_LOG}.1 {ELASTIC_LOG} 2>/dev/null", check=False).stdout.splitlines()
    ctld = kubectl("logs", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--timestamps",
                   "--since-time=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since - 5)),
                   check=False, timeout=120).stdout
    got = kubectl("get", "events", "-n", NAMESPACE, "--field-selector", "reason=Scheduled", "-o", "json", check=False)
    events = json.loads(got.stdout) if got.returncode == 0 and got.stdout.strip() else {}
    return Sources(calls=resume_calls(elastic), prolog=prolog_waits(elastic), ctld=slurmctld_events(ctld),
                   pods=pod_times(json_stream(watch_file.read_text())), scheduled=scheduled_events(events))


def clear_from_nothing(state: Path) -> bool:
    """Before `up`: what an earlier run left goes (its namespace, its PersistentVolumes, its Pulumi
    state, and on the local cluster its volumes' host directories); raises NotOurs for a namespace
    this bench did not make. True when nothing of an earlier run can remain (the local cluster)."""
    clear_leftover(NAMESPACE, MADE_BY)
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={NAME}", "--ignore-not-found", "--wait=true", "--timeout=120s",
            timeout=150)
    shutil.rmtree(state, ignore_errors=True)
    if kubeconfig() != LOCAL_KUBECONFIG:
        return False
    shutil.rmtree(HOST_VOLUMES, ignore_errors=True)
    return True


async def first_ssh_answer(host: str, key: asyncssh.SSHKey, t0: float, within: float = 120) -> float:
    """P5: seconds from `t0` until an SSH session to the login pod ran `true` (tried every SSH_TRY_EVERY)."""
    end = time.monotonic() + within
    while True:
        try:
            async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None,
                                        connect_timeout=5) as conn:
                await conn.run("true", check=True, timeout=10)
                return time.monotonic() - t0
        except (OSError, asyncssh.Error, asyncio.TimeoutError):
            if time.monotonic() > end:
                raise
            await asyncio.sleep(SSH_TRY_EVERY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    parser.add_argument("--json", metavar="OUT", type=Path,
                        help="write every run (from zero: with its phases, s after t0, and their sources) to OUT")
    args = parser.parse_args()
    work = Path("/tmp/slurmk8s-bench-p1")
    work.mkdir(exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec = e2e_spec(key.export_public_key().decode().strip() + " bench")
    spec["name"] = NAME
    spec["elasticity"] = {"suspend_time": 5, "suspend_timeout": 5, "resume_timeout": 120}
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    log = work / "slurmk8s.log"
    try:
        from_nothing = clear_from_nothing(work / "state")
    except NotOurs as err:
        sys.exit(f"cannot run: {err}")
    subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), "apply", "-f", "-"], text=True, check=True,
                   capture_output=True, input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": static_volumes(NAME, NAMESPACE)}))
    t0 = time.monotonic()
    try:
        failed = slurmk8s("up", "--spec", str(work / "spec.yaml"), "--state", str(work / "state"), log=log).returncode
    finally:
        mark_made_by(NAMESPACE, MADE_BY)
    if failed:
        sys.exit(f"slurmk8s up failed: see {log}")
    up_seconds = time.monotonic() - t0
    host = kjson("get", "service", "-n", NAMESPACE, "login")["spec"]["clusterIP"]
    login_seconds = asyncio.run(first_ssh_answer(host, key, t0))
    print(f"slurmk8s up: {up_seconds:.1f} s; login answered SSH {login_seconds:.1f} s after `up` started"
          + ("" if from_nothing else " (not from nothing: the volumes are not this machine's to empty)"))

    async def connect() -> asyncssh.SSHClientConnection:
        """The login pod's sshd (it answered P5's session already; tried again for 60 s all the same)."""
        end = time.monotonic() + 60
        while True:
            try:
                return await asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None)
            except OSError:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(1)

    async def loop(mode: str) -> str:
        async with await connect() as conn:
            await conn.run(f"cat > bench-loop.sh <<'EOF'\n{LOOP}\nEOF", check=True)
            res = await conn.run(f"bash bench-loop.sh {mode} {args.runs}", check=True, timeout=1800)
            return str(res.stdout)

    async def slurm_version() -> str:  # for --json; after the measuring, never inside it
        try:
            async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None) as conn:
                return str((await conn.run("sinfo --version", check=False, timeout=60)).stdout).strip() or "?"
        except (OSError, asyncssh.Error) as err:
            return f"? ({err})"

    watch_file = work / "pods.watch.json"
    watch_file.write_text("")
    started = time.time()
    with PodWatch(watch_file):
        zero_runs = parse_runs(asyncio.run(loop("zero")))
    sources = read_sources(watch_file, started)
    zero_phases = [phases(r, sources) for r in zero_runs]
    idle_runs = parse_runs(asyncio.run(loop("idle")))
    zero = [r.seconds for r in zero_runs]
    idle = [r.seconds for r in idle_runs]
    bare = bare_pod_start("slurmk8s/slurmd:dev", max(5, args.runs // 2))
    server = server_version()
    print(f"Kubernetes {server}, Slurm 24.11 images, {args.runs} runs each, 1-node batch job")
    for name, vals in (("from zero workers", zero), ("from idle workers", idle), ("bare pod start", bare)):
        print(f"{name:18s}: p50 {statistics.median(vals):5.2f} s  p95 {pct(vals, 0.95):5.2f} s  "
              f"min {min(vals):5.2f} s  max {max(vals):5.2f} s")
    ratio = statistics.median(zero) / statistics.median(bare)
    print(f"from zero / bare pod start (p50): {ratio:.1f}x (target <= 3x, and p50 <= 8 s)")
    print("\nfrom zero workers, per run (s after t0; * 1 s stamps):")
    print("\n".join(run_table(zero_phases)))
    print(f"\nfrom zero workers, by phase ({len(zero_phases)} runs):")
    print("\n".join(phase_table(zero_phases)))
    if args.json:
        args.json.write_text(json.dumps({
            "kubernetes": server, "slurm": asyncio.run(slurm_version()), "up_seconds": round(up_seconds, 3),
            "login_ssh_seconds": round(login_seconds, 3), "from_nothing": from_nothing,
            "runs": args.runs,
            "phases": [{"key": k, "label": label, "resolution": res} for k, label, res in PHASES],
            "zero": [{**p, "seconds": round(r.seconds, 6)} for r, p in zip(zero_runs, zero_phases)],
            "idle": [{"job": r.job, "node": r.nodes, "t0": r.t0, "seconds": round(r.seconds, 6),
                      "sbatch_returned": round(r.sbatch - r.t0, 6), "start_time": r.start_time} for r in idle_runs],
            "bare_pod_start": [round(b, 6) for b in bare],
        }, indent=2) + "\n")
        print(f"per-run phases: {args.json}")
    if not args.keep:
        slurmk8s("down", "--spec", str(work / "spec.yaml"), "--state", str(work / "state"), "--purge", "--yes", log=log)
        clear_from_nothing(work / "state")  # the Released PersistentVolumes and their directories too


if __name__ == "__main__":
    main()
