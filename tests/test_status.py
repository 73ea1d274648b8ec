"""Unit tests for `slurmk8s status`: the controller's sleep state, node classification, the queue,
pods and volumes, node-seconds from the metrics, the JSON document, the screen, and gather() with an
in-memory reader (asleep: nothing exec'd; controller silent: an error, the rest still shown)."""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from provisioner import status as st
from provisioner.kubeapi import exec_status
from provisioner.elastic.backend import Worker
from provisioner.inventory import Inventory, SlurmNode
from provisioner.reconcile.act import Report
from provisioner.reconcile.classify import Snapshot
from provisioner.reconcile.metrics import Metrics
from provisioner.reconcile.usage import Usage
from provisioner.slurm.state import JobStatus, parse_nodes

NOW = 1_800_000_000.0


def sts(replicas: int | None = 1, ready: int = 1, **annotations: str) -> dict[str, Any]:
    spec = {} if replicas is None else {"replicas": replicas}
    return {"metadata": {"name": "slurmctld", "creationTimestamp": "2027-01-15T08:00:00Z",
                         "annotations": annotations},
            "spec": spec, "status": {"readyReplicas": ready}}


# ---------------------------------------------------------------- sleep state


def test_controller_state_from_replicas_and_annotations():
    assert st.controller_state(sts()).state == "awake"
    assert st.controller_state(sts()).since == "2027-01-15T08:00:00Z"
    asleep = st.controller_state(sts(0, 0, **{st.A_STATE: "asleep", st.A_STATE_REASON: "idle for 30m",
                                              st.A_STATE_SINCE: "2027-01-15T09:00:00Z"}))
    assert (asleep.state, asleep.reason, asleep.since) == ("asleep", "idle for 30m", "2027-01-15T09:00:00Z")
    # 0 replicas is asleep even without (or before) the annotation
    bare = st.controller_state(sts(0, 0))
    assert bare.state == "asleep" and "scaled to 0" in bare.reason and not bare.reachable
    # annotated asleep but scaled up: waking
    assert st.controller_state(sts(1, 0, **{st.A_STATE: "asleep"})).state == "starting"
    assert st.controller_state(sts(1, 0)).state == "starting"
    assert st.controller_state(sts(None, 1)).state == "awake"  # replicas defaulted by the API
    absent = st.controller_state(None)
    assert absent.state == "absent" and not absent.reachable
    assert st.controller_state(sts(1, 1, **{st.A_STATE: "awake", st.A_STATE_REASON: "woken by ssh alice"})).reason \
        == "woken by ssh alice"


# ---------------------------------------------------------------- nodes and queue


def node(name: str, *state: str, reason: str = "") -> dict[str, Any]:
    return {"name": name, "state": list(state), "reason": reason, "partitions": ["cpu"]}


def sinfo_lines(doc: dict[str, Any]) -> str:
    """What status.SHOW_NODES_ARGV prints for these nodes (sinfo: lower case, `*` on the default
    partition, `none` for no reason)."""
    return "".join(f"{n['name']}|{'+'.join(n['state']).lower()}|{p}*|{n['reason'] or 'none'}\n"
                   for n in doc["nodes"] for p in n["partitions"])


NODES = {"nodes": [
    node("cpu-0", "IDLE", "CLOUD", "POWERED_DOWN"),
    node("cpu-1", "IDLE", "CLOUD", "POWERING_UP"),
    node("cpu-2", "IDLE", "CLOUD"),
    node("cpu-3", "ALLOCATED", "CLOUD"),
    node("cpu-4", "IDLE", "DRAIN", "CLOUD", reason="health: memory: 310MiB available (pod cgroup limit - usage)"),
    node("cpu-5", "MIXED", "DRAIN", "CLOUD", reason="health: disk: / has 10MiB free, below 1024MiB"),
    node("cpu-6", "DOWN", "CLOUD", reason="slurmk8s worker-failed: pod cpu-6 Failed"),
    node("cpu-7", "IDLE", "DRAIN", "CLOUD", reason="maintenance"),
    node("cpu-8", "IDLE", "CLOUD", "POWERING_DOWN"),
]}


def test_node_rows_from_sinfo_lines():
    text = ("q-5|idle+cloud+drain+powered_down|q|health: disk: a|b\n"  # a | in the reason is kept
            "g-0|mixed+cloud|gpu*|none\ng-0|mixed+cloud|all|none\n\n")
    rows = st.node_rows(text)
    assert [(r.name, r.category, r.reason, r.partitions) for r in rows] == [
        ("g-0", "mixed", "", ("gpu", "all")), ("q-5", "drained", "health: disk: a|b", ("q",))]
    assert rows[1].state == ("CLOUD", "DRAIN", "IDLE", "POWERED_DOWN")
    assert "--json" not in st.SHOW_NODES_ARGV


