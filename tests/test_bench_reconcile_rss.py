"""bench/reconcile_rss.py, quickly (a couple hundred passes over a small cluster, so the bench does
not rot; the 10,000-pass run is `python bench/reconcile_rss.py`): it drives the loop's pass, the
warm programs and the metrics over a churning cluster, samples RSS, and fails on a leak."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import reconcile_rss  # noqa: E402

QUICK = ["--passes", "120", "--sample", "30", "--warmup", "30", "--nodes", "60", "--log-bytes", "1000"]


def test_quick_run_churns_samples_rss_and_stays_within_its_floor(tmp_path, capsys):
    out = tmp_path / "rss.json"
    code = reconcile_rss.main(QUICK + ["--json", str(out)])
    r = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert [at for at, _ in r["samples"]] == [30, 60, 90, 120]
    assert r["first_kib"] == r["samples"][0][1] and r["last_kib"] == r["samples"][-1][1]
    assert r["max_kib"] == max(k for _, k in r["samples"]) > 10_000
    # the churn is real: jobs, programs run warm over the loop's socket, the log rotated at its bound,
    # and the loop found and acted on failures, vanished workers and orphans
    assert r["jobs"] > 50 and r["program_calls"] > 50 and r["log_rotations"] >= 1
    assert {"worker-failed", "missing-worker", "orphan-worker", "down-powered-down"} <= set(r["found"]), r["found"]
    assert "floor <= 5 MiB: met" in printed and "RSS first" in printed
    assert code == (0 if not r["missing_kinds"] else 1)


def test_a_leak_in_the_pass_is_over_the_floor_and_exits_1(monkeypatch, capsys):
    # what the bench is for: memory kept by each pass (here 128 KiB held by the metrics) shows as growth
    kept: list[bytes] = []
    real = reconcile_rss.Metrics.observe_pass

    def leaky(self, *args, **kwargs):
        kept.append(bytes(range(256)) * 512)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(reconcile_rss.Metrics, "observe_pass", leaky)
    assert reconcile_rss.main(QUICK) == 1
    printed = capsys.readouterr().out
    assert "floor <= 5 MiB: NOT met" in printed, printed


def test_a_churn_that_misses_a_kind_is_not_a_measurement():
    r = {"passes": 10, "nodes": 3, "seconds": 0.1, "jobs": 1, "program_calls": 1, "orphans": 0,
         "log_rotations": 0, "found": {"worker-failed": 1}, "samples": [(5, 40_000), (10, 40_100)],
         "first_kib": 40_000, "last_kib": 40_100, "max_kib": 40_100, "warmup": 5, "base_kib": 40_000,
         "growth_kib": 100, "max_growth_kib": 100, "missing_kinds": ["host-lost"]}
    lines, ok = reconcile_rss.report_lines(r, 5.0)
    assert not ok and lines[-1].startswith("the churn never made the loop find: host-lost")
    lines, ok = reconcile_rss.report_lines({**r, "missing_kinds": []}, 5.0)
    assert ok and "growth after 5 passes of warm-up: +0.1 MiB at most" in lines[-1]
