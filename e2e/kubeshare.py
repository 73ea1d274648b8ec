"""The Kubernetes cluster shared by e2e tests that run at once (`pytest -n`), or held by one alone.

Most e2e tests can run beside each other: each deploys into its own namespace. A test that stops
the cluster itself (its API server, its kubelet: marker `e2e_alone`) must not: every other test
would see the cluster gone. A reader-writer lock on a file (flock(2)) says who may run, across the
workers of one pytest session and across sessions on one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def kubernetes_share(lock: Path, alone: bool) -> Iterator[None]:
    """Hold the cluster shared with other tests, or `alone`: a test that waits to be alone goes in
    before any test that asks after it. Without the turnstile that makes it so, the other worker's
    tests, each holding the shared lock in turn, could pass it on to each other for ever."""
    with open(f"{lock}.turnstile", "a") as turnstile, open(lock, "a") as held:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(held, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # closing the file lets go
