"""Pools under Kueue (issue 41), measured on the real cluster with a real Kueue, in one run:

1. P1 from zero, a pool under a Kueue queue beside a pool under none: `sbatch -N1` -> job RUNNING
   (seen on the login pod, squeue polled every 50 ms), each run on a node of its own that has no
   worker pod yet, the two pools taking turns. Overhead = p50(kueue) - p50(plain); floor 0.3 s.
2. Quota freed -> the waiting job RUNNING: a ClusterQueue quota for one worker pod; job A runs, job
   B waits (Kueue gates its pod); from A's pod gone (A's idle node handed its quota on: powered down
   at once, not at SuspendTime, its pod deleted; Kueue's workload done, its quota free) to B
   RUNNING. p50 of --freed runs; floor 2 s. Also from A's end to B RUNNING, the handover included.
   Each sample starts with no pod in the pool (A on a node still up would be in another job's pod
   group), and prints each step's time after A's pod was gone (bench/kueue_timeline.py).
3. Two 2-node jobs on a quota for 2 pods: how many pods of a job ran while another of the same job
   was gated (must be 0), and both jobs COMPLETED.

Its own cluster `bench-kq` (namespace slurm-bench-kq, labelled for Kueue, with its LocalQueue made
before `up`, as a platform team would) beside whatever else runs; Kueue from `slurmk8s cluster
kueue up` (run first; this script runs it, a few seconds when Kueue is up). At the end the cluster
is removed (`down --purge`), then its ClusterQueue and ResourceFlavor; --keep leaves them.

Usage: KUBECONFIG=... python bench/kueue.py [--runs 5] [--freed 3] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

import deploy  # noqa: E402
import kueue_timeline as timeline  # noqa: E402
import p1_phases  # noqa: E402
from helpers import MADE_BY, kjson, kubectl, login_in, server_version, side_spec  # noqa: E402
from kueuelab import apply, cluster_queue, kueue_up, local_queue, resource_flavor  # noqa: E402

from provisioner import kueue as names  # noqa: E402
from provisioner.names import L_NODE, L_POOL  # noqa: E402
from provisioner.localk8s import kueue_manifests as km  # noqa: E402

NAME = "bench-kq"
NAMESPACE = deploy.namespace_of(NAME)
QUEUE, CQ, FLAVOR = "slurm", "bench-kq", "bench-kq"
POD_CPU, POD_MEMORY = "50m", "128Mi"
OVERHEAD_FLOOR, FREED_FLOOR = 0.3, 2.0
# long enough that a node suspended within it was handed over, not idle for SuspendTime
SUSPEND_TIME = 30

# one line per run: `p1 POOL NODE JOB T0_NS RUNNING_NS`
P1_LOOP = r"""
set -e
runs=$1
for i in $(seq 0 $((runs - 1))); do
  for p in kq plain; do
    t0=$(date +%s%N)
    j=$(sbatch --parsable -p "$p" -w "$p-$i" -N1 -o /dev/null --wrap 'sleep 2'); j=${j%%;*}
    until [ "$(squeue -h -j "$j" -o %T)" = RUNNING ]; do sleep 0.05; done
    echo "p1 $p $p-$i $j $t0 $(date +%s%N)"
  done
done
"""


def spec(public_key: str, nodes: int) -> dict[str, Any]:
    out = side_spec(public_key, NAME)
    small = {"mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": POD_CPU,
             "pod_memory_request": POD_MEMORY, "domains": [{"name": "local", "count": nodes}]}
    out["pools"] = [{"name": "kq", **small, "kueue": {"queue": QUEUE}}, {"name": "plain", **small}]
    out["elasticity"] = {"suspend_time": SUSPEND_TIME, "resume_timeout": 180}
    return out


def quota(pods: int) -> None:
    """The ClusterQueue's nominal quota: `pods` worker pods' requests."""
    cpu_m, mem_mi = int(POD_CPU.rstrip("m")) * pods, int(POD_MEMORY.rstrip("Mi")) * pods
    apply(cluster_queue(CQ, FLAVOR, cpu=f"{cpu_m}m", memory=f"{mem_mi}Mi"))


def prepare() -> None:
    kubectl("create", "namespace", NAMESPACE)
    kubectl("label", "namespace", NAMESPACE, f"{MADE_BY}={deploy.MADE_BY}",
            f"{km.MANAGED_KEY}={km.MANAGED_VALUE}", "--overwrite")
    apply(resource_flavor(FLAVOR), local_queue(NAMESPACE, QUEUE, CQ))
    quota(64)


def job_pods(job: int) -> list[dict[str, Any]]:
    return [p for p in kjson("get", "pods", "-n", NAMESPACE, "-l", names.GROUP_LABEL)["items"]
            if names.job_of(p["metadata"]["labels"][names.GROUP_LABEL]) == job]


def pool_pods(pool: str) -> list[dict[str, Any]]:
    return kjson("get", "pods", "-n", NAMESPACE, "-l", f"{L_POOL}={pool}")["items"]


def gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] in names.GATES for g in pod["spec"].get("schedulingGates") or [])


def state(login, job: str) -> str:
    """The job's state: squeue's, else scontrol's (this cluster keeps no accounting for sacct)."""
    out = login.run(f"squeue -h -j {job} -o %T", check=False).stdout.strip()
    if out:
        return out
    shown = login.run(f"scontrol show job -o {job}", check=False).stdout
    return next((w.split("=", 1)[1] for w in shown.split() if w.startswith("JobState=")), "")


