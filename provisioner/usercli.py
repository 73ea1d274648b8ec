"""`slurmk8s submit SCRIPT`, `slurmk8s ssh` and `slurmk8s token`: for a researcher or platform
engineer with a kubeconfig. All wake a sleeping control tier (provisioner.controltier: everything
scaled up at once). `ssh` waits for the tier's readiness, then runs the system `ssh` client
(interactive, or one command) to the login pod as the user. `submit` does not wait for readiness:
the wake goes on in a thread while it logs in over SSH and polls `scontrol ping` until the
controller answers (and the wake has scaled everything up, so no sleep under way can take the job),
then runs plain `sbatch` with the script on stdin and prints the job id; a failed wake is reported
as soon as it is known.

`token --user NAME` prints a JWT for the REST API (``rest.enabled``): it wakes the tier, then runs
``scontrol token username=NAME lifespan=SECONDS`` in the slurmctld container (the Kubernetes exec
API, as root there: slurmctld signs tokens for any user only for root and SlurmUser) and prints the
one line ``SLURM_JWT=...``; a user not in the spec is refused before anything runs.

Where SSH goes: `--address HOST[:PORT]`, else from the login Service: a LoadBalancer's address,
a NodePort on a node's InternalIP, or the ClusterIP (reachable from the cluster's nodes and pods,
e.g. on the local cluster; elsewhere `kubectl -n NS port-forward svc/login 2222:22` and
`--address localhost:2222`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer

from .errors import SlurmK8sError

SpecOpt = Annotated[Optional[Path], typer.Option("--spec", help="Cluster spec YAML (gives the namespace).")]
NsOpt = Annotated[Optional[str], typer.Option("--namespace", "-n", help="The cluster's namespace (slurm-<name>).")]
KubeOpt = Annotated[Optional[str], typer.Option("--kubeconfig", help="kubeconfig (default $KUBECONFIG, ~/.kube/config).")]
UserOpt = Annotated[Optional[str], typer.Option("--user", "-u", help="Cluster user to log in as (default: $USER).")]
KeyOpt = Annotated[Optional[Path], typer.Option("--key", "-i", help="SSH private key (default: ssh-agent, ~/.ssh/id_*).")]
AddrOpt = Annotated[Optional[str], typer.Option("--address", help="SSH to HOST[:PORT] instead of the login Service's address.")]
KnownOpt = Annotated[Optional[Path], typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts).")]
InsecureOpt = Annotated[bool, typer.Option("--insecure-host-key", help="Do not check the login pod's SSH host key.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the wake and the controller.")]


class UserError(SlurmK8sError):
    pass


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _api_client(kubeconfig: str | None, quick: bool = False) -> Any:
    """The client for the kubeconfig; with `quick`, a :class:`provisioner.kubeapi.KubeconfigClient`
    when the kubeconfig allows it (for RawClient calls only: it saves the kubernetes package's import
    before the wake's first call)."""
    from .kubeapi import KubeConfigError, api_client, quick_client

    if quick:
        client = quick_client(kubeconfig)
        if client is not None:
            return client
    try:
        return api_client(kubeconfig)
    except KubeConfigError as err:
        raise UserError(f"{err}; pass --kubeconfig or set KUBECONFIG") from None


def namespace_of(spec: Path | None, namespace: str | None) -> str:
    if namespace:
        return namespace
    if spec is None:
        raise UserError("name the cluster: --spec SPEC.yaml or --namespace slurm-<name>")
    from .config import load_spec

    return load_spec(spec).namespace_name


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":") if address.count(":") == 1 else (address, "", "22")
    if not host:
        host, port = address, "22"
    if not port.isdigit():
        raise UserError(f"--address {address!r}: expected HOST[:PORT]")
    return host, int(port)


