"""P6: MPI across Kubernetes nodes, measured: ping-pong and allreduce between two worker pods on two
Kubernetes nodes, on the pod network and with host_network, beside the same binary as two plain host
processes (issue #14 item 6).

Adds two real nodes to the local cluster (`slurmk8s cluster node add p6-a / p6-b`, labelled
slurmk8s.io/bench-p6=yes and tainted slurmk8s.io/bench-p6=true:NoSchedule so nothing else lands on
them) and deploys its own cluster `bench-p6` (namespace slurm-bench-p6, its own static volumes) with
two pools on exactly those nodes: `pod` (pinned, pod network) and `hostnet` (slots, one per node by
kubernetes.io/hostname, network.host_network: the namespace becomes Pod Security `privileged`, which
`slurmk8s up` sets by itself for such a pool). In ONE SSH session on the login pod it compiles
bench/mpi_p6.c with mpicc and runs `srun --mpi=pmix -p POOL -N2 -n2 ./mpi_p6` on each pool. The floor
is the binary built there, fetched back and run as two plain processes on this machine outside any
pod network: `docker run --network host` of the worker image, `mpirun -np 2` over loopback.
Every run uses Open MPI's ob1 over TCP (OMPI_MCA_pml=ob1, OMPI_MCA_btl=tcp,self), so the three
differ only in the network path: loopback (host), the pod network (veth, bridge and routing per node),
the node's own address (host_network; btl_tcp_if_include set to the nodes' InternalIP network).

On the local cluster every node shares this machine's network namespace and InternalIP: two
host-network worker pods there are two slurmd on one port (6818) in one namespace, and the second
exits ("Unable to bind listen port (6818): Address already in use"). The hostnet run is then skipped
with that reason unless --try-hostnet. A slurm-bench-p6 namespace or a p6-a / p6-b node this
benchmark did not make is never touched (refused before anything runs).

Usage: KUBECONFIG=/var/lib/slurmk8s/localk8s/kubeconfig python bench/mpi_p6.py [--keep] [--json OUT]
           [--try-hostnet]
       python bench/mpi_p6.py --host-only [--json OUT]   # the floor only: Docker, no Kubernetes
Goal (issue #14 item 6): with host_network >= 0.9 of the host processes for large messages (1 MiB,
16 MiB: ping-pong bandwidth and allreduce time); and say what the pod network costs without it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncssh
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from helpers import (LOCAL_KUBECONFIG, NotOurs, clear_leftover, kjson, kubeconfig, kubectl,  # noqa: E402
                     mark_made_by, refuse_foreign, server_version, side_spec, slurmk8s, static_volumes)

NAME = "bench-p6"  # its own cluster: never the quickstart's or the e2e suite's `local`
NAMESPACE = f"slurm-{NAME}"
MADE_BY = "bench"
VOLUMES = Path(f"/var/lib/slurmk8s/volumes/{NAME}")
WORK = Path("/tmp/slurmk8s-bench-p6")
NODES = ("p6-a", "p6-b")
SELECT = {"slurmk8s.io/bench-p6": "yes"}
TAINT = "slurmk8s.io/bench-p6"
WORKER_IMAGE = "slurmk8s/slurmd:dev"
LOGIN_IMAGE = "slurmk8s/login:dev"
SOURCE = Path(__file__).with_name("mpi_p6.c")
# ob1 over TCP everywhere: Open MPI would otherwise pick what each place offers (shared memory
# between local ranks, UCX or libfabric where they find a device), and the runs would not compare
MPI_ENV = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self"}
SRUN_TIMEOUT = 300  # a boot from zero plus the ~15 s of measuring; the resume timeout is 120 s

PINGPONG = (8, 4 << 10, 64 << 10, 1 << 20, 16 << 20)
ALLREDUCE = (8, 64 << 10, 1 << 20, 16 << 20)
LARGE = (1 << 20, 16 << 20)  # "large messages" of the goal
GOAL = 0.9
VARIANTS = (("pod", "pod network"), ("hostnet", "host_network"))


def mb_s(x: float) -> str:
    return f"{x:9.1f}" if x >= 10 else f"{x:9.3f}"  # 8 B messages move a fraction of 1 MB/s


def size_name(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


# ---------------------------------------------------------------- the program's output


def parse(out: str) -> dict[str, Any]:
    """mpi_p6's "P6 ..." lines -> {library, ranks, pingpong: {bytes: fields}, allreduce: {...}}."""
    doc: dict[str, Any] = {"library": None, "ranks": [], "pingpong": {}, "allreduce": {}}
    done = False
    for line in out.splitlines():
        if not line.startswith("P6 "):
            continue
        kind, _, rest = line[3:].partition(" ")
        if kind == "library":
            doc["library"] = rest
        elif kind == "done":
            done = True
        elif kind in ("rank", "pingpong", "allreduce"):
            fields: dict[str, Any] = {}
            for item in rest.split():
                key, _, value = item.partition("=")
                try:
                    fields[key] = int(value)
                except ValueError:
                    try:
                        fields[key] = float(value)
                    except ValueError:
                        fields[key] = value
            if kind == "rank":
                doc["ranks"].append(fields)
            else:
                doc[kind][fields["bytes"]] = fields
    missing = [f"pingpong {n}" for n in PINGPONG if n not in doc["pingpong"]]
    missing += [f"allreduce {n}" for n in ALLREDUCE if n not in doc["allreduce"]]
    if not done or missing:
        raise ValueError(f"mpi_p6 did not finish (missing: {', '.join(missing) or 'P6 done'}):\n{out[-3000:]}")
    return doc


