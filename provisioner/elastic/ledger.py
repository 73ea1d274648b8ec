"""The per-pool failure ledger and the backoff computed from it.

The resume / resume-fail programs and the reconcile loop record worker failures per pool in one
JSON file on the state volume (:class:`FileLedger`). A failure counts once per attempt: one pod uid
is one attempt, whoever sees it fail (the loop, then resume-fail at ResumeTimeout); a create the API
refused made no pod and is counted by the resume program alone. ``consecutive failures >= N within
a window`` opens the pool's backoff: for a cooling-off period the resume program refuses its nodes
at once (reason ``backoff``). Then the pool is half-open: one resume at a time goes through as a
trial (claimed in the ledger, so concurrent programs agree), the others are still refused; the
trial's failure opens the backoff again, its success (the loop sees its worker up) clears the
pool's history.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol

from .. import settings
from ..errors import SlurmK8sError

DEFAULT_LEDGER: str = settings.default(settings.LEDGER)
_BACKOFF = settings.Backoff.from_env({})  # the registry's defaults


@dataclass(frozen=True)
class Failure:
    node: str
    at: float
    reason: str
    attempt: str = ""  # the failed worker's uid; '' when no worker was made (the API refused the create)


@dataclass(frozen=True)
class Trial:
    """The one resume let through while the pool is half-open."""

    node: str
    at: float


@dataclass(frozen=True)
class PoolHistory:
    failures: tuple[Failure, ...] = ()
    last_success: float | None = None
    trial: Trial | None = None

    def to_json(self) -> dict[str, Any]:
        failures = [{"node": f.node, "at": f.at, "reason": f.reason, **({"attempt": f.attempt} if f.attempt else {})}
                    for f in self.failures]
        doc: dict[str, Any] = {"failures": failures, "last_success": self.last_success}
        if self.trial is not None:
            doc["trial"] = {"node": self.trial.node, "at": self.trial.at}
        return doc

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "PoolHistory":
        failures = tuple(Failure(str(f["node"]), float(f["at"]), str(f.get("reason", "")), str(f.get("attempt") or ""))
                         for f in obj.get("failures") or () if isinstance(f, dict) and "node" in f and "at" in f)
        last = obj.get("last_success")
        t = obj.get("trial")
        trial = Trial(str(t["node"]), float(t["at"])) if isinstance(t, dict) and "node" in t and "at" in t else None
        return cls(failures, float(last) if isinstance(last, (int, float)) else None, trial)


@dataclass(frozen=True)
class Policy:
    """The loop's bounds (seconds) and the pool backoff rule."""

    grace: float = 20.0  # a healthy worker / a freshly booted node is not judged before this age
    pending_timeout: float = 60.0  # image / config errors while Pending
    unschedulable_timeout: float = 180.0  # Unschedulable (an autoscaler may be adding capacity)
    # a worker whose Kubernetes node stopped answering is judged lost once the loop has seen it so
    # for this long: a CI run's API server restart (50 s) then kubelet restart (25 s) had the node
    # controller mark a healthy node's pods not ready for about half a minute
    host_lost_grace: float = 40.0
    backoff_failures: int = _BACKOFF.failures  # consecutive resume failures of a pool (3) ...
    backoff_window: float = _BACKOFF.window  # ... within this many seconds (600) ...
    backoff_cooloff: float = _BACKOFF.cooloff  # ... refuse its resumes this long after the last one (300), then a trial
    keep: int = 50  # failures kept per pool

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: float) -> "Policy":
        backoff = settings.Backoff.from_env(env)
        policy = cls(backoff_failures=backoff.failures, backoff_window=backoff.window,
                     backoff_cooloff=backoff.cooloff)
        changes: dict[str, Any] = dict(overrides)  # float fields by name (replace's keywords are typed per field)
        return replace(policy, **changes) if overrides else policy


def consecutive_failures(history: PoolHistory, now: float, policy: Policy) -> list[Failure]:
    """Failures after the pool's last success and within the window."""
    since = max(history.last_success or -math.inf, now - policy.backoff_window)
    return [f for f in history.failures if f.at > since]


