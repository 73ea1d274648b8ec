"""The programs Slurm runs on the slurmctld host: ResumeProgram, SuspendProgram, ResumeFailProgram
and PrologSlurmctld (console scripts slurmk8s-resume, -suspend, -resume-fail, -prolog-slurmctld).

Slurm discards their output, so everything goes to a log file (SLURMK8S_LOG, default
/var/log/slurmk8s/elastic.log). Slurm 24.11 runs them asynchronously (slurmscriptd) and kills one
still running after max(ResumeTimeout, SuspendTimeout); within that the backend calls run in
parallel up to a deadline derived from the number of calls (20 s per wave of SLURMK8S_PARALLEL
calls, at most that Slurm timeout less 30 s), so a resume of any size the API can serve completes;
failures are reported (DOWN) as they come.

Environment:
  SLURMK8S_BACKEND    node backend (default docker; see backend.BACKENDS)
  SLURMK8S_INVENTORY  inventory.json written with the config (default /etc/slurm/inventory.json)
  SLURMK8S_LOG        log file (default /var/log/slurmk8s/elastic.log)
  SLURMK8S_BUDGET     seconds the resume / suspend / resume-fail programs may take (default:
                      derived as above from the number of calls and slurm.conf at SLURM_CONF,
                      default /etc/slurm/slurm.conf)
  SLURMK8S_PARALLEL   backend calls in flight at once (default 8)
  SLURMK8S_EVENTS     JSON lines, one per decision and its outcome, for the reconcile loop's
                      metrics (default /var/log/slurmk8s/events.jsonl; empty: none)
  SLURMK8S_LEDGER     per-pool resume failure history shared with the reconcile loop (default
                      /var/spool/slurmctld/slurmk8s/ledger.json, on the StateSaveLocation volume);
                      a pool that failed too often is refused at once (reason backoff) for a while
  SLURMK8S_PROGRAM_SOCKET  where the reconcile loop serves these programs warm (warm.py; default
                      /run/slurmk8s/programs/programs.sock; empty: always run in this process)
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

from .. import settings
from ..logs import Log
from ..settings import Programs
from .context import (DEFAULT_BUDGET, DEFAULT_ENV_FILE, DEFAULT_INVENTORY, DEFAULT_LOG, DEFAULT_PARALLEL,  # noqa: F401
                      DEFAULT_SLURM_CONF, LIST_RETRY_PAUSES, SLURM_DEFAULT_TIMEOUT, SLURM_TIMEOUT_MARGIN, Context,
                      RunResult, _load_env, append_events, conf_seconds, program_env, read_env_file)
from .events import DEFAULT_EVENTS
from .ledger import DEFAULT_LEDGER

if TYPE_CHECKING:
    from ..slurm.commands import SlurmControl
    from .calls import Outcome
    from .plan import Decision


# ---------------------------------------------------------------- resume / suspend / resume-fail


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


def _workers(ctx: Context, names: Sequence[str]) -> Mapping:
    """The workers of these nodes (every decision is about the nodes Slurm named). A failed list is
    an error, never an empty list: a transient one (retryable) is tried again, at most three times
    within the budget, then raised."""
    from .backend import BackendError

    for pause in (*LIST_RETRY_PAUSES, None):
        try:
            return ctx.backend().list(names)
        except BackendError as err:
            if not err.retryable or pause is None or ctx.remaining() < pause + 1:
                raise
            ctx.log.write(f"cannot list workers ({err.reason}); trying again in {pause:.1f}s")
            ctx.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def _cannot_see(ctx: Context, names: Sequence[str], reason: str, why: str) -> RunResult:
    """Suspend / resume-fail without a view of the workers: fail loudly. Exit 1 (Slurm 24.11 only
    logs it) and the nodes DOWN with a slurmk8s reason, so none goes back to service while its
    worker may remain; the reconcile loop then deletes the worker of a powered-down node and
    returns the node (down-powered-down)."""
    failures = {n: " ".join(f"slurmk8s {reason}: {why}; its worker may remain".replace('"', "'").split())[:200]
                for n in names}
    ctx.log.write(f"{reason} {','.join(names)}: {why}; nothing done, nodes set DOWN")
    _set_down(ctx.slurm, failures, ctx.log)
    return RunResult(1, failures)


def _workers_in_view(ctx: Context, names: Sequence[str], reason: str) -> Mapping | RunResult:
    """Suspend / resume-fail: these nodes' workers, or the result of failing without them (_cannot_see)."""
    from .backend import BackendError

    try:
        ctx.backend()
    except BackendError as err:
        return _cannot_see(ctx, names, reason, f"backend unavailable: {err.reason}")
    try:
        return _workers(ctx, names)
    except BackendError as err:
        return _cannot_see(ctx, names, reason, f"cannot list workers: {err.reason}")


