"""An in-memory node backend (the NodeBackend protocol of provisioner.elastic.backend); `fail` maps a
node name to the BackendError reason its create raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from provisioner.elastic.backend import BackendError, Worker, WorkerGone, WorkerReplaced
from provisioner.inventory import SlurmNode


@dataclass
class FakeBackend:
    """In-memory backend for unit tests; `fail` maps node name -> BackendError reason to raise."""

    workers: dict[str, Worker] = field(default_factory=dict)
    fail: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    created: int = 0  # workers created so far: each gets its own uid
    lists: list[list[str] | None] = field(default_factory=list)  # the names of each list() (None: all)
    groups: dict = field(default_factory=dict)  # node -> the Kueue PodGroup its last create named
    pool_queues: dict = field(default_factory=dict)  # pool -> its Kueue LocalQueue (queues())
    workloads: dict = field(default_factory=dict)  # group -> its Kueue Workload (workload()); a str: BackendError
    gone_taken: dict = field(default_factory=dict)  # node -> who took its worker, gone meanwhile (taken_gone())

    def create(self, node: SlurmNode, group=None) -> None:
        self.calls.append(("create", node.name))
        if group is not None:
            self.groups[node.name] = group
        if node.name in self.fail:
            raise BackendError(node.name, self.fail[node.name])
        if node.name not in self.workers:
            self.created += 1
            # a pod of a group waits at Kueue's gates (Pending) until its group is admitted (admit())
            self.workers[node.name] = Worker(node.name, "Pending" if group else "Running", host=node.k8s_node,
                                             created_at=time.time(), uid=f"{node.name}-uid-{self.created}",
                                             group=group.name if group else "", group_total=group.total if group else 0,
                                             gated=group is not None)

    def admit(self, group: str) -> None:
        """Kueue admits `group`: its pods are ungated and run."""
        for name, w in list(self.workers.items()):
            if w.group == group:
                self.workers[name] = replace(w, phase="Running", gated=False)

    def delete(self, name: str, uid: str | None = None, force: bool = False, version: str | None = None) -> None:
        self.calls.append(("force-delete", name) if force else ("delete", name))
        current = self.workers.get(name)
        if uid and current is None:
            raise WorkerGone(name, f"worker {name} ({uid}) is gone already")
        if uid and current is not None and current.uid and current.uid != uid:
            raise WorkerReplaced(name, f"worker {name} was replaced since ({uid} is gone)")
        if uid and version and current is not None and current.version and current.version != version:
            raise WorkerReplaced(name, f"worker {name} changed since it was judged (version {version})")
        self.workers.pop(name, None)

    def adopt(self, name: str, uid: str, version: str = "") -> bool:
        """Kept when it is the live worker `uid`; the keeping changes its version (as a pod's write)."""
        self.calls.append(("adopt", name))
        current = self.workers.get(name)
        if current is None or current.uid != uid or current.phase not in ("Pending", "Running"):
            return False
        self.workers[name] = replace(current, version=f"{current.version}+adopted")
        return True

    def queues(self) -> Mapping[str, str]:
        return dict(self.pool_queues)

    def taken_gone(self):
        return dict(self.gone_taken)

    def mark_busy(self, name: str, uid: str, busy: bool) -> bool:
        self.calls.append(("mark-busy" if busy else "mark-idle", name))
        w = self.workers.get(name)
        if w is None or (uid and w.uid != uid):
            return False
        self.workers[name] = replace(w, busy_marked=busy)
        return True

    def workload(self, group: str):
        self.calls.append(("workload", group))
        found = self.workloads.get(group)
        if isinstance(found, str):
            raise BackendError(group, found, retryable=True)
        return found

    def list(self, names: Sequence[str] | None = None) -> Mapping[str, Worker]:
        self.lists.append(None if names is None else list(names))
        return {n: w for n, w in self.workers.items() if names is None or n in names}
