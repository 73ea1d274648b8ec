"""Locating and running the shell scripts of this package."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

TOOLCHAIN_SCRIPT = "toolchain.sh"
CLUSTER_SCRIPT = "cluster.sh"


def script_path(name: str) -> Path:
    """Path of a script shipped with this package (package data)."""
    path = Path(str(resources.files("provisioner.localk8s").joinpath(name)))
    if not path.is_file():
        raise FileNotFoundError(f"{name} is missing from the installed package ({path})")
    return path


def script_argv(name: str, args: Sequence[str]) -> list[str]:
    """argv that runs a packaged script with bash (package data may lose its executable bit)."""
    return ["bash", str(script_path(name)), *args]


def run_script(name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run a script with its output streamed to ours; returns its exit status."""
    full_env = {**os.environ, "LOCALK8S_CMD": "slurmk8s cluster", **(env or {})}
    try:
        return subprocess.run(script_argv(name, args), env=full_env, check=False).returncode
    except KeyboardInterrupt:
        return 130


def script_output(name: str, args: Sequence[str]) -> str:
    """Run a script that prints one value (a path) and return it stripped."""
    done = subprocess.run(script_argv(name, args), capture_output=True, text=True, check=True)
    return done.stdout.strip()
