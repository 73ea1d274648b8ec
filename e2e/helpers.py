"""End-to-end helpers: kubectl, the slurmk8s CLI and SSH to the login pod, as a researcher uses it.

The suite deploys examples/local.yaml, changed only where a test needs it (the test's own SSH key,
a short SuspendTime, three small slot nodes so a 2-node job fits the single local node), then
drives it as a researcher would: SSH to the login pod, plain sbatch/squeue/sinfo.
On a failure, the pod logs of the cluster's namespace are attached to the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import asyncssh
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))  # waiting.py, shared with the integration tier

import waiting  # noqa: E402
LOCAL_KUBECONFIG = "/var/lib/slurmk8s/localk8s/kubeconfig"
LOCAL_VOLUMES = "/var/lib/slurmk8s/volumes/local"  # examples/localk8s/storage.yaml's hostPath volumes
TOOLCHAIN_BIN = "/var/cache/slurmk8s/toolchain/bin"
SLURMK8S = str(Path(sys.executable).with_name("slurmk8s"))
NAMESPACE = "slurm-local"  # examples/local.yaml's cluster "local"; its static volumes name it
SUSPEND_TIME = 20
HEALTH_INTERVAL = 15
# (user, token) of every REST token e2e/test_e2e_rest.py was given; the secret scan looks for them
ISSUED_TOKENS: list[tuple[str, str]] = []
MISSING_IMAGE = "slurmk8s/missing:none"  # never built: ErrImageNeverPull under pull_policy Never
# the cpu pool's network.nccl_env: NCCL settings only (inert without NCCL; UCX_* would steer MPI),
# values with '=', ',' and '^' as NCCL's own syntax has them
NCCL_ENV = {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "^lo,docker0"}


def kubeconfig() -> str:
    return os.environ.get("KUBECONFIG") or LOCAL_KUBECONFIG


def kubectl_exe() -> str:
    built = Path(TOOLCHAIN_BIN) / "kubectl"
    return str(built) if built.exists() else (shutil.which("kubectl") or "kubectl")


def kubectl(*args: str, check: bool = True, timeout: float = 60,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), *args], capture_output=True, text=True,
                          check=check, timeout=timeout, input=input)


def server_version(default: str = "?") -> str:
    """The API server's version (its gitVersion), or `default` when it does not answer: for the
    benches' JSON and the table's machine line."""
    try:
        got = kubectl("version", "-o", "json", "--request-timeout=10s", check=False, timeout=30)
        return json.loads(got.stdout or "{}").get("serverVersion", {}).get("gitVersion", default) or default
    except (OSError, subprocess.TimeoutExpired, ValueError):  # no kubectl, no answer, not JSON
        return default


def kjson(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


# ---------------------------------------------------------------- clusters a run made, and only those

MADE_BY = "slurmk8s.io/made-by"  # label a test or benchmark run puts on the namespace it deployed


class NotOurs(Exception):
    """The namespace a run would deploy into holds something this kind of run did not make."""


def can_i(account: str, verb: str, resource: str, namespace: str | None, name: str = "") -> bool:
    """`kubectl auth can-i` as the ServiceAccount `account` ("NAMESPACE:NAME"); resource may be
    'pods/exec' (a subresource); namespace None: across all namespaces; name: that object alone."""
    resource, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, f"{resource}/{name}" if name else resource, f"--as=system:serviceaccount:{account}"]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def namespace_doc(ns: str) -> dict[str, Any] | None:
    got = kubectl("get", "namespace", ns, "-o", "json", check=False)
    if got.returncode != 0:
        if "NotFound" in got.stderr or "not found" in got.stderr:
            return None
        raise NotOurs(f"cannot read namespace {ns}: {got.stderr.strip()}")
    return json.loads(got.stdout)


def refuse_foreign(ns: str, made_by: str) -> bool:
    """Raise NotOurs when namespace `ns` exists without the label MADE_BY=`made_by` (a cluster someone
    else made: a quickstart, an engineer's, another harness's), so a run never touches it. Returns
    whether a namespace of this harness is there (left by an earlier run)."""
    doc = namespace_doc(ns)
    if doc is None:
        return False
    meta = doc["metadata"]
    if (meta.get("labels") or {}).get(MADE_BY) == made_by:
        return True
    owner = (meta.get("annotations") or {}).get("slurmk8s.io/owner-description") or "no owner record"
    raise NotOurs(f"namespace {ns} exists and was not made by a {made_by} run (label {MADE_BY}={made_by} missing; "
                  f"owner: {owner}); this run does not touch it. Fix: remove it where it was made "
                  f"(`slurmk8s down --purge` with its state directory), or point KUBECONFIG at another cluster")


def clear_leftover(ns: str, made_by: str) -> None:
    """Before deploying into `ns` from nothing: a namespace an earlier `made_by` run left goes; any
    other is refused (NotOurs), never deleted."""
    if refuse_foreign(ns, made_by):
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=200)


def mark_made_by(ns: str, made_by: str) -> None:
    """After a run's `slurmk8s up` (even a failed one: the namespace, if any, is this run's)."""
    if namespace_doc(ns) is not None:
        kubectl("label", "namespace", ns, f"{MADE_BY}={made_by}", "--overwrite")


def apply_storage_class() -> None:
    """The local cluster's StorageClass slurmk8s-local (examples/localk8s/storage.yaml: no provisioner,
    the volumes are made by hand); idempotent, so a bench on a fresh cluster needs no e2e run first."""
    kubectl("apply", "-f", str(ROOT / "examples" / "localk8s" / "storage.yaml"))


def apply_static_volumes(name: str, ns: str, manifest: Path) -> None:
    """The StorageClass and :func:`static_volumes` for the cluster `name` in `ns` (written to
    `manifest`, then applied)."""
    apply_storage_class()
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": static_volumes(name, ns)}))
    kubectl("apply", "-f", str(manifest))


def static_volumes(name: str, ns: str) -> list[dict[str, Any]]:
    """hostPath PersistentVolumes (class slurmk8s-local, /var/lib/slurmk8s/volumes/<name>) bound to the
    three claims of the cluster in `ns`: the local cluster has no dynamic provisioner. Labelled
    slurmk8s.io/e2e=<name> (delete them with `kubectl delete pv -l slurmk8s.io/e2e=<name>`)."""
    out = []
    for claim, mode in (("home", "ReadWriteMany"), ("slurmctld-state", "ReadWriteOnce"),
                        ("accounting-db", "ReadWriteOnce")):
        out.append({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"slurmk8s-local-{name}-{claim}", "labels": {"slurmk8s.io/volume": claim,
                                                                             "slurmk8s.io/e2e": name}},
            "spec": {"storageClassName": "slurmk8s-local", "capacity": {"storage": "1Gi"}, "accessModes": [mode],
                     "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": ns, "name": claim},
                     "hostPath": {"path": f"/var/lib/slurmk8s/volumes/{name}/{claim}", "type": "DirectoryOrCreate"}},
        })
    return out


def slurmk8s(*args: str, log: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=kubeconfig(), PATH=f"{TOOLCHAIN_BIN}:{os.environ.get('PATH', '')}")
    with log.open("a") as fh:
        fh.write(f"\n$ slurmk8s {' '.join(args)}\n")
        fh.flush()
        proc = subprocess.run([SLURMK8S, *args], stdout=fh, stderr=subprocess.STDOUT, text=True, env=env,
                              timeout=timeout, check=False)
    return proc


def worker_pods() -> dict[str, dict[str, Any]]:
    pods = kjson("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=worker")["items"]
    return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def wait_for(what: str, probe, timeout: float, interval: float = 0.5, *, until=None, show=None):
    """tests/waiting.py's wait_for, failing the test on a timeout."""
    return waiting.wait_for(what, probe, timeout, interval, until=until, show=show, fail=pytest.fail)


