"""`slurmk8s up | preview | down | outputs` through the Pulumi Automation API (inline program).

No Pulumi Cloud account is needed: the state lives in a local file backend under the state
directory (default ``~/.slurmk8s/state``):

    <state>/backend/     file:// backend (checkpoints, history, locks)
    <state>/workspace/   Pulumi.yaml and Pulumi.<stack>.yaml (stack config; secrets encrypted)
    <state>/passphrase   the secrets passphrase (mode 0600), generated unless
                         PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE is set

The engine needs the Pulumi CLI and the pulumi-kubernetes provider plugin at the version of the
installed SDK; both are looked up in the environment, then in the toolchain that
``slurmk8s toolchain build`` makes from the Go module proxy. When one is missing the error says how
to get it. Nothing here prints a secret: the passphrase goes to the engine through a file, the
generated keys through the CLI's stdin.
"""

from __future__ import annotations

import os
import secrets as pysecrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..config import ClusterSpec, load_spec
from ..generate import Generated, generate_for_kubernetes
from ..settings import PYTHON, Cli
from . import keys
from .engine import EngineCommand, Interruptible
from .errors import DeployError, Interrupted
from .live import delete_leftovers, diagnose_now, preflight, watcher_for
from .live import wait_login_reaches_controller, wait_rollouts  # noqa: F401 (the CLI calls them as automation's)
from .program import PROJECT, inline_program, read_k8s_nodes

PULUMI_CLI_BUILT = "3.274.1"  # what `slurmk8s toolchain build` makes (the Go proxy refuses older ones)
KUBECONFIG_KEY = "kubernetes:kubeconfig"
WAIT_KEY = f"{keys.CONFIG_NAMESPACE}:wait"
SPEC_KEY = f"{keys.CONFIG_NAMESPACE}:spec"

Printer = Callable[[str], Any]


def provider_version() -> str:
    """The pulumi-kubernetes plugin version the installed SDK asks the engine for."""
    return metadata.version("pulumi_kubernetes")


def sdk_version() -> str:
    return metadata.version("pulumi")


# ---------------------------------------------------------------- finding the toolchain


@dataclass(frozen=True)
class Toolchain:
    pulumi: Path
    pulumi_home: Path
    plugin: Path  # the pulumi-resource-kubernetes binary the engine will use
    plugin_ambient: bool  # found on PATH rather than installed in PULUMI_HOME

    @property
    def root(self) -> str:
        return str(self.pulumi.parent.parent)


def toolchain_dir(env: Mapping[str, str]) -> Path:
    return Path(Cli.from_env(env).toolchain_dir)


def _missing_cli(env: Mapping[str, str]) -> DeployError:
    return DeployError(
        "the Pulumi CLI was not found (looked at $SLURMK8S_PULUMI, "
        f"{toolchain_dir(env) / 'bin' / 'pulumi'}, $PATH and ~/.pulumi/bin). Fix: build it offline from the Go "
        f"module proxy with `slurmk8s toolchain build pulumi pulumi-kubernetes` (Pulumi CLI v{PULUMI_CLI_BUILT}, "
        f"provider v{provider_version()}), or install the Pulumi CLI (>= {sdk_version()}) and put it on PATH, "
        "or point SLURMK8S_PULUMI at the binary"
    )


def _missing_plugin(home: Path, env: Mapping[str, str]) -> DeployError:
    v = provider_version()
    return DeployError(
        f"the Kubernetes provider plugin v{v} was not found (looked in {home}/plugins/resource-kubernetes-v{v} and "
        "for pulumi-resource-kubernetes on PATH); automatic plugin downloads are off. Fix: "
        f"`slurmk8s toolchain build pulumi-kubernetes` builds v{v} from the Go module proxy and installs it into "
        f"{toolchain_dir(env) / 'pulumi-home'}; or, with internet access, "
        f"`pulumi plugin install resource kubernetes v{v}`; or `pulumi plugin install resource kubernetes v{v} "
        "--file <pulumi-resource-kubernetes binary>`"
    )


