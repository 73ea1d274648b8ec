"""P1 on Kubernetes: `sbatch` -> job RUNNING, from zero workers and from idle workers, beside a bare
pod start (same slurmd image, cached) measured in the same run.

Deploys (or reuses, from its own state directory) the e2e cluster shape of examples/local.yaml with a
short SuspendTime as its own cluster `bench-p1` (namespace slurm-bench-p1, its own static volumes),
beside whatever else runs, then runs the measuring loop *inside one SSH session* on the login pod so
SSH set-up never counts. A slurm-bench-p1 namespace this benchmark did not make is never touched
(refused before anything runs; `slurmk8s up` also refuses a namespace another stack owns).

Usage: KUBECONFIG=... python bench/k8s_submit_latency.py [--runs 10] [--keep]
Target (issue #6): p50 <= 8 s and <= 3x the bare pod start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncssh
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from helpers import (NotOurs, e2e_spec, kjson, kubeconfig, kubectl, kubectl_exe, mark_made_by,  # noqa: E402
                     refuse_foreign, slurmk8s, static_volumes)

NAME = "bench-p1"  # its own cluster: never the quickstart's or the e2e suite's `local`
NAMESPACE = f"slurm-{NAME}"
MADE_BY = "bench"

LOOP = r"""
set -e
mode=$1; runs=$2
for i in $(seq "$runs"); do
  if [ "$mode" = zero ]; then   # wait until every node is powered down (no worker pod)
    until [ -z "$(sinfo -h -N -o '%T' | grep -v '~$')" ]; do sleep 0.2; done
  fi
  t0=$(date +%s%N)
  j=$(sbatch --parsable -N1 -o /dev/null --wrap 'sleep 1')
  until [ "$(squeue -h -j "$j" -o %T)" = RUNNING ]; do sleep 0.05; done
  t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000000 ))"
  while squeue -h -j "$j" | grep -q .; do sleep 0.2; done
done
"""


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
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
        refuse_foreign(NAMESPACE, MADE_BY)
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
    print(f"slurmk8s up: {time.monotonic() - t0:.1f} s")
    host = kjson("get", "service", "-n", NAMESPACE, "login")["spec"]["clusterIP"]

    async def loop(mode: str) -> list[float]:
        async with asyncssh.connect(host, username="alice", client_keys=[key], known_hosts=None) as conn:
            await conn.run(f"cat > bench-loop.sh <<'EOF'\n{LOOP}\nEOF", check=True)
            res = await conn.run(f"bash bench-loop.sh {mode} {args.runs}", check=True, timeout=1800)
            return [int(x) / 1000 for x in res.stdout.split()]

    zero = asyncio.run(loop("zero"))
    idle = asyncio.run(loop("idle"))
    bare = bare_pod_start("slurmk8s/slurmd:dev", max(5, args.runs // 2))
    versions = kubectl("version", "-o", "json", check=False).stdout
    server = json.loads(versions).get("serverVersion", {}).get("gitVersion", "?") if versions else "?"
    print(f"Kubernetes {server}, Slurm 24.11 images, {args.runs} runs each, 1-node batch job")
    for name, vals in (("from zero workers", zero), ("from idle workers", idle), ("bare pod start", bare)):
        print(f"{name:18s}: p50 {statistics.median(vals):5.2f} s  p95 {pct(vals, 0.95):5.2f} s  "
              f"min {min(vals):5.2f} s  max {max(vals):5.2f} s")
    ratio = statistics.median(zero) / statistics.median(bare)
    print(f"from zero / bare pod start (p50): {ratio:.1f}x (target <= 3x, and p50 <= 8 s)")
    if not args.keep:
        slurmk8s("down", "--spec", str(work / "spec.yaml"), "--state", str(work / "state"), log=log)


if __name__ == "__main__":
    main()
