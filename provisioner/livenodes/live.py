"""The reconcile loop's side of live nodes: render from the Kubernetes nodes, apply what changed.

Each pass (:meth:`LiveNodes.step`, before the loop judges workers):

1. list the Kubernetes nodes (only for specs with a pinned pool); when nothing the rendering reads
   changed since the last applied pass (names, labels, allocatable, cordon, Ready, taints) and no
   Slurm node is waiting to leave, stop here;
2. render the files (:func:`provisioner.livenodes.render.render`);
3. a Slurm node that would disappear while it has a job (its Kubernetes node was deleted or lost
   the pool's labels) stays, rendered from the last Node object the loop saw, marked unavailable
   (so drained) until the job ends; the pass after, it goes;
4. write the files that differ into the directory slurmctld runs from; when anything but
   inventory.json changed, run ``scontrol reconfigure`` (24.11: slurmctld re-executes itself with
   the new files; running and pending jobs are kept, nodes added and removed). A refused
   reconfigure puts the old files back and is retried next pass.

After the pass judged the workers, :meth:`LiveNodes.drain` drains and undrains Slurm nodes from the
(new) inventory's availability and Slurm's node states of that pass (:mod:`.drain`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..config import ClusterSpec
from ..errors import SlurmK8sError
from ..inventory import Inventory, K8sNode, LEAVING_ANNOTATION
from ..logs import Log
from ..names import SLURM_FILES
from ..render import write_files
from ..slurm.commands import SlurmClient, SlurmCommandError
from ..slurm.state import NodeStatus, parse_nodes
from ..elastic.quiesce import Hold
from .drain import plan
from .render import Rendered, render

INVENTORY = "inventory.json"
# Written before the files of a change that needs a reconfigure, removed once slurmctld took them:
# a loop that died in between (container restart) finds it and reconfigures, though the files
# already match the nodes.
PENDING = ".reconfigure-pending"
HAS_JOB = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
RECONFIGURE_WAIT = 30.0  # seconds slurmctld gets to answer again after a reconfigure
# Slurm 24.11 re-executes slurmctld on `scontrol reconfigure`, and first waits, answering no RPC,
# for every script it started (PrologSlurmctld, the resume and suspend programs) to end; a program
# that waits for slurmctld meanwhile (the prolog's boot wait, the suspend program's sinfo polls)
# then holds both up to its own timeout (seen: 14 s of timed-out commands; a boot wait: up to
# ResumeTimeout). So a reconfigure first holds (elastic/quiesce.py): the programs' optional waits
# end at once and no new one starts; it runs when no program is left, waiting HOLD_WAIT within
# the pass and then pass after pass, and goes ahead anyway after RECONFIGURE_DEFER.
RECONFIGURE_DEFER = 60.0
HOLD_WAIT = 5.0  # seconds a pass waits for the programs to end once the hold is set


@dataclass(frozen=True)
class Outcome:
    written: tuple[str, ...] = ()  # files rewritten (or removed) this pass
    reconfigured: bool = False
    added: tuple[str, ...] = ()  # Slurm nodes
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()  # Slurm nodes whose Kubernetes node left, kept until their job ends
    error: str = ""
    deferred: bool = False  # a reconfigure was due and waits for the programs running (next pass)


def _fingerprint(raw: Sequence[Mapping[str, Any]]) -> str:
    """What the rendering reads of the nodes, hashed: a pass with the same is a no-op."""
    parts = []
    for obj in raw:
        n = K8sNode.from_api(obj)
        parts.append([n.name, sorted(n.labels.items()), n.cpu_milli, n.memory_bytes, sorted(n.extended.items()),
                      n.unschedulable, n.ready, [sorted(t.items()) for t in n.taints]])
    return hashlib.sha256(json.dumps(sorted(parts), default=str).encode()).hexdigest()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _leaving(obj: Mapping[str, Any], why: str) -> dict[str, Any]:
    """The loop's copy of a Node that left the pool, marked so the inventory keeps it unavailable."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), LEAVING_ANNOTATION: why}
    return out


