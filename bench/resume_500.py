"""P4b: one resume of 500 nodes through the real resume program and the Kubernetes node backend ->
500 worker pods Running. The pods land on kwok nodes (simulated: scheduled and "Running", never
started), so the figure is the control path: planning, 500 API creates, scheduling, status.

Usage: KUBECONFIG=... python bench/resume_500.py [--nodes 500] [--parallel N] [--json OUT]
Needs the local cluster with kwok (`slurmk8s cluster up --kwok`). --parallel defaults to the resume
program's shipped SLURMK8S_PARALLEL. Target (issue #17 item 3): all Running <= 5 s and <= 1.3x the
floor, which this script measures in the same run: the same pods (the backend's own manifests,
owner included) created straight through the API, with as many calls in flight, no resume program.
With every pod Running it also times --passes reconcile passes at that many pods (the loop's own
run_once against the real API server; Slurm's side canned: every node allocated, no jobs) and their
peak Python memory: issue #17 item 4 asks <= 2 s at 4,096 pods (`--nodes 4096`, which also gives
"one resume of 4,096 nodes creates every pod", target <= 20 s).
--json also writes the figures printed to OUT (bench/all.py reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "tests"))  # the fakes package

from helpers import NotOurs, clear_leftover, kubectl, kubectl_exe, kubeconfig, mark_made_by, server_version  # noqa: E402

from provisioner import manifests as m  # noqa: E402
from provisioner.kubeapi import api_path  # noqa: E402
from provisioner.config import parse_spec  # noqa: E402
from provisioner.elastic.programs import DEFAULT_PARALLEL, Context, run_resume, run_suspend  # noqa: E402
from provisioner.logs import Log  # noqa: E402
from fakes.slurm import FakeSlurm  # noqa: E402
from provisioner.generate import generate  # noqa: E402
from provisioner.elastic.k8s_backend import from_env  # noqa: E402
from provisioner.render import compress  # noqa: E402

NS = "slurm-p4b"
ZONE = "topology.kubernetes.io/zone"


WORKERS = "app.kubernetes.io/component=worker"


class RunningWatch:
    """When the `count`-th worker pod of `ns` was seen Running: one watch of the pods Running (the
    API server filters by phase), started before the pods are made. A poll (kubectl every 0.1 s, as
    before) loaded the 2 cores that the figures measure, and read the time only to its next poll.
    The API server closes a watch whose reader falls behind (seen at 4,096 pods, this process busy
    creating them), a stream may break: the pods are then listed again and watched from there
    (`restarts`, at most MAX_RESTARTS)."""

    MAX_RESTARTS = 20

    def __init__(self, api, ns: str, count: int) -> None:
        import threading

        self._api, self._ns, self._count = api, ns, count
        self._query = {"labelSelector": WORKERS, "fieldSelector": "status.phase=Running"}
        self._names: set[str] = set()
        self.done_at: float | None = None
        self.error = ""
        self.reasons: list[str] = []  # why each restart
        self._done = threading.Event()
        self._deadline = time.monotonic() + limit_s(count)
        version = self._list()
        if not self._done.is_set():
            threading.Thread(target=self._watch, args=(version,), daemon=True).start()

    @property
    def restarts(self) -> int:
        return len(self.reasons)

    def _list(self) -> str:
        """The pods Running now (replacing what was seen); returns the list's resourceVersion."""
        listed = self._api.request("GET", api_path("v1", self._ns, "pods"), self._query)
        self._names = set()
        self._note(listed.get("items") or ())
        return listed["metadata"]["resourceVersion"]

    def _note(self, pods, gone: bool = False) -> None:
        for pod in pods:
            name = pod["metadata"]["name"]
            if gone or pod["metadata"].get("deletionTimestamp"):
                self._names.discard(name)
            else:
                self._names.add(name)
        if self.done_at is None and len(self._names) >= self._count:
            self.done_at = time.monotonic()
            self._done.set()

    def _watch(self, version: str) -> None:
        while (left := int(self._deadline - time.monotonic())) > 0:
            try:
                for event in self._api.watch_path(api_path("v1", self._ns, "pods"),
                                                  {**self._query, "resourceVersion": version, "timeoutSeconds": left},
                                                  (10.0, left + 30.0)):
                    if event.get("type") == "ERROR":  # e.g. 410: the version is too old; list again
                        self.error = str(event.get("object"))
                        break
                    self._note([event["object"]], gone=event.get("type") == "DELETED")
                    if self._done.is_set():
                        return
                else:
                    if time.monotonic() >= self._deadline:
                        break  # its own timeoutSeconds: the deadline
                    self.error = "the API server ended the watch"
            except Exception as err:  # a broken stream, a refused request: list again; wait() reports  # noqa: BLE001
                self.error = str(err)
            if self.restarts >= self.MAX_RESTARTS:
                self.error += f" ({self.restarts} restarts: given up)"
                break
            self.reasons.append(self.error[:300])
            time.sleep(0.2)  # not a tight loop of lists on the cores being measured
            try:
                version = self._list()
            except Exception as err:  # noqa: BLE001
                self.error = str(err)
                continue
            if self._done.is_set():
                return
        self._done.set()

    def wait(self, t0: float, what: str) -> float:
        """Seconds from `t0` to the moment the last pod was seen Running; exits with the count short."""
        self._done.wait(max(0.0, self._deadline - time.monotonic()) + 30)
        if self.done_at is None:
            sys.exit(f"{what}: only {len(self._names)} of {self._count} pods Running after "
                     f"{time.monotonic() - t0:.0f} s{'; the watch failed: ' + self.error if self.error else ''}"
                     f" ({self.restarts} restarts)")
        return self.done_at - t0