def sbatch(login, args: str) -> str:
    return login.run(f"sbatch --parsable -o /dev/null {args}").stdout.strip().split(";")[0]


def wait_state(login, job: str, want: tuple[str, ...], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = state(login, job)
        if got.startswith(want):
            return got
        time.sleep(0.2)
    story = login.run(f"scontrol show job {job}; squeue -a; sinfo -N", check=False)
    sys.exit(f"job {job} not {'/'.join(want)} within {timeout:.0f} s (last: {state(login, job)!r})\n"
             f"{story.stdout}{story.stderr}")


class Sample(NamedTuple):
    freed: float  # A's pod gone -> B RUNNING
    ended: float  # A no longer RUNNING -> B RUNNING: what a researcher waits, the handover included
    steps: dict[str, float | None]  # each step's time after A's pod was gone


def freed_to_running(login, watch: timeline.Watch) -> Sample:
    """One sample of 2: A runs on the quota's one pod, B waits; A ends, its idle node hands the quota
    on, A's pod gone -> B RUNNING. Each step's time after A's pod was gone comes from the watch and
    slurmctld's log (bench/kueue_timeline.py)."""
    no_pod_left()  # no warm node left: A gets a pod (and a pod group) of its own
    a = sbatch(login, "-p kq -N1 --wrap 'sleep 3'")
    wait_state(login, a, ("RUNNING",), 120)
    if not job_pods(int(a)):
        sys.exit(f"job {a} runs on no pod of its own pod group")
    b = sbatch(login, "-p kq -N1 --wrap 'sleep 3'")
    deadline = time.monotonic() + 60
    while not (waiting := [p for p in job_pods(int(b)) if gated(p)]):
        if time.monotonic() > deadline:
            sys.exit(f"job {b}'s pod never waited for quota")
        time.sleep(0.2)
    a_group = job_pods(int(a))[0]["metadata"]["labels"][names.GROUP_LABEL]
    b_group, b_node = waiting[0]["metadata"]["labels"][names.GROUP_LABEL], waiting[0]["metadata"]["labels"][L_NODE]
    ended = wait_ended(login, a)
    while job_pods(int(a)):  # A ended: its idle node hands its quota on (powered down, its pod deleted)
        time.sleep(0.05)
    freed = time.monotonic()
    took = wait_running(login, b) - freed
    seen_running = time.time()
    times = timeline.sample_times(list(watch.seen), a_group, b_group, names.GROUP_LABEL, names.GATES)
    since = (times["freed"] or seen_running - took) - 5
    ctld = p1_phases.slurmctld_events(kubectl(
        "logs", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--timestamps",
        "--since-time=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)), check=False).stdout)
    times["registered"] = next((t for t in ctld.registered.get(b_node, []) if t >= since), None)
    times["job_started"] = ctld.started.get(int(b))
    times["running_seen"] = seen_running
    wait_state(login, b, ("COMPLETED",), 120)
    while job_pods(int(b)):
        time.sleep(0.2)
    return Sample(took, freed - ended + took, timeline.steps(times))


def admin(*argv: str) -> None:
    """scontrol in slurmctld's container (root there, a Slurm administrator): what a loop running
    the other plan would do."""
    kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "scontrol", *argv)


def no_pod_left(pool: str = "kq") -> None:
    deadline = time.monotonic() + 120
    while pool_pods(pool):  # no warm node left: each sample starts from zero pods
        if time.monotonic() > deadline:
            sys.exit(f"the {pool} pool's worker pods were not deleted within 120 s of their jobs")
        time.sleep(0.2)


def wait_ended(login, job: str) -> float:
    """Poll squeue every 50 ms until `job` no longer runs: the time it was seen."""
    while state(login, job) == "RUNNING":
        time.sleep(0.05)
    return time.monotonic()


def wait_running(login, job: str, timeout: float = 120) -> float:
    """Poll squeue every 50 ms until `job` runs (or ran): the time it was seen."""
    deadline = time.monotonic() + timeout
    while "RUNNING" not in (got := state(login, job)) and not got.startswith("COMPLETED"):
        if time.monotonic() > deadline:
            wait_state(login, job, ("RUNNING",), 0)
        time.sleep(0.05)
    return time.monotonic()


TENANT = "bench-kq-tenant"


def tenant(hold: bool) -> None:
    """Another tenant's pod in the queue, holding the quota's one worker pod's share (hold), or gone."""
    if not hold:
        kubectl("delete", "pod", TENANT, "-n", NAMESPACE, "--ignore-not-found", "--wait=true", "--grace-period=0",
                timeout=90)
        return
    apply({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": TENANT, "namespace": NAMESPACE, "labels": {names.QUEUE_LABEL: QUEUE}},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "slurmk8s/slurmd:dev", "imagePullPolicy": "Never",
                                    "command": ["sleep", "600"],
                                    "resources": {"requests": {"cpu": POD_CPU, "memory": POD_MEMORY},
                                                  "limits": {"memory": POD_MEMORY}}}]}})
    kubectl("wait", "pod", TENANT, "-n", NAMESPACE, "--for=condition=Ready", "--timeout=90s", timeout=100)


