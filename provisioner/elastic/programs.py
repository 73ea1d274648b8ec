"""The programs Slurm runs on the slurmctld host: ResumeProgram, SuspendProgram, ResumeFailProgram
and PrologSlurmctld (console scripts slurmk8s-resume, -suspend, -resume-fail, -prolog-slurmctld).

Slurm discards their output, so everything goes to a log file (SLURMK8S_LOG, default
/var/log/slurmk8s/elastic.log). They must return fast: a blocked ResumeProgram stalls slurmctld's
script daemon, so the work is a bounded number of backend calls, run in parallel, within a total
time budget (SLURMK8S_BUDGET seconds, default 20).

Environment:
  SLURMK8S_BACKEND    node backend (default docker; see backend.BACKENDS)
  SLURMK8S_INVENTORY  inventory.json written with the config (default /etc/slurm/inventory.json)
  SLURMK8S_LOG        log file (default /var/log/slurmk8s/elastic.log)
  SLURMK8S_BUDGET     seconds the resume / suspend / resume-fail programs may take (default 20)
  SLURMK8S_PARALLEL   backend calls in flight at once (default 8)
  SLURMK8S_EVENTS     JSON lines, one per decision and its outcome, for the reconcile loop's
                      metrics (default /var/log/slurmk8s/events.jsonl; empty: none)
  SLURMK8S_LEDGER     per-pool resume failure history shared with the reconcile loop (default
                      /var/spool/slurmctld/slurmk8s/ledger.json, on the StateSaveLocation volume);
                      a pool that failed too often is refused at once (reason backoff) for a while
  SLURM_RESUME_FILE   set by Slurm for ResumeProgram (JSON, temporary: read at once)

Slurm starts these programs with a minimal environment (not slurmctld's), so the settings above
(and the backend's) are read from an env file as well: SLURMK8S_ENV_FILE, default
/etc/slurmk8s/elastic.env, KEY=VALUE lines; the process environment wins where both set a key.

This module's top level imports only the standard library's cheapest modules: the prolog runs for
every job and must start fast. The resume / suspend code imports the rest when it runs.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..logs import Log
from .events import DEFAULT_EVENTS
from .ledger import DEFAULT_LEDGER

if TYPE_CHECKING:
    from ..slurm.commands import SlurmControl
    from .backend import NodeBackend
    from .plan import Decision

DEFAULT_ENV_FILE = "/etc/slurmk8s/elastic.env"
DEFAULT_LOG = "/var/log/slurmk8s/elastic.log"
DEFAULT_INVENTORY = "/etc/slurm/inventory.json"
DEFAULT_BUDGET = 20.0
DEFAULT_PARALLEL = 8


# ---------------------------------------------------------------- logging


def append_events(path: str, program: str, outcomes: Sequence["Outcome"], pending: Sequence["Decision"] = (),
                  now: float | None = None) -> str:
    """One JSON line per decision and its outcome (ok / failed / abandoned), appended with one
    write (O_APPEND) so concurrent programs do not interleave lines. Returns an error text or ''."""
    import json

    if not path:
        return ""
    at = time.time() if now is None else now
    rows = [{"ts": round(at, 3), "program": program, "node": o.decision.node, "action": o.decision.action.value,
             "reason": o.decision.reason.value, "outcome": "ok" if o.ok else "failed", "error": o.error[:200]}
            for o in outcomes]
    rows += [{"ts": round(at, 3), "program": program, "node": d.node, "action": d.action.value,
              "reason": d.reason.value, "outcome": "abandoned", "error": ""} for d in pending]
    if not rows:
        return ""
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as err:
        return f"cannot append to the events file {path}: {err}"
    return ""


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines (no quoting, no expansion; '#' starts a comment line) -> dict; {} if absent."""
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep and key.strip().isidentifier():
            out[key.strip()] = value.strip()
    return out


