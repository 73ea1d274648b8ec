"""Waiting for a state in the tests, the e2e suite and the benches: one poll loop whose timeout
says what it waited for and what it saw last."""

from __future__ import annotations

import time
from typing import Callable, NoReturn, TypeVar

T = TypeVar("T")


def _raise_timeout(message: str) -> NoReturn:
    raise TimeoutError(message)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5, *,
             until: Callable[[T], object] | None = None, show: Callable[[T], object] | None = None,
             fail: Callable[[str], NoReturn] = _raise_timeout) -> T:
    """Poll `probe` until it returns something truthy; after `timeout` seconds call `fail` with a
    message naming `what` (TimeoutError by default; the e2e suite fails the test instead).

    With `until`, `probe` reads a state and the wait ends when `until(state)` holds (the state is
    returned). With `until` or `show`, a timeout also says what the last read showed:
    `show(state)`, or the state itself (the end of it, when long)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if until(value) if until is not None else value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.0f} s waiting for {what}"
            if until is not None or show is not None:
                seen = str(show(value)) if show is not None else value if isinstance(value, str) else repr(value)
                seen = seen if len(seen) <= 6000 else "..." + seen[-6000:]
                message += "; last seen:" + ("\n" if "\n" in seen else " ") + seen
            fail(message)
        time.sleep(interval)
