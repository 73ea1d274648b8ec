"""`slurmk8s status`: one screen with the cluster's state, queue, nodes, worker pods, volumes and
node-seconds, or the same as JSON (``--json``) for scripts.

Sources, none of them a second source of truth:

- Kubernetes (the user's kubeconfig): the slurmctld StatefulSet (replicas), the sleep state in the
  annotations of the ConfigMap slurmk8s-tier-state (``slurmk8s.io/state`` awake|asleep,
  ``slurmk8s.io/state-reason``, ``slurmk8s.io/state-since``; the StatefulSet's own while it has
  none), the worker pods, the PersistentVolumeClaims;
- Slurm, asked inside the slurmctld pod (the Kubernetes exec API, as `kubectl exec` does):
  one short line per node (``sinfo``) and per job (``squeue``), not their --json (see SHOW_NODES_ARGV),
  both in one exec (SLURM_ARGV);
- the reconcile loop's metrics (its ``/metrics``, read from inside the same pod): node-seconds
  provisioned and busy since `up`.

While the controller is asleep nothing is exec'd (there is no pod to ask): the screen says so.

Layers: :func:`gather` takes a :class:`ClusterReader` (the Kubernetes one is :class:`KubeReader`;
the tests use an in-memory one); everything else here is pure: parsing, classification, the JSON
document and the rich rendering.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Protocol, Sequence
from urllib.parse import quote

from .errors import SlurmK8sError
from .kubeapi import api_path, pod_exec
from .slurm.state import NodeStatus

A_STATE = "slurmk8s.io/state"  # awake | asleep (written by the idle sleep / wake logic)
A_STATE_REASON = "slurmk8s.io/state-reason"
A_STATE_SINCE = "slurmk8s.io/state-since"  # RFC 3339
CONTROLLER = "slurmctld"
CONTROLLER_POD = "slurmctld-0"
TIER_STATE = "slurmk8s-tier-state"  # ConfigMap: the control tier's state, as annotations (names.TIER_STATE)
CONTROLLER_CONTAINER = "slurmctld"
RECONCILE_CONTAINER = "reconcile"
METRICS_URL = "http://127.0.0.1:9410/metrics"
PYTHON = "/opt/slurmk8s/bin/python3"  # the provisioner venv in the slurmctld image
# argv only, no shell: the reconcile container reads its own endpoint (same pod network)
SCRAPE_ARGV = (PYTHON, "-c", "import sys, urllib.request; "
               f"sys.stdout.write(urllib.request.urlopen({METRICS_URL!r}, timeout=5).read().decode())")
# one short line per node and partition ("q-5|idle+cloud+drain+powered_down|q|reason"): with 4,096
# nodes `scontrol show nodes --json` is 9.5 MB, which the Kubernetes client's exec stream reads in
# quadratic time (about 5 s); these lines are 0.15 MB. Nodes in no partition are not listed.
SHOW_NODES_ARGV = ("sinfo", "--all", "--Node", "--noheader",
                   "--Format", "NodeList:0|,StateComplete:0|,Partition:0|,Reason:0")
# one short line per job (array tasks each): with 32,768 queued jobs `squeue --json` is ~100 MB
# through the exec stream and took `status` to 9-10 s; these lines are ~0.6 MB
SQUEUE_ARGV = ("squeue", "--all", "--noheader", "--array", "--format", "%P %T")
# both in one exec (each exec is a round trip through the API server and the kubelet, 0.3-0.4 s):
# sinfo's lines, this line, squeue's lines; a failing sinfo ends it with sinfo's exit status
SLURM_MARK = "--- slurmk8s status: squeue ---"  # no sinfo line has spaces around dashes like this
SLURM_ARGV = ("/bin/sh", "-c", f"{shlex.join(SHOW_NODES_ARGV)} && printf '%s\\n' {shlex.quote(SLURM_MARK)} && "
              f"exec {shlex.join(SQUEUE_ARGV)}")
HEALTH_PREFIX = "health: "

# node categories, in display order
CATEGORIES = ("powered_down", "powering_up", "idle", "allocated", "mixed", "completing", "draining", "drained",
              "down", "powering_down", "other")


class StatusError(SlurmK8sError):
    """Nothing useful can be shown (no namespace, no API); the message names the fix."""


# ---------------------------------------------------------------- the model (pure)


@dataclass(frozen=True)
class ControllerState:
    state: str  # awake | asleep | starting | absent
    reason: str = ""
    since: str = ""  # RFC 3339, from the annotation (or the StatefulSet's creation)
    replicas: int | None = None
    ready: int = 0

    @property
    def reachable(self) -> bool:
        """Worth exec'ing into: not asleep, not absent, and the pod has a ready replica."""
        return self.state not in ("asleep", "absent") and self.ready > 0


