"""NVIDIA Topograph's two label schemes and the presets that read them (golden topology.conf files).

Topograph before 1.0 labelled nodes ``network.topology.nvidia.com/{datacenter,spine,block}`` (a
three-level tree) and ``network.topology.nvidia.com/accelerator`` (the NVLink domain). Topograph 1.0
writes ``fabric.topograph.run/tier-N`` instead, any number of tiers, tier-0 the switch nearest the
node ("fabric tier 0 is closest to the compute node, and tier numbers increase outwards",
docs/reference/node-labels.md of NVIDIA/topograph v1.0.0), and ``accelerator.topograph.run/domain``
(+ an optional ``sub-domain``). An upgrade leaves the older labels on the nodes, stale.

Each golden case is a directory under tests/golden/topograph/: the rendered topology.conf and the
notices the render prints (notices.txt, empty when none). UPDATE_GOLDEN=1 rewrites them.
"""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from typer.testing import CliRunner

from factories import node, node_list
from provisioner.livenodes.render import render_files
from provisioner.cli import app
from provisioner.config import TOPOLOGY_PRESETS, Topology, parse_spec
from provisioner.errors import SpecError, TopologyError
from provisioner.generate import Generated, generate
from provisioner.inventory import nodes_from_api

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "topograph"

OLD = "network.topology.nvidia.com/"
TIER = "fabric.topograph.run/tier-"
DOMAIN = "accelerator.topograph.run/domain"
SUB_DOMAIN = "accelerator.topograph.run/sub-domain"


def old(datacenter: str, spine: str, leaf: str) -> dict[str, str]:
    """Topograph before 1.0: three fixed levels, the leaf switch is `block`."""
    return {f"{OLD}datacenter": datacenter, f"{OLD}spine": spine, f"{OLD}block": leaf}


def tiers(*switches: str) -> dict[str, str]:
    """Topograph 1.0: switches nearest the node first (tier-0 is the leaf)."""
    return {f"{TIER}{n}": s for n, s in enumerate(switches)}


def gpu(i: int, labels: dict[str, str]) -> dict[str, Any]:
    return node(f"gpu-{i}", {"pool": "gpu", **labels}, gpus=4)


def spec_for(preset: str, **topology: Any) -> Any:
    return parse_spec({"name": "topo", "pools": [{"name": "gpu", "node_selector": {"pool": "gpu"}}],
                       "topology": {"preset": preset, **topology}})


def render(preset: str, nodes: list[dict[str, Any]], **topology: Any) -> Generated:
    return generate(spec_for(preset, **topology), nodes_from_api(nodes))


# ---------------------------------------------------------------- fleets

def old_fleet() -> list[dict[str, Any]]:
    """8 nodes, 4 leaves under 2 spines under one datacenter: older labels only."""
    return [gpu(i, old("dc1", f"spine{i // 4}", f"leaf{i // 2}")) for i in range(8)]


def two_tier_fleet() -> list[dict[str, Any]]:
    """6 nodes, 3 leaves under one spine: tier-0 and tier-1 only."""
    return [gpu(i, tiers(f"leaf{i // 2}", "spine0")) for i in range(6)]


def three_tier_fleet() -> list[dict[str, Any]]:
    """8 nodes, 4 leaves under 2 spines under one core: tier-0..tier-2."""
    return [gpu(i, tiers(f"leaf{i // 2}", f"spine{i // 4}", "core0")) for i in range(8)]


def upgraded_fleet() -> list[dict[str, Any]]:
    """After an upgrade to Topograph 1.0: the 1.0 tiers, and the older labels still there, stale
    (an older, different discovery: the values disagree, so using them would give another tree)."""
    return [gpu(i, {**tiers(f"leaf{i // 2}", f"spine{i // 4}", "core0"), **old("dc-old", "spine-old", f"blk{i % 2}")})
            for i in range(8)]


def half_relabelled_fleet() -> list[dict[str, Any]]:
    """A relabelling half done: nodes 0-3 carry the 1.0 tiers, nodes 4-5 still only the older labels
    (same switches, named the same by both schemes, so they join the same tree)."""
    return ([gpu(i, tiers(f"leaf{i // 2}", "spine0", "core0")) for i in range(4)]
            + [gpu(i, old("core0", "spine0", f"leaf{i // 2}")) for i in range(4, 6)])


def mixed_depth_fleet() -> list[dict[str, Any]]:
    """Nodes with 3 tiers (under core0), nodes with 2 (a spine with no core above it), a node with
    a gap (tier-0 and tier-2, no tier-1) and one without labels: the last two go under `unlabeled`."""
    return ([gpu(i, tiers(f"leaf{i // 2}", "spine0", "core0")) for i in range(4)]
            + [gpu(i, tiers(f"leaf{i // 2}", "spine9")) for i in range(4, 8)]
            + [gpu(8, {f"{TIER}0": "leaf4", f"{TIER}2": "core0"}), gpu(9, {})])


