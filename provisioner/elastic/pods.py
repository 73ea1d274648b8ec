"""What a worker pod says, read into a :class:`~provisioner.elastic.backend.Worker`: its phase (a
deletionTimestamp reads Terminating), why it is not running, its container's last death, whether
its host stopped answering, who is taking it away, its Kueue group and its busy annotations.

Pure functions over the API's pod JSON (no I/O), shared by the backend's lists and the pod watch.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Mapping

from .. import kueue
from .. import manifests as m
from ..kubeapi import MAX_REASON
from ..names import A_NODE_START, BUSY_ANNOTATIONS, L_BUSY
from .backend import Worker


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()[:MAX_REASON]


def pod_phase(pod: Mapping[str, Any]) -> str:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return (pod.get("status") or {}).get("phase") or "Pending"


def pod_reason(pod: Mapping[str, Any]) -> str:
    """Why a pod is not (or no longer) running, in a few words; '' when nothing is wrong."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and (state["waiting"] or {}).get("reason") not in (None, "ContainerCreating"):
            w = state["waiting"]
            return _one_line(f"{w.get('reason')}: {w.get('message', '')}".rstrip(": "))
        if "terminated" in state and (state["terminated"] or {}).get("reason"):
            t = state["terminated"]
            return _one_line(f"{t.get('reason')} (exit {t.get('exitCode')})")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return _one_line(f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}")
    if status.get("reason"):
        return _one_line(f"{status['reason']}: {status.get('message', '')}")
    return ""


def last_death(pod: Mapping[str, Any]) -> tuple[float | None, str]:
    """When the pod's container last died and was restarted in place (lastState.terminated), and how."""
    latest: tuple[float | None, str] = (None, "")
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = ((cs.get("lastState") or {}).get("terminated")) or {}
        at = _epoch(term.get("finishedAt"))
        if at is not None and (latest[0] is None or at > latest[0]):
            how = f"{cs.get('name')} {term.get('reason') or 'terminated'} (exit {term.get('exitCode')})"
            latest = (at, _one_line(f"{how}, {cs.get('restartCount', 0)} restarts"))
    return latest


def host_lost(pod: Mapping[str, Any]) -> bool:
    """The pod's node stopped answering: the node controller marks every pod of a node whose kubelet
    stopped posting status not ready (condition Ready False) and leaves ContainersReady as the
    kubelet last reported it (True); a failing readiness probe turns both False."""
    status = pod.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    return pod_phase(pod) == "Running" and conds.get("Ready") == "False" and conds.get("ContainersReady") == "True"


# conditions a controller sets on a pod it is about to remove: Kueue's pod integration (a preempted or
# evicted workload's pods), and Kubernetes' own (scheduler preemption, Eviction API, taint manager, kubelet)
TAKEN_CONDITIONS = {"TerminationTarget": "Kueue", "DisruptionTarget": "Kubernetes"}


def taken_by(pod: Mapping[str, Any]) -> str:
    """Who is removing the pod and why ('Kueue: WorkloadEvicted: Preempted to accommodate ...',
    'Kubernetes: EvictionByEvictionAPI: ...'), from the condition set before the delete; ''."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or ():
        who = TAKEN_CONDITIONS.get(str(cond.get("type")))
        if who and cond.get("status") == "True":
            return _one_line(f"{who}: {cond.get('reason') or 'removed'}: {cond.get('message') or ''}".rstrip(": "))
    if status.get("reason") == "Evicted":  # the kubelet's eviction of a pod over its ephemeral-storage
        # limit sets no DisruptionTarget condition (seen on Kubernetes 1.34): its status says it
        return _one_line(f"kubelet: Evicted: {status.get('message') or ''}".rstrip(": "))
    if (pod.get("spec") or {}).get("restartPolicy") == "Always" and pod_phase(pod) == "Succeeded":
        # a container of such a pod that exits is restarted in place: only the kubelet ends the pod
        # itself (an eviction, a node shutdown). Seen on 1.34: evicted, the worker's preStop hook ran,
        # slurmd exited 0 on SIGTERM, and the pod ended Succeeded with no reason or condition at all.
        # A Failed one may be a dead host or container: judged as worker-failed
        return _one_line(f"kubelet: ended the pod ({pod_phase(pod)}: {pod_reason(pod) or 'no reason given'}), "
                         "as for an eviction or a node shutdown")
    return ""


def worker_from_pod(pod: Mapping[str, Any]) -> Worker:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    died_at, died_how = last_death(pod)
    return Worker(
        name=labels.get(m.L_NODE) or meta.get("name", ""),
        phase=pod_phase(pod),
        reason=pod_reason(pod),
        created_at=_epoch(meta.get("creationTimestamp")),
        host=(pod.get("spec") or {}).get("nodeName"),
        ready_at=next((_epoch(c.get("lastTransitionTime")) for c in (pod.get("status") or {}).get("conditions") or ()
                       if c.get("type") == "Ready" and c.get("status") == "True"), None),
        died_at=died_at,
        died_how=died_how,
        restarts=sum(int(cs.get("restartCount") or 0)
                     for cs in (pod.get("status") or {}).get("containerStatuses") or ()),
        uid=str(meta.get("uid") or ""),
        host_lost=host_lost(pod),
        version=str(meta.get("resourceVersion") or ""),
        group=labels.get(kueue.GROUP_LABEL, ""),
        gated=any(g.get("name") in kueue.GATES for g in (pod.get("spec") or {}).get("schedulingGates") or ()),
        group_total=_count((meta.get("annotations") or {}).get(kueue.GROUP_TOTAL)),
        taken=taken_by(pod),
        busy_marked=busy_marks(meta),
        start_bound=_count((meta.get("annotations") or {}).get(A_NODE_START)) or None,
    )


def busy_marks(meta: dict[str, Any]) -> bool | None:
    """True: the pod carries every busy mark (names.BUSY_ANNOTATIONS and the L_BUSY label); False:
    none of them; None: some (an older release's marks, a write cut short): written again."""
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    marks = [annotations.get(k) == v for k, v in BUSY_ANNOTATIONS.items()] + [labels.get(L_BUSY) == "true"]
    present = [k in annotations for k in BUSY_ANNOTATIONS] + [L_BUSY in labels]
    return True if all(marks) else False if not any(present) else None


def _count(text: str | None) -> int:
    return int(text) if text and text.isdigit() else 0