def plans(login, nodes: int, samples: int) -> dict[str, list[float]]:
    """The two plans for capacity Kubernetes may refuse, on a quota for one worker pod:

    - hold (what slurmk8s does): Slurm allocates nodes as if the capacity were there; Kueue gates
      the job's pods (the job CONFIGURING) until quota frees;
    - drain: nodes are made unavailable to Slurm while the queue has no quota (drained), and made
      available when it has (here by hand, at once: the best case of a loop that would watch the
      ClusterQueue); the job stays PENDING with no node and no pod meanwhile.

    Each in two cases: quota freed by the queue's own job (A ends, B waits) and by another tenant's
    pod (it goes, B waits). Times to B RUNNING from A's end / the pod gone."""
    every, rest = f"kq-[0-{nodes - 1}]", f"kq-[1-{nodes - 1}]"
    out: dict[str, list[float]] = {"hold_own": [], "drain_own": [], "hold_tenant": [], "drain_tenant": []}
    for _ in range(samples):
        for plan in ("hold", "drain"):
            no_pod_left()
            a = sbatch(login, "-p kq -N1 -w kq-0 --wrap 'sleep 3'")
            wait_state(login, a, ("RUNNING",), 120)
            if plan == "drain":
                admin("update", f"nodename={rest}", "state=drain", "reason=bench: the queue has no quota")
            b = sbatch(login, "-p kq -N1 --wrap 'sleep 2'")
            ended = wait_ended(login, a)
            out[f"{plan}_own"].append(wait_running(login, b) - ended)
            if plan == "drain":
                admin("update", f"nodename={rest}", "state=undrain")
            wait_state(login, b, ("COMPLETED",), 120)

            no_pod_left()
            tenant(hold=True)
            if plan == "drain":
                admin("update", f"nodename={every}", "state=drain", "reason=bench: the queue has no quota")
            b = sbatch(login, "-p kq -N1 --wrap 'sleep 2'")
            deadline = time.monotonic() + 60
            while plan == "hold" and not [p for p in job_pods(int(b)) if gated(p)]:
                if time.monotonic() > deadline:
                    sys.exit(f"job {b}'s pod never waited for quota")
                time.sleep(0.2)
            time.sleep(1 if plan == "drain" else 0)  # B PENDING, seen by the scheduler
            tenant(hold=False)
            gone = time.monotonic()
            if plan == "drain":
                admin("update", f"nodename={every}", "state=undrain")
            out[f"{plan}_tenant"].append(wait_running(login, b) - gone)
            wait_state(login, b, ("COMPLETED",), 120)
    return out


