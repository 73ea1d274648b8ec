"""A clock for unit tests: `clock()` reads it, `clock.sleep(s)` moves it on (nothing really waits)."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
