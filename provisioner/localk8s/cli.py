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
    """Start the local cluster (idempotent) and print the kubeconfig path."""
    _exit(run_script(CLUSTER_SCRIPT, ["up", *(["--kwok"] if kwok else [])]))


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