def program_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The env file under the process environment."""
    return {**read_env_file(environ.get("SLURMK8S_ENV_FILE", DEFAULT_ENV_FILE)), **environ}


def _load_env() -> tuple[dict[str, str], str]:
    try:
        return program_env(os.environ), ""
    except OSError as err:
        return dict(os.environ), f"cannot read the env file: {err}; using the process environment only"


def _env_float(env: Mapping[str, str], key: str, default: float) -> float:
    try:
        return float(env.get(key, default))
    except ValueError:
        return default


# ---------------------------------------------------------------- PrologSlurmctld


# ---------------------------------------------------------------- resume / suspend / resume-fail


class Outcome:
    __slots__ = ("decision", "ok", "error", "seconds")

    def __init__(self, decision: "Decision", ok: bool, error: str = "", seconds: float = 0.0) -> None:
        self.decision = decision
        self.ok = ok
        self.error = error
        self.seconds = seconds


def _act(backend: "NodeBackend", decision: "Decision") -> Outcome:
    from .backend import BackendError
    from .plan import Action

    start = time.monotonic()
    try:
        if decision.action in (Action.DELETE, Action.REPLACE):
            backend.delete(decision.node)
        if decision.action in (Action.CREATE, Action.REPLACE):
            if decision.slurm_node is None:
                raise BackendError(decision.node, "no inventory entry to create the worker from")
            backend.create(decision.slurm_node)
    except BackendError as err:
        return Outcome(decision, False, err.reason, time.monotonic() - start)
    except Exception as err:  # noqa: BLE001 -- a bug for one node must still end as that node's DOWN reason
        return Outcome(decision, False, f"internal error {type(err).__name__}: {err}", time.monotonic() - start)
    return Outcome(decision, True, "", time.monotonic() - start)


def execute(
    decisions: Sequence["Decision"], backend: "NodeBackend", *, budget: float, parallel: int, log: Log
) -> tuple[list[Outcome], list["Decision"]]:
    """Carry out the backend actions in parallel within `budget` seconds.

    Returns (outcomes of finished decisions, decisions still running when the budget ran out).
    """
    from concurrent.futures import ThreadPoolExecutor, wait

    from .plan import Action

    outcomes: list[Outcome] = []
    work = []
    for d in decisions:
        if d.action == Action.NOTHING:
            outcomes.append(Outcome(d, True))
        elif d.action == Action.FAIL:
            outcomes.append(Outcome(d, False, d.detail))
        else:
            work.append(d)
    if not work:
        return outcomes, []
    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(work))), thread_name_prefix="slurmk8s")
    futures = {pool.submit(_act, backend, d): d for d in work}
    done, running = wait(futures, timeout=max(0.0, budget))
    pool.shutdown(wait=False, cancel_futures=True)
    for fut in done:
        outcomes.append(fut.result())
    for out in outcomes:
        if out.decision.action not in (Action.NOTHING, Action.FAIL):
            state = "ok" if out.ok else f"FAILED: {out.error}"
            log.write(f"{out.decision.node} {out.decision.action.value} {state} ({out.seconds:.2f}s)")
    pending = [futures[f] for f in running]
    return outcomes, pending


def _set_down(slurm: "SlurmControl", failures: Mapping[str, str], log: Log) -> None:
    """Set failed nodes DOWN with their reason, one scontrol call per distinct reason."""
    from ..slurm.commands import SlurmCommandError

    by_reason: dict[str, list[str]] = {}
    for node, reason in failures.items():
        by_reason.setdefault(reason, []).append(node)
    for reason, nodes in by_reason.items():
        try:
            slurm.set_down(nodes, reason)
            log.write(f"set DOWN {','.join(nodes)}: {reason}")
        except SlurmCommandError as err:
            log.write(f"could not set DOWN {','.join(nodes)} ({reason}): {err}")


class Context:
    """What a program run needs, gathered from the environment (or given by a test)."""

    def __init__(self, env: Mapping[str, str], log: Log, *, backend: "NodeBackend | None" = None,
                 slurm: "SlurmControl | None" = None, inventory=None, ledger=None) -> None:
        self.env = env
        self.log = log
        self._backend = backend
        self._slurm = slurm
        self._inventory = inventory
        self.start = time.monotonic()
        self._ledger = ledger
        self.budget = _env_float(env, "SLURMK8S_BUDGET", DEFAULT_BUDGET)
        self.parallel = int(_env_float(env, "SLURMK8S_PARALLEL", DEFAULT_PARALLEL))

    def remaining(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    @property
    def slurm(self) -> "SlurmControl":
        if self._slurm is None:
            from ..slurm.commands import Scontrol

            self._slurm = Scontrol()
        return self._slurm

    def backend(self) -> "NodeBackend":
        if self._backend is None:
            from .backend import backend_from_env

            self._backend = backend_from_env(self.env)
        return self._backend

    @property
    def program(self) -> str:
        return self.log.program.split("[", 1)[0]

    def ledger(self):
        """The per-pool failure ledger (reconcile.FileLedger at SLURMK8S_LEDGER); None without one.

        The programs' entry points (`_main`) default SLURMK8S_LEDGER / SLURMK8S_EVENTS; a Context
        built without them (tests) has no ledger and writes no events.
        """
        if self._ledger is None and self.env.get("SLURMK8S_LEDGER"):
            from .ledger import FileLedger, Policy

            self._ledger = FileLedger(self.env["SLURMK8S_LEDGER"], Policy.from_env(self.env))
        return self._ledger

    def emit(self, outcomes: Sequence["Outcome"], pending: Sequence["Decision"] = ()) -> None:
        error = append_events(self.env.get("SLURMK8S_EVENTS", ""), self.program, outcomes, pending)
        if error:
            self.log.write(error)

    def inventory(self):
        if self._inventory is None:
            from ..inventory import Inventory

            self._inventory = Inventory.read(self.env.get("SLURMK8S_INVENTORY", DEFAULT_INVENTORY))
        return self._inventory


class RunResult:
    """What a program run did: exit code, nodes set DOWN, whether work was left running."""

    def __init__(self, code: int, down: Mapping[str, str] | None = None, abandoned: bool = False) -> None:
        self.code = code
        self.down = dict(down or {})
        self.abandoned = abandoned


def _workers(ctx: Context) -> Mapping:
    from .backend import BackendError

    try:
        return ctx.backend().list()
    except BackendError as err:
        ctx.log.write(f"cannot list workers ({err.reason}); deciding as if none existed (creates are idempotent)")
        return {}


def _finish(ctx: Context, decisions: Sequence["Decision"], failure_prefix: str) -> RunResult:
    """Log decisions, execute, set failures DOWN, log a summary."""
    from .plan import down_reason

    for d in decisions:
        ctx.log.write(f"decide {d.describe()}")
    outcomes, pending = execute(decisions, ctx.backend(), budget=ctx.remaining(), parallel=ctx.parallel,
                                log=ctx.log)
    failures = {o.decision.node: down_reason(o.decision, f"{failure_prefix}{o.error}")
                for o in outcomes if not o.ok}
    for d in pending:
        failures[d.node] = down_reason(d, f"{failure_prefix}backend did not answer within the {ctx.budget:.0f}s budget")
    if pending:
        ctx.log.write(f"{len(pending)} backend calls still running after {ctx.budget:.0f}s: abandoned "
                      f"({', '.join(d.node for d in pending)})")
    if failures:
        _set_down(ctx.slurm, failures, ctx.log)
    ctx.emit(outcomes, pending)
    ok = sum(o.ok for o in outcomes)
    ctx.log.write(f"done in {time.monotonic() - ctx.start:.2f}s: {ok} ok, {len(failures)} failed")
    return RunResult(1 if failures else 0, failures, bool(pending))


def _fail_all(ctx: Context, names: Sequence[str], why: str) -> RunResult:
    from .plan import Action, Decision, Reason, down_reason

    failures = {n: down_reason(Decision(n, Action.FAIL, Reason.RESUME, why)) for n in names}
    ctx.log.write(f"cannot resume {','.join(names)}: {why}")
    _set_down(ctx.slurm, failures, ctx.log)
    ctx.emit([Outcome(Decision(n, Action.FAIL, Reason.RESUME, why), False, why) for n in names])
    return RunResult(1, failures)


def _pool_backoffs(ctx: Context) -> dict[str, str]:
    """pool -> refusal reason for the pools in backoff; {} when the ledger cannot be read (logged)."""
    from .ledger import LedgerError, Policy, active_backoffs

    ledger = ctx.ledger()
    if ledger is None:
        return {}
    try:
        return active_backoffs(ledger, time.time(), Policy.from_env(ctx.env))
    except LedgerError as err:
        ctx.log.write(f"{err}; resuming without the pool backoff check")
        return {}


def _record_failures(ctx: Context, nodes: Mapping[str, str], inventory) -> None:
    """Failed resumes -> the pool failure ledger (drives the backoff)."""
    from .ledger import LedgerError

    ledger = ctx.ledger()
    if ledger is None:
        return
    now = time.time()
    for node, reason in nodes.items():
        if node not in inventory:
            continue
        try:
            ledger.record_failure(inventory[node].pool, node, reason, now)
        except LedgerError as err:
            ctx.log.write(f"{err}; failure of {node} not recorded")
            return


def _node_names(args: Sequence[str], ctx: Context, program: str) -> list[str] | None:
    """The node names in the hostlist expressions Slurm passed; None (logged) when unparsable."""
    from .plan import InputError, parse_hostlists

    try:
        return parse_hostlists(args)
    except InputError as err:
        ctx.log.write(f"{program} {list(args)}: {err}; nothing done")
        return None


def run_resume(args: Sequence[str], ctx: Context, resume_file_text: str | None) -> RunResult:
    from .backend import BackendError
    from .plan import Action, InputError, parse_resume_file, plan_resume

    names = _node_names(args, ctx, "resume")
    if names is None:
        return RunResult(2)
    request = None
    if resume_file_text is not None:
        try:
            request = parse_resume_file(resume_file_text)
            ctx.log.write("resume file: " + "; ".join(
                f"job {j.job_id} resumes {','.join(j.nodes_resume)} of {','.join(j.nodes_alloc)}"
                for j in request.jobs) if request.jobs else "resume file: no jobs")
        except InputError as err:
            ctx.log.write(f"{err}; going by the hostlist alone")
    ctx.log.write(f"resume {len(names)} nodes: {','.join(names)}")
    if not names:
        return RunResult(0)
    try:
        inventory = ctx.inventory()
    except (OSError, ValueError, KeyError, TypeError) as err:
        return _fail_all(ctx, names, f"inventory {ctx.env.get('SLURMK8S_INVENTORY', DEFAULT_INVENTORY)} "
                                     f"unreadable: {err}")
    try:
        ctx.backend()
    except BackendError as err:
        return _fail_all(ctx, names, f"backend unavailable: {err.reason}")
    backoff = _pool_backoffs(ctx)
    decisions = plan_resume(names, inventory, _workers(ctx), request, backoff)
    result = _finish(ctx, decisions, "")
    # failures of the backend (and of our budget) count towards the pool's backoff; refusals
    # (unknown node, unavailable, backoff itself) do not
    counted = {d.node for d in decisions if d.action in (Action.CREATE, Action.REPLACE)}
    _record_failures(ctx, {n: r for n, r in result.down.items() if n in counted}, inventory)
    return result


def run_suspend(args: Sequence[str], ctx: Context) -> RunResult:
    from .backend import BackendError
    from .plan import plan_suspend

    names = _node_names(args, ctx, "suspend")
    if names is None:
        return RunResult(2)
    ctx.log.write(f"suspend {len(names)} nodes: {','.join(names)}")
    if not names:
        return RunResult(0)
    try:
        ctx.backend()
    except BackendError as err:
        ctx.log.write(f"backend unavailable: {err.reason}")
        failures = {n: f"slurmk8s suspend: backend unavailable: {err.reason}"[:200] for n in names}
        _set_down(ctx.slurm, failures, ctx.log)
        return RunResult(1, failures)
    return _finish(ctx, plan_suspend(names, _workers(ctx)), "worker not removed: ")


def run_resume_fail(args: Sequence[str], ctx: Context) -> RunResult:
    from .backend import BackendError
    from .plan import plan_resume_fail

    names = _node_names(args, ctx, "resume-fail")
    if names is None:
        return RunResult(2)
    ctx.log.write(f"resume-fail: Slurm gave up on {len(names)} nodes: {','.join(names)}")
    if not names:
        return RunResult(0)
    try:
        ctx.backend()
    except BackendError as err:
        ctx.log.write(f"backend unavailable, workers of {','.join(names)} may be left behind: {err.reason}")
        return RunResult(1)
    result = _finish(ctx, plan_resume_fail(names, _workers(ctx)), "worker not removed after failed resume: ")
    try:
        inventory = ctx.inventory()
    except (OSError, ValueError, KeyError, TypeError) as err:
        ctx.log.write(f"inventory unreadable, failures not recorded for the pool backoff: {err}")
    else:
        _record_failures(ctx, {n: "slurmk8s resume-failed: no registration within ResumeTimeout" for n in names},
                         inventory)
    # Slurm left these nodes DOWN+POWERED_DOWN (reason kept, jobs requeued). With no worker left
    # behind, return them to powered-down IDLE so a later job can try again: a node that failed
    # is retried at most once per ResumeTimeout, and requeued jobs wait 120 s before they retry.
    clean = [n for n in names if n not in result.down]
    if clean:
        from ..slurm.commands import SlurmCommandError

        try:
            ctx.slurm.return_to_service(clean)
            ctx.log.write(f"returned {','.join(clean)} to service (powered down, idle)")
        except SlurmCommandError as err:
            ctx.log.write(f"could not return {','.join(clean)} to service: {err}")
            result.code = 1
    return result




def _main(program: str, run: Callable[[Sequence[str], Context], RunResult]) -> int:
    env, env_error = _load_env()
    env = {"SLURMK8S_EVENTS": DEFAULT_EVENTS, "SLURMK8S_LEDGER": DEFAULT_LEDGER, **env}
    log = Log(program, env.get("SLURMK8S_LOG", DEFAULT_LOG))
    if env_error:
        log.write(env_error)
    result = run(sys.argv[1:], Context(env, log))
    log.close()
    if result.abandoned:
        # backend calls still hang in worker threads: do not let the interpreter wait for them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(result.code)
    return result.code


def resume_main() -> int:
    # the file is temporary: read it before anything else
    path = os.environ.get("SLURM_RESUME_FILE")
    text: str | None = None
    read_error = ""
    if path:
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError as err:
            read_error = f"cannot read SLURM_RESUME_FILE {path}: {err}"

    def run(args: Sequence[str], ctx: Context) -> RunResult:
        if read_error:
            ctx.log.write(read_error)
        return run_resume(args, ctx, text)

    return _main("resume", run)


def suspend_main() -> int:
    return _main("suspend", run_suspend)


def resume_fail_main() -> int:
    return _main("resume-fail", run_resume_fail)