@dataclass
class Login:
    host: str
    port: int
    user: str
    key: asyncssh.SSHKey

    def run(self, command: str, timeout: float = 120, check: bool = True,
            input: str | None = None) -> asyncssh.SSHCompletedProcess:
        """Run one command as the researcher would type it in their SSH session."""

        async def go() -> asyncssh.SSHCompletedProcess:
            async with asyncssh.connect(self.host, port=self.port, username=self.user, client_keys=[self.key],
                                        known_hosts=None, connect_timeout=15) as conn:
                return await conn.run(command, check=False, timeout=timeout, input=input)

        result = asyncio.run(go())
        if check and result.exit_status != 0:
            pytest.fail(f"`{command}` on the login pod exited {result.exit_status}:\n{result.stdout}\n{result.stderr}")
        return result

    def json(self, command: str) -> Any:
        return json.loads(self.run(command).stdout)

    def _connect(self):
        return asyncssh.connect(self.host, port=self.port, username=self.user, client_keys=[self.key],
                                known_hosts=None, connect_timeout=15)

    def put_file(self, path: str, text: str) -> None:
        """Write a text file as the researcher (through SFTP, as scp would)."""
        async def go() -> None:
            async with self._connect() as conn, conn.start_sftp_client() as sftp:
                async with sftp.open(path, "w") as fh:
                    await fh.write(text)

        asyncio.run(go())

    def put_files(self, local_paths: Sequence[Path], remote_dir: str) -> None:
        """Copy local files (binary: wheels, tarballs) into `remote_dir` as the researcher (SFTP)."""
        async def go() -> None:
            async with self._connect() as conn, conn.start_sftp_client() as sftp:
                await sftp.makedirs(remote_dir, exist_ok=True)
                await sftp.put([str(p) for p in local_paths], remote_dir)

        asyncio.run(go())

    def pty(self, command: str, dialogue: Sequence[tuple[str, str]] = (), timeout: float = 60) -> tuple[str, int | None]:
        """Run `command` in a pseudo-terminal, as `ssh -t` does: for each (regex, line) of `dialogue`,
        wait until the terminal shows `regex`, then type `line`. Returns all the terminal showed and
        the exit status; fails with what it showed when it ends early or times out."""
        async def go() -> tuple[str, int | None]:
            async with self._connect() as conn:
                async with conn.create_process(command, term_type="xterm", term_size=(200, 50)) as proc:
                    seen = ""
                    deadline = time.monotonic() + timeout

                    async def read_more() -> bool:
                        nonlocal seen
                        chunk = await asyncio.wait_for(proc.stdout.read(4096), max(0.1, deadline - time.monotonic()))
                        seen += chunk
                        return bool(chunk)

                    try:
                        for expect, line in dialogue:
                            start = len(seen)
                            while re.search(expect, seen[start:]) is None:
                                if not await read_more():
                                    pytest.fail(f"pty `{command}` ended before {expect!r}; it showed:\n{seen}")
                            proc.stdin.write(line + "\n")
                        while await read_more():
                            pass
                    except asyncio.TimeoutError:
                        pytest.fail(f"pty `{command}` timed out after {timeout:.0f}s; it showed:\n{seen}")
                    await asyncio.wait_for(proc.wait_closed(), 10)
                    return seen, proc.exit_status

        return asyncio.run(go())


