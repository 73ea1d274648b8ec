"""P4b: one resume of 500 nodes through the real resume program and the Kubernetes node backend ->
500 worker pods Running. The pods land on kwok nodes (simulated: scheduled and "Running", never
started), so the figure is the control path: planning, 500 API creates, scheduling, status.

Usage: KUBECONFIG=... python bench/resume_500.py [--nodes 500] [--parallel N] [--json OUT]
Needs the local cluster with kwok (`slurmk8s cluster up --kwok`). --parallel defaults to the resume
program's shipped SLURMK8S_PARALLEL. Target (issue #17 item 3): all Running <= 5 s and <= 1.3x the
floor, which this script measures in the same run: the same pods (the backend's own manifests,
owner included) created straight through the API, with as many calls in flight, no resume program.
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

from helpers import NotOurs, clear_leftover, kjson, kubectl, kubectl_exe, kubeconfig, mark_made_by  # noqa: E402

from provisioner import manifests as m  # noqa: E402
from provisioner.config import parse_spec  # noqa: E402
from provisioner.elastic.programs import DEFAULT_PARALLEL, Context, run_resume, run_suspend  # noqa: E402
from provisioner.logs import Log  # noqa: E402
from fakes.slurm import FakeSlurm  # noqa: E402
from provisioner.generate import generate  # noqa: E402
from provisioner.elastic.k8s_backend import from_env  # noqa: E402
from provisioner.render import compress  # noqa: E402

NS = "slurm-p4b"
ZONE = "topology.kubernetes.io/zone"


def running(ns: str) -> int:
    pods = kjson("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=worker")["items"]
    return sum(p["status"].get("phase") == "Running" for p in pods)


def floor(backend, inventory, ns: str, nodes: int, parallel: int) -> tuple[float, float]:
    """The same pods created straight through the API (`parallel` calls in flight), no resume
    program: (seconds until every create returned, until all were Running). Deletes them after."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = []
    for node in inventory.nodes:
        pod = m.worker_pod(backend.spec, node, backend.site)
        pod["metadata"]["ownerReferences"] = [backend.owner_reference(node.name)]
        # a name of its own: kwok may still be carrying out the deletes of the resume's pods of the
        # same names (seen: 226 of 500 new pods deleted before binding, `pods "sim-p4b-272" not found`)
        pod["metadata"]["name"] += "-floor"
        bodies.append(pod)
    t0 = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda body: backend.api.create(ns, body), bodies))
    created = time.monotonic() - t0
    while running(ns) < nodes:
        if time.monotonic() - t0 > 120:
            sys.exit(f"floor: only {running(ns)} of {nodes} pods Running after 120 s")
        time.sleep(0.1)
    all_running = time.monotonic() - t0
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda body: backend.api.delete(ns, body["metadata"]["name"], grace_seconds=0), bodies))
    wait_gone(ns)
    return created, all_running


def wait_gone(ns: str) -> None:
    deadline = time.monotonic() + 120
    while kjson("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=worker")["items"]:
        if time.monotonic() > deadline:
            sys.exit(f"worker pods of {ns} still there after 120 s")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL)
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
        t0 = time.monotonic()
        ctx = Context(env, Log("resume", str(log_path)), backend=from_env(env), slurm=FakeSlurm(),
                      inventory=inventory)
        result = run_resume([hostlist], ctx, None)
        t_created = time.monotonic() - t0
        while running(NS) < args.nodes:
            if time.monotonic() - t0 > 120:
                sys.exit(f"only {running(NS)} of {args.nodes} pods Running after 120 s; see {log_path}")
            time.sleep(0.1)
        t_running = time.monotonic() - t0
        t1 = time.monotonic()
        ctx = Context(env, Log("suspend", str(log_path)), backend=from_env(env), slurm=FakeSlurm(),
                      inventory=inventory)
        run_suspend([hostlist], ctx)
        t_deleted = time.monotonic() - t1
        wait_gone(NS)
        f_created, f_running = floor(from_env(env), inventory, NS, args.nodes, args.parallel)
        print(f"resume of {args.nodes} nodes ({hostlist}) through the resume program + Kubernetes backend, "
              f"{args.parallel} parallel API calls, {kwok_nodes} kwok nodes:")
        print(f"  resume program returned (every pod created): {t_created:.2f} s, exit {result.code}, "
              f"{len(result.down)} nodes set DOWN")
        print(f"  all {args.nodes} worker pods Running: {t_running:.2f} s (target <= 5 s)")
        print(f"  suspend program deleted them: {t_deleted:.2f} s")
        print(f"  floor, the same pods created straight through the API ({args.parallel} in flight): created "
              f"{f_created:.2f} s, all Running {f_running:.2f} s -> resume / floor {t_running / f_running:.2f}x "
              f"(target <= 1.3x)")
    if args.json:
        versions = kubectl("version", "-o", "json", check=False).stdout
        server = json.loads(versions).get("serverVersion", {}).get("gitVersion", "?") if versions else "?"
        args.json.write_text(json.dumps({
            "kubernetes": server, "nodes": args.nodes, "parallel": args.parallel, "kwok_nodes": kwok_nodes,
            "hostlist": hostlist, "resume_exit": result.code, "set_down": len(result.down),
            "created_s": round(t_created, 6), "running_s": round(t_running, 6), "deleted_s": round(t_deleted, 6),
            "floor_created_s": round(f_created, 6), "floor_running_s": round(f_running, 6),
        }, indent=2) + "\n")
    kubectl("delete", "namespace", NS, "--wait=false", check=False)
    kubectl("delete", "pv", "p4b-home", "--wait=false", check=False)
    for i in range(kwok_nodes):
        kubectl("delete", "node", f"p4b-{i}", "--wait=false", check=False)


if __name__ == "__main__":
    os.environ.setdefault("KUBECONFIG", kubeconfig())
    main()
