"""mypy over provisioner/ with the configuration in pyproject.toml ([tool.mypy]): it fails, naming
each finding, until the package type-checks. Its cache (.mypy_cache/, ignored by git) makes a run
after the first one take a few seconds."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing():
    assert importlib.util.find_spec("mypy") is not None, "mypy is missing: pip install -e '.[test]'"
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
