"""ruff over the repository with the configuration in pyproject.toml ([tool.ruff]): pyflakes' unused
and undefined names, syntax errors and bugbear's checks. It fails, naming each finding, until the
code is clean; `ruff check --fix` repairs the fixable ones."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    assert importlib.util.find_spec("ruff") is not None, "ruff is missing: pip install -e '.[test]'"
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                           "provisioner", "tests", "e2e", "bench", "stacks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
