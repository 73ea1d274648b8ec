"""e2e/kubeshare.py: e2e tests share the Kubernetes cluster, and one that stops it (marker
`e2e_alone`) holds it alone, across the workers of `pytest -n` (here: threads, each with its own
open file, as flock(2) sees separate processes)."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kubeshare", ROOT / "e2e" / "kubeshare.py")
kubeshare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kubeshare)

WAIT = 5.0


class Holder(threading.Thread):
    """Takes the share (or holds alone) when started, notes when it got in, lets go on `leave`."""

    def __init__(self, lock: Path, name: str, alone: bool, log: list[str]):
        super().__init__(name=name, daemon=True)
        self.lock, self.alone, self.log = lock, alone, log
        self.inside, self.leave = threading.Event(), threading.Event()

    def run(self) -> None:
        with kubeshare.kubernetes_share(self.lock, alone=self.alone):
            self.log.append(f"{self.name} in")
            self.inside.set()
            self.leave.wait(WAIT)
            self.log.append(f"{self.name} out")


def start(lock: Path, name: str, alone: bool, log: list[str]) -> Holder:
    holder = Holder(lock, name, alone, log)
    holder.start()
    return holder


def test_tests_share_the_cluster(tmp_path):
    log: list[str] = []
    a, b = start(tmp_path / "k.lock", "a", False, log), start(tmp_path / "k.lock", "b", False, log)
    assert a.inside.wait(WAIT) and b.inside.wait(WAIT), log  # both in at once
    a.leave.set(), b.leave.set()
    a.join(WAIT), b.join(WAIT)


def test_a_test_alone_waits_for_the_others_and_they_for_it(tmp_path):
    lock, log = tmp_path / "k.lock", []
    shared = start(lock, "shared", False, log)
    assert shared.inside.wait(WAIT)
    alone = start(lock, "alone", True, log)
    assert not alone.inside.wait(0.3), "in beside a test that holds the cluster shared"
    shared.leave.set()
    assert alone.inside.wait(WAIT), log
    later = start(lock, "later", False, log)
    assert not later.inside.wait(0.3), "in beside the test that holds the cluster alone"
    alone.leave.set()
    assert later.inside.wait(WAIT), log
    later.leave.set()
    for holder in (shared, alone, later):
        holder.join(WAIT)
    assert log == ["shared in", "shared out", "alone in", "alone out", "later in", "later out"]


def test_a_test_that_waits_to_be_alone_goes_before_tests_that_come_after_it(tmp_path):
    """The other worker's tests overlap (one takes the share before the last lets go): without the
    turnstile they would keep the shared lock among themselves."""
    lock, log = tmp_path / "k.lock", []
    first = start(lock, "first", False, log)
    assert first.inside.wait(WAIT)
    alone = start(lock, "alone", True, log)
    time.sleep(0.2)  # alone now waits at the lock, holding the turnstile
    second = start(lock, "second", False, log)
    assert not second.inside.wait(0.3), "a test that came after the waiting one got in first"
    first.leave.set()
    assert alone.inside.wait(WAIT), log
    alone.leave.set()
    assert second.inside.wait(WAIT), log
    second.leave.set()
    for holder in (first, alone, second):
        holder.join(WAIT)
    assert log.index("alone in") < log.index("second in"), log
