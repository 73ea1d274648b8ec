"""The daemon: ``slurmk8s-reconcile`` (second container of the slurmctld pod). See the package's
docstring for how it is run and what it does each period.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..elastic.backend import BackendError, NodeBackend
from ..elastic.events import EventTail
from ..elastic.ledger import FileLedger, LedgerError, Policy
from ..settings import Reconcile
from ..slurm.commands import SlurmCli, SlurmCommandError
from ..slurm.state import JobStatus, parse_jobs
from . import busy, kueuewait
from .act import Report, run_once
from .classify import Kind, RestartWatch
from .idle import idle_watch_from_env
from .metrics import Metrics, metrics_markdown
from .usage import UsageFile, resume_usage

if TYPE_CHECKING:
    from ..elastic.bootgate import BootGate
    from ..inventory import Inventory
    from ..livenodes.cache import ConfigCache
    from ..livenodes.live import LiveNodes
    from .notices import NoticeReader
    from ..logs import Log


DEFAULT_PERIOD = 10.0
DEFAULT_METRICS_PORT = 9410


def _load_inventory(path: str) -> "Inventory":
    from ..inventory import Inventory

    return Inventory.read(path)


def _live_nodes(env: Mapping[str, str], inventory_path: str, slurm: SlurmCli, log: "Log",
                programs_running: Callable[[], int] = lambda: 0) -> "LiveNodes | None":
    """The follower of the Kubernetes nodes, for a spec with a pinned pool (None otherwise, or when
    the spec cannot be read: then the configuration rendered at the pod's start stays)."""
    from ..errors import SlurmK8sError
    from ..livenodes.live import LiveNodes
    from ..livenodes.source import read_domain, read_nodes, read_spec
    from ..manifests import pinned

    try:
        spec = read_spec(env)
    except (OSError, ValueError, SlurmK8sError) as err:
        log.write(f"cannot read the spec: the Slurm configuration will not follow the Kubernetes nodes: {err}")
        return None
    if not pinned(spec):
        return None
    domain, warning = read_domain(env)
    if warning:
        log.write(warning)
    log.write("following the Kubernetes nodes of the pinned pools (cordon, labels, nodes added and removed)")
    from ..elastic.quiesce import Hold

    return LiveNodes(spec, os.path.dirname(inventory_path), lambda: read_nodes(env), slurm, log,
                     cluster_domain=domain, scontrol=slurm.scontrol, programs_running=programs_running,
                     hold=Hold.of(env))


def _notices(env: Mapping[str, str], log: "Log", nudge: threading.Event | None) -> "NoticeReader | None":
    """The reader of the Kubernetes nodes' interruption notices (None when the spec lists none, or
    cannot be read: _live_nodes says so); with `nudge`, a node watch started beside it sets it when
    a node gets a notice, so the next pass need not wait for the period."""
    from ..errors import SlurmK8sError
    from ..kubeapi import RawClient, api_client, quick_client
    from ..livenodes.source import read_nodes, read_spec
    from .notices import WATCH_TIMEOUT_S, NoticeReader, NoticeWatch

    try:
        spec = read_spec(env)
    except (OSError, ValueError, SlurmK8sError):
        return None
    if not spec.elasticity.follows_notices:
        return None
    log.write("following the Kubernetes nodes' interruption notices (taints: "
              f"{', '.join(spec.elasticity.interruption_taints) or 'none'}; conditions: "
              f"{', '.join(spec.elasticity.interruption_conditions) or 'none'})")
    reader = NoticeReader(spec, lambda: read_nodes(env, cached=True), log.write)
    if nudge is not None:
        raw = RawClient(quick_client(env=env) or api_client(env=env), timeout=(5.0, 60.0))

        def watch(version: str) -> Any:
            query = {"resourceVersion": version, "timeoutSeconds": WATCH_TIMEOUT_S, "allowWatchBookmarks": True}
            return raw.watch_path("/api/v1/nodes", query, (5.0, WATCH_TIMEOUT_S + 30.0))
        NoticeWatch(reader, watch, nudge, log.write).start()
    return reader


def _drop_config(cache: "ConfigCache", log: "Log") -> None:
    try:
        if cache.clear():
            log.write(f"removed the configuration kept in {cache.cache_dir}: a pinned pool's start renders")
    except OSError as err:
        log.write(f"cannot remove {cache.cache_dir} ({err}); the next start still renders (the spec differs)")


def _keep_config(cache: "ConfigCache", log: "Log", last_error: str) -> tuple["ConfigCache | None", str]:
    """Copy the configuration slurmctld runs with to its state volume for the next start
    (livenodes/cache.py): (None, '') once done, as nothing rewrites it while this pod runs; else
    (cache, the error) to try again next pass. A failure is logged once, not every pass, and never
    stops the loop."""
    try:
        if cache.sync():
            log.write(f"kept the configuration in {cache.cache_dir} for the next start")
        return None, ""
    except Exception as err:  # noqa: BLE001 - a copy for the next start must never stop this loop
        error = f"cannot keep the configuration in {cache.cache_dir} (the next start renders it again): {err}"
        if error != last_error:
            log.write(error)
        return cache, error


def _deployment_id(backend: NodeBackend, log: "Log") -> str:
    """The slurmctld StatefulSet's uid, read from this pod (its name is the hostname): '' where the
    backend is not Kubernetes or the pod cannot be read (the saved tally is then continued)."""
    owner_uid = getattr(backend, "owner_uid", None)
    if owner_uid is None:
        return ""
    pod = os.environ.get("HOSTNAME") or socket.gethostname()
    try:
        return str(owner_uid(pod))
    except BackendError as err:
        log.write(f"cannot tell this deployment from pod {pod}: {err.reason}; continuing the saved tally")
        return ""


def _stop_on_sigterm(log: "Log") -> threading.Event:
    """An event set by SIGTERM (and SIGINT): the loop finishes its pass and exits 0 at once.

    The loop is its container's PID 1, which the kernel shields from signals it does not handle:
    without this, every pod deletion (eviction, rollout, a drained node) would wait out the whole
    termination grace period before the new slurmctld pod could start.
    """
    import signal

    stop = threading.Event()

    def handle(signum: int, _frame: Any) -> None:
        log.write(f"{signal.Signals(signum).name}: stopping after this pass")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
    return stop


def _boot_gate(wanted: bool, log: "Log", env: Mapping[str, str]) -> "BootGate | None":
    """The boot gate, served on its port (elastic/bootgate.py); None when turned off or not served.
    On Kubernetes it serves only the worker pod of the node asked for (bootgate.WorkerPods, one
    pod list by the node's label); a gate that cannot check that is not served (no pod is then
    created ahead of Slurm's resume call)."""
    from ..elastic import bootgate

    if not wanted:
        log.write("no boot gate (--no-boot-gate): no pod is created ahead of Slurm's resume call")
        return None
    is_worker = None
    if Reconcile.from_env(env).backend == "kubernetes":
        from ..elastic.k8s_backend import from_env
        from ..names import L_CLUSTER, L_COMPONENT, L_NODE

        try:
            pods = from_env(env)
        except BackendError as err:
            log.write(f"boot gate not served (it cannot check who asks: {err.reason}); no pod is created "
                      "ahead of Slurm's resume call")
            return None
        selector = f"{L_CLUSTER}={pods.spec.name},{L_COMPONENT}=worker"
        is_worker = bootgate.WorkerPods(lambda node: pods.api.list(pods.namespace, f"{selector},{L_NODE}={node}"))
    gate = bootgate.BootGate()
    return gate if bootgate.serve(gate, bootgate.DEFAULT_PORT, log, is_worker=is_worker) is not None else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurmk8s-reconcile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="one pass, then exit (status 1 if it had errors)")
    parser.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="seconds between passes")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, help="0: no metrics endpoint")
    parser.add_argument("--no-boot-gate", action="store_true",
                        help="serve no boot gate (elastic/bootgate.py, TCP 9412, which the workers ask): no pod is "
                             "created ahead of Slurm's resume call")
    parser.add_argument("--grace", type=float, default=None, help="seconds before a worker / boot is judged")
    parser.add_argument("--pending-timeout", type=float, default=None)
    parser.add_argument("--unschedulable-timeout", type=float, default=None)
    parser.add_argument("--wait-config", metavar="DIR", default="",
                        help="wait until the slurmctld container has filled the configuration directory DIR "
                             "(DIR/.ready) before the first pass (the slurmctld pod's containers)")
    parser.add_argument("--metrics-table", action="store_true",
                        help="print the metrics as a Markdown table and exit")
    return parser


