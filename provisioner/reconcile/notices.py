"""Interruption notices (issue 42): a Kubernetes node about to go says so before it goes. Karpenter
taints it ``karpenter.sh/disrupted``, AWS Node Termination Handler ``aws-node-termination-handler/
spot-itn`` (2 minutes before a spot reclaim), GKE ``cloud.google.com/impending-node-termination``,
cluster-autoscaler ``ToBeDeletedByClusterAutoscaler``; some platforms set a node condition instead.
The spec lists the taint keys and condition types (``elasticity.interruption_taints`` /
``interruption_conditions``).

Each pass the loop lists the nodes (from the API server's watch cache) and :func:`notices` names
the hosts with a notice; the classifier then takes their workers' Slurm nodes out at once (DOWN:
the jobs are requeued with SIGTERM and KillWait, and start elsewhere), before the host is lost
under them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..config import ClusterSpec


def notice(node: Mapping[str, Any], taints: Sequence[str], conditions: Sequence[str]) -> str:
    """What announces this Node's end ('' for nothing): the first listed taint it has, else the
    first listed condition that is True (pure)."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    name = (node.get("metadata") or {}).get("name", "?")
    for taint in spec.get("taints") or ():
        if taint.get("key") in taints:
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"kubernetes node {name} has interruption notice {taint['key']}{value}:{taint.get('effect', '')}"
    for cond in status.get("conditions") or ():
        if cond.get("type") in conditions and cond.get("status") == "True":
            why = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
            return f"kubernetes node {name} has interruption notice {cond['type']}" + (f" ({why})" if why else "")
    return ""


def notices(nodes: Iterable[Mapping[str, Any]], taints: Sequence[str], conditions: Sequence[str]) -> dict[str, str]:
    """Kubernetes node name -> its notice, for the nodes that have one (pure)."""
    out = {}
    for node in nodes:
        said = notice(node, taints, conditions)
        if said:
            out[(node.get("metadata") or {}).get("name", "")] = said
    return out


class NoticeReader:
    """The loop's reader: lists the nodes each pass (`list_nodes`) and names the hosts with a
    notice. A failed list is logged when its message changes and gives the last pass's notices
    (a host with a notice stays one until it is gone)."""

    def __init__(self, spec: ClusterSpec, list_nodes: Callable[[], Iterable[Mapping[str, Any]]],
                 log: Callable[[str], None]) -> None:
        self.taints = tuple(spec.elasticity.interruption_taints)
        self.conditions = tuple(spec.elasticity.interruption_conditions)
        self.list_nodes, self.log = list_nodes, log
        self.last: dict[str, str] = {}
        self.error = ""

    def read(self) -> dict[str, str]:
        try:
            found = notices(self.list_nodes(), self.taints, self.conditions)
        except Exception as err:  # noqa: BLE001 - any API failure: said once, the pass goes on
            said = f"cannot list the Kubernetes nodes for interruption notices: {err}"
            if said != self.error:
                self.log(said)
            self.error = said
            return dict(self.last)
        if self.error:
            self.log("the Kubernetes nodes are listed again: interruption notices are followed")
            self.error = ""
        for host in sorted(found.keys() - self.last.keys()):
            self.log(found[host])
        self.last = found
        return dict(found)


WATCH_TIMEOUT_S = 60  # the API server ends each watch after this; it is then resumed where it was
RETRY_S = (1.0, 30.0)  # after a failed watch: first wait, doubling up to the second


class NoticeWatch:
    """A trigger, not a view: a watch of the nodes that sets `nudge` as soon as a node gets a notice
    the reader does not know yet, so the loop's next pass comes at once instead of at its period
    (the reader's list each pass stays what the pass judges). `watch(version)` yields the API's raw
    watch events from `version` ("0": from the watch cache, every node first as ADDED)."""

    def __init__(self, reader: NoticeReader, watch: Callable[[str], Iterable[Mapping[str, Any]]],
                 nudge: "threading.Event", log: Callable[[str], None], retry_s: tuple[float, float] = RETRY_S) -> None:
        self.reader, self.watch, self.nudge, self.log, self.retry_s = reader, watch, nudge, log, retry_s
        self.stopped = threading.Event()
        self.nudges = 0

    def start(self) -> "NoticeWatch":
        threading.Thread(target=self.run, name="notice-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        version, wait, said = "0", self.retry_s[0], ""
        while not self.stopped.is_set():
            try:
                for event in self.watch(version):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # 410 Expired, among others: from the cache again
                        version = "0"
                        break
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    name = (obj.get("metadata") or {}).get("name", "")
                    if event.get("type") in ("ADDED", "MODIFIED") and name not in self.reader.last and \
                            notice(obj, self.reader.taints, self.reader.conditions):
                        self.nudges += 1
                        self.nudge.set()
                wait, said = self.retry_s[0], ""
            except Exception as err:  # noqa: BLE001 - any failure: said once, retried with a back-off
                if str(err) != said:
                    self.log(f"node watch for interruption notices failed ({err}); the pass's list still "
                             f"reads them; retrying")
                said, version = str(err), "0"
                self.stopped.wait(wait)
                wait = min(wait * 2, self.retry_s[1])
