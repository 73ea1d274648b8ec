"""The per-pool failure ledger and the backoff computed from it.

The resume / resume-fail programs and the reconcile loop record worker failures per pool in one
JSON file on the state volume (:class:`FileLedger`); ``consecutive failures >= N within a window``
puts the pool in backoff for a cooling-off period, during which the resume program refuses its
nodes at once (reason ``backoff``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol

from ..errors import SlurmK8sError

DEFAULT_LEDGER = "/var/spool/slurmctld/slurmk8s/ledger.json"


@dataclass(frozen=True)
class Failure:
    node: str
    at: float
    reason: str


@dataclass(frozen=True)
class PoolHistory:
    failures: tuple[Failure, ...] = ()
    last_success: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"failures": [{"node": f.node, "at": f.at, "reason": f.reason} for f in self.failures],
                "last_success": self.last_success}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "PoolHistory":
        failures = tuple(Failure(str(f["node"]), float(f["at"]), str(f.get("reason", "")))
                         for f in obj.get("failures") or () if isinstance(f, dict) and "node" in f and "at" in f)
        last = obj.get("last_success")
        return cls(failures, float(last) if isinstance(last, (int, float)) else None)


@dataclass(frozen=True)
class Policy:
    """The loop's bounds (seconds) and the pool backoff rule."""

    grace: float = 20.0  # a healthy worker / a freshly booted node is not judged before this age
    pending_timeout: float = 60.0  # image / config errors while Pending
    unschedulable_timeout: float = 180.0  # Unschedulable (an autoscaler may be adding capacity)
    backoff_failures: int = 3  # consecutive resume failures of a pool ...
    backoff_window: float = 600.0  # ... within this many seconds ...
    backoff_cooloff: float = 300.0  # ... refuse its resumes for this long after the last one
    dedupe: float = 120.0  # a node's failure seen again (by another program) within this counts once
    keep: int = 50  # failures kept per pool

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: float) -> "Policy":
        def get(key: str, default: float) -> float:
            try:
                return float(env.get(key, default))
            except ValueError:
                return default

        base = cls()
        policy = cls(backoff_failures=int(get("SLURMK8S_BACKOFF_FAILURES", base.backoff_failures)),
                     backoff_window=get("SLURMK8S_BACKOFF_WINDOW", base.backoff_window),
                     backoff_cooloff=get("SLURMK8S_BACKOFF_COOLOFF", base.backoff_cooloff))
        return replace(policy, **overrides) if overrides else policy


def consecutive_failures(history: PoolHistory, now: float, policy: Policy) -> list[Failure]:
    """Failures after the pool's last success and within the window."""
    since = max(history.last_success or -math.inf, now - policy.backoff_window)
    return [f for f in history.failures if f.at > since]


def backoff_until(history: PoolHistory, now: float, policy: Policy) -> float | None:
    """When the pool's cooling-off period ends, or None when the pool is not backed off."""
    failures = consecutive_failures(history, now, policy)
    if len(failures) < max(1, policy.backoff_failures):
        return None
    until = max(f.at for f in failures) + policy.backoff_cooloff
    return until if until > now else None


def backoff_detail(history: PoolHistory, now: float, policy: Policy) -> str | None:
    """The refusal reason for a pool in backoff (None when it is not)."""
    until = backoff_until(history, now, policy)
    if until is None:
        return None
    failures = consecutive_failures(history, now, policy)
    last = max(failures, key=lambda f: f.at)
    return (f"{len(failures)} consecutive resume failures within {policy.backoff_window:.0f}s, "
            f"last {last.node}: {last.reason}; resumes refused for {until - now:.0f}s more")


def add_failure(history: PoolHistory, node: str, reason: str, at: float, policy: Policy) -> PoolHistory:
    """The history with one failure more (pure); a repeat of the same node's failure counts once."""
    for f in history.failures:
        if f.node == node and abs(at - f.at) < policy.dedupe and f.at > (history.last_success or -math.inf):
            return history
    failures = (*history.failures, Failure(node, at, reason[:200]))[-policy.keep:]
    return PoolHistory(failures, history.last_success)


class LedgerError(SlurmK8sError):
    pass


class FailureLedger(Protocol):
    """Per-pool resume failure history that survives restarts and is shared between processes."""

    def load(self) -> dict[str, PoolHistory]: ...

    def record_failure(self, pool: str, node: str, reason: str, at: float) -> None: ...

    def record_success(self, pool: str, at: float) -> None: ...


@dataclass
class FileLedger:
    """FailureLedger in one JSON file (on the StateSaveLocation volume), updated under flock and
    replaced atomically, so the resume programs and the loop can write it concurrently."""

    path: str = DEFAULT_LEDGER
    policy: Policy = field(default_factory=Policy)

    def _read(self) -> dict[str, PoolHistory]:
        try:
            with open(self.path) as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as err:
            raise LedgerError(f"cannot read the failure ledger {self.path}: {err}") from None
        pools = doc.get("pools") if isinstance(doc, dict) else None
        return {str(k): PoolHistory.from_json(v) for k, v in (pools or {}).items() if isinstance(v, dict)}

    def load(self) -> dict[str, PoolHistory]:
        return self._read()

    def _update(self, fn: Callable[[dict[str, PoolHistory]], dict[str, PoolHistory]]) -> None:
        import fcntl

        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                pools = fn(self._read())
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as fh:
                    json.dump({"pools": {k: v.to_json() for k, v in sorted(pools.items())}}, fh, indent=1)
                os.replace(tmp, self.path)
        except OSError as err:
            raise LedgerError(f"cannot update the failure ledger {self.path}: {err}") from None

    def record_failure(self, pool: str, node: str, reason: str, at: float) -> None:
        self._update(lambda p: {**p, pool: add_failure(p.get(pool, PoolHistory()), node, reason, at, self.policy)})

    def record_success(self, pool: str, at: float) -> None:
        self._update(lambda p: {**p, pool: PoolHistory((), at)})


def active_backoffs(ledger: FailureLedger, now: float, policy: Policy) -> dict[str, str]:
    """pool -> refusal reason, for the pools in backoff now (used by the resume program)."""
    out = {}
    for pool, history in ledger.load().items():
        detail = backoff_detail(history, now, policy)
        if detail:
            out[pool] = detail
    return out