def find_toolchain(env: Mapping[str, str] | None = None) -> Toolchain:
    """Locate the Pulumi CLI and the provider plugin, or raise DeployError saying how to get them."""
    env = dict(os.environ if env is None else env)
    tdir = toolchain_dir(env)
    candidates: list[Path] = []
    pulumi = Cli.from_env(env).pulumi
    if pulumi:
        candidates.append(Path(pulumi))
    candidates.append(tdir / "bin" / "pulumi")
    which = shutil.which("pulumi", path=env.get("PATH"))
    if which:
        candidates.append(Path(which))
    candidates.append(Path(env.get("HOME", "~")).expanduser() / ".pulumi" / "bin" / "pulumi")
    cli = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if cli is None:
        raise _missing_cli(env)
    cli = cli.resolve()

    v = provider_version()
    homes: list[Path] = []
    if env.get("PULUMI_HOME"):
        homes.append(Path(env["PULUMI_HOME"]))
    homes += [tdir / "pulumi-home", Path(env.get("HOME", "~")).expanduser() / ".pulumi"]
    for home in homes:
        plugin = home / "plugins" / f"resource-kubernetes-v{v}" / "pulumi-resource-kubernetes"
        if plugin.is_file():
            return Toolchain(cli, home, plugin, plugin_ambient=False)
    ambient = shutil.which("pulumi-resource-kubernetes", path=env.get("PATH"))
    if ambient:
        return Toolchain(cli, homes[0], Path(ambient), plugin_ambient=True)
    raise _missing_plugin(homes[0], env)


