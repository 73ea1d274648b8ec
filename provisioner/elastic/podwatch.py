"""The reconcile loop's view of the worker pods: listed once, then kept current by a watch.

Every pass of the loop (provisioner.reconcile) judges every worker pod. Listing them all each
period costs O(cluster) per pass: at 4,096 pods that is about 30 MB of JSON from the API server
and most of the pass's time (bench/resume_500.py). :class:`PodWatch` lists them once (in pages)
and then follows a watch from that list's resourceVersion, as client-go's informers do: it keeps
one :class:`~provisioner.elastic.backend.Worker` per pod (what the loop judges, not the pod
objects), so a pass reads a dict. The watch is restarted from the last resourceVersion seen when
the API server ends it (every ``timeout_s``), with bookmarks on, and the pods are listed again
only when that version is gone (410 Expired) or the watch failed.

:class:`WatchedBackend` is the backend the loop uses: ``list()`` of every worker comes from the
watch while it is in sync, after a one-pod ``limit=1`` list that proves the API server answers
(an API outage must still fail the pass, see reconcile.act); ``list(names)`` of a few nodes, and
every create and delete, go to the API as before. Until the first list, and after a failed watch
until the next list, ``list()`` asks the API itself.

RBAC: list and watch of pods in the cluster's namespace, which the slurmctld ServiceAccount has
(manifests/rbac.py).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, Sequence, cast

from ..kubeapi import ApiError
from .backend import Worker
from .k8s_backend import KubernetesBackend, list_all
from .pods import worker_from_pod

if TYPE_CHECKING:
    from ..kueue import PodGroup
    from ..inventory import SlurmNode
    from ..logs import Log

WATCH_TIMEOUT_S = 60  # the API server ends each watch after this; it is then resumed from where it was
RETRY_S = (1.0, 30.0)  # after a failed list or watch: first wait, doubling up to the second
TAKEN_MEMORY_S = 300.0  # how long a worker taken away (and gone) is remembered with its cause


class WatchablePodApi(Protocol):
    def list_page(self, namespace: str, label_selector: str, limit: int,
                  cont: str = "") -> Mapping[str, Any]: ...

    def watch(self, namespace: str, label_selector: str, resource_version: str,
              timeout_s: int) -> Iterator[Mapping[str, Any]]: ...


class Expired(Exception):
    """The watch's resourceVersion is older than the API server keeps (410): list again."""


