"""The failure ledger's file (issue 40 item 6): written durably (the new file's data, then the
directory's entry, on disk before the update counts), and a bad file (empty after a crash between the
rename and the data reaching the disk, zeroed blocks, not JSON, JSON of the wrong shape) reset with
a logged line, its copy kept beside it, so the pool backoff works again at once instead of never."""

from __future__ import annotations

import os

import pytest
from fakes.backend import FakeBackend
from fakes.slurm import FakeSlurmClient

from provisioner.elastic import ledger as ledger_mod
from provisioner.elastic.backend import Worker
from provisioner.elastic.ledger import FileLedger, LedgerError, Policy, gate
from provisioner.inventory import Inventory, SlurmNode
from provisioner.logs import Log
from provisioner.reconcile.act import run_once

NOW = 1_800_000_000.0
POLICY = Policy(grace=20, pending_timeout=60, backoff_failures=3, backoff_window=600, backoff_cooloff=300)

BAD = {
    "empty": "",
    "zeroed": "\0" * 512,
    "not json": "{not json",
    "cut short": '{"pools": {"cpu": {"failures": [{"node": "cpu-0", "at": 18',
    "not an object": "[1, 2]",
    "a failure's time is no number": '{"pools": {"cpu": {"failures": [{"node": "cpu-0", "at": "soon"}]}}}',
    "pools is a list": '{"pools": [1]}',
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_a_bad_ledger_is_reset_with_a_logged_line_and_the_backoff_works_again(tmp_path, text):
    path = tmp_path / "ledger.json"
    path.write_text(text)
    said: list[str] = []
    led = FileLedger(str(path), POLICY, log=said.append)
    for i in range(3):
        led.record_failure("cpu", f"cpu-{i}", "slurmk8s stuck-pending: ErrImagePull", NOW + i)
    assert gate(led.load()["cpu"], NOW + 3, POLICY) is not None, "three failures open the pool's backoff"
    assert len(said) == 1, said
    assert said[0].startswith(f"the failure ledger {path} was unreadable (") and "reset to empty" in said[0], said
    assert (tmp_path / "ledger.json.bad").read_text() == text, "the bad copy is kept for a look"


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_a_bad_ledger_read_by_the_loop_is_reset_and_classified_without_history(tmp_path, text):
    path = tmp_path / "ledger.json"
    path.write_text(text)
    said: list[str] = []
    assert FileLedger(str(path), POLICY, log=said.append).load() == {}
    assert len(said) == 1 and "reset to empty" in said[0], said
    assert FileLedger(str(path), POLICY, log=said.append).load() == {} and len(said) == 1, "reset once"


def test_the_loop_records_failures_again_after_a_bad_ledger(tmp_path):
    """Through the loop's pass: a worker stuck pending is a failure counted in the ledger though the
    file was empty (before: every pass 'cannot read the failure ledger', nothing ever counted)."""
    path = tmp_path / "ledger.json"
    path.write_text("")
    log = Log("reconcile-test")
    inv = Inventory(tuple(SlurmNode(f"cpu-{i}", "cpu", "cpu", 2, 1024) for i in range(3)))
    nodes = [{"name": f"cpu-{i}", "state": ["IDLE", "CLOUD", "POWERING_UP"], "reason": "", "partitions": ["cpu"]}
             for i in range(3)]
    workers = {f"cpu-{i}": Worker(f"cpu-{i}", "Pending", "ErrImagePull", created_at=NOW - 300, uid=f"u{i}")
               for i in range(3)}
    led = FileLedger(str(path), POLICY, log=log.write)
    report = run_once(FakeSlurmClient(nodes=nodes), FakeBackend(workers), inv, led, NOW, log, POLICY)
    assert not report.errors, report.errors
    assert [f.node for f in led.load()["cpu"].failures] == ["cpu-0", "cpu-1", "cpu-2"]
    assert sum("reset to empty" in line for line in log.lines) == 1, list(log.lines)


def test_an_unreadable_ledger_is_an_error_and_is_not_reset(tmp_path):
    """A read that fails (permissions, an I/O error) says nothing of the content: it is reported, never
    reset (the failures in it may be right)."""
    path = tmp_path / "ledger.json"
    path.mkdir()  # reading a directory fails with an OSError
    with pytest.raises(LedgerError, match="cannot read the failure ledger"):
        FileLedger(str(path), POLICY, log=pytest.fail).load()
    assert path.is_dir() and not (tmp_path / "ledger.json.bad").exists()
    assert FileLedger(str(tmp_path / "absent.json")).load() == {}


def test_an_update_reaches_the_disk_before_it_counts(tmp_path, monkeypatch):
    """The new file's data is fsynced before the rename, and the directory after it: a crash (a node
    losing power) can leave the old ledger or the new one, never an empty file under the name."""
    path = tmp_path / "spool" / "ledger.json"
    seen: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        seen.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(ledger_mod.os, "fsync", fsync)
    monkeypatch.setattr(ledger_mod.os, "replace", replace)
    FileLedger(str(path), POLICY).record_failure("cpu", "cpu-0", "x", NOW)
    ops = [op for op, _ in seen]
    assert ops == ["fsync", "replace", "fsync"], seen
    assert seen[0][1].startswith(str(path) + ".") and seen[0][1].endswith(".tmp"), seen
    assert seen[1][1] == str(path) and seen[2][1] == str(path.parent), seen


def test_a_file_that_is_not_text_is_reset(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    said: list[str] = []
    assert FileLedger(str(path), POLICY, log=said.append).load() == {} and "reset to empty" in said[0], said


def test_the_programs_say_a_reset_in_their_log(tmp_path):
    """The resume / suspend programs' ledger says its reset in the programs' log (elastic.log)."""
    from provisioner.elastic.programs import Context

    path = tmp_path / "ledger.json"
    path.write_text("")
    ctx = Context({"SLURMK8S_LEDGER": str(path)}, Log("resume"))
    assert ctx.ledger().load() == {}
    assert sum("reset to empty" in line for line in ctx.log.lines) == 1, list(ctx.log.lines)
