"""A pool's own software (docs/pool-images.md), on the session cluster, as a researcher does it:

- a pool on `slurmk8s/mariadb:dev` (in the cluster, but not a worker image) is refused by `up` with
  the pool, the image and what it is, nothing applied (the objects' versions unchanged, no check pod
  left), and by `preview` from the image's labels;
- an image built FROM slurmk8s/slurmd:dev that adds the Debian package `jq` (`docker build`, apt from
  Debian's mirror as images/build.sh uses it), loaded with `slurmk8s cluster load-image`, on a new
  pool `bio`: `up` checks it and goes on; a job on `bio` runs `jq`, a job on the default pool `cpu`
  finds no `jq`; the health check passes on the derived image (the node ALLOCATED, not DRAIN); then
  the pool goes back to rest and the spec is restored.

Expected time: about 2.5 min on the local cluster (build ~15 s with apt, load ~10 s, three `up`s, a
resume, the pool back at rest ~40 s). Needs the local cluster (`load-image`) and a Docker engine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

from faultkit import nodes, pool_pods, queue, wait_pool_at_rest
from helpers import (LOCAL_KUBECONFIG, NAMESPACE, Cluster, kjson, kubeconfig, kubectl, slurmk8s, submit, wait_for,
                     wait_job)
from provisioner.deploy.imagecheck import IMAGE_INTERFACE

pytestmark = pytest.mark.e2e

BASE = "slurmk8s/slurmd:dev"
POOL = "bio"
SMALL = {"mode": "slots", "cpus": 1, "memory": "1Gi", "pod_cpu_request": "50m", "pod_memory_request": "128Mi"}
CONTAINERFILE = f"""FROM {BASE}
RUN set -eux; \\
    apt-get update; \\
    apt-get install -y --no-install-recommends jq; \\
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt/* /var/log/dpkg.log
"""


def _docker(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def _said(cluster: Cluster, command: str) -> str:
    return cluster.log.read_text().rsplit(f"$ slurmk8s {command}", 1)[-1]


def _versions() -> dict[str, str]:
    objs = kjson("get", "deployments,statefulsets,secrets,configmaps", "-n", NAMESPACE)["items"]
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"].get("generation") or o["metadata"]["resourceVersion"]
            for o in objs}


def _check_pods(said: str) -> list[str]:
    """The check pods that the `up` which said `said` started and that still exist. Only its own:
    another xdist worker's `up` may be checking its images at the same moment."""
    named = {n for group in re.findall(r"\[pods ([^\]]+)\]", said) for n in group.split()}
    assert named, f"`up` names its check pods:\n{said[-3000:]}"
    live = {p["metadata"]["name"] for p in kjson("get", "pods", "-A", "-l", "app.kubernetes.io/component=image-check")
            ["items"]}
    return sorted(named & live)


def _spec_with(cluster: Cluster, tmp_path, name: str, pool: dict) -> str:
    spec = yaml.safe_load(cluster.spec_path.read_text())
    spec["pools"].append(pool)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_a_pool_on_an_image_that_is_not_a_worker_image_is_refused_before_anything_is_applied(cluster: Cluster,
                                                                                            tmp_path):
    path = _spec_with(cluster, tmp_path, "db-pool", {"name": "db", **SMALL, "image": "slurmk8s/mariadb:dev",
                                                         "domains": [{"name": "local", "count": 1}]})
    before = _versions()
    t0 = time.monotonic()
    proc = slurmk8s("up", "--spec", path, "--state", str(cluster.state), log=cluster.log)
    said = _said(cluster, "up")
    print(f"pool on slurmk8s/mariadb:dev refused by `up` in {time.monotonic() - t0:.1f} s")
    assert proc.returncode != 0, said[-3000:]
    assert "the spec names images that cannot serve their role (nothing was applied)" in said, said[-3000:]
    assert "pools[db].image: slurmk8s/mariadb:dev is not a slurmk8s worker image" in said, said[-3000:]
    assert "the slurmk8s mariadb image" in said, said[-3000:]  # identified (rebuilt) or logged as (older build)
    assert "Fix: build it FROM slurmk8s/slurmd:dev" in said and "docs/pool-images.md" in said, said[-3000:]
    assert _versions() == before, "a refused `up` must not change the cluster"
    assert "still terminating" not in said, said[-3000:]
    assert _check_pods(said) == [], "the check pods must be gone"

    if shutil.which("docker") and _docker("image", "inspect", "slurmk8s/mariadb:dev").returncode == 0:
        proc = slurmk8s("preview", "--spec", path, "--state", str(cluster.state), log=cluster.log)
        said = _said(cluster, "preview")
        assert proc.returncode != 0, said[-3000:]
        assert ("pools[db].image: slurmk8s/mariadb:dev is not a slurmk8s worker image: it is the slurmk8s mariadb "
                "image (org.slurmk8s.image=mariadb in the labels of the local Docker engine's copy)") in said, said[-3000:]


def test_a_derived_image_with_a_package_runs_its_pools_jobs_and_passes_the_health_check(cluster: Cluster, tmp_path):
    if kubeconfig() != LOCAL_KUBECONFIG:
        pytest.skip("loads the image with `slurmk8s cluster load-image`: the local cluster only")
    if not shutil.which("docker") or _docker("image", "inspect", BASE).returncode != 0:
        pytest.fail(f"needs a Docker engine with {BASE} (images/build.sh)")
    base_id = _docker("image", "inspect", "-f", "{{.Id}}", BASE).stdout.strip()
    image = f"slurmk8s-e2e/slurmd-jq:{base_id.split(':')[-1][:12]}"  # a new base -> a new tag, checked again
    (tmp_path / "Containerfile").write_text(CONTAINERFILE)
    classic = {} if _docker("buildx", "version").returncode == 0 else {"DOCKER_BUILDKIT": "0"}
    t0 = time.monotonic()
    built = _docker("build", "-f", str(tmp_path / "Containerfile"), "-t", image, str(tmp_path), env=classic)
    assert built.returncode == 0, f"docker build failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    labels = json.loads(_docker("image", "inspect", "-f", "{{json .Config.Labels}}", image).stdout)
    assert labels.get("org.slurmk8s.image") == "slurmd", f"labels are inherited from the base: {labels}"
    t_build = time.monotonic() - t0
    proc = slurmk8s("cluster", "load-image", image, log=cluster.log)
    assert proc.returncode == 0, _said(cluster, "cluster load-image")[-3000:]
    t_load = time.monotonic() - t0 - t_build

    original = cluster.spec_path.read_text()
    path = _spec_with(cluster, tmp_path, "bio-pool", {"name": POOL, **SMALL, "image": image,
                                                            "domains": [{"name": "local", "count": 1}]})
    t1 = time.monotonic()
    proc = slurmk8s("up", "--spec", path, "--state", str(cluster.state), log=cluster.log)
    said = checked = _said(cluster, "up")
    assert proc.returncode == 0, said[-4000:]
    identified = "org.slurmk8s.interface" in labels
    assert (f"image check: {image}: slurmk8s slurmd image (interface {IMAGE_INTERFACE}" if identified
            else f"image check: {image}: slurmk8s slurmd image from before image identity") in said, said[-4000:]
    print(f"derived image: built in {t_build:.1f} s, loaded in {t_load:.1f} s, `up` with the new pool "
          f"{time.monotonic() - t1:.1f} s")
    try:
        login = cluster.login()
        bio = submit(login, f"#!/bin/bash\n#SBATCH -p {POOL} -o bio-%j.out\n"
                            "jq -n --arg p \"$SLURM_JOB_PARTITION\" '{pool: $p, jq: true}' -c\nsleep 20\n")
        cpu = submit(login, "#!/bin/bash\n#SBATCH -p cpu -o cpu-%j.out\n"
                            "command -v jq || echo 'no jq here'\n")

        # while the bio job runs (20 s: slurmd's own health check runs every 15 s too): the health check on
        # the derived image passes, the node is ALLOCATED
        def running():
            job = queue(login, [bio]).get(bio)
            return job["nodes"] if job and job["job_state"] == ["RUNNING"] else None

        node = wait_for(f"job {bio} running on pool {POOL}", running, 150, interval=1)
        pod = pool_pods(POOL)[node]
        assert pod["spec"]["containers"][0]["image"] == image
        health = kubectl("exec", "-n", NAMESPACE, node, "-c", "slurmd", "--",
                         "slurmk8s-healthcheck", "--no-drain", "--json", check=False)
        assert health.returncode == 0, f"health check on the derived image:\n{health.stdout}\n{health.stderr}"
        state = nodes(login, POOL)[node]["state"]
        assert "ALLOCATED" in state and "DRAIN" not in state, state

        assert wait_job(login, bio, 120)["job_state"] == ["COMPLETED"]
        assert wait_job(login, cpu, 150)["job_state"] == ["COMPLETED"]
        assert login.run(f"cat bio-{bio}.out").stdout.strip() == '{"pool":"bio","jq":true}'
        assert login.run(f"cat cpu-{cpu}.out").stdout.strip() == "no jq here", "the default pool has no jq"
        state = nodes(login, POOL)[node]["state"]
        assert "DRAIN" not in state, f"{state}: {nodes(login, POOL)[node].get('reason')}"
        wait_pool_at_rest(login, POOL)
    finally:
        cluster.spec_path.write_text(original)
        proc = slurmk8s("up", "--spec", str(cluster.spec_path), "--state", str(cluster.state), log=cluster.log)
        assert proc.returncode == 0, _said(cluster, "up")[-3000:]
    assert _check_pods(checked) == []
