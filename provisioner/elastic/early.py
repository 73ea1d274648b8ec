"""PrologSlurmctld's head start: the worker pods of a just-allocated job's powered-down nodes,
created by the reconcile loop (warm.py) before Slurm's own resume call.

Slurm starts PrologSlurmctld at the allocation, but ResumeProgram only at its next power-save pass
(measured 1 to 2 s later on the local cluster). The prolog (prolog.py) hands the job's
powered-down nodes to the loop, which runs :func:`run_early_resume`; never in a process of its own
(it would pay the imports the head start is meant to save). Each node is held at the boot gate
(bootgate.py) before its pod is created: its slurmd starts only after Slurm's resume call (the
worker's entrypoint asks before `exec slurmd`). No gate, no head start: the nodes are left to that
call. ``SLURMK8S_HEAD_START=0`` in the programs' environment turns it off (prolog.prolog_main).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from .context import Context, RunResult
from .programs import backoff_gates, node_names

if TYPE_CHECKING:
    from .bootgate import BootGate


def run_early_resume(args: Sequence[str], ctx: Context, gate: "BootGate | None" = None) -> RunResult:
    """A head start for the powered-down nodes of a job that was just allocated (args: the job id,
    its nodes, and when the prolog read them powered down, epoch seconds), asked by PrologSlurmctld,
    which Slurm starts at the allocation, while Slurm calls ResumeProgram only at its next
    power-save pass (measured about 1.5 s later). Only creates
    the worker pods that plainly need creating: a node that is unknown, unavailable or in a pool
    in backoff is left alone, nothing is set DOWN, no failure is recorded. Slurm's own resume call
    for the same nodes decides everything as always: it finds the pods made here (and keeps them),
    and retries a create that failed here, with the full handling of a failure."""
    from ..kueue import new_token
    from .plan import Action, plan_resume, with_groups

    job, names = (args[0], node_names(args[1:2], ctx, "early resume")) if args else ("?", None)
    try:  # when the prolog read the nodes powered down (wall clock), if it says
        since = float(args[2]) if len(args) > 2 else None
    except ValueError:
        since = None
    if not names:
        return RunResult(0)
    ctx.log.write(f"early resume for job {job}: {','.join(names)}")
    if gate is None:
        ctx.log.write("no boot gate served: left to Slurm's resume call")
        return RunResult(0)
    try:
        inventory = ctx.inventory()
    except (OSError, ValueError, KeyError, TypeError) as err:
        ctx.log.write(f"inventory unreadable ({err}): left to Slurm's resume call")
        return RunResult(0)
    refuse = {pool: backoff.detail for pool, backoff in backoff_gates(ctx, time.time()).items()}
    decisions = plan_resume(names, inventory, {}, None, refuse)
    creates = [d for d in decisions if d.action is Action.CREATE]
    left = [d.node for d in decisions if d.action is not Action.CREATE]
    if left:
        ctx.log.write(f"left to Slurm's resume call: {','.join(left)}")
    held = set(gate.hold([d.node for d in creates], since))
    if len(held) < len(creates):
        ctx.log.write("resumed by Slurm already: " + ",".join(d.node for d in creates if d.node not in held))
        creates = [d for d in creates if d.node in held]
    if not creates:
        return RunResult(0)
    if job.isdigit():  # pools under Kueue: the pods made here for the job are one pod group
        creates = with_groups(creates, [(int(job), [d.node for d in creates])], {}, ctx.backend().queues(),
                              new_token())
    from .calls import execute

    outcomes, pending = execute(creates, ctx.backend(), deadline=ctx.start + ctx.budget_for(len(creates)),
                                parallel=ctx.parallel, log=ctx.log, clock=ctx.clock)
    ctx.emit(outcomes, pending)
    failed = [o.decision.node for o in outcomes if not o.ok] + [d.node for d in pending]
    ctx.log.write(f"done in {ctx.clock() - ctx.start:.2f}s: {sum(o.ok for o in outcomes)} created"
                  + (f"; {','.join(failed)} left to Slurm's resume call" if failed else ""))
    return RunResult(0)
