"""Node-seconds since ``up``, kept on the state volume across restarts and wakes from sleep.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .. import settings
from ..elastic.ledger import LedgerError

DEFAULT_USAGE: str = settings.default(settings.USAGE)  # node-seconds since `up`, kept across restarts


@dataclass(frozen=True)
class Usage:
    """Node-seconds provisioned / busy per pool since `since`, for the deployment (the slurmctld
    StatefulSet's uid: a new `up` after `down` starts a new tally; a restart or a wake from sleep
    continues it)."""

    deployment: str
    since: float
    provisioned: Mapping[str, float] = field(default_factory=dict)
    busy: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "since": self.since,
                "provisioned": dict(sorted(self.provisioned.items())), "busy": dict(sorted(self.busy.items()))}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Usage":
        def totals(key: str) -> dict[str, float]:
            raw = obj.get(key)
            return {str(k): float(v) for k, v in (raw.items() if isinstance(raw, dict) else ())
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}

        since = obj.get("since")
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            raise ValueError("no 'since' timestamp")
        return cls(str(obj.get("deployment") or ""), float(since), totals("provisioned"), totals("busy"))


def resume_usage(saved: Usage | None, deployment: str, now: float) -> tuple[Usage, str]:
    """The tally to continue from (pure) and why: the saved one when it belongs to this deployment
    (or this deployment cannot be told), else a fresh one starting now."""
    if saved is None:
        return Usage(deployment, now), "no saved node-seconds: counting from now"
    if deployment and saved.deployment and saved.deployment != deployment:
        return Usage(deployment, now), (f"saved node-seconds belong to an earlier deployment ({saved.deployment}): "
                                        "counting from now")
    return replace(saved, deployment=deployment or saved.deployment), \
        f"continuing the node-seconds tally started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(saved.since))}"


@dataclass
class UsageFile:
    """The tally in one JSON file on the StateSaveLocation volume, replaced atomically."""

    path: str = DEFAULT_USAGE

    def load(self) -> Usage | None:
        try:
            with open(self.path) as fh:
                doc = json.load(fh)
            return Usage.from_json(doc if isinstance(doc, dict) else {})
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise LedgerError(f"cannot read the node-seconds tally {self.path}: {err}") from None

    def save(self, usage: Usage) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(usage.to_json(), fh)
            os.replace(tmp, self.path)
        except OSError as err:
            raise LedgerError(f"cannot write the node-seconds tally {self.path}: {err}") from None
