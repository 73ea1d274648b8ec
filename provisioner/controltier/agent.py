"""The login pod's agent (``python -m provisioner.controltier``, a sidecar with its own
ServiceAccount that may only scale the tier): wakes the tier when a Slurm command or an SSH login
asks on the pod's loopback, and serves the login pod's SSH session count on ``/activity`` for the
reconcile loop's idle check.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Sequence

from .. import manifests as m
from ..logs import Log
from .activity import activity_doc
from .api import ClientTierApi
from .decision import DEFAULT_WAKE_TIMEOUT, TierError
from .tier import Tier


class Agent:
    """The login pod's sidecar: wakes the tier for the login container's Slurm commands (line
    protocol on the pod's loopback) and serves the session count to the reconcile loop."""

    def __init__(self, tier: Tier, activity_file: str, timeout: float = DEFAULT_WAKE_TIMEOUT,
                 awake_cache: float = 2.0) -> None:
        self.tier = tier
        self.activity_file = activity_file
        self.timeout = timeout
        self.awake_cache = awake_cache
        self.last_request: float | None = None
        self._lock = threading.Lock()
        self._awake_at = 0.0
        self._waking = ""  # the reason of the wake under way
        self._woken = 0  # wakes done (requests that waited for one see it change)

    def handle(self, line: str, send: Callable[[str], None]) -> None:
        """One request: `wake USER WHAT`. Replies `progress TEXT`*, then `ok awake` (nothing to do),
        `ok woken` or `error TEXT`."""
        parts = line.split()
        if len(parts) < 1 or parts[0] != "wake":
            send("error unknown request (expected: wake USER COMMAND)")
            return
        user = parts[1] if len(parts) > 1 else "?"
        what = " ".join(parts[2:]) or "a Slurm command"
        self.last_request = time.time()
        if time.monotonic() - self._awake_at < self.awake_cache:
            send("ok awake")
            return
        generation = self._woken
        if self._waking:  # a wake is under way (e.g. from this user's SSH login): wait for it
            send(f"progress waking the control tier (already under way for {self._waking})")
        with self._lock:  # one wake at a time
            if self._woken != generation:
                send("ok woken")  # the wake we waited for is done; the caller waits for slurmctld
                return
            reason = f"{what} by {user} on the login pod"
            self._waking = reason
            try:
                woke = self.tier.wake(reason, progress=lambda t: send(f"progress {t}"), timeout=self.timeout,
                                      running_in=m.LOGIN)
            except TierError as err:
                self.tier.log(f"wake for {reason} failed: {err}")
                send(f"error {err}")
                return
            finally:
                self._waking = ""
            self._awake_at = time.monotonic()
            if woke:
                self._woken += 1
        if woke:
            self.tier.log(f"woke the control tier for {reason}")
        send("ok woken" if woke else "ok awake")

    def activity(self) -> dict[str, Any]:
        return activity_doc(self.activity_file, self.last_request, time.time())


def _serve_lines(agent: Agent, host: str, port: int) -> None:
    import socketserver

    class Handler(socketserver.StreamRequestHandler):
        timeout = 15  # a client that sends no request line does not hold a thread for ever

        def handle(self) -> None:
            try:
                line = self.rfile.readline(512).decode(errors="replace").strip()
            except OSError:
                return

            def send(text: str) -> None:
                try:
                    self.wfile.write((" ".join(text.split()) + "\n").encode())
                    self.wfile.flush()
                except OSError:
                    pass  # the client left (a background wake from an SSH login): keep waking

            agent.handle(line, send)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server((host, port), Handler) as srv:
        srv.serve_forever()


def _serve_activity(agent: Agent, port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/activity":
                self.send_error(404)
                return
            body = json.dumps(agent.activity()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def agent_main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from ..kubeapi import api_client

    parser = argparse.ArgumentParser(prog="python -m provisioner.controltier",
                                     description="The login pod's wake agent (see the module docstring).")
    parser.add_argument("--namespace", default=os.environ.get("SLURMK8S_NAMESPACE", ""))
    parser.add_argument("--wake-port", type=int, default=m.WAKE_PORT)
    parser.add_argument("--activity-port", type=int, default=m.ACTIVITY_PORT)
    parser.add_argument("--activity-file", default=f"{m.ACTIVITY_DIR}/sessions")
    parser.add_argument("--timeout", type=float, default=DEFAULT_WAKE_TIMEOUT)
    args = parser.parse_args(argv)

    log = Log("login-agent", stream=sys.stdout).write

    namespace = args.namespace
    if not namespace:
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as fh:
                namespace = fh.read().strip()
        except OSError:
            log("no --namespace and no ServiceAccount namespace file")
            return 2
    tier = Tier(ClientTierApi(api_client()), namespace, "slurmk8s-login-agent", log=log)
    agent = Agent(tier, args.activity_file, timeout=args.timeout)
    threading.Thread(target=_serve_activity, args=(agent, args.activity_port), daemon=True).start()
    log(f"serving wake requests on 127.0.0.1:{args.wake_port}, activity on :{args.activity_port}/activity "
        f"(namespace {namespace})")
    _serve_lines(agent, "127.0.0.1", args.wake_port)
    return 0


