"""The waking front of the REST API (``python -m provisioner.controltier.restfront``): a container
beside slurmrestd, with ``elasticity.idle_teardown``, that owns the REST port.

slurmrestd stays up while the control tier sleeps (it is not part of the tier), but without
slurmctld every request would hang for ~20 s and end in 502. The front takes each connection on
the Service's port and reads the request's head:

- a request that carries a user's token (``X-SLURM-USER-TOKEN`` or ``Authorization``) wakes an
  asleep tier (the login agent's :meth:`Tier.wake`, with the same rights: scale the tier's
  workloads, leave a ``WakeRequested`` Event) and is held until slurmctld answers, at most
  ``hold`` seconds; past that it is answered ``503`` with ``Retry-After`` (the wake goes on), so
  a client sees neither a hang nor a refused connection. Awake (checked at most every
  ``awake_cache`` seconds), it goes straight through;
- a request without a token goes straight to slurmrestd, which refuses it (401) without waking
  anything: an anonymous caller cannot wake the cluster nor keep it awake.

Each byte a token-bearing client sends is activity: the front serves the time of the last on
``/activity`` (the login agent's document), and the reconcile loop's idle check reads it beside
the login pod's, so a pipeline polling the REST API keeps the cluster awake.

Only bytes pass through: the front parses the first request's head of each connection and nothing
after it (keep-alive requests follow it unread). The user the wake is recorded for is the
``X-SLURM-USER-NAME`` header as sent: slurmctld checks the token, the front cannot (it holds no key).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Sequence

from .. import names as m
from ..logs import Log
from .activity import port_open, serve_activity
from .decision import DEFAULT_WAKE_TIMEOUT, TierError

MAX_HEAD = 64 * 1024  # bytes of a request's head (request line and headers)
READ_TIMEOUT = 15.0  # a client that sends no complete head does not hold a connection for ever
HOLD = 25.0  # a request that woke the tier waits this long for slurmctld, then hears 503
RETRY_AFTER = 5  # seconds, in the 503's Retry-After
MAX_CONNECTIONS = 256  # connections in flight; over it a client hears 503 at once
TOKEN_HEADERS = ("x-slurm-user-token", "authorization")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,32}")


class Front:
    """The decision and the plumbing for one connection at a time (:meth:`handle`), shared state
    across them: the wake under way, the awake cache and the last request's time.

    `wake(reason)` is :meth:`Tier.wake` (blocking; True when it woke something); `controller_up()`
    says whether slurmctld's port answers. Both run in a thread, never on the event loop."""

    def __init__(self, wake: Callable[[str], bool], controller_up: Callable[[], bool], upstream: tuple[str, int],
                 log: Callable[[str], None], hold: float = HOLD, awake_cache: float = 2.0,
                 retry_after: int = RETRY_AFTER, read_timeout: float = READ_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.wake = wake
        self.controller_up = controller_up
        self.upstream = upstream
        self.log = log
        self.hold = hold
        self.awake_cache = awake_cache
        self.retry_after = retry_after
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.last_request: float | None = None  # wall clock, for /activity
        self.in_flight = 0
        self._awake_at = -1e9  # monotonic
        self._waking: asyncio.Task[None] | None = None

    # -- the decision

    async def _awake(self, reason: str) -> str:
        """'' once the tier is awake and slurmctld answers (within `hold`), else why not yet."""
        if time.monotonic() - self._awake_at < self.awake_cache:
            return ""
        if self._waking is None or self._waking.done():
            self._waking = asyncio.get_running_loop().create_task(self._wake(reason))
        try:
            await asyncio.wait_for(asyncio.shield(self._waking), self.hold)
        except asyncio.TimeoutError:
            return "the cluster is waking up"
        except TierError as err:
            return f"the cluster could not be woken: {err}"
        return ""

    async def _wake(self, reason: str) -> None:
        woke = await asyncio.to_thread(self.wake, reason)
        if woke:
            self.log(f"woke the control tier for {reason}")
            while not await asyncio.to_thread(self.controller_up):
                await asyncio.sleep(0.25)
            self.log("slurmctld answers: passing requests on")
        self._awake_at = time.monotonic()

    def activity(self) -> dict[str, Any]:
        """The login agent's /activity document: no SSH sessions here, the last token-bearing request."""
        return {"sessions": 0, "users": [], "updated": time.time(), "last_request": self.last_request}

    # -- one connection

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.in_flight += 1
        try:
            if self.in_flight > self.max_connections:
                await _reply(reader, writer, 503, f"too many connections ({self.in_flight - 1} in flight)", self.retry_after)
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
                return
            headers = parse_headers(head)
            token = any(h in headers for h in TOKEN_HEADERS)
            if token:
                self.last_request = time.time()
                user = headers.get("x-slurm-user-name", "")
                who = user if _NAME.fullmatch(user) else "a user"
                why_not = await self._awake(f"a REST request by {who}")
                if why_not:
                    await _reply(reader, writer, 503, f"{why_not}; retry in {self.retry_after} s", self.retry_after)
                    return
            await self._pipe(head, reader, writer, token)
        finally:
            self.in_flight -= 1
            writer.close()

    async def _pipe(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: bool) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError as err:
            await _reply(reader, writer, 503, f"slurmrestd is not answering yet ({err.strerror or err})", self.retry_after)
            return
        up_writer.write(head)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, counts: bool) -> None:
            try:
                while chunk := await src.read(65536):
                    if counts:
                        self.last_request = time.time()
                    dst.write(chunk)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                if dst.can_write_eof():
                    try:
                        dst.write_eof()
                    except (OSError, RuntimeError):
                        pass

        try:
            await asyncio.gather(copy(reader, up_writer, token), copy(up_reader, writer, False))
        finally:
            up_writer.close()


