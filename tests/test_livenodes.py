"""The Slurm configuration follows the Kubernetes nodes of pinned pools while the cluster runs
(issue #14 item 4): :class:`provisioner.livenodes.live.LiveNodes` against canned Node lists and a
recording Slurm client, in a temporary config directory filled as the slurmctld container fills it
at start.

Each case says what the loop writes, whether it reconfigures, and what it drains."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from factories import AWS, node
from fakes.slurm import FakeSlurmClient

from provisioner.config import parse_spec
from provisioner.inventory import Inventory
from provisioner.livenodes.live import LiveNodes
from provisioner.livenodes.render import render
from provisioner.logs import Log
from provisioner.render import write_files
from provisioner.slurm.state import NodeStatus

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzd0lrWdoGzZqR7HcXXwVcEBjzC1D8dRp6oOC5eYIx0 alice@test"
SPEC = parse_spec({"name": "live", "pools": [{"name": "gpu", "node_selector": {"pool": "gpu"}}],
                   "topology": {"preset": "aws"}, "users": [{"name": "alice", "uid": 2001, "ssh_keys": [KEY]}]})
RECONFIGURE = ["scontrol", "reconfigure"]


def k8s(name: str, leaf: str, *, pool: str | None = "gpu", **kw) -> dict:
    labels = {AWS + "1": "top", AWS + "2": "spine", AWS + "3": leaf}
    if pool:
        labels["pool"] = pool
    return node(name, labels, **kw)


FLEET = [k8s("k-1", "leaf-a"), k8s("k-2", "leaf-a"), k8s("k-3", "leaf-b")]


def slurm_node(name: str, *state: str, reason: str = "") -> dict:
    return {"name": name, "state": list(state), "reason": reason}


class Cluster:
    """A config directory as the render at start leaves it, the nodes the API lists, Slurm's view."""

    def __init__(self, tmp: Path, nodes: list[dict]) -> None:
        self.dir = tmp / "etc-slurm"
        write_files(render(SPEC, nodes).files, self.dir)
        self.nodes = nodes
        self.slurm = FakeSlurmClient(nodes=[slurm_node(f"gpu-{n['metadata']['name']}", "IDLE", "CLOUD", "POWERED_DOWN")
                                            for n in nodes])
        self.lists = 0
        self.live = LiveNodes(SPEC, str(self.dir), self._list, self.slurm, Log("live-test"), reconfigure_wait=1)

    def _list(self) -> list[dict]:
        self.lists += 1
        return json.loads(json.dumps(self.nodes))

    def file(self, name: str) -> str:
        return (self.dir / name).read_text()

    def inventory(self) -> Inventory:
        return Inventory.read(str(self.dir / "inventory.json"))

    def drain(self) -> list[list[str]]:
        before = len(self.slurm.updates)
        assert self.live.drain(self.inventory(), [NodeStatus.from_json(n) for n in self.slurm.nodes]) == []
        return self.slurm.updates[before:]

    def reconfigures(self) -> int:
        return sum(1 for u in self.slurm.updates if u == RECONFIGURE)


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, [dict(n) for n in json.loads(json.dumps(FLEET))])


def test_unchanged_nodes_write_nothing_and_call_nothing(cluster):
    before = {p.name: p.read_text() for p in cluster.dir.iterdir()}
    for _ in range(3):
        outcome = cluster.live.step()
        assert not outcome.error and not outcome.written and not outcome.reconfigured
    assert {p.name: p.read_text() for p in cluster.dir.iterdir()} == before
    assert cluster.slurm.updates == []
    assert cluster.drain() == []


def test_a_cordon_drains_the_node_without_a_reconfigure_and_an_uncordon_returns_it(cluster):
    cluster.nodes[1]["spec"]["unschedulable"] = True
    outcome = cluster.live.step()
    assert outcome.written == ("inventory.json",) and not outcome.reconfigured
    assert cluster.reconfigures() == 0
    assert cluster.inventory()["gpu-k-2"].unavailable == "kubernetes node k-2 is cordoned"
    assert cluster.drain() == [["scontrol", "update", "nodename=gpu-k-2", "state=DRAIN",
                                "reason=kubernetes node k-2 is cordoned"]]
    cluster.slurm.nodes[1] = slurm_node("gpu-k-2", "IDLE", "DRAIN", "CLOUD", reason="kubernetes node k-2 is cordoned")
    assert cluster.drain() == [], "drained once, not every pass"

    del cluster.nodes[1]["spec"]["unschedulable"]
    assert cluster.live.step().written == ("inventory.json",)
    assert cluster.drain() == [["scontrol", "update", "nodename=gpu-k-2", "state=UNDRAIN"]]
    assert cluster.reconfigures() == 0


