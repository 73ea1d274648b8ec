"""The boot gate: a worker whose pod was made ahead of Slurm's resume call starts its slurmd only
once Slurm has its node POWERING_UP.

Slurm starts PrologSlurmctld at a job's allocation, but ResumeProgram only at its next power-save
pass, 1 to 2 s later (Slurm 24.11 runs that pass at most once per whole second). The reconcile loop
creates the pods of a just-allocated job's powered-down nodes when the prolog tells it (early.py),
so their containers start during that wait. Their slurmd must not *start* before the pass: Slurm
takes a POWERING_UP node as booted only when the boot time its slurmd reports (its start, with -b)
is not older than the pass's boot request (waiting_for_node_boot in Slurm 24.11's node_mgr.c);
a slurmd started earlier is waited for until ResumeTimeout, then set DOWN. So the loop *holds* each
node it creates early, and *releases* it when Slurm's resume call for it arrives (Slurm marks the
node POWERING_UP and sets the boot request before it runs ResumeProgram). The worker's entrypoint
asks this gate as its last step before `exec slurmd` (ask_boot_gate in images/entrypoint/lib.sh).

Protocol (TCP, port :data:`DEFAULT_PORT` of the slurmctld pod, reachable from the cluster's own
pods only by the intra-cluster NetworkPolicy): the worker sends its node name and a newline; the
loop answers ``open T`` when the node may start (T: this clock's time of the answer, after Slurm's
boot request; the worker starts slurmd no earlier than T by its own clock, so a worker's clock a
little behind slurmctld's cannot make its boot time older than the request), or ``held`` after
:data:`WAIT_MAX` seconds (the worker asks again). Open at once: a node whose resume call came
through this loop (every worker Slurm's own resume call created). Otherwise Slurm's state decides
(the loop's shared ``sinfo`` snapshot): a node Slurm still has powered down (``~``) waits, whoever
made its pod (this loop, a loop before a restart, which lost its holds, or a head start whose job
went away before the pass); POWERING_UP or up may start. A held node also opens at its release.
Anything else, a refused or dropped connection included, means no gate is served (no loop, an
older one, the Docker test bed): the worker goes on at once, as every worker did before the head
start.

Who asks: only the worker pod of the node named may ask for it. A job can reach this port (it
runs in a worker pod); were any question served, a job could fill the slots with questions for
held nodes, and the real workers, closed out, would start slurmd early: Slurm then sets their
nodes DOWN at ResumeTimeout and requeues other users' jobs. On Kubernetes the loop checks the
caller's address against the pod IP of the node's worker pod (:class:`WorkerPods`, one pod list
by the node's label; a pod whose IP is not posted yet is asked again for :data:`IDENTIFY_WAIT`
seconds): another address is closed at once, unanswered. A job on the node's own pod may ask
for it, and is answered at once: its node is up. Beside that (defence in depth, the boot gate
NetworkPolicy admits worker pods only) the slots are capped *before* a thread starts, in the
accept loop: at most :data:`MAX_WAITERS` questions in flight, :data:`MAX_PER_PEER` from one
address (a host-network pool has one worker per host), each read for at most
:data:`READ_TIMEOUT` seconds; a connection over a cap is closed at once (the worker goes on).

Bounded: holds are forgotten after :data:`HOLD_MAX` seconds (Slurm's state still holds a node it
has powered down; the reconcile loop deletes a worker whose node stays powered down), a node
whose resume call came after the prolog read it powered down is not held (a prolog slower than
the pass), and the worker asks for at most 50 s in all, then starts slurmd anyway.
"""

from __future__ import annotations

import re
import socket
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, cast

from ..kubeapi import ApiError
from ..names import BOOT_GATE_PORT

if TYPE_CHECKING:
    from ..logs import Log