class LiveNodes:
    def __init__(self, spec: ClusterSpec, conf_dir: str, list_nodes: Callable[[], list[dict[str, Any]]],
                 slurm: SlurmClient, log: Log, *, cluster_domain: str = "cluster.local",
                 scontrol: str = "scontrol", reconfigure_wait: float = RECONFIGURE_WAIT,
                 programs_running: Callable[[], int] = lambda: 0, defer_max: float = RECONFIGURE_DEFER,
                 hold: Hold | None = None, hold_wait: float = HOLD_WAIT,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.conf_dir = conf_dir
        self.list_nodes = list_nodes
        self.slurm = slurm
        self.log = log
        self.domain = cluster_domain
        self.scontrol = scontrol
        self.reconfigure_wait = reconfigure_wait
        self.programs_running = programs_running  # the power-saving programs running in the loop now
        self.defer_max = defer_max
        self.hold = hold  # the programs' optional waits end while it is set (None: not held)
        self.hold_wait = hold_wait
        self.clock = clock
        self.sleep = sleep
        if hold is not None:
            hold.release()  # left by a loop that died while it held
        self._deferred_since: float | None = None
        self._applied: str | None = None  # fingerprint of the nodes last rendered and applied
        self._seen: dict[str, dict[str, Any]] = {}  # Kubernetes node -> its last Node object
        self._kept: dict[str, dict[str, Any]] = {}  # Kubernetes node -> the object a kept Slurm node renders from
        self._last_error = ""

    # ------------------------------------------------------------ the pass

    def step(self) -> Outcome:
        outcome = self._step()
        if not outcome.deferred:  # a reconfigure held is held from its first pass, not an older one's
            self._deferred_since = None
            if self.hold is not None:
                self.hold.release()  # reconfigured, failed, or no longer due: the waits may run again
        return outcome

    def _step(self) -> Outcome:
        try:
            raw = self.list_nodes()
        except Exception as err:  # noqa: BLE001 - any API failure: report it, retry next pass
            return self._fail(f"cannot list the Kubernetes nodes: {err}")
        previous, self._seen = self._seen, {_name(obj): obj for obj in raw}
        if os.path.exists(os.path.join(self.conf_dir, PENDING)):
            error = self._reconfigure("files written by a loop that stopped before slurmctld took them")
            if error:
                return self._fail(error)
        try:
            fingerprint = _fingerprint(raw)
            if fingerprint == self._applied and not self._kept:
                return Outcome()
            old = Inventory.read(os.path.join(self.conf_dir, INVENTORY))
        except (OSError, ValueError, KeyError, TypeError) as err:
            return self._fail(f"cannot read the running inventory in {self.conf_dir}: {err}")
        except SlurmK8sError as err:  # a Node object the rendering cannot read
            return self._fail(f"the Kubernetes nodes do not give a valid cluster; the running configuration "
                              f"is kept:\n{err}")
        try:
            rendered = render(self.spec, raw, self.domain)
            rendered, kept = self._keep_busy(old, rendered, raw, previous)
        except SlurmCommandError as err:  # (a SlurmK8sError too: first)
            return self._fail(f"cannot tell which leaving Slurm nodes still run jobs: {err}")
        except SlurmK8sError as err:
            return self._fail(f"the Kubernetes nodes do not give a valid cluster; the running configuration "
                              f"is kept:\n{err}")
        outcome = self._apply(old, rendered, kept)
        if not outcome.error and not outcome.deferred:
            self._applied = fingerprint
            self._last_error = ""
        return outcome

    def drain(self, inventory: Inventory, slurm_nodes: Iterable[NodeStatus]) -> list[str]:
        """Drain / undrain from the running inventory (the one the pass loaded after :meth:`step`)
        and Slurm's states; the errors, if any."""
        errors = []
        for action in plan(inventory, slurm_nodes):
            try:
                self.slurm.update(action.argv(self.scontrol))
                self.log.write(action.describe())
            except SlurmCommandError as err:
                errors.append(str(err))
        return errors

    # ------------------------------------------------------------ its parts

    def _fail(self, message: str) -> Outcome:
        if message != self._last_error:  # once per distinct problem, not every 10 s
            self.log.write(message)
        self._last_error = message
        return Outcome(error=message)

    def _keep_busy(self, old: Inventory, rendered: Rendered, raw: list[dict[str, Any]],
                   previous: Mapping[str, dict[str, Any]]) -> tuple[Rendered, tuple[str, ...]]:
        leaving = {n.name: n.k8s_node for n in old.nodes if n.k8s_node and n.name not in rendered.inventory}
        if not leaving:
            self._kept = {}
            return rendered, ()
        states = parse_nodes(self.slurm.show_nodes())
        busy = {s: k for s, k in leaving.items() if s in states and HAS_JOB & states[s].state}
        extra: dict[str, dict[str, Any]] = {}
        for slurm_name, k8s_name in sorted(busy.items()):
            obj = self._kept.get(k8s_name) or previous.get(k8s_name)
            if obj is None:  # the loop restarted since the node left: render it from the running inventory
                obj = _node_from_inventory(old[slurm_name], self.spec)
            why = "left the pool" if k8s_name in self._seen else "is gone"
            extra[k8s_name] = _leaving(obj, f"{why}: it leaves Slurm once its job ends")
        self._kept = extra
        if not extra:
            return rendered, ()
        nodes = [obj for obj in raw if _name(obj) not in extra] + list(extra.values())
        return render(self.spec, nodes, self.domain), tuple(sorted(busy))

    def _apply(self, old: Inventory, rendered: Rendered, kept: tuple[str, ...]) -> Outcome:
        current: dict[str, str] = {}
        for name in SLURM_FILES:
            try:
                with open(os.path.join(self.conf_dir, name)) as fh:
                    current[name] = fh.read()
            except FileNotFoundError:
                continue
        new = rendered.files
        changed = sorted(n for n in new if current.get(n) != new[n])
        stale = sorted(n for n in current if n not in new)
        if not changed and not stale:
            return Outcome(kept=kept)
        added = tuple(n for n in rendered.inventory.names if n not in old)
        removed = tuple(n for n in old.names if n not in rendered.inventory)
        reconfigure = any(n != INVENTORY for n in changed + stale)
        if reconfigure and self._defer():
            return Outcome(kept=kept, deferred=True)
        pending = os.path.join(self.conf_dir, PENDING)
        try:
            if reconfigure:
                open(pending, "w").close()
            write_files({n: new[n] for n in changed}, self.conf_dir)
            for n in stale:
                os.unlink(os.path.join(self.conf_dir, n))
        except OSError as err:  # a full or failing volume: an error of this pass, never the loop's end
            return self._fail(f"cannot write the Slurm configuration in {self.conf_dir}: {err}; "
                              + self._put_back(current, changed + stale, pending) + " (tried again next pass)")
        if reconfigure:
            error = self._reconfigure("the Kubernetes nodes changed")
            if error:
                return self._fail(f"{error}; " + self._put_back(current, changed + stale, pending))
        what = ", ".join(changed + [f"{n} (removed)" for n in stale])
        nodes = "".join([f"; added {','.join(added)}" if added else "", f"; removed {','.join(removed)}" if removed else "",
                         f"; kept until their job ends {','.join(kept)}" if kept else ""])
        self.log.write(f"Kubernetes nodes changed: wrote {what}" + (" and reconfigured slurmctld" if reconfigure else "")
                       + nodes)
        for note in rendered.notes:
            self.log.write(note)
        return Outcome(tuple(changed + stale), reconfigure, added, removed, kept)

    def _put_back(self, current: Mapping[str, str], touched: list[str], pending: str) -> str:
        """The files as they were before this pass wrote `touched`, and no pending mark: what was done."""
        error = None
        try:
            write_files({n: current[n] for n in touched if n in current}, self.conf_dir)
            for n in touched:
                if n not in current:
                    Path(self.conf_dir, n).unlink(missing_ok=True)
        except OSError as err:
            error = err
        try:  # never a reconfigure of mixed files: the next pass writes them all again first
            Path(pending).unlink(missing_ok=True)
        except OSError as err:
            error = error or err
        if error is not None:
            return (f"and putting the previous files back failed too ({error}): slurmctld runs on the "
                    "configuration it read, the files on disk may be mixed until a pass writes them")
        return "the previous files are back in place"

    def _defer(self) -> bool:
        """Whether the reconfigure due waits for the power-saving programs running (RECONFIGURE_DEFER)."""
        running = self.programs_running()
        now = self.clock()
        if not running:
            return False
        if self.hold is not None and not self.hold.held():
            held = self.hold.hold()
            if not held:
                self.log.write(f"cannot write the hold file {self.hold.path}: the programs' boot waits run on")
        deadline = now + (self.hold_wait if self.hold is not None else 0.0)
        while running and self.clock() < deadline:  # their waits end within a poll of the hold
            self.sleep(0.1)
            running = self.programs_running()
        now = self.clock()
        if not running:
            return False
        if self._deferred_since is None:
            self._deferred_since = now
            self.log.write(f"the Kubernetes nodes changed; the reconfigure waits for {running} power-saving "
                           "program(s) to end (slurmctld's reconfigure would wait for them, answering nothing, "
                           f"while they may wait for slurmctld), at most {self.defer_max:.0f}s")
        if now - self._deferred_since < self.defer_max:
            return True
        self.log.write(f"reconfiguring with {running} power-saving program(s) still running after "
                       f"{now - self._deferred_since:.0f}s")
        return False

    def _reconfigure(self, why: str) -> str:
        """`scontrol reconfigure`, then wait for slurmctld to answer; '' or what went wrong."""
        started = time.monotonic()
        try:
            self.slurm.update([self.scontrol, "reconfigure"])
        except SlurmCommandError as err:
            return f"scontrol reconfigure refused the configuration ({why}): {err}"
        Path(self.conf_dir, PENDING).unlink(missing_ok=True)
        self._wait_for_slurmctld(started)
        return ""

    def _wait_for_slurmctld(self, started: float) -> None:
        while True:
            try:
                self.slurm.update([self.scontrol, "ping"])
                self.log.write(f"slurmctld answers {time.monotonic() - started:.1f}s after the reconfigure")
                return
            except SlurmCommandError as err:
                if time.monotonic() - started > self.reconfigure_wait:
                    self.log.write(f"slurmctld not answering {self.reconfigure_wait:.0f}s after the reconfigure: {err}")
                    return
                time.sleep(0.5)


def _node_from_inventory(node: Any, spec: ClusterSpec) -> dict[str, Any]:
    """A Node object that renders back into `node` (a pinned Slurm node of the running inventory),
    for a node that left while the loop was not running, so that its last Node object is unknown:
    same name, CPUs, memory, GPUs and topology; features read from other labels are not restored
    (the node only waits for its job to end, drained)."""
    pool = next(p for p in spec.pools if p.name == node.pool)
    from ..config import mib, parse_quantity

    cpu = node.cpus + parse_quantity(pool.reserve_cpu)
    memory = (node.real_memory + mib(pool.reserve_memory)) * 2**20
    labels = {**pool.node_selector, **dict(node.topology_labels)}
    alloc: dict[str, Any] = {"cpu": str(cpu), "memory": str(memory)}
    if node.gpus:
        alloc[pool.gpu_resource] = str(node.gpus)
        if node.gpu_type and pool.gpu_type_label:
            labels[pool.gpu_type_label] = node.gpu_type
    return {"metadata": {"name": node.k8s_node, "labels": labels}, "spec": {},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}
