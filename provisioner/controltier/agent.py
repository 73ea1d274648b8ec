"""The login pod's agent (``python -m provisioner.controltier``, a sidecar with its own
ServiceAccount that may only scale the tier): wakes the tier when a Slurm command or an SSH login
asks on a Unix socket shared with the login container, and serves the login pod's SSH session count
on ``/activity`` for the reconcile loop's idle check.

The wake socket names each caller by the uid the kernel reports for it (``SO_PEERCRED``), mapped to
a name through the cluster's passwd (the users ConfigMap): the name a request line carries is not
trusted. Connections are capped (in all and per uid; over the cap the caller hears ``error busy``
at once), so a flood of idle clients cannot make the agent start threads without bound.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .. import names
from ..logs import Log
from ..settings import ClusterFiles
from .activity import activity_doc, serve_activity
from .api import ClientTierApi
from .decision import DEFAULT_WAKE_TIMEOUT, TierError
from .tier import Tier, controller_listens

MAX_LINE = 512  # bytes of a request line (without its newline); a longer one is refused
READ_TIMEOUT = 15.0  # a client that sends no request line does not hold a connection for ever
MAX_CONNECTIONS = 64  # wake connections in flight, all callers together
MAX_PER_UID = 8  # ... and from one uid
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Agent:
    """The login pod's sidecar: wakes the tier for the login container's Slurm commands (line
    protocol on a Unix socket, :class:`WakeServer`) and serves the session count to the reconcile loop."""

    def __init__(self, tier: Tier, activity_file: str, timeout: float = DEFAULT_WAKE_TIMEOUT,
                 awake_cache: float = 2.0, answers: Callable[[], bool] | None = None) -> None:
        self.tier = tier
        self.answers = answers  # slurmctld takes connections (tier.controller_listens): done waking
        self.activity_file = activity_file
        self.timeout = timeout
        self.awake_cache = awake_cache
        self.last_request: float | None = None
        self._lock = threading.Lock()
        self._awake_at = 0.0
        self._waking = ""  # the reason of the wake under way
        self._woken = 0  # wakes done (requests that waited for one see it change)

    def handle(self, line: str, send: Callable[[str], None], user: str) -> None:
        """One request: `wake CLAIMED-USER WHAT` from `user` (named by the server from the caller's
        kernel uid; CLAIMED-USER is ignored). Replies `progress TEXT`*, then `ok awake` (nothing to
        do), `ok woken` or `error TEXT`."""
        parts = line.split()
        if len(parts) < 1 or parts[0] != "wake":
            send("error unknown request (expected: wake USER COMMAND)")
            return
        claimed = parts[1] if len(parts) > 1 else ""
        if claimed and claimed != user:
            self.tier.log(f"wake request from {user} names the user {claimed[:64]!r}: ignored")
        what = " ".join(parts[2:])[:64] or "a Slurm command"
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
                                      running_in=names.LOGIN, answers=self.answers)
            except TierError as err:
                self.tier.log(f"wake for {reason} failed: {err}")
                send(f"error {err}")
                return
            finally:
                self._waking = ""
            if woke:  # slurmctld may take connections before it serves RPCs: the next caller asks again
                self._woken += 1
            else:
                self._awake_at = time.monotonic()
        if woke:
            self.tier.log(f"woke the control tier for {reason}")
        send("ok woken" if woke else "ok awake")

    def activity(self) -> dict[str, Any]:
        return activity_doc(self.activity_file, self.last_request, time.time())


@dataclass(frozen=True)
class Peer:
    """The caller of a wake connection, as the kernel reports it (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


def peer_credentials(conn: socket.socket) -> Peer:
    """The connected peer of a Unix stream socket: its pid, uid and gid when it connected."""
    return Peer(*_UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)))


class UserNames:
    """uid -> user name from a passwd file (the cluster's users, the ConfigMap the login container
    merges into its /etc/passwd), re-read when it changes; root is uid 0. An unknown uid is named
    ``uid N``."""

    def __init__(self, passwd_file: str | None) -> None:
        self.passwd_file = passwd_file
        self._stamp: tuple[int, int] | None = None
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()

    def name(self, uid: int) -> str:
        with self._lock:
            self._refresh()
            name = self._names.get(uid)
        if name is None:
            name = "root" if uid == 0 else f"uid {uid}"
        return name

    def _refresh(self) -> None:
        if not self.passwd_file:
            return
        try:
            st = os.stat(self.passwd_file)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            with open(self.passwd_file, encoding="utf-8", errors="replace") as fh:
                text = fh.read(1 << 20)
        except OSError:
            self._stamp, self._names = None, {}
            return
        names: dict[int, str] = {}
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[0] and not fields[0].startswith("#") and fields[2].isdigit():
                names.setdefault(int(fields[2]), fields[0])
        self._stamp, self._names = stamp, names