def login_endpoint(api: Any, namespace: str, address: str | None) -> tuple[str, int]:
    """(host, port) where the login pod's sshd answers (see the module docstring); `api` is a
    :class:`provisioner.kubeapi.RawClient`."""
    from . import names

    if address:
        return _split(address)
    from .kubeapi import ApiError, api_path

    try:
        svc = api.request("GET", api_path("v1", namespace, "services", names.LOGIN))
    except ApiError as err:
        if err.status == 0:
            raise UserError(f"cannot read service/{names.LOGIN} in {namespace}: the Kubernetes API did not answer "
                            f"({err.message})") from None
        raise UserError(f"cannot read service/{names.LOGIN} in {namespace}: {err.status} {err.reason} "
                        "(is the cluster deployed with a login pod? the right --namespace?)") from None
    spec = svc.get("spec") or {}
    kind = spec.get("type", "ClusterIP")
    if kind == "LoadBalancer":
        ingress = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
        for i in ingress:
            if i.get("ip") or i.get("hostname"):
                return i.get("ip") or i.get("hostname"), names.SSH_PORT
        raise UserError(f"service/{names.LOGIN} has no LoadBalancer address yet; wait, or pass --address")
    if kind == "NodePort":
        port = (spec.get("ports") or [{}])[0].get("nodePort")
        nodes = api.request("GET", "/api/v1/nodes").get("items", [])
        for n in nodes:
            for a in (n.get("status") or {}).get("addresses") or []:
                if a.get("type") == "InternalIP":
                    return a["address"], int(port)
        raise UserError("no node with an InternalIP for the NodePort; pass --address")
    return spec.get("clusterIP") or f"{names.LOGIN}.{namespace}.svc", names.SSH_PORT


_T0 = time.monotonic()


def progress(line: str) -> None:
    typer.echo(f"[{time.monotonic() - _T0:5.1f}s] {line}", err=True)


def wake(api_client: Any, namespace: str, why: str, timeout: float, scaled: Any = lambda: None) -> bool:
    from .controltier.api import ClientTierApi
    from .controltier.decision import TierError
    from .controltier.tier import Tier

    tier = Tier(ClientTierApi(api_client), namespace, "slurmk8s-cli", log=lambda line: typer.echo(line, err=True),
                replace_deployment_pods=True)
    try:
        return tier.wake(why, progress=progress, timeout=timeout, scaled=scaled)
    except TierError as err:
        raise UserError(str(err)) from None


class Waking:
    """A wake in a thread of its own, so that `submit` logs in and asks slurmctld while the tier
    starts, instead of after the StatefulSets report ready (the pod's readiness waits for its slowest
    container and a probe period; slurmctld answers before that). :attr:`scaled` is set once no
    sleep is under way and everything is scaled up (a job submitted from then on is not lost to a
    sleep); :meth:`check` raises the wake's failure (a workload not ready in time, an API refusal),
    which then explains a slurmctld that does not answer better than the ping does."""

    def __init__(self, api_client: Any, namespace: str, why: str, timeout: float) -> None:
        import threading

        self.error: BaseException | None = None
        self.scaled = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(api_client, namespace, why, timeout),
                                        name="wake", daemon=True)
        self._thread.start()

    def _run(self, api_client: Any, namespace: str, why: str, timeout: float) -> None:
        try:
            wake(api_client, namespace, why, timeout, scaled=self.scaled.set)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread by check()
            self.error = err
        finally:
            self.scaled.set()  # a failed wake lets the caller go on to check() it

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def settle(self, timeout: float = 60.0) -> None:
        """Before the CLI exits early (a failure, Ctrl-C): let the wake finish scaling, so that no
        part of the tier is left up with the rest at zero (readiness is not waited for)."""
        self.scaled.wait(timeout)


