"""The waking front of the REST API (``python -m provisioner.controltier.restfront``): a container
beside slurmrestd, with ``elasticity.idle_teardown``, that owns the REST port.

slurmrestd stays up while the control tier sleeps (it is not part of the tier), but without
slurmctld every request would hang for ~20 s and end in 502. The front takes each connection on
the Service's port and reads the request's head:

- a request that carries a user's token (``X-SLURM-USER-TOKEN``, or ``Authorization: Bearer``, as
  slurmrestd's rest_auth/jwt reads them) has it checked first (:func:`verify_token`: an HS256 JWT
  signed with the cluster's JWT key, not expired, naming a user); a bad one is answered ``401`` by
  the front and neither wakes nor counts. A good one wakes an
  asleep tier (the login agent's :meth:`Tier.wake`, with the same rights: scale the tier's
  workloads, leave a ``WakeRequested`` Event) and is held until slurmctld answers, at most
  ``hold`` seconds; past that it is answered ``503`` with ``Retry-After`` (the wake goes on), so
  a client sees neither a hang nor a refused connection. Awake (checked at most every
  ``awake_cache`` seconds), it goes straight through;
- a request without a token goes straight to slurmrestd, which refuses it (401) without waking
  anything: an anonymous caller cannot wake the cluster nor keep it awake.

Each byte a client with a good token sends is activity: the front serves the time of the last on
``/activity`` (the login agent's document), and the reconcile loop's idle check reads it beside
the login pod's, so a pipeline polling the REST API keeps the cluster awake.

Only bytes pass through: the front parses the first request's head of each connection and nothing
after it (keep-alive requests follow it unread). The user the wake is recorded for is the token's
(``sun``). No connection holds a slot for ever: its head must arrive within ``read_timeout``, a
connection passed through is closed after ``idle_timeout`` without a byte either way
(``read_timeout`` for one without a token: slurmrestd refuses it at once), and a wake whose
slurmctld does not answer within ``controller_wait`` ends in a ``503`` naming that, the next
request trying again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Sequence

from .. import names
from ..logs import Log
from ..settings import ClusterFiles
from .activity import port_open, serve_activity
from .decision import DEFAULT_WAKE_TIMEOUT, TierError

MAX_HEAD = 64 * 1024  # bytes of a request's head (request line and headers)
READ_TIMEOUT = 15.0  # a client that sends no complete head does not hold a connection for ever
IDLE_TIMEOUT = 300.0  # a passed-through connection with a good token, silent both ways this long, is closed
HOLD = 25.0  # a request that woke the tier waits this long for slurmctld, then hears 503
RETRY_AFTER = 5  # seconds, in the 503's Retry-After
MAX_CONNECTIONS = 256  # connections in flight; over it a client hears 503 at once
TOKEN_HEADERS = ("x-slurm-user-token", "authorization")
BEARER = "Bearer "  # slurmrestd's prefix of the Authorization header's token (case-sensitive)
JWT_KEY = f"{names.JWT_DIR}/{names.JWT_KEY_FILE}"  # the mounted Secret slurm-jwt: the raw HS256 key
_NAME = re.compile(r"[A-Za-z0-9._-]{1,32}")


class Front:
    """The decision and the plumbing for one connection at a time (:meth:`handle`), shared state
    across them: the wake under way, the awake cache and the last request's time.

    `wake(reason)` is :meth:`Tier.wake` (blocking; True when it woke something); `controller_up()`
    says whether slurmctld's port answers. Both run in a thread, never on the event loop.
    `jwt_key()` is the cluster's HS256 key (:class:`KeyFile`)."""

    def __init__(self, wake: Callable[[str], bool], controller_up: Callable[[], bool], upstream: tuple[str, int],
                 log: Callable[[str], None], *, jwt_key: Callable[[], bytes], hold: float = HOLD,
                 awake_cache: float = 2.0, retry_after: int = RETRY_AFTER, read_timeout: float = READ_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT, controller_wait: float = DEFAULT_WAKE_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.wake = wake
        self.jwt_key = jwt_key
        self.idle_timeout = idle_timeout
        self.controller_wait = controller_wait
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
            # its failure is heard by the requests waiting then; one none waited for is not an error
            self._waking.add_done_callback(lambda t: t.cancelled() or t.exception())
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
            until = time.monotonic() + self.controller_wait
            while not await asyncio.to_thread(self.controller_up):
                if time.monotonic() >= until:  # the next request wakes again (and so looks again)
                    self.log(f"slurmctld did not answer within {self.controller_wait:.0f}s of the wake")
                    raise TierError(f"slurmctld did not answer within {self.controller_wait:.0f}s of the wake")
                await asyncio.sleep(0.25)
            self.log("slurmctld answers: passing requests on")
        self._awake_at = time.monotonic()

    def activity(self) -> dict[str, Any]:
        """The login agent's /activity document: no SSH sessions here, the last request with a good token."""
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
                user, why = self.check(headers)
                if why:  # neither a wake nor activity: slurmctld would refuse it too
                    await _reply(reader, writer, 401, f"the request's token is refused: {why}")
                    return
                self.last_request = time.time()
                who = user if _NAME.fullmatch(user) else "a user"
                why_not = await self._awake(f"a REST request by {who}")
                if why_not:
                    await _reply(reader, writer, 503, f"{why_not}; retry in {self.retry_after} s", self.retry_after)
                    return
            await self._pipe(head, reader, writer, token)
        finally:
            self.in_flight -= 1
            writer.close()

    def check(self, headers: dict[str, str]) -> tuple[str, str]:
        """(the token's user, '') for a request whose token is good, else ('', why not)."""
        token, why = request_token(headers)
        if why:
            return "", why
        try:
            key = self.jwt_key()
        except OSError as err:
            return "", f"the REST front cannot read the cluster's JWT key ({err.strerror or err})"
        try:
            return verify_token(token, key, time.time()), ""
        except TokenError as err:
            return "", str(err)

    async def _pipe(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: bool) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError as err:
            await _reply(reader, writer, 503, f"slurmrestd is not answering yet ({err.strerror or err})", self.retry_after)
            return
        up_writer.write(head)
        # a connection silent both ways this long is closed: its slot is not held for ever (one
        # without a token is refused by slurmrestd at once, so it gets no longer than a head)
        idle = self.idle_timeout if token else self.read_timeout
        last = [time.monotonic()]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, counts: bool) -> None:
            try:
                while True:
                    try:
                        chunk = await asyncio.wait_for(src.read(65536), idle)
                    except asyncio.TimeoutError:
                        if time.monotonic() - last[0] < idle:
                            continue  # the other way is busy (an upload, a slow answer)
                        break
                    if not chunk:
                        break
                    last[0] = time.monotonic()
                    if counts:
                        self.last_request = time.time()
                    dst.write(chunk)
                    await asyncio.wait_for(dst.drain(), idle)
            except (ConnectionError, asyncio.TimeoutError):
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