def parse_headers(head: bytes) -> dict[str, str]:
    """Header names (lower case) -> values of a request's head; the request line is skipped."""
    out: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.setdefault(name.strip().lower(), value.strip())
    return out


async def _reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, text: str,
                 retry_after: int) -> None:
    """A complete HTTP/1.1 answer in slurmrestd's error shape, then the connection closes: what the
    client still sends (a body) is read and dropped first, briefly, since closing with unread input
    would reset the connection, answer and all."""
    body = json.dumps({"errors": [{"error": text, "description": text, "source": "slurmk8s REST front",
                                   "error_number": status}], "warnings": []}).encode()
    words = {503: "Service Unavailable"}.get(status, "Error")
    head = (f"HTTP/1.1 {status} {words}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: {retry_after}\r\nConnection: close\r\n\r\n")
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        left = MAX_HEAD
        async with asyncio.timeout(1.0):
            while left > 0 and (chunk := await reader.read(min(left, 4096))):
                left -= len(chunk)
    except (ConnectionError, TimeoutError, OSError):
        pass


async def serve(front: Front, port: int) -> None:
    server = await asyncio.start_server(front.handle, "0.0.0.0", port, limit=MAX_HEAD)
    async with server:
        await server.serve_forever()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from ..kubeapi import api_client
    from .api import ClientTierApi
    from .tier import Tier

    parser = argparse.ArgumentParser(prog="python -m provisioner.controltier.restfront",
                                     description="The REST API's waking front (see the module docstring).")
    parser.add_argument("--namespace", default=os.environ.get("SLURMK8S_NAMESPACE", ""))
    parser.add_argument("--port", type=int, default=m.REST_PORT)
    parser.add_argument("--upstream", default=f"127.0.0.1:{m.REST_LOCAL_PORT}", help="slurmrestd's HOST:PORT")
    parser.add_argument("--controller", required=True, help="slurmctld's HOST:PORT")
    parser.add_argument("--activity-port", type=int, default=m.ACTIVITY_PORT)
    parser.add_argument("--hold", type=float, default=HOLD)
    parser.add_argument("--timeout", type=float, default=DEFAULT_WAKE_TIMEOUT)
    args = parser.parse_args(argv)
    log = Log("rest-front", stream=sys.stdout).write
    if not args.namespace:
        log("no --namespace")
        return 2
    tier = Tier(ClientTierApi(api_client()), args.namespace, "slurmk8s-rest-front", log=log)
    host, port = _host_port(args.controller)
    front = Front(lambda reason: tier.wake(reason, timeout=args.timeout),
                  lambda: port_open(host, port), _host_port(args.upstream), log, hold=args.hold)
    threading.Thread(target=serve_activity, args=(front.activity, args.activity_port), daemon=True).start()
    log(f"REST front on :{args.port} for slurmrestd at {args.upstream}: a request with a token wakes the "
        f"control tier (held {args.hold:.0f}s, then 503); activity on :{args.activity_port}/activity "
        f"(namespace {args.namespace})")
    asyncio.run(serve(front, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