def _finish(ctx: Context, decisions: Sequence["Decision"], failure_prefix: str) -> RunResult:
    """Log decisions, execute, set failures DOWN as they come, log a summary."""
    from .calls import execute
    from .plan import Action, down_reason

    for d in decisions:
        ctx.log.write(f"decide {d.describe()}")
    failures: dict[str, str] = {}

    def down(outcomes: list) -> None:
        batch = {o.decision.node: down_reason(o.decision, f"{failure_prefix}{o.error}") for o in outcomes}
        failures.update(batch)
        _set_down(ctx.slurm, batch, ctx.log)

    budget = ctx.budget_for(sum(d.action not in (Action.NOTHING, Action.FAIL) for d in decisions))
    outcomes, pending = execute(decisions, ctx.backend(), deadline=ctx.start + budget, parallel=ctx.parallel,
                                log=ctx.log, clock=ctx.clock, on_failures=down)
    if pending:
        ctx.log.write(f"{len(pending)} backend calls still running after {budget:.0f}s: abandoned "
                      f"({', '.join(d.node for d in pending)})")
        down([_outcome(d, False, f"backend did not answer within the {budget:.0f}s budget") for d in pending])
    ctx.emit(outcomes, pending)
    ok = sum(o.ok for o in outcomes)
    ctx.log.write(f"done in {ctx.clock() - ctx.start:.2f}s: {ok} ok, {len(failures)} failed")
    return RunResult(1 if failures else 0, failures, [d.node for d in pending])


def _outcome(decision: "Decision", ok: bool, error: str = "") -> "Outcome":
    from .calls import Outcome

    return Outcome(decision, ok, error)


def _fail_all(ctx: Context, names: Sequence[str], why: str) -> RunResult:
    from .plan import Action, Decision, Reason, down_reason

    failures = {n: down_reason(Decision(n, Action.FAIL, Reason.RESUME, why)) for n in names}
    ctx.log.write(f"cannot resume {','.join(names)}: {why}")
    _set_down(ctx.slurm, failures, ctx.log)
    ctx.emit([_outcome(Decision(n, Action.FAIL, Reason.RESUME, why), False, why) for n in names])
    return RunResult(1, failures)


def backoff_gates(ctx: Context, now: float) -> dict:
    """pool -> ledger.Gate for the pools in backoff; {} when the ledger cannot be read (logged)."""
    from .ledger import LedgerError, Policy, pool_gates

    ledger = ctx.ledger()
    if ledger is None:
        return {}
    try:
        return pool_gates(ledger, now, Policy.from_env(ctx.env))
    except LedgerError as err:
        ctx.log.write(f"{err}; resuming without the pool backoff check")
        return {}


def _backoff(ctx: Context, names: Sequence[str], inventory, workers: Mapping) -> tuple[dict[str, str], dict[str, str]]:
    """(pool -> refusal reason, node -> trial reason): cooling-off pools refuse their nodes; a
    half-open pool lets one node through as its trial (claimed in the ledger) and refuses the rest."""
    from .ledger import LedgerError
    from .plan import trial_candidates

    now = time.time()
    gates = backoff_gates(ctx, now)
    refuse = {pool: g.detail for pool, g in gates.items()}
    trials: dict[str, str] = {}
    for pool, node in trial_candidates(names, inventory, workers, [p for p, g in gates.items() if g.trial]).items():
        try:
            claimed = ctx.ledger().claim_trial(pool, node, now)
        except LedgerError as err:
            ctx.log.write(f"{err}; {node} resumes as pool {pool}'s trial unrecorded")
            claimed = True
        if claimed:
            trials[node] = f"trial resume of pool {pool} after its backoff"
            refuse[pool] = f"{gates[pool].why}; cooled off: {node} is the trial resume"
        else:
            refuse[pool] = f"{gates[pool].why}; cooled off: another trial resume is in progress"
    return refuse, trials


