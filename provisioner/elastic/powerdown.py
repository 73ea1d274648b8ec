"""The end of a suspend: a node's power-down ends once its worker is gone, not at SuspendTimeout.

Slurm keeps a suspended node POWERING_DOWN (``idle%`` in sinfo) for SuspendTimeout, the time a
machine may take to switch off, and only then makes it POWERED_DOWN (``idle~``) and available.
Nothing schedules at that moment: a job that arrived meanwhile, with no other node free, waits on
for Slurm's next backfill pass (bf_interval, 30 s) or its periodic main pass (sched_interval, 60 s).
On the local cluster (P3, ``bench/bursty_day.py``) jobs submitted a few seconds after their nodes'
suspend started 45 s later, while the worker pods had been gone 0.5 s after their deletion.

So the suspend program, once the backend no longer lists a node's worker, ends that node's
power-down with ``scontrol update nodename=... state=RESUME``: Slurm's own way (its power-saving
guide: RESUME "will also clear the POWERING_DOWN state of a node and make it eligible to be
allocated"), and an update that, like every node update, queues a scheduling pass. A node is
touched only while it is still plainly powering down (``idle%``): one drained, set DOWN or failed
meanwhile is left to Slurm, since RESUME would also clear that. A worker still there when
SuspendTimeout is near is left to Slurm's timeout, as before.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from ..logs import Log

if TYPE_CHECKING:
    from .context import Context

POLL = 0.25  # seconds between two looks at the workers
MARGIN = 1.0  # seconds before SuspendTimeout at which Slurm's own timeout is left to do it
POWERING_DOWN = "idle%"  # sinfo's extended state of a node powering down and nothing else
SLURM_DEFAULT_SUSPEND_TIMEOUT = 30.0  # Slurm's SuspendTimeout when slurm.conf does not set it


def after_suspend(ctx: "Context", names: Sequence[str]) -> list[str]:
    """The suspend program's last step, for the nodes whose workers it removed: end their
    power-down as soon as those are gone, until shortly before SuspendTimeout (counted, like
    Slurm's, from before this run started)."""
    from .context import DEFAULT_SLURM_CONF, conf_seconds

    backend = ctx.backend()
    suspend_timeout = conf_seconds(ctx.env.get("SLURM_CONF", DEFAULT_SLURM_CONF), "SuspendTimeout")
    left = (suspend_timeout or SLURM_DEFAULT_SUSPEND_TIMEOUT) - MARGIN - (ctx.clock() - ctx.start)
    from .quiesce import Hold

    return end_when_gone(names, lambda waiting: backend.list(waiting).keys(), ctx.slurm.node_states,
                         ctx.slurm.end_power_down, ctx.log, left, clock=ctx.clock, sleep=ctx.sleep,
                         stop=Hold.of(ctx.env).held)


def end_when_gone(
    names: Sequence[str],
    present: Callable[[Sequence[str]], Iterable[str]],
    states_of: Callable[[Sequence[str]], list[str] | None],
    end: Callable[[Sequence[str]], None],
    log: Log,
    timeout: float,
    poll: float = POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    stop: Callable[[], bool] = lambda: False,
) -> list[str]:
    """Wait (at most `timeout` seconds) for the workers of `names` to be gone, and end the
    power-down of each node gone that is still plainly powering down; returns those ended.
    `stop()`: a reconfigure is due (quiesce.Hold): leave the rest to SuspendTimeout now.

    `present(names)`: the nodes of `names` whose worker still exists (a BackendError is taken as
    "all still there", and logged once); `states_of(names)`: their sinfo extended states in that
    order, None when unknown; `end(names)`: ``scontrol update nodename=... state=RESUME``."""
    from .backend import BackendError

    start = clock()
    waiting = list(names)
    ended: list[str] = []
    logged = False
    while waiting:
        unread = ""  # why this look saw nothing: said when the wait ends on it
        try:
            there = set(present(waiting))
        except BackendError as err:  # the API's passing error: look again; Slurm's timeout is the fallback
            if not logged:
                log.write(f"cannot list the workers ({err.reason}); looking again")
            logged, unread, there = True, f"their workers could not be listed: {err.reason}", set(waiting)
        gone = [n for n in waiting if n not in there]
        states = states_of(gone) if gone else None
        if gone and (states is None or len(states) != len(gone)):
            unread = "sinfo did not answer for them"
        elif gone and states is not None:  # (None is the branch above)
            waiting = [n for n in waiting if n in there]
            ready = [n for n, s in zip(gone, states) if s == POWERING_DOWN]
            kept = [f"{n} ({s})" for n, s in zip(gone, states) if s != POWERING_DOWN and s.endswith("%")]
            if kept:
                log.write(f"power-down of {', '.join(kept)} left to SuspendTimeout: not plainly powering down")
            done = _end(ready, end, log) if ready else []
            if done:
                ended += done
                log.write(f"power-down of {','.join(done)} ended {clock() - start:.2f}s after the workers' "
                          "deletion (gone): available to the next job now, not at SuspendTimeout")
        if not waiting:
            break
        if stop():
            log.write(f"power-down of {','.join(waiting)} left to SuspendTimeout: a reconfigure is due "
                      "(slurmctld answers nothing during it until this program ends)")
            break
        if clock() - start >= timeout:
            log.write(f"power-down of {','.join(waiting)} left to SuspendTimeout: after {max(timeout, 0):.1f}s "
                      + (unread or "their workers are still there"))
            break
        sleep(poll)
    return ended


def _end(ready: Sequence[str], end: Callable[[Sequence[str]], None], log: Log) -> list[str]:
    """One `scontrol update` for all of `ready`; when it fails, one per node (Slurm applies an
    update to the nodes it can and fails the call for the rest, e.g. a node whose SuspendTimeout
    just passed): the nodes whose power-down was ended."""
    try:
        end(ready)
        return list(ready)
    except Exception as err:  # noqa: BLE001 - Slurm's timeout still ends it
        if len(ready) == 1:
            log.write(f"could not end the power-down of {ready[0]} ({err}); it is available at SuspendTimeout")
            return []
    return [n for node in ready for n in _end([node], end, log)]