def old_nvlink_fleet() -> list[dict[str, Any]]:
    return [gpu(i, {f"{OLD}accelerator": f"nvl{i // 4}"}) for i in range(8)]


def accelerator_fleet() -> list[dict[str, Any]]:
    """Two NVLink domains of 4 nodes, each split into two sub-domains of 2 (ignored)."""
    return [gpu(i, {DOMAIN: f"nvl{i // 4}", SUB_DOMAIN: f"nvl{i // 4}.rack{i // 2}"}) for i in range(8)]


def upgraded_nvlink_fleet() -> list[dict[str, Any]]:
    return [gpu(i, {DOMAIN: f"nvl{i // 4}", f"{OLD}accelerator": f"old-clique{i % 2}"}) for i in range(8)]


GOLDEN_CASES: dict[str, tuple[str, Callable[[], list[dict[str, Any]]]]] = {
    "topograph-old-labels": ("topograph", old_fleet),
    "topograph-fabric-2-tiers": ("topograph-fabric", two_tier_fleet),
    "topograph-fabric-3-tiers": ("topograph-fabric", three_tier_fleet),
    "topograph-new-labels": ("topograph", three_tier_fleet),
    "topograph-both-labels": ("topograph", upgraded_fleet),
    "topograph-half-relabelled": ("topograph", half_relabelled_fleet),
    "topograph-mixed-depth": ("topograph", mixed_depth_fleet),
    "topograph-nvlink-old-labels": ("topograph-nvlink", old_nvlink_fleet),
    "topograph-nvlink-new-labels": ("topograph-nvlink", accelerator_fleet),
    "topograph-accelerator": ("topograph-accelerator", accelerator_fleet),
    "topograph-nvlink-both-labels": ("topograph-nvlink", upgraded_nvlink_fleet),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_topograph(case: str):
    preset, fleet = GOLDEN_CASES[case]
    gen = render(preset, fleet())
    got = {"topology.conf": gen.files["topology.conf"], "notices.txt": "".join(f"{n}\n" for n in gen.topology.notices)}
    directory = GOLDEN / case
    if os.environ.get("UPDATE_GOLDEN") == "1":
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (directory / name).write_text(text)
    expected = {p.name: p.read_text() for p in directory.iterdir()}
    assert got == expected, "rendered topology changed; inspect and rerun with UPDATE_GOLDEN=1 if intended"


# ---------------------------------------------------------------- what the goldens stand for

def by_name(gen: Generated) -> dict[str, Any]:
    return {s.name: s for s in gen.topology.switches}


def test_older_labels_alone_give_the_same_file_with_every_preset_that_reads_them():
    """`topograph` reads a cluster that was never upgraded exactly as before; so does the explicit
    older scheme."""
    auto, legacy = render("topograph", old_fleet()), render("topograph-legacy", old_fleet())
    assert auto.files["topology.conf"] == legacy.files["topology.conf"]
    assert auto.topology.notices == legacy.topology.notices == ()
    auto, legacy = render("topograph-nvlink", old_nvlink_fleet()), render("topograph-legacy-nvlink", old_nvlink_fleet())
    assert auto.files["topology.conf"] == legacy.files["topology.conf"] and auto.topology.notices == ()


def test_tier_0_is_the_leaf_and_the_highest_tier_the_top():
    switches = by_name(render("topograph-fabric", three_tier_fleet()))
    assert switches["leaf0"].level == 0 and switches["leaf0"].nodes == ("gpu-gpu-0", "gpu-gpu-1")
    assert switches["spine0"].level == 1 and switches["spine0"].switches == ("leaf0", "leaf1")
    assert switches["core0"].level == 2 and switches["core0"].switches == ("spine0", "spine1")
    assert "root" not in switches  # one top: nothing to join


def test_new_labels_win_over_stale_ones_and_the_notice_names_the_nodes():
    gen = render("topograph", upgraded_fleet())
    assert gen.files["topology.conf"] == render("topograph-fabric", three_tier_fleet()).files["topology.conf"]
    (notice,) = gen.topology.notices
    text = str(notice)
    assert "8 node(s) (gpu-0, gpu-1, gpu-2, gpu-3, gpu-4 and 3 more)" in text
    assert f"placed by {TIER}N" in text and f"{OLD}{{datacenter,spine,block}}" in text
    assert f"kubectl label node NAME {OLD}datacenter- {OLD}spine- {OLD}block-" in notice.fix

    gen = render("topograph-nvlink", upgraded_nvlink_fleet())
    assert gen.files["topology.conf"] == render("topograph-accelerator", accelerator_fleet()).files["topology.conf"]
    (notice,) = gen.topology.notices
    assert f"placed by {DOMAIN}" in str(notice) and notice.fix.endswith(f"{OLD}accelerator-")


def test_a_preset_for_one_scheme_reads_only_it_and_says_nothing():
    """The explicit presets pin a scheme: the other's labels are not even read."""
    gen = render("topograph-legacy", upgraded_fleet())
    assert {s.name for s in gen.topology.switches} == {"dc-old", "spine-old", "blk0", "blk1"}
    assert gen.topology.notices == ()
    assert all(not any(k.startswith(TIER) for k in n.labels) for n in gen.inventory.nodes)
    gen = render("topograph-fabric", upgraded_fleet())
    assert gen.topology.notices == () and "dc-old" not in gen.files["topology.conf"]


def test_nodes_with_fewer_tiers_hang_from_root_beside_the_deeper_ones():
    switches = by_name(render("topograph", mixed_depth_fleet()))
    assert switches["spine9"].level == 1 and switches["spine9"].switches == ("leaf2", "leaf3")
    assert switches["root"].switches == ("core0", "spine9", "unlabeled") and switches["root"].level == 3
    assert switches["unlabeled"].nodes == ("gpu-gpu-8", "gpu-gpu-9")


def test_sub_domains_do_not_split_blocks():
    gen = render("topograph-accelerator", accelerator_fleet())
    assert [(b.name, len(b.nodes)) for b in gen.topology.blocks] == [("nvl0", 4), ("nvl1", 4)]
    assert gen.topology.block_sizes == (4,)


def test_the_inventory_keeps_every_tier_and_no_look_alike():
    """Tier labels are any number, so the inventory picks them by name: `tier-7` is one, `tier-07`
    (a second name for the same tier) and `tier-x` are not."""
    labels = {**tiers(*(f"s{n}" for n in range(8))), f"{TIER}07": "dup", f"{TIER}x": "no", "other/label": "no"}
    gen = render("topograph-fabric", [gpu(0, labels)])
    assert sorted(gen.inventory.nodes[0].labels) == sorted(tiers(*(f"s{n}" for n in range(8))))
    assert by_name(gen)["s7"].level == 7


def test_missing_tiers_are_named_when_unlabeled_nodes_are_refused():
    nodes = [gpu(0, {f"{TIER}0": "leaf0", f"{TIER}2": "core0"}), gpu(1, {})]
    with pytest.raises(TopologyError) as info:
        render("topograph", nodes, unlabeled="error")
    messages = [str(i) for i in info.value.issues]
    assert any(m.startswith("nodes.gpu-0: lacks topology label(s) fabric.topograph.run/tier-1 or "
                            f"{OLD}datacenter") for m in messages), messages
    assert any(m.startswith("nodes.gpu-1: lacks topology label(s) fabric.topograph.run/tier-N or") for m in messages)
    with pytest.raises(TopologyError, match=f"lacks block label {DOMAIN} or {OLD}accelerator"):
        render("topograph-nvlink", [gpu(0, {})], unlabeled="error")


def test_a_switch_reached_at_two_depths_is_a_label_conflict():
    """A leaf whose nodes disagree on what is above it: under a spine for one, the top for the other."""
    nodes = [gpu(0, tiers("leaf0", "spine0")), gpu(1, tiers("leaf0", "spine0", "core0")),
             gpu(2, tiers("leaf1", "spine1", "core0"))]
    with pytest.raises(TopologyError, match=r"switch 'spine0' \(fabric.topograph.run/tier-1\) is under no switch"):
        render("topograph-fabric", nodes)


@pytest.mark.parametrize("topology,field", [
    ({"plugin": "block", "block_label": DOMAIN, "tier_prefix": TIER}, "tier_prefix"),
    ({"plugin": "tree", "tier_prefix": "has space/tier-"}, "tier_prefix"),
    ({"plugin": "tree", "levels": ["a/b"], "fallback_block_label": DOMAIN}, "fallback_block_label"),
    ({"plugin": "block", "block_label": DOMAIN, "fallback_block_label": DOMAIN}, "fallback_block_label"),
])
def test_bad_scheme_fields_are_refused(topology: dict[str, Any], field: str):
    with pytest.raises(SpecError, match=field):
        parse_spec({"name": "t", "pools": [{"name": "p"}], "topology": topology})


# ---------------------------------------------------------------- where the notices show

def test_notices_show_in_the_cli_render_and_the_chart_log(tmp_path: Path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "topo", "pools": [{"name": "gpu", "node_selector": {"pool": "gpu"}}],
                                         "topology": {"preset": "topograph"}}))
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps(node_list(upgraded_fleet())))
    result = CliRunner().invoke(app, ["render", "--spec", str(spec_file), "--nodes", str(nodes_file),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "notice: topology: 8 node(s) (gpu-0," in result.output and "Fix: remove them" in result.output

    _, notes = render_files(spec_for("topograph"), upgraded_fleet())
    assert [n for n in notes if n.startswith("notice: topology: 8 node(s)")]


# ---------------------------------------------------------------- the presets are documented

def test_every_preset_is_documented():
    names = list(TOPOLOGY_PRESETS)
    literal = typing.get_args(Topology.model_fields["preset"].annotation)[0]
    assert list(typing.get_args(literal)) == names
    doc = Topology.__doc__ or ""
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for name in names:
        assert f"- `{name}`:" in doc, name
        assert f"| `{name}` |" in configuration, name