class TokenError(ValueError):
    """Why a request's token is refused (the front answers it 401)."""


def request_token(headers: dict[str, str]) -> tuple[str, str]:
    """(the token, '') as slurmrestd's rest_auth/jwt takes it from a request's headers (lower-case
    names): ``X-SLURM-USER-TOKEN``, or ``Authorization: Bearer TOKEN``, not both; else ('', why)."""
    key, bearer = headers.get("x-slurm-user-token"), headers.get("authorization")
    if key is not None and bearer is not None:
        return "", "both X-SLURM-USER-TOKEN and Authorization are set (slurmrestd refuses that): send one"
    if key is not None:
        return key, ""
    if bearer is not None and bearer.startswith(BEARER):
        return bearer[len(BEARER):].strip(), ""
    return "", "the Authorization header is not 'Bearer TOKEN'"


def _b64url(text: str) -> bytes:
    return base64.b64decode(text.translate(str.maketrans("-_", "+/")) + "=" * (-len(text) % 4), validate=True)


def verify_token(token: str, key: bytes, now: float) -> str:
    """The user a Slurm JWT was issued to (``sun``, else ``username``, as auth/jwt reads it), once
    it is an HS256 JWT signed with `key` (compared in constant time) whose ``exp`` has not passed;
    else :class:`TokenError` saying why. Slurm's tokens (``scontrol token``, ``slurmk8s token``)
    are ``{"alg": "HS256"}`` with ``iat``, ``exp`` and ``sun``; any other alg (``none``) is refused."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts[:2]):
        raise TokenError("not a JWT (three base64url parts separated by '.')")
    try:
        header = json.loads(_b64url(parts[0]))
        signature = _b64url(parts[2])
        signed = f"{parts[0]}.{parts[1]}".encode("ascii")
    except (ValueError, binascii.Error):  # UnicodeError and JSONDecodeError are ValueErrors
        raise TokenError("not a JWT (its header or signature is not base64url JSON)") from None
    alg = header.get("alg") if isinstance(header, dict) else None
    if alg != "HS256":
        raise TokenError(f"alg {alg!r} is not HS256 (the cluster's tokens are HS256)")
    if not hmac.compare_digest(hmac.new(key, signed, hashlib.sha256).digest(), signature):
        raise TokenError("its signature does not match the cluster's JWT key")
    try:
        claims = json.loads(_b64url(parts[1]))
    except (ValueError, binascii.Error):
        raise TokenError("its claims are not base64url JSON") from None
    if not isinstance(claims, dict):
        raise TokenError("its claims are not a JSON object")
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        raise TokenError("it has no expiry (exp)")
    if exp < int(now):
        raise TokenError(f"it expired {int(now - exp)} s ago: get a new one (scontrol token, slurmk8s token)")
    user = claims.get("sun", claims.get("username"))
    if not isinstance(user, str) or not user:
        raise TokenError("it names no user (sun)")
    return user


class KeyFile:
    """The JWT key as a file of its raw bytes (the mounted Secret), read again when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._key = b""

    def __call__(self) -> bytes:
        st = os.stat(self.path)  # follows the Secret volume's symlinks: a new key is a new file
        if (st.st_ino, st.st_mtime_ns, st.st_size) != self._seen:
            with open(self.path, "rb") as f:
                key = f.read()
            if not key:
                raise OSError(f"{self.path} is empty")
            self._key, self._seen = key, (st.st_ino, st.st_mtime_ns, st.st_size)
        return self._key


