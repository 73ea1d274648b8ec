"""Bad inputs: each must fail with an error naming the field and a fix, and write nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from factories import AWS, node, node_list
from provisioner.cli import app
from provisioner.accounts import RESERVED_IDS
from provisioner.config import parse_spec
from provisioner.errors import InventoryError, Problem, SpecError, TopologyError
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzd0lrWdoGzZqR7HcXXwVcEBjzC1D8dRp6oOC5eYIx0 a@b"

BASE: dict[str, Any] = {
    "name": "demo",
    "pools": [{"name": "cpu", "node_selector": {"pool": "cpu"}}],
    "users": [{"name": "alice", "uid": 2001, "ssh_keys": [KEY]}],
}


def tree_nodes(n: int = 4) -> list[dict[str, Any]]:
    return [node(f"n{i}", {"pool": "cpu", f"{AWS}1": "top", f"{AWS}2": f"sp{i // 2}", f"{AWS}3": f"lf{i // 2}"})
            for i in range(n)]


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    for path, value in changes.items():
        target = spec
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target.setdefault(k, {})
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return spec


def two_pools(**pool2: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    spec["pools"].append({"name": "gpu", "node_selector": {"pool": "gpu"}, **pool2})
    return spec


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], type[Problem], str]] = [
    # --- spec errors
    ("cluster name with capitals", spec_with(name="Demo"), tree_nodes(), SpecError, "name"),
    ("cluster name too long", spec_with(name="a" * 31), tree_nodes(), SpecError, "name"),
    ("unknown top-level field", spec_with(nodez=3), tree_nodes(), SpecError, "nodez"),
    ("typo inside a pool", spec_with(pools__0__node_selecter={"a": "b"}), tree_nodes(), SpecError, "pools[0].node_selecter"),
    ("no pools", spec_with(pools=[]), tree_nodes(), SpecError, "pools"),
    ("bad pool name", spec_with(pools__0__name="CPU_pool"), tree_nodes(), SpecError, "pools[0].name"),
    ("duplicate pool names", two_pools(name="cpu"), tree_nodes(), SpecError, "pools[1].name"),
    ("duplicate UIDs", spec_with(users=[{"name": "alice", "uid": 2001}, {"name": "bob", "uid": 2001}]),
     tree_nodes(), SpecError, "users[1].uid"),
    ("duplicate user names", spec_with(users=[{"name": "alice", "uid": 2001}, {"name": "alice", "uid": 2002}]),
     tree_nodes(), SpecError, "users[1].name"),
    ("system uid", spec_with(users=[{"name": "alice", "uid": 0}]), tree_nodes(), SpecError, "users[0].uid"),
    ("reserved user name", spec_with(users=[{"name": "slurm", "uid": 2001}]), tree_nodes(), SpecError, "users[0].name"),
    # the images' own accounts (accounts.IMAGE_USERS/IMAGE_GROUPS, checked against the images by
    # tests/integration/test_image_accounts.py): a spec account of the same name or id would merge
    # into it (its members join slurm's group, its files become the user's)
    ("group named like an image's system group", spec_with(groups=[{"name": "slurm", "gid": 64030}]),
     tree_nodes(), SpecError, "groups[0].name"),
    ("group reusing an image's system gid", spec_with(groups=[{"name": "ops", "gid": 64030}]),
     tree_nodes(), SpecError, "groups[0].gid"),
    ("group named like an image's low system group", spec_with(groups=[{"name": "users", "gid": 5000}]),
     tree_nodes(), SpecError, "groups[0].name"),
    ("group named like the REST user's group", spec_with(groups=[{"name": "slurmrestd", "gid": 5000}]),
     tree_nodes(), SpecError, "groups[0].name"),
    ("user with an image account's uid", spec_with(users=[{"name": "alice", "uid": 6820}]), tree_nodes(), SpecError,
     "users[0].uid"),
    ("user with the login agent's uid", spec_with(users=[{"name": "alice", "uid": 65532}]), tree_nodes(),
     SpecError, "users[0].uid"),
    ("user whose primary group is slurm's", spec_with(users=[{"name": "alice", "uid": 2001, "gid": 64030}]),
     tree_nodes(), SpecError, "users[0].gid"),
    ("user named like an image's system account", spec_with(users=[{"name": "www-data", "uid": 2001}]),
     tree_nodes(), SpecError, "users[0].name"),
    ("user named like an image's system group (their primary group)", spec_with(users=[{"name": "staff", "uid": 2001}]),
     tree_nodes(), SpecError, "users[0].name"),
    ("private key given as ssh key", spec_with(users=[{"name": "alice", "uid": 2001,
     "ssh_keys": ["-----BEGIN OPENSSH PRIVATE KEY----- abc"]}]), tree_nodes(), SpecError, "users[0].ssh_keys"),
    ("two keys in one ssh_keys item (an embedded newline: two authorized_keys lines)",
     spec_with(users=[{"name": "alice", "uid": 2001, "ssh_keys": [KEY + "\n" + KEY.replace("alice", "mallory")]}]),
     tree_nodes(), SpecError, "users[0].ssh_keys"),
    ("undefined extra group", spec_with(users=[{"name": "alice", "uid": 2001, "groups": ["ml"]}]),
     tree_nodes(), SpecError, "users[0].groups"),
    ("bad duration", spec_with(elasticity={"suspend_time": "ten minutes"}), tree_nodes(), SpecError,
     "elasticity.suspend_time"),
    ("resume timeout too short", spec_with(elasticity={"resume_timeout": 5}), tree_nodes(), SpecError, "elasticity"),
    ("idle teardown shorter than suspend", spec_with(elasticity={"suspend_time": 600, "idle_teardown": "5m"}),
     tree_nodes(), SpecError, "elasticity"),
    ("managed slurm.conf key in extra_conf", spec_with(slurm={"extra_conf": {"SelectType": "select/linear"}}),
     tree_nodes(), SpecError, "slurm.extra_conf"),
    ("default partition unknown", spec_with(slurm={"default_partition": "nope"}), tree_nodes(), SpecError,
     "slurm.default_partition"),
    ("bad quantity", spec_with(pools__0__reserve_memory="lots"), tree_nodes(), SpecError, "pools[0].reserve_memory"),
    ("slot pool without size", spec_with(pools=[{"name": "s", "mode": "slots", "domains": [{"name": "a", "count": 2}]}]),
     [], SpecError, "pools[0]"),
    ("pinned pool with slot fields", spec_with(pools__0__cpus=4), tree_nodes(), SpecError, "pools[0]"),
    ("tree without levels", spec_with(topology={"plugin": "tree"}), tree_nodes(), SpecError, "topology"),
    ("block sizes not power-of-two multiples", spec_with(topology={"preset": "nvlink", "block_sizes": [2, 6]}),
     tree_nodes(), SpecError, "topology"),
    ("block sizes on a tree", spec_with(topology={"preset": "aws", "block_sizes": [2]}), tree_nodes(), SpecError,
     "topology"),
    ("bad label key in levels", spec_with(topology={"plugin": "tree", "levels": ["has space/x"]}), tree_nodes(),
     SpecError, "topology.levels"),
    ("nccl env not a fabric variable", spec_with(pools__0__network={"nccl_env": {"PATH": "/x"}}), tree_nodes(),
     SpecError, "pools[0].network.nccl_env"),
    ("nccl env value on two lines (TaskProlog lines)",
     spec_with(pools__0__network={"nccl_env": {"NCCL_DEBUG": "WARN\nexport LD_PRELOAD=/x"}}), tree_nodes(),
     SpecError, "pools[0].network.nccl_env"),
    ("node_port without NodePort", spec_with(login={"node_port": 30022}), tree_nodes(), SpecError, "login"),
    # --- inventory errors
    ("pool selects no node", spec_with(pools__0__node_selector={"pool": "none"}), tree_nodes(), InventoryError,
     "pools[0].node_selector"),
    ("node in two pools", two_pools(node_selector={"pool": "cpu"}, name_prefix="g-"), tree_nodes(), InventoryError,
     "pools[1].node_selector"),
    ("names collide after sanitising", spec_with(pools__0__name_from="full"), [node("a.b", {"pool": "cpu"}), node("a-b", {"pool": "cpu"})],
     InventoryError, "pools[0].name_from"),
    ("short names collide across domains", spec_with(),
     [node("n1.zone-a.example", {"pool": "cpu"}), node("n1.zone-b.example", {"pool": "cpu"})],
     InventoryError, "pools[0].name_from"),
    ("oversize node name", spec_with(pools__0__name_from="full"), [node("x" * 70 + ".example", {"pool": "cpu"})],
     InventoryError, "pools[0].name_prefix"),
    ("every node too small", spec_with(), [node("tiny", {"pool": "cpu"}, cpu="500m")], InventoryError,
     "pools[0].node_selector"),
    ("every node tainted", spec_with(), [node("t", {"pool": "cpu"}, taints=[{"key": "gpu", "value": "x",
     "effect": "NoSchedule"}])], InventoryError, "pools[0].node_selector"),
    ("node listed twice", spec_with(), [node("n1", {"pool": "cpu"}), node("n1", {"pool": "cpu"})], InventoryError,
     "nodes[1]"),
    ("node without a name", spec_with(), [{"metadata": {}, "status": {}}], InventoryError, "nodes[0]"),
    # --- topology errors
    ("switch with two parents", spec_with(topology={"preset": "aws"}),
     [node("n1", {"pool": "cpu", f"{AWS}1": "t", f"{AWS}2": "sA", f"{AWS}3": "leaf"}),
      node("n2", {"pool": "cpu", f"{AWS}1": "t", f"{AWS}2": "sB", f"{AWS}3": "leaf"})], TopologyError, "nodes.n2"),
    ("label values collide after sanitising", spec_with(topology={"preset": "aws"}),
     [node("n1", {"pool": "cpu", f"{AWS}1": "t", f"{AWS}2": "s", f"{AWS}3": "rack 1"}),
      node("n2", {"pool": "cpu", f"{AWS}1": "t", f"{AWS}2": "s", f"{AWS}3": "rack_1"})], TopologyError, "nodes.n2"),
    ("same switch name on two levels", spec_with(topology={"preset": "aws"}),
     [node("n1", {"pool": "cpu", f"{AWS}1": "x", f"{AWS}2": "x", f"{AWS}3": "leaf"})], TopologyError,
     "topology.switches.x"),
    ("unlabeled nodes refused", spec_with(topology={"preset": "aws", "unlabeled": "error"}),
     [node("n1", {"pool": "cpu"})], TopologyError, "nodes.n1"),
    ("block smaller than base size", spec_with(topology={"preset": "nvlink", "block_sizes": [4]}),
     [node(f"n{i}", {"pool": "cpu", "nvidia.com/gpu.clique": "c1" if i < 4 else "c2"}) for i in range(6)],
     TopologyError, "topology.block_sizes"),
    ("block size beyond node count", spec_with(topology={"preset": "nvlink", "block_sizes": [2, 8]}),
     [node(f"n{i}", {"pool": "cpu", "nvidia.com/gpu.clique": f"c{i // 2}"}) for i in range(4)],
     TopologyError, "topology.block_sizes"),
    ("block label value reserved", spec_with(topology={"preset": "nvlink"}),
     [node("n1", {"pool": "cpu", "nvidia.com/gpu.clique": "unlabeled"})], TopologyError, "topology.block_label"),
    ("tier labels with a gap refused", spec_with(topology={"preset": "topograph-fabric", "unlabeled": "error"}),
     [node("n1", {"pool": "cpu", "fabric.topograph.run/tier-0": "leaf", "fabric.topograph.run/tier-2": "core"})],
     TopologyError, "nodes.n1"),
    ("tier prefix on blocks", spec_with(topology={"preset": "nvlink", "tier_prefix": "fabric.topograph.run/tier-"}),
     tree_nodes(), SpecError, "topology"),
]


@pytest.mark.parametrize("spec,nodes,kind,field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_field_and_fix(spec, nodes, kind, field):
    with pytest.raises(kind) as info:
        generate(parse_spec(spec), nodes_from_api(nodes))
    err = info.value
    assert any(field in f for f in err.fields), f"expected an issue on {field!r}, got {err}"
    assert all(issue.fix for issue in err.issues), f"an issue lacks a fix: {err}"


def test_there_are_at_least_25_bad_inputs():
    assert len(CASES) >= 25


@pytest.mark.parametrize("spec,nodes,kind,field", [c[1:] for c in CASES[::6]], ids=[c[0] for c in CASES[::6]])
def test_cli_writes_nothing_on_bad_input(tmp_path: Path, spec, nodes, kind, field):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps(node_list(nodes)))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["render", "--spec", str(spec_file), "--nodes", str(nodes_file),
                                      "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert field in result.output and "Fix:" in result.output
    assert not out.exists() or not any(out.iterdir())


def test_a_reserved_id_is_refused_naming_every_account_to_avoid():
    """The message is made from accounts.py's tables, so it names what the check refuses."""
    with pytest.raises(SpecError) as info:
        parse_spec(spec_with(users=[{"name": "alice", "uid": 64031}]))
    message = str(info.value)
    assert "uid 64031 belongs to a system account of the images" in message, message
    for xid in sorted(x for x in RESERVED_IDS if x >= 1000):
        assert f" {xid}" in message, (xid, message)
    assert "mysql 64031" in message and "the login agent 65532" in message and "nobody/nogroup 65534" in message