def test_a_drain_set_by_someone_else_is_left_alone(cluster):
    cluster.slurm.nodes[0] = slurm_node("gpu-k-1", "IDLE", "DRAIN", reason="maintenance by bob")
    assert cluster.drain() == []


def test_a_cordon_keeps_a_drain_set_by_someone_else_and_its_uncordon_never_undrains_it(cluster):
    """Issue 40 item 4: a health-check or operator DRAIN on a node that is then cordoned keeps its
    reason; the uncordon does not return the faulty node to service."""
    reason = "health check: /dev/shm too small"
    cluster.slurm.nodes[1] = slurm_node("gpu-k-2", "IDLE", "DRAIN", reason=reason)
    cluster.nodes[1]["spec"]["unschedulable"] = True
    assert cluster.live.step().written == ("inventory.json",)
    assert cluster.drain() == [], "someone else's drain is neither overwritten nor doubled"

    del cluster.nodes[1]["spec"]["unschedulable"]
    assert cluster.live.step().written == ("inventory.json",)
    assert cluster.drain() == [], "the uncordon leaves the health check's drain in place"


def test_a_node_that_gains_the_pool_labels_joins_in_its_switch_with_a_reconfigure(cluster):
    cluster.nodes.append(k8s("k-4", "leaf-b"))
    outcome = cluster.live.step()
    assert outcome.added == ("gpu-k-4",) and outcome.reconfigured and not outcome.error
    assert "SwitchName=leaf-b Nodes=gpu-k-[3-4]" in cluster.file("topology.conf")
    assert "NodeName=gpu-k-[1-4]" in cluster.file("slurm.conf")
    assert cluster.slurm.updates[:2] == [RECONFIGURE, ["scontrol", "ping"]], "reconfigure, then wait for slurmctld"
    assert cluster.live.step().written == (), "applied once"
    assert cluster.reconfigures() == 1


def test_a_changed_topology_label_moves_the_node(cluster):
    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-b"
    outcome = cluster.live.step()
    assert outcome.reconfigured and outcome.written == ("inventory.json", "topology.conf")
    topo = cluster.file("topology.conf")
    assert "SwitchName=leaf-a Nodes=gpu-k-1\n" in topo and "SwitchName=leaf-b Nodes=gpu-k-[2-3]" in topo


def test_an_idle_node_that_loses_the_labels_leaves_at_once(cluster):
    del cluster.nodes[2]["metadata"]["labels"]["pool"]
    outcome = cluster.live.step()
    assert outcome.removed == ("gpu-k-3",) and outcome.reconfigured
    assert "NodeName=gpu-k-[1-2] " in cluster.file("slurm.conf") and "leaf-b" not in cluster.file("topology.conf")


@pytest.mark.parametrize("how", ["loses-labels", "deleted"])
def test_a_node_with_a_job_stays_drained_until_the_job_ends_then_leaves(cluster, how):
    if how == "deleted":
        del cluster.nodes[2]
    else:
        del cluster.nodes[2]["metadata"]["labels"]["pool"]
    cluster.slurm.nodes[2] = slurm_node("gpu-k-3", "ALLOCATED", "CLOUD")
    outcome = cluster.live.step()
    assert outcome.kept == ("gpu-k-3",) and not outcome.removed and not outcome.error
    assert "NodeName=gpu-k-[1-3]" in cluster.file("slurm.conf")
    assert "SwitchName=leaf-b Nodes=gpu-k-3" in cluster.file("topology.conf")
    why = "left the pool" if how == "loses-labels" else "is gone"
    reason = f"kubernetes node k-3 {why}: it leaves Slurm once its job ends"
    assert cluster.inventory()["gpu-k-3"].unavailable == reason
    assert cluster.drain() == [["scontrol", "update", "nodename=gpu-k-3", "state=DRAIN", f"reason={reason}"]]
    cluster.slurm.nodes[2] = slurm_node("gpu-k-3", "ALLOCATED", "DRAIN", "CLOUD", reason=reason)
    assert cluster.live.step().kept == ("gpu-k-3",), "still busy: kept (a pass re-checks though the nodes did not change)"
    assert "NodeName=gpu-k-[1-3]" in cluster.file("slurm.conf")

    cluster.slurm.nodes[2] = slurm_node("gpu-k-3", "IDLE", "DRAIN", "CLOUD", reason=reason)
    outcome = cluster.live.step()
    assert outcome.removed == ("gpu-k-3",) and outcome.reconfigured
    assert "NodeName=gpu-k-[1-2] " in cluster.file("slurm.conf")
    assert cluster.live.step().written == ()


