"""``slurmk8s toolchain ...`` and ``slurmk8s cluster ...``: thin wrappers over the scripts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from provisioner.errors import SlurmK8sError
from provisioner.localk8s import nodehost
from provisioner.localk8s.kwok import KwokNodeError, KwokNodeSpec, kwok_node_list, node_names, parse_key_values
from provisioner.localk8s.nodes import MAX_SLOT, NodeSpec, extra_node_names, make_spec, parse_labels_file, parse_taint
from provisioner.localk8s.scripts import CLUSTER_SCRIPT, TOOLCHAIN_SCRIPT, run_script, script_output
from provisioner.settings import Cli

toolchain_app = typer.Typer(
    help="Build the tools that are not in PyPI/Debian (Kubernetes, etcd, CoreDNS, kwok, helm, Pulumi CLI "
    "and provider) from the Go module proxy, cached under /var/cache/slurmk8s/toolchain.",
    no_args_is_help=True,
)
cluster_app = typer.Typer(
    help="A local Kubernetes made of host processes (state under /var/lib/slurmk8s/localk8s): one control "
    "plane, one node, and extra real nodes on request (`cluster node add`, `cluster up --nodes N`).",
    no_args_is_help=True,
)
node_app = typer.Typer(
    help="Extra real nodes of the local cluster on this host: each with its own kubelet and containerd "
    "(own socket, state, cgroup root, pod CIDR 198.18.<slot>.0/24 and ports), joined to the one control plane.",
    no_args_is_help=True,
)
kueue_app = typer.Typer(
    help="Real Kueue (the toolchain's `kueue` tool) on the local cluster, its webhooks restricted to the "
    "namespaces labelled slurmk8s.io/kueue=managed, plain Pods only.",
    no_args_is_help=True,
)
cluster_app.add_typer(node_app, name="node")
cluster_app.add_typer(kueue_app, name="kueue")


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
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=1 + MAX_SLOT,
                                       help="Real nodes in all: node 1 plus NODES-1 extra nodes named "
                                       "<node 1>-2 .. <node 1>-NODES (see `cluster node add`).")] = 1,
) -> None:
    """Start the local cluster (idempotent) and print the kubeconfig path; its own volumes whose claim
    was deleted are given back (see reclaim-volumes)."""
    _exit(run_script(CLUSTER_SCRIPT, ["up", *(["--kwok"] if kwok else [])]))
    host = _host()
    if nodes > 1 or nodehost.known_nodes(host):
        _node_call(lambda host: _up_extra_nodes(host, nodes))
    else:
        try:
            _delete_stale_node_objects(host)
        except Exception as err:  # noqa: BLE001 - the cluster is up; stale extra-node objects are cosmetic
            typer.echo(f"[cluster] warning: could not check for Node objects of removed extra nodes "
                       f"({type(err).__name__}: {err})", err=True)
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
    """Stop every daemon and pod container (also after an interrupted up). State is kept, except that
    every extra node (`cluster node add`) is removed."""
    try:
        _node_call(_remove_all_nodes)
        nodes_ok = True
    except typer.Exit:
        nodes_ok = False   # said why; node 1 and the control plane still go down
    _exit(run_script(CLUSTER_SCRIPT, ["down", *(["--purge"] if purge else [])]))
    _exit(0 if nodes_ok else 1)


@cluster_app.command("status")
def cluster_status() -> None:
    """Say what runs, and each node: Ready, pods, labels beyond the defaults, extended resources.
    Exit 0 running, 3 stopped, 4 partly running."""
    code = run_script(CLUSTER_SCRIPT, ["status"])
    if code == 0:
        _node_call(_print_nodes)
    _exit(code)


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
def cluster_load_image(
    images: Annotated[list[str], typer.Argument(help="Images from the local Docker engine.")],
    node: Annotated[str | None, typer.Option("--node", help="Only into this node (node 1's name or an extra "
                                             "node's); default: every node.")] = None,
) -> None:
    """Copy images from Docker into the containerd of every node (skipped where already loaded): each
    node has its own image store, as a real node would."""
    main = os.environ.get("LOCALK8S_NODE", "localk8s")
    if node is None or node == main:
        _exit(run_script(CLUSTER_SCRIPT, ["load-image", *images]))
    if node == main:
        return

    def load(host: nodehost.Host) -> None:
        targets = [lay for lay, _ in nodehost.known_nodes(host) if node is None or lay.name == node]
        if node is not None and not targets:
            nodehost.find_node(host, node)
        for lay in targets:
            if nodehost.pid_of(lay, "containerd") is None:
                _say(f"{lay.name}: containerd is stopped (slurmk8s cluster node start {lay.name}): skipped")
                if node is not None:
                    raise typer.Exit(1)
                continue
            for image in images:
                nodehost.load_docker_image(lay, image, _say)

    _node_call(load)


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


# ---- extra real nodes --------------------------------------------------------------------------------
def _say(line: str) -> None:
    typer.echo(f"[node] {line}")


def _bin_dir() -> Path:
    """The toolchain's binaries: SLURMK8S_BIN, else where toolchain.sh keeps them."""
    return Path(Cli.from_env(os.environ).bin or script_output(TOOLCHAIN_SCRIPT, ["path"]))