def controller_state(sts: Mapping[str, Any] | None, recorded: Mapping[str, str] | None = None) -> ControllerState:
    """The slurmctld StatefulSet and the state recorded by the sleep logic (`recorded`: the
    annotations of the ConfigMap slurmk8s-tier-state) -> awake / asleep / starting / absent.

    The recorded state wins where present (the StatefulSet's own annotations while the ConfigMap has
    none: a cluster upgraded from a release that kept it there, controltier.tier.Tier.state); 0
    replicas is asleep whatever it says (the record may lag the scale-down); 1 replica not ready
    yet is starting (waking or booting)."""
    if sts is None:
        return ControllerState("absent", "no slurmctld StatefulSet in the namespace (`slurmk8s down` ran?)")
    meta = sts.get("metadata") or {}
    ann = recorded if recorded and A_STATE in recorded else (meta.get("annotations") or {})
    spec_replicas = (sts.get("spec") or {}).get("replicas")
    replicas = 1 if spec_replicas is None else int(spec_replicas)  # the API defaults it to 1
    ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
    said = str(ann.get(A_STATE, "")).strip().lower()
    reason = str(ann.get(A_STATE_REASON, ""))
    since = str(ann.get(A_STATE_SINCE, "")) or str(meta.get("creationTimestamp", ""))
    if replicas == 0:
        if said != "asleep":
            reason = reason or "the slurmctld StatefulSet is scaled to 0 replicas"
        return ControllerState("asleep", reason, since, replicas, ready)
    if said == "asleep":
        return ControllerState("starting", reason or "waking up (annotated asleep, replicas > 0)", since, replicas,
                               ready)
    if ready < 1:
        return ControllerState("starting", reason or "slurmctld pod not ready yet", since, replicas, ready)
    return ControllerState("awake", reason, since, replicas, ready)


@dataclass(frozen=True)
class NodeRow:
    name: str
    category: str
    state: tuple[str, ...]
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def health_check(self) -> str:
        """The failed check when slurmk8s-healthcheck drained this node ('' otherwise)."""
        if self.category not in ("draining", "drained") or not self.reason.startswith(HEALTH_PREFIX):
            return ""
        return self.reason[len(HEALTH_PREFIX):].split(":", 1)[0].strip()


def node_category(node: NodeStatus) -> str:
    """One word per node, in the order an operator cares: down and drain first (with their reason),
    then the power states, then the base state."""
    s = node.state
    if "DOWN" in s:
        return "down"
    if "DRAIN" in s:
        return "draining" if {"ALLOCATED", "MIXED", "COMPLETING"} & s else "drained"
    if "POWERING_UP" in s:
        return "powering_up"
    if "POWERING_DOWN" in s:
        return "powering_down"
    if "POWERED_DOWN" in s:
        return "powered_down"
    for base in ("COMPLETING", "ALLOCATED", "MIXED", "IDLE"):
        if base in s:
            return base.lower()
    return "other"


def node_rows(text: str) -> list[NodeRow]:
    """SHOW_NODES_ARGV's lines -> rows, sorted by name (a node in several partitions has a line for
    each; sinfo marks the default partition with `*` and an empty reason as `none`)."""
    nodes: dict[str, tuple[frozenset[str], str, list[str]]] = {}
    for line in text.splitlines():
        fields = line.split("|", 3)
        if len(fields) < 3 or not fields[0]:
            continue
        name, state, part = fields[0], frozenset(fields[1].upper().split("+")), fields[2].rstrip("*")
        reason = fields[3] if len(fields) > 3 and fields[3] != "none" else ""
        if name not in nodes:
            nodes[name] = (state, reason, [])
        nodes[name][2].append(part)
    out = []
    for name in sorted(nodes):
        state, reason, parts = nodes[name]
        n = NodeStatus(name, state, reason, tuple(parts))
        out.append(NodeRow(name, node_category(n), tuple(sorted(state)), reason, n.partitions))
    return out