def test_a_restarted_loop_keeps_a_busy_leaving_node_from_the_running_inventory(cluster):
    del cluster.nodes[2]["metadata"]["labels"]["pool"]
    cluster.slurm.nodes[2] = slurm_node("gpu-k-3", "MIXED", "CLOUD")
    fresh = LiveNodes(SPEC, str(cluster.dir), cluster._list, cluster.slurm, Log("live-test"), reconfigure_wait=1)
    outcome = fresh.step()  # it never saw k-3 with the pool's labels
    assert outcome.kept == ("gpu-k-3",) and not outcome.error
    assert "NodeName=gpu-k-[1-3]" in cluster.file("slurm.conf") and "SwitchName=leaf-b Nodes=gpu-k-3" in cluster.file("topology.conf")
    assert cluster.inventory()["gpu-k-3"].unavailable.startswith("kubernetes node k-3 left the pool")


def test_a_reconfigure_never_waits_behind_a_boot_wait(cluster, tmp_path):
    """Issue 40 item 1: PrologSlurmctld's boot waits, served by the loop, would hold a reconfigure
    for RECONFIGURE_DEFER and then, once it ran, slurmctld (answering no RPC until every script it
    started ends) until ResumeTimeout. The reconfigure holds first: the waits end within a poll,
    it runs in the same pass, and the waits that start after it wait again."""
    import threading
    from types import SimpleNamespace

    from provisioner.elastic import prolog
    from provisioner.elastic.quiesce import Hold

    env = {"SLURMK8S_PROGRAM_SOCKET": str(tmp_path / "programs" / "programs.sock")}
    lines: list[str] = []
    ctx = SimpleNamespace(env=env, log=SimpleNamespace(write=lines.append))
    shared = prolog.SharedStates(read=lambda: [("gpu-k-1", "idle#"), ("gpu-k-2", "idle#")])  # booting for ever
    waits = [threading.Thread(target=prolog.run_wait, args=([str(job), node, "300", ""], ctx, shared), daemon=True)
             for job, node in ((1, "gpu-k-1"), (2, "gpu-k-2"))]
    for t in waits:
        t.start()
    cluster.live.hold = Hold.of(env)
    cluster.live.programs_running = lambda: sum(t.is_alive() for t in waits)
    time.sleep(0.3)
    assert cluster.live.programs_running() == 2, "the boot waits wait"

    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-b"
    t0 = time.monotonic()
    outcome = cluster.live.step()
    took = time.monotonic() - t0
    assert outcome.reconfigured and not outcome.deferred, outcome
    assert took < 2, f"the reconfigure waited {took:.1f}s behind the boot waits"
    assert cluster.reconfigures() == 1
    assert sorted(line.split(":")[0] + ":" + line.split(":")[1].split(" after")[0] for line in lines) == [
        "job 1 nodes gpu-k-1: released", "job 2 nodes gpu-k-2: released"], lines
    assert not Path(cluster.live.hold.path).exists(), "the hold ends with the reconfigure"
    again = threading.Thread(target=prolog.run_wait, args=(["3", "gpu-k-1", "0.5", ""], ctx, shared), daemon=True)
    again.start()
    again.join(5)
    assert [line for line in lines if line.startswith("job 3 nodes gpu-k-1: timeout")], "a later wait waits again"


