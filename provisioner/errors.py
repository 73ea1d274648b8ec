"""One family of errors: every error slurmk8s raises on purpose is a :class:`SlurmK8sError`, with a
short machine-readable ``reason`` and whether retrying the same call may succeed (``retryable``).
Anything else that escapes is a bug.

Errors that tell the user which field is wrong and how to fix it: every error the core raises is a :class:`Problem` (or a :class:`ProblemList` of several), carrying
the dotted path of the offending field, what is wrong, and how to fix it. The CLI prints them as
``<field>: <what>. Fix: <how>`` and exits non-zero; nothing is written when one is raised.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Issue:
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}"
        if self.fix:
            text += f". Fix: {self.fix}"
        return text


class SlurmK8sError(Exception):
    """Base class of every error slurmk8s raises on purpose (as opposed to bugs).

    ``reason``: a short word for logs, metrics and Kubernetes events (a subclass sets a default, an
    instance may override it); ``retryable``: whether the same call may succeed later without
    anyone changing anything (an unreachable API server: yes; an invalid spec or a 403: no).
    """

    reason: str = "Error"
    retryable: bool = False

    def __init__(self, *args: object, reason: str | None = None, retryable: bool | None = None) -> None:
        super().__init__(*args)
        if reason is not None:
            self.reason = reason
        if retryable is not None:
            self.retryable = retryable


class Problem(SlurmK8sError):
    """One or more problems with the user's input, each naming its field and a fix."""

    reason = "InvalidInput"

    def __init__(self, issues: list[Issue] | Issue, *, title: str = "invalid input") -> None:
        self.issues: tuple[Issue, ...] = (issues,) if isinstance(issues, Issue) else tuple(issues)
        if not self.issues:
            raise ValueError("a Problem needs at least one issue")
        self.title = title
        super().__init__(self.render())

    @classmethod
    def one(cls, field: str, message: str, fix: str = "", *, title: str = "invalid input") -> "Problem":
        return cls(Issue(field, message, fix), title=title)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(i.field for i in self.issues)

    def render(self) -> str:
        if len(self.issues) == 1:
            return f"{self.title}: {self.issues[0]}"
        lines = [f"{self.title}: {len(self.issues)} problems"]
        lines += [f"  - {i}" for i in self.issues]
        return "\n".join(lines)


class SpecError(Problem):
    """The cluster spec is invalid."""


class InventoryError(Problem):
    """The Kubernetes nodes cannot be turned into a valid set of Slurm nodes."""


class TopologyError(Problem):
    """The topology derived from node labels would be rejected (or silently broken) by Slurm."""


class RenderError(Problem):
    """A rendered file failed validation."""
