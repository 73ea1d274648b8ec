"""bench/kueue_timeline.py: the steps of "quota freed -> RUNNING" from a watch's events."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import kueue_timeline as tl  # noqa: E402

LABEL = "kueue.x-k8s.io/pod-group-name"
GATES = ("kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology")


def pod(group: str, *, gated: bool = False, node: str = "", phase: str = "Pending") -> dict:
    spec = {"schedulingGates": [{"name": g} for g in GATES] if gated else [], **({"nodeName": node} if node else {})}
    return {"metadata": {"name": "kq-0", "labels": {LABEL: group}}, "spec": spec, "status": {"phase": phase}}


def workload(name: str, *conditions: str) -> dict:
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}}


def test_each_step_is_the_first_event_that_shows_it():
    seen = [
        tl.Seen(10.0, "pod", "ADDED", pod("b", gated=True)),
        tl.Seen(10.5, "pod", "MODIFIED", pod("a", node="n1", phase="Running")),  # the running job's pod
        tl.Seen(11.0, "pod", "DELETED", pod("a", node="n1", phase="Running")),
        tl.Seen(11.1, "workload", "MODIFIED", workload("a", "Admitted", "Finished")),
        tl.Seen(11.3, "workload", "MODIFIED", workload("b", "QuotaReserved", "Admitted")),
        tl.Seen(11.4, "pod", "MODIFIED", pod("b")),
        tl.Seen(11.5, "pod", "MODIFIED", pod("b", node="n1")),
        tl.Seen(12.2, "pod", "MODIFIED", pod("b", node="n1", phase="Running")),
        tl.Seen(12.9, "pod", "MODIFIED", pod("b", node="n1", phase="Running")),
        tl.Seen(13.0, "workload", "MODIFIED", workload("b", "QuotaReserved", "Admitted")),
    ]
    times = tl.sample_times(seen, "a", "b", LABEL, GATES)
    assert times == {"freed": 11.0, "finished": 11.1, "admitted": 11.3, "ungated": 11.4, "bound": 11.5,
                     "started": 12.2}
    times.update(registered=12.6, job_started=12.7, running_seen=12.8)
    assert tl.steps(times) == {"freed": 0.0, "finished": 0.1, "admitted": 0.3, "ungated": 0.4, "bound": 0.5,
                               "started": 1.2, "registered": 1.6, "job_started": 1.7, "running_seen": 1.8}


def test_a_step_not_seen_is_none_and_the_summary_shows_a_dash():
    seen = [tl.Seen(5.0, "pod", "DELETED", pod("a")), tl.Seen(5.2, "pod", "ADDED", pod("b", gated=True))]
    times = tl.sample_times(seen, "a", "b", LABEL, GATES)
    assert times["ungated"] is None and times["admitted"] is None
    got = tl.steps({**times, "running_seen": 7.0})
    assert got["running_seen"] == 2.0 and got["bound"] is None
    lines = tl.summary([got, {**got, "bound": 0.25}])
    assert "  bound           -     0.25" in lines
    assert not any(line.lstrip().startswith("freed") for line in lines)


def test_without_the_freed_event_no_step_has_a_time():
    assert set(tl.steps({"admitted": 3.0, "running_seen": 4.0}).values()) == {None}
