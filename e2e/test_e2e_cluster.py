"""The product, end to end on a real Kubernetes: up -> SSH -> sbatch -> worker pods -> COMPLETED ->
accounts and fair share -> pods gone, jobs still in sacct -> down -> up again with /home and the job
history kept. Tests run in file order and share one cluster."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time

import asyncssh
import pytest

import yaml

from faultkit import controller_log
from helpers import (NAMESPACE, NCCL_ENV, SUSPEND_TIME, Cluster, accounting_log, job_state, kjson, kubectl, sacct_jobs,
                     slurmk8s, submit, wait_for, wait_job, worker_pods)
from provisioner.accounting import parse_known_associations
from provisioner.names import A_DO_NOT_DISRUPT as DO_NOT_DISRUPT
from provisioner.names import A_SAFE_TO_EVICT as SAFE_TO_EVICT

pytestmark = pytest.mark.e2e

# job id -> what the test expects sacct to say about it, across worker pods and `down`/`up`
JOBS: dict[str, dict[str, str]] = {}

ALLREDUCE_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size; long mine, sum = 0; char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    mine = (long)(rank + 1) * 1000 + 7;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %ld\n", rank, size, host, sum);
    MPI_Finalize();
    return 0;
}
"""


def test_up_from_nothing_and_login_answers(cluster: Cluster):
    login = cluster.login()
    result = login.run("id -un && squeue --version")
    assert result.stdout.splitlines()[0] == "alice"
    print(f"P5: slurmk8s up from nothing -> login answers SSH: {cluster.up_seconds:.1f} s")


def test_password_and_root_logins_refused(cluster: Cluster):
    login = cluster.login()

    async def try_password(user: str) -> bool:
        try:
            async with asyncssh.connect(login.host, username=user, password="alice", client_keys=None,
                                        known_hosts=None, connect_timeout=10, preferred_auth="password,keyboard-interactive"):
                return True
        except asyncssh.PermissionDenied:
            return False

    assert asyncio.run(try_password("alice")) is False
    assert asyncio.run(try_password("root")) is False
    with pytest.raises(asyncssh.PermissionDenied):
        cluster.login(user="root").run("true")


def test_two_node_job_from_zero_workers(cluster: Cluster):
    assert worker_pods() == {}, "worker pods exist before any job"
    login = cluster.login()
    t0 = time.monotonic()
    job = submit(login, "#!/bin/bash\n#SBATCH -N2 -o hosts-%j.out\nsrun hostname")

    def allocated():
        state = job_state(login, job)
        return state if state["nodes"] and set(state["job_state"]) & {"RUNNING", "CONFIGURING", "COMPLETED"} else None

    alloc = wait_for(f"job {job} to get nodes", allocated, 60)
    nodes = sorted(login.run(f"scontrol show hostnames {alloc['nodes']}").stdout.split())
    assert len(nodes) == 2
    pods = wait_for("worker pods", lambda: worker_pods() if len(worker_pods()) >= 2 else None, 60)
    assert sorted(pods) == nodes, "worker pods must be exactly the nodes Slurm chose"
    final = wait_job(login, job, 180)
    print(f"2-node job from zero workers: submit -> COMPLETED {time.monotonic() - t0:.1f} s")
    assert final["job_state"] == ["COMPLETED"], final["job_state"]
    JOBS[job] = {"user": "alice", "state": "COMPLETED", "nodes": alloc["nodes"]}
    output = login.run(f"cat ~/hosts-{job}.out").stdout.split()
    assert sorted(output) == nodes
    # PrologSlurmctld's head start (elastic/early.py): the loop created the pods before Slurm's
    # resume call, holding each at the boot gate (elastic/bootgate.py) until that call released it.
    # (When Slurm's power-save pass came before the prolog read the nodes, there is no head start.)
    elastic = controller_log("elastic.log")
    head = re.search(rf"early resume for job {job}: (\S+)", elastic)
    gate_lines = [line for line in elastic.splitlines() if "boot gate" in line or "resumed by Slurm already" in line]
    print(f"head start for job {job}: {head.group(1) if head else 'none'}; " + " | ".join(gate_lines[-4:]))
    if head:
        for node in nodes:
            assert re.search(rf"boot gate: released .*\b{node} \(held", elastic) or re.search(
                rf"resumed by Slurm already: .*\b{node}\b", elastic), f"{node} held and never released"
    # every worker's entrypoint asked the gate before it started slurmd, and was answered: a worker
    # made early waited there for Slurm's resume call (its slurmd's boot time is then not older than
    # Slurm's boot request, or Slurm would have waited out ResumeTimeout and the job would not have run)
    for node in nodes:
        said = kubectl("logs", "-n", NAMESPACE, node, "-c", "slurmd", check=False).stdout
        asked = re.search(r"boot gate \S+:9412: (\S+) after (\d+\.\d+)s", said)
        assert asked and asked.group(1) == "open", f"{node}: no open answer from the boot gate in its log:\n{said[-2000:]}"
        started = said.index("exec slurmd")
        assert said.index(asked.group(0)) < started, "the gate is asked before slurmd starts"
        print(f"{node}: boot gate open after {asked.group(2)} s")


