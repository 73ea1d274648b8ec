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