@dataclass
class Cluster:
    spec_path: Path
    state: Path
    log: Path
    key: asyncssh.SSHKey
    up_seconds: float

    def login(self, user: str = "alice") -> Login:
        return login_in(NAMESPACE, user, self.key)


def login_in(namespace: str, user: str, key: asyncssh.SSHKey) -> Login:
    """An SSH session target on the login Service of the cluster in `namespace`."""
    svc = kjson("get", "service", "-n", namespace, "login")
    return Login(svc["spec"]["clusterIP"], 22, user, key)


REQUEUE_AUTH_INFO = "cred_expire=30"  # Slurm's minimum is 5 s; its default 120 s


def e2e_spec(public_key: str) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    spec["users"][0]["ssh_keys"] = [public_key]
    # a second researcher in another account (dropped from the spec before the second `up`)
    spec["users"].append({"name": "bob", "uid": 2002, "account": "teaching", "ssh_keys": [public_key]})
    spec["elasticity"] = {"suspend_time": SUSPEND_TIME, "resume_timeout": 120}
    # a requeued job may start again cred_expire + 1 s after its requeue (Slurm's default 120 s):
    # the node loss, deleted pod and failed resume tests wait 31 s for it instead
    spec.setdefault("slurm", {}).setdefault("extra_conf", {})["AuthInfo"] = REQUEUE_AUTH_INFO
    # health checks every 15 s (300 s by default), so a check made to fail drains within a test's patience
    spec["health"] = {"interval": HEALTH_INTERVAL}
    # the REST API with JWT auth (e2e/test_e2e_rest.py; the secret scan then covers the JWT key)
    spec["rest"] = {"enabled": True}
    small = {"mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m", "pod_memory_request": "128Mi"}
    spec["pools"] = [
        # a job environment (Slurm's TaskProlog exports it into every task: test_e2e_cluster.py)
        {"name": "cpu", **small, "domains": [{"name": "local", "count": 3}], "network": {"nccl_env": NCCL_ENV}},
        # fault tests only (no pods at rest): outages with 4 jobs running at once
        {"name": "ctl", **small, "domains": [{"name": "local", "count": 4}]},
        # resume that cannot be satisfied: an image that is not there (pull policy Never) ...
        {"name": "noimage", **small, "image": MISSING_IMAGE, "domains": [{"name": "local", "count": 3}]},
        # ... and a pod no Kubernetes node fits (64 CPUs requested, Guaranteed QoS)
        {"name": "huge", "mode": "slots", "cpus": 64, "memory": "1Gi", "domains": [{"name": "local", "count": 1}]},
    ]
    return spec