def test_a_reconfigure_waits_for_the_power_saving_programs_running_then_goes_ahead(cluster):
    """Slurm 24.11's reconfigure waits, answering nothing, for every script slurmctld started; a
    suspend program polling sinfo meanwhile held both for 14 s (an e2e run). While the loop runs
    programs, the reconfigure waits (files unchanged, retried each pass), at most defer_max; a
    change needing no reconfigure (a cordon) is not held."""
    running, now = [1], [100.0]
    lines = []
    cluster.live.programs_running = lambda: running[0]
    cluster.live.clock = lambda: now[0]
    cluster.live.log = type("L", (), {"write": staticmethod(lines.append)})()
    before = {p.name: p.read_text() for p in cluster.dir.iterdir()}
    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-b"
    outcome = cluster.live.step()
    assert outcome.deferred and not outcome.reconfigured and not outcome.error and not outcome.written
    assert {p.name: p.read_text() for p in cluster.dir.iterdir()} == before and cluster.reconfigures() == 0
    assert [line for line in lines if "waits for 1 power-saving program(s)" in line], lines
    now[0] += 10
    assert cluster.live.step().deferred, "retried next pass, not forgotten"
    running[0] = 0  # the program ended: the next pass reconfigures
    now[0] += 10
    outcome = cluster.live.step()
    assert outcome.reconfigured and not outcome.deferred and cluster.reconfigures() == 1
    # a program that never ends holds a reconfigure for defer_max at most
    running[0] = 2
    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-a"
    assert cluster.live.step().deferred
    now[0] += cluster.live.defer_max
    outcome = cluster.live.step()
    assert outcome.reconfigured and cluster.reconfigures() == 2
    assert [line for line in lines if "reconfiguring with 2 power-saving program(s) still running" in line]
    # a cordon needs no reconfigure: not held by the programs
    cluster.nodes[0]["spec"]["unschedulable"] = True
    assert cluster.live.step().written == ("inventory.json",)
    # a change held, then undone before it was applied: a later change is held afresh
    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-b"
    assert cluster.live.step().deferred
    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-a"
    assert not cluster.live.step().deferred
    now[0] += 2 * cluster.live.defer_max
    cluster.nodes[1]["metadata"]["labels"][AWS + "3"] = "leaf-b"
    assert cluster.live.step().deferred and cluster.reconfigures() == 2


def test_a_refused_reconfigure_puts_the_old_files_back_and_is_retried(cluster):
    before = {p.name: p.read_text() for p in cluster.dir.iterdir()}
    cluster.nodes.append(k8s("k-4", "leaf-b"))
    cluster.slurm.fail_updates = True
    outcome = cluster.live.step()
    assert "scontrol reconfigure refused" in outcome.error and "previous files are back" in outcome.error
    assert {p.name: p.read_text() for p in cluster.dir.iterdir()} == before
    cluster.slurm.fail_updates = False
    assert cluster.live.step().added == ("gpu-k-4",), "retried on the next pass"


def test_a_disk_error_writing_the_files_puts_the_old_ones_back_and_the_loop_goes_on(cluster, monkeypatch):
    """A full or failing volume (ENOSPC, EIO) while the new files are written: an error of the pass,
    not an exception that stops the loop (a crash loop: every start hits the same disk); the files
    written so far are put back, no reconfigure, no pending mark, and the next pass tries again."""
    import errno

    from provisioner.livenodes import live as live_mod

    real = live_mod.write_files
    state = {"full": True}

    def write_some(files, conf_dir):
        if not state["full"]:
            return real(files, conf_dir)
        state["full"] = state["full"] == "always" and "always"  # the put back (same sizes) fits
        first = dict(list(files.items())[:1])
        real(first, conf_dir)  # one file made it before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(live_mod, "write_files", write_some)
    before = {p.name: p.read_text() for p in cluster.dir.iterdir()}
    cluster.nodes.append(k8s("k-4", "leaf-b"))
    outcome = cluster.live.step()
    assert "No space left on device" in outcome.error and "previous files are back" in outcome.error, outcome
    assert {p.name: p.read_text() for p in cluster.dir.iterdir()} == before
    assert cluster.reconfigures() == 0
    state["full"] = "always"  # the put back fails too: said so, and still no exception
    outcome = cluster.live.step()
    assert "putting the previous files back failed too" in outcome.error, outcome
    assert not (cluster.dir / live_mod.PENDING).exists() and cluster.reconfigures() == 0
    state["full"] = False
    assert cluster.live.step().added == ("gpu-k-4",), "retried on the next pass"


def test_nodes_that_give_no_valid_cluster_keep_the_running_configuration(cluster, tmp_path):
    spec = parse_spec({**SPEC.model_dump(mode="json"), "pools": [
        {"name": "gpu", "node_selector": {"pool": "gpu"}}, {"name": "other", "node_selector": {"rack": "r1"}}]})
    cluster.live.spec = spec
    before = {p.name: p.read_text() for p in cluster.dir.iterdir()}
    cluster.nodes[0]["metadata"]["labels"]["rack"] = "r1"  # now in both pools
    outcome = cluster.live.step()
    assert "running configuration is kept" in outcome.error and "matches both pool" in outcome.error
    assert {p.name: p.read_text() for p in cluster.dir.iterdir()} == before and cluster.slurm.updates == []


