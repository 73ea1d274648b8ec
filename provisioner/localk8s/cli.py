"""``slurmk8s toolchain ...`` and ``slurmk8s cluster ...``: thin wrappers over the scripts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from provisioner.localk8s.kwok import KwokNodeError, KwokNodeSpec, kwok_node_list, node_names, parse_key_values
from provisioner.localk8s.scripts import CLUSTER_SCRIPT, TOOLCHAIN_SCRIPT, run_script, script_output

toolchain_app = typer.Typer(
    help="Build the tools that are not in PyPI/Debian (Kubernetes, etcd, CoreDNS, kwok, helm, Pulumi CLI "
    "and provider) from the Go module proxy, cached under /var/cache/slurmk8s/toolchain.",
    no_args_is_help=True,
)
cluster_app = typer.Typer(
    help="A single-node local Kubernetes made of host processes (state under /var/lib/slurmk8s/localk8s).",
    no_args_is_help=True,
)


def _exit(code: int) -> None:
    if code != 0:
        raise typer.Exit(code)


# ---- toolchain ------------------------------------------------------------------------------------
@toolchain_app.command("build")
def toolchain_build(
    tools: Annotated[list[str] | None, typer.Argument(help="Only these tools (default: all).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Go build parallelism (-p).")] = 2,
) -> None:
    """Build what is missing; cached tools are skipped. Prints the bin dir to put on PATH."""
    _exit(run_script(TOOLCHAIN_SCRIPT, ["build", *(tools or [])], env={"TOOLCHAIN_JOBS": str(jobs)}))


@toolchain_app.command("path")
def toolchain_path() -> None:
    """Print the stable bin directory (put it on PATH)."""
    typer.echo(script_output(TOOLCHAIN_SCRIPT, ["path"]))


@toolchain_app.command("env")
def toolchain_env() -> None:
    """Print shell exports for PATH and PULUMI_HOME (eval "$(slurmk8s toolchain env)")."""
    _exit(run_script(TOOLCHAIN_SCRIPT, ["env"]))


@toolchain_app.command("check")
def toolchain_check() -> None:
    """Exit 0 when every tool is built, else name what is missing."""
    _exit(run_script(TOOLCHAIN_SCRIPT, ["check"]))


# ---- cluster --------------------------------------------------------------------------------------
@cluster_app.command("up")
def cluster_up(
    kwok: Annotated[bool, typer.Option("--kwok", help="Also start the kwok controller for fake nodes.")] = False,
) -> None:
    """Start the local cluster (idempotent) and print the kubeconfig path; its own volumes whose claim
    was deleted are given back (see reclaim-volumes)."""
    _exit(run_script(CLUSTER_SCRIPT, ["up", *(["--kwok"] if kwok else [])]))
    try:
        give_back_volumes(None, dry_run=False, quiet=True)
    except Exception as err:  # noqa: BLE001 - the cluster is up; the volumes are a convenience on top
        typer.echo(f"[cluster] warning: could not check the local volumes ({type(err).__name__}: {err}); "
                   "`slurmk8s cluster reclaim-volumes` retries", err=True)


def give_back_volumes(namespace: str | None, *, dry_run: bool, quiet: bool = False) -> int:
    """The local cluster's own volumes (hostPath under /var/lib/slurmk8s/volumes) that are Released
    and whose claim is gone: delete their old data and make them Available for a new claim of the
    same name. Returns the number of problems."""
    from provisioner import volumes
    from provisioner.kubeapi import api_client

    api = api_client(str(volumes.localk8s_root() / "kubeconfig"))
    pvs, claims = volumes.read_volumes_and_claims(api, namespace)
    items = volumes.reclaimable(pvs, claims, namespace=namespace)
    if not items:
        if not quiet:
            typer.echo("no local volume is held by a deleted claim" + (f" of namespace {namespace}" if namespace else ""))
        return 0
    if dry_run:
        for item in items:
            typer.echo(f"would give back {item.describe()} (deleting its old data)")
        return 0
    _, problems = volumes.reclaim(api, items, lambda line: typer.echo(f"[cluster] {line}"))
    for problem in problems:
        typer.echo(f"[cluster] error: {problem}", err=True)
    return len(problems)


@cluster_app.command("reclaim-volumes")
def cluster_reclaim_volumes(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only volumes reserved for claims of "
                                                   "this namespace.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be given back; change nothing.")] = False,
) -> None:
    """Give the local cluster's own volumes back once their claim is deleted (e.g. by `slurmk8s down
    --purge`): their old data is deleted and they become Available for a new claim of the same name,
    as with a provisioner whose reclaim policy is Delete. `cluster up` and `slurmk8s up` (for its own
    claims) do it too."""
    from provisioner.errors import SlurmK8sError

    try:
        _exit(1 if give_back_volumes(namespace, dry_run=dry_run) else 0)
    except SlurmK8sError as err:
        typer.echo(f"[cluster] error: {err}. Fix: start the local cluster (`slurmk8s cluster up`)", err=True)
        raise typer.Exit(1) from None


@cluster_app.command("down")
def cluster_down(
    purge: Annotated[bool, typer.Option("--purge", help="Also delete the cluster state (etcd, PKI, images).")] = False,
) -> None:
    """Stop every daemon and pod container (also after an interrupted up). State is kept."""
    _exit(run_script(CLUSTER_SCRIPT, ["down", *(["--purge"] if purge else [])]))


@cluster_app.command("status")
def cluster_status() -> None:
    """Say what runs. Exit 0 running, 3 stopped, 4 partly running."""
    _exit(run_script(CLUSTER_SCRIPT, ["status"]))


RESTARTABLE = ("kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler")


@cluster_app.command("restart")
def cluster_restart(
    component: Annotated[str, typer.Argument(help=f"One of: {', '.join(RESTARTABLE)}.")],
    down_for: Annotated[int, typer.Option("--down-for", min=0, help="Seconds to keep it stopped.")] = 0,
) -> None:
    """Stop one daemon and start it again (an outage for fault tests); pods and state are kept."""
    if component not in RESTARTABLE:
        raise typer.BadParameter(f"{component!r} cannot be restarted alone; use one of {', '.join(RESTARTABLE)}")
    _exit(run_script(CLUSTER_SCRIPT, ["restart", component, "--down-for", str(down_for)]))


@cluster_app.command("load-image")
def cluster_load_image(images: Annotated[list[str], typer.Argument(help="Images from the local Docker engine.")]) -> None:
    """Copy images from Docker into the cluster's containerd (skipped when already loaded)."""
    _exit(run_script(CLUSTER_SCRIPT, ["load-image", *images]))


@cluster_app.command("kubeconfig")
def cluster_kubeconfig() -> None:
    """Print the kubeconfig path of the local cluster."""
    typer.echo(script_output(CLUSTER_SCRIPT, ["kubeconfig"]))


@cluster_app.command("kwok")
def cluster_kwok(action: Annotated[str, typer.Argument(help="up, down or status")] = "up") -> None:
    """Start/stop the kwok controller (manages nodes annotated kwok.x-k8s.io/node=fake)."""
    if action not in ("up", "down", "status"):
        raise typer.BadParameter("action must be up, down or status")
    _exit(run_script(CLUSTER_SCRIPT, ["kwok", action]))


@cluster_app.command("kwok-node")
def cluster_kwok_node(
    name: Annotated[str, typer.Argument(help="Node name; with --count N the nodes are NAME-0 .. NAME-(N-1).")],
    count: Annotated[int, typer.Option(help="How many nodes.")] = 1,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="KEY=VALUE, repeatable.")] = None,
    cpu: Annotated[str, typer.Option(help="CPU capacity.")] = "32",
    memory: Annotated[str, typer.Option(help="Memory capacity.")] = "256Gi",
    pods: Annotated[str, typer.Option(help="Pod capacity.")] = "110",
    resource: Annotated[
        list[str] | None, typer.Option("--resource", "-r", help="Extra capacity NAME=QUANTITY (e.g. nvidia.com/gpu=8).")
    ] = None,
    taint: Annotated[
        bool, typer.Option("--taint/--no-taint", help="NoSchedule taint kwok.x-k8s.io/node=fake keeps real pods off.")
    ] = True,
) -> None:
    """Add fake nodes with the given labels and capacity (starts the kwok controller if needed)."""
    try:
        labels = parse_key_values(label or [], "label")
        capacity = {"cpu": cpu, "memory": memory, "pods": pods, **parse_key_values(resource or [], "resource")}
        specs = [KwokNodeSpec(name=n, labels=labels, capacity=capacity, taint=taint) for n in node_names(name, count)]
        manifest = kwok_node_list(specs)
    except KwokNodeError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _exit(run_script(CLUSTER_SCRIPT, ["kwok", "up"]))
    kubectl = Path(script_output(TOOLCHAIN_SCRIPT, ["path"])) / "kubectl"
    kubeconfig = script_output(CLUSTER_SCRIPT, ["kubeconfig"])
    done = subprocess.run(
        [str(kubectl), "apply", "-f", "-"],
        input=json.dumps(manifest),
        text=True,
        env={**os.environ, "KUBECONFIG": kubeconfig},
        check=False,
    )
    _exit(done.returncode)
