"""The login pod's activity (SSH sessions, the last Slurm command) as the login agent serves it on
``/activity`` and the reconcile loop reads it, and the probes the idle check uses.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Callable, Mapping

from .decision import ACTIVITY_STALE


def read_activity_file(path: str) -> tuple[float, int, tuple[str, ...]] | None:
    """The login container's session count: one line `EPOCH COUNT USER,USER`, rewritten every few
    seconds by the login entrypoint (images/entrypoint/login.sh)."""
    try:
        with open(path) as fh:
            parts = fh.read().split()
    except OSError:
        return None
    try:
        users = tuple(u for u in parts[2].split(",") if u) if len(parts) > 2 else ()
        return float(parts[0]), int(parts[1]), users
    except (IndexError, ValueError):
        return None


def activity_doc(path: str, last_request: float | None, now: float) -> dict[str, Any]:
    got = read_activity_file(path)
    if got is None:
        return {"sessions": None, "error": f"no session count in {path} yet", "last_request": last_request}
    at, count, users = got
    if now - at > ACTIVITY_STALE:
        return {"sessions": None, "error": f"session count is {now - at:.0f}s old", "last_request": last_request}
    return {"sessions": count, "users": list(users), "updated": at, "last_request": last_request}


def activity_from_doc(doc: Mapping[str, Any] | None, error: str = "") -> tuple[int | None, tuple[str, ...], float | None, str]:
    """(sessions, users, last_request, why unknown) from the agent's /activity answer."""
    if doc is None:
        return None, (), None, error or "no answer"
    sessions = doc.get("sessions")
    last = doc.get("last_request")
    return (int(sessions) if isinstance(sessions, int) else None, tuple(doc.get("users") or ()),
            float(last) if isinstance(last, (int, float)) else None, str(doc.get("error") or ""))


def fetch_activity(url: str, timeout: float = 3.0) -> tuple[dict[str, Any] | None, str]:
    """GET an /activity document (the login agent's, the REST front's): (document, '') or (None, why not)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            doc = json.loads(resp.read().decode())
    except (OSError, urllib.error.URLError, ValueError) as err:
        return None, f"{url} did not answer: {err}"
    return (doc if isinstance(doc, dict) else None), ""


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def serve_activity(doc: Callable[[], dict[str, Any]], port: int) -> None:
    """Serve ``GET /activity`` (the JSON of `doc()`) on `port` for the reconcile loop; runs for ever
    (call it in a daemon thread)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/activity":
                self.send_error(404)
                return
            body = json.dumps(doc()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()