def backoff_until(history: PoolHistory, now: float, policy: Policy) -> float | None:
    """When the pool's cooling-off period ends, or None when it is not cooling off (closed, or
    half-open: see :func:`gate`)."""
    failures = consecutive_failures(history, now, policy)
    if len(failures) < max(1, policy.backoff_failures):
        return None
    until = max(f.at for f in failures) + policy.backoff_cooloff
    return until if until > now else None


@dataclass(frozen=True)
class Gate:
    """What the resume program may do for a pool in backoff: refuse its nodes (``trial`` False), or
    let one through as the trial (``trial`` True, after claiming it: :func:`take_trial`)."""

    why: str  # the failures: "3 consecutive resume failures within 600s, last cpu-2: ..."
    state: str  # "resumes refused for 290s more", "cooled off: one trial resume", ...
    trial: bool = False

    @property
    def detail(self) -> str:
        return f"{self.why}; {self.state}"


def _active_trial(history: PoolHistory, last_failure: float, now: float, policy: Policy) -> Trial | None:
    """The trial resume still being decided: claimed after the last failure, within a cooling-off."""
    t = history.trial
    if t is not None and t.at >= last_failure and now < t.at + policy.backoff_cooloff:
        return t
    return None


def gate(history: PoolHistory, now: float, policy: Policy) -> Gate | None:
    """The pool's backoff now: None (closed: every resume goes), a refusal while cooling off, or
    half-open: one trial (refused while another trial is being decided). Pure."""
    failures = consecutive_failures(history, now, policy)
    if len(failures) < max(1, policy.backoff_failures):
        return None
    last = max(failures, key=lambda f: f.at)
    why = (f"{len(failures)} consecutive resume failures within {policy.backoff_window:.0f}s, "
           f"last {last.node}: {last.reason}")
    until = last.at + policy.backoff_cooloff
    if until > now:
        return Gate(why, f"resumes refused for {until - now:.0f}s more")
    trial = _active_trial(history, last.at, now, policy)
    if trial is not None:
        return Gate(why, f"cooled off, trial resume of {trial.node} in progress ({now - trial.at:.0f}s)")
    return Gate(why, "cooled off: one trial resume", trial=True)


def backoff_detail(history: PoolHistory, now: float, policy: Policy) -> str | None:
    """Why the pool's resumes are held back (cooling off or half-open); None when they are not."""
    g = gate(history, now, policy)
    return g.detail if g is not None else None


def take_trial(history: PoolHistory, node: str, at: float, policy: Policy) -> PoolHistory | None:
    """The history with `node` as the pool's trial resume; None when no trial may go now (cooling
    off again, or another trial is being decided). A pool not in backoff needs no trial: unchanged."""
    g = gate(history, at, policy)
    if g is None:
        return history
    if not g.trial:
        return None
    return replace(history, trial=Trial(node, at))


def add_failure(history: PoolHistory, node: str, reason: str, at: float, policy: Policy,
                attempt: str = "") -> PoolHistory:
    """The history with one failure more (pure). An attempt (a worker uid) counts once, whoever
    reports it; a failure without one (no worker was made) always counts."""
    if attempt and any(f.attempt == attempt for f in history.failures):
        return history
    failures = (*history.failures, Failure(node, at, reason[:200], attempt))[-policy.keep:]
    return replace(history, failures=failures)


class LedgerError(SlurmK8sError):
    pass


class FailureLedger(Protocol):
    """Per-pool resume failure history that survives restarts and is shared between processes."""

    def load(self) -> dict[str, PoolHistory]: ...

    def record_failure(self, pool: str, node: str, reason: str, at: float, attempt: str = "") -> None: ...

    def record_success(self, pool: str, at: float) -> None: ...

    def claim_trial(self, pool: str, node: str, at: float) -> bool:
        """Make `node` the half-open pool's trial resume, atomically; False when it may not go."""
        ...


class _BadLedger(ValueError):
    """The ledger file's content is not a ledger (empty, zeroed, not JSON, the wrong shape)."""