DEFAULT_PORT = BOOT_GATE_PORT  # the login pod's agent has 9411 (ACTIVITY_PORT), another pod
HOLD_MAX = 30.0  # seconds a node stays held without Slurm's resume call
WAIT_MAX = 20.0  # seconds one question is held open before 'held' (the worker asks again)
MAX_WAITERS = 4096  # questions in flight (read, checked or waiting), taken before a thread starts
MAX_PER_PEER = 8  # of them from one address: a pod (or a host-network pool's host: one worker each)
READ_TIMEOUT = 5.0  # seconds to read the node name
IDENTIFY_WAIT = 5.0  # seconds a worker pod whose IP is not posted yet is asked again
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BootGate:
    """Which nodes' slurmd must not start yet. Thread-safe. `clock`: the wall clock (the prolog,
    another process of the same pod, says when it read its nodes' states). `state_of(node)`: the
    node's extended state from Slurm ('idle~', 'allocated#'; None when it cannot be read), set by
    the loop to its shared `sinfo` snapshot (prolog.SharedStates)."""

    def __init__(self, clock: Callable[[], float] = time.time, hold_max: float = HOLD_MAX,
                 state_of: Callable[[str], str | None] | None = None, poll: float = 0.2) -> None:
        self._clock = clock
        self._hold_max = hold_max
        self.state_of = state_of
        self._poll = poll
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
                self._held[node] = now
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

    def now(self) -> float:
        return self._clock()

    def is_held(self, node: str) -> bool:
        with self._cond:
            self._prune(self._clock())
            return node in self._held

    def wait(self, node: str, timeout: float) -> bool:
        """True once `node`'s slurmd may start; False after `timeout` seconds. At once for a node
        whose resume call came through this loop and is not held again. Otherwise Slurm decides: a
        node it still has powered down ('~') waits (a hold of this loop, or of a loop before a
        restart, or a pod whose job went away before the power-save pass); POWERING_UP or up may
        start. A node held here opens at its release, or when Slurm shows it powering up (the
        resume call ran outside the loop). When Slurm cannot be asked, only this loop's holds wait."""
        deadline = self._clock() + timeout
        while True:
            with self._cond:
                self._prune(self._clock())
                if self._released(node):
                    return True
                held = node in self._held
            state = self.state_of(node) if self.state_of is not None else None
            if state is None and not held:
                return True
            if state is not None and not state.endswith("~"):
                return True
            with self._cond:  # released while Slurm was asked (its snapshot may predate the call)
                if self._released(node):
                    return True
            now = self._clock()
            if now >= deadline:
                return False
            with self._cond:  # woken by release(); else Slurm is asked again
                if node in self._held:
                    self._cond.wait(max(0.001, min(deadline - now, self._poll)))
                    continue
            time.sleep(max(0.001, min(deadline - now, self._poll)))

    def _released(self, node: str) -> bool:
        """(Under the lock.) Its resume call came through this loop, and it is not held again."""
        return node not in self._held and node in self._resumed

    def _prune(self, now: float) -> None:
        for table in (self._held, self._resumed):
            for node in [n for n, t in table.items() if now - t >= self._hold_max]:
                del table[node]


class WorkerPods:
    """Is `ip` the pod IP of the worker pod of `node`? The gate's check of who asks (module
    docstring). `pods_of(node)`: the worker pods labelled with that node (a list by label, raising
    ApiError). True: it is; False: it is not (a pod of the node has another IP, or none has one
    after `wait` seconds); None: the API did not answer (the gate serves as before the check).
    A match is remembered for `remember` seconds: a worker asks again every 20 s while held."""

    def __init__(self, pods_of: Callable[[str], Sequence[Mapping[str, Any]]], wait: float = IDENTIFY_WAIT,
                 poll: float = 0.5, remember: float = HOLD_MAX * 2,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.pods_of = pods_of
        self.wait = wait
        self.poll = poll
        self.remember = remember
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], float] = {}  # (node, ip) -> matched at

    def __call__(self, node: str, ip: str) -> bool | None:
        now = self._clock()
        with self._lock:
            for key in [k for k, t in self._known.items() if now - t >= self.remember]:
                del self._known[key]
            if (node, ip) in self._known:
                return True
        deadline = now + self.wait
        while True:
            try:
                pods = self.pods_of(node)
            except ApiError as err:
                # a refusal of the selector (a name no label can hold) is no worker; no answer: cannot tell
                return False if 400 <= err.status < 500 and err.status not in (401, 403, 429) else None
            addresses = [_pod_ips(p) for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
            if any(ip in a for a in addresses):
                with self._lock:
                    self._known[(node, ip)] = self._clock()
                return True
            if any(addresses) or self._clock() >= deadline:
                return False  # a pod's IP never changes: another one posted is an answer
            self._sleep(self.poll)


def _pod_ips(pod: Mapping[str, Any]) -> set[str]:
    status = pod.get("status") or {}
    ips = {str(i.get("ip")) for i in status.get("podIPs") or () if i.get("ip")}
    if status.get("podIP"):
        ips.add(str(status["podIP"]))
    return ips


class _Handler(socketserver.StreamRequestHandler):
    def _server(self) -> GateServer:
        return cast("GateServer", self.server)  # the only server this handler serves

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self._server().read_timeout)  # to read the node name

    def handle(self) -> None:
        server = self._server()
        try:
            node = self.rfile.readline(256).decode("ascii", "replace").strip()
        except OSError:
            return
        if not _NODE_NAME.match(node):
            return
        if server.is_worker is not None:
            ip = str(self.client_address[0])
            verdict = server.is_worker(node, ip)
            if verdict is False:
                server.note(("refused", ip), f"boot gate: refused a question for {node} from {ip}, not its worker pod")
                return  # closed, unanswered: only the node's own worker waits here
            if verdict is None:
                server.note(("?", node), f"boot gate: cannot tell whether {ip} is {node}'s worker pod (the API "
                                         "did not answer); Slurm's state decides, as without the check")
        held = server.gate.is_held(node)
        opened = server.gate.wait(node, server.wait_max)
        if held and opened:
            server.log.write(f"boot gate: {node} may start")
        try:
            self.connection.settimeout(5.0)
            # open: with this clock's time, after Slurm's boot request for the node (the worker's
            # slurmd starts no earlier by its own clock: Slurm compares the two)
            self.wfile.write(f"open {server.gate.now():.3f}\n".encode() if opened else b"held\n")
        except OSError:
            pass  # the worker is gone


