"""An in-memory failure ledger (the FailureLedger protocol of provisioner.elastic.ledger).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.elastic.ledger import Policy, PoolHistory, add_failure, take_trial


@dataclass
class MemoryLedger:
    """In-memory FailureLedger for tests."""

    policy: Policy = field(default_factory=Policy)
    pools: dict[str, PoolHistory] = field(default_factory=dict)

    def load(self) -> dict[str, PoolHistory]:
        return dict(self.pools)

    def record_failure(self, pool: str, node: str, reason: str, at: float, attempt: str = "") -> None:
        self.pools[pool] = add_failure(self.pools.get(pool, PoolHistory()), node, reason, at, self.policy, attempt)

    def record_success(self, pool: str, at: float) -> None:
        self.pools[pool] = PoolHistory((), at)

    def claim_trial(self, pool: str, node: str, at: float) -> bool:
        taken = take_trial(self.pools.get(pool, PoolHistory()), node, at, self.policy)
        if taken is not None:
            self.pools[pool] = taken
        return taken is not None