def test_mpi_allreduce_across_two_worker_pods(cluster: Cluster):
    login = cluster.login()
    login.run(f"cat > allreduce.c <<'EOF'\n{ALLREDUCE_C}\nEOF\nmpicc -O2 -o allreduce allreduce.c")
    job = submit(login, "#!/bin/bash\n#SBATCH -N2 -n2 -o mpi-%j.out\nsrun --mpi=pmix ./allreduce")
    final = wait_job(login, job, 180)
    out = login.run(f"cat ~/mpi-{job}.out").stdout
    assert final["job_state"] == ["COMPLETED"], out
    lines = [l for l in out.splitlines() if l.startswith("rank ")]
    assert len(lines) == 2, out
    assert all(l.endswith("sum 3014") for l in lines), out  # (1*1000+7) + (2*1000+7)
    assert len({l.split()[5] for l in lines}) == 2, "the two ranks must run on two worker pods"


def test_every_job_step_gets_its_pools_nccl_env(cluster: Cluster):
    """pools[].network.nccl_env reaches the batch step and each task of an srun step on every node
    (Slurm's TaskProlog exports it), over what the submitter's environment had."""
    login = cluster.login()
    # NCCL_DEBUG set in the submitting shell (sbatch --export=ALL,NAME=value would make slurmd load the
    # user's login environment, which kills slurmd in an unprivileged pod: "fatal: clone: Operation
    # not permitted")
    script = "#!/bin/bash\n#SBATCH -p cpu -N2 -n2 -o env-%j.out\nenv | sed 's/^/batch: /'\nsrun -l env"
    job = login.run(f"cat > env-job.sh <<'EOF'\n{script}\nEOF\n"
                    "NCCL_DEBUG=INFO sbatch --parsable env-job.sh").stdout.strip()
    assert job.isdigit(), f"sbatch printed {job!r}"
    final = wait_job(login, job, 180)
    out = login.run(f"cat ~/env-{job}.out").stdout
    assert final["job_state"] == ["COMPLETED"], out
    tasks: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        who, sep, var = line.partition(": ")
        who = who.strip()
        if sep and "=" in var and (who == "batch" or who.isdigit()):
            name, _, value = var.partition("=")
            tasks.setdefault(who, {})[name] = value
    assert set(tasks) == {"batch", "0", "1"}, sorted(tasks)
    for who, env in tasks.items():
        assert {k: env.get(k) for k in NCCL_ENV} == NCCL_ENV, (who, {k: v for k, v in env.items() if "NCCL" in k})
    assert tasks["0"]["SLURMD_NODENAME"] != tasks["1"]["SLURMD_NODENAME"], "the two tasks must run on two pods"