def _host() -> nodehost.Host:
    return nodehost.host_from_env(_bin_dir())


def _node_call(action) -> None:
    """Run an action on the extra nodes; errors become one line and exit status 1."""
    try:
        action(_host())
    except (SlurmK8sError, OSError) as err:
        typer.echo(f"[node] error: {err}", err=True)
        raise typer.Exit(1) from None


def node_spec_from_args(name: str, label: list[str] | None, labels_file: Path | None, resource: list[str] | None,
                        taint: list[str] | None) -> NodeSpec:
    """The node spec from `node add` arguments: file labels first, --label wins over them."""
    labels: dict[str, str] = {}
    if labels_file is not None:
        labels.update(parse_labels_file(labels_file.read_text(), str(labels_file)))
    labels.update(parse_key_values(label or [], "label"))
    return make_spec(name, labels, parse_key_values(resource or [], "resource"), [parse_taint(t) for t in taint or []])


def _up_extra_nodes(host: nodehost.Host, count: int) -> None:
    known = {lay.name: (lay, spec) for lay, spec in nodehost.known_nodes(host)}
    _delete_stale_node_objects(host)
    for name in extra_node_names(host.main_node, count):
        if name in known:
            lay, spec = known[name]
            nodehost.start_node(host, lay, spec, _say)
            _say(f"{name}: Ready")
        else:
            nodehost.add_node(host, make_spec(name, {}, {}, []), _say)
    extra = [n for n in known if n not in extra_node_names(host.main_node, count)]
    if extra:
        _say(f"also running, not counted in --nodes: {', '.join(extra)} (slurmk8s cluster node remove NAME)")


def _delete_stale_node_objects(host: nodehost.Host) -> None:
    for stale in nodehost.stale_node_objects(host):
        nodehost.core_api(host).delete_node(stale)
        _say(f"{stale}: Node object of a removed extra node deleted")


def _remove_all_nodes(host: nodehost.Host) -> None:
    api_up = nodehost.run(["curl", "-sfk", "--max-time", "3", f"{nodehost.api_server(host)}/readyz"],
                          check=False).returncode in (0, 22) if host.kubeconfig.exists() else False
    for lay, _ in nodehost.known_nodes(host):
        nodehost.remove_node(host, lay, _say, delete_object=api_up)


def _print_nodes(host: nodehost.Host) -> None:
    core = nodehost.core_api(host)
    pods: dict[str, int] = {}
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            pods[pod.spec.node_name] = pods.get(pod.spec.node_name, 0) + 1
    extra = {lay.name: lay for lay, _ in nodehost.known_nodes(host)}
    typer.echo("nodes:")
    for node in core.list_node().items:
        name = node.metadata.name
        if (node.metadata.annotations or {}).get("kwok.x-k8s.io/node") == "fake":
            continue
        ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "?")
        labels = {k: v for k, v in (node.metadata.labels or {}).items() if not k.startswith(DEFAULT_LABEL_PREFIXES)}
        resources = {k: v for k, v in (node.status.allocatable or {}).items() if "/" in k}
        lay = extra.pop(name, None)
        where = (f"slot {lay.slot} pods {lay.pod_cidr} kubelet :{lay.kubelet_port} "
                 f"{'running' if nodehost.pid_of(lay, 'kubelet') else 'stopped'}") if lay else "node 1"
        typer.echo(f"  {name:<20} Ready={ready:<7} pods={pods.get(name, 0):<3} {where}")
        if labels:
            typer.echo(f"  {'':<20} labels: {', '.join(f'{k}={v}' for k, v in sorted(labels.items()))}")
        if resources:
            typer.echo(f"  {'':<20} resources: {', '.join(f'{k}={v}' for k, v in sorted(resources.items()))}")
        taints = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in node.spec.taints or [])
        if taints:
            typer.echo(f"  {'':<20} taints: {taints}")
    for name in extra:
        typer.echo(f"  {name:<20} no Node object (state in {extra[name].dir}): slurmk8s cluster node start {name}")


DEFAULT_LABEL_PREFIXES = ("kubernetes.io/", "beta.kubernetes.io/", nodehost.N.EXTRA_NODE_LABEL)


