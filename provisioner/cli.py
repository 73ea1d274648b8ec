"""The `slurmk8s` command line. Thin: parses arguments, calls the layers below, prints results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn, Optional

import typer

app = typer.Typer(
    name="slurmk8s",
    help="Ephemeral Slurm clusters on Kubernetes capacity.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# Sub-command groups are registered below, one line each (keep this list sorted by name).
# --- sub-apps ---
from provisioner.localk8s import cluster_app, toolchain_app  # noqa: E402
app.add_typer(cluster_app, name="cluster")
app.add_typer(toolchain_app, name="toolchain")
from provisioner.images import images_app  # noqa: E402
app.add_typer(images_app, name="images")
from provisioner.deploy.commands import register as _register_deploy  # noqa: E402  (up, preview, down, outputs)
_register_deploy(app)
from provisioner.usercli import register as _register_user  # noqa: E402  (submit, ssh, token)
_register_user(app)
# --- end sub-apps ---


spec_app = typer.Typer(help="The cluster spec: schema and validation.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")


def _fail(err: Exception | str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(code)


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON schema of the cluster spec."""
    from .config import json_schema

    typer.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


@spec_app.command("chart-schema")
def spec_chart_schema() -> None:
    """Print the Helm chart's values schema (charts/slurmk8s/values.schema.json is this output)."""
    from .chart import values_schema_text

    typer.echo(values_schema_text(), nl=False)


@spec_app.command("docs")
def spec_docs() -> None:
    """Print the spec reference as Markdown (docs/spec.md is this output)."""
    from .specdoc import spec_markdown

    typer.echo(spec_markdown(), nl=False)


@spec_app.command("validate")
def spec_validate(spec: Path = typer.Argument(..., help="Cluster spec YAML.")) -> None:
    """Validate a cluster spec; prints each problem with its field and fix."""
    from .config import load_spec
    from .errors import SlurmK8sError

    try:
        loaded = load_spec(spec)
    except SlurmK8sError as err:
        _fail(err)
    typer.echo(f"{spec}: valid (cluster {loaded.name}, {len(loaded.pools)} pool(s), {len(loaded.users)} user(s))")


@app.command()
def render(
    spec: Path = typer.Option(..., "--spec", help="Cluster spec YAML."),
    nodes: Path = typer.Option(..., "--nodes", help="Kubernetes nodes as `kubectl get nodes -o json` prints them."),
    out: Path = typer.Option(..., "--out", help="Directory to write the files into."),
    cluster_domain: str = typer.Option("cluster.local", help="The Kubernetes cluster's DNS domain."),
    controller_host: Optional[str] = typer.Option(None, help="Hostname of slurmctld, when not on Kubernetes "
                                                  "(default: its pod, slurmctld-0)."),
    controller_addr: Optional[str] = typer.Option(None, help="Address of slurmctld, if not its hostname."),
) -> None:
    """Write slurm.conf, topology.conf, gres.conf (+ gres-slurmctld.conf), passwd, group and inventory.json
    (all or nothing)."""
    from .config import load_spec
    from .errors import SlurmK8sError
    from dataclasses import replace

    from .generate import generate, kubernetes_site
    from .inventory import nodes_from_api
    from .render import write_files

    try:
        loaded = load_spec(spec)
        try:
            raw = json.loads(nodes.read_text())
        except (OSError, ValueError) as err:
            _fail(f"--nodes {nodes}: cannot read a JSON node list ({err}); "
                  "create it with `kubectl get nodes -o json > nodes.json`")
        # exactly the files `up` deploys (generate_for_kubernetes), unless told to name the controller otherwise
        site = kubernetes_site(loaded, cluster_domain)
        if controller_host or controller_addr:
            site = replace(site, controller_host=controller_host or site.controller_host, controller_addr=controller_addr)
        result = generate(loaded, nodes_from_api(raw), site)
    except SlurmK8sError as err:
        _fail(err)
    for path in write_files(result.files, out):
        typer.echo(f"wrote {path}")
    inv = result.inventory
    typer.echo(f"{len(inv.nodes)} Slurm node(s) in {len({n.pool for n in inv.nodes})} pool(s), "
               f"topology {result.topology.plugin}")
    for ex in inv.excluded:
        typer.echo(f"left out Kubernetes node {ex.k8s_node} (pool {ex.pool}): {ex.reason}")
    for notice in result.topology.notices:
        typer.echo(f"notice: {notice}")
    for node in inv.nodes:
        if node.unavailable:
            typer.echo(f"drained {node.name}: {node.unavailable}")


@app.command()
def status(
    spec: Optional[Path] = typer.Option(None, "--spec", help="Cluster spec YAML (its namespace is shown)."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="The cluster's namespace "
                                            "(instead of --spec), e.g. slurm-research."),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", help="kubeconfig (default: $KUBECONFIG, "
                                             "else ~/.kube/config)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (for scripts)."),
) -> None:
    """The cluster on one screen: awake/asleep, queue, nodes (drained ones with their reason), worker
    pods, volumes and node-seconds since `up`. Exit 1 when the controller does not answer."""
    from rich.console import Console

    from .errors import SlurmK8sError
    from .status import StatusError, gather, kube_reader, render

    if (spec is None) == (namespace is None):
        _fail("give either --spec SPEC or --namespace NAMESPACE")
    ns = namespace or ""
    if spec is not None:
        from .config import load_spec

        try:
            ns = load_spec(spec).namespace_name
        except SlurmK8sError as err:
            _fail(err)
    try:
        result = gather(kube_reader(kubeconfig), ns)
    except StatusError as err:
        _fail(err)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        render(result, Console())
    if result.errors:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
