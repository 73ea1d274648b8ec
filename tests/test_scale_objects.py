"""Kubernetes refuses any object over 1 MiB (etcd's request limit). At 10,000 Slurm nodes every
object `up` applies must stay well under it: this test builds them all for a 10,000-node pinned
fleet (3-level AWS network topology) and checks each against half the limit.

Found by its first run: the slurm-config ConfigMap carried inventory.json as plain JSON, about 470
bytes a node, 5.2 MB at 10,000 nodes (over the limit from about 2,000 nodes on); it is gzipped now.
"""

from __future__ import annotations

import json
from pathlib import Path

from factories import aws_fleet

from provisioner import manifests as m
from provisioner.config import load_spec
from provisioner.deploy.keys import generate, secrets_from_values
from provisioner.generate import generate_for_kubernetes

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1024 * 1024  # bytes, Kubernetes' object size limit
ROOM = LIMIT // 2


def test_every_object_stays_under_half_the_limit_at_10000_nodes():
    spec = load_spec(ROOT / "examples" / "aws-gpu.yaml")
    raw = json.loads(json.dumps(aws_fleet(10, 25, 40)))  # 10 spines x 25 leaves x 40 nodes
    gen = generate_for_kubernetes(spec, raw)
    assert len(gen.inventory.nodes) == 10_000
    objs = m.all_objects(spec, gen.inventory, gen.files, secrets_from_values(generate()))
    sizes = {f"{o['kind']}/{o['metadata']['name']}": len(json.dumps(o)) for o in objs}
    big = {k: v for k, v in sizes.items() if v > ROOM}
    assert not big, f"objects over {ROOM} bytes (half of Kubernetes' 1 MiB limit) at 10,000 nodes: {big}"
    # and the gzipped inventory still carries every node
    [cm] = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == m.SLURM_CONFIG]
    assert m.config_map_files(cm)["inventory.json"] == gen.files["inventory.json"]