@node_app.command("add")
def node_add(
    name: Annotated[str, typer.Argument(help="Node name (lowercase DNS name, at most 63 characters).")],
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="KEY=VALUE, repeatable.")] = None,
    labels_file: Annotated[Path | None, typer.Option("--labels-file", exists=True, dir_okay=False,
                                                     help="Labels: a YAML/JSON mapping or KEY=VALUE lines.")] = None,
    resource: Annotated[list[str] | None, typer.Option(
        "--resource", "-r", help="Extended resource NAME=QUANTITY on the node's capacity and allocatable "
        "(e.g. example.com/gpu=4), repeatable; set again at every start.")] = None,
    taint: Annotated[list[str] | None, typer.Option(
        "--taint", help="KEY[=VALUE]:EFFECT, set from the node's first registration, repeatable.")] = None,
    image: Annotated[list[str] | None, typer.Option(
        "--image", help="Copy this image from node 1's containerd, repeatable (later: cluster load-image).")] = None,
) -> None:
    """Join one more real node to the local cluster: own kubelet and containerd on this host. Prints
    the time from the command's start to node Ready."""
    try:
        spec = node_spec_from_args(name, label, labels_file, resource, taint)
    except KwokNodeError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _node_call(lambda host: nodehost.add_node(host, spec, _say, image or []))


@node_app.command("remove")
def node_remove(name: Annotated[str, typer.Argument(help="An extra node's name.")]) -> None:
    """Delete an extra node: its pods' containers, kubelet, containerd, Node object, bridge, iptables
    rules, cgroups and state."""
    _node_call(lambda host: nodehost.remove_node(host, nodehost.find_node(host, name)[0], _say))


@node_app.command("stop")
def node_stop(name: Annotated[str, typer.Argument(help="An extra node's name.")]) -> None:
    """Stop the node's kubelet and containerd, its pods' containers left running: a lost node (NotReady
    after the 40 s node-monitor grace period, its pods evicted after 300 s)."""
    _node_call(lambda host: nodehost.stop_node(host, nodehost.find_node(host, name)[0], _say))


@node_app.command("start")
def node_start(name: Annotated[str, typer.Argument(help="An extra node's name.")]) -> None:
    """Start the node's containerd and kubelet again; wait for Ready; set its labels and extended
    resources again."""
    def start(host: nodehost.Host) -> None:
        lay, spec = nodehost.find_node(host, name)
        times = nodehost.start_node(host, lay, spec, _say)
        _say(f"{name}: Ready {times['ready']:.1f} s after the start")

    _node_call(start)


@node_app.command("list")
def node_list() -> None:
    """Each node: Ready, pods, labels beyond the defaults, extended resources, taints."""
    _node_call(_print_nodes)


@node_app.command("memory")
def node_memory() -> None:
    """RSS of each extra node's kubelet, containerd and container shims (from /proc)."""
    def show(host: nodehost.Host) -> None:
        for lay, _ in nodehost.known_nodes(host):
            rss = nodehost.memory_rss_kib(host, lay)
            parts = ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in rss.items())
            typer.echo(f"{lay.name}: {sum(rss.values()) / 1024:.0f} MiB ({parts})")

    _node_call(show)


# ---- Kueue --------------------------------------------------------------------------------------------
def _kueue_call(action):  # noqa: ANN001, ANN202 - (paths, kubectl) -> result
    from provisioner.localk8s import kueue

    bin_dir = _bin_dir()
    state_dir = Path(os.environ.get("LOCALK8S_ROOT", "/var/lib/slurmk8s/localk8s"))
    kubeconfig = Path(os.environ.get("KUBECONFIG") or script_output(CLUSTER_SCRIPT, ["kubeconfig"]))
    paths = kueue.lab_paths(bin_dir, state_dir, kubeconfig)
    try:
        return action(kueue, paths, kueue.Kubectl(paths.kubectl, paths.kubeconfig))
    except (SlurmK8sError, OSError, subprocess.TimeoutExpired) as err:
        typer.echo(f"[kueue] error: {err}", err=True)
        raise typer.Exit(1) from None


def _kueue_say(line: str) -> None:
    typer.echo(f"[kueue] {line}")


@kueue_app.command("up")
def kueue_up(
    timeout: Annotated[int, typer.Option(help="Seconds to wait for the manager Ready.")] = 240,
) -> None:
    """Build the Kueue image (FROM the base image, with the toolchain's binary) when missing, load it
    into every node, apply Kueue and wait until the manager is Ready and its webhooks serve.
    Idempotent: an unchanged, serving Kueue is left alone."""
    _kueue_call(lambda k, paths, kubectl: k.up(
        paths, kubectl, lambda tag: cluster_load_image([tag], None), _kueue_say, timeout=timeout,
        base_image=Cli.from_env(os.environ).base_image))


@kueue_app.command("down")
def kueue_down() -> None:
    """Delete Kueue's objects (its pods' Workloads, LocalQueues, ClusterQueues, ResourceFlavors, ...)
    while the manager still removes their finalizers, then Kueue itself. The namespaces keep their
    label. Idempotent."""
    _kueue_call(lambda k, paths, kubectl: k.down(paths, kubectl, _kueue_say))


@kueue_app.command("status")
def kueue_status() -> None:
    """Say whether Kueue is up, and its version. Exit 0 up, 3 down, 4 partly (e.g. scaled to 0)."""
    got = _kueue_call(lambda k, paths, kubectl: k.status(paths, kubectl, _kueue_say))
    _exit(got.state.value)
