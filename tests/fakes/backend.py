"""An in-memory node backend (the NodeBackend protocol of provisioner.elastic.backend); `fail` maps a
node name to the BackendError reason its create raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from provisioner.elastic.backend import BackendError, Worker
from provisioner.inventory import SlurmNode


@dataclass
class FakeBackend:
    """In-memory backend for unit tests; `fail` maps node name -> BackendError reason to raise."""

    workers: dict[str, Worker] = field(default_factory=dict)
    fail: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def create(self, node: SlurmNode) -> None:
        self.calls.append(("create", node.name))
        if node.name in self.fail:
            raise BackendError(node.name, self.fail[node.name])
        self.workers.setdefault(node.name, Worker(node.name, "Running", host=node.k8s_node))

    def delete(self, name: str) -> None:
        self.calls.append(("delete", name))
        self.workers.pop(name, None)

    def list(self) -> Mapping[str, Worker]:
        return dict(self.workers)
