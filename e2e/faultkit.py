"""What the fault tests share: the queue and the nodes as Slurm reports them, the worker pods of one
pool, the programs' logs in the slurmctld pod, and waiting for a pool to settle back to zero pods."""

from __future__ import annotations

import re
import time
from typing import Any, Iterable

from helpers import FINAL, NAMESPACE, SUSPEND_TIME, kjson, kubectl, wait_for, worker_pods

CONTROLLER_POD = "slurmctld-0"


def queue(login, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """job id -> `squeue --json --states=all` entry, for the given jobs (array tasks by their own id)."""
    wanted = set(job_ids)
    jobs = login.json("squeue --json --states=all")["jobs"]
    return {str(j["job_id"]): j for j in jobs if str(j["job_id"]) in wanted}


def states(login, job_ids: Iterable[str]) -> dict[str, str]:
    return {k: "+".join(v["job_state"]) for k, v in queue(login, job_ids).items()}


def submit_many(login, count: int, sbatch_args: str) -> list[str]:
    """`count` separate sbatch calls in one SSH session; their job ids."""
    out = login.run(f"for i in $(seq {count}); do sbatch --parsable {sbatch_args} || exit 1; done", timeout=300).stdout
    ids = out.split()
    assert len(ids) == count and all(re.fullmatch(r"\d+", i) for i in ids), out
    return ids


def wait_final(login, job_ids: Iterable[str], timeout: float) -> dict[str, dict[str, Any]]:
    ids = list(job_ids)

    def done():
        q = queue(login, ids)
        return q if len(q) == len(ids) and all(set(j["job_state"]) & FINAL for j in q.values()) else None

    return wait_for(f"{len(ids)} jobs to reach a final state", done, timeout, interval=2)


def nodes(login, pool: str) -> dict[str, dict[str, Any]]:
    """Slurm node name -> `scontrol show nodes --json` entry, for the nodes of one pool (partition)."""
    return {n["name"]: n for n in login.json("scontrol show nodes --json")["nodes"] if pool in (n.get("partitions") or ())}


def pool_pods(pool: str, include_terminating: bool = False) -> dict[str, dict[str, Any]]:
    if include_terminating:
        pods = kjson("get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component=worker,slurmk8s.io/pool={pool}")
        return {p["metadata"]["name"]: p for p in pods["items"]}
    return {name: p for name, p in worker_pods().items() if p["metadata"]["labels"].get("slurmk8s.io/pool") == pool}


def wait_pool_at_rest(login, pool: str, timeout: float = SUSPEND_TIME + 120) -> dict[str, dict[str, Any]]:
    """Every node of the pool powered down and idle (none DOWN), and no pod of the pool left."""

    def at_rest():
        if pool_pods(pool, include_terminating=True):
            return None
        ns = nodes(login, pool)
        ok = ns and all("POWERED_DOWN" in n["state"] and "IDLE" in n["state"] and "DOWN" not in n["state"]
                        and not {"POWERING_UP", "POWERING_DOWN"} & set(n["state"]) for n in ns.values())
        return ns if ok else None

    try:
        return wait_for(f"pool {pool} back at rest (zero pods, every node idle and powered down)", at_rest, timeout,
                        interval=2)
    except BaseException:
        print(f"pool {pool} not at rest: nodes {_node_summary(nodes(login, pool))}, pods {sorted(pool_pods(pool, True))}")
        raise


def _node_summary(ns: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {k: "+".join(v["state"]) + (f" ({v['reason']})" if v.get("reason") else "") for k, v in ns.items()}


def slurmctld_log() -> str:
    """slurmctld's own log (its container's output)."""
    return kubectl("logs", "-n", NAMESPACE, CONTROLLER_POD, "-c", "slurmctld", check=False).stdout


def unresolved_names(log: str) -> list[str]:
    """Every name slurmctld failed to resolve, in the order logged. Each one cost it 10 s of lookups
    under the lock every address lookup takes (Debian's Slurm retries them), so none may appear."""
    return re.findall(r'Unable to resolve "([^"]+)"', log)


def slurm_down_reasons(node: str, log: str | None = None) -> list[str]:
    """Every reason slurmctld logged when it set `node` DOWN, oldest first (`update_node: node X reason
    set to: R`, then `... state set to DOWN`), from `log` or a fresh read of slurmctld's log. Durable,
    unlike the node's state: Slurm marks a node the loop set DOWN IDLE as soon as the suspend program
    runs (idle_on_node_suspend), about a second later, too short a window to poll for over SSH."""
    reasons, pending = [], None
    for line in (slurmctld_log() if log is None else log).splitlines():
        if m := re.search(rf"update_node: node {re.escape(node)} reason set to: (.*)$", line):
            pending = m.group(1)
        elif pending is not None and re.search(rf"update_node: node {re.escape(node)} state set to DOWN$", line):
            reasons.append(pending)
            pending = None
    return reasons


def new_down_reason(node: str, contains: str, seen_before: int, log: str | None = None) -> str | None:
    """The first DOWN reason of `node` logged after the first `seen_before` ones that contains `contains`."""
    return next((r for r in slurm_down_reasons(node, log)[seen_before:] if contains in r), None)


def controller_log(name: str) -> str:
    """A slurmk8s log of the running slurmctld pod (elastic.log, reconcile.log), '' if unreadable."""
    proc = kubectl("exec", "-n", NAMESPACE, CONTROLLER_POD, "-c", "slurmctld", "--", "cat",
                   f"/var/log/slurmk8s/{name}", check=False)
    return proc.stdout


def controller_pod() -> dict[str, Any]:
    return kjson("get", "pod", "-n", NAMESPACE, CONTROLLER_POD)


def controller_ready(previous_uid: str | None = None, restarts_above: int | None = None) -> dict[str, Any] | None:
    """The slurmctld pod when it is Ready (and, if asked, a new one / one whose slurmctld container restarted)."""
    proc = kubectl("get", "pod", "-n", NAMESPACE, CONTROLLER_POD, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    import json

    pod = json.loads(proc.stdout)
    if pod["metadata"].get("deletionTimestamp") or (previous_uid and pod["metadata"]["uid"] == previous_uid):
        return None
    statuses = {c["name"]: c for c in pod["status"].get("containerStatuses") or []}
    ctld = statuses.get("slurmctld")
    if not ctld or not ctld.get("ready"):
        return None
    if restarts_above is not None and ctld.get("restartCount", 0) <= restarts_above:
        return None
    return pod


def slurm_answers(login) -> bool:
    return login.run("squeue -h -o %i | wc -l", check=False, timeout=30).exit_status == 0


def accounting(login) -> bool:
    """Whether the cluster stores accounting (slurmdbd), so that sacct can be asserted on."""
    conf = login.run("scontrol show config", check=False).stdout
    return bool(re.search(r"^AccountingStorageType\s*=\s*accounting_storage/slurmdbd", conf, re.M))


def sacct_states(login, job_ids: Iterable[str]) -> dict[str, str]:
    ids = ",".join(job_ids)
    out = login.run(f"sacct -X -n -P -o JobID,State -j {ids}").stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def since(log: str, t0: float) -> list[str]:
    """Log lines stamped at or after t0 (the programs' ISO-8601 UTC stamps)."""
    cutoff = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0))
    return [line for line in log.splitlines() if line[:19] >= cutoff]