@dataclass
class Ssh:
    host: str
    port: int
    user: str
    key: Path | None
    known_hosts: Path | None
    insecure: bool

    def _options(self) -> dict[str, Any]:
        import asyncssh

        opts: dict[str, Any] = {"username": self.user, "port": self.port, "connect_timeout": 10}
        if self.key is not None:
            try:
                opts["client_keys"] = [asyncssh.read_private_key(str(self.key))]
            except (OSError, asyncssh.KeyImportError) as err:
                raise UserError(f"--key {self.key}: {err}") from None
        if self.insecure:
            opts["known_hosts"] = None
        elif self.known_hosts is not None:
            opts["known_hosts"] = str(self.known_hosts)
        return opts

    async def _run(self, steps: Any, timeout: float, check: Any = lambda: None,
                   committed: Any = lambda: False) -> Any:
        """`steps(conn)` over a fresh connection, again after a failed connect or a lost connection
        (sshd starting after a wake, the login pod replaced), until `timeout`; never again once
        `committed()` (a command that must not run twice was sent: the loss is reported instead)."""
        import asyncssh

        deadline = time.monotonic() + timeout
        last = ""
        while True:  # sshd may still be starting right after a wake
            try:
                async with asyncssh.connect(self.host, **self._options()) as conn:
                    return await steps(conn)
            except asyncssh.PermissionDenied:
                raise UserError(f"SSH as {self.user}@{self.host}:{self.port}: permission denied; is this key among "
                                f"{self.user}'s ssh_keys in the spec? (--key, --user)") from None
            except asyncssh.HostKeyNotVerifiable as err:
                raise UserError(f"SSH host key of {self.host}:{self.port} not verifiable ({err}); add it to "
                                "known_hosts (the stack output ssh_host_public_keys) or pass --insecure-host-key") from None
            except (OSError, asyncssh.ConnectionLost, asyncssh.DisconnectError, asyncssh.ChannelOpenError,
                    asyncio.TimeoutError) as err:
                last = str(err) or type(err).__name__
                if committed():
                    raise UserError(f"the SSH connection to {self.host}:{self.port} was lost while sbatch ran "
                                    f"({last}); the job may have been submitted: look with squeue before "
                                    "submitting again") from None
            check()  # a wake that failed says why better than the connection does
            if time.monotonic() > deadline:
                raise UserError(f"cannot reach sshd at {self.host}:{self.port} after {timeout:.0f}s: {last}")
            await asyncio.sleep(0.5)

    def submit(self, script: str, sbatch_args: list[str], timeout: float,
               progress: Any = lambda _line: None, waking: Waking | None = None) -> str:
        """`sbatch` of `script` as the user, once slurmctld answers; with `waking` (a wake under way),
        not before it has scaled everything up, and its failure is raised as soon as it is known."""
        check = waking.check if waking is not None else (lambda: None)
        sent: list[bool] = []

        async def steps(conn: Any) -> str:
            t0 = time.monotonic()
            progress(f"logged in as {self.user} at {self.host}:{self.port}")
            # a ping before the wake has scaled could reach a slurmctld that a sleep under way is
            # about to stop: only a controller asked after that counts
            while waking is not None and not waking.scaled.is_set():
                await asyncio.sleep(0.05)
            while True:  # the controller answers (its port is open once ready; state recovery may lag)
                check()
                ping = await conn.run("scontrol ping", check=False)
                if ping.exit_status == 0 and " UP" in str(ping.stdout):
                    progress("slurmctld answers")
                    break
                if time.monotonic() - t0 > timeout:
                    raise UserError(f"slurmctld does not answer `scontrol ping` after {timeout:.0f}s: "
                                    f"{str(ping.stdout).strip()} {str(ping.stderr).strip()}")
                await asyncio.sleep(0.2)
            cmd = " ".join(["sbatch", "--parsable", *(shlex.quote(a) for a in sbatch_args)])
            sent.append(True)
            res = await conn.run(cmd, input=script, check=False)
            out = str(res.stdout).strip()
            if res.exit_status != 0 or not re.match(r"^\d+", out):
                raise UserError(f"sbatch failed (exit {res.exit_status}): {str(res.stderr).strip() or out}")
            return out.split(";")[0]

        return asyncio.run(self._run(steps, timeout, check, committed=lambda: bool(sent)))

    def ssh_argv(self, command: list[str]) -> list[str]:
        argv = ["ssh", "-p", str(self.port)]
        if self.key is not None:
            argv += ["-i", str(self.key)]
        if self.insecure:
            argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
        elif self.known_hosts is not None:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        # "--" before the destination: ssh's options end there; the command's words follow it
        return [*argv, "--", f"{self.user}@{self.host}", *command]