def test_node_categories_and_health_drains():
    rows = {r.name: r for r in st.node_rows(sinfo_lines(NODES))}
    assert {n: r.category for n, r in rows.items()} == {
        "cpu-0": "powered_down", "cpu-1": "powering_up", "cpu-2": "idle", "cpu-3": "allocated",
        "cpu-4": "drained", "cpu-5": "draining", "cpu-6": "down", "cpu-7": "drained", "cpu-8": "powering_down"}
    assert rows["cpu-4"].health_check == "memory" and rows["cpu-5"].health_check == "disk"
    assert rows["cpu-7"].health_check == "" and rows["cpu-6"].health_check == ""


def test_queue_counts_by_partition():
    text = "\n".join(["cpu PENDING", "cpu RUNNING",
                      "cpu CONFIGURING",  # nodes still booting
                      "gpu COMPLETING", "gpu,cpu PENDING", "gpu COMPLETED", ""])
    assert st.queue_counts(text) == {"cpu": {"pending": 3, "running": 1}, "gpu": {"pending": 1, "running": 1}}
    assert st.queue_counts("") == {}
    assert "--json" not in st.SQUEUE_ARGV and "--array" in st.SQUEUE_ARGV  # one short line per job, arrays expanded


def pod(name: str, phase: str = "Running", pool: str = "cpu", created: str = "2027-01-15T08:00:00Z") -> dict:
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {"slurmk8s.io/node": name, "slurmk8s.io/pool": pool}},
            "spec": {"nodeName": "k8s-a"}, "status": {"phase": phase}}


def pvc(name: str, size: str | None = "10Gi", phase: str = "Bound") -> dict:
    doc = {"metadata": {"name": name}, "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteMany"],
                                                 "resources": {"requests": {"storage": "5Gi"}}},
           "status": {"phase": phase}}
    if size:
        doc["status"]["capacity"] = {"storage": size}
    return doc


def test_pods_and_volumes():
    [w] = st.worker_rows([pod("cpu-3", created="2027-01-15T07:59:00Z")], now=NOW)
    assert (w.name, w.pool, w.phase, w.host, w.age_seconds) == ("cpu-3", "cpu", "Running", "k8s-a", 60.0)
    vols = st.volume_rows([pvc("slurmctld-state"), pvc("home", size=None, phase="Pending")])
    assert [(v.name, v.size, v.storage_class, v.phase) for v in vols] == [
        ("home", "5Gi", "fast", "Pending"), ("slurmctld-state", "10Gi", "fast", "Bound")]


# ---------------------------------------------------------------- node-seconds from the real exporter


def exposition_with_usage() -> str:
    m = Metrics()
    m.restore_usage(Usage("uid", NOW - 3600, {"cpu": 900.0}, {"cpu": 300.0}))
    inv = Inventory((SlurmNode("cpu-0", "cpu", "cpu", 1, 1024),))
    snap = Snapshot(parse_nodes({"nodes": [node("cpu-0", "ALLOCATED", "CLOUD")]}),
                    {"cpu-0": Worker("cpu-0", "Running", created_at=NOW - 100)}, inv)
    running = [JobStatus(3, "cpu", "RUNNING", NOW - 200, NOW - 150, ("cpu-0",))]
    m.observe_pass(Report(snapshot=snap), running, NOW, NOW - 100, 0.1, [])
    m.observe_pass(Report(snapshot=snap), running, NOW + 100, NOW - 100, 0.1, [])
    return m.exposition().decode()


def test_usage_from_the_reconcile_loops_exposition():
    u = st.usage_from_metrics(exposition_with_usage())
    assert u.since == NOW - 3600
    assert u.provisioned == {"cpu": 1000.0} and u.busy == {"cpu": 400.0}
    assert u.busy_fraction == pytest.approx(0.4)
    empty = st.usage_from_metrics("")
    assert empty.since is None and empty.busy_fraction is None


# ---------------------------------------------------------------- gather with an in-memory reader