def competing(login) -> dict[str, Any]:
    quota(2)
    first = sbatch(login, "-p kq -N2 --wrap 'sleep 6'")
    second = sbatch(login, "-p kq -N2 --wrap 'sleep 1'")
    partial = 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for job in (first, second):
            mine = job_pods(int(job))
            if any(gated(p) for p in mine):
                partial = max(partial, sum(p["status"].get("phase") == "Running" for p in mine))
        if all(state(login, j).startswith(("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL")) for j in (first, second)):
            break
        time.sleep(0.3)
    return {"jobs": [first, second], "states": [state(login, first), state(login, second)],
            "partial_pods_running": partial}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="P1 runs per pool (each on a node of its own)")
    ap.add_argument("--freed", type=int, default=3, help="quota freed -> RUNNING samples")
    ap.add_argument("--plans", type=int, default=0, help="samples of each plan for capacity Kubernetes may refuse")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = Path("/tmp/slurmk8s-bench-kueue")
    print(f"kueue up: {kueue_up():.1f} s")
    key = asyncssh.generate_private_key("ssh-ed25519")
    deploy.from_nothing(NAME, work)
    for kind, name in (("clusterqueue", CQ), ("resourceflavor", FLAVOR)):
        kubectl("delete", kind, name, "--ignore-not-found", "--wait=true", timeout=150)
    prepare()
    took_up = deploy.up(spec(key.export_public_key().decode().strip() + " bench-kq", args.runs), work,
                        cleared=True)
    print(f"slurmk8s up: {took_up:.1f} s")
    out: dict[str, Any] = {"kubernetes": server_version()}
    try:
        login = login_in(NAMESPACE, "alice", key)
        lines = login.run(f"cat > p1.sh <<'EOF'\n{P1_LOOP}\nEOF\nbash p1.sh {args.runs}", timeout=60 * args.runs + 120)
        p1: dict[str, list[float]] = {"kq": [], "plain": []}
        for line in lines.stdout.splitlines():
            if line.startswith("p1 "):
                _, pool, _node, _job, t0, t1 = line.split()
                p1[pool].append((int(t1) - int(t0)) / 1e9)
        overhead = statistics.median(p1["kq"]) - statistics.median(p1["plain"])
        for pool in ("plain", "kq"):
            print(f"P1 from zero, {pool:5} pool: p50 {statistics.median(p1[pool]):.2f} s, max {max(p1[pool]):.2f} s "
                  f"({' '.join(f'{s:.2f}' for s in p1[pool])})")
        print(f"P1 overhead of a Kueue pool: p50 {overhead:+.2f} s (floor <= {OVERHEAD_FLOOR} s)")
        quota(1)
        with timeline.Watch(NAMESPACE, names.GROUP_LABEL, names.GROUP, names.API.split("/")[1]) as watch:
            sampled = [freed_to_running(login, watch) for _ in range(args.freed)]
        freed, ended, freed_steps = [s.freed for s in sampled], [s.ended for s in sampled], [s.steps for s in sampled]
        print(f"job A ended -> waiting job B RUNNING (A's idle node handing its quota on; SuspendTime "
              f"{SUSPEND_TIME} s): p50 {statistics.median(ended):.2f} s ({' '.join(f'{s:.2f}' for s in ended)})")
        print(f"quota freed -> waiting job RUNNING: p50 {statistics.median(freed):.2f} s, max {max(freed):.2f} s "
              f"({' '.join(f'{s:.2f}' for s in freed)}) (floor <= {FREED_FLOOR} s); each step after the pod was gone:")
        print("\n".join(timeline.summary(freed_steps)))
        if watch.errors:
            print(f"  (the watches were opened again {len(watch.errors)} times: {watch.errors[:3]})")
        if args.plans:
            chosen = plans(login, args.runs, args.plans)
            for key, what in (("own", "the queue's own job A ends"), ("tenant", "another tenant's pod goes")):
                for plan in ("hold", "drain"):
                    got = chosen[f"{plan}_{key}"]
                    print(f"plan {plan:5}: {what} -> waiting job B RUNNING: p50 {statistics.median(got):.2f} s "
                          f"({' '.join(f'{s:.2f}' for s in got)})")
            out["plans"] = chosen
        race = competing(login)
        print(f"two 2-node jobs on a quota for one: {race['states']}, pods of a job running while another was "
              f"gated: {race['partial_pods_running']} (must be 0)")
        out.update({"p1": p1, "overhead_p50": overhead, "overhead_floor": OVERHEAD_FLOOR, "freed": freed,
                    "freed_steps": freed_steps, "freed_p50": statistics.median(freed), "freed_floor": FREED_FLOOR,
                    "ended": ended, "competing": race})
    finally:
        if not args.keep:
            deploy.down(NAME, work)
            for kind, name in (("clusterqueue", CQ), ("resourceflavor", FLAVOR)):
                kubectl("delete", kind, name, "--ignore-not-found", "--wait=true", timeout=150, check=False)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    ok = (out.get("overhead_p50", 9) <= OVERHEAD_FLOOR and out.get("freed_p50", 9) <= FREED_FLOOR
          and out.get("competing", {}).get("partial_pods_running", 1) == 0
          and all(s.startswith("COMPLETED") for s in out.get("competing", {}).get("states", [""])))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
