"""The boot gate: a worker whose pod was made ahead of Slurm's resume call registers only once
Slurm has its node POWERING_UP.

Slurm starts PrologSlurmctld at a job's allocation, but ResumeProgram only at its next power-save
pass, 1 to 2 s later (Slurm 24.11 runs that pass at most once per whole second). The reconcile loop
creates the pods of a just-allocated job's powered-down nodes when the prolog tells it (early.py),
so their containers start during that wait. Their slurmd must not register before the pass: a
node that registers while Slurm still has it POWERED_DOWN is not the node the pass then powers up
(seen in CI as a job's 'Node failure' after ResumeTimeout). So the loop *holds* each node it
creates early, and *releases* it when Slurm's resume call for it arrives (Slurm marks the node
POWERING_UP before it runs ResumeProgram). The worker asks before its slurmd registers: slurmd
runs its HealthCheckProgram once before registering, and the slurmd image's
``slurmk8s-healthcheck`` asks this gate then (the address comes from the worker's entrypoint in
``/run/slurmk8s/boot-gate``).

Protocol (TCP, port :data:`DEFAULT_PORT` of the slurmctld pod, reachable from the cluster's own
pods only by the intra-cluster NetworkPolicy): the worker sends its node name and a newline; the
loop answers ``open`` at once for a node it does not hold, and for a held one when Slurm's resume
call releases it, or ``held`` after :data:`WAIT_MAX` seconds (the worker asks again). Anything else,
a refused or dropped connection included, means no gate is served (no loop, an older one, the
Docker test bed): the worker goes on at once, as every worker did before the head start.

Bounded: a hold ends by itself after :data:`HOLD_MAX` seconds (a job cancelled before the pass
leaves its node powered down; its early pod then boots and Slurm powers it down as an idle node),
a node whose resume call came after the prolog read it powered down is not held (a prolog slower
than the pass does not hold a node Slurm already powers up), and at most :data:`MAX_WAITERS` workers wait at once (more
are answered by a closed connection: they go on).
"""

from __future__ import annotations

import re
import socket
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from ..logs import Log

DEFAULT_PORT = 9411
HOLD_MAX = 30.0  # seconds a node stays held without Slurm's resume call
WAIT_MAX = 20.0  # seconds one question is held open before 'held' (the worker asks again)
MAX_WAITERS = 4096
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BootGate:
    """Which nodes' slurmd must not register yet: those the loop created ahead of Slurm's resume
    call for them. Thread-safe. `clock`: the wall clock (the prolog, another process of the same
    pod, says when it read its nodes' states)."""

    def __init__(self, clock: Callable[[], float] = time.time, hold_max: float = HOLD_MAX) -> None:
        self._clock = clock
        self._hold_max = hold_max
        self._cond = threading.Condition()
        self._held: dict[str, float] = {}  # node -> held since
        self._resumed: dict[str, float] = {}  # node -> Slurm's resume call seen at

    def hold(self, nodes: Iterable[str], since: float | None = None) -> list[str]:
        """Hold `nodes` (their pods are about to be created ahead of Slurm); the nodes held. `since`:
        when the caller read them powered down (this clock; default now). A node whose resume call
        came at or after that is not held: Slurm has it POWERING_UP already."""
        with self._cond:
            now = self._clock()
            self._prune(now)
            since = now if since is None else since
            held = [n for n in nodes if self._resumed.get(n, since - 1) < since]
            for node in held:
                self._held.setdefault(node, now)
            return held

    def release(self, nodes: Iterable[str]) -> dict[str, float]:
        """Slurm's resume call for `nodes` arrived: open them. -> {node: seconds it was held} for the
        nodes that were held."""
        with self._cond:
            now = self._clock()
            self._prune(now)
            released = {}
            for node in nodes:
                self._resumed[node] = now
                since = self._held.pop(node, None)
                if since is not None:
                    released[node] = now - since
            if released:
                self._cond.notify_all()
            return released

    def is_held(self, node: str) -> bool:
        with self._cond:
            self._prune(self._clock())
            return node in self._held

    def wait(self, node: str, timeout: float) -> bool:
        """True once `node` is not held (at once when it is not); False after `timeout` seconds."""
        with self._cond:
            deadline = self._clock() + timeout
            while True:
                now = self._clock()
                self._prune(now)
                if node not in self._held:
                    return True
                if now >= deadline:
                    return False
                # woken by release(); else at the hold's end or the deadline (re-checked each second)
                self._cond.wait(max(0.001, min(deadline - now, self._held[node] + self._hold_max - now, 1.0)))

    def _prune(self, now: float) -> None:
        for table in (self._held, self._resumed):
            for node in [n for n, t in table.items() if now - t >= self._hold_max]:
                del table[node]


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0  # to read the node name

    def handle(self) -> None:
        server: GateServer = self.server  # type: ignore[assignment]
        if not server.slots.acquire(blocking=False):
            return  # too many waiting: a closed connection, the worker goes on
        try:
            try:
                node = self.rfile.readline(256).decode("ascii", "replace").strip()
            except OSError:
                return
            if not _NODE_NAME.match(node):
                return
            held = server.gate.is_held(node)
            opened = server.gate.wait(node, server.wait_max)
            if held and opened:
                server.log.write(f"boot gate: {node} may register")
            try:
                self.connection.settimeout(5.0)
                self.wfile.write(b"open\n" if opened else b"held\n")
            except OSError:
                pass  # the worker is gone
        finally:
            server.slots.release()


class GateServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], gate: BootGate, log: "Log", wait_max: float = WAIT_MAX,
                 max_waiters: int = MAX_WAITERS) -> None:
        self.gate = gate
        self.log = log
        self.wait_max = wait_max
        self.slots = threading.BoundedSemaphore(max_waiters)
        super().__init__(address, _Handler)


def serve(gate: BootGate, port: int, log: "Log", addr: str = "0.0.0.0") -> GateServer | None:
    """Serve `gate` on `port` in the background; None (logged) when the port cannot be bound."""
    try:
        server = GateServer((addr, port), gate, log)
    except OSError as err:
        log.write(f"boot gate not served (port {port}: {err}); no pod is created ahead of Slurm's resume call")
        return None
    threading.Thread(target=server.serve_forever, name="boot-gate", daemon=True).start()
    log.write(f"boot gate on :{server.server_address[1]}")
    return server


def ask(host: str, port: int, node: str, timeout: float = WAIT_MAX + 5) -> str:
    """The worker's question, in Python (tests, tools): 'open', 'held' or '' (no gate served)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(node.encode() + b"\n")
            return conn.makefile("rb").readline(16).decode("ascii", "replace").strip()
    except OSError:
        return ""