# ---------------------------------------------------------------- the floor: plain processes


def docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


def compile_in_docker(work: Path) -> Path:
    """--host-only: build mpi_p6 with the login image's mpicc (the login pod's compiler)."""
    shutil.copy(SOURCE, work / "mpi_p6.c")
    proc = docker("run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}", "-v", f"{work}:/p6", "--entrypoint", "mpicc",
                  LOGIN_IMAGE,
                  "-O2", "-o", "/p6/mpi_p6", "/p6/mpi_p6.c")
    if proc.returncode != 0:
        sys.exit(f"mpicc in {LOGIN_IMAGE} failed:\n{proc.stdout}{proc.stderr}")
    return work / "mpi_p6"


def host_floor(binary: Path) -> dict[str, Any]:
    """The binary as two plain processes on this machine: the worker image's libraries, the host's
    network namespace, no pod network, no Slurm; over loopback (the TCP BTL leaves lo out unless
    told). --bind-to none: srun in the pods binds nothing either (task/none)."""
    argv = ["docker", "run", "--rm", "--network", "host", "-v", f"{binary.parent}:/p6:ro",
            "--entrypoint", "mpirun", WORKER_IMAGE, "--allow-run-as-root", "-np", "2", "--oversubscribe",
            "--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", "lo", f"/p6/{binary.name}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=SRUN_TIMEOUT, check=False)
    if proc.returncode != 0:
        sys.exit(f"the host processes failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    doc = parse(proc.stdout)
    doc["command"] = shlex.join(argv)
    return doc


# ---------------------------------------------------------------- the cluster


def cli(*args: str, log: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = slurmk8s(*args, log=log, timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text()[-4000:] if log.exists() else ""
        raise RuntimeError(f"`slurmk8s {' '.join(args)}` failed (exit {proc.returncode}); {log}:\n{tail}")
    return proc


def refuse_foreign_nodes() -> None:
    """A p6-a / p6-b Node without the benchmark's label is someone else's: never removed."""
    for node in NODES:
        got = kubectl("get", "node", node, "-o", "json", check=False)
        if got.returncode != 0:
            continue
        labels = json.loads(got.stdout)["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in SELECT.items()):
            raise NotOurs(f"Kubernetes node {node} exists without the label "
                          f"{','.join(f'{k}={v}' for k, v in SELECT.items())}: not this benchmark's")


def clean(spec_path: Path, state: Path, log: Path) -> None:
    """Remove what a run (this one, or an interrupted one) left: the cluster, its volumes, the nodes."""
    if state.exists() and spec_path.exists():
        slurmk8s("down", "--spec", str(spec_path), "--state", str(state), "--purge", "--yes", log=log)
    clear_leftover(NAMESPACE, MADE_BY)
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={NAME}", "--ignore-not-found", "--wait=true", timeout=120)
    shutil.rmtree(VOLUMES, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)
    for node in NODES:
        slurmk8s("cluster", "node", "remove", node, log=log)  # fails harmlessly when there is none


def internal_ip(node: str) -> str:
    addresses = kjson("get", "node", node)["status"].get("addresses") or []
    return next(a["address"] for a in addresses if a.get("type") == "InternalIP")


def allocatable_cpus(node: str) -> int:
    cpu = kjson("get", "node", node)["status"]["allocatable"]["cpu"]
    return int(cpu[:-1]) // 1000 if cpu.endswith("m") else int(cpu)


def bench_spec(public_key: str, cpus: int) -> dict[str, Any]:
    spec = side_spec(public_key, NAME)
    spec["elasticity"] = {"suspend_time": 600, "resume_timeout": 120}
    # the health checks run at slurmd start, then not again during the measuring (each check runs
    # an MPI loopback on the node, which would land in the numbers)
    spec["health"] = {"interval": 3600}
    tolerate = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    # small requests (overcommit, as the e2e pools); the CPU limit is the node's CPUs in both pools,
    # so neither rank is throttled below what a plain process gets
    small = {"pod_cpu_request": "50m", "pod_memory_request": "256Mi"}
    spec["pools"] = [
        # one Slurm node per labelled Kubernetes node, on the pod network
        {"name": "pod", "mode": "pinned", "node_selector": SELECT, "tolerations": tolerate, "reserve_cpu": "0",
         **small},
        # one slot on each of the same nodes, on the node's network
        {"name": "hostnet", "mode": "slots", "cpus": cpus, "memory": "2Gi", "domain_label": "kubernetes.io/hostname",
         "domains": [{"name": n, "count": 1} for n in NODES], "node_selector": SELECT, "tolerations": tolerate,
         "network": {"host_network": True}, **small},
    ]
    return spec


def covering_network(ips: list[str]) -> str:
    """The smallest network holding every address: btl_tcp_if_include for the host-network run (the
    interface of the nodes' InternalIPs, none of the bridges and veths the host network also shows)."""
    addrs = [ipaddress.ip_address(ip) for ip in ips]
    net = ipaddress.ip_network(f"{addrs[0]}/{addrs[0].max_prefixlen}")
    while not all(a in net for a in addrs):
        net = net.supernet()
    return str(net)


async def on_login(host: str, key: asyncssh.SSHKey, runs: dict[str, dict[str, str]]) -> tuple[bytes, dict[str, Any]]:
    """One SSH session as alice: compile, then each pool's run. Returns the binary and, per pool,
    (exit status, stdout, stderr) of the measured run."""
    async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None,
                                connect_timeout=15) as conn:
        made = await conn.run("cat > mpi_p6.c && mpicc -O2 -o mpi_p6 mpi_p6.c", input=SOURCE.read_text(),
                              check=False, timeout=120)
        if made.exit_status != 0:
            raise RuntimeError(f"mpicc on the login pod failed:\n{made.stdout}{made.stderr}")
        binary = (await conn.run("cat mpi_p6", encoding=None, check=True, timeout=60)).stdout
        results: dict[str, Any] = {}
        for pool, env in runs.items():
            srun = f"timeout {SRUN_TIMEOUT} srun -p {pool} -N2 -n2 --ntasks-per-node=1"
            # power both nodes up first: a boot from zero is not what this measures
            t0 = time.monotonic()
            up = await conn.run(f"{srun} true", check=False, timeout=SRUN_TIMEOUT + 30)
            print(f"{pool}: two nodes up and a 2-task step run in {time.monotonic() - t0:.1f} s"
                  + ("" if up.exit_status == 0 else f" (exit {up.exit_status}: {up.stderr.strip()[-500:]})"))
            if up.exit_status != 0:
                results[pool] = (up.exit_status, up.stdout, up.stderr)
                continue
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            res = await conn.run(f"{exports} {srun} --mpi=pmix ./mpi_p6", check=False, timeout=SRUN_TIMEOUT + 30)
            results[pool] = (res.exit_status, res.stdout, res.stderr)
        return binary, results


def placement(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Each rank's Slurm node -> its worker pod's Kubernetes node and pod IP."""
    pods = {p["metadata"]["name"]: p for p in kjson("get", "pods", "-n", NAMESPACE, "-l",
                                                    "app.kubernetes.io/component=worker")["items"]}
    out = []
    for rank in doc["ranks"]:
        pod = pods.get(rank["slurm_node"]) or {}
        out.append({"slurm_node": rank["slurm_node"], "k8s_node": (pod.get("spec") or {}).get("nodeName", "?"),
                    "pod_ip": (pod.get("status") or {}).get("podIP", "?")})
    return out


def measure_on_kubernetes(args: argparse.Namespace) -> dict[str, Any]:
    """Nodes, cluster, both pools' runs and the floor with the binary built on the login pod."""
    if kubeconfig() != LOCAL_KUBECONFIG:
        sys.exit(f"bench/mpi_p6.py adds real nodes to the local cluster (`slurmk8s cluster node add`); "
                 f"KUBECONFIG={kubeconfig()} is another cluster")
    WORK.mkdir(exist_ok=True)
    spec_path, state, log = WORK / "spec.yaml", WORK / "state", WORK / "slurmk8s.log"
    try:
        refuse_foreign(NAMESPACE, MADE_BY)
        refuse_foreign_nodes()
    except NotOurs as err:
        sys.exit(f"cannot run: {err}")
    clean(spec_path, state, log)
    result: dict[str, Any] = {}
    try:
        for node in NODES:
            t0 = time.monotonic()
            cli("cluster", "node", "add", node, *(a for k, v in SELECT.items() for a in ("--label", f"{k}={v}")),
                "--taint", f"{TAINT}=true:NoSchedule", "--image", WORKER_IMAGE, log=log)
            print(f"node {node}: added in {time.monotonic() - t0:.1f} s")
        ips = [internal_ip(n) for n in NODES]
        cpus = min(allocatable_cpus(n) for n in NODES)
        key = asyncssh.generate_private_key("ssh-ed25519")
        spec_path.write_text(yaml.safe_dump(bench_spec(key.export_public_key().decode().strip() + " bench-p6", cpus)))
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                      "items": static_volumes(NAME, NAMESPACE)}))
        t0 = time.monotonic()
        try:
            cli("up", "--spec", str(spec_path), "--state", str(state), log=log)
        finally:
            mark_made_by(NAMESPACE, MADE_BY)
        print(f"slurmk8s up: {time.monotonic() - t0:.1f} s")

        runs = {"pod": dict(MPI_ENV)}
        if len(set(ips)) < len(ips) and not args.try_hostnet:
            result["hostnet_skipped"] = (
                f"the nodes share one network namespace (InternalIP {ips[0]}: the local cluster's nodes are one "
                f"machine): two host-network slurmd would both bind port 6818 there; --try-hostnet runs it anyway")
            print(f"hostnet: skipped: {result['hostnet_skipped']}")
        else:
            runs["hostnet"] = {**MPI_ENV, "OMPI_MCA_btl_tcp_if_include": covering_network(ips)}
        host = kjson("get", "service", "-n", NAMESPACE, "login")["spec"]["clusterIP"]
        binary, outs = asyncio.run(on_login(host, key, runs))
        for pool, (status, out, err) in outs.items():
            if status != 0:
                print(f"{pool}: srun failed (exit {status}):\n{out[-2000:]}{err[-2000:]}")
                result[pool] = {"failed": f"exit {status}: {err.strip()[-1000:]}"}
                continue
            doc = parse(out)
            doc["env"] = runs[pool]
            doc["placement"] = placement(doc)
            k8s_nodes = {p["k8s_node"] for p in doc["placement"]}
            if k8s_nodes != set(NODES):
                raise RuntimeError(f"{pool}: the two ranks were not on {' and '.join(NODES)}: {doc['placement']}")
            result[pool] = doc
        # the floor, with the very binary the pods ran
        (WORK / "mpi_p6").write_bytes(binary)
        (WORK / "mpi_p6").chmod(0o755)
        result["binary_sha256"] = hashlib.sha256(binary).hexdigest()
        result["host"] = host_floor(WORK / "mpi_p6")
        result["kubernetes"] = server_version()
        result["node_ips"] = dict(zip(NODES, ips))
    finally:
        if args.keep:
            print(f"kept: cluster {NAME} (spec {spec_path}, state {state}) and nodes {', '.join(NODES)}; "
                  f"the next run removes them first")
        else:
            clean(spec_path, state, log)
    return result


# ---------------------------------------------------------------- the report


def ratios(result: dict[str, Any], variant: str) -> dict[str, dict[int, float]]:
    """Fraction of the host processes' performance: host time / time (= bandwidth / host bandwidth)."""
    doc, host = result.get(variant) or {}, result["host"]
    if "pingpong" not in doc:
        return {}
    return {"pingpong": {n: host["pingpong"][n]["lat_us"] / doc["pingpong"][n]["lat_us"] for n in PINGPONG},
            "allreduce": {n: host["allreduce"][n]["us"] / doc["allreduce"][n]["us"] for n in ALLREDUCE}}


def report(result: dict[str, Any]) -> None:
    host = result["host"]
    shown = [(v, title) for v, title in VARIANTS if v in result]
    print(f"\nP6: {host['library']}")
    load = result.get("loadavg_1min") or {}
    print(f"CPUs on this machine: {os.cpu_count()}, load average (1 min) {load.get('start', 0):.2f} at the start, "
          f"{load.get('end', 0):.2f} at the end")
    print(f"every run: ob1 over TCP ({', '.join(f'{k}={v}' for k, v in MPI_ENV.items())})")
    print("host: 2 plain processes (docker --network host, mpirun -np 2, btl_tcp_if_include lo)")
    for variant, title in shown:
        doc = result[variant]
        if "failed" in doc:
            print(f"{variant} ({title}): FAILED: {doc['failed']}")
        else:
            where = ", ".join(f"{p['slurm_node']} on {p['k8s_node']} ({p['pod_ip']})" for p in doc["placement"])
            print(f"{variant} ({title}): srun --mpi=pmix -N2 -n2: {where}")
    if "hostnet_skipped" in result:
        print(f"hostnet (host_network): not measured: {result['hostnet_skipped']}")
    if result.get("binary_sha256"):
        print(f"the same binary everywhere: sha256 {result['binary_sha256'][:16]}...")
    print("x host: fraction of the host processes' performance (host latency / latency = bandwidth / host "
          "bandwidth; host time / time)\n")

    measured = [(v, title) for v, title in shown if "pingpong" in result[v]]
    r = {v: ratios(result, v) for v, _ in measured}
    head = f"{'ping-pong':>10} | {'host lat us':>11} {'MB/s':>9}"
    for v, _ in measured:
        head += f" | {v + ' lat us':>14} {'MB/s':>9} {'x host':>6}"
    print(head)
    for n in PINGPONG:
        h = host["pingpong"][n]
        line = f"{size_name(n):>10} | {h['lat_us']:11.2f} {mb_s(h['mb_s'])}"
        for v, _ in measured:
            d = result[v]["pingpong"][n]
            line += f" | {d['lat_us']:14.2f} {mb_s(d['mb_s'])} {r[v]['pingpong'][n]:6.2f}"
        print(line)
    head = f"\n{'allreduce':>10} | {'host us/call':>12}"
    for v, _ in measured:
        head += f" | {v + ' us/call':>16} {'x host':>6}"
    print(head)
    for n in ALLREDUCE:
        line = f"{size_name(n):>10} | {host['allreduce'][n]['us']:12.2f}"
        for v, _ in measured:
            line += f" | {result[v]['allreduce'][n]['us']:16.2f} {r[v]['allreduce'][n]:6.2f}"
        print(line)
    print("(median of 7 repetitions each; the best ones are in --json)\n")

    large = {v: [r[v][kind][n] for kind in ("pingpong", "allreduce") for n in LARGE] for v in r}
    goal = f"goal: host_network >= {GOAL} of the host processes for large messages (1 MiB, 16 MiB)"
    if "hostnet" in large:
        worst = min(large["hostnet"])
        result["goal"] = {"met": worst >= GOAL, "worst_large_ratio": worst}
        print(f"{goal}: {'MET' if worst >= GOAL else 'NOT MET'} (worst {worst:.2f})")
    else:
        result["goal"] = {"met": None, "reason": result.get("hostnet_skipped") or (result.get("hostnet") or {}).get(
            "failed", "host_network not run")}
        print(f"{goal}: NOT MEASURED ({result['goal']['reason']})")
    if "pod" in r:
        pod, small = result["pod"], PINGPONG[0]
        extra = pod["pingpong"][small]["lat_us"] - host["pingpong"][small]["lat_us"]
        big = PINGPONG[-1]
        cost = (f"without host_network the pod network costs {extra:+.1f} us per {size_name(small)} message "
                f"({r['pod']['pingpong'][small]:.2f} x host), {r['pod']['pingpong'][big]:.2f} x the host's bandwidth at "
                f"{size_name(big)} ({pod['pingpong'][big]['mb_s']:.0f} vs {host['pingpong'][big]['mb_s']:.0f} MB/s), "
                f"allreduce {size_name(ALLREDUCE[-1])} {r['pod']['allreduce'][ALLREDUCE[-1]]:.2f} x host; "
                f"large messages worst {min(large['pod']):.2f} x host")
        result["pod_network_cost"] = cost
        print(cost[0].upper() + cost[1:] + ".")
    result["ratios"] = {v: {k: {str(n): x for n, x in d.items()} for k, d in rv.items()} for v, rv in r.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster and the two nodes up afterwards")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write every number to OUT")
    parser.add_argument("--try-hostnet", action="store_true",
                        help="run the host_network pool even where the nodes share one network namespace")
    parser.add_argument("--host-only", action="store_true", help="only the host processes (Docker, no Kubernetes)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    try:
        if args.host_only:
            with tempfile.TemporaryDirectory(prefix="slurmk8s-bench-p6-") as tmp:
                binary = compile_in_docker(Path(tmp))
                result = {"host": host_floor(binary), "binary_sha256": hashlib.sha256(binary.read_bytes()).hexdigest()}
        else:
            result = measure_on_kubernetes(args)
    except (RuntimeError, ValueError) as err:  # a failed step, or mpi_p6 output cut short
        sys.exit(f"bench-p6 failed: {err}")
    # the machine's other work lands in every figure (2 shared cores here): judge them by this
    result["loadavg_1min"] = {"start": load_before[0], "end": os.getloadavg()[0]}
    report(result)
    if args.json:
        def keyed(doc: Any) -> Any:  # JSON keys are strings: message sizes too
            return {str(k): keyed(v) for k, v in doc.items()} if isinstance(doc, dict) else doc
        args.json.write_text(json.dumps(keyed(result), indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
