"""The events file: one JSON line per decision of the resume / suspend programs, tailed by the
reconcile loop for its metrics.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from .. import settings

MAX_EVENTS_BYTES = 16 * 1024 * 1024  # then the file is renamed to <file>.1 (see append_events)
DEFAULT_EVENTS: str = settings.default(settings.EVENTS)


@dataclass
class EventTail:
    """Reads the JSON lines appended to the events file since the last call (from its end at start:
    counters restart at zero with the process, as Prometheus expects; from its beginning when it
    did not exist at start, so a fresh cluster's first resume is counted)."""

    path: str
    offset: int | None = None
    _partial: str = ""
    _inode: int | None = None

    def read(self) -> list[dict[str, Any]]:
        try:
            st = os.stat(self.path)
        except OSError:
            if self.offset is None:
                self.offset = 0  # no file yet (a fresh cluster): everything written to it later is new
            return []
        size, inode, self._inode = st.st_size, self._inode, st.st_ino
        if self.offset is None:
            self.offset = size
            return []
        if size < self.offset or (inode is not None and inode != st.st_ino):  # truncated / rotated
            self.offset, self._partial = 0, ""
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(size - self.offset)
        except OSError:
            return []
        self.offset += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn or foreign line: skip it, keep reading
            if isinstance(obj, dict):
                out.append(obj)
        return out