def queue_counts(text: str) -> dict[str, dict[str, int]]:
    """`squeue -h -r -o "%P %T"` -> {partition: {"pending": n, "running": n}} (CONFIGURING counts as
    pending: its nodes are still booting; COMPLETING as running)."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        parts, _, job_state = line.strip().rpartition(" ")
        state = {"PENDING": "pending", "CONFIGURING": "pending", "RUNNING": "running",
                 "COMPLETING": "running"}.get(job_state)
        if state is None:
            continue
        for part in (parts.split(",") if parts else [""]):
            row = out.setdefault(part, {"pending": 0, "running": 0})
            row[state] += 1
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class WorkerRow:
    name: str
    pool: str
    phase: str
    reason: str = ""
    host: str = ""
    age_seconds: float | None = None


def worker_rows(pods: Sequence[Mapping[str, Any]], now: float) -> list[WorkerRow]:
    from .elastic.k8s_backend import worker_from_pod
    from .manifests import L_POOL

    rows = []
    for pod in pods:
        w = worker_from_pod(pod)
        pool = ((pod.get("metadata") or {}).get("labels") or {}).get(L_POOL, "")
        age = None if w.created_at is None else max(0.0, now - w.created_at)
        rows.append(WorkerRow(w.name, pool, w.phase, w.reason, w.host or "", age))
    return sorted(rows, key=lambda r: r.name)


@dataclass(frozen=True)
class VolumeRow:
    name: str
    size: str
    storage_class: str
    phase: str
    access_modes: tuple[str, ...] = ()


def volume_rows(pvcs: Sequence[Mapping[str, Any]]) -> list[VolumeRow]:
    rows = []
    for pvc in pvcs:
        meta, spec, status = pvc.get("metadata") or {}, pvc.get("spec") or {}, pvc.get("status") or {}
        size = (status.get("capacity") or {}).get("storage") or \
            ((spec.get("resources") or {}).get("requests") or {}).get("storage") or ""
        rows.append(VolumeRow(meta.get("name", ""), str(size), spec.get("storageClassName") or "",
                              status.get("phase") or "Pending", tuple(spec.get("accessModes") or ())))
    return sorted(rows, key=lambda r: r.name)


@dataclass(frozen=True)
class Usage:
    """Node-seconds since `up`, from the reconcile loop's counters."""

    since: float | None
    provisioned: Mapping[str, float] = field(default_factory=dict)
    busy: Mapping[str, float] = field(default_factory=dict)

    @property
    def total_provisioned(self) -> float:
        return sum(self.provisioned.values())

    @property
    def total_busy(self) -> float:
        return sum(self.busy.values())

    @property
    def busy_fraction(self) -> float | None:
        return self.total_busy / self.total_provisioned if self.total_provisioned > 0 else None


def usage_from_metrics(text: str) -> Usage:
    """The Prometheus exposition of the reconcile loop -> node-seconds per pool and their start."""
    from prometheus_client.parser import text_string_to_metric_families

    provisioned: dict[str, float] = {}
    busy: dict[str, float] = {}
    since = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "slurmk8s_node_provisioned_seconds_total":
                provisioned[sample.labels.get("pool", "")] = sample.value
            elif sample.name == "slurmk8s_node_busy_seconds_total":
                busy[sample.labels.get("pool", "")] = sample.value
            elif sample.name == "slurmk8s_usage_since_timestamp_seconds" and sample.value > 0:
                since = sample.value
    return Usage(since, dict(sorted(provisioned.items())), dict(sorted(busy.items())))


