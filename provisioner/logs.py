"""One log format for every slurmk8s program and daemon, on the standard library's :mod:`logging`::

    2026-12-01T10:11:41.123Z reconcile[4242] <message>

UTC with milliseconds, the program and its pid, then the message; one line per record, appended
(``O_APPEND``: safe when several programs write one file, as the resume / suspend programs do).

:class:`Log` is what the programs hold: a :class:`logging.Logger` of its own (not registered
globally, so short-lived programs and tests leave nothing behind) with one handler, a file or a
stream. A log file that cannot be opened falls back to stderr, so a wrong log path never stops a
program from doing its work. ``lines`` keeps what was written (tests, final summaries).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TextIO


class Formatter(logging.Formatter):
    """``<UTC time with ms>Z <program>[<pid>] <message>``."""

    def __init__(self, program: str) -> None:
        super().__init__("%(asctime)s " + program.replace("%", "%%") + "[%(process)d] %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class _Lines(logging.Handler):
    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class _Stream(logging.StreamHandler):
    """A stream handler that stops writing (instead of printing a traceback) when the stream fails."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        self.stream = _Null()  # keep working; nothing left to report to


class _File(logging.FileHandler):
    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        pass  # a full disk must not stop the program; the line is lost, the work goes on


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


class Log:
    """Timestamped lines to one file (or a stream), through :mod:`logging`."""

    def __init__(self, program: str, path: str | None = None, stream: TextIO | None = None) -> None:
        self.program = f"{program}[{os.getpid()}]"
        self.path = path
        self.logger = logging.Logger(f"slurmk8s.{program}", logging.INFO)
        self.logger.propagate = False
        formatter = Formatter(program)
        self._lines = _Lines(formatter)
        self.lines = self._lines.lines  # kept for tests and for the final summary
        self.logger.addHandler(self._lines)
        self._handler: logging.Handler | None = None
        problem = ""
        if stream is None and path:
            try:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                self._handler = _File(path, mode="a", encoding="utf-8")
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
