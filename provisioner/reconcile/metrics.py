"""The cluster's Prometheus metrics, served by the reconcile loop, and their catalogue.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..slurm.state import JobStatus, NodeStatus
from .act import RAN_STATES, Report
from .classify import Snapshot
from .usage import Usage

LATENCY_BUCKETS = (0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The loop's Prometheus metrics, in their own registry (prometheus_client imported here only)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.jobs = Gauge("slurmk8s_jobs", "Jobs by partition and state (pending: also CONFIGURING, waiting for "
                          "its nodes to boot; running)", ["partition", "state"], registry=r)
        self.nodes = Gauge("slurmk8s_nodes", "Slurm nodes by pool and state (down, drain, powering_up, powering_down, "
                           "powered_down, completing, allocated, mixed, idle, ...)", ["pool", "state"], registry=r)
        self.workers = Gauge("slurmk8s_workers", "Worker pods by pool and phase (Pending, Running, Failed, Succeeded, "
                             "Terminating)", ["pool", "phase"], registry=r)
        self.elastic = Counter("slurmk8s_elastic_requests", "Resume / suspend / resume-fail requests per node "
                               "by program, action, reason and outcome (from the programs' events file)",
                               ["program", "action", "reason", "outcome"], registry=r)
        self.findings = Counter("slurmk8s_reconcile_findings", "Reconcile findings that needed action, by kind",
                                ["kind"], registry=r)
        self.actions = Counter("slurmk8s_reconcile_actions", "Reconcile actions by op and outcome",
                               ["op", "outcome"], registry=r)
        self.passes = Counter("slurmk8s_reconcile_passes", "Reconcile passes by outcome", ["outcome"], registry=r)
        self.last_run = Gauge("slurmk8s_reconcile_last_run_timestamp_seconds", "End of the last reconcile pass",
                              registry=r)
        self.pass_seconds = Histogram("slurmk8s_reconcile_duration_seconds", "Time of one reconcile pass",
                                      buckets=RPC_BUCKETS, registry=r)
        self.backoff = Gauge("slurmk8s_pool_backoff", "1 while the pool's resumes are refused (backoff)",
                             ["pool"], registry=r)
        self.submit_to_running = Histogram("slurmk8s_job_submit_to_running_seconds",
                                           "Job submit_time -> start_time, observed when first seen RUNNING",
                                           ["partition"], buckets=LATENCY_BUCKETS, registry=r)
        self.pod_start = Histogram("slurmk8s_worker_start_seconds", "Worker pod created -> Ready, for pods "
                                   "created while the loop runs", ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.provisioned = Counter("slurmk8s_node_provisioned_seconds", "Node-seconds with a worker pod in "
                                   "existence (not Terminating), since `up`", ["pool"], registry=r)
        self.busy = Counter("slurmk8s_node_busy_seconds", "Node-seconds a node ran jobs (from the jobs' start "
                            "and end times, as sacct has them), since `up`", ["pool"], registry=r)
        self.rpc = Histogram("slurmk8s_controller_rpc_seconds", "Latency of the loop's scontrol / squeue calls "
                             "(slurmctld RPCs)", ["command"], buckets=RPC_BUCKETS, registry=r)
        self.rpc_errors = Counter("slurmk8s_controller_rpc_errors", "Failed scontrol / squeue calls",
                                  ["command"], registry=r)
        self.health_drained = Gauge("slurmk8s_health_drained_nodes", "Slurm nodes drained by a failed health "
                                    "check, by pool and check (disk, shm, memory, mpi, gpu)", ["pool", "check"],
                                    registry=r)
        self.usage_since = Gauge("slurmk8s_usage_since_timestamp_seconds", "Start of the node-seconds tally "
                                 "(provisioned / busy): the cluster's `up`; kept across controller restarts",
                                 registry=r)
        self._usage: dict[str, dict[str, float]] = {"provisioned": {}, "busy": {}}
        self._since: float | None = None
        self._gauge_keys: dict[str, set[tuple[str, ...]]] = {}
        self._seen_running: dict[int, float] = {}
        self._seen_ready: set[tuple[str, float]] = set()
        self._last: float | None = None
        self._busy_last: float | None = None
        self._inventory: Any = None
        self._lock = threading.Lock()

    # -- observation helpers

    def observe_rpc(self, command: str, seconds: float, ok: bool) -> None:
        self.rpc.labels(command).observe(seconds)
        if not ok:
            self.rpc_errors.labels(command).inc()

    def _set_gauge(self, key: str, gauge: Any, values: Mapping[tuple[str, ...], float]) -> None:
        """Set a labelled gauge to exactly `values` (label sets not seen any more drop to 0)."""
        old = self._gauge_keys.get(key, set())
        for labels in old - set(values):
            gauge.labels(*labels).set(0)
        for labels, v in values.items():
            gauge.labels(*labels).set(v)
        self._gauge_keys[key] = old | set(values)

    def observe_pass(self, report: Report, jobs: Sequence[JobStatus] | None, now: float, started: float,
                     seconds: float, backoff_pools: Iterable[str]) -> None:
        with self._lock:
            self.passes.labels("ok" if not report.errors else "error").inc()
            self.pass_seconds.observe(seconds)
            self.last_run.set(now)
            for f in report.acted:
                self.findings.labels(f.kind.value).inc()
            for d in report.done:
                self.actions.labels(d.op.value, d.outcome).inc()
            pools = set(backoff_pools)
            self._set_gauge("backoff", self.backoff, {(p,): 1.0 for p in pools})
            snap = report.snapshot
            if snap is not None:
                self._observe_snapshot(snap, now, started)
            if jobs is not None:
                self._observe_jobs(jobs, started)
                if snap is not None:
                    self._inventory = snap.inventory  # a pass without a snapshot counts with the last one
                self._observe_busy(jobs, now, self._inventory)

    def _observe_snapshot(self, snap: Snapshot, now: float, started: float) -> None:
        def pool_of(name: str) -> str:
            return _pool_of(snap.inventory, name)

        counts: dict[tuple[str, ...], float] = {}
        for name, node in snap.nodes.items():
            key = (pool_of(name), node.summary)
            counts[key] = counts.get(key, 0) + 1
        self._set_gauge("nodes", self.nodes, counts)
        counts = {}
        for name, w in snap.workers.items():
            key = (pool_of(name), w.phase)
            counts[key] = counts.get(key, 0) + 1
        self._set_gauge("workers", self.workers, counts)
        counts = {}
        for name, node in snap.nodes.items():
            check = health_check_of(node)
            if check:
                key = (pool_of(name), check)
                counts[key] = counts.get(key, 0) + 1
        self._set_gauge("health_drained", self.health_drained, counts)
        # node-seconds since the previous pass, attributed with this pass's state
        if self._last is not None:
            dt = max(0.0, now - self._last)
            for name, w in snap.workers.items():
                if w.phase != "Terminating":
                    self._add_usage("provisioned", pool_of(name), dt)
        self._last = now
        since = _whole_second(started)
        for name, w in snap.workers.items():
            if w.phase != "Running" or w.created_at is None or w.created_at < since:
                continue  # only workers created while this process watches: no stale huge values
            seen = (name, w.created_at)
            if seen in self._seen_ready:
                continue
            self._seen_ready.add(seen)
            ready = w.ready_at or now
            self.pod_start.labels(pool_of(name)).observe(max(0.0, ready - w.created_at))
        live = {(n, w.created_at) for n, w in snap.workers.items()}
        self._seen_ready &= live

    def _observe_jobs(self, jobs: Sequence[JobStatus], started: float) -> None:
        counts: dict[tuple[str, ...], float] = {}
        for j in jobs:
            if j.state in ("PENDING", "RUNNING"):
                key = (j.partition, j.state.lower())
                counts[key] = counts.get(key, 0) + 1
        self._set_gauge("jobs", self.jobs, counts)
        since = _whole_second(started)
        for j in jobs:
            # started jobs, running or already finished (a short job may never be seen RUNNING);
            # CANCELLED is left out: Slurm gives a job cancelled while pending a start time too
            if j.state not in RAN_STATES or not j.start_time or j.job_id in self._seen_running:
                continue
            self._seen_running[j.job_id] = j.start_time or 0.0
            if j.submit_time and j.start_time and j.start_time >= since:
                self.submit_to_running.labels(j.partition).observe(max(0.0, j.start_time - j.submit_time))
        listed = {j.job_id for j in jobs}  # forget a job once squeue no longer lists it (MinJobAge)
        for job_id in [k for k in self._seen_running if k not in listed]:
            del self._seen_running[job_id]

    def _observe_busy(self, jobs: Sequence[JobStatus], now: float, inv: Any) -> None:
        """Busy node-seconds since the last pass that saw the jobs, from the jobs' own start and end
        times (what sacct reports; whole seconds): each node counts once while any job runs on it.
        A job that starts and ends between two passes is still listed at the next one (MinJobAge),
        so it counts in full; a pass whose job listing failed leaves its time to the next one."""
        last, self._busy_last = self._busy_last, now
        if last is None:
            return  # the first pass: the tally continues from here (usage.json)
        spans: dict[str, list[tuple[float, float]]] = {}
        for j in jobs:
            if not j.start_time or not j.nodes or j.state == "PENDING":
                continue  # never ran (a requeued job's earlier run is lost with its times)
            # a running job's end_time is its time limit's end; any other's is when it ended
            # (cancelled, deadline and the rest included: sacct counts them too)
            end = now if j.state in ("RUNNING", "COMPLETING") else (j.end_time or 0.0)
            lo, hi = max(j.start_time, last), min(end, now)
            if hi > lo:
                for node in j.nodes:
                    spans.setdefault(node, []).append((lo, hi))
        for node, intervals in spans.items():
            covered, reach = 0.0, last
            for lo, hi in sorted(intervals):  # the union: jobs sharing a node count it once
                lo = max(lo, reach)
                if hi > lo:
                    covered += hi - lo
                    reach = hi
            self._add_usage("busy", _pool_of(inv, node), covered)

    def _add_usage(self, kind: str, pool: str, seconds: float) -> None:
        (self.provisioned if kind == "provisioned" else self.busy).labels(pool).inc(seconds)
        totals = self._usage[kind]
        totals[pool] = totals.get(pool, 0.0) + seconds

    def restore_usage(self, usage: "Usage") -> None:
        """Continue the node-seconds counters from a saved tally (a restarted or woken controller)."""
        with self._lock:
            for kind, totals in (("provisioned", usage.provisioned), ("busy", usage.busy)):
                for pool, seconds in sorted(totals.items()):
                    if seconds > 0:
                        self._add_usage(kind, pool, seconds)
            self._since = usage.since
            self.usage_since.set(usage.since)

    def usage(self, deployment: str) -> "Usage":
        """The node-seconds tally to save (since the restored / first start)."""
        with self._lock:
            return Usage(deployment, self._since if self._since is not None else 0.0,
                         dict(self._usage["provisioned"]), dict(self._usage["busy"]))

    def observe_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for e in events:
                self.elastic.labels(str(e.get("program", "")), str(e.get("action", "")), str(e.get("reason", "")),
                                    str(e.get("outcome", ""))).inc()

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)


def _whole_second(started: float) -> float:
    """The earliest stamp of something made after `started`: Kubernetes' creationTimestamp, Docker's
    Created and Slurm's start_time are whole seconds, so a pod made 0.4 s after the loop started
    can read as made before it."""
    return float(math.floor(started))


def _pool_of(inv: Any, node: str) -> str:
    """The pool of a Slurm node by the inventory ('unknown' without one, or for a node not in it)."""
    return inv[node].pool if inv is not None and node in inv else "unknown"


def health_check_of(node: NodeStatus) -> str:
    """The failed check of a node drained by slurmk8s-healthcheck (reason 'health: <check>: ...'), else ''."""
    if "DRAIN" not in node.state or not node.reason.startswith("health: "):
        return ""
    check = node.reason[len("health: "):].split(":", 1)[0].strip()
    return check if check.isidentifier() else "other"


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as exported: counters end in _total; histograms add _bucket / _sum / _count
    kind: str
    labels: tuple[str, ...]
    help: str


def metric_catalog(metrics: "Metrics") -> list[MetricDoc]:
    """Every metric the loop exports, with its labels (also those with no sample yet)."""
    from prometheus_client.metrics import MetricWrapperBase

    out = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            kind = value._type or ""  # counter | gauge | histogram (None only on the abstract base)
            name = value._name + ("_total" if kind == "counter" else "")
            out.append(MetricDoc(name, kind, tuple(value._labelnames), value._documentation))
    return sorted(out, key=lambda d: d.name)


def metrics_markdown(metrics: "Metrics | None" = None) -> str:
    """The metrics table of docs/metrics.md (kept current by a test)."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for d in metric_catalog(metrics or Metrics()):
        labels = ", ".join(f"`{label}`" for label in d.labels) or "-"
        rows.append(f"| `{d.name}` | {d.kind} | {labels} | {d.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def dashboard_queries(dashboard: Any) -> list[str]:
    """Every PromQL expression (`expr`) of a Grafana dashboard document, in document order: the
    unit tests check them against the exported names, the e2e tier runs them on Prometheus."""
    if isinstance(dashboard, dict):
        own = [dashboard["expr"]] if isinstance(dashboard.get("expr"), str) else []
        return own + [e for v in dashboard.values() for e in dashboard_queries(v)]
    if isinstance(dashboard, list):
        return [e for v in dashboard for e in dashboard_queries(v)]
    return []


def exported_names(registry: Any) -> set[str]:
    """Every sample name the registry can export (counter _total, histogram _bucket/_sum/_count...),
    whether or not a labelled child exists yet."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
    names = set()
    for family in registry.collect():
        for s in suffixes.get(family.type, ("",)):
            names.add(family.name + s)
    return names