@dataclass
class Status:
    namespace: str
    controller: ControllerState
    nodes: list[NodeRow] | None = None  # None: not asked (asleep) or no answer
    queue: dict[str, dict[str, int]] | None = None
    workers: list[WorkerRow] = field(default_factory=list)
    volumes: list[VolumeRow] = field(default_factory=list)
    usage: Usage | None = None
    notes: list[str] = field(default_factory=list)  # why a section is missing (asleep, ...)
    errors: list[str] = field(default_factory=list)  # what failed (controller not answering, ...)
    at: float = 0.0

    def node_counts(self) -> dict[str, int]:
        counts = {c: 0 for c in CATEGORIES}
        for row in self.nodes or ():
            counts[row.category] = counts.get(row.category, 0) + 1
        return {c: n for c, n in counts.items() if n}

    def to_json(self) -> dict[str, Any]:
        """The document `slurmk8s status --json` prints (stable keys; null where unknown)."""
        usage = None
        if self.usage is not None:
            usage = {"since": _rfc3339(self.usage.since) if self.usage.since else None,
                     "provisioned_node_seconds": round(self.usage.total_provisioned, 1),
                     "busy_node_seconds": round(self.usage.total_busy, 1),
                     "busy_fraction": None if self.usage.busy_fraction is None else round(self.usage.busy_fraction, 4),
                     "by_pool": {p: {"provisioned": round(self.usage.provisioned.get(p, 0.0), 1),
                                     "busy": round(self.usage.busy.get(p, 0.0), 1)}
                                 for p in sorted(set(self.usage.provisioned) | set(self.usage.busy))}}
        nodes = None
        if self.nodes is not None:
            nodes = {"counts": self.node_counts(),
                     "list": [{"name": r.name, "category": r.category, "state": list(r.state), "reason": r.reason,
                               "partitions": list(r.partitions), "health_check": r.health_check or None}
                              for r in self.nodes]}
        return {
            "namespace": self.namespace,
            "at": _rfc3339(self.at),
            "state": self.controller.state,
            "state_reason": self.controller.reason,
            "state_since": self.controller.since or None,
            "queue": self.queue,
            "nodes": nodes,
            "health_drained": None if self.nodes is None else
            [{"name": r.name, "check": r.health_check, "reason": r.reason} for r in self.nodes if r.health_check],
            "workers": [asdict(w) for w in self.workers],
            "volumes": [{**asdict(v), "access_modes": list(v.access_modes)} for v in self.volumes],
            "usage": usage,
            "notes": list(self.notes),
            "errors": list(self.errors),
        }


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- gathering (through a reader)