def test_venv_made_on_the_login_pod_runs_in_a_job(cluster: Cluster):
    """The login and worker images share one Python: a venv made in /home on the login pod runs
    unchanged in a job, and its interpreter is the very same build."""
    login = cluster.login()
    probe = "import sys; print(sys.prefix); print(sys.version)"
    made = login.run(f"rm -rf ~/e2e-venv && python3 -m venv ~/e2e-venv && ~/e2e-venv/bin/python -c '{probe}' "
                     "&& ~/e2e-venv/bin/pip --version").stdout
    job = submit(login, f"#!/bin/bash\n#SBATCH -p cpu -N1 -o venv-%j.out\n~/e2e-venv/bin/python -c '{probe}' "
                        "&& srun ~/e2e-venv/bin/pip --version")
    final = wait_job(login, job, 180)
    out = login.run(f"cat ~/venv-{job}.out").stdout
    assert final["job_state"] == ["COMPLETED"], out
    assert out == made, f"login:\n{made}\njob:\n{out}"
    assert out.splitlines()[0] == "/home/alice/e2e-venv"


def test_jobs_are_charged_to_each_users_account_with_fair_share(cluster: Cluster):
    wait_for("the spec's accounts and users in the database",
             lambda: "database matches the spec" in accounting_log(), 120, interval=2)
    # slurmdbd sends the associations on to slurmctld a moment later; a job submitted before
    # slurmctld has bob's runs charged to no account (seen once in CI: account "")
    wait_for("slurmctld to know bob's association", lambda: _slurmctld_knows("bob", "teaching"), 60, interval=1)
    bob = cluster.login(user="bob")
    job = submit(bob, "#!/bin/bash\n#SBATCH -N1 -o bob-%j.out\nhostname")
    final = wait_job(bob, job, 120)
    assert final["job_state"] == ["COMPLETED"]
    assert final["account"] == "teaching", final["account"]
    JOBS[job] = {"user": "bob", "account": "teaching", "state": "COMPLETED", "nodes": final["nodes"]}
    login = cluster.login()
    alice_job = submit(login, "#!/bin/bash\n#SBATCH -N1 -o alice-%j.out\nhostname")
    assert wait_job(login, alice_job, 120)["account"] == "research"
    JOBS[alice_job] = {"user": "alice", "account": "research", "state": "COMPLETED"}
    # fair share: the accounts' shares as the spec gives them, users under them
    rows = [line.split("|") for line in login.run("sshare -a -n -P -o Account,User,RawShares").stdout.splitlines()]
    shares = {(a.strip(), u): s for a, u, s in rows}
    assert shares[("research", "")] == "10" and shares[("teaching", "")] == "2", rows
    assert ("research", "alice") in shares and ("teaching", "bob") in shares, rows
    assert "priority/multifactor" in login.run("scontrol show config | grep ^PriorityType").stdout


def test_busy_node_is_never_removed_while_its_job_runs(cluster: Cluster):
    login = cluster.login()
    hold = SUSPEND_TIME + 15
    job = submit(login, f"#!/bin/bash\n#SBATCH -N1 -o busy-%j.out\nhostname; sleep {hold}; echo done")
    running = wait_for("job running", lambda: (s := job_state(login, job)) and "RUNNING" in s["job_state"] and s, 120)
    node = running["nodes"]
    uid = worker_pods()[node]["metadata"]["uid"]
    t0 = time.monotonic()
    deadline = t0 + hold - 3
    marked = None  # when the autoscalers' annotations appeared on the busy worker (issue 42)
    while time.monotonic() < deadline:
        pod = worker_pods().get(node)
        assert pod is not None and pod["metadata"]["uid"] == uid, f"pod of busy node {node} was removed"
        ann = pod["metadata"].get("annotations") or {}
        if marked is None and ann.get(DO_NOT_DISRUPT) == "true" and ann.get(SAFE_TO_EVICT) == "false":
            marked = time.monotonic() - t0
        time.sleep(1)
    assert marked is not None, f"busy worker {node} never carried {DO_NOT_DISRUPT} and {SAFE_TO_EVICT}"
    final = wait_job(login, job, 60)
    assert final["job_state"] == ["COMPLETED"]
    assert login.run(f"tail -n1 ~/busy-{job}.out").stdout.strip() == "done"
    ended = time.monotonic()
    # idle again: the annotations go (removed, not "false": Karpenter reads presence) before the suspend
    wait_for(f"idle worker {node} without the autoscalers' annotations", lambda: (p := worker_pods().get(node)) is None
             or not {DO_NOT_DISRUPT, SAFE_TO_EVICT} & set(p["metadata"].get("annotations") or {}), SUSPEND_TIME)
    print(f"busy annotations on {node} {marked:.1f} s after RUNNING was seen; gone {time.monotonic() - ended:.1f} s "
          "after the job ended")
    assert node in worker_pods(), f"the pod of {node} was suspended before its annotations were removed"


