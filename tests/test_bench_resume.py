"""bench/resume_500.py's RunningWatch: when the last worker pod was seen Running, from one watch
that lists again after the API server ends it, sends an ERROR event or breaks, and gives up after
MAX_RESTARTS. The API here is a script of answers; the watch against the real API server runs in
the benchmark itself."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "e2e"))

import resume_500  # noqa: E402

from provisioner.kubeapi import ApiError  # noqa: E402


def _pod(name: str, deleting: bool = False) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2026-12-05T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {"phase": "Running"}}


class ScriptedApi:
    """request(): the lists, in turn; watch_path(): the watches, in turn (a list of events, or an
    exception raised before or after them)."""

    def __init__(self, lists: list[list[dict]], watches: list) -> None:
        self.lists, self.watches, self.calls = list(lists), list(watches), []

    def request(self, method, path, query):
        self.calls.append(("list", query["fieldSelector"]))
        items = self.lists.pop(0) if self.lists else []
        return {"metadata": {"resourceVersion": str(len(self.calls))}, "items": items}

    def watch_path(self, path, query, timeout):
        self.calls.append(("watch", query["resourceVersion"]))
        script = self.watches.pop(0) if self.watches else []
        if isinstance(script, Exception):
            raise script
        yield from script
        if not self.watches and not script:
            time.sleep(0.05)


def test_the_last_pod_seen_running_by_the_watch_ends_the_wait():
    api = ScriptedApi([[_pod("a")]], [[{"type": "ADDED", "object": _pod("b")},
                                        {"type": "ADDED", "object": _pod("a", deleting=True)},
                                        {"type": "ADDED", "object": _pod("c")},
                                        {"type": "MODIFIED", "object": _pod("a")}]])
    t0 = time.monotonic()
    watch = resume_500.RunningWatch(api, "ns", 3)
    assert watch.wait(t0, "test") >= 0 and watch.restarts == 0
    assert api.calls == [("list", "status.phase=Running"), ("watch", "1")]


def test_a_watch_ended_broken_or_expired_is_listed_again_and_goes_on():
    api = ScriptedApi([[], [_pod("a")], [_pod("a")], [_pod("a"), _pod("b")]],
                      [[{"type": "ADDED", "object": _pod("a")}],  # then the API server ends it
                       [{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}],
                       ApiError(0, "connection broken")])
    t0 = time.monotonic()
    watch = resume_500.RunningWatch(api, "ns", 2)
    assert watch.wait(t0, "test") >= 0
    assert watch.restarts == 3 and len(watch.reasons) == 3
    assert "ended the watch" in watch.reasons[0] and "410" in watch.reasons[1] and "broken" in watch.reasons[2]
    assert [c[0] for c in api.calls] == ["list", "watch", "list", "watch", "list", "watch", "list"]


def test_a_watch_that_keeps_failing_gives_up_and_says_why(monkeypatch):
    monkeypatch.setattr(resume_500.RunningWatch, "MAX_RESTARTS", 2)
    monkeypatch.setattr(resume_500.time, "sleep", lambda s: None)
    api = ScriptedApi([], [ApiError(403, "Forbidden", "no")] * 5)
    watch = resume_500.RunningWatch(api, "ns", 1)
    with pytest.raises(SystemExit) as exited:
        watch.wait(time.monotonic(), "floor")
    message = str(exited.value)
    assert message.startswith("floor: only 0 of 1 pods Running after"), message
    assert "403 Forbidden" in message and "2 restarts: given up" in message and message.endswith("(2 restarts)")
    assert [c[0] for c in api.calls].count("watch") == 3
