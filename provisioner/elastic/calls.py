"""The backend calls of one resume / suspend / resume-fail run: in parallel, up to a deadline,
failures reported as they come (so a node whose create failed in the first wave of a large resume
is DOWN, its job requeued, at once, not when the last wave is done).

Imported by the programs when they run (not by the prolog, which must start fast).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from .backend import BackendError, WorkerReplaced
from .plan import Action, Decision

if TYPE_CHECKING:
    from ..logs import Log
    from .backend import NodeBackend

SLICE = 0.25  # at most this long (real seconds) between two looks at the deadline and the failures
FLUSH_EVERY = 1.0  # failures are handed on at most this often (one scontrol call per batch)


class Outcome:
    __slots__ = ("decision", "ok", "error", "seconds")

    def __init__(self, decision: Decision, ok: bool, error: str = "", seconds: float = 0.0) -> None:
        self.decision = decision
        self.ok = ok
        self.error = error
        self.seconds = seconds


def act(backend: "NodeBackend", decision: Decision) -> Outcome:
    """Carry out one decision's backend calls; an error is the node's outcome, never raised."""
    start = time.monotonic()
    try:
        if decision.action is Action.DELETE:
            backend.delete(decision.node)  # Slurm's word is about the node: whatever worker it has goes
        elif decision.action is Action.REPLACE:
            try:
                backend.delete(decision.node, decision.uid or None)
            except WorkerReplaced:
                pass  # not the dead worker any more: the create looks at the one there now
        elif decision.action is Action.ADOPT and backend.adopt(decision.node, decision.uid, decision.version):
            return Outcome(decision, True, "", time.monotonic() - start)
        if decision.action in (Action.CREATE, Action.REPLACE, Action.ADOPT):
            # ADOPT here: the worker was not kept (a delete came first, or it died): the node's next one
            if decision.slurm_node is None:
                raise BackendError(decision.node, "no inventory entry to create the worker from")
            backend.create(decision.slurm_node, decision.group)
    except BackendError as err:
        return Outcome(decision, False, err.reason, time.monotonic() - start)
    except Exception as err:  # noqa: BLE001 -- a bug for one node must still end as that node's DOWN reason
        return Outcome(decision, False, f"internal error {type(err).__name__}: {err}", time.monotonic() - start)
    return Outcome(decision, True, "", time.monotonic() - start)


def execute(
    decisions: Sequence[Decision], backend: "NodeBackend", *, deadline: float, parallel: int, log: "Log",
    clock: Callable[[], float] = time.monotonic, on_failures: Callable[[list[Outcome]], None] | None = None,
) -> tuple[list[Outcome], list[Decision]]:
    """Carry out the backend actions, `parallel` at a time, until `deadline` (on `clock`).

    `on_failures` gets the failed outcomes in batches as they come: the refusals (FAIL decisions)
    first, then the failed calls at most every FLUSH_EVERY seconds. Returns (outcomes of the finished
    decisions, decisions still running at the deadline: abandoned, not reported as failures).
    """
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    outcomes: list[Outcome] = []
    work = []
    for d in decisions:
        if d.action == Action.NOTHING:
            outcomes.append(Outcome(d, True))
        elif d.action == Action.FAIL:
            outcomes.append(Outcome(d, False, d.detail))
        else:
            work.append(d)
    refused = [o for o in outcomes if not o.ok]
    if refused and on_failures is not None:
        on_failures(refused)
    if not work:
        return outcomes, []
    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(work))), thread_name_prefix="slurmk8s")
    futures = {pool.submit(act, backend, d): d for d in work}
    pending = set(futures)
    fresh: list[Outcome] = []
    flushed = clock()
    while pending:
        left = deadline - clock()
        if left <= 0:
            break
        done, pending = wait(pending, timeout=min(SLICE, left), return_when=FIRST_COMPLETED)
        for fut in done:
            out = fut.result()
            outcomes.append(out)
            state = "ok" if out.ok else f"FAILED: {out.error}"
            log.write(f"{out.decision.node} {out.decision.action.value} {state} ({out.seconds:.2f}s)")
            if not out.ok:
                fresh.append(out)
        if fresh and on_failures is not None and (not pending or clock() - flushed >= FLUSH_EVERY):
            on_failures(fresh)
            fresh, flushed = [], clock()
    pool.shutdown(wait=False, cancel_futures=True)
    if fresh and on_failures is not None:
        on_failures(fresh)
    return outcomes, [futures[f] for f in pending]