def test_a_job_for_a_node_powering_down_starts_once_its_pod_is_gone(cluster: Cluster):
    """Slurm keeps a suspended node POWERING_DOWN for SuspendTimeout (15 s here), and nothing
    schedules when that ends: a job for the node waited that out and then for the next backfill
    pass (45 s in the P3 bench). The suspend program ends the power-down once the pod is gone."""
    login = cluster.login()
    first = submit(login, "#!/bin/bash\n#SBATCH -N1 -o /dev/null\nhostname")
    node = wait_job(login, first, 120)["nodes"]
    seen = len(controller_log("elastic.log"))  # before the suspend, SuspendTime from now
    wait_for(f"{node}'s pod to be deleted (suspend after {SUSPEND_TIME} s idle)", lambda: node not in worker_pods(),
             SUSPEND_TIME + 60, interval=0.2)
    t0 = time.monotonic()
    second = submit(login, f"#!/bin/bash\n#SBATCH -N1 -w {node} -o /dev/null\nhostname")
    final = wait_job(login, second, 90)
    took = time.monotonic() - t0
    elastic = controller_log("elastic.log")[seen:]  # what the programs wrote since the first job ended
    ended = re.findall(rf"power-down of (?:\S+,)?{re.escape(node)}(?:,\S+)? ended (\d+\.\d+)s after", elastic)
    print(f"job {second} for {node}, submitted as its pod was deleted: COMPLETED after {took:.1f} s; "
          f"power-down ended {ended[-1] if ended else '(not by slurmk8s)'} s after the deletion")
    assert final["job_state"] == ["COMPLETED"], final["job_state"]
    assert ended, f"no 'power-down of {node} ended' in elastic.log:\n{elastic[-3000:]}"
    assert took < 12, f"job {second} took {took:.1f} s: it waited for SuspendTimeout or a scheduling pass"


def test_idle_workers_are_suspended_to_zero_pods(cluster: Cluster):
    login = cluster.login()
    wait_for("every worker pod to be gone", lambda: worker_pods() == {}, SUSPEND_TIME + 90, interval=2)
    states = login.run("sinfo -h -N -o '%N %T'").stdout.split("\n")

    def powered_down():
        rows = [l.split() for l in login.run("sinfo -h -N -o '%N %T'").stdout.splitlines() if l.strip()]
        return rows if rows and all(state.endswith("~") for _, state in rows) else None

    assert wait_for("sinfo to show every node powered down", powered_down, 60), states


def test_sacct_lists_jobs_whose_worker_pods_are_gone(cluster: Cluster):
    assert worker_pods() == {}
    login = cluster.login()
    jobs = wait_for("every job in sacct", lambda: (j := sacct_jobs(login)) and set(JOBS) <= set(j) and j, 60)
    for job, want in JOBS.items():
        for key, value in want.items():
            assert jobs[job][key] == value, (job, jobs[job])
    two_nodes = next(j for j, w in JOBS.items() if w["user"] == "alice" and "nodes" in w)
    print(f"sacct after the worker pods are gone: {len(jobs)} jobs, e.g. {two_nodes}: {jobs[two_nodes]}")
    # the same through the tools a workflow manager calls (sacct --json, one job)
    record = login.json(f"sacct -j {two_nodes} --json")["jobs"][0]
    assert record["state"]["current"] == ["COMPLETED"] and record["user"] == "alice"


