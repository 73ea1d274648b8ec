"""The slurmd entrypoint's locked-memory step (``set_memlock`` in images/entrypoint/lib.sh), run with
bash in a subprocess under a lowered limit: it raises the limit only when the pool asks for it
(``SLURMK8S_MEMLOCK_UNLIMITED=1``, from ``pools[].network.memlock_unlimited``) and says loudly when
the runtime's hard limit stops it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "images" / "entrypoint" / "lib.sh"
SLURMD_SH = LIB.parent / "slurmd.sh"


def _run(want: str | None, soft: int = 32, hard: int = 64) -> subprocess.CompletedProcess:
    """set_memlock under soft/hard KiB limits; prints the limits it leaves on stdout."""
    env_set = "" if want is None else f"export SLURMK8S_MEMLOCK_UNLIMITED={want}; "
    script = (f"ulimit -S -l {soft} && ulimit -H -l {hard} || exit 99; {env_set}"
              f". {LIB}; SLURMK8S_ROLE=slurmd; set_memlock; echo \"soft=$(ulimit -S -l) hard=$(ulimit -H -l)\"")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def _can_raise_hard_limit() -> bool:
    """True where this test process may raise a hard limit (CAP_SYS_RESOURCE): the refusal cannot be shown."""
    probe = subprocess.run(["bash", "-c", "ulimit -S -l 32 && ulimit -H -l 64 && ulimit -H -l 128"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def test_slurmd_entrypoint_calls_set_memlock():
    assert "\nset_memlock\n" in SLURMD_SH.read_text()


@pytest.mark.parametrize("want", ["1", None])
def test_asked_and_refused_by_the_hard_limit_it_raises_the_soft_one_and_warns(want):
    if _can_raise_hard_limit():
        pytest.skip("this process may raise hard limits (CAP_SYS_RESOURCE): the refusal cannot happen here")
    r = _run(want)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "soft=64 hard=64"
    assert "WARNING: memlock:" in r.stderr and "memlock_unlimited" in r.stderr and "64 KiB" in r.stderr


def test_not_asked_it_leaves_the_runtime_limits_alone():
    r = _run("0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "soft=32 hard=64"
    assert "memlock_unlimited is false" in r.stderr and "WARNING" not in r.stderr


def test_a_bad_value_is_fatal():
    r = _run("yes")
    assert r.returncode == 1 and "FATAL" in r.stderr and "SLURMK8S_MEMLOCK_UNLIMITED" in r.stderr