def parse_ledger(data: bytes) -> dict[str, PoolHistory]:
    """The pools of a ledger file's content; :class:`_BadLedger` when it is not one. Pure."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or not isinstance(doc.get("pools") or {}, dict):
            raise ValueError("not a ledger object ({\"pools\": {...}})")
        return {str(k): PoolHistory.from_json(v) for k, v in (doc.get("pools") or {}).items() if isinstance(v, dict)}
    except (ValueError, TypeError, KeyError, AttributeError) as err:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise _BadLedger(str(err) or type(err).__name__) from None


def _fsync_dir(path: str) -> None:
    """The directory's entries (a rename into it) on disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class FileLedger:
    """FailureLedger in one JSON file (on the StateSaveLocation volume), updated under flock and
    replaced atomically, so the resume programs and the loop can write it concurrently.

    Durable: the new file's data is fsynced before it is renamed in, and the directory after, so
    a crash (the node losing power) leaves the old ledger or the new one, not an empty file under
    the name (ext4 and XFS may write the rename before the data). A file that is nonetheless bad
    (empty, zeroed, not JSON, the wrong shape) would otherwise fail every read and every update for
    good, which keeps the pool backoff off for good: it is reset to empty under the lock, once,
    said on ``log``, and its copy kept as ``<path>.bad``. A file that cannot be read at all
    (permissions, an I/O error) says nothing of its content: a :class:`LedgerError`, never a reset."""

    path: str = DEFAULT_LEDGER
    policy: Policy = field(default_factory=Policy)
    log: Callable[[str], None] | None = None  # where a reset is said (the program's log); None: stderr

    def _read(self) -> dict[str, PoolHistory]:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise LedgerError(f"cannot read the failure ledger {self.path}: {err}") from None
        return parse_ledger(data)

    def load(self) -> dict[str, PoolHistory]:
        try:
            return self._read()
        except _BadLedger:
            pass  # read again under the lock (a writer may have just replaced it), and reset if still bad
        found: dict[str, PoolHistory] = {}

        def same(pools: dict[str, PoolHistory]) -> dict[str, PoolHistory]:
            found.update(pools)
            return pools

        self._update(same)
        return found

    def _reset(self, err: _BadLedger) -> dict[str, PoolHistory]:
        """Under the lock: the bad file aside as <path>.bad (its last copy), said once; an empty ledger."""
        bad = self.path + ".bad"
        os.replace(self.path, bad)
        message = (f"the failure ledger {self.path} was unreadable ({str(err)[:200]}); reset to empty, its copy "
                   f"kept as {bad}: the pools' failure history (and any backoff) starts over")
        if self.log is not None:
            self.log(message)
        else:
            import sys

            print(message, file=sys.stderr)
        return {}

    def _update(self, fn: Callable[[dict[str, PoolHistory]], dict[str, PoolHistory]]) -> None:
        import fcntl

        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            with open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    current = self._read()
                except _BadLedger as err:
                    current = self._reset(err)
                pools = fn(current)
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as fh:
                    json.dump({"pools": {k: v.to_json() for k, v in sorted(pools.items())}}, fh, indent=1)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
                _fsync_dir(directory)
        except OSError as err:
            raise LedgerError(f"cannot update the failure ledger {self.path}: {err}") from None

    def record_failure(self, pool: str, node: str, reason: str, at: float, attempt: str = "") -> None:
        self._update(lambda p: {**p, pool: add_failure(p.get(pool, PoolHistory()), node, reason, at, self.policy,
                                                       attempt)})

    def record_success(self, pool: str, at: float) -> None:
        self._update(lambda p: {**p, pool: PoolHistory((), at)})

    def claim_trial(self, pool: str, node: str, at: float) -> bool:
        claimed = False

        def claim(pools: dict[str, PoolHistory]) -> dict[str, PoolHistory]:
            nonlocal claimed
            taken = take_trial(pools.get(pool, PoolHistory()), node, at, self.policy)
            claimed = taken is not None
            return {**pools, pool: taken} if taken is not None else pools

        self._update(claim)
        return claimed


def pool_gates(ledger: FailureLedger, now: float, policy: Policy) -> dict[str, Gate]:
    """pool -> its :class:`Gate`, for the pools in backoff now (used by the resume program)."""
    out = {}
    for pool, history in ledger.load().items():
        g = gate(history, now, policy)
        if g is not None:
            out[pool] = g
    return out