def _prepare(spec: Path | None, namespace: str | None, kubeconfig: str | None, user: str | None, key: Path | None,
             address: str | None, known_hosts: Path | None, insecure: bool, why: str, timeout: float,
             wait: bool = True) -> tuple[Ssh, Waking | None]:
    """Where to SSH, after waking the tier; with `wait` False the wake goes on in a thread (returned)."""
    from .kubeapi import RawClient

    ns = namespace_of(spec, namespace)
    who = user or os.environ.get("USER") or ""
    if not who:
        raise UserError("no user: pass --user NAME (a user of the cluster spec)")
    api = _api_client(kubeconfig, quick=True)  # the wake and the Service read go by path (RawClient)
    waking = None
    if wait:
        wake(api, ns, why, timeout)
    else:
        waking = Waking(api, ns, why, timeout)
    try:
        host, port = login_endpoint(RawClient(api), ns, address)
    except Exception:
        if waking is not None:  # the wake's own failure (an API that does not answer) says it better
            waking.settle()
            waking.check()
        raise
    return Ssh(host, port, who, key, known_hosts, insecure), waking


def submit(
    script: Annotated[Path, typer.Argument(help="Batch script (with #SBATCH lines), as for sbatch.")],
    sbatch_args: Annotated[Optional[list[str]], typer.Argument(help="Options for sbatch (after --).")] = None,
    spec: SpecOpt = None, namespace: NsOpt = None, kubeconfig: KubeOpt = None, user: UserOpt = None,
    key: KeyOpt = None, address: AddrOpt = None, known_hosts: KnownOpt = None, insecure_host_key: InsecureOpt = False,
    timeout: TimeoutOpt = 300.0,
) -> None:
    """Wake the cluster if it sleeps, then submit SCRIPT with sbatch as the user; prints the job id."""
    from .errors import SlurmK8sError

    global _T0
    _T0 = time.monotonic()

    try:
        text = script.read_text()
    except OSError as err:
        _fail(f"cannot read {script}: {err}")
    try:
        who = user or os.environ.get("USER") or "?"
        # the wake goes on while the login pod is reached and slurmctld asked (Waking)
        ssh, waking = _prepare(spec, namespace, kubeconfig, user, key, address, known_hosts, insecure_host_key,
                               f"slurmk8s submit {script.name} by {who}", timeout, wait=False)
        try:
            job = ssh.submit(text, list(sbatch_args or []), timeout, progress, waking)
        finally:
            if waking is not None:
                waking.settle()
    except (UserError, SlurmK8sError) as err:
        _fail(str(err))
    typer.echo(job)


def ssh(
    command: Annotated[Optional[list[str]], typer.Argument(help="Command to run (after --); none: a login shell.")]
    = None,
    spec: SpecOpt = None, namespace: NsOpt = None, kubeconfig: KubeOpt = None, user: UserOpt = None,
    key: KeyOpt = None, address: AddrOpt = None, known_hosts: KnownOpt = None, insecure_host_key: InsecureOpt = False,
    timeout: TimeoutOpt = 300.0,
) -> None:
    """Wake the cluster if it sleeps, then SSH to the login pod (the system ssh client)."""
    import shutil

    from .errors import SlurmK8sError

    if shutil.which("ssh") is None:
        _fail("no ssh client on PATH (install openssh-client)")
    try:
        who = user or os.environ.get("USER") or "?"
        target, _ = _prepare(spec, namespace, kubeconfig, user, key, address, known_hosts, insecure_host_key,
                             f"slurmk8s ssh by {who}", timeout)
    except (UserError, SlurmK8sError) as err:
        _fail(str(err))
    argv = target.ssh_argv(list(command or []))
    sys.stdout.flush()
    os.execvp(argv[0], argv)


# ---------------------------------------------------------------- slurmk8s token

