"""A real slurmctld (Slurm 24.11, the slurmctld image) accepts the rendered files and sees exactly
the nodes, features, GRES, partitions and switches that the inventory and topology say."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factories import AWS, node  # noqa: E402

from provisioner.config import parse_spec  # noqa: E402
from provisioner.generate import generate  # noqa: E402
from provisioner.inventory import nodes_from_api  # noqa: E402
from provisioner.render import Site, expand, write_files  # noqa: E402

pytestmark = pytest.mark.integration
IMAGE = os.environ.get("SLURMK8S_CTLD_IMAGE", "slurmk8s/slurmctld:dev")


def docker(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def docker_ready() -> None:
    if shutil.which("docker") is None or docker("info", check=False).returncode != 0:
        pytest.skip("no Docker engine answers (run images/ensure-docker.sh)")
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        pytest.skip(f"image {IMAGE} is not built (run images/build.sh)")


def labelled_fleet() -> list[dict]:
    """3 leaf switches under 2 spines, GPU and CPU pools, one cordoned and one unlabeled node."""
    nodes = []
    for i in range(6):
        spine, leaf = f"spine-{i // 4}", f"leaf-{i // 2}"
        nodes.append(node(f"gpu{i}.example", {"pool": "gpu", f"{AWS}1": "core", f"{AWS}2": spine, f"{AWS}3": leaf,
                                              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                              "node.kubernetes.io/instance-type": "p5.48xlarge"},
                          cpu="96", memory="1000Gi", gpus=8, unschedulable=(i == 5)))
    for i in range(3):
        labels = {"pool": "cpu", f"{AWS}1": "core", f"{AWS}2": "spine-1", f"{AWS}3": "leaf-cpu"} if i < 2 else \
            {"pool": "cpu"}
        nodes.append(node(f"cpu{i}.example", labels, cpu="32", memory="128Gi"))
    return nodes


SPEC = {
    "name": "itest",
    "pools": [
        {"name": "gpu", "node_selector": {"pool": "gpu"}, "feature_labels": ["node.kubernetes.io/instance-type"]},
        {"name": "cpu", "node_selector": {"pool": "cpu"}, "partition": "cpu", "features": ["avx512"]},
    ],
    "users": [{"name": "alice", "uid": 2001}],
    "topology": {"preset": "aws"},
    "accounting": {"enabled": False},  # no slurmdbd in this container (accounting: e2e/)
}


def scontrol_json(name: str, *args: str) -> dict:
    return json.loads(docker("exec", name, "scontrol", *args, "--json").stdout)


def test_real_slurmctld_sees_exactly_the_inventory(docker_ready, tmp_path: Path):
    spec = parse_spec(SPEC)
    name = f"slurmk8s-itest-ctld-{uuid.uuid4().hex[:8]}"
    result = generate(spec, nodes_from_api(labelled_fleet()), Site(controller_host=name))
    conf = tmp_path / "etc-slurm"
    write_files(result.files, conf)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "munge.key").write_bytes(secrets.token_bytes(1024))
    users = tmp_path / "users"
    write_files({"passwd": result.files["passwd"], "group": result.files["group"]}, users)
    try:
        docker("run", "-d", "--name", name, "--hostname", name,
               "-v", f"{conf}:/etc/slurm:ro", "-v", f"{secret}:/etc/slurmk8s/secret:ro",
               "-v", f"{users}:/etc/slurmk8s/users:ro", IMAGE)
        deadline = time.monotonic() + 60
        while True:
            probe = docker("exec", name, "scontrol", "ping", check=False)
            if probe.returncode == 0 and "UP" in probe.stdout:
                break
            if time.monotonic() > deadline:
                logs = docker("logs", name, check=False)
                pytest.fail(f"slurmctld did not answer within 60 s:\n{logs.stdout}\n{logs.stderr}")
            time.sleep(0.5)

        # nodes: names, CPUs, memory, features, GRES, CLOUD + powered down, drain reason for the cordoned one
        # (drained by the entrypoint's slurmk8s-sync-nodes once slurmctld answers)
        cordoned = [n.name for n in result.inventory.nodes if n.unavailable]
        assert cordoned == ["gpu-gpu5"]
        deadline = time.monotonic() + 30
        while True:
            nodes = {n["name"]: n for n in scontrol_json(name, "show", "nodes")["nodes"]}
            if "DRAIN" in nodes["gpu-gpu5"]["state"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert set(nodes) == set(result.inventory.names)
        for inv in result.inventory.nodes:
            seen = nodes[inv.name]
            assert seen["cpus"] == inv.cpus, inv.name
            assert seen["real_memory"] == inv.real_memory, inv.name
            assert sorted(seen["features"]) == sorted(inv.features), inv.name
            assert (seen["gres"] or None) == inv.gres, inv.name
            assert "CLOUD" in seen["state"] and "POWERED_DOWN" in seen["state"], (inv.name, seen["state"])
            if inv.unavailable:
                assert "DRAIN" in seen["state"] and seen["reason"] == inv.unavailable
            else:
                assert "DRAIN" not in seen["state"]

        # partitions
        parts = {p["name"]: p for p in scontrol_json(name, "show", "partitions")["partitions"]}
        assert set(parts) == {"gpu", "cpu"}
        for pname, part in parts.items():
            assert sorted(expand(part["nodes"]["configured"])) == sorted(
                n.name for n in result.inventory.nodes if n.partition == pname)
        sinfo = docker("exec", name, "sinfo", "-h", "-o", "%P %D").stdout.split()
        assert sinfo[0] == "gpu*", f"gpu must be the default partition: {sinfo}"

        # switches, as slurmctld loaded them
        shown = docker("exec", name, "scontrol", "show", "topology").stdout
        loaded = {}
        for line in shown.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "SwitchName" in fields:
                loaded[fields["SwitchName"]] = (int(fields["Level"]), sorted(expand(fields.get("Nodes", ""))),
                                                sorted(expand(fields.get("Switches", ""))))
        expected = {}
        for sw in result.topology.switches:
            below: list[str] = []
            stack = [sw]
            by_name = {s.name: s for s in result.topology.switches}
            while stack:  # slurmctld lists every node reachable below a switch
                cur = stack.pop()
                below += cur.nodes
                stack += [by_name[c] for c in cur.switches]
            expected[sw.name] = (sw.level, sorted(below), sorted(sw.switches))
        assert loaded == expected
        assert "root" in loaded and "unlabeled" in loaded  # the unlabeled CPU node stays schedulable
    finally:
        docker("rm", "-f", name, check=False)