def test_bad_database_or_storage_fails_before_anything_is_applied(cluster: Cluster, tmp_path):
    """A wrong database password and a storage class that does not exist: `up` / `preview` stop with the
    field and the fix, and the running cluster is left exactly as it was."""
    def versions() -> dict[str, str]:
        objs = kjson("get", "deployments,statefulsets,secrets,configmaps", "-n", NAMESPACE)["items"]
        # workloads: their generation (spec changes only; status updates do not count)
        return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"].get("generation") or o["metadata"]["resourceVersion"]
                for o in objs}

    kubectl("create", "secret", "generic", "wrong-db-password", "-n", NAMESPACE,
            "--from-literal=password=NotThePassword1")
    before = versions()
    spec = yaml.safe_load(cluster.spec_path.read_text())
    spec["accounting"]["external_database"] = {"host": "mariadb", "user": "slurm", "database": "slurm_acct_db",
                                               "password_secret": {"name": "wrong-db-password"}}
    bad_db = tmp_path / "bad-db.yaml"
    bad_db.write_text(yaml.safe_dump(spec))
    t0 = time.monotonic()
    proc = slurmk8s("up", "--spec", str(bad_db), "--state", str(cluster.state), log=cluster.log)
    said = cluster.log.read_text().rsplit("$ slurmk8s up", 1)[-1]
    print(f"wrong database password refused by `up` in {time.monotonic() - t0:.1f} s")
    assert proc.returncode != 0, said[-3000:]
    assert "the external accounting database is not usable (nothing was applied)" in said, said[-3000:]
    assert "accounting.external_database: slurm@mariadb:3306/slurm_acct_db:" in said, said[-3000:]
    assert "Access denied" in said and "Fix: check the user and the password" in said, said[-3000:]

    spec = yaml.safe_load(cluster.spec_path.read_text())
    spec["storage"]["database"]["storage_class"] = "no-such-class"
    bad_sc = tmp_path / "bad-sc.yaml"
    bad_sc.write_text(yaml.safe_dump(spec))
    proc = slurmk8s("preview", "--spec", str(bad_sc), "--state", str(cluster.state), log=cluster.log)
    said = cluster.log.read_text().rsplit("$ slurmk8s preview", 1)[-1]
    assert proc.returncode != 0
    assert "storage.database.storage_class: StorageClass 'no-such-class' does not exist in the cluster" in said, said
    kubectl("delete", "secret", "wrong-db-password", "-n", NAMESPACE)
    after = versions()
    del before["Secret/wrong-db-password"]
    assert after == before, "a refused `up` must not change the cluster"
    assert not [p for p in kjson("get", "pods", "-n", NAMESPACE)["items"]
                if p["metadata"]["name"].startswith("slurmk8s-db-check")], "the check pod must be gone"


def test_down_leaves_only_the_volumes(cluster: Cluster):
    proc = slurmk8s("down", "--spec", str(cluster.spec_path), "--state", str(cluster.state), log=cluster.log)
    assert proc.returncode == 0, cluster.log.read_text()[-4000:]
    for kind in ("pods", "services", "secrets", "roles", "rolebindings", "configmaps", "statefulsets",
                 "deployments", "serviceaccounts", "networkpolicies", "poddisruptionbudgets"):
        items = [i["metadata"]["name"] for i in kjson("get", kind, "-n", NAMESPACE)["items"]
                 if not (kind == "configmaps" and i["metadata"]["name"] == "kube-root-ca.crt")
                 and not (kind == "serviceaccounts" and i["metadata"]["name"] == "default")]
        assert items == [], f"`down` left {kind}: {items}"
    pvcs = sorted(i["metadata"]["name"] for i in kjson("get", "pvc", "-n", NAMESPACE)["items"])
    assert pvcs == ["accounting-db", "home", "slurmctld-state"], f"`down` must keep the volumes: {pvcs}"
    said = cluster.log.read_text().rsplit("$ slurmk8s down", 1)[-1]
    assert "kept namespace slurm-local and 3 volume(s): home (/home, " in said, said[-2000:]
    assert "accounting-db (accounting database, " in said and "down --purge" in said, said[-2000:]