def _record_failures(ctx: Context, nodes: Mapping[str, str], inventory,
                     attempts: Mapping[str, str] | None = None) -> None:
    """Failed resumes -> the pool failure ledger (drives the backoff); `attempts`: node -> the uid
    of the worker that failed (one attempt counts once, whoever reports it)."""
    from .ledger import LedgerError

    ledger = ctx.ledger()
    if ledger is None:
        return
    now = time.time()
    for node, reason in nodes.items():
        if node not in inventory:
            continue
        try:
            ledger.record_failure(inventory[node].pool, node, reason, now, (attempts or {}).get(node, ""))
        except LedgerError as err:
            ctx.log.write(f"{err}; failure of {node} not recorded")
            return


def node_names(args: Sequence[str], ctx: Context, program: str) -> list[str] | None:
    """The node names in the hostlist expressions Slurm passed; None (logged) when unparsable."""
    from .plan import InputError, parse_hostlists

    try:
        return parse_hostlists(args)
    except InputError as err:
        ctx.log.write(f"{program} {list(args)}: {err}; nothing done")
        return None


def run_resume(args: Sequence[str], ctx: Context, resume_file_text: str | None) -> RunResult:
    from .backend import BackendError
    from ..kueue import new_token
    from .plan import Action, InputError, Reason, parse_resume_file, plan_resume, with_groups

    names = node_names(args, ctx, "resume")
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
        return _fail_all(ctx, names, f"inventory {ctx.settings.inventory} "
                                     f"unreadable: {err}")
    try:
        ctx.backend()
    except BackendError as err:
        return _fail_all(ctx, names, f"backend unavailable: {err.reason}")
    try:
        workers = _workers(ctx, names)
    except BackendError as err:
        # creates are idempotent: each one looks at what is there (adopts a live worker, replaces a dead one)
        ctx.log.write(f"cannot list workers ({err.reason}); deciding as if none existed")
        workers = {}
    refuse, trials = _backoff(ctx, names, inventory, workers)
    decisions = plan_resume(names, inventory, workers, request, refuse, trials)
    jobs = [(j.job_id, j.nodes_resume) for j in request.jobs] if request else []
    decisions = with_groups(decisions, jobs, workers, ctx.backend().queues(), new_token())
    result = _finish(ctx, decisions, "")
    # failures of the backend count towards the pool's backoff; refusals (unknown node, unavailable,
    # backoff itself) do not, nor calls abandoned at the deadline: their outcome is unknown, and a
    # worker they made after all is judged by its uid (the loop, resume-fail)
    counted = {d.node for d in decisions if d.action in (Action.CREATE, Action.REPLACE, Action.ADOPT)} - set(result.pending)
    _record_failures(ctx, {n: r for n, r in result.down.items() if n in counted}, inventory)
    # a node refused for backoff, or because its Kubernetes node must not take pods (cordoned,
    # NotReady, leaving), is DOWN (its jobs requeue) but still powering up: POWER_DOWN_FORCE ends
    # that at once, so it is idle~ again after SuspendTimeout (drained while its Kubernetes node is
    # unavailable, in service once it is not), instead of waiting out ResumeTimeout
    why = {Reason.BACKOFF: "backoff", Reason.UNAVAILABLE: "unavailable"}
    refused = {d.node: why[d.reason] for d in decisions if d.reason in why and d.node in result.down}
    if refused:
        from ..slurm.commands import SlurmCommandError

        try:
            ctx.slurm.power_down(list(refused))
            for reason in sorted(set(refused.values())):  # e.g. "powered down gpu-3 (refused for backoff)"
                nodes = ",".join(n for n, r in refused.items() if r == reason)
                ctx.log.write(f"powered down {nodes} (refused for {reason})")
        except SlurmCommandError as err:
            ctx.log.write(f"could not power down {','.join(refused)}: {err}; they return at ResumeTimeout")
    return result


