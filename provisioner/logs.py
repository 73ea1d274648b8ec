"""One log format for every slurmk8s program and daemon, on the standard library's :mod:`logging`::

    2026-12-01T10:11:41.123Z reconcile[4242] <message>

UTC with milliseconds, the program and its pid, then the message; one line per record, appended
(``O_APPEND``: safe when several programs write one file, as the resume / suspend programs do).

:class:`Log` is what the programs hold: a :class:`logging.Logger` of its own (not registered
globally, so short-lived programs and tests leave nothing behind) with one handler, a file or a
stream. A log file that cannot be opened falls back to stderr, so a wrong log path never stops a
program from doing its work. A log file past ``max_bytes`` (16 MiB) is renamed to ``<file>.1`` and
started anew, so the logs stay within the small emptyDir they share. ``lines`` keeps the last
:data:`KEEP_LINES` lines written (tests, final summaries): a bounded deque, as the reconcile loop
logs for as long as its pod lives and kept every line of it in memory before.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from typing import TextIO

KEEP_LINES = 1000  # lines kept in memory per Log: the file (or stream) has them all


class Formatter(logging.Formatter):
    """``<UTC time with ms>Z <program>[<pid>] <message>``."""

    def __init__(self, program: str, pid: int | None = None) -> None:
        # pid: the process the lines speak for, when another one writes them (the reconcile loop
        # running a power-saving program for the process Slurm started: elastic/warm.py)
        process = "%(process)d" if pid is None else str(int(pid))
        super().__init__("%(asctime)s " + program.replace("%", "%%") + f"[{process}] %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class _Lines(logging.Handler):
    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class _Stream(logging.StreamHandler):
    """A stream handler that stops writing (instead of printing a traceback) when the stream fails."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        self.stream = _Null()  # keep working; nothing left to report to


def rotate_if_full(path: str, max_bytes: int) -> bool:
    """Rename ``path`` to ``path.1`` (the one generation kept) once it holds ``max_bytes``; True if
    it did. Best effort: a file that cannot be read or renamed is left as it is."""
    try:
        if os.path.getsize(path) >= max_bytes:
            os.replace(path, path + ".1")
            return True
    except OSError:
        pass
    return False


class _File(logging.FileHandler):
    """Appends to ``path``; past ``max_bytes`` the file is renamed to ``path.1`` (one generation
    kept) and a new one started, so the logs cannot fill the small volume they live on. Several
    programs may append to one file: the one that finds it too big renames it, and any other that
    still writes to the renamed file notices (another inode at ``path``) and reopens ``path``."""

    def __init__(self, path: str, max_bytes: int) -> None:
        super().__init__(path, mode="a", encoding="utf-8")
        self.max_bytes = max_bytes

    def emit(self, record: logging.LogRecord) -> None:
        if self.max_bytes and self.stream is not None:
            self._maybe_rotate(self.stream)
        super().emit(record)

    def _maybe_rotate(self, stream: TextIO) -> None:
        try:
            mine = os.fstat(stream.fileno())
            try:
                current = os.stat(self.baseFilename)
            except FileNotFoundError:
                current = None
            if current is None or current.st_ino != mine.st_ino:  # rotated by another program
                self._reopen(stream)
            elif rotate_if_full(self.baseFilename, self.max_bytes):
                self._reopen(stream)
        except OSError:
            pass  # rotation is best effort; the line is still written

    def _reopen(self, stream: TextIO) -> None:
        stream.close()
        self.stream = self._open()

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        pass  # a full disk must not stop the program; the line is lost, the work goes on


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


MAX_BYTES = 16 * 1024 * 1024  # per log file; with the one kept generation, 32 MiB at most


class Log:
    """Timestamped lines to one file (or a stream), through :mod:`logging`."""

    def __init__(self, program: str, path: str | None = None, stream: TextIO | None = None,
                 max_bytes: int = MAX_BYTES, pid: int | None = None) -> None:
        self.program = f"{program}[{os.getpid() if pid is None else pid}]"
        self.path = path
        self.logger = logging.Logger(f"slurmk8s.{program}", logging.INFO)
        self.logger.propagate = False
        formatter = Formatter(program, pid)
        self._lines = _Lines(formatter)
        self.lines = self._lines.lines  # the last KEEP_LINES, for tests and for the final summary
        self.logger.addHandler(self._lines)
        self._handler: logging.Handler | None = None
        problem = ""
        if stream is None and path:
            try:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                self._handler = _File(path, max_bytes)
            except OSError as err:
                stream, problem = sys.stderr, f"cannot open log file {path}: {err}; logging to stderr"
        if self._handler is None and stream is not None:
            self._handler = _Stream(stream)
        if self._handler is not None:
            self._handler.setFormatter(formatter)
            self.logger.addHandler(self._handler)
        if problem:
            self.write(problem)

    def write(self, message: str) -> None:
        self.logger.info(message)

    def close(self) -> None:
        if isinstance(self._handler, logging.FileHandler):
            self._handler.close()