def side_spec(public_key: str, name: str) -> dict[str, Any]:
    """The e2e spec as a small side cluster `name` (its own namespace slurm-<name>): no REST API, no
    accounting (so no user accounts); the caller sets its pools and topology."""
    spec = e2e_spec(public_key)
    spec["name"] = name
    spec["rest"] = {"enabled": False}
    spec["accounting"] = {"enabled": False}
    for user in spec["users"]:
        user.pop("account", None)
    return spec


@contextlib.contextmanager
def side_cluster(name: str, make_spec: Callable[[str], dict[str, Any]], work: Path,
                 prepare: Callable[[str, Path, Path], None] | None = None) -> Iterator[Login]:
    """Deploy `make_spec(alice's public key)` as cluster `name` (namespace slurm-<name>, its own
    static volumes) with `slurmk8s up`, log alice in; `down --purge` and every trace removed afterwards.
    `prepare(namespace, spec path, state dir)` runs before the `up`, once any leftover is gone: what
    the platform makes before a cluster (a namespace with a Kueue LocalQueue); a namespace it makes
    must carry the label MADE_BY=e2e."""
    namespace, volumes = f"slurm-{name}", f"/var/lib/slurmk8s/volumes/{name}"
    key = asyncssh.generate_private_key("ssh-ed25519")
    spec_path = work / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(make_spec(key.export_public_key().decode().strip() + f" e2e-{name}")))
    state, log = work / "state", work / f"slurmk8s-{name}.log"
    clear_leftover(namespace, "e2e")
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={name}", "--ignore-not-found", "--wait=true", timeout=120)
    shutil.rmtree(volumes, ignore_errors=True)
    manifest = work / "volumes.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": static_volumes(name, namespace)}))
    apply_storage_class()  # the session cluster's fixture applies it too; a side module may run alone
    kubectl("apply", "-f", str(manifest))
    try:
        if prepare is not None:
            prepare(namespace, spec_path, state)
        try:
            proc = slurmk8s("up", "--spec", str(spec_path), "--state", str(state), log=log)
        finally:
            mark_made_by(namespace, "e2e")
        if proc.returncode != 0:
            pytest.fail(f"`slurmk8s up` of {name} failed (exit {proc.returncode}):\n{log.read_text()[-6000:]}")
        yield login_in(namespace, "alice", key)
    finally:
        if state.exists():
            slurmk8s("down", "--spec", str(spec_path), "--state", str(state), "--purge", "--yes", log=log)
        clear_leftover(namespace, "e2e")
        kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={name}", "--ignore-not-found", "--wait=true", timeout=120)
        shutil.rmtree(volumes, ignore_errors=True)


# ---------------------------------------------------------------- jobs, as the researcher sees them


# Slurm's job states that end a job: a wait for a job to finish or to start ends on any of them (a
# wait that knew only some would outwait a job that ended otherwise, and fail saying it never started)
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE"})


def job_state(login, job_id: str) -> dict:
    jobs = login.json(f"scontrol show job {job_id} --json")["jobs"]
    return jobs[0]


