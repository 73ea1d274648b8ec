"""Unit tests for the local cluster's extra real nodes: layout, parsing, rendering (no cluster, no root)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import tomllib
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.cli import app
from provisioner.localk8s import nodehost
from provisioner.localk8s.cli import node_spec_from_args
from provisioner.localk8s.kwok import KwokNodeError
from provisioner.localk8s.nodes import (
    CLUSTER_CIDR,
    EXTRA_NODE_LABEL,
    MAX_SLOT,
    POD_TO_POD_RULE,
    NodeError,
    NodeSpec,
    Taint,
    allocate_slot,
    extra_node_names,
    image_record_name,
    is_kubelet_label,
    kubelet_argv,
    labels_patch,
    layout,
    make_spec,
    node_rules,
    normalize_image,
    parse_labels_file,
    parse_taint,
    pod_to_pod_position,
    registration_labels,
    render_cni_conflist,
    render_containerd_toml,
    render_kubeconfig,
    render_kubelet_config,
    status_patch,
)

DEV_TAINT = Taint("slurmk8s.io/dev-node", "true", "NoSchedule")


def all_layouts(tmp_path):
    return [layout(f"n{slot}", slot, tmp_path) for slot in range(1, MAX_SLOT + 1)]


# ---- allocation ------------------------------------------------------------------------------------
def test_slots_are_the_smallest_free_and_reused_after_a_remove():
    assert allocate_slot([]) == 1
    assert allocate_slot([1, 2, 4]) == 3
    assert allocate_slot([2]) == 1
    with pytest.raises(NodeError, match="slots are in use"):
        allocate_slot(range(1, MAX_SLOT + 1))
    with pytest.raises(NodeError):
        layout("x", 0, "/tmp")          # slot 0 is node 1's


def test_every_slot_has_its_own_cidr_bridge_ports_socket_and_cgroup(tmp_path):
    lays = all_layouts(tmp_path)
    for attr in ("pod_cidr", "bridge", "kubelet_port", "healthz_port", "socket", "state_dir", "cgroup_root",
                 "cni_network", "dir"):
        values = [getattr(lay, attr) for lay in lays]
        assert len(set(values)) == len(values), attr
    ports = {p for lay in lays for p in (lay.kubelet_port, lay.healthz_port)}
    assert len(ports) == 2 * MAX_SLOT
    # node 1, the control plane and kwok use 10247-10259; kube-proxy 10249/10256
    assert not ports & set(range(10247, 10260))
    nets = [ipaddress.ip_network(lay.pod_cidr) for lay in lays]
    node1 = ipaddress.ip_network("198.18.0.0/24")
    kwok = ipaddress.ip_network("198.18.64.0/18")
    for net in nets:
        assert net.subnet_of(ipaddress.ip_network(CLUSTER_CIDR))
        assert not net.overlaps(node1) and not net.overlaps(kwok)
    assert all(lay.bridge != "cni0" for lay in lays)
    # the containerd socket path stays far below the 108-byte limit of a unix socket
    assert max(len(str(lay.socket)) for lay in lays) < 100


def test_up_names_nodes_after_node_one():
    assert extra_node_names("localk8s", 1) == []
    assert extra_node_names("localk8s", 3) == ["localk8s-2", "localk8s-3"]
    with pytest.raises(NodeError):
        extra_node_names("localk8s", 0)


# ---- parsing -------------------------------------------------------------------------------------------
def test_parse_taint():
    assert parse_taint("slurmk8s.io/dev-node=true:NoSchedule") == DEV_TAINT
    assert parse_taint("gpu:NoExecute") == Taint("gpu", "", "NoExecute")
    assert str(parse_taint("gpu:NoExecute")) == "gpu:NoExecute"
    for bad, match in (("gpu", "EFFECT"), ("gpu=x:Sometimes", "EFFECT"), ("bad key!=x:NoSchedule", "label key")):
        with pytest.raises(KwokNodeError, match=match):
            parse_taint(bad)


def test_labels_file_as_yaml_mapping_or_key_value_lines():
    assert parse_labels_file("topology.kubernetes.io/zone: z1\nnvidia.com/gpu.present: true\nempty:\n") == {
        "topology.kubernetes.io/zone": "z1", "nvidia.com/gpu.present": "true", "empty": ""}
    assert parse_labels_file('{"a": "b", "n": 3}') == {"a": "b", "n": "3"}
    text = "# GKE-like\ncloud.google.com/gke-nodepool=pool-a\n\nnetwork.topology.nvidia.com/block=b1\n"
    assert parse_labels_file(text) == {"cloud.google.com/gke-nodepool": "pool-a",
                                       "network.topology.nvidia.com/block": "b1"}
    with pytest.raises(NodeError, match="dict value"):
        parse_labels_file("a: {b: c}\n")
    with pytest.raises(KwokNodeError, match="not KEY=VALUE"):
        parse_labels_file("just words\n")


def test_make_spec_validates_name_labels_and_resources():
    spec = make_spec("gpu-1", {"topology.kubernetes.io/zone": "z1"}, {"example.com/gpu": "4"}, [DEV_TAINT])
    assert spec.resources == {"example.com/gpu": "4"}
    for name in ("Upper", "x" * 64):
        with pytest.raises(KwokNodeError, match="node name"):
            make_spec(name, {}, {}, [])
    with pytest.raises(NodeError, match="domain of its own"):
        make_spec("n", {}, {"gpu": "4"}, [])
    with pytest.raises(NodeError, match="domain of its own"):
        make_spec("n", {}, {"kubernetes.io/gpu": "4"}, [])
    with pytest.raises(KwokNodeError, match="quantity"):
        make_spec("n", {}, {"example.com/gpu": "four"}, [])
    with pytest.raises(KwokNodeError, match="label value"):
        make_spec("n", {"a": "-x"}, {}, [])


def test_spec_round_trips_through_node_json():
    spec = make_spec("n", {"b": "2", "a": "1"}, {"example.com/gpu": "4"}, [DEV_TAINT])
    assert NodeSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_cli_arguments_make_the_spec_flags_win_over_the_file(tmp_path):
    f = tmp_path / "labels.yaml"
    f.write_text("topology.kubernetes.io/zone: z1\nrack: r1\n")
    spec = node_spec_from_args("n2", ["rack=r9"], f, ["example.com/gpu=4"], ["slurmk8s.io/dev-node=true:NoSchedule"])
    assert spec.labels == {"topology.kubernetes.io/zone": "z1", "rack": "r9"}
    assert spec.resources == {"example.com/gpu": "4"}
    assert spec.taints == (DEV_TAINT,)


def test_cli_rejects_bad_arguments_before_touching_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALK8S_ROOT", str(tmp_path))
    monkeypatch.setenv("SLURMK8S_BIN", str(tmp_path / "bin"))
    runner = CliRunner()
    result = runner.invoke(app, ["cluster", "node", "add", "Bad_Name"])
    assert result.exit_code == 2 and "node name" in result.output
    result = runner.invoke(app, ["cluster", "node", "add", "n2", "--taint", "x=y:Never"])
    assert result.exit_code == 2 and "EFFECT" in result.output
    result = runner.invoke(app, ["cluster", "up", "--nodes", "0"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["cluster", "node", "stop", "nosuch"])
    assert result.exit_code == 1 and "no extra node 'nosuch'" in result.output


# ---- what the kubelet and the API get -------------------------------------------------------------------
def test_kubelet_label_rules():
    assert is_kubelet_label("topology.kubernetes.io/zone")
    assert is_kubelet_label("node.kubernetes.io/instance-type")
    assert is_kubelet_label("cloud.google.com/gke-nodepool")
    assert is_kubelet_label("plain")
    assert not is_kubelet_label("node-role.kubernetes.io/worker")
    assert not is_kubelet_label("example.k8s.io/x")


def test_registration_labels_leave_the_refused_ones_to_the_api():
    spec = make_spec("n", {"node-role.kubernetes.io/worker": "", "topology.kubernetes.io/zone": "z1"}, {}, [])
    assert registration_labels(spec) == {EXTRA_NODE_LABEL: "extra", "topology.kubernetes.io/zone": "z1"}
    assert labels_patch(spec)["metadata"]["labels"]["node-role.kubernetes.io/worker"] == ""
    assert labels_patch(spec)["metadata"]["labels"][EXTRA_NODE_LABEL] == "extra"


def test_status_patch_sets_capacity_and_allocatable():
    assert status_patch(make_spec("n", {}, {}, [])) == {}
    patch = status_patch(make_spec("n", {}, {"example.com/gpu": "4"}, []))
    assert patch == {"status": {"capacity": {"example.com/gpu": "4"}, "allocatable": {"example.com/gpu": "4"}}}


# ---- rendered config ---------------------------------------------------------------------------------------
def test_containerd_config_is_separate_per_node(tmp_path):
    lay = layout("localk8s-2", 1, tmp_path)
    cfg = tomllib.loads(render_containerd_toml(lay))
    assert cfg["root"] == str(tmp_path / "nodes/localk8s-2/containerd")
    assert cfg["state"] == "/run/slurmk8s-containerd-1"
    assert cfg["grpc"]["address"] == "/run/slurmk8s-containerd-1/containerd.sock"
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["cni"]["conf_dir"] == str(tmp_path / "nodes/localk8s-2/cni/net.d")
    # the default runc root /run/containerd/runc is shared by every containerd of the host
    assert cri["containerd"]["runtimes"]["runc"]["options"]["Root"] == "/run/slurmk8s-containerd-1/runc"


def test_cni_conflist_has_its_own_bridge_subnet_and_no_masquerade(tmp_path):
    conf = json.loads(render_cni_conflist(layout("n", 5, tmp_path)))
    bridge = conf["plugins"][0]
    assert conf["name"] == "slurmk8s-5"
    assert bridge["bridge"] == "cni5" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "198.18.5.0/24"}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "nodes/n/cni/ipam")


def test_kubelet_config_ports_cgroup_root_and_taints(tmp_path):
    lay = layout("localk8s-3", 2, tmp_path)
    spec = make_spec("localk8s-3", {}, {}, [DEV_TAINT])
    cfg = yaml.safe_load(render_kubelet_config(lay, spec, ca_file="/ca.crt", cgroup_v1=True))
    assert (cfg["port"], cfg["healthzPort"], cfg["readOnlyPort"]) == (10354, 10355, 0)
    assert cfg["cgroupRoot"] == "/slurmk8s-node-2"
    assert cfg["containerRuntimeEndpoint"] == "unix:///run/slurmk8s-containerd-2/containerd.sock"
    assert cfg["podLogsDir"] == str(tmp_path / "nodes/localk8s-3/pod-logs")
    assert cfg["registerWithTaints"] == [{"key": "slurmk8s.io/dev-node", "effect": "NoSchedule", "value": "true"}]
    assert cfg["failCgroupV1"] is False
    cfg = yaml.safe_load(render_kubelet_config(lay, make_spec("localk8s-3", {}, {}, []), ca_file="/ca.crt",
                                               cgroup_v1=False))
    assert "failCgroupV1" not in cfg and "registerWithTaints" not in cfg


def test_kubelet_argv(tmp_path):
    lay = layout("localk8s-2", 1, tmp_path)
    argv = kubelet_argv(lay, make_spec("localk8s-2", {"rack": "r1"}, {}, []), kubelet="/bin/kubelet",
                        node_ip="192.0.2.2")
    assert argv[0] == "/bin/kubelet"
    assert "--hostname-override=localk8s-2" in argv and "--node-ip=192.0.2.2" in argv
    assert f"--root-dir={tmp_path}/nodes/localk8s-2/kubelet" in argv
    assert f"--node-labels={EXTRA_NODE_LABEL}=extra,rack=r1" in argv


def test_kubeconfig_embeds_the_node_credentials():
    cfg = yaml.safe_load(render_kubeconfig("https://192.0.2.2:6443", b"CA", b"CERT", b"KEY", "system:node:n"))
    assert cfg["clusters"][0]["cluster"]["server"] == "https://192.0.2.2:6443"
    assert base64.b64decode(cfg["users"][0]["user"]["client-key-data"]) == b"KEY"
    assert cfg["users"][0]["name"] == "system:node:n"


def test_iptables_rules(tmp_path):
    rules = node_rules(layout("n", 3, tmp_path))
    assert ("filter", "FORWARD", ["-i", "cni3", "-j", "ACCEPT"]) in rules
    assert ("nat", "POSTROUTING", ["-s", "198.18.3.0/24", "!", "-d", CLUSTER_CIDR, "-j", "MASQUERADE"]) in rules
    listing = ("-P POSTROUTING ACCEPT\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\n"
               '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING\n'
               "-A POSTROUTING -s 198.18.0.2/32 -j CNI-5b894edaf4a0efce1748abab\n")
    assert pod_to_pod_position(listing) == 3     # after KUBE-POSTROUTING, before node 1's CNI-* chains
    assert pod_to_pod_position("-P POSTROUTING ACCEPT\n") == 1
    assert POD_TO_POD_RULE[2][-1] == "RETURN"


@pytest.mark.parametrize("ref, want", [
    ("nginx", "docker.io/library/nginx:latest"),
    ("slurmk8s/slurmd:dev", "docker.io/slurmk8s/slurmd:dev"),
    ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
    ("localhost:5000/x", "localhost:5000/x:latest"),
    ("a/b@sha256:00", "docker.io/a/b@sha256:00"),
])
def test_normalize_image(ref, want):
    assert normalize_image(ref) == want


def test_image_record_name():
    assert image_record_name("docker.io/slurmk8s/slurmd:dev") == "docker.io_slurmk8s_slurmd_dev.id"


# ---- host helpers that need no root ---------------------------------------------------------------------------
def test_ready_needs_a_heartbeat_since_the_kubelet_start():
    beat = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    node = SimpleNamespace(status=SimpleNamespace(conditions=[
        SimpleNamespace(type="Ready", status="True", last_heartbeat_time=beat)]))
    assert nodehost.ready_since(node, beat.timestamp())
    assert nodehost.ready_since(node, 0)
    assert not nodehost.ready_since(node, beat.timestamp() + 5)
    node.status.conditions[0].status = "Unknown"
    assert not nodehost.ready_since(node, 0)


def test_node_ip_from_the_api_server_url():
    assert nodehost.node_ip_of("https://192.0.2.2:6443") == "192.0.2.2"
    assert nodehost.node_ip_of("https://[2001:db8::1]:6443") == "2001:db8::1"


def test_known_nodes_reads_node_json(tmp_path):
    host = nodehost.Host(root=tmp_path, bin_dir=tmp_path / "bin")
    assert nodehost.known_nodes(host) == []
    spec = make_spec("n2", {"a": "b"}, {"example.com/gpu": "1"}, [DEV_TAINT])
    nodehost.save_spec(layout("n2", 4, tmp_path), spec)
    [(lay, got)] = nodehost.known_nodes(host)
    assert (lay.name, lay.slot, got) == ("n2", 4, spec)
    with pytest.raises(nodehost.NodeHostError, match="extra nodes: n2"):
        nodehost.find_node(host, "n3")
