"""Inventory, topology and rendering: what a valid input turns into."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from factories import AWS, aws_fleet, node
from provisioner.config import json_schema, load_spec, parse_spec, parse_duration, parse_quantity
from provisioner.generate import generate
from provisioner.inventory import Inventory, build_inventory, nodes_from_api
from provisioner.render import Site, expand, parse_topology_conf, write_files
from provisioner.topology import Switch, build_topology, validate_tree

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzd0lrWdoGzZqR7HcXXwVcEBjzC1D8dRp6oOC5eYIx0 a@b"


def test_durations_and_quantities():
    assert parse_duration("30m") == 1800 and parse_duration(45) == 45 and parse_duration("2h") == 7200
    assert parse_quantity("3920m") == pytest.approx(3.92)
    assert parse_quantity("16Gi") == 16 * 2**30 and parse_quantity("1000000Ki") == 1024000000


def test_schema_exports_every_section():
    schema = json_schema()
    assert set(schema["properties"]) >= {"name", "pools", "users", "storage", "elasticity", "topology", "images"}
    assert schema["$defs"]["Pool"]["additionalProperties"] is False


def test_example_specs_load():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        load_spec(path)


def test_pinned_inventory_sizes_gpus_features_and_states():
    spec = parse_spec({
        "name": "t",
        "pools": [{"name": "gpu", "node_selector": {"pool": "gpu"}, "feature_labels": ["zone"],
                   "reserve_cpu": "1", "reserve_memory": "2Gi"}],
    })
    nodes = [
        node("b.example", {"pool": "gpu", "zone": "z-1", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
             cpu="15800m", memory="64Gi", gpus=4),
        node("a.example", {"pool": "gpu"}, cpu="8", memory="16Gi", unschedulable=True),
        node("c.example", {"pool": "gpu"}, ready=False),
        node("other", {"pool": "cpu"}),
    ]
    inv = build_inventory(spec, nodes_from_api(nodes))
    assert inv.names == ["gpu-a", "gpu-b", "gpu-c"]  # sorted by Kubernetes name, whatever the API order
    b = inv["gpu-b"]
    assert (b.cpus, b.real_memory, b.gpus, b.gpu_type) == (14, 64 * 1024 - 2048, 4, "nvidia_a100_sxm4_80gb")
    assert b.gres == "gpu:nvidia_a100_sxm4_80gb:4" and b.features == ("gpu", "z-1") and b.k8s_node == "b.example"
    assert inv["gpu-a"].unavailable == "kubernetes node a.example is cordoned"
    assert inv["gpu-c"].unavailable == "kubernetes node c.example is NotReady"
    assert Inventory.from_json(json.loads(json.dumps(inv.to_json()))) == inv


def test_inventory_is_independent_of_api_order():
    spec = load_spec(ROOT / "examples" / "aws-gpu.yaml")
    fleet = aws_fleet(2, 3, 4)
    shuffled = list(fleet)
    random.Random(7).shuffle(shuffled)
    a = generate(spec, nodes_from_api(fleet))
    b = generate(spec, nodes_from_api(shuffled))
    assert a.files == b.files


def test_taints_tolerations_and_max_nodes():
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = nodes_from_api([node(f"n{i}", {"pool": "p"}, taints=[taint]) for i in range(3)])
    spec = parse_spec({"name": "t", "pools": [{"name": "p", "node_selector": {"pool": "p"}, "max_nodes": 2,
                                               "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}]})
    inv = build_inventory(spec, nodes)
    assert inv.names == ["p-n0", "p-n1"]
    assert [e.reason for e in inv.excluded] == ["pool max_nodes=2 reached"]


def test_slot_pool_names_are_stable_per_domain():
    spec = parse_spec({"name": "t", "pools": [{
        "name": "cpu", "mode": "slots", "cpus": 4, "memory": "8Gi", "domain_label": "topology.kubernetes.io/zone",
        "domains": [{"name": "zone-a", "count": 3}, {"name": "zone-b", "count": 2}]}],
        "topology": {"plugin": "tree", "levels": ["topology.kubernetes.io/zone"]}})
    result = generate(spec, [])
    assert result.inventory.names == ["cpu-zone-a-0", "cpu-zone-a-1", "cpu-zone-a-2", "cpu-zone-b-0", "cpu-zone-b-1"]
    assert result.inventory["cpu-zone-b-1"].real_memory == 8192
    switches = {s.name: s for s in result.topology.switches}
    assert switches["zone-a"].nodes == ("cpu-zone-a-0", "cpu-zone-a-1", "cpu-zone-a-2")
    assert switches["root"].switches == ("zone-a", "zone-b")


def test_unlabeled_nodes_stay_usable_under_their_own_switch():
    spec = parse_spec({"name": "t", "pools": [{"name": "p"}], "topology": {"preset": "aws"}})
    nodes = [node("n1", {f"{AWS}1": "t", f"{AWS}2": "s", f"{AWS}3": "l"}), node("n2", {f"{AWS}1": "t"})]
    topo = build_topology(spec, build_inventory(spec, nodes_from_api(nodes)))
    by_name = {s.name: s for s in topo.switches}
    assert by_name["unlabeled"].nodes == ("p-n2",)
    assert by_name["root"].switches == ("t", "unlabeled")
    assert by_name["l"].level == 0 and by_name["s"].level == 1 and by_name["t"].level == 2


def test_path_qualified_switch_names_for_repeating_racks():
    spec = parse_spec({"name": "t", "pools": [{"name": "p"}], "topology": {"preset": "zone-rack"}})
    zr = ("topology.kubernetes.io/zone", "topology.kubernetes.io/rack")
    nodes = [node(f"n{i}", {zr[0]: f"z{i % 2}", zr[1]: "r1"}) for i in range(4)]
    topo = build_topology(spec, build_inventory(spec, nodes_from_api(nodes)))
    assert sorted(s.name for s in topo.switches) == ["root", "z0", "z0_r1", "z1", "z1_r1"]


def test_validate_tree_catches_what_slurm_rejects():
    switches = [Switch("a", 1, switches=("b", "ghost")), Switch("b", 1, switches=("a",)), Switch("a", 0, nodes=("n1",)),
                Switch("empty", 0), Switch("leaf", 0, nodes=("n1", "stranger"))]
    messages = " | ".join(str(i) for i in validate_tree(switches, ["n1", "n2"]))
    for expected in ("duplicate switch name", "ghost", "cycle", "no nodes and no child switches", "stranger",
                     "also under switch", "under no switch"):
        assert expected in messages, expected


def test_rendered_topology_parses_back_to_the_same_tree():
    spec = load_spec(ROOT / "examples" / "aws-gpu.yaml")
    result = generate(spec, nodes_from_api(aws_fleet(3, 4, 5)))
    switches, _, _ = parse_topology_conf(result.files["topology.conf"])
    assert {(s.name, s.nodes, s.switches) for s in switches} == {
        (s.name, s.nodes, s.switches) for s in result.topology.switches}


def test_block_topology_defaults_base_size_to_smallest_block():
    spec = parse_spec({"name": "t", "pools": [{"name": "p"}], "topology": {"preset": "nvlink"}})
    nodes = [node(f"n{i}", {"nvidia.com/gpu.clique": "c1" if i < 4 else "c2"}) for i in range(7)]
    result = generate(spec, nodes_from_api(nodes))
    assert "BlockSizes=3\n" in result.files["topology.conf"]
    assert "BlockName=c1 Nodes=p-n[0-3]" in result.files["topology.conf"]


def test_write_files_is_all_or_nothing(tmp_path: Path):
    write_files({"a": "1", "b": "2"}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_hostlists_expand_to_inventory():
    spec = load_spec(ROOT / "examples" / "aws-gpu.yaml")
    result = generate(spec, nodes_from_api(aws_fleet(2, 2, 3)))
    line = next(l for l in result.files["slurm.conf"].splitlines() if l.startswith("NodeName="))
    assert sorted(expand(line.split()[0].split("=", 1)[1])) == sorted(result.inventory.names)


# ---------------------------------------------------------------- golden files

GOLDEN_CASES = {
    "aws-tree": (ROOT / "examples" / "aws-gpu.yaml", lambda: aws_fleet(2, 2, 2), Site()),
    "mixed-block": (GOLDEN / "mixed-block.yaml", lambda: [
        node(f"gpu-{i}.cluster.local", {"pool": "gpu", "nvidia.com/gpu.clique": f"clique-{i // 4}",
                                        "nvidia.com/gpu.product": "NVIDIA-GB200"}, cpu="72", memory="480Gi", gpus=4)
        for i in range(8)
    ] + [node("gpu-8.cluster.local", {"pool": "gpu"}, cpu="72", memory="480Gi", gpus=4, unschedulable=True)],
        Site("ctl", "ctl.slurm.svc", "/opt/bin")),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(case: str):
    spec_path, nodes, site = GOLDEN_CASES[case]
    files = generate(load_spec(spec_path), nodes_from_api(nodes()), site).files
    directory = GOLDEN / case
    if os.environ.get("UPDATE_GOLDEN") == "1":
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
    expected = {p.name: p.read_text() for p in directory.iterdir()}
    assert files == expected, "rendered files changed; inspect and rerun with UPDATE_GOLDEN=1 if intended"


def test_spec_reference_is_current():
    from provisioner.specdoc import spec_markdown

    assert (ROOT / "docs" / "spec.md").read_text() == spec_markdown(), "run: slurmk8s spec docs > docs/spec.md"


def test_nodesync_drains_unavailable_and_undrains_only_its_own():
    from provisioner.inventory import SlurmNode
    from provisioner.livenodes.drain import plan
    from provisioner.slurm.state import NodeStatus

    inv = Inventory((
        SlurmNode("a", "p", "p", 1, 1, unavailable="kubernetes node a is cordoned"),
        SlurmNode("b", "p", "p", 1, 1),
        SlurmNode("c", "p", "p", 1, 1),
        SlurmNode("d", "p", "p", 1, 1, unavailable="kubernetes node d is cordoned"),
    ))
    slurm = [
        {"name": "a", "state": ["IDLE", "CLOUD"], "reason": ""},
        {"name": "b", "state": ["IDLE", "DRAIN"], "reason": "kubernetes node b is NotReady"},
        {"name": "c", "state": ["IDLE", "DRAIN"], "reason": "health check: /dev/shm too small"},
        {"name": "d", "state": ["IDLE", "DRAIN"], "reason": "kubernetes node d is cordoned"},
    ]
    actions = plan(inv, [NodeStatus.from_json(n) for n in slurm])
    assert [(a.names, a.state) for a in actions] == [(("a",), "DRAIN"), (("b",), "UNDRAIN")]
    assert actions[0].argv() == ["scontrol", "update", "nodename=a", "state=DRAIN",
                                 "reason=kubernetes node a is cordoned"]