class Loop:
    """The reconcile loop's state from one pass to the next: made once by :func:`start`, then one
    :meth:`one_pass` per period (:func:`main`)."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str], log: "Log", stop: threading.Event) -> None:
        self.args, self.env, self.log, self.stop = args, env, log, stop
        self.settings = Reconcile.from_env(env)
        overrides = {k: v for k, v in (("grace", args.grace), ("pending_timeout", args.pending_timeout),
                                       ("unschedulable_timeout", args.unschedulable_timeout)) if v is not None}
        self.policy = Policy.from_env(env, **overrides)
        self.ledger = FileLedger(self.settings.ledger, self.policy, log=log.write)
        self.metrics = Metrics() if args.metrics_port else None
        self.slurm = SlurmCli(observe=self.metrics.observe_rpc if self.metrics else None)
        self.inventory_path = self.settings.inventory
        self.events = EventTail(self.settings.events)
        self.started = time.time()
        self.programs_server: Any = None
        self.backend: NodeBackend | None = None
        self.usage_file = UsageFile(self.settings.usage) if self.metrics is not None else None
        self.usage_restored, self.usage_error, self.deployment = False, False, ""
        self.restart_watch: dict[str, RestartWatch] = {}  # see classify.restarted_under_job
        self.lost_watch: dict[str, tuple[str, float]] = {}  # see classify.watch_lost
        self.idle: Any = None
        self.live: "LiveNodes | None" = None
        self.notices: "NoticeReader | None" = None
        self.nudge = threading.Event()  # set by the notice watch: the next pass now
        self.cache: "ConfigCache | None" = None
        self.cache_error = ""

    def get_backend(self) -> NodeBackend:
        """Made once; on Kubernetes a long-running loop follows the worker pods with a watch
        instead of listing them all each pass (elastic/podwatch.py); --once just lists."""
        from ..elastic.backend import backend_from_env
        from ..elastic.podwatch import watched

        if self.backend is None:
            made = backend_from_env(self.env)
            self.backend = made if self.args.once else watched(made, self.log)
        return self.backend

    def one_pass(self) -> tuple[int, bool]:
        """(exit status: 1 when the pass had errors, whether the control tier went to sleep)."""
        tick = time.monotonic()
        now = time.time()
        log, live, metrics = self.log, self.live, self.metrics
        errors: list[str] = []
        report = Report()
        live_errors: list[str] = []  # logged by LiveNodes itself
        if live is not None:  # first: this pass judges the workers against the nodes as they are now
            outcome = live.step()
            if outcome.error:
                live_errors.append(outcome.error.splitlines()[0])
        try:
            inventory = _load_inventory(self.inventory_path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            errors.append(f"inventory {self.inventory_path} unreadable: {err}")
            inventory = None
        if inventory is not None:
            try:
                self.get_backend()
            except BackendError as err:
                errors.append(f"backend unavailable: {err.reason}")
        self._restore_usage(now)
        if inventory is not None and self.backend is not None:
            interrupted = self.notices.read() if self.notices is not None else {}
            report = run_once(self.slurm, self.backend, inventory, self.ledger, now, log, self.policy,
                              self.slurm.scontrol, self.restart_watch, self.lost_watch, interrupted)
        if report.snapshot is not None and report.jobs is not None and self.backend is not None:
            report.errors += kueuewait.explain(self.slurm, self.backend, report.snapshot, report.jobs, log,
                                               self.slurm.scontrol)
            report.errors += busy.mark(self.backend, report.snapshot, log)
        if live is not None and report.snapshot is not None:  # cordoned / NotReady / leaving: drained
            live_errors += live.drain(report.snapshot.inventory, report.snapshot.nodes.values())
        if self.cache is not None:
            self.cache, self.cache_error = _keep_config(self.cache, log, self.cache_error)
        report.errors[:0] = errors
        report.errors += live_errors
        for e in errors:
            log.write(f"pass skipped: {e}")
        # the queue, asked of slurmctld at most once a pass (a whole dump of it; and with slurmctld
        # away each ask waits out its timeout): the pass's own read, else one read here
        jobs: list[JobStatus] | None = report.jobs
        if jobs is None and not report.queue_asked and (metrics is not None or self.idle is not None):
            try:
                jobs = parse_jobs(self.slurm.jobs())
            except SlurmCommandError as err:
                log.write(f"cannot read the queue: {err}")
        if metrics is not None:
            pools = [f.pool for f in report.findings if f.kind is Kind.POOL_BACKOFF]
            metrics.observe_pass(report, jobs, now, self.started, time.monotonic() - tick, pools)
            metrics.observe_events(self.events.read())
            self._save_usage()
        code = 1 if report.errors else 0
        if self.idle is not None:
            snap = report.snapshot
            job_doc = None if jobs is None else {"jobs": [{"job_state": [j.state]} for j in jobs]}
            if self.idle.step(job_doc, len(snap.workers) if snap is not None else None, time.time()):
                log.write("control tier asleep: the reconcile loop ends with its pod")
                return code, True
        return code, False

    def _restore_usage(self, now: float) -> None:
        """Once the backend exists: the usage counters saved by an earlier pod of this deployment."""
        if self.metrics is None or self.backend is None or self.usage_file is None or self.usage_restored:
            return
        self.usage_restored = True
        self.deployment = _deployment_id(self.backend, self.log)
        try:
            saved = self.usage_file.load()
        except LedgerError as err:
            self.log.write(f"{err}; counting from now")
            saved = None
        restored, why = resume_usage(saved, self.deployment, now)
        self.metrics.restore_usage(restored)
        self.log.write(why)

    def _save_usage(self) -> None:
        if not self.usage_restored or self.usage_file is None or self.metrics is None:
            return
        try:
            self.usage_file.save(self.metrics.usage(self.deployment))
        except LedgerError as err:
            if not self.usage_error:
                self.log.write(str(err))
            self.usage_error = True

    def close(self) -> None:
        if self.programs_server is not None:
            self.programs_server.close()
        self.log.close()


def start(args: argparse.Namespace) -> Loop | None:
    """Everything before the first pass: the log, metrics endpoint, SIGTERM, the wait for the
    configuration, the programs' socket and boot gate, the idle watch, the node follower. None when
    the pod stopped while waiting for its configuration."""
    from ..elastic.context import program_env
    from ..elastic.warm import serve as serve_programs
    from ..livenodes.cache import cache_from_env
    from ..logs import Log

    env = program_env(os.environ)
    log = Log("reconcile", Reconcile.from_env(env).log)
    # SIGTERM only sets `stop`: a sleep of the control tier under way (slurmctld's own pod is
    # stopping) still scales slurmdbd and the database down before the loop ends
    loop = Loop(args, env, log, _stop_on_sigterm(log))
    if loop.metrics is not None:
        loop.metrics.serve(args.metrics_port)
        log.write(f"metrics on :{args.metrics_port}/metrics")
    if args.wait_config:  # the metrics endpoint (the container's readiness) serves meanwhile
        from ..livenodes.ready import wait_for_config

        # a pod deleted while the configuration never came (a spec that does not render) stops at once
        if wait_for_config(args.wait_config, log.write, stop=loop.stop.is_set) is None:
            log.close()
            return None
    loop.events.read()  # start at the end
    loop.started = time.time()  # the first pass's, not the wait's
    log.write(f"started: period {args.period:.0f}s, grace {loop.policy.grace:.0f}s, ledger {loop.ledger.path}")
    # the power-saving programs Slurm starts hand their calls to this process, imports done (elastic/warm.py)
    # and the workers created ahead of Slurm's resume call ask it before their slurmd registers
    if not args.once:
        loop.programs_server = serve_programs(env, log, _boot_gate(not args.no_boot_gate, log, env))
    loop.idle = idle_watch_from_env(env, log, loop.slurm, loop.get_backend)
    server = loop.programs_server
    loop.live = _live_nodes(env, loop.inventory_path, loop.slurm, log,
                            server.running if server is not None else lambda: 0)
    loop.notices = _notices(env, log, None if args.once else loop.nudge)
    loop.cache = cache_from_env(env, os.path.dirname(loop.inventory_path))
    if loop.live is not None:  # a pinned pool: every start renders from the Kubernetes nodes as they are then
        _drop_config(loop.cache, log)
        loop.cache = None
    return loop


def _wait(loop: Loop, seconds: float) -> None:
    """Until the next pass: `seconds`, or less when the pod stops or a node got an interruption
    notice (loop.nudge)."""
    deadline = time.monotonic() + seconds
    while not loop.stop.is_set() and time.monotonic() < deadline:
        if loop.nudge.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
            loop.nudge.clear()
            return


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.metrics_table:
        sys.stdout.write(metrics_markdown())
        return 0
    loop = start(args)
    if loop is None:
        return 0
    code = 0
    try:
        while not loop.stop.is_set():
            tick = time.monotonic()
            code, asleep = loop.one_pass()
            if asleep or args.once:
                break
            _wait(loop, max(0.5, args.period - (time.monotonic() - tick)))
    finally:
        loop.close()
    return code