@dataclass
class FakeReader:
    namespaces: set[str] = field(default_factory=lambda: {"slurm-t"})
    sts: dict | None = field(default_factory=sts)
    recorded: dict | None = None  # the tier state ConfigMap's annotations (None: no ConfigMap)
    pod_list: list[dict] = field(default_factory=lambda: [pod("cpu-3"), pod("cpu-4")])
    pvc_list: list[dict] = field(default_factory=lambda: [pvc("home"), pvc("slurmctld-state")])
    answers: dict[tuple[str, ...], tuple[int, str, str]] = field(default_factory=dict)
    execs: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)

    def namespace_exists(self, namespace):
        return namespace in self.namespaces

    def statefulset(self, namespace, name):
        return self.sts

    def tier_state(self, namespace):
        return self.recorded

    def pods(self, namespace, label_selector):
        assert label_selector == "app.kubernetes.io/component=worker"
        return self.pod_list

    def pvcs(self, namespace):
        return self.pvc_list

    def exec(self, namespace, pod_name, container, argv, timeout):
        self.execs.append((pod_name, container, tuple(argv)))
        return self.answers.get(tuple(argv), (1, "", f"{argv[0]}: not found"))


def answering() -> FakeReader:
    r = FakeReader()
    r.answers = {st.SLURM_ARGV: (0, f"{sinfo_lines(NODES)}{st.SLURM_MARK}\ncpu RUNNING\n", ""),
                 st.SCRAPE_ARGV: (0, exposition_with_usage(), "")}
    return r


def test_gather_awake_cluster_and_its_json():
    r = answering()
    s = st.gather(r, "slurm-t", now=NOW)
    # one exec for Slurm (sinfo and squeue), one for the loop's metrics
    assert [(p, c) for p, c, _ in r.execs] == [("slurmctld-0", "slurmctld"), ("slurmctld-0", "reconcile")]
    doc = s.to_json()
    json.dumps(doc)  # serialisable
    assert doc["state"] == "awake" and doc["errors"] == [] and doc["namespace"] == "slurm-t"
    assert doc["queue"] == {"cpu": {"pending": 0, "running": 1}}
    assert doc["nodes"]["counts"] == {"powered_down": 1, "powering_up": 1, "idle": 1, "allocated": 1,
                                      "draining": 1, "drained": 2, "down": 1, "powering_down": 1}
    assert doc["health_drained"] == [
        {"name": "cpu-4", "check": "memory", "reason": "health: memory: 310MiB available (pod cgroup limit - usage)"},
        {"name": "cpu-5", "check": "disk", "reason": "health: disk: / has 10MiB free, below 1024MiB"}]
    assert [w["name"] for w in doc["workers"]] == ["cpu-3", "cpu-4"]
    assert [v["name"] for v in doc["volumes"]] == ["home", "slurmctld-state"]
    assert doc["usage"]["provisioned_node_seconds"] == 1000.0 and doc["usage"]["busy_fraction"] == 0.4
    assert doc["usage"]["since"] == "2027-01-15T07:00:00Z"


def test_gather_asleep_execs_nothing_and_says_so():
    r = answering()
    r.sts = sts(0, 0, **{st.A_STATE: "asleep", st.A_STATE_REASON: "idle for 30m",
                         st.A_STATE_SINCE: "2027-01-15T09:00:00Z"})
    r.pod_list = []
    s = st.gather(r, "slurm-t", now=NOW)
    assert r.execs == []
    doc = s.to_json()
    assert doc["state"] == "asleep" and doc["state_reason"] == "idle for 30m"
    assert doc["nodes"] is None and doc["queue"] is None and doc["usage"] is None and doc["errors"] == []
    assert "asleep" in doc["notes"][0] and "wakes it" in doc["notes"][0]
    assert [v["name"] for v in doc["volumes"]] == ["home", "slurmctld-state"]  # volumes still shown


def test_gather_controller_not_answering_is_an_error_but_the_rest_is_shown():
    r = FakeReader()
    r.answers = {st.SLURM_ARGV: (1, "", "slurm_load_node error: Unable to contact slurm controller "
                                        "(connect failure)")}
    s = st.gather(r, "slurm-t", now=NOW)
    assert s.nodes is None and s.queue is None
    assert "slurmctld does not answer" in s.errors[0] and "Unable to contact slurm controller" in s.errors[0]
    assert "metrics" in s.errors[1]
    assert len(s.workers) == 2


def test_gather_says_when_the_answer_stops_before_squeue():
    r = answering()
    r.answers[st.SLURM_ARGV] = (0, sinfo_lines(NODES), "")  # the mark and squeue's lines missing
    s = st.gather(r, "slurm-t", now=NOW)
    assert s.nodes is None and s.queue is None
    assert "slurmctld does not answer" in s.errors[0] and "ended before squeue's lines" in s.errors[0]


def test_the_mark_splits_only_as_a_whole_line():
    reason = f"q-1|idle+drain|q|operator: see {st.SLURM_MARK}\n"  # a reason that ends in the mark's text
    assert st.split_slurm_answer(f"{reason}{st.SLURM_MARK}\ncpu PENDING\n") == (reason, "cpu PENDING\n")
    assert st.split_slurm_answer(f"{st.SLURM_MARK}\n") == ("", "")  # no nodes, no jobs


