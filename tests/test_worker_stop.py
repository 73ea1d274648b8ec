"""images/slurmd/worker-stop, the worker's preStop hook, run for real with stand-ins for squeue,
scontrol and pgrep on PATH: a pod deleted under running jobs requeues them while slurmd still runs
and waits (bounded) for their processes to end; with no job it returns at once."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

HOOK = Path(__file__).resolve().parents[1] / "images" / "slurmd" / "worker-stop"


def _bin(d: Path, name: str, body: str) -> None:
    p = d / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)


def _run(tmp_path: Path, jobs: str, *, steps_end_after: float = 0.0, requeue_fails: bool = False,
         limit: str = "3") -> tuple[subprocess.CompletedProcess[str], list[str], float]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    ends = time.time() + steps_end_after
    _bin(bindir, "squeue", f'echo "squeue $*" >> {calls}; printf "{jobs}"')
    _bin(bindir, "scontrol", f'echo "scontrol $*" >> {calls}; exit {1 if requeue_fails else 0}')
    _bin(bindir, "pgrep", f'[ "$(date +%s)" -lt {int(ends) + (1 if steps_end_after else 0)} ]')
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURMK8S_NODENAME": "cpu-3"}
    t0 = time.monotonic()
    done = subprocess.run(["sh", str(HOOK), limit], env=env, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    return done, calls.read_text().splitlines() if calls.exists() else [], took


def test_no_job_on_the_node_returns_at_once_without_requeueing(tmp_path: Path):
    done, calls, took = _run(tmp_path, "")
    assert done.returncode == 0 and took < 2
    assert calls == ["squeue -h -w cpu-3 -t RUNNING -o %A"]


def test_the_running_jobs_are_requeued_and_the_hook_waits_for_their_steps(tmp_path: Path):
    done, calls, took = _run(tmp_path, "41\\n42\\n", steps_end_after=1.5)
    assert done.returncode == 0
    assert calls[1:] == ["scontrol requeue 41", "scontrol requeue 42"]
    assert 1.0 <= took < 3.5  # until the stand-in's slurmstepd is gone


def test_the_wait_is_bounded_and_a_job_that_cannot_be_requeued_does_not_fail_the_hook(tmp_path: Path):
    done, calls, took = _run(tmp_path, "41\\n", steps_end_after=60, requeue_fails=True, limit="2")
    assert done.returncode == 0 and "scontrol requeue 41" in calls
    assert 1 <= took < 4.5  # whole seconds of date +%s: 1 to 3 s