def test_an_api_failure_changes_nothing(cluster):
    def broken() -> list[dict]:
        raise OSError("connection refused")

    cluster.live.list_nodes = broken
    outcome = cluster.live.step()
    assert "cannot list the Kubernetes nodes" in outcome.error and cluster.slurm.updates == []


def test_a_lost_node_keeps_its_slurm_node_drained_though_kubernetes_taints_it(cluster):
    """The node controller taints a lost node node.kubernetes.io/unreachable (NoSchedule, NoExecute):
    seen in e2e, such a node was taken for one that left the pool and removed from slurm.conf. It
    stays, drained as NotReady, and comes back in service when Ready again."""
    lost = cluster.nodes[1]
    lost["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    lost["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                              {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    outcome = cluster.live.step()
    assert outcome.written == ("inventory.json",) and not outcome.removed and not outcome.reconfigured
    assert cluster.inventory()["gpu-k-2"].unavailable == "kubernetes node k-2 is NotReady"
    lost["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    lost["spec"]["taints"] = [{"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]
    cluster.live.step()
    assert cluster.inventory()["gpu-k-2"].unavailable == \
        "kubernetes node k-2 has taint node.kubernetes.io/memory-pressure:NoSchedule"
    lost["spec"]["taints"] = [{"key": "example.com/maintenance", "effect": "NoSchedule"}]
    assert cluster.live.step().removed == ("gpu-k-2",), "a taint of someone else's the pool does not tolerate"


def test_a_loop_that_stopped_between_the_files_and_the_reconfigure_reconfigures_when_it_starts(cluster):
    """The files are written first, then slurmctld is told: a loop killed in between (container
    restart) would find files that match the nodes and never tell slurmctld. The marker says so."""
    cluster.nodes.append(k8s("k-4", "leaf-b"))

    def killed(argv):  # the container dies inside `scontrol reconfigure`
        raise KeyboardInterrupt

    cluster.slurm.update = killed
    with pytest.raises(KeyboardInterrupt):
        cluster.live.step()
    assert "gpu-k-[1-4]" in cluster.file("slurm.conf")
    restarted = FakeSlurmClient(nodes=cluster.slurm.nodes)
    fresh = LiveNodes(SPEC, str(cluster.dir), cluster._list, restarted, Log("live-test"), reconfigure_wait=1)
    outcome = fresh.step()
    assert not outcome.error and RECONFIGURE in restarted.updates
    assert not (cluster.dir / ".reconfigure-pending").exists()
    assert fresh.step().written == () and restarted.updates.count(RECONFIGURE) == 1


def test_slurmctld_not_answering_about_a_leaving_node_keeps_everything(cluster):
    del cluster.nodes[2]["metadata"]["labels"]["pool"]
    cluster.slurm.fail_reads = True
    outcome = cluster.live.step()
    assert "cannot tell which leaving Slurm nodes still run jobs" in outcome.error
    assert "NodeName=gpu-k-[1-3]" in cluster.file("slurm.conf") and cluster.slurm.updates == []


def test_a_node_object_without_a_name_is_reported_not_a_crash(cluster):
    cluster.nodes.append({"metadata": {"labels": {"pool": "gpu"}}, "status": {}})
    outcome = cluster.live.step()
    assert "do not give a valid cluster" in outcome.error and cluster.slurm.updates == []


def test_reading_the_nodes_imports_no_generated_api(tmp_path):
    """slurmctld's start (and wake) renders from the nodes of a pinned pool: read through the raw
    seam, not CoreV1Api, whose import alone cost 0.6 s of the wake on the 2-core machine (issue 45).
    A real HTTP server answers /api/v1/nodes; the reader runs in a fresh interpreter."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.path)
            body = json.dumps({"kind": "NodeList", "items": [{"metadata": {"name": "k-1"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        code = ("import json, os, sys; from provisioner.livenodes.source import read_nodes; "
                "nodes = read_nodes(os.environ); "
                "print(json.dumps([[n['metadata']['name'] for n in nodes], "
                "sorted(m for m in sys.modules if m.startswith('kubernetes.client.api.'))]))")
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        done = subprocess.run([sys.executable, "-c", code], env={**env, "KUBECONFIG": str(kubeconfig)},
                              capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    names, apis = json.loads(done.stdout)
    assert names == ["k-1"] and seen == ["/api/v1/nodes"]
    assert apis == [], f"generated API modules imported: {apis}"
