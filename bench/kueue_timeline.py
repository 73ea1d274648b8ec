"""Where the time of "quota freed -> the waiting job RUNNING" goes (bench/kueue.py, issue 41).

A watch of the namespace's pod-group pods and of its Kueue Workloads, opened before the samples,
notes the time (this machine's clock, when the event arrived) of each step of one sample:

  freed         the running job's last pod gone (its DELETED event)
  finished      its Workload Finished (Kueue's quota released)
  admitted      the waiting job's Workload Admitted
  ungated       the waiting job's pod without Kueue's scheduling gates
  bound         ... on a node (spec.nodeName)
  started       ... phase Running (its container started)
  registered    slurmd's node `now responding` (slurmctld's log, containerd's ns stamp)
  job_started   slurmctld starts the job (`Resetting JobId=J start time for node power up`)
  running_seen  the bench sees the job RUNNING (squeue on the login pod, polled every 50 ms)

:func:`steps` is pure and tested (tests/test_bench_kueue_timeline.py); :class:`Watch` does the I/O.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

STEPS = ("freed", "finished", "admitted", "ungated", "bound", "started", "registered", "job_started", "running_seen")


@dataclass(frozen=True)
class Seen:
    at: float  # time.time() when the event arrived
    kind: str  # "pod" or "workload"
    event: str  # ADDED, MODIFIED, DELETED
    obj: Mapping[str, Any]


def _group(obj: Mapping[str, Any], label: str) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(label, "")


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _first(seen: Iterable[Seen], test: Callable[[Seen], bool]) -> float | None:
    return next((s.at for s in seen if test(s)), None)


def sample_times(seen: Sequence[Seen], done_group: str, waiting_group: str, group_label: str,
                 gates: Sequence[str]) -> dict[str, float | None]:
    """The watch's part of one sample: `done_group` is the running job's pod group, `waiting_group`
    the waiting job's; each step the first event that shows it (None: not seen)."""
    def pod_of(group: str) -> Callable[[Seen], bool]:
        return lambda s: s.kind == "pod" and _group(s.obj, group_label) == group

    def wl_named(group: str) -> Callable[[Seen], bool]:
        return lambda s: s.kind == "workload" and (s.obj.get("metadata") or {}).get("name") == group

    done_pod, waiting_pod = pod_of(done_group), pod_of(waiting_group)
    done_wl, waiting_wl = wl_named(done_group), wl_named(waiting_group)

    def ungated(s: Seen) -> bool:
        return waiting_pod(s) and not any(g.get("name") in gates for g in (s.obj.get("spec") or {}).get(
            "schedulingGates") or [])

    return {
        "freed": _first(seen, lambda s: done_pod(s) and s.event == "DELETED"),
        "finished": _first(seen, lambda s: done_wl(s) and _condition_true(s.obj, "Finished")),
        "admitted": _first(seen, lambda s: waiting_wl(s) and _condition_true(s.obj, "Admitted")),
        "ungated": _first(seen, ungated),
        "bound": _first(seen, lambda s: waiting_pod(s) and bool((s.obj.get("spec") or {}).get("nodeName"))),
        "started": _first(seen, lambda s: waiting_pod(s) and (s.obj.get("status") or {}).get("phase") == "Running"),
    }


def steps(times: Mapping[str, float | None]) -> dict[str, float | None]:
    """Each step's time after `freed` (seconds, None where either is missing)."""
    t0 = times.get("freed")
    return {k: (None if t0 is None or times.get(k) is None else round(times[k] - t0, 3)) for k in STEPS}


def summary(samples: Sequence[Mapping[str, float | None]]) -> list[str]:
    """A line per step: its time after `freed` in each sample."""
    lines = []
    for k in STEPS[1:]:
        cells = " ".join("   -  " if s.get(k) is None else f"{s[k]:6.2f}" for s in samples)
        lines.append(f"  {k:12} {cells}")
    return lines


@dataclass
class Watch:
    """Pods (with `label`) and Workloads of `namespace`, every event kept with its arrival time."""

    namespace: str
    label: str
    group: str  # Kueue's API group and version
    version: str
    seen: list[Seen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self, kind: str, lister: Callable[..., Any], **kw: Any) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(lister, timeout_seconds=30, **kw):
                    self.seen.append(Seen(time.time(), kind, ev["type"], ev.get("raw_object") or ev["object"]))
                    if self._stop.is_set():
                        break
            except Exception as e:  # the watch ended (server closed it, a broken stream): open it again
                self.errors.append(f"{kind}: {e}")
                time.sleep(0.2)

    def __enter__(self) -> "Watch":
        from kubernetes import client, config

        config.load_kube_config()
        core, custom = client.CoreV1Api(), client.CustomObjectsApi()
        targets = [
            ("pod", core.list_namespaced_pod, {"namespace": self.namespace, "label_selector": self.label}),
            ("workload", custom.list_namespaced_custom_object,
             {"group": self.group, "version": self.version, "namespace": self.namespace, "plural": "workloads"}),
        ]
        for kind, lister, kw in targets:  # daemon threads: a stream blocked in a read ends with the bench
            threading.Thread(target=self._run, args=(kind, lister), kwargs=kw, name=f"watch-{kind}", daemon=True).start()
        time.sleep(1.0)  # both watches are open before the first sample
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