class PodWatch:
    """The worker pods matching `selector` in `namespace`, as Workers by Slurm node name, kept
    current by a background thread (:meth:`start`). :meth:`workers` is None while not in sync."""

    def __init__(self, api: WatchablePodApi, namespace: str, selector: str, log: "Log", *,
                 timeout_s: int = WATCH_TIMEOUT_S, retry_s: tuple[float, float] = RETRY_S) -> None:
        self.api = api
        self.namespace = namespace
        self.selector = selector
        self.log = log
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.lists = 0  # full lists made (1 when it never lost track)
        self.events = 0  # watch events applied
        self._workers: dict[str, Worker] | None = None
        # name -> (who took it, when it went: monotonic) for taken workers the watch saw deleted
        self._taken: dict[str, tuple[str, float]] = {}
        self._version = ""  # the last resourceVersion seen
        self._heard = False  # the watch answered since the last list
        self._error = ""  # the last failure logged, until the watch answers again
        self._contact = 0.0  # monotonic time the API server was last heard from (a list, an event, a watch's end)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stale_after(self) -> float:
        """Seconds without a word from the API server after which the view is not trusted: a watch
        ends every ``timeout_s``, so a longer silence is a connection gone quiet."""
        return self.timeout_s + 30.0

    def workers(self) -> dict[str, Worker] | None:
        """A copy of the workers as the watch has them; None until listed, after a failure, and
        when the API server has not been heard from for :attr:`stale_after` seconds."""
        with self._lock:
            if self._workers is None or time.monotonic() - self._contact > self.stale_after:
                return None
            return dict(self._workers)

    def taken_gone(self) -> dict[str, str]:
        """The workers deleted in the last TAKEN_MEMORY_S seconds whose last state said who took
        them (a preemption's, an eviction's condition): name -> Worker.taken. A pod of the name
        seen again ends its entry."""
        now = time.monotonic()
        with self._lock:
            self._taken = {n: t for n, t in self._taken.items() if now - t[1] < TAKEN_MEMORY_S}
            return {n: t[0] for n, t in self._taken.items()}

    def start(self) -> "PodWatch":
        self._thread = threading.Thread(target=self.run, name="pod-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread once its current watch returns (within ``timeout_s``, or the read timeout
        of a silent connection); it is a daemon thread, so a process that exits does not wait."""
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.workers() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.workers() is not None

    def _drop(self) -> None:
        with self._lock:
            self._workers = None  # the loop lists by itself until the watch is back

    def run(self) -> None:
        wait = self.retry_s[0]
        try:
            while not self._stop.is_set():
                try:
                    self._heard = False
                    self._follow(self._list())
                    continue
                except Expired:
                    if self._heard:
                        continue  # fell behind what the API server keeps: list again at once
                    error = "the list's resourceVersion had already expired (410) before any event"
                except Exception as err:  # noqa: BLE001 - any failure drops the view; the thread must go on
                    error = str(err).splitlines()[0] if str(err) else type(err).__name__
                self._drop()
                if error != self._error:
                    self.log.write(f"pod watch failed ({error}); passes list the pods themselves, "
                                   f"retrying in {wait:.0f}s")
                if self._error == "":
                    wait = self.retry_s[0]
                self._error = error
                self._stop.wait(wait)
                wait = min(wait * 2, self.retry_s[1])
        finally:
            self._drop()  # stopped, or a BaseException: never leave a view that nothing updates

    def _heard_from_watch(self) -> None:
        """The watch after a list answered (an event, or its end): the view is followed again."""
        self._heard = True
        if self._error:
            self.log.write(f"pod watch: in sync again ({len(self._workers or ())} worker pods)")
            self._error = ""

    def _list(self) -> str:
        items, version = list_all(self.api, self.namespace, self.selector)
        fresh = {}
        for pod in items:
            worker = worker_from_pod(pod)
            fresh[worker.name] = worker
        with self._lock:
            self._workers = fresh
            self._contact = time.monotonic()
            self.lists += 1
        return version

    def _follow(self, version: str) -> None:
        """Apply the watch's events from `version` on, resuming after each end of the watch, until
        stopped; raises Expired for a 410 (the answer to the request, or an ERROR event) and
        ApiError for any other failure."""
        self._version = version
        while not self._stop.is_set():
            try:  # each watch from the last version seen (an event's, a bookmark's, else the list's)
                self._apply(self.api.watch(self.namespace, self.selector, self._version, self.timeout_s))
            except ApiError as err:
                if err.status == 410:
                    raise Expired() from None
                raise
            with self._lock:
                self._contact = time.monotonic()  # the server ended the watch: it was there
            if not self._heard:
                self._heard_from_watch()

    def _apply(self, events: Iterator[Mapping[str, Any]]) -> None:
        for event in events:
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(int(obj.get("code") or 0), str(obj.get("reason") or "WatchError"),
                               str(obj.get("message") or ""))  # 410 Expired: _follow lists again
            self._version = str((obj.get("metadata") or {}).get("resourceVersion") or self._version)
            if not self._heard:
                self._heard_from_watch()
            worker = None if kind == "BOOKMARK" else worker_from_pod(obj)
            with self._lock:
                self._contact = time.monotonic()
                if worker is None:
                    continue
                if kind == "DELETED":
                    known = self._workers.get(worker.name) if self._workers is not None else None
                    if self._workers is not None and known is not None and known.uid == worker.uid:
                        # defensive: never a newer pod's entry
                        del self._workers[worker.name]
                        taken = worker.taken or known.taken
                        if taken:
                            self._taken[worker.name] = (taken, time.monotonic())
                else:  # ADDED, MODIFIED
                    if kind == "ADDED":  # a new pod of the name: what took the last one is over
                        self._taken.pop(worker.name, None)
                    if self._workers is not None:
                        self._workers[worker.name] = worker
                self.events += 1


class WatchedBackend:
    """A KubernetesBackend whose list of every worker comes from a :class:`PodWatch` (module
    docstring); everything else is the backend's own."""

    def __init__(self, backend: KubernetesBackend, watch: PodWatch) -> None:
        self.backend = backend
        self.watch = watch

    def create(self, node: "SlurmNode", group: "PodGroup | None" = None) -> None:
        self.backend.create(node, group)

    def delete(self, name: str, uid: str | None = None, force: bool = False, version: str | None = None) -> None:
        self.backend.delete(name, uid, force, version)

    def adopt(self, name: str, uid: str, version: str = "") -> bool:
        return self.backend.adopt(name, uid, version)

    def owner_uid(self, pod_name: str) -> str:
        return self.backend.owner_uid(pod_name)

    def queues(self) -> Mapping[str, str]:
        return self.backend.queues()

    def workload(self, group: str) -> Mapping[str, Any] | None:
        return self.backend.workload(group)

    def mark_busy(self, name: str, uid: str, busy: bool) -> bool:
        return self.backend.mark_busy(name, uid, busy)

    def taken_gone(self) -> Mapping[str, str]:
        return self.watch.taken_gone()

    def list(self, names: Sequence[str] | None = None) -> Mapping[str, Worker]:
        workers = None if names is not None else self.watch.workers()
        if workers is None:
            return self.backend.list(names)
        self.backend.ping()  # the API answers now: an outage fails the pass as a list would
        return workers


def watched(backend: Any, log: "Log") -> Any:
    """The reconcile loop's backend: a KubernetesBackend with a started :class:`PodWatch`; any
    other backend (Docker) as it is."""
    if not isinstance(backend, KubernetesBackend) or not hasattr(backend.api, "watch"):
        return backend
    api = cast(WatchablePodApi, backend.api)  # a PodApi with watch (checked above)
    watch = PodWatch(api, backend.namespace, backend.selector, log).start()
    log.write(f"pod watch: following the worker pods ({backend.selector}) instead of listing them each pass")
    return WatchedBackend(backend, watch)