DEFAULT_TOKEN_LIFETIME = 3600
_JWT_LINE = re.compile(r"^SLURM_JWT=([A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+)\s*$", re.MULTILINE)


def token_argv(spec: Any, user: str, lifetime: int) -> list[str]:
    """`scontrol token` for `user` of the spec, valid `lifetime` seconds; refuses what Slurm should
    never be asked (a user not in the spec, a cluster without JWT auth, a lifetime out of range)."""
    if not spec.rest.enabled:
        raise UserError(f"cluster {spec.name} has no REST API and no JWT auth (rest.enabled is false); set "
                        "rest: {enabled: true} in the spec and run `slurmk8s up`")
    names = [u.name for u in spec.users]
    if user not in names:
        raise UserError(f"user {user!r} is not in the spec of cluster {spec.name} (users: "
                        f"{', '.join(names) or 'none'}); tokens are only for the spec's users")
    cap = spec.rest.max_token_lifespan  # slurmctld would give this caller (root in its container) more
    if not 1 <= lifetime <= cap:
        raise UserError(f"--lifetime {lifetime}s is out of range; use 1s to {cap}s (rest.max_token_lifespan)")
    return ["scontrol", "token", f"username={user}", f"lifespan={lifetime}"]


def parse_token(stdout: str) -> str:
    """The JWT from `scontrol token`'s output (one line SLURM_JWT=header.payload.signature)."""
    found = _JWT_LINE.search(stdout)
    if not found:
        raise UserError("scontrol token printed no SLURM_JWT=<token> line; see the slurmctld container's log")
    return found.group(1)


def _retryable(code: int, err: str) -> bool:
    """slurmctld not answering yet (just woken, restarting) or the pod not there yet."""
    return code in (124, 125, 126) or "Unable to contact" in err or "Connection refused" in err


def request_token(api: Any, namespace: str, argv: list[str], timeout: float,
                  exec_fn: Any = None, sleep: Any = time.sleep, clock: Any = time.monotonic) -> str:
    """Run `argv` (token_argv) in slurmctld's container until it answers or `timeout` passes."""
    from . import names
    from .kubeapi import pod_exec

    run = exec_fn or pod_exec
    deadline = clock() + timeout
    while True:
        code, out, err = run(api, namespace, names.CONTROLLER_POD, names.CONTROLLER, argv, max(5.0, deadline - clock()))
        if code == 0:
            return parse_token(out)
        why = " ".join(err.split())[:300]
        if not _retryable(code, err) or clock() > deadline:
            raise UserError(f"`{' '.join(argv[:2])}` in {namespace}/{names.CONTROLLER_POD} failed (exit {code}): {why}")
        sleep(2.0)


def token(
    user: Annotated[str, typer.Option("--user", "-u", help="The cluster user (of the spec's users) the token is for.")],
    spec: Annotated[Path, typer.Option("--spec", help="Cluster spec YAML (its users and namespace).")],
    lifetime: Annotated[str, typer.Option("--lifetime", help="How long the token is valid: 90s, 30m, 1h (at most rest.max_token_lifespan, 24h by default).")]
    = "1h",
    kubeconfig: KubeOpt = None,
    timeout: TimeoutOpt = 300.0,
) -> None:
    """Print a JWT for the REST API as SLURM_JWT=<token> (wakes a sleeping cluster first)."""
    from .config import parse_duration

    global _T0
    _T0 = time.monotonic()
    try:
        from .config import load_spec

        loaded = load_spec(spec)
        try:
            seconds = parse_duration(lifetime)
        except ValueError as err:
            raise UserError(f"--lifetime: {err}") from None
        argv = token_argv(loaded, user, seconds)
        api = _api_client(kubeconfig)
        ns = loaded.namespace_name
        wake(api, ns, f"slurmk8s token for {user}", timeout)
        jwt = request_token(api, ns, argv, timeout)
    except SlurmK8sError as err:
        _fail(str(err))
    typer.echo(f"SLURM_JWT={jwt}")


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("ssh")(ssh)
    app.command("token")(token)