def test_second_up_finds_home_and_job_history_again(cluster: Cluster):
    # the second `up` also drops bob from the spec: his association goes, his jobs stay in the history
    original = cluster.spec_path.read_text()
    spec = yaml.safe_load(original)
    spec["users"] = [u for u in spec["users"] if u["name"] != "bob"]
    cluster.spec_path.write_text(yaml.safe_dump(spec))
    try:
        proc = slurmk8s("up", "--spec", str(cluster.spec_path), "--state", str(cluster.state), log=cluster.log)
        assert proc.returncode == 0, cluster.log.read_text()[-4000:]
        login = cluster.login()
        outputs = login.run("ls ~").stdout.split()
        assert any(name.startswith("hosts-") for name in outputs), outputs
        kubectl("get", "pvc", "-n", NAMESPACE, "home")
        jobs = wait_for("the job records from before `down`",
                        lambda: (j := sacct_jobs(login)) and set(JOBS) <= set(j) and j, 90, interval=2)
        for job, want in JOBS.items():
            # bob is no longer a user of the login pod: sacct may show his uid where his name was
            expected = {**want, "user": jobs[job]["user"]} if want["user"] == "bob" else want
            assert jobs[job] == {**jobs[job], **expected}, (job, jobs[job], want)
            assert jobs[job]["user"] in (want["user"], "2002")
        wait_for("bob's association to be removed",
                 lambda: login.run("sacctmgr -n -P show assoc user=bob format=Account,User").stdout.strip() == "", 90,
                 interval=2)
        # (sacct -u bob / -u 2002 refuses a user the login pod no longer knows: the full listing has them)
        bob_jobs = [j for j, w in JOBS.items() if w["user"] == "bob"]
        history = sacct_jobs(login)
        assert bob_jobs and all(history[j]["account"] == "teaching" for j in bob_jobs), "bob's jobs stay in the history"
        assert login.run("sacctmgr -n -P show assoc user=alice format=Account").stdout.split() == ["research"]
        # idempotent: the database kept everything, so the only change applied is bob's removal
        # the loop logs what it applied once its pass is done, after the removal seen above
        log = wait_for("the accounting loop to log what it applied", accounting_log, 60, interval=2,
                       until=lambda log: " applied " in log)
        applied = [line for line in log.splitlines() if " applied " in line]
        assert applied and all("user-removed-from-spec" in line for line in applied), applied
    finally:
        # restore the e2e spec for the tests that follow, also when a check above failed (bob is the
        # second user of the security tests: a failure here must not fail them too)
        restored = _restore_spec(cluster, original)
    assert restored == "", restored
    wait_for("bob to log in again", lambda: _logs_in(cluster, "bob"), 120, interval=2)


def _restore_spec(cluster: Cluster, original: str) -> str:
    """`up` with the e2e spec again: '' when it worked, else what went wrong (never raises, so a
    failure of the test it cleans up after stays the one reported)."""
    cluster.spec_path.write_text(original)
    try:
        proc = slurmk8s("up", "--spec", str(cluster.spec_path), "--state", str(cluster.state), log=cluster.log)
    except (OSError, subprocess.SubprocessError) as err:
        return f"restoring the e2e spec: {err!r}"
    return "" if proc.returncode == 0 else f"restoring the e2e spec: exit {proc.returncode}\n" + \
        cluster.log.read_text()[-4000:]


def _slurmctld_knows(user: str, account: str) -> bool:
    """slurmctld's association manager has `user`'s association in `account`, with the user's uid
    resolved (what a job is charged by), read as the accounting loop reads it."""
    shown = kubectl("exec", "-n", NAMESPACE, "slurmctld-0", "-c", "slurmctld", "--", "scontrol", "show", "assoc_mgr",
                    f"users={user}", "flags=assoc", check=False).stdout
    return (user, account) in parse_known_associations(shown)


def _logs_in(cluster: Cluster, user: str) -> bool:
    try:
        return cluster.login(user=user).run("id -un", check=False).stdout.strip() == user
    except (OSError, asyncssh.Error):
        return False
