"""`slurmk8s up | preview | down | outputs | stack-secrets`: thin typer commands over
:mod:`provisioner.deploy.automation` (imported when a command runs, not at import time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer

SpecOpt = Annotated[Path, typer.Option("--spec", help="Cluster spec YAML.")]
KubeOpt = Annotated[Optional[str], typer.Option(
    "--kubeconfig", help="kubeconfig of the target cluster (default: the one the stack was deployed with, "
    "else $KUBECONFIG, else ~/.kube/config).")]
StateOpt = Annotated[Optional[Path], typer.Option(
    "--state", help="State directory (file backend, stack config, passphrase); default ~/.slurmk8s/state "
    "or $SLURMK8S_STATE_DIR.")]
StackOpt = Annotated[Optional[str], typer.Option("--stack", help="Stack name (default: the cluster's name).")]
WaitOpt = Annotated[bool, typer.Option(
    "--wait/--no-wait", help="Wait for slurmctld and login to be ready (--no-wait: pulumi.com/skipAwait).")]
RepairOpt = Annotated[bool, typer.Option(
    "--repair", help="First remove the stack's lock and pending operations whoever left them, then refresh (an "
    "interrupted run on this host is repaired without it).")]
TakeOverOpt = Annotated[bool, typer.Option(
    "--take-over", help="The namespace is owned by another stack whose state directory is lost for good: make this "
    "stack its owner (up keeps the cluster's running keys).")]


def _automation() -> Any:
    """provisioner.deploy.automation, or a clear error when the Pulumi SDKs (the 'deploy' extra) are missing."""
    try:
        from . import automation
    except ImportError as err:
        typer.echo(f"error: {err.name or err}: the Pulumi SDKs are not installed. Fix: pip install 'slurmk8s[deploy]' "
                   "(pulumi==3.272.0, pulumi-kubernetes==4.25.0)", err=True)
        raise typer.Exit(2) from None
    return automation


def _echo_line(line: str) -> None:
    typer.echo(line.rstrip("\n"))


def _fail(err: Exception, code: int = 2) -> NoReturn:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(130 if getattr(err, "reason", "") == "Interrupted" else code)


def _session(spec: Path, *, state: Optional[Path], stack: Optional[str], kubeconfig: Optional[str],
             need_cluster: bool) -> Any:
    from ..errors import SlurmK8sError
    a = _automation()

    try:
        return a.open_session(spec, state=state, stack_name=stack, kubeconfig=kubeconfig, need_cluster=need_cluster)
    except SlurmK8sError as err:
        _fail(err)


def _owner_check(session: Any, op: str, take_over: bool = False) -> None:
    """Before anything is applied or deleted: this stack must own the cluster's namespace, or may take
    it (provisioner/deploy/owner.py). Raises NotOwner (a SlurmK8sError) otherwise."""
    from . import owner

    decision = owner.check(session, op, _echo_line, take_over=take_over)
    if op == "up" and decision.took_over:
        a = _automation()
        owner.adopt_keys(session, _echo_line, store=lambda key, value: a.set_secret_config(session, key, value))


def _report(op: str, result: Any, session: Any) -> None:
    a = _automation()

    changes = ", ".join(f"{k} {v}" for k, v in sorted(result.changes.items())) or "no changes"
    typer.echo(f"{op}: {result.summary or 'done'} - {changes}; engine {result.seconds:.1f}s, "
               f"wall {result.wall:.1f}s (" + ", ".join(f"{k} {v:.1f}s" for k, v in session.timings.items()) + ")")
    typer.echo(a.describe_versions(session))


def _print_outputs(outputs: dict[str, Any]) -> None:
    for key in sorted(outputs):
        value = outputs[key]
        typer.echo(f"  {key}: {value if isinstance(value, str) else json.dumps(value)}")


def up(spec: SpecOpt, kubeconfig: KubeOpt = None, state: StateOpt = None, stack: StackOpt = None,
       wait: WaitOpt = True, repair: RepairOpt = False,
       diff: Annotated[bool, typer.Option("--diff", help="Show a detailed diff.")] = False,
       take_over: TakeOverOpt = False) -> None:
    """Create or update the cluster (Pulumi Automation API, local state)."""
    from ..errors import SlurmK8sError
    a = _automation()

    session = _session(spec, state=state, stack=stack, kubeconfig=kubeconfig, need_cluster=True)
    try:
        _owner_check(session, "up", take_over)
        if repair:
            a.repair(session, _echo_line)
        else:  # what an interrupted run left: its processes, its lock, pending operations
            a.recover(session, _echo_line)
        a.preflight(session, _echo_line, database=True, reclaim=True, images="pods")
        made = a.ensure_stack_config(session, wait=wait, spec_path=spec)
        if made:
            typer.echo(f"generated and stored (encrypted) in the stack config: {', '.join(made)}")
        result = a.up(session, _echo_line, diff=diff)
        if wait:  # Pulumi's StatefulSet await can take the old revision's status for the new one's
            a.wait_rollouts(session, _echo_line)
            # and a new slurmctld pod's address reaches the login pod's DNS a cache TTL later
            a.wait_login_reaches_controller(session, _echo_line)
    except SlurmK8sError as err:
        _fail(err)
    _report("up", result, session)
    _print_outputs(dict(result.outputs))


def preview(spec: SpecOpt, kubeconfig: KubeOpt = None, state: StateOpt = None, stack: StackOpt = None,
            wait: WaitOpt = True, diff: Annotated[bool, typer.Option("--diff", help="Show a detailed diff.")] = False
            ) -> None:
    """Show what `up` would change."""
    from ..errors import SlurmK8sError
    a = _automation()

    session = _session(spec, state=state, stack=stack, kubeconfig=kubeconfig, need_cluster=True)
    try:
        _owner_check(session, "preview")
        a.recover(session, _echo_line, pending=False)
        a.preflight(session, _echo_line, database=False, images="labels")
        a.ensure_stack_config(session, wait=wait, spec_path=spec)
        a.diagnose_now(session, _echo_line)
        result = a.preview(session, _echo_line, diff=diff)
    except SlurmK8sError as err:
        _fail(err)
    _report("preview", result, session)


def down(spec: SpecOpt, kubeconfig: KubeOpt = None, state: StateOpt = None, stack: StackOpt = None,
         purge: Annotated[bool, typer.Option("--purge", help="Also delete the volumes (/home, slurmctld's state, the "
                                                          "accounting database) and the namespace.")]
         = False,
         yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before --purge.")] = False,
         repair: RepairOpt = False, take_over: TakeOverOpt = False) -> None:
    """Tear the cluster down. Keeps the PersistentVolumeClaims (and the namespace) unless --purge."""
    from ..errors import SlurmK8sError
    a = _automation()

    session = _session(spec, state=state, stack=stack, kubeconfig=kubeconfig, need_cluster=False)
    ns = session.spec.namespace_name
    try:
        _owner_check(session, "down", take_over)  # before asking about --purge: a refusal needs no answer
    except SlurmK8sError as err:
        _fail(err)
    if purge and not yes:
        from ..manifests import kept_claims

        typer.confirm(f"--purge deletes the volumes {', '.join(kept_claims(session.spec))} (/home, slurmctld's state, "
                      f"the job accounting database) and namespace {ns} for good. Continue?", abort=True)
    try:
        if repair:
            a.repair(session, _echo_line)
        else:
            a.recover(session, _echo_line)
        result = a.down(session, _echo_line)
        a.delete_leftovers(session, _echo_line, purge=purge)
    except SlurmK8sError as err:
        _fail(err)
    _report("down", result, session)


def outputs(spec: SpecOpt, state: StateOpt = None, stack: StackOpt = None,
            as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Print the stack outputs (secrets are never printed)."""
    from ..errors import SlurmK8sError
    a = _automation()

    session = _session(spec, state=state, stack=stack, kubeconfig=None, need_cluster=False)
    try:
        values = a.outputs(session)
    except SlurmK8sError as err:
        _fail(err)
    if as_json:
        typer.echo(json.dumps(values, indent=2, sort_keys=True))
    else:
        _print_outputs(values)


def stack_secrets(
    stack: Annotated[str, typer.Option("--stack", help="Stack name (as in Pulumi.<stack>.yaml).")],
    stack_dir: Annotated[Path, typer.Option("--stack-dir", help="Directory with Pulumi.yaml.")] = Path("stacks"),
) -> None:
    """For `pulumi up` in stacks/: generate the cluster's keys into the stack config (once)."""
    from ..errors import SlurmK8sError
    a = _automation()

    try:
        made = a.stack_secrets(stack_dir, stack)
    except SlurmK8sError as err:
        _fail(err)
    typer.echo(f"generated: {', '.join(made)}" if made else "all keys already present")


def register(app: typer.Typer) -> None:
    """Add the deploy commands to the top-level `slurmk8s` app."""
    app.command("up")(up)
    app.command("preview")(preview)
    app.command("down")(down)
    app.command("outputs")(outputs)
    app.command("stack-secrets")(stack_secrets)
