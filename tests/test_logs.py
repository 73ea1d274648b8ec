"""The one log format and its rotation (provisioner.logs)."""

from __future__ import annotations

import re

from provisioner.logs import Log

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z resume\[\d+\] hello$")


def test_format_and_lines(tmp_path):
    log = Log("resume", str(tmp_path / "a.log"))
    log.write("hello")
    log.close()
    text = (tmp_path / "a.log").read_text().splitlines()
    assert len(text) == 1 and LINE.match(text[0]), text
    assert list(log.lines) == text


def test_an_unwritable_path_falls_back_to_stderr(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    log = Log("resume", str(tmp_path / "file" / "x.log"))  # a directory that is a file
    log.write("hello")
    err = capsys.readouterr().err
    assert "cannot open log file" in err and "hello" in err


def test_a_full_file_is_rotated_once_and_kept_small(tmp_path):
    path = tmp_path / "elastic.log"
    log = Log("resume", str(path), max_bytes=2000)
    for i in range(200):
        log.write(f"line {i:04d} " + "x" * 40)
    log.close()
    assert path.stat().st_size <= 2000 + 100 and (tmp_path / "elastic.log.1").stat().st_size <= 2000 + 100
    assert "line 0199" in path.read_text()
    assert not (tmp_path / "elastic.log.2").exists()


def test_two_programs_share_a_file_across_a_rotation(tmp_path):
    path = tmp_path / "elastic.log"
    a, b = Log("resume", str(path), max_bytes=1500), Log("suspend", str(path), max_bytes=1500)
    for i in range(100):
        (a if i % 2 else b).write(f"line {i:04d} " + "y" * 30)
    a.close()
    b.close()
    text = path.read_text() + (tmp_path / "elastic.log.1").read_text()
    assert "line 0099" in path.read_text(), "the last line is in the current file"
    assert "line 0098" in text and "line 0097" in text


def test_the_events_file_rotates_and_the_tail_follows_a_new_file_even_when_it_is_longer(tmp_path, monkeypatch):
    """append_events renames a full events file to .1; the loop's tail follows the new file by its
    inode, also when the new file has already grown past the old offset."""
    from provisioner.elastic import context
    from provisioner.elastic.events import EventTail

    path = tmp_path / "events.jsonl"
    path.write_text('{"n": 0}\n')
    tail = EventTail(str(path))
    assert tail.read() == []
    monkeypatch.setattr(context, "MAX_EVENTS_BYTES", 5)
    path.rename(tmp_path / "old")  # another program rotated it, then wrote a longer file
    path.write_text('{"n": 1}\n{"n": 2}\n')
    assert tail.read() == [{"n": 1}, {"n": 2}]
    (tmp_path / "old").rename(path)

    class O:
        ok, error = True, ""

        class decision:
            node, action, reason = "cpu-0", type("A", (), {"value": "create"}), type("R", (), {"value": "resume"})

    assert context.append_events(str(path), "resume", [O()]) == ""
    assert (tmp_path / "events.jsonl.1").exists() and path.read_text().count("\n") == 1


def test_the_lines_kept_in_memory_are_bounded(tmp_path):
    """A daemon logs for weeks (the reconcile loop: lines every pass): the lines kept in memory
    (for tests and summaries) are the last ones only, however many were written; the file has all."""
    log = Log("reconcile", str(tmp_path / "r.log"))
    for i in range(20_000):
        log.write(f"pass {i}")
    log.close()
    assert len(log.lines) <= 2_000, f"{len(log.lines)} lines kept in memory"
    assert log.lines[-1].endswith("pass 19999") and log.lines[-500].endswith("pass 19500")
    assert (tmp_path / "r.log").read_text().count("\n") == 20_000
