"""bench/p1_phases.py: the phases of a P1 run from zero workers, from recorded samples of every
source (the login loop's lines, elastic.log, slurmctld's stderr under `kubectl logs --timestamps`,
the worker pod watch stream, the Scheduled events), and from lines the real resume program and
PrologSlurmctld write, so a change of their format breaks here, not in a benchmark run."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.backend import FakeBackend
from fakes.slurm import FakeSlurm

from provisioner.elastic import prolog
from provisioner.elastic.bootgate import BootGate
from provisioner.elastic.early import run_early_resume
from provisioner.elastic.programs import Context, run_resume
from provisioner.inventory import Inventory, SlurmNode
from provisioner.logs import Log

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import p1_phases as p1  # noqa: E402

T0 = 1796156010.0  # 2026-12-01T20:13:30Z


# ---------------------------------------------------------------- timestamps


def test_rfc3339_at_every_resolution_and_offset():
    assert p1.parse_rfc3339("2026-12-01T20:13:30Z") == T0
    assert p1.parse_rfc3339("2026-12-01T20:13:30.123Z") == pytest.approx(T0 + 0.123)
    assert p1.parse_rfc3339("2026-12-01T20:13:30.123456Z") == pytest.approx(T0 + 0.123456)
    # containerd: nanoseconds, trailing zeros trimmed by Go's RFC3339Nano
    assert p1.parse_rfc3339("2026-12-01T20:13:30.12345678Z") == pytest.approx(T0 + 0.12345678)
    assert p1.parse_rfc3339("2026-12-01T21:13:30.5+01:00") == pytest.approx(T0 + 0.5)
    assert p1.parse_rfc3339("2026-12-01T19:43:30-00:30") == T0
    assert p1.parse_rfc3339(None) is None and p1.parse_rfc3339("") is None
    assert p1.parse_rfc3339("yesterday") is None


# ---------------------------------------------------------------- the login loop


def loop_script() -> str:
    """LOOP from bench/k8s_submit_latency.py, without importing it (it deploys on main())."""
    tree = ast.parse((ROOT / "bench" / "k8s_submit_latency.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "LOOP" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no LOOP in bench/k8s_submit_latency.py")


FAKE_SBATCH = """#!/bin/bash
n=$(cat "$STATE/next" 2>/dev/null || echo 41); echo $((n + 1)) >"$STATE/next"; echo "$((n + 1))"
"""
# squeue: RUNNING at the second look; start time and node list (epoch only under SLURM_TIME_FORMAT=%s,
# as Slurm's own slurm_make_time_str); nothing without -o (the job has left)
FAKE_SQUEUE = """#!/bin/bash
fmt=""; while [ $# -gt 0 ]; do case $1 in -o) fmt=$2; shift;; esac; shift; done
case "$fmt" in
  %T) c=$(cat "$STATE/looks" 2>/dev/null || echo 0); echo $((c + 1)) >"$STATE/looks"
      if [ "$c" -ge 1 ]; then echo RUNNING; else echo CONFIGURING; fi;;
  "%S %N") if [ "${SLURM_TIME_FORMAT:-}" = %s ]; then echo "1796156013 cpu-0"; else echo "2026-12-01T20:13:33 cpu-0"; fi;;
