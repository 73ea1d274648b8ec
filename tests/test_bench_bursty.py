"""bench/bursty_day.py (P3, a bursty day): its pure parts, no cluster. The trace generator, the
always-on simulation (FIFO + EASY backfill) on hand-checked cases, the replay script on the login pod
with stand-in sbatch / squeue, sacct's lines, node-seconds from `slurmk8s status --json` documents
made by provisioner.status itself, and the report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.status import ControllerState, Status, Usage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bursty_day as b  # noqa: E402
from bursty_day import TraceJob as J  # noqa: E402

# ---------------------------------------------------------------- the trace


def most_in_one_second(trace: list[J]) -> int:
    offsets = [j.offset for j in trace]
    best, lo = 0, 0
    for hi, t in enumerate(offsets):
        while t - offsets[lo] > 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_the_trace_is_the_same_for_the_same_seed_and_has_what_was_asked():
    trace = b.make_trace()
    assert trace == b.make_trace(1000, 17) and trace != b.make_trace(1000, 18)
    assert len(trace) == 1000
    assert [j.offset for j in trace] == sorted(j.offset for j in trace) and trace[0].offset >= 0
    assert {j.nodes for j in trace} == set(range(1, 9))  # every size, small ones most
    assert sum(j.nodes <= 2 for j in trace) > 0.7 * len(trace)
    assert all(1.0 <= j.duration <= 30.0 for j in trace)
    assert most_in_one_second(trace) >= 5  # bursts
    gaps = [b2.offset - b1.offset for b1, b2 in zip(trace, trace[1:])]
    assert sum(g >= 45 for g in gaps) == 5  # the five quiet spells


@pytest.mark.parametrize("jobs", [0, 1, 7, 16, 1001])
def test_exactly_the_jobs_asked_for_even_when_a_burst_is_cut(jobs: int):
    assert len(b.make_trace(jobs, 3, burst_prob=0.5)) == jobs


def test_sizes_and_durations_stay_in_their_ranges():
    trace = b.make_trace(2000, 5, max_nodes=3, duration_range=(2.0, 4.0))
    assert {j.nodes for j in trace} == {1, 2, 3}
    assert min(j.duration for j in trace) == 2.0 and max(j.duration for j in trace) == 4.0
    with pytest.raises(ValueError):
        b.make_trace(10, burst_size=(3, 2))
    with pytest.raises(ValueError):
        b.make_trace(10, mean_gap=0)


def test_without_bursts_the_gaps_are_exponential_with_the_mean_asked():
    trace = b.make_trace(5000, 11, mean_gap=2.0, burst_prob=0.0, lulls=0)
    gaps = [b2.offset - b1.offset for b1, b2 in zip(trace, trace[1:])]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(2.0, rel=0.05)
    below = sum(g < 2.0 for g in gaps) / len(gaps)  # exponential: P(gap < mean) = 1 - 1/e
    assert below == pytest.approx(0.632, abs=0.03)
    assert most_in_one_second(b.make_trace(2000, 11, mean_gap=10.0, burst_prob=0.0, lulls=0)) < 5


def test_quiet_spells_fall_through_the_trace():
    trace = b.make_trace(900, 2, mean_gap=0.5, burst_prob=0.0, lulls=3, lull_range=(30.0, 45.0))
    spells = [i for i in range(1, len(trace)) if trace[i].offset - trace[i - 1].offset >= 30]
    assert spells == [225, 450, 675]


def test_time_scale_limits_and_the_lines_the_replay_reads():
    trace = [J(0.0, 1, 2.0), J(1.25, 3, 2.5)]
    assert b.scale_trace(trace, 4) == [J(0.0, 1, 8.0), J(5.0, 3, 10.0)]
    assert [b.time_limit_minutes(d) for d in (1, 30, 31, 240)] == [2, 2, 3, 9]
    assert b.trace_lines(trace) == "0 1 2 2\n1250 3 2.5 2\n"


# ---------------------------------------------------------------- the always-on simulation


def test_jobs_that_fit_start_at_once_and_fifo_holds_the_rest():
    assert b.simulate_always_on([], 4) == []
    assert b.simulate_always_on([J(0, 2, 5), J(1, 2, 5), J(2, 4, 1)], 4) == [0, 0, 4]
    # the same offset: the earlier in the trace goes first
    assert b.simulate_always_on([J(0, 2, 10), J(0, 1, 5)], 2) == [0, 10]


def test_easy_backfill_starts_a_short_job_that_ends_before_the_reservation():
    # A holds 3 of 4 nodes until 10; B (4 nodes) waits for it: its reservation is at 10.
    # C (1 node, ends at 7) fits the free node now and ends before 10: backfilled at once.
    # D (1 node, 20 s) would still run at 10 and there is no node to spare: it waits until B ends.
    trace = [J(0, 3, 10), J(1, 4, 5), J(2, 1, 5), J(2.5, 1, 20)]
    assert b.simulate_always_on(trace, 4) == [0, 9, 0, 12.5]


def test_easy_backfill_uses_the_nodes_the_reservation_leaves_over():
    # A holds 2 of 4 nodes until 10; B needs 3 and gets them at 10, one node to spare: C (1 node,
    # 100 s) starts at once without delaying B; E (1 node) finds no node to spare and waits.
    trace = [J(0, 2, 10), J(1, 3, 5), J(2, 1, 100), J(3, 1, 100)]
    assert b.simulate_always_on(trace, 4) == [0, 9, 0, 12]


def test_the_simulation_never_uses_more_nodes_than_there_are():
    trace = b.make_trace(600, 9)
    waits = b.simulate_always_on(trace, 8)
    assert all(w >= 0 for w in waits)
    # (time, nodes taken): at the same time, ends (negative) before starts; times to the us, as
    # offset + wait + duration need not add up to the float the simulation ended the job at
    events = sorted([(round(j.offset + w, 6), j.nodes) for j, w in zip(trace, waits)]
                    + [(round(j.offset + w + j.duration, 6), -j.nodes) for j, w in zip(trace, waits)])
    used = 0
    for _, n in events:
        used += n
        assert used <= 8
    assert b.simulate_always_on(trace, 10_000) == [0.0] * len(trace)
    with pytest.raises(ValueError):
        b.simulate_always_on([J(0, 9, 1)], 8)


# ---------------------------------------------------------------- the replay on the login pod

FAKE_SBATCH = """#!/bin/bash
echo "$*" >>"$STATE/args"
case " $* " in *" -N 3 "*) echo "sbatch: error: Node count specification invalid"; exit 1;; esac
n=$(cat "$STATE/next" 2>/dev/null || echo 41); echo $((n + 1)) >"$STATE/next"; echo "$((n + 1));local"
"""
# squeue: fails at the first call, lists a job at the second, nothing after
FAKE_SQUEUE = """#!/bin/bash
c=$(cat "$STATE/sq" 2>/dev/null || echo 0); echo $((c + 1)) >"$STATE/sq"
case $c in 0) exit 1;; 1) echo 44;; esac
"""


def test_the_replay_script_submits_each_job_at_its_offset_and_waits_for_the_queue(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "replay.sh").write_text(b.REPLAY)
    (tmp_path / "trace.txt").write_text(b.trace_lines([J(0.0, 1, 1.5), J(0.3, 3, 2.0), J(0.6, 2, 12.0)]))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(tmp_path)}
    out = subprocess.run(["bash", str(tmp_path / "replay.sh"), str(tmp_path / "trace.txt"), "bursty-1", "day"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    r = b.parse_replay(out)
    assert [(s.index, s.planned_ms, s.rc, s.job) for s in r.submissions] == [
        (0, 0, 0, "42"), (1, 300, 1, None), (2, 600, 0, "43")], out
    assert "Node count specification invalid" in r.submissions[1].output
    assert all(s.planned_ms <= s.at_ms < s.planned_ms + 1000 for s in r.submissions), out
    assert r.start_ms > 1.7e12 and r.submitted_ms is not None and r.drained_ms is not None
    assert r.drained_ms >= r.submitted_ms + 1000  # squeue failed once, then listed a job: not drained at once
    assert (tmp_path / "sq").read_text().strip() == "3"
    assert b._when(r.since) is not None
    assert (tmp_path / "args").read_text().splitlines()[0] == (
        "--parsable -p day -N 1 --exclusive -t 2 -J bursty-1 -o /dev/null --wrap sleep 1.5")


def test_replay_lines_that_are_not_its_own_are_left_out():
    r = b.parse_replay("since 2026-12-01T20:12:30\nstart 1796156010000\nj 0 0 3 40 0 17\nwarning: x\n"
                       "j 1 x 3 40 0 18\nj 2 100 101 9 0 garbage\nsubmitted 200\ndrained 9000\n")
    assert r.since == "2026-12-01T20:12:30" and r.start_ms == 1796156010000
    assert [(s.index, s.job) for s in r.submissions] == [(0, "17"), (2, None)]
    assert (r.submitted_ms, r.drained_ms) == (200, 9000)


# ---------------------------------------------------------------- accounting

SACCT = """\
101|COMPLETED|1|1796156010|1796156013|1796156016|3
102|COMPLETED|2|1796156011|1796156011|1796156014|3
103|NODE_FAIL|4|1796156012|1796156020|1796156025|5
103|COMPLETED|4|1796156030|1796156040|1796156043|3
104|CANCELLED by 2001|1|1796156013|Unknown|1796156050|0
105|PENDING|1|1796156014|Unknown|Unknown|0
not|a|line
"""


def test_sacct_lines_each_run_of_each_job():
    records = b.parse_sacct(SACCT)
    assert len(records) == 6
    assert records[2] == b.Record("103", "NODE_FAIL", 4, 1796156012.0, 1796156020.0, 1796156025.0, 5)
    assert records[4].state == "CANCELLED" and records[4].start is None
    assert b._when("2026-12-01T20:13:30") == 1796156010.0  # without SLURM_TIME_FORMAT=%s, taken as UTC
    assert b._when("None") is None and b._when("") is None


def test_outcome_final_states_interruptions_waits_and_busy_node_seconds():
    got = b.outcome(b.parse_sacct(SACCT), ["101", "102", "103", "104", "105", "106"])
    assert got.completed == 3
    assert got.not_completed == {"CANCELLED": ["104"], "PENDING": ["105"], "MISSING": ["106"]}
    assert got.interrupted == {"103": ["NODE_FAIL"]}  # COMPLETED in the end, yet killed once
    assert got.waits == [3.0, 0.0, 28.0]  # 103: from its first submit to its last start
    assert got.busy_node_seconds == 1 * 3 + 2 * 3 + 4 * 5 + 4 * 3
    assert got.failed_jobs == ["103", "104", "105", "106"]
    assert b.outcome(b.parse_sacct(SACCT), ["101", "102"]).failed_jobs == []


def test_accounting_is_complete_when_every_job_has_a_final_state():
    records = b.parse_sacct(SACCT)
    assert b.accounting_complete(records, ["101", "103", "104"])
    assert not b.accounting_complete(records, ["101", "105"])  # still PENDING in slurmdbd
    assert not b.accounting_complete(records, ["101", "106"])  # not there yet


# ---------------------------------------------------------------- node-seconds


def status_doc(provisioned: dict[str, float], busy: dict[str, float]) -> dict:
    """A `slurmk8s status --json` document, as provisioner.status writes it."""
    return Status("slurm-bench-day", ControllerState("awake", replicas=1, ready=1),
                  usage=Usage(1796156000.0, provisioned, busy), at=1796156010.0).to_json()


def test_node_seconds_of_the_pool_between_two_status_documents_and_their_ratio():
    before = status_doc({"cpu": 50.0}, {"cpu": 40.0})  # pool `day` never had a pod yet
    after = status_doc({"cpu": 50.0, "day": 6250.0}, {"cpu": 40.0, "day": 5000.0})
    assert b.pool_usage(before, "day") == (0.0, 0.0)
    assert b.usage_delta(before, after, "day") == (6250.0, 5000.0)
    assert b.ratio(6250.0, 5000.0) == 1.25 and b.ratio(10.0, 0.0) is None
    later = status_doc({"day": 9000.0}, {"day": 6000.0})
    assert b.usage_delta(after, later, "day") == (2750.0, 1000.0)
    asleep = Status("slurm-bench-day", ControllerState("asleep", replicas=0)).to_json()
    assert b.usage_delta(before, asleep, "day") is None and b.usage_delta(None, after, "day") is None


# ---------------------------------------------------------------- the report


def report_doc(ratio: float | None, always_on: bool = False) -> dict:
    return {"jobs": 1000, "seed": 17, "time_scale": 1.0, "nodes": 8, "always_on": always_on, "suspend_time": 20,
            "submitted": 1000, "sbatch_failed": 0, "submit_lag_p95_s": 0.08, "completed": 999,
            "not_completed": {"NODE_FAIL": ["7"]}, "interrupted": {"7": []}, "replay_s": 1100.0,
            "trace_span_s": 1076.0, "waits": b.waits_summary([1.0, 2.0, 30.0]),
            "always_on_simulated": {**b.waits_summary([]), "makespan": 1078.0},
            "node_seconds": {"provisioned": None if ratio is None else 1000 * ratio, "busy": 1000.0, "ratio": ratio,
                             "busy_sacct": 990.0, "window": "first job to pool back at zero pods"}}


def test_the_report_gives_each_figure_beside_its_goal_and_says_what_is_simulated():
    lines = b.report_lines(report_doc(1.2))
    text = "\n".join(lines)
    assert "goal <= 1.3: met" in text and "NODE_FAIL 1" in text and "simulated" in lines[-1]
    assert "2.0 / " in text  # the measured median wait
    assert "goal <= 1.3: NOT met" in "\n".join(b.report_lines(report_doc(1.31)))
    assert "not measured" in "\n".join(b.report_lines(report_doc(None)))
    assert "goal <=" not in "\n".join(b.report_lines(report_doc(3.0, always_on=True)))


def test_the_trace_summary_dry_run():
    lines = b.trace_summary(b.make_trace(200, 4), 8)
    assert lines[0].startswith("trace: 200 jobs") and "simulated" in lines[2]