def programs_log(ns: str, lines: int) -> str:
    """The last `lines` of each slurmk8s program log in the slurmctld pod of `ns` (resume, suspend,
    reconcile), or why they could not be read."""
    tail = kubectl("exec", "-n", ns, "slurmctld-0", "-c", "slurmctld", "--", "sh", "-c",
                   f"tail -n {lines} /var/log/slurmk8s/*.log", check=False)
    return tail.stdout + tail.stderr


def _namespace_of(login) -> str | None:
    """The namespace whose login Service `login` connects to."""
    for svc in kjson("get", "services", "-A", "-l", "app.kubernetes.io/component=login")["items"]:
        if svc["spec"].get("clusterIP") == login.host:
            return svc["metadata"]["namespace"]
    return None


def job_story(login, job_id: str) -> str:
    """What a failed wait on job `job_id` needs said: the job and node states as Slurm shows them,
    slurmctld's lines about the job and power saving, and the resume/suspend programs' log tail."""
    parts = []
    try:
        ns = _namespace_of(login)
        if ns:
            parts.append(f"slurmk8s programs:\n{programs_log(ns, 25)}")
            log = kubectl("logs", "-n", ns, "slurmctld-0", "-c", "slurmctld", "--tail=3000", check=False).stdout
            mine = re.compile(rf"(?i:JobId={job_id}\b|power|resume|suspend|not responding|drain)|\bDOWN\b")
            parts.append("slurmctld about the job and power saving:\n"
                         + "\n".join([line for line in log.splitlines() if mine.search(line)][-40:]))
        # last: a long story is cut at its start, and the states say most
        shown = login.run(f"scontrol show job {job_id}; sinfo -a -N -o '%N %P %T %E'", timeout=30, check=False)
        parts.append(f"scontrol show job {job_id}; sinfo:\n{shown.stdout}{shown.stderr}")
    except Exception as err:  # noqa: BLE001 - a diagnosis must never hide the failure it explains
        parts.append(f"(could not collect the rest: {err!r})")
    return "\n".join(parts)


def wait_job(login, job_id: str, timeout: float) -> dict:
    def done():
        job = job_state(login, job_id)
        # COMPLETED+COMPLETING: the job ended but its nodes are still cleaning up (epilog, the
        # accounting gather's last sample): wait for the final state
        done_ = set(job["job_state"]) & FINAL
        return job if done_ and "COMPLETING" not in job["job_state"] else None

    return wait_for(f"job {job_id} to finish", done, timeout, interval=1.0, show=lambda _: job_story(login, job_id))


def submit(login, script: str) -> str:
    out = login.run(f"cat > job.sh <<'EOF'\n{script}\nEOF\nsbatch --parsable job.sh").stdout.strip()
    assert re.fullmatch(r"\d+", out), f"sbatch printed {out!r}"
    return out


def two_node_job_from_zero_workers(login, label: str) -> None:
    """A 2-node `srun hostname` job on a cluster with no worker pod yet: COMPLETED, on two nodes,
    each of which wrote its name (the caller checks first that no worker pod exists)."""
    t0 = time.monotonic()
    job = submit(login, "#!/bin/bash\n#SBATCH -N2 -o hosts-%j.out\nsrun hostname")
    final = wait_job(login, job, 180)
    print(f"{label}: 2-node job from zero workers: submit -> COMPLETED {time.monotonic() - t0:.1f} s")
    assert final["job_state"] == ["COMPLETED"], final
    nodes = sorted(login.run(f"scontrol show hostnames {final['nodes']}").stdout.split())
    assert len(nodes) == 2 and sorted(login.run(f"cat ~/hosts-{job}.out").stdout.split()) == nodes


# ---------------------------------------------------------------- accounting, as the researcher sees it


def sacct_jobs(login, user_flag: str = "-a") -> dict[str, dict[str, str]]:
    """Job records from slurmdbd: job id -> {user, account, state, nodes} (allocations only, last 2 days)."""
    out = login.run(f"sacct {user_flag} -X -n -P -S now-2days -o JobID,User,Account,State,NodeList").stdout
    jobs = {}
    for line in out.splitlines():
        if line.strip():
            job, user, account, state, nodes = line.split("|")
            jobs[job] = {"user": user, "account": account, "state": state, "nodes": nodes}
    return jobs


def accounting_log() -> str:
    return kubectl("logs", "-n", NAMESPACE, "slurmctld-0", "-c", "accounting", check=False).stdout