class GateServer(socketserver.ThreadingTCPServer):
    """The gate's TCP server. A connection takes its slot (:data:`MAX_WAITERS` in all,
    `max_per_peer` per address) in the accept loop, before its thread starts; `is_worker(node, ip)`
    (a :class:`WorkerPods`; None: no check, the Docker test bed) says who may ask."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # a burst of booting workers connects at once

    def __init__(self, address: tuple[str, int], gate: BootGate, log: "Log", wait_max: float = WAIT_MAX,
                 max_waiters: int = MAX_WAITERS, max_per_peer: int = MAX_PER_PEER,
                 is_worker: Callable[[str, str], bool | None] | None = None,
                 read_timeout: float = READ_TIMEOUT) -> None:
        self.gate = gate
        self.log = log
        self.wait_max = wait_max
        self.slots = threading.BoundedSemaphore(max_waiters)
        self.max_per_peer = max_per_peer
        self.is_worker = is_worker
        self.read_timeout = read_timeout
        self._peers: dict[str, int] = {}  # address -> questions in flight from it
        self._peers_lock = threading.Lock()
        self._noted: dict[object, float] = {}  # what was logged when: a flood is logged once a minute
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """(The accept loop.) Over a cap: closed at once, no thread (the worker goes on)."""
        peer = str(client_address[0])
        with self._peers_lock:
            count = self._peers.get(peer, 0)
            if count >= self.max_per_peer or not self.slots.acquire(blocking=False):
                self.shutdown_request(request)
                return
            self._peers[peer] = count + 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))

    def _release(self, peer: str) -> None:
        with self._peers_lock:
            count = self._peers.pop(peer, 1) - 1
            if count > 0:
                self._peers[peer] = count
            self.slots.release()

    def note(self, key: object, text: str, every: float = 60.0) -> None:
        """Log `text`, at most once every `every` seconds for `key`."""
        now = time.monotonic()
        with self._peers_lock:
            if now - self._noted.get(key, -every) < every:
                return
            if len(self._noted) > 1024:
                self._noted.clear()
            self._noted[key] = now
        self.log.write(text)


def serve(gate: BootGate, port: int, log: "Log", addr: str = "0.0.0.0",
          is_worker: Callable[[str, str], bool | None] | None = None) -> GateServer | None:
    """Serve `gate` on `port` in the background, asking `is_worker` who asks (GateServer); None
    (logged) when the port cannot be bound."""
    try:
        server = GateServer((addr, port), gate, log, is_worker=is_worker)
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
            words = conn.makefile("rb").readline(64).decode("ascii", "replace").split()
            return words[0] if words else ""
    except OSError:
        return ""
