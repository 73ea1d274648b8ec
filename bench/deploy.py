"""A benchmark's own cluster, from nothing and back (bench/load_10k.py, bench/queue_32k.py and
bench/bursty_day.py deploy with it).

The cluster `name` lives in namespace slurm-<name> with its own static hostPath volumes
(/var/lib/slurmk8s/volumes/<name>, labelled slurmk8s.io/e2e=<name>) and its own Pulumi state under
`work`. A namespace of that name an earlier run of the same kind left (label
slurmk8s.io/made-by=<made_by>) is removed first; any other is refused (the process exits with the
reason), never touched.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from helpers import (LOCAL_KUBECONFIG, NotOurs, apply_static_volumes, clear_leftover, kubeconfig,  # noqa: E402
                     kubectl, mark_made_by, slurmk8s)

MADE_BY = "bench"  # the label value every benchmark's namespace carries (docs/testing.md)


def namespace_of(name: str) -> str:
    return f"slurm-{name}"


def from_nothing(name: str, work: Path, made_by: str = MADE_BY) -> None:
    """No namespace, Slurm state or volumes left from an earlier run; the StorageClass and this
    cluster's static volumes applied. A namespace this kind of run did not make: exit, untouched."""
    try:
        clear_leftover(namespace_of(name), made_by)
    except NotOurs as err:
        sys.exit(f"cannot run: {err}")
    kubectl("delete", "pv", "-l", f"slurmk8s.io/e2e={name}", "--ignore-not-found", "--wait=true", timeout=120)
    if kubeconfig() == LOCAL_KUBECONFIG:
        shutil.rmtree(f"/var/lib/slurmk8s/volumes/{name}", ignore_errors=True)
    shutil.rmtree(work / "state", ignore_errors=True)  # the stack of the cluster just removed
    work.mkdir(parents=True, exist_ok=True)
    apply_static_volumes(name, namespace_of(name), work / "volumes.json")


def up(spec: dict[str, Any], work: Path, made_by: str = MADE_BY, *, cleared: bool = False) -> float:
    """Write `spec` to work/spec.yaml and `slurmk8s up` it from nothing (work/slurmk8s.log); the
    namespace is labelled as this run's even when `up` fails. Exits on failure; returns the seconds
    `up` took. `cleared`: the caller ran :func:`from_nothing` itself, then made what the cluster
    needs beforehand (a namespace with a Kueue LocalQueue)."""
    name = str(spec["name"])
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    log = work / "slurmk8s.log"
    if not cleared:
        from_nothing(name, work, made_by)
    t0 = time.monotonic()
    try:
        failed = slurmk8s("up", "--spec", str(work / "spec.yaml"), "--state", str(work / "state"), log=log).returncode
    finally:
        mark_made_by(namespace_of(name), made_by)
    if failed:
        sys.exit(f"slurmk8s up failed: see {log}")
    return time.monotonic() - t0


def down(name: str, work: Path, made_by: str = MADE_BY) -> None:
    """`slurmk8s down --purge` of the cluster `up` made, then its namespace if anything is left."""
    slurmk8s("down", "--spec", str(work / "spec.yaml"), "--state", str(work / "state"), "--purge", "--yes",
             log=work / "slurmk8s.log")
    clear_leftover(namespace_of(name), made_by)
