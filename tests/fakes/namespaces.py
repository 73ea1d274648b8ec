"""Namespaces in memory as `up`'s owner check sees them (provisioner.deploy.owner): read, and the
claim with the API server's semantics: a create of a name that exists is refused (409
AlreadyExists), a write whose resourceVersion precondition is not the object's current one is
refused (409 Conflict); every accepted write moves the resourceVersion. Thread-safe, so two `up`s
can race in threads. The real API server's answers are checked by e2e/test_e2e_owner.py.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from provisioner.deploy.owner import Found
from provisioner.kubeapi import ApiError


@dataclass
class FakeNamespaces:
    """`read` and `claim` as provisioner.deploy.owner calls them (kubeconfig, ...); `after_read`
    runs after each read, before it returns (a test holds two readers there to force their race)."""

    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    after_read: Callable[[], None] = lambda: None
    writes: list[tuple[str, str]] = field(default_factory=list)  # (verb, name) of each accepted write
    _version: int = 100
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, annotations: dict[str, str] | None = None) -> None:
        with self._lock:
            self._version += 1
            self.namespaces[name] = {"metadata": {"name": name, "resourceVersion": str(self._version),
                                                  **({"annotations": dict(annotations)} if annotations else {})}}

    def read(self, kubeconfig: str | None, name: str) -> Found:
        with self._lock:
            ns = self.namespaces.get(name)
            found = Found(copy.deepcopy(ns) if ns is not None else None)
        self.after_read()
        return found

    def claim(self, kubeconfig: str | None, claim: Any) -> None:
        """The owner check's write (a Claim): create, or annotate under the resourceVersion precondition;
        raises the API server's answers as ApiError (409: the owner check lost the race)."""
        with self._lock:
            current = self.namespaces.get(claim.name)
            if claim.namespace is not None:
                if current is not None:
                    raise ApiError(409, "AlreadyExists", f'namespaces "{claim.name}" already exists')
                self._version += 1
                obj = copy.deepcopy(dict(claim.namespace))
                obj["metadata"]["resourceVersion"] = str(self._version)
                self.namespaces[claim.name] = obj
                self.writes.append(("create", claim.name))
                return
            if current is None:
                raise ApiError(404, "NotFound", f'namespaces "{claim.name}" not found')
            if current["metadata"]["resourceVersion"] != claim.resource_version:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on namespaces "{claim.name}": the '
                                                "object has been modified; please apply your changes to the latest "
                                                "version and try again")
            self._version += 1
            current["metadata"].setdefault("annotations", {}).update(claim.annotations)
            current["metadata"]["resourceVersion"] = str(self._version)
            self.writes.append(("annotate", claim.name))