def cli_version(tool: Toolchain) -> str:
    out = subprocess.run([str(tool.pulumi), "version"], capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"})
    return out.stdout.strip().lstrip("v") or "unknown"


# ---------------------------------------------------------------- state directory and passphrase


def state_dir(path: str | Path | None) -> Path:
    d = Path(path or Cli.from_env(os.environ).state_dir).expanduser().resolve()
    (d / "backend").mkdir(parents=True, exist_ok=True)
    (d / "workspace").mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d


def passphrase_env(state: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The engine's passphrase settings. An operator's PULUMI_CONFIG_PASSPHRASE(_FILE) wins; else a
    random passphrase is generated once into <state>/passphrase (0600) and passed as a file."""
    if env.get("PULUMI_CONFIG_PASSPHRASE") is not None or env.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        return {}
    path = state / "passphrase"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(pysecrets.token_urlsafe(32) + "\n")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise DeployError(f"{path} is readable by others (mode {mode:o}). Fix: chmod 600 {path}")
    return {"PULUMI_CONFIG_PASSPHRASE_FILE": str(path)}


def engine_home(tool: Toolchain, state: Path, env: Mapping[str, str]) -> Path:
    """PULUMI_HOME for the engine. An operator's PULUMI_HOME (or ~/.pulumi holding the plugin) is
    used as is; a plugin from the shared toolchain cache is linked into <state>/pulumi-home, so the
    engine's logs and workspace files stay with the state instead of piling up in the cache."""
    if env.get("PULUMI_HOME") or tool.plugin_ambient or tool.pulumi_home != toolchain_dir(env) / "pulumi-home":
        return tool.pulumi_home
    home = state / "pulumi-home"
    plugin_dir = home / "plugins" / tool.plugin.parent.name
    if plugin_dir.is_symlink():  # the engine ignores a linked plugin directory: it must be a real one
        plugin_dir.unlink()
    plugin_dir.mkdir(parents=True, exist_ok=True)
    link = plugin_dir / tool.plugin.name
    if link.is_symlink() and link.resolve() != tool.plugin.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(tool.plugin)
    return home


DYNAMIC_PROVIDER = "pulumi-resource-pulumi-python"
# Pulumi's Python dynamic provider as the engine starts it for `pulumi-python:dynamic*` resources (the
# keys of an embedded SlurmCluster, provisioner/deploy/stackkeys.py). Pulumi's release ships this program
# beside its CLI; a CLI built from source (`slurmk8s toolchain build`) lacks it. It runs the Python that
# runs slurmk8s, where the provider's module imports.
_DYNAMIC_PROVIDER_SCRIPT = """#!/bin/sh
# written by slurmk8s (provisioner/deploy/automation.py): Pulumi's Python dynamic provider
exec "${SLURMK8S_PYTHON:-python3}" -u -m pulumi.dynamic "$@"
"""


def dynamic_provider_dir(tool: Toolchain, state: Path, env: Mapping[str, str]) -> Path | None:
    """A directory holding Pulumi's Python dynamic provider for the engine's PATH: None when the CLI's
    own directory or PATH has one, else <state>/bin with the script written there."""
    if (tool.pulumi.parent / DYNAMIC_PROVIDER).is_file() or shutil.which(DYNAMIC_PROVIDER, path=env.get("PATH")):
        return None
    bindir = state / "bin"
    script = bindir / DYNAMIC_PROVIDER
    if not script.is_file() or script.read_text() != _DYNAMIC_PROVIDER_SCRIPT:
        bindir.mkdir(parents=True, exist_ok=True)
        tmp = script.with_suffix(".tmp")
        tmp.write_text(_DYNAMIC_PROVIDER_SCRIPT)
        tmp.chmod(0o755)
        tmp.replace(script)
    return bindir


def engine_env(tool: Toolchain, state: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    dynamic = dynamic_provider_dir(tool, state, env)
    out = {
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        # one stack per namespace (provisioner/deploy/owner.py checks it first), so this stack's apply wins
        # over a `kubectl edit` of a field it declares (which moved the field to another manager: a plain
        # server-side apply would stop on the conflict instead of restoring it); undeclared fields stay theirs
        "PULUMI_K8S_ENABLE_PATCH_FORCE": env.get("PULUMI_K8S_ENABLE_PATCH_FORCE", "true"),
        "PULUMI_HOME": str(engine_home(tool, state, env)),
        "PATH": os.pathsep.join(
            # an installed plugin is found in PULUMI_HOME; only an ambient one must be on PATH
            [str(tool.pulumi.parent)] + ([str(tool.plugin.parent)] if tool.plugin_ambient else [])
            + ([str(dynamic)] if dynamic else []) + [env.get("PATH", "")]),
        PYTHON: Cli.from_env(env).python,
    }
    out.update(passphrase_env(state, env))
    return out


# ---------------------------------------------------------------- the stack


@dataclass
class Session:
    """One opened stack with everything needed to run an operation on it."""

    spec: ClusterSpec
    stack: Any  # pulumi.automation.Stack
    state: Path
    tool: Toolchain
    env: dict[str, str]
    kubeconfig: str | None
    nodes: list[dict[str, Any]] | None = None
    generated: Generated | None = None
    timings: dict[str, float] = field(default_factory=dict)
    engine: Any = None  # engine.EngineCommand: the `pulumi` processes of this session
    refresh: bool = False  # refresh before the next update (set when recover cleared pending operations)
    api_client: Any = None  # the kubernetes ApiClient of the live checks (deploy.live), made once
    local_cluster: bool | None = None  # whether that client talks to this machine's local cluster


def _explain_command_error(err: Exception, stack_name: str, state: Path) -> DeployError:
    text = str(err)
    lower = text.lower()
    if "currently locked by" in lower or "another update is currently in progress" in lower:
        return DeployError(
            f"stack {stack_name!r} is locked by another update (lock files under {state}/backend/.pulumi/locks). "
            "Fix: if no other slurmk8s/pulumi process is running on it, rerun with --repair (removes the stale "
            "lock and pending operations, then refreshes the state from the cluster)"
        )
    if "pending operations" in lower or "interrupted while" in lower:
        return DeployError(
            f"stack {stack_name!r} has pending operations from an interrupted update. Fix: rerun with --repair "
            "(clears them and refreshes the state from the cluster; the objects that exist are kept)"
        )
    if "no resource plugin" in lower or "could not find plugin" in lower or "plugin not found" in lower:
        return _missing_plugin(Path(os.environ.get("PULUMI_HOME", "~/.pulumi")), os.environ)
    if "incorrect passphrase" in lower or "passphrase must be set" in lower or "failed to decrypt" in lower:
        return DeployError(
            f"the secrets passphrase does not open stack {stack_name!r}. Fix: use the passphrase it was created with "
            f"(PULUMI_CONFIG_PASSPHRASE / PULUMI_CONFIG_PASSPHRASE_FILE, or {state}/passphrase)"
        )
    return DeployError(f"pulumi failed:\n{_tail(text, 60)}")


def _tail(text: str, lines: int) -> str:
    parts = text.strip().splitlines()
    return "\n".join(parts[-lines:])


def resolve_kubeconfig(explicit: str | None, stack_config: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """--kubeconfig, else what the stack was deployed with, else $KUBECONFIG, else the default."""
    if explicit:
        p = Path(explicit).expanduser()
        if not p.is_file():
            raise DeployError(f"--kubeconfig {explicit}: no such file")
        return str(p.resolve())
    saved = stack_config.get(KUBECONFIG_KEY)
    if saved is not None and getattr(saved, "value", None):
        return saved.value
    if env.get("KUBECONFIG"):
        first = env["KUBECONFIG"].split(os.pathsep)[0]
        return str(Path(first).expanduser().resolve())
    default = Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"
    return str(default) if default.is_file() else None


def open_session(spec_path: str | Path, *, state: str | Path | None = None, stack_name: str | None = None,
                 kubeconfig: str | None = None, need_cluster: bool = True,
                 env: Mapping[str, str] | None = None) -> Session:
    """Validate the spec, find the toolchain, open (or create) the stack, read the live nodes."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from pulumi import automation as auto
    from urllib3.exceptions import HTTPError

    from ..kubeapi import KubeConfigError

    env = dict(os.environ if env is None else env)
    started = time.monotonic()
    spec = load_spec(spec_path)
    tool = find_toolchain(env)
    sdir = state_dir(state)
    wenv = engine_env(tool, sdir, env)
    name = stack_name or spec.name
    project = auto.ProjectSettings(name=PROJECT, runtime="python",
                                   backend=auto.ProjectBackend(url=f"file://{sdir / 'backend'}"),
                                   description="slurmk8s clusters (inline Automation API program)")
    try:
        cmd = EngineCommand(tool.root, sdir / "run", name)
        opts = auto.LocalWorkspaceOptions(work_dir=str(sdir / "workspace"), pulumi_home=wenv["PULUMI_HOME"],
                                          env_vars=wenv, secrets_provider="passphrase", project_settings=project,
                                          pulumi_command=cmd)
        holder: dict[str, Any] = {}
        stack = auto.create_or_select_stack(name, project_name=PROJECT,
                                            program=lambda: holder["program"](), opts=opts)
    except auto.CommandError as err:
        raise _explain_command_error(err, name, sdir) from None
    session = Session(spec=spec, stack=stack, state=sdir, tool=tool, env=wenv, kubeconfig=None, engine=cmd)
    session.timings["open"] = time.monotonic() - started

    cfg = stack.get_all_config()
    session.kubeconfig = resolve_kubeconfig(kubeconfig, cfg, env)
    if need_cluster:
        t0 = time.monotonic()
        try:
            session.nodes = read_k8s_nodes(session.kubeconfig)
        except (ConfigException, KubeConfigError, ApiException, HTTPError, OSError, ValueError) as err:
            raise DeployError(
                f"cannot list the Kubernetes nodes (kubeconfig {session.kubeconfig or 'default'}): "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Fix: pass --kubeconfig "
                "for a reachable cluster (for the local one: `slurmk8s cluster up`, then "
                "--kubeconfig \"$(slurmk8s cluster kubeconfig)\")"
            ) from None
        session.timings["nodes"] = time.monotonic() - t0
        session.generated = generate_for_kubernetes(spec, session.nodes)  # clean errors before Pulumi
    holder["program"] = inline_program(spec, session.nodes) if need_cluster else _no_program
    return session


def _no_program() -> None:
    raise DeployError("this operation does not run the program (a bug: open the session with need_cluster=True)")


def ensure_stack_config(session: Session, *, wait: bool, spec_path: str | Path | None = None) -> list[str]:
    """Generate the cluster's keys once (kept, encrypted, in the stack config); record the kubeconfig
    and the wait setting. Returns the names of keys generated now."""
    started = time.monotonic()
    stack = session.stack
    cfg = stack.get_all_config()
    have = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith(keys.CONFIG_NAMESPACE + ":")}
    new = keys.generate(missing_only=have)
    for key, value in new.items():
        set_secret_config(session, f"{keys.CONFIG_NAMESPACE}:{key}", value)
    from pulumi import automation as auto

    plain = {WAIT_KEY: auto.ConfigValue("true" if wait else "false")}
    if session.kubeconfig:
        plain[KUBECONFIG_KEY] = auto.ConfigValue(session.kubeconfig)
    if spec_path is not None:
        plain[SPEC_KEY] = auto.ConfigValue(str(Path(spec_path).resolve()))
    stack.set_all_config(plain)
    session.timings["config"] = time.monotonic() - started
    return sorted(new)


def set_secret_config(session: Session, key: str, value: str) -> None:
    """`pulumi config set --secret KEY` with the value on stdin (never in argv or a log)."""
    argv = [str(session.tool.pulumi), "config", "set", key, "--secret", "--stack", session.stack.name]
    done = subprocess.run(argv, input=value, text=True, capture_output=True, check=False, timeout=120,
                          cwd=session.stack.workspace.work_dir, env={**os.environ, **session.env})
    if done.returncode != 0:
        raise DeployError(f"cannot store {key} in the stack config: {_tail(done.stderr, 5)}")


# ---------------------------------------------------------------- operations


@dataclass(frozen=True)
class Result:
    summary: str
    changes: Mapping[str, int]
    seconds: float  # engine time (start to end of the update)
    wall: float  # including opening the stack and reading the nodes
    outputs: Mapping[str, Any]


def _summary(result: Any) -> tuple[str, dict[str, int], float]:
    s = getattr(result, "summary", None)
    if s is None:
        return "", {}, 0.0
    changes = dict(s.resource_changes or {})
    seconds = (s.end_time - s.start_time).total_seconds() if s.end_time and s.start_time else 0.0
    return s.result, changes, seconds


def _outputs(stack: Any) -> dict[str, Any]:
    return {k: ("[secret]" if v.secret else v.value) for k, v in stack.outputs().items()}


def _run(session: Session, op: str, fn: Callable[[], Any], started: float, echo: Printer,
         watcher: Any = None) -> Any:
    """Run one engine operation: Ctrl-C / SIGTERM cancel the engine (then kill it and its provider
    after a grace period); `watcher` (watch.Watcher) may cancel it on a problem that will not go away.
    What a cancelled or killed engine leaves (lock, pending operations) is cleared before returning."""
    from pulumi import automation as auto

    guard = Interruptible(session.engine, echo)
    try:
        with guard:
            if watcher is not None:
                watcher.start()
            try:
                return fn()
            finally:
                if watcher is not None:
                    watcher.stop()
    except auto.CommandError as err:
        stopped = bool(guard.signals or (watcher is not None and watcher.stopped_by) or session.engine.killed_engine)
        cleaned = _recover_after(session, echo) if stopped else []
        after = (" " + "; ".join(cleaned) + ".") if cleaned else ""
        if watcher is not None and watcher.stopped_by:
            from .watch import report

            raise DeployError(report(watcher.stopped_by, watcher.elapsed()) + after) from None
        if guard.signals:
            killed = " and, as it did not stop in time, killed with its provider" if session.engine.killed_engine else ""
            raise Interrupted(
                f"`{op}` interrupted ({guard.signals[0]}): the Pulumi engine was cancelled{killed}; no Pulumi process of "
                f"it is left.{after} The objects applied so far stay; `slurmk8s up` continues from there") from None
        raise _explain_command_error(err, session.stack.name, session.state) from None
    finally:
        session.timings[op] = time.monotonic() - started


def _recover_after(session: Session, echo: Printer) -> list[str]:
    from .engine import recover

    try:
        return recover(session.stack, session.state, session.engine, echo)
    except Exception as err:  # noqa: BLE001 - the next `up` recovers; the original failure matters more
        return [f"clearing what it left failed ({type(err).__name__}: {err}); the next `slurmk8s up` retries"]


def recover(session: Session, echo: Printer, *, pending: bool = True) -> None:
    """Before an operation: stop what an interrupted run left running, remove its stale lock, clear
    its pending operations (then refresh before the update)."""
    from pulumi import automation as auto

    from . import engine

    try:
        engine.recover(session.stack, session.state, session.engine, echo, pending=pending)
    except RuntimeError as err:
        raise DeployError(f"{err}. Fix: wait for it to finish; if no slurmk8s or pulumi process runs on this stack, "
                          "rerun with --repair") from None
    except auto.CommandError as err:
        raise _explain_command_error(err, session.stack.name, session.state) from None
    session.refresh = session.engine.cleared_pending > 0


def repair(session: Session, echo: Printer) -> None:
    """Remove a stale lock and pending operations, then refresh the state from the cluster."""
    from .engine import clear_pending, remove_lock, stack_locks

    stack = session.stack
    locks = stack_locks(session.state, stack.name)
    for lock in locks:
        remove_lock(lock)
    echo(f"repair: removed {len(locks)} stale lock(s)")
    pending = clear_pending(stack)
    if pending:
        echo(f"repair: cleared {len(pending)} pending operation(s): "
             + ", ".join(p.get("resource", {}).get("urn", "?").rsplit("::", 1)[-1] for p in pending))
    stack.refresh(on_output=echo, color="never")
    echo("repair: state refreshed from the cluster")


def preview(session: Session, echo: Printer, *, diff: bool = False) -> Result:
    t0 = time.monotonic()
    res = _run(session, "preview", lambda: session.stack.preview(on_output=echo, color="never", diff=diff,
                                                                  refresh=True), t0, echo)
    changes = dict(getattr(res, "change_summary", {}) or {})
    wall = sum(session.timings.values())
    return Result("preview", changes, session.timings["preview"], wall, {})


def up(session: Session, echo: Printer, *, diff: bool = False, watch: bool = True) -> Result:
    """The update, watched (provisioner.deploy.watch): a claim that cannot bind or a pod that cannot
    start stops it with the reason and the fix instead of Pulumi's 10-minute await timeout."""
    t0 = time.monotonic()
    watcher = watcher_for(session, echo) if watch else None
    if session.refresh:
        echo("refreshing the state from the cluster first (an interrupted update left it unsure)")
    # refresh first, always: objects deleted or changed behind this stack's back are restored
    # (one refresh per up)
    res = _run(session, "up", lambda: session.stack.up(on_output=echo, color="never", diff=diff, refresh=True),
               t0, echo, watcher)
    summary, changes, seconds = _summary(res)
    outputs = {k: ("[secret]" if v.secret else v.value) for k, v in (res.outputs or {}).items()}
    return Result(summary, changes, seconds, sum(session.timings.values()), outputs)


def down(session: Session, echo: Printer) -> Result:
    t0 = time.monotonic()
    res = _run(session, "destroy", lambda: session.stack.destroy(on_output=echo, color="never"), t0, echo)
    summary, changes, seconds = _summary(res)
    return Result(summary, changes, seconds, sum(session.timings.values()), {})


def outputs(session: Session) -> dict[str, Any]:
    return _outputs(session.stack)


def stack_secrets(stack_dir: str | Path, stack_name: str, env: Mapping[str, str] | None = None) -> list[str]:
    """For stacks driven by the Pulumi CLI (stacks/): generate the keys missing from the stack's
    config, stored as secrets. Runs `pulumi config` only (no language host needed)."""
    env = dict(os.environ if env is None else env)
    tool = find_toolchain(env)
    run_env = {**env, "PULUMI_SKIP_UPDATE_CHECK": "true", "PULUMI_HOME": str(tool.pulumi_home)}
    got = subprocess.run([str(tool.pulumi), "config", "--json", "--stack", stack_name], capture_output=True,
                         text=True, check=False, cwd=str(stack_dir), env=run_env, timeout=120)
    if got.returncode != 0:
        raise DeployError(f"cannot read the config of stack {stack_name!r} in {stack_dir}: {_tail(got.stderr, 5)}. "
                          f"Fix: `pulumi stack init {stack_name}` there first")
    import json

    have = {k.split(":", 1)[1] for k in json.loads(got.stdout or "{}") if k.startswith(keys.CONFIG_NAMESPACE + ":")}
    new = keys.generate(missing_only={k: True for k in have})
    for key, value in new.items():
        done = subprocess.run([str(tool.pulumi), "config", "set", f"{keys.CONFIG_NAMESPACE}:{key}", "--secret",
                               "--stack", stack_name], input=value, text=True, capture_output=True, check=False,
                              cwd=str(stack_dir), env=run_env, timeout=120)
        if done.returncode != 0:
            raise DeployError(f"cannot set {key}: {_tail(done.stderr, 5)}")
    return sorted(new)


def describe_versions(session: Session) -> str:
    plugin = f"{session.tool.plugin}" + (" (ambient, on PATH)" if session.tool.plugin_ambient else "")
    return (f"Pulumi CLI {cli_version(session.tool)} ({session.tool.pulumi}), SDK {sdk_version()}, "
            f"pulumi-kubernetes {provider_version()} ({plugin}); state {session.state}")


__all__: Sequence[str] = (
    "DeployError", "Interrupted", "Toolchain", "find_toolchain", "open_session", "ensure_stack_config", "preflight",
    "recover", "preview", "diagnose_now", "up", "down",
    "delete_leftovers", "outputs", "repair", "stack_secrets", "describe_versions",
)