def wait_nodes_schedulable(selector: str, count: int, timeout: float = 120.0) -> float:
    """Wait until `count` nodes matching `selector` are Ready without the node controller's
    not-ready / unreachable taints: kwok marks a new node Ready a moment after it is created, and a
    pod the scheduler tried before that waits out its backoff (up to 10 s), which would be charged
    to whichever of the resume and the floor comes first. Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        nodes = json.loads(kubectl("get", "nodes", "-l", selector, "-o", "json", timeout=60).stdout)["items"]
        ready = [n for n in nodes
                 if any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (n.get("status") or {}).get("conditions") or ())
                 and not any(t.get("key", "").startswith("node.kubernetes.io/")
                             for t in (n.get("spec") or {}).get("taints") or ())]
        if len(ready) >= count:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            sys.exit(f"only {len(ready)} of {count} kwok nodes ({selector}) Ready and untainted after {timeout:.0f} s")
        time.sleep(0.2)


def limit_s(nodes: int) -> float:
    """How long to wait for every pod Running before giving up: 120 s, more above 1,000 nodes."""
    return max(120.0, nodes * 0.1)


def reconcile_passes(backend, inventory, passes: int) -> tuple[list[float], int, int, float, float]:
    """The reconcile loop's pass (provisioner.reconcile.act.run_once) at this many worker pods, with
    the backend the loop runs with (elastic/podwatch.py: the pods listed once, then watched): the
    Kubernetes side is the real API server (the watch's first list of every worker pod, then each
    pass's one-pod list, each pod classified against its Slurm node); Slurm's side is canned (every
    node ALLOCATED and booted, no jobs: slurmctld's own cost with a deep queue is
    bench/queue_32k.py). Returns each pass's seconds, the peak Python memory of a pass (tracemalloc,
    bytes), how many findings of the last were other than ok (0 expected: every pod Running for an
    allocated node), the seconds the watch took to list every pod (once per loop start) and one
    pass with a direct list of every pod instead (what each pass cost before the watch)."""
    import io
    import tracemalloc

    from fakes.slurm import FakeSlurmClient
    from provisioner.elastic.ledger import FileLedger
    from provisioner.elastic.podwatch import PodWatch, WatchedBackend
    from provisioner.reconcile.act import run_once

    booted = int(time.time()) - 600
    nodes = [{"name": n, "state": ["ALLOCATED", "CLOUD"], "reason": "", "partitions": ["sim"],
              "boot_time": {"set": True, "infinite": False, "number": booted},
              "slurmd_start_time": {"set": True, "infinite": False, "number": booted}} for n in inventory.names]
    slurm = FakeSlurmClient(nodes=nodes)
    times, peak, findings = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        ledger = FileLedger(str(Path(tmp) / "ledger.json"))
        log = Log("reconcile", str(Path(tmp) / "reconcile.log"))
        t0 = time.monotonic()
        report = run_once(slurm, backend, inventory, ledger, time.time(), log)
        listed_pass = time.monotonic() - t0
        t0 = time.monotonic()
        watch = PodWatch(backend.api, backend.namespace, backend.selector,  # short watches: stop() ends it soon
                         Log("reconcile", stream=io.StringIO()), timeout_s=5).start()
        if not watch.wait_synced(120):
            sys.exit("the pod watch did not list the pods within 120 s")
        sync_s = time.monotonic() - t0
        if len(watch.workers() or ()) != len(inventory.names):
            sys.exit(f"the pod watch holds {len(watch.workers() or ())} pods, not {len(inventory.names)}")
        backend = WatchedBackend(backend, watch)
        for _ in range(passes):  # timed without tracemalloc, which slows every allocation
            t0 = time.monotonic()
            report = run_once(slurm, backend, inventory, ledger, time.time(), log)
            times.append(time.monotonic() - t0)
            findings = sum(f.kind.value != "ok" for f in report.findings)  # what the pass would act on
            if report.errors:
                sys.exit(f"reconcile pass failed: {report.errors}")
        tracemalloc.start()  # one more pass, untimed, for its peak memory
        run_once(slurm, backend, inventory, ledger, time.time(), log)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        watch.stop()
    return times, peak, findings, sync_s, listed_pass


def floor(backend, inventory, ns: str, nodes: int, parallel: int) -> tuple[float, float, RunningWatch]:
    """The same pods created straight through the API (`parallel` calls in flight), no resume
    program: (seconds until every create returned, until all were Running, the watch that saw them
    Running). Deletes them after."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = []
    for node in inventory.nodes:
        pod = m.worker_pod(backend.spec, node, backend.site)
        pod["metadata"]["ownerReferences"] = [backend.owner_reference(node.name)]
        # a name of its own: kwok may still be carrying out the deletes of the resume's pods of the
        # same names (seen: 226 of 500 new pods deleted before binding, `pods "sim-p4b-272" not found`)
        pod["metadata"]["name"] += "-floor"
        bodies.append(pod)
    watch = RunningWatch(backend.api, ns, nodes)
    t0 = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda body: backend.api.create(ns, body), bodies))
    created = time.monotonic() - t0
    all_running = watch.wait(t0, "floor")
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda body: backend.api.delete(ns, body["metadata"]["name"], grace_seconds=0), bodies))
    wait_gone(ns, nodes)
    return created, all_running, watch