def run_suspend(args: Sequence[str], ctx: Context) -> RunResult:
    from .plan import plan_suspend

    names = node_names(args, ctx, "suspend")
    if names is None:
        return RunResult(2)
    ctx.log.write(f"suspend {len(names)} nodes: {','.join(names)}")
    if not names:
        return RunResult(0)
    workers = _workers_in_view(ctx, names, "suspend")
    if isinstance(workers, RunResult):
        return workers
    result = _finish(ctx, plan_suspend(names, workers), "worker not removed: ")
    # only nodes whose worker this run removed: one that had none (refused for backoff, a worker
    # gone missing: POWER_DOWN_FORCE) keeps SuspendTimeout, which paces its next attempt
    removed = [n for n in names if n in workers and n not in result.down and n not in result.pending]
    if removed:
        from .powerdown import after_suspend

        after_suspend(ctx, removed)
    return result


def run_resume_fail(args: Sequence[str], ctx: Context) -> RunResult:
    from .plan import plan_resume_fail

    names = node_names(args, ctx, "resume-fail")
    if names is None:
        return RunResult(2)
    ctx.log.write(f"resume-fail: Slurm gave up on {len(names)} nodes: {','.join(names)}")
    if not names:
        return RunResult(0)
    workers = _workers_in_view(ctx, names, "resume-failed")
    if isinstance(workers, RunResult):
        return workers
    result = _finish(ctx, plan_resume_fail(names, workers), "worker not removed after failed resume: ")
    try:
        inventory = ctx.inventory()
    except (OSError, ValueError, KeyError, TypeError) as err:
        ctx.log.write(f"inventory unreadable, failures not recorded for the pool backoff: {err}")
    else:
        # only a node that had a worker failed here: Slurm hands over every node still powering up,
        # nodes the resume program refused or whose create failed (counted then) included; nor
        # does one whose Kubernetes node must not take pods (cordoned, NotReady, leaving)
        had = [n for n in names if n in workers and not (n in inventory and inventory[n].unavailable)]
        # nor one Kueue never admitted: the queue had no quota for its job within ResumeTimeout,
        # which bounds that wait (the job is requeued); the pool's pods are fine
        for n in [n for n in had if workers[n].gated]:
            ctx.log.write(f"{n}: still waiting for Kueue's admission (group {workers[n].group or 'none'}): "
                          "not a failure of the pool")
        had = [n for n in had if not workers[n].gated]
        _record_failures(ctx, {n: "slurmk8s resume-failed: no registration within ResumeTimeout" for n in had},
                         inventory, {n: workers[n].uid for n in had})
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


def with_program_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The programs' environment: the events file and the failure ledger on by default."""
    return {settings.EVENTS: DEFAULT_EVENTS, settings.LEDGER: DEFAULT_LEDGER, **env}


def program_log(program: str, env: Mapping[str, str], pid: int | None = None) -> Log:
    return Log(program, Programs.from_env(env).log, pid=pid)


RUNS: dict[str, Callable[..., RunResult]] = {"resume": run_resume, "suspend": run_suspend,
                                             "resume-fail": run_resume_fail}


def _main(program: str, resume_file: str | None = None, read_error: str = "") -> int:
    """Run `program` for Slurm: by the reconcile loop when it serves (warm.py: no imports to wait
    for), else here. Returns the exit code for Slurm."""
    from .warmcall import NotServed, delegate, socket_path

    env, env_error = _load_env()
    env = with_program_defaults(env)
    log = program_log(program, env)
    if env_error:
        log.write(env_error)
    if read_error:
        log.write(read_error)
    args = sys.argv[1:]
    try:
        return delegate(socket_path(env), program, args, resume_file)
    except NotServed as why:
        if str(why):
            log.write(f"{why}; running {program} in this process")
    ctx = Context(env, log)
    result = RUNS[program](args, ctx, resume_file) if program == "resume" else RUNS[program](args, ctx)
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
    return _main("resume", text, read_error)


def suspend_main() -> int:
    return _main("suspend")


def resume_fail_main() -> int:
    return _main("resume-fail")