esac
"""
FAKE_SINFO = """#!/bin/bash
echo 'idle~'; echo 'idle~'
"""


def test_the_login_loop_prints_one_parsable_line_per_run(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE), ("sinfo", FAKE_SINFO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "loop.sh").write_text(loop_script())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(tmp_path)}
    env.pop("SLURM_TIME_FORMAT", None)
    out = subprocess.run(["bash", str(tmp_path / "loop.sh"), "zero", "2"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    runs = p1.parse_runs(out)
    assert [r.index for r in runs] == [1, 2] and [r.job for r in runs] == ["42", "43"], out
    for r in runs:
        assert r.t0 <= r.sbatch <= r.running and 0 < r.seconds < 30
        assert r.start_time == 1796156013.0 and r.nodes == "cpu-0"


def test_run_lines():
    line = ("run 3 job 12 t0 1796156010000000000 sbatch 1796156010052000000 running 1796156013912000000 "
            "start 1796156013 nodes cpu-0")
    run = p1.parse_run_line(line)
    assert run == p1.Run(3, "12", T0, T0 + 0.052, T0 + 3.912, 1796156013.0, "cpu-0")
    assert run.seconds == pytest.approx(3.912)
    # squeue no longer had the job: start and nodes unknown; a federated `sbatch --parsable` id
    gone = p1.parse_run_line("run 1 job 12;fed t0 1 sbatch 2 running 3 start - nodes -")
    assert gone.job == "12" and gone.start_time is None and gone.nodes == ""
    for junk in ("", "3912", "run 1 job", "run x job 1 t0 1 sbatch 2 running 3", "hello world"):
        assert p1.parse_run_line(junk) is None
    assert len(p1.parse_runs(line + "\nWarning: something\n" + line)) == 2


# ---------------------------------------------------------------- elastic.log

# what provisioner/logs.py writes for one from-zero run (the resume program, then PrologSlurmctld),
# with a suspend call of an earlier run and a reconcile line interleaved
ELASTIC = """\
2026-12-01T20:13:21.400Z suspend[812] suspend 1 nodes: cpu-0
2026-12-01T20:13:21.650Z suspend[812] decide cpu-0 delete (suspend): worker is Running
2026-12-01T20:13:21.702Z suspend[812] cpu-0 delete ok (0.05s)
2026-12-01T20:13:21.703Z suspend[812] done in 0.31s: 1 ok, 0 failed
2026-12-01T20:13:30.512Z resume[851] resume file: job 12 resumes cpu-0 of cpu-0
2026-12-01T20:13:30.513Z resume[851] resume 1 nodes: cpu-0
2026-12-01T20:13:30.700Z reconcile[77] pass: 1 workers, 0 orphans
2026-12-01T20:13:30.702Z resume[851] decide cpu-0 create (resume) jobs=12
2026-12-01T20:13:30.801Z resume[851] cpu-0 create ok (0.09s)
2026-12-01T20:13:30.802Z resume[851] done in 0.35s: 1 ok, 0 failed
2026-12-01T20:13:33.610Z prolog[866] job 12 nodes cpu-0: booted after 3.05s (31 polls, states ['allocated'])
2026-12-01T20:13:45.001Z resume[851] resume 1 nodes: cpu-1
2026-12-01T20:13:45.300Z resume[851] cpu-1 create ok (0.10s)
garbage that is not a log line
2026-12-01T20:13:45.302Z resume[851] done in 0.31s: 1 ok, 0 failed
"""


def test_resume_calls_and_prolog_waits_from_elastic_log():
    calls = p1.resume_calls(ELASTIC.splitlines())
    assert len(calls) == 2  # the same pid again after `done in` is a new call
    first, second = calls
    assert first.pid == 851 and first.started == pytest.approx(T0 + 0.512)
    assert first.jobs == {12: ["cpu-0"]} and first.nodes == ["cpu-0"]
    assert first.created == {"cpu-0": pytest.approx(T0 + 0.801)} and first.done == pytest.approx(T0 + 0.802)
    assert second.jobs == {} and second.nodes == ["cpu-1"] and second.started == pytest.approx(T0 + 15.001)
    waits = p1.prolog_waits(ELASTIC.splitlines())
    assert waits == {12: p1.PrologWait(12, "cpu-0", "booted", 3.05, pytest.approx(T0 + 3.61))}


def test_the_real_programs_lines_parse(tmp_path: Path, monkeypatch):
    """Lines written by run_resume (fake backend) and prolog_main, as in the slurmctld pod."""
    path = tmp_path / "elastic.log"
    inventory = Inventory((SlurmNode("cpu-0", "cpu", "cpu", 1, 1024), SlurmNode("cpu-1", "cpu", "cpu", 1, 1024)))
    resume_file = json.dumps({"all_nodes_resume": "cpu-0", "jobs": [
        {"job_id": 12, "nodes_resume": "cpu-0", "nodes_alloc": "cpu-0", "partition": "cpu"}]})
    log = Log("resume", str(path))
    ctx = Context({"SLURMK8S_BUDGET": "5"}, log, backend=FakeBackend(), slurm=FakeSlurm(), inventory=inventory)
    assert run_resume(["cpu-0"], ctx, resume_file).code == 0
    log.close()

    states = iter([["allocated#"], ["allocated#"], ["allocated"]])
    monkeypatch.setattr(prolog, "node_states", lambda nodelist: next(states))
    monkeypatch.setenv("SLURMK8S_LOG", str(path))
    monkeypatch.setenv("SLURMK8S_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "cpu-0")
    monkeypatch.setenv("SLURMK8S_PROLOG_TIMEOUT", "5")
    assert prolog.prolog_main() == 0

    lines = path.read_text().splitlines()
    assert all(p1.parse_log_line(line) is not None for line in lines), lines
    (call,) = p1.resume_calls(lines)
    assert call.jobs == {12: ["cpu-0"]} and call.nodes == ["cpu-0"] and set(call.created) == {"cpu-0"}
    assert call.done is not None and call.started <= call.created["cpu-0"] <= call.done
    wait = p1.prolog_waits(lines)[12]
    assert wait.outcome == "booted" and wait.nodes == "cpu-0" and wait.at >= call.done


# ---------------------------------------------------------------- slurmctld's stderr

# `kubectl logs --timestamps` of the slurmctld container: containerd's stamp, then Slurm's stderr
# format without LogTimeFormat ("slurmctld: " + message), lines of the entrypoint's sync-nodes too
CTLD = """\
2026-12-01T20:13:30.061234567Z slurmctld: _slurm_rpc_submit_batch_job: JobId=12 InitPrio=4294901759 usec=1423
2026-12-01T20:13:30.063456789Z slurmctld: sched: Allocate JobId=12 NodeList=cpu-0 #CPUs=1 Partition=cpu
2026-12-01T20:13:31.2Z [sync-nodes] nothing to drain
2026-12-01T20:13:33.512345678Z slurmctld: Node cpu-0 now responding
2026-12-01T20:13:33.70112Z slurmctld: Resetting JobId=12 start time for node power up
2026-12-01T20:13:40.001Z slurmctld: Started JobId=13 in cpu on cpu-1
2026-12-01T20:13:45.9Z slurmctld: Node cpu-0 now responding
not a stamped line: Node cpu-9 now responding
"""


def test_slurmctld_events():
    ctld = p1.slurmctld_events(CTLD)
    assert ctld.allocated == {12: pytest.approx(T0 + 0.063456789), 13: pytest.approx(T0 + 10.001)}
    assert ctld.registered == {"cpu-0": [pytest.approx(T0 + 3.512345678), pytest.approx(T0 + 15.9)]}
    assert ctld.started == {12: pytest.approx(T0 + 3.70112)}


# ---------------------------------------------------------------- worker pods and events

UID = "6f1c2d8e-1b7a-4c1e-9a53-0d2f3c4b5a69"


def pod(phase: str, *, scheduled: bool = False, started: bool = False, deleting: bool = False,
        terminated: bool = False) -> dict:
    """A worker pod object as the API server sends it (trimmed: the fields the bench reads, and a few)."""
    meta = {"name": "cpu-0", "namespace": "slurm-bench-p1", "uid": UID, "resourceVersion": "4711",
            "creationTimestamp": "2026-12-01T20:13:30Z",
            "labels": {"app.kubernetes.io/component": "worker", "app.kubernetes.io/instance": "bench-p1",
                       "app.kubernetes.io/name": "slurmk8s", "app.kubernetes.io/part-of": "slurmk8s",
                       "slurmk8s.io/cluster": "bench-p1", "slurmk8s.io/node": "cpu-0", "slurmk8s.io/pool": "cpu"},
            "annotations": {"slurmk8s.io/spec-hash": "3f9a"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "slurmctld",
                                 "uid": "0b4c", "controller": False, "blockOwnerDeletion": False}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T20:13:40Z"
    status: dict = {"phase": phase, "qosClass": "Burstable"}
    if scheduled:
        status["conditions"] = [
            {"type": "PodReadyToStartContainers", "status": "True" if started else "False",
             "lastTransitionTime": "2026-12-01T20:13:32Z" if started else "2026-12-01T20:13:31Z"},
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T20:13:31Z"},
            {"type": "Ready", "status": "True" if started else "False", "lastTransitionTime": "2026-12-01T20:13:32Z"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T20:13:31Z"}]
    if started or terminated:
        state = ({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-01T20:13:32Z",
                                 "finishedAt": "2026-12-01T20:13:41Z"}} if terminated
                 else {"running": {"startedAt": "2026-12-01T20:13:32Z"}})
        status["containerStatuses"] = [{"name": "slurmd", "image": "slurmk8s/slurmd:dev", "ready": started,
                                        "restartCount": 0, "started": started, "state": state}]
    elif scheduled:
        status["containerStatuses"] = [{"name": "slurmd", "ready": False, "restartCount": 0,
                                        "state": {"waiting": {"reason": "ContainerCreating"}}}]
    spec = {"containers": [{"name": "slurmd", "image": "slurmk8s/slurmd:dev"}], "hostname": "cpu-0"}
    if scheduled:
        spec["nodeName"] = "slurmk8s-local"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def watch_stream() -> str:
    """`kubectl get pods --watch --output-watch-events -o json`: indented documents one after the
    other; here kubectl was restarted once, mid-document (the restart lists the pod again)."""
    events = [("ADDED", pod("Pending")), ("MODIFIED", pod("Pending", scheduled=True)),
              ("MODIFIED", pod("Running", scheduled=True, started=True))]
    text = "".join(json.dumps({"type": t, "object": o}, indent=4) + "\n" for t, o in events)
    cut = json.dumps({"type": "MODIFIED", "object": pod("Running", scheduled=True, started=True)}, indent=4)
    text += cut[: len(cut) // 2] + "\n"
    later = [("ADDED", pod("Running", scheduled=True, started=True)),
             ("MODIFIED", pod("Running", scheduled=True, terminated=True, deleting=True)),
             ("DELETED", pod("Succeeded", scheduled=True, terminated=True, deleting=True))]
    return text + "".join(json.dumps({"type": t, "object": o}, indent=4) + "\n" for t, o in later)


def test_json_stream_skips_a_document_cut_short():
    docs = p1.json_stream(watch_stream())
    assert [d["type"] for d in docs] == ["ADDED", "MODIFIED", "MODIFIED", "ADDED", "MODIFIED", "DELETED"]
    assert p1.json_stream('{"a": 1}{"b": 2}\n  {"c": 3}') == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert p1.json_stream("") == [] and p1.json_stream('{"a": ') == []


def test_pod_times_merge_every_version_of_the_pod():
    (times,) = p1.pod_times(p1.json_stream(watch_stream())).values()
    assert times.uid == UID and times.node == "cpu-0" and times.host == "slurmk8s-local"
    assert times.created == T0 and times.scheduled == T0 + 1 and times.started == T0 + 2
    # plain objects too (`kubectl get pod -o json`), and a pod seen only once it had ended
    (ended,) = p1.pod_times([pod("Succeeded", scheduled=True, terminated=True)]).values()
    assert ended.started == T0 + 2
    assert p1.pod_times([{"kind": "Status"}, [], {"type": "ERROR", "object": {"kind": "Status"}}]) == {}


# `kubectl get events --field-selector reason=Scheduled -o json`: the scheduler's event has an
# eventTime (events.k8s.io, microseconds) and no first/lastTimestamp; an old-style one only those
EVENTS = {"apiVersion": "v1", "kind": "List", "items": [
    {"kind": "Event", "reason": "Scheduled", "type": "Normal", "action": "Binding",
     "eventTime": "2026-12-01T20:13:30.912345Z", "firstTimestamp": None, "lastTimestamp": None,
     "reportingComponent": "default-scheduler", "reportingInstance": "default-scheduler-slurmk8s-local",
     "involvedObject": {"kind": "Pod", "name": "cpu-0", "namespace": "slurm-bench-p1", "uid": UID,
                        "apiVersion": "v1", "resourceVersion": "4711"},
     "message": "Successfully assigned slurm-bench-p1/cpu-0 to slurmk8s-local"},
    {"kind": "Event", "reason": "Scheduled", "eventTime": None, "firstTimestamp": "2026-12-01T20:14:00Z",
     "involvedObject": {"kind": "Pod", "name": "cpu-1", "uid": "other"}},
    {"kind": "Event", "reason": "Started", "firstTimestamp": "2026-12-01T20:13:32Z",
     "involvedObject": {"kind": "Pod", "name": "cpu-0", "uid": UID}},
]}


def test_scheduled_events():
    assert p1.scheduled_events(EVENTS) == {UID: (pytest.approx(T0 + 0.912345), True), "other": (T0 + 30, False)}
    assert p1.scheduled_events({}) == {}


# ---------------------------------------------------------------- one run, and the summary

RUN = p1.Run(1, "12", T0 + 0.05, T0 + 0.098, T0 + 3.912, 1796156013.0, "cpu-0")


def sources(**over) -> p1.Sources:
    base = dict(calls=p1.resume_calls(ELASTIC.splitlines()), prolog=p1.prolog_waits(ELASTIC.splitlines()),
                ctld=p1.slurmctld_events(CTLD), pods=p1.pod_times(p1.json_stream(watch_stream())),
                scheduled=p1.scheduled_events(EVENTS))
    return p1.Sources(**{**base, **over})


def test_phases_of_one_run():
    got = p1.phases(RUN, sources())
    assert got["job"] == "12" and got["node"] == "cpu-0" and got["t0"] == T0 + 0.05
    ph = {k: v for k, v in got["phases"].items()}
    expect = {"sbatch_returned": 0.048, "allocated": 0.013456789, "resume_started": 0.462, "create_returned": 0.751,
              "pod_created": -0.05, "pod_scheduled": 0.862345, "container_started": 1.95,
              "slurmd_registered": 3.462345678, "prolog_released": 3.56, "job_started": 3.65112,
              "start_time": 2.95, "running_seen": 3.862}
    assert ph == {k: pytest.approx(v, abs=1e-5) for k, v in expect.items()}
    assert set(got["coarse"]) == {"pod_created", "container_started", "start_time"}
    assert got["sources"]["pod_scheduled"] == "Scheduled event eventTime"
    assert got["sources"]["resume_started"] == "elastic.log resume[851] first line"


def test_phases_fall_back_and_stay_in_the_run_window():
    # no Scheduled event: the PodScheduled condition (1 s); no resume file line: by node and time
    no_file = [line for line in ELASTIC.splitlines() if "resume file:" not in line]
    got = p1.phases(RUN, sources(scheduled={}, calls=p1.resume_calls(no_file)))
    assert got["phases"]["pod_scheduled"] == pytest.approx(0.95) and "pod_scheduled" in got["coarse"]
    assert got["phases"]["resume_started"] == pytest.approx(0.463)
    # a later run of the same node sees none of this run's stamps (the second `now responding` is its own)
    later = p1.Run(2, "14", T0 + 14.9, T0 + 14.95, T0 + 16.0, None, "cpu-0")
    ph = p1.phases(later, sources())["phases"]
    assert ph["slurmd_registered"] == pytest.approx(1.0)
    assert all(ph[k] is None for k in ("allocated", "resume_started", "create_returned", "pod_created",
                                       "pod_scheduled", "container_started", "prolog_released", "job_started",
                                       "start_time"))
    assert ph["sbatch_returned"] == pytest.approx(0.05) and ph["running_seen"] == pytest.approx(1.1)


def test_steps_count_from_the_previous_sub_second_phase():
    got = p1.phases(RUN, sources())
    s = p1.steps(got)

    def approx(v):  # phases are rounded to the microsecond (an epoch double holds ~0.2 us anyway)
        return pytest.approx(v, abs=2e-6)

    assert s["allocated"] == approx(0.013456789 - 0.048)  # allocated before sbatch had returned
    assert s["resume_started"] == approx(0.462 - 0.013456789)
    assert s["pod_created"] == approx(-0.05 - 0.751)  # from create_returned; a 1 s stamp
    assert s["pod_scheduled"] == approx(0.862345 - 0.751)  # not from the 1 s pod_created
    assert s["slurmd_registered"] == approx(3.462345678 - 0.862345)
    assert s["running_seen"] == approx(3.862 - 3.65112)  # from job_started, not start_time


def test_phase_table_and_run_table():
    runs = [p1.phases(RUN, sources()), p1.phases(RUN, sources(scheduled={}))]
    table = p1.phase_table(runs)
    assert len(table) == 1 + len(p1.PHASES) + 1
    row = {line.split("  ")[0].rstrip(" *"): line for line in table[1:-1]}
    assert set(row) == {label for _, label, _ in p1.PHASES}
    assert row["slurmd registered"].split()[2:4] == ["3.462", "3.462"]
    assert row["pod created"].split()[2] == "*"
    assert row["job RUNNING (seen)"].split()[3:7] == ["3.862", "3.862", "+0.211", "2"]
    empty = p1.phase_table([p1.phases(RUN, p1.Sources())])
    assert any(line.startswith("slurmd registered") and " - " in line for line in empty)
    rows = p1.run_table(runs)
    assert len(rows) == 3 and rows[1].split()[:3] == ["12", "cpu-0", "0.048"]


def test_an_early_resume_is_the_call_that_created_the_pod(tmp_path: Path):
    """PrologSlurmctld's early resume (program early-resume) creates the pod before Slurm's resume
    call, which then keeps it: the phases take the create from the early call."""
    path = tmp_path / "elastic.log"
    inventory = Inventory((SlurmNode("cpu-0", "cpu", "cpu", 1, 1024),))
    backend = FakeBackend()
    early = Log("early-resume", str(path), pid=4242)
    conf = tmp_path / "slurm.conf"
    conf.write_text("HealthCheckInterval=300\n")
    assert run_early_resume(["12", "cpu-0"], Context({"SLURMK8S_BUDGET": "5", "SLURM_CONF": str(conf)}, early,
                                                     backend=backend, slurm=FakeSlurm(), inventory=inventory),
                            BootGate()).code == 0
    early.close()
    resume_file = json.dumps({"all_nodes_resume": "cpu-0", "jobs": [
        {"job_id": 12, "nodes_resume": "cpu-0", "nodes_alloc": "cpu-0", "partition": "cpu"}]})
    log = Log("resume", str(path))
    assert run_resume(["cpu-0"], Context({"SLURMK8S_BUDGET": "5"}, log, backend=backend, slurm=FakeSlurm(),
                                         inventory=inventory), resume_file).code == 0
    log.close()
    first, second = p1.resume_calls(path.read_text().splitlines())
    assert (first.program, first.pid, first.jobs, set(first.created)) == ("early-resume", 4242, {12: ["cpu-0"]},
                                                                          {"cpu-0"})
    assert (second.program, second.jobs, second.created) == ("resume", {12: ["cpu-0"]}, {})