def parse_headers(head: bytes) -> dict[str, str]:
    """Header names (lower case) -> values of a request's head; the request line is skipped."""
    out: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.setdefault(name.strip().lower(), value.strip())
    return out


async def _reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, text: str,
                 retry_after: int | None = None) -> None:
    """A complete HTTP/1.1 answer in slurmrestd's error shape, then the connection closes: what the
    client still sends (a body) is read and dropped first, briefly, since closing with unread input
    would reset the connection, answer and all."""
    body = json.dumps({"errors": [{"error": text, "description": text, "source": "slurmk8s REST front",
                                   "error_number": status}], "warnings": []}).encode()
    words = {401: "Unauthorized", 503: "Service Unavailable"}.get(status, "Error")
    retry = "" if retry_after is None else f"Retry-After: {retry_after}\r\n"
    head = (f"HTTP/1.1 {status} {words}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{retry}Connection: close\r\n\r\n")
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
    parser.add_argument("--namespace", default=ClusterFiles.from_env(os.environ).namespace or "")
    parser.add_argument("--port", type=int, default=names.REST_PORT)
    parser.add_argument("--upstream", default=f"127.0.0.1:{names.REST_LOCAL_PORT}", help="slurmrestd's HOST:PORT")
    parser.add_argument("--controller", required=True, help="slurmctld's HOST:PORT")
    parser.add_argument("--activity-port", type=int, default=names.ACTIVITY_PORT)
    parser.add_argument("--hold", type=float, default=HOLD)
    parser.add_argument("--timeout", type=float, default=DEFAULT_WAKE_TIMEOUT)
    parser.add_argument("--jwt-key", default=JWT_KEY, help="the cluster's HS256 key (raw bytes), to check tokens")
    args = parser.parse_args(argv)
    log = Log("rest-front", stream=sys.stdout).write
    if not args.namespace:
        log("no --namespace")
        return 2
    jwt_key = KeyFile(args.jwt_key)
    try:
        jwt_key()
    except OSError as err:
        log(f"cannot read the cluster's JWT key at {args.jwt_key} ({err.strerror or err}): mount the Secret "
            f"slurm-jwt (key {names.JWT_KEY_FILE}) at {names.JWT_DIR}, readable by uid {os.getuid()}")
        return 2
    tier = Tier(ClientTierApi(api_client()), args.namespace, "slurmk8s-rest-front", log=log)
    host, port = _host_port(args.controller)
    front = Front(lambda reason: tier.wake(reason, timeout=args.timeout),
                  lambda: port_open(host, port), _host_port(args.upstream), log, jwt_key=jwt_key, hold=args.hold,
                  controller_wait=args.timeout)
    threading.Thread(target=serve_activity, args=(front.activity, args.activity_port), daemon=True).start()
    log(f"REST front on :{args.port} for slurmrestd at {args.upstream}: a request with a good token wakes the "
        f"control tier (held {args.hold:.0f}s, then 503); activity on :{args.activity_port}/activity "
        f"(namespace {args.namespace})")
    asyncio.run(serve(front, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