def _fake_slurm_bin(tmp_path, sinfo_exit: int = 0) -> dict[str, str]:
    """sinfo and squeue stand-ins that print their argv, one word a line, then exit."""
    for name, code in (("sinfo", sinfo_exit), ("squeue", 0)):
        exe = tmp_path / name
        exe.write_text(f"#!/bin/sh\nprintf '{name}\\n'\nprintf '%s\\n' \"$@\"\nexit {code}\n")
        exe.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_slurm_argv_runs_sinfo_then_squeue_with_their_arguments_intact(tmp_path):
    """The one exec's shell line, run by a real /bin/sh: each command gets exactly its argv (the
    format's '|' and '%' survive the quoting) and the mark separates their output."""
    proc = subprocess.run(st.SLURM_ARGV, capture_output=True, text=True, env=_fake_slurm_bin(tmp_path), check=False)
    assert proc.returncode == 0, proc.stderr
    nodes, queue = st.split_slurm_answer(proc.stdout)
    assert nodes.splitlines() == ["sinfo", *st.SHOW_NODES_ARGV[1:]]
    assert queue.splitlines() == ["squeue", *st.SQUEUE_ARGV[1:]]
    failing = subprocess.run(st.SLURM_ARGV, capture_output=True, text=True,
                             env=_fake_slurm_bin(tmp_path, sinfo_exit=3), check=False)
    assert failing.returncode == 3 and st.SLURM_MARK not in failing.stdout and "squeue" not in failing.stdout


def test_gather_missing_namespace_names_the_fix():
    with pytest.raises(st.StatusError, match="namespace slurm-x does not exist.*slurmk8s up"):
        st.gather(FakeReader(), "slurm-x")


def test_gather_starting_controller_is_not_asked():
    r = answering()
    r.sts = sts(1, 0)
    s = st.gather(r, "slurm-t", now=NOW)
    assert r.execs == [] and s.controller.state == "starting" and "not available yet" in s.notes[0]


# ---------------------------------------------------------------- the screen


def screen(s: st.Status) -> str:
    buf = io.StringIO()
    st.render(s, Console(file=buf, width=160, color_system=None))
    return buf.getvalue()


def test_screen_shows_every_section():
    out = screen(st.gather(answering(), "slurm-t", now=NOW))
    assert "cluster slurm-t  AWAKE" in out
    for text in ("queue", "pending", "powered down 1", "drained 2", "[health memory] health: memory: 310MiB",
                 "slurmk8s worker-failed: pod cpu-6 Failed", "worker pods (2)", "slurmctld-state", "10Gi",
                 "node-seconds since 2027-01-15T07:00:00Z: provisioned 1000, busy 400 (40.0% used)"):
        assert text in out, f"{text!r} not on the screen:\n{out}"
    assert "cpu-0 " not in out  # powered down without a reason: counted, not listed


def test_screen_asleep():
    r = FakeReader(sts=sts(0, 0, **{st.A_STATE: "asleep", st.A_STATE_SINCE: "2027-01-15T09:00:00Z"}), pod_list=[])
    out = screen(st.gather(r, "slurm-t", now=NOW))
    assert "ASLEEP  since 2027-01-15T09:00:00Z" in out and "controller asleep" in out and "partition" not in out


# ---------------------------------------------------------------- the command


def test_cli_needs_exactly_one_of_spec_and_namespace():
    from provisioner.cli import app

    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 2 and "give either --spec SPEC or --namespace NAMESPACE" in result.output


def test_cli_json_and_exit_code(monkeypatch):
    from provisioner.cli import app

    reader = FakeReader()  # controller silent
    monkeypatch.setattr(st, "kube_reader", lambda kubeconfig: reader)
    result = CliRunner().invoke(app, ["status", "-n", "slurm-t", "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["state"] == "awake" and doc["errors"]
    monkeypatch.setattr(st, "kube_reader", lambda kubeconfig: answering())
    ok = CliRunner().invoke(app, ["status", "-n", "slurm-t", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["queue"] == {"cpu": {"pending": 0, "running": 1}}
    missing = CliRunner().invoke(app, ["status", "-n", "slurm-nope"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_exec_status_from_the_error_channel():
    assert exec_status('{"metadata":{},"status":"Success"}') == (0, "")
    assert exec_status('{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code",'
                          '"reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}') \
        == (2, "")
    code, why = exec_status('{"status":"Failure","reason":"InternalError","message":"OCI runtime exec failed: '
                               'exec: \\"nope\\": executable file not found in $PATH"}')
    assert code == 126 and "executable file not found" in why
    assert exec_status("")[0] == 125 and exec_status("garbage")[0] == 125