def wait_gone(ns: str, nodes: int) -> None:
    deadline = time.monotonic() + limit_s(nodes)
    while kubectl("get", "pods", "-n", ns, "-l", WORKERS, "-o", "name",
                  timeout=120).stdout.strip():
        if time.monotonic() > deadline:
            sys.exit(f"worker pods of {ns} still there after {limit_s(nodes):.0f} s")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL)
    parser.add_argument("--passes", type=int, default=3, help="reconcile passes timed with every pod Running")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the figures printed to OUT")
    args = parser.parse_args()
    spec = parse_spec({
        "name": "p4b", "namespace": NS,
        "pools": [{"name": "sim", "mode": "slots", "cpus": 1, "memory": "1Gi", "domain_label": ZONE,
                   "domains": [{"name": "p4b", "count": args.nodes}],
                   "pod_cpu_request": "1m", "pod_memory_request": "1Mi",
                   "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}],
    })
    inventory = generate(spec, []).inventory
    per_node = 110
    kwok_nodes = -(-args.nodes // per_node)
    subprocess.run([str(Path(sys.executable).with_name("slurmk8s")), "cluster", "kwok-node", "p4b",
                    "--count", str(kwok_nodes), "-l", f"{ZONE}=p4b", "--pods", str(per_node), "--cpu", "1000",
                    "--memory", "4Ti"], check=True, capture_output=True)
    waited = wait_nodes_schedulable(f"{ZONE}=p4b", kwok_nodes)
    print(f"{kwok_nodes} kwok nodes Ready and untainted after {waited:.1f} s", flush=True)
    try:  # a slurm-p4b namespace this benchmark did not make is never touched; one an earlier run left
        clear_leftover(NS, "bench")  # (or is still deleting) is waited out: creating in it would fail
    except NotOurs as err:
        sys.exit(f"cannot run: {err}")
    kubectl("create", "namespace", NS, check=False)
    mark_made_by(NS, "bench")
    # /home as the worker pods mount it: a claim bound at once to a throwaway volume (one an earlier
    # run left stays bound to that run's claim, so it goes first)
    kubectl("delete", "pv", "p4b-home", "--ignore-not-found", "--wait=true", "--timeout=60s", timeout=90)
    volume = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "p4b-home"},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "claimRef": {"namespace": NS, "name": "home"}, "hostPath": {"path": "/tmp/p4b-home"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "home", "namespace": NS},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "p4b-home",
                  "resources": {"requests": {"storage": "1Gi"}}}}]}
    subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), "apply", "-f", "-"], input=json.dumps(volume),
                   text=True, check=True, capture_output=True)
    # as in a deployed cluster, /home is bound before any resume: a pod whose claim is not Bound yet
    # is unschedulable and waits out the scheduler's backoff (the first batch of a run took 19-20 s
    # to all Running against 9.4-9.6 s for the same pods a minute later, whichever came first)
    kubectl("wait", "-n", NS, "pvc/home", "--for=jsonpath={.status.phase}=Bound", "--timeout=60s", timeout=90)
    # every worker pod names the slurmctld StatefulSet as its owner, and the backend creates none
    # without it: a StatefulSet of that name with no replicas stands in for the controller here
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "slurmctld", "namespace": NS},
             "spec": {"replicas": 0, "serviceName": "slurmctld", "selector": {"matchLabels": {"p4b": "owner"}},
                      "template": {"metadata": {"labels": {"p4b": "owner"}},
                                   "spec": {"containers": [{"name": "none", "image": "slurmk8s/slurmd:dev"}]}}}}
    subprocess.run([kubectl_exe(), "--kubeconfig", kubeconfig(), "apply", "-f", "-"], input=json.dumps(owner),
                   text=True, check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(spec.model_dump_json())
        env = {"SLURMK8S_SPEC": str(spec_file), "SLURMK8S_NAMESPACE": NS, "KUBECONFIG": kubeconfig(),
               "SLURMK8S_PARALLEL": str(args.parallel), "SLURMK8S_BUDGET": "120"}
        log_path = Path(tmp) / "elastic.log"
        hostlist = compress(inventory.names)
        watch = RunningWatch(from_env(env).api, NS, args.nodes)
        t0 = time.monotonic()
        ctx = Context(env, Log("resume", str(log_path)), backend=from_env(env), slurm=FakeSlurm(),
                      inventory=inventory)
        result = run_resume([hostlist], ctx, None)
        t_created = time.monotonic() - t0
        t_running = watch.wait(t0, f"resume (see {log_path})")
        pass_s, pass_peak, pass_findings, sync_s, listed_pass_s = reconcile_passes(from_env(env), inventory,
                                                                                  args.passes)
        t1 = time.monotonic()
        ctx = Context(env, Log("suspend", str(log_path)), backend=from_env(env), slurm=FakeSlurm(),
                      inventory=inventory)
        run_suspend([hostlist], ctx)
        t_deleted = time.monotonic() - t1
        wait_gone(NS, args.nodes)
        f_created, f_running, f_watch = floor(from_env(env), inventory, NS, args.nodes, args.parallel)
        print(f"resume of {args.nodes} nodes ({hostlist}) through the resume program + Kubernetes backend, "
              f"{args.parallel} parallel API calls, {kwok_nodes} kwok nodes:")
        goal_created = " (target <= 20 s at 4,096 nodes)" if args.nodes == 4096 else ""
        goal_running = " (target <= 5 s)" if args.nodes == 500 else ""
        print(f"  resume program returned (every pod created): {t_created:.2f} s{goal_created}, exit {result.code}, "
              f"{len(result.down)} nodes set DOWN")
        reasons = sorted(set(watch.reasons + f_watch.reasons))
        restarts = (f"; the Running watch restarted {watch.restarts} / {f_watch.restarts} times (resume / floor): "
                    f"a pod first seen Running by a list is timed at that list; why: {' | '.join(reasons)}"
                    if reasons else "")
        print(f"  all {args.nodes} worker pods Running: {t_running:.2f} s{goal_running}{restarts}")
        print(f"  reconcile pass at {args.nodes} worker pods (Slurm's side canned): "
              f"{' / '.join(f'{t:.2f}' for t in pass_s)} s (target <= 2 s), peak Python memory of a pass "
              f"{pass_peak / 2**20:.1f} MiB, {pass_findings} findings other than ok; the watch's first list "
              f"{sync_s:.2f} s (once per loop start); a pass listing every pod instead {listed_pass_s:.2f} s")
        print(f"  suspend program deleted them: {t_deleted:.2f} s")
        print(f"  floor, the same pods created straight through the API ({args.parallel} in flight): created "
              f"{f_created:.2f} s, all Running {f_running:.2f} s -> resume / floor {t_running / f_running:.2f}x "
              f"(target <= 1.3x)")
    if args.json:
        server = server_version()
        args.json.write_text(json.dumps({
            "kubernetes": server, "nodes": args.nodes, "parallel": args.parallel, "kwok_nodes": kwok_nodes,
            "hostlist": hostlist, "resume_exit": result.code, "set_down": len(result.down),
            "created_s": round(t_created, 6), "running_s": round(t_running, 6), "deleted_s": round(t_deleted, 6),
            "reconcile_pass_s": [round(t, 6) for t in pass_s], "reconcile_pass_peak_bytes": pass_peak,
            "reconcile_findings": pass_findings, "reconcile_watch_sync_s": round(sync_s, 6),
            "reconcile_listed_pass_s": round(listed_pass_s, 6),
            "floor_created_s": round(f_created, 6), "floor_running_s": round(f_running, 6),
            "watch_restarts": watch.reasons, "floor_watch_restarts": f_watch.reasons,
        }, indent=2) + "\n")
    kubectl("delete", "namespace", NS, "--wait=false", check=False)
    kubectl("delete", "pv", "p4b-home", "--wait=false", check=False)
    for i in range(kwok_nodes):
        kubectl("delete", "node", f"p4b-{i}", "--wait=false", check=False)


if __name__ == "__main__":
    os.environ.setdefault("KUBECONFIG", kubeconfig())
    main()