class WakeServer:
    """The wake endpoint: a Unix stream socket (mode 0666: any local user may ask) serving the
    agent's line protocol, one thread per connection, at most `max_connections` connections (and
    `max_per_uid` from one uid) at a time; a connection over a cap hears `error busy: ...` and is
    closed by the accepting thread, which starts no thread for it."""

    def __init__(self, agent: Agent, path: str, names: UserNames, log: Callable[[str], None],
                 max_connections: int = MAX_CONNECTIONS, max_per_uid: int = MAX_PER_UID,
                 read_timeout: float = READ_TIMEOUT) -> None:
        self.agent = agent
        self.path = path
        self.names = names
        self.log = log
        self.max_connections = max_connections
        self.max_per_uid = max_per_uid
        self.read_timeout = read_timeout
        self._lock = threading.Lock()
        self._in_flight = 0
        self._per_uid: dict[int, int] = {}
        self._closed = False
        self.sock = self._listen(path)

    @staticmethod
    def _listen(path: str) -> socket.socket:
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # left by an earlier run of this container
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)  # fails on anything else at that path: nothing is removed but our socket
            os.chmod(path, 0o666)  # connect() needs write permission: every user of the login pod
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        return sock

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def serve_forever(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.1)  # e.g. EMFILE: do not spin
                continue
            self._admit(conn)

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _admit(self, conn: socket.socket) -> None:
        try:
            peer = peer_credentials(conn)
        except OSError as err:
            self.log(f"wake connection without peer credentials ({err}): closed")
            conn.close()
            return
        with self._lock:
            busy = ""
            if self._in_flight >= self.max_connections:
                busy = f"too many wake requests ({self._in_flight} in flight)"
            elif self._per_uid.get(peer.uid, 0) >= self.max_per_uid:
                busy = f"too many wake requests from uid {peer.uid} ({self._per_uid[peer.uid]} in flight)"
            else:
                self._in_flight += 1
                self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
        if busy:
            try:
                conn.settimeout(1.0)
                conn.sendall(f"error busy: {busy}; try again\n".encode())
            except OSError:
                pass
            conn.close()
            return
        try:
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()
        except RuntimeError:  # the system refused a thread
            self._release(peer)
            conn.close()

    def _release(self, peer: Peer) -> None:
        with self._lock:
            self._in_flight -= 1
            left = self._per_uid[peer.uid] - 1
            if left:
                self._per_uid[peer.uid] = left
            else:
                del self._per_uid[peer.uid]

    def _serve(self, conn: socket.socket, peer: Peer) -> None:
        try:
            with conn:
                conn.settimeout(self.read_timeout)
                line = self._read_line(conn)
                if line is None:
                    return

                def send(text: str) -> None:
                    try:
                        conn.sendall((" ".join(text.split()) + "\n").encode())
                    except OSError:
                        pass  # the client left (a background wake from an SSH login): keep waking

                if isinstance(line, bytes):
                    self.agent.handle(line.decode(errors="replace"), send, self.names.name(peer.uid))
                else:
                    send(line)
                    _drain(conn)  # closing with unread input would reset the connection, reply and all
        finally:
            self._release(peer)

    @staticmethod
    def _read_line(conn: socket.socket) -> bytes | str | None:
        """The request line (bytes), an error reply (str) or None (the client sent nothing, or left)."""
        buf = b""
        while b"\n" not in buf:
            if len(buf) > MAX_LINE:
                break
            try:
                chunk = conn.recv(MAX_LINE + 2 - len(buf))
            except OSError:  # including the read timeout
                return None
            if not chunk:
                break
            buf += chunk
        line = buf.split(b"\n", 1)[0]
        if len(line) > MAX_LINE:
            return f"error request line too long (over {MAX_LINE} bytes)"
        return line if line.strip() else None


def _drain(conn: socket.socket, limit: int = 1 << 16, timeout: float = 1.0) -> None:
    """Tell the client we are done and discard what it still sends (a bounded amount, briefly)."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(timeout)
        left = limit
        while left > 0:
            chunk = conn.recv(min(left, 4096))
            if not chunk:
                return
            left -= len(chunk)
    except OSError:
        pass


def agent_main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from ..kubeapi import api_client

    parser = argparse.ArgumentParser(prog="python -m provisioner.controltier",
                                     description="The login pod's wake agent (see the module docstring).")
    parser.add_argument("--namespace", default=ClusterFiles.from_env(os.environ).namespace or "")
    parser.add_argument("--wake-socket", default=names.WAKE_SOCKET)
    parser.add_argument("--activity-port", type=int, default=names.ACTIVITY_PORT)
    parser.add_argument("--activity-file", default=f"{names.ACTIVITY_DIR}/sessions")
    parser.add_argument("--users-file", default=f"{names.USERS_DIR}/passwd",
                        help="passwd file naming the uids of wake callers (the cluster's users)")
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
    api = ClientTierApi(api_client())
    # while a Slurm command waits for the wake: slurmctld's port asked each 0.05 s (a list of its
    # Service's EndpointSlices for the address, then a TCP connect: the kubelet posts the pod's
    # address up to a second after slurmctld listens), the StatefulSet's ready count each 0.5 s
    tier = Tier(api, namespace, "slurmk8s-login-agent", log=log, poll=0.5, answer_poll=0.05)
    agent = Agent(tier, args.activity_file, timeout=args.timeout, answers=controller_listens(api, namespace))
    try:
        server = WakeServer(agent, args.wake_socket, UserNames(args.users_file), log)
    except OSError as err:
        log(f"cannot listen on {args.wake_socket}: {err}")
        return 2
    threading.Thread(target=serve_activity, args=(agent.activity, args.activity_port), daemon=True).start()
    log(f"serving wake requests on {args.wake_socket} (callers named by uid from {args.users_file}; at most "
        f"{server.max_connections} at a time, {server.max_per_uid} per uid), activity on "
        f":{args.activity_port}/activity (namespace {namespace})")
    server.serve_forever()
    return 0