class ClusterReader(Protocol):
    """What status needs of Kubernetes; every call raises StatusError with a fix on failure."""

    def namespace_exists(self, namespace: str) -> bool: ...

    def statefulset(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def tier_state(self, namespace: str) -> dict[str, str] | None: ...

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    def pvcs(self, namespace: str) -> list[dict[str, Any]]: ...

    def exec(self, namespace: str, pod: str, container: str, argv: Sequence[str],
             timeout: float) -> tuple[int, str, str]: ...


def split_slurm_answer(text: str) -> tuple[str, str]:
    """SLURM_ARGV's output -> (sinfo's lines, squeue's lines)."""
    nodes, mark, queue = f"\n{text}".partition(f"\n{SLURM_MARK}\n")  # the mark as a whole line only
    nodes = nodes[1:] + ("\n" if nodes[1:] else "")
    if not mark:
        raise StatusError(f"`{SLURM_ARGV[-1]}` in pod {CONTROLLER_POD} ended before squeue's lines "
                          f"({len(text)} characters)")
    return nodes, queue


def _exec_text(reader: ClusterReader, namespace: str, argv: Sequence[str], timeout: float) -> str:
    code, out, err = reader.exec(namespace, CONTROLLER_POD, CONTROLLER_CONTAINER, argv, timeout)
    if code != 0:
        text = (err.strip() or out.strip() or f"exit {code}").splitlines()[-1][:300]
        raise StatusError(f"`{' '.join(argv)}` in pod {CONTROLLER_POD}: {text}")
    return out


def gather(reader: ClusterReader, namespace: str, now: float | None = None, timeout: float = 20.0) -> Status:
    """Everything `slurmk8s status` shows. Raises StatusError only when the namespace is missing;
    a controller that does not answer leaves its sections empty with the error recorded."""
    from .manifests import L_COMPONENT

    now = time.time() if now is None else now
    if not reader.namespace_exists(namespace):
        raise StatusError(f"namespace {namespace} does not exist: no cluster is deployed there. Deploy one with "
                          "`slurmk8s up --spec SPEC`, or name another with --namespace / --spec")
    sts = reader.statefulset(namespace, CONTROLLER)
    recorded = reader.tier_state(namespace) if sts is not None else None
    st = Status(namespace, controller_state(sts, recorded), at=now)
    st.workers = worker_rows(reader.pods(namespace, f"{L_COMPONENT}=worker"), now)
    st.volumes = volume_rows(reader.pvcs(namespace))
    ctl = st.controller
    if ctl.state == "asleep":
        st.notes.append("controller asleep: queue, nodes and node-seconds are not asked (nothing was woken); "
                        "the next `ssh` / `slurmk8s submit` wakes it")
        return st
    if not ctl.reachable:
        st.notes.append(f"controller {ctl.state}: {ctl.reason}; queue and nodes not available yet")
        return st
    try:
        nodes, queue = split_slurm_answer(_exec_text(reader, namespace, SLURM_ARGV, timeout))
        st.nodes, st.queue = node_rows(nodes), queue_counts(queue)
    except StatusError as err:
        st.errors.append(f"slurmctld does not answer: {err}")
    code, out, err_text = reader.exec(namespace, CONTROLLER_POD, RECONCILE_CONTAINER, SCRAPE_ARGV, timeout)
    if code == 0:
        try:
            st.usage = usage_from_metrics(out)
        except ValueError as e:
            st.errors.append(f"the reconcile loop's metrics are unreadable: {e}")
    else:
        last = (err_text.strip() or out.strip() or f"exit {code}").splitlines()[-1][:300]
        st.errors.append(f"the reconcile loop's metrics ({METRICS_URL} in container {RECONCILE_CONTAINER}) "
                         f"do not answer: {last}")
    return st


# ---------------------------------------------------------------- rendering (rich)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


STATE_STYLE = {"awake": "green", "asleep": "blue", "starting": "yellow", "absent": "red"}
CATEGORY_STYLE = {"down": "red", "drained": "red", "draining": "yellow", "powering_up": "yellow",
                  "allocated": "green", "mixed": "green", "idle": "cyan", "powered_down": "dim"}


def render(status: Status, console: Any) -> None:
    """Print the status screen on a rich Console."""
    from rich.table import Table
    from rich.text import Text

    ctl = status.controller
    head = Text.assemble(("cluster ", "bold"), (status.namespace, "bold"), "  ",
                         (ctl.state.upper(), f"bold {STATE_STYLE.get(ctl.state, '')}"))
    if ctl.since:
        head.append(f"  since {ctl.since}")
    if ctl.reason:
        head.append(f"  ({ctl.reason})", "dim")
    console.print(head)
    for note in status.notes:
        console.print(Text(note, "blue"))
    for err in status.errors:
        console.print(Text(f"error: {err}", "bold red"))

    if status.queue is not None:
        t = Table(title="queue", title_justify="left")
        t.add_column("partition")
        t.add_column("pending", justify="right")
        t.add_column("running", justify="right")
        for part, row in status.queue.items():
            t.add_row(part or "-", str(row["pending"]), str(row["running"]))
        if not status.queue:
            t.add_row("(empty)", "0", "0")
        console.print(t)

    if status.nodes is not None:
        counts = status.node_counts()
        console.print(Text.assemble(("nodes  ", "bold"), *[
            Text(f"{c.replace('_', ' ')} {n}  ", CATEGORY_STYLE.get(c, "")) for c, n in counts.items()]))
        shown = [r for r in status.nodes if r.category not in ("powered_down", "idle") or r.reason]
        if shown:
            t = Table(title="nodes not idle or powered down", title_justify="left")
            for col in ("node", "state", "reason"):
                t.add_column(col)
            for r in shown:
                reason = Text(r.reason)
                if r.health_check:
                    reason = Text(f"[health {r.health_check}] ", "bold red") + Text(r.reason)
                t.add_row(r.name, Text(r.category.replace("_", " "), CATEGORY_STYLE.get(r.category, "")), reason)
            console.print(t)

    t = Table(title=f"worker pods ({len(status.workers)})", title_justify="left")
    for col in ("pod", "pool", "phase", "age", "host", "reason"):
        t.add_column(col)
    for w in status.workers:
        t.add_row(w.name, w.pool, w.phase, _duration(w.age_seconds), w.host, w.reason)
    console.print(t)

    t = Table(title="volumes", title_justify="left")
    for col in ("claim", "size", "class", "phase"):
        t.add_column(col)
    for v in status.volumes:
        t.add_row(v.name, v.size, v.storage_class or "-", v.phase)
    console.print(t)

    u = status.usage
    if u is not None:
        since = f"since {_rfc3339(u.since)}" if u.since else "since the reconcile loop started"
        frac = "-" if u.busy_fraction is None else f"{100 * u.busy_fraction:.1f}%"
        console.print(Text.assemble(("node-seconds ", "bold"), f"{since}: provisioned {u.total_provisioned:.0f}, "
                                    f"busy {u.total_busy:.0f} ({frac} used)"))


# ---------------------------------------------------------------- the Kubernetes reader


class KubeReader:
    """ClusterReader over the user's kubeconfig: requests by REST path (:class:`~provisioner.kubeapi.RawClient`)
    and the exec subresource (:func:`~provisioner.kubeapi.pod_exec`), not the generated API classes,
    whose import alone took 1.4 s of `status`'s 3 s at 4,096 nodes and 32,768 jobs."""

    def __init__(self, api_client: Any, request_timeout: tuple[float, float] = (5.0, 20.0)) -> None:
        from .kubeapi import RawClient

        self._client = api_client
        self._raw = RawClient(api_client, request_timeout)

    def _get(self, what: str, path: str, query: Mapping[str, Any] | None = None, forbidden: Any = None) -> Any:
        from .kubeapi import ApiError

        try:
            return self._raw.request("GET", path, query)
        except ApiError as err:
            if err.status == 404:
                return None
            if err.status == 403 and forbidden is not None:
                return forbidden
            if err.status in (401, 403):
                raise StatusError(f"{what}: the Kubernetes API refused your kubeconfig's user ({err.status} "
                                  f"{err.reason}): {err.message}") from None
            if err.status == 0:
                raise StatusError(f"{what}: the Kubernetes API does not answer ({err.message}); check KUBECONFIG / "
                                  "--kubeconfig") from None
            raise StatusError(f"{what}: Kubernetes API error {err.status} {err.reason}: {err.message}") from None

    def namespace_exists(self, namespace: str) -> bool:
        # a user with rights in the namespace only may not read Namespace objects: then assume it exists
        # (a missing one still shows as an empty namespace with no StatefulSet: "absent")
        return self._get(f"reading namespace {namespace}", f"/api/v1/namespaces/{quote(namespace, safe='')}",
                         forbidden={"forbidden": True}) is not None

    def statefulset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(f"reading statefulset {name}", api_path("apps/v1", namespace, "statefulsets", name))

    def tier_state(self, namespace: str) -> dict[str, str] | None:
        """The annotations of the control tier's state ConfigMap; None without one (no idle
        teardown, or a cluster deployed before it)."""
        doc = self._get(f"reading configmap {TIER_STATE}", api_path("v1", namespace, "configmaps", TIER_STATE))
        return None if doc is None else dict((doc.get("metadata") or {}).get("annotations") or {})

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        doc = self._get("listing pods", api_path("v1", namespace, "pods"), {"labelSelector": label_selector})
        return (doc or {}).get("items") or []

    def pvcs(self, namespace: str) -> list[dict[str, Any]]:
        doc = self._get("listing volume claims", api_path("v1", namespace, "persistentvolumeclaims"))
        return (doc or {}).get("items") or []

    def exec(self, namespace: str, pod: str, container: str, argv: Sequence[str],
             timeout: float) -> tuple[int, str, str]:
        """Run argv in the container (the exec subresource, as `kubectl exec`): (exit code, stdout, stderr)."""
        return pod_exec(self._client, namespace, pod, container, argv, timeout)


def kube_reader(kubeconfig: str | None) -> KubeReader:
    """A reader with the user's kubeconfig (--kubeconfig, else $KUBECONFIG, else ~/.kube/config)."""
    from .kubeapi import KubeConfigError, api_client

    try:
        return KubeReader(api_client(kubeconfig))
    except (KubeConfigError, OSError) as err:
        raise StatusError(f"no usable kubeconfig ({kubeconfig or '$KUBECONFIG or ~/.kube/config'}): {err}; "
                          "pass --kubeconfig") from None
