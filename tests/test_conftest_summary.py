"""The test run's own summary (conftest.py): seconds per tier and the slowest test modules, which
CI's log shows so that a growing suite's cost is seen where it is."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def test_the_summary_gives_time_per_tier_and_the_slowest_modules(pytester):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    for i in range(14):
        pytester.makepyfile(**{f"test_m{i:02d}": f"import time\n\ndef test_a():\n    time.sleep({0.05 if i == 7 else 0})\n"})
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=14)
    out = result.stdout.str()
    assert "time per tier" in out and "unit" in out
    assert "slowest 12 test modules" in out
    listed = [line for line in out.splitlines() if line.rstrip().endswith(".py") and " s  " in line]
    assert len(listed) == 12 and listed[0].endswith("test_m07.py"), listed
