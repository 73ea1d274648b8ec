"""The configuration kept for the next start of slurmctld (provisioner/livenodes/cache.py) and the
init container that reuses it (images/entrypoint/config-init.sh, run here with sh)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from provisioner.livenodes.cache import ConfigCache, cache_from_env

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "images" / "entrypoint" / "config-init.sh"


@pytest.fixture
def pod(tmp_path: Path) -> dict[str, Path]:
    """A slurmctld pod's paths: the config dir the loop keeps, the spec ConfigMap, the image's id."""
    p = {k: tmp_path / k for k in ("conf", "spec", "cache", "out")}
    for k in ("conf", "spec"):
        p[k].mkdir()
    (p["conf"] / "slurm.conf").write_text("ClusterName=a\n")
    (p["conf"] / "inventory.json").write_text("{}\n")
    (p["spec"] / "spec.json").write_text('{"name": "a"}')
    (p["spec"] / "site.json").write_text('{"cluster_domain": "cluster.local"}')
    p["id"] = tmp_path / "render-id"
    p["id"].write_text("abc\n")
    # the renderer the init container falls back to: records that it ran
    p["render"] = tmp_path / "render-config"
    p["render"].write_text('#!/bin/sh\nmkdir -p "$2"; echo rendered > "$2/slurm.conf"\n')
    p["render"].chmod(0o755)
    return p


def cache(p: dict[str, Path]) -> ConfigCache:
    return ConfigCache(p["conf"], p["cache"], p["spec"], p["id"])


def init(p: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "SLURMK8S_CONFIG_CACHE": str(p["cache"]),
           "SLURMK8S_SPEC": str(p["spec"] / "spec.json"), "SLURMK8S_RENDER_ID": str(p["id"]),
           "SLURMK8S_RENDER_CONFIG": str(p["render"])}
    return subprocess.run(["sh", str(INIT), "--out", str(p["out"])], env=env, text=True, capture_output=True,
                          check=True)


def test_a_kept_configuration_is_reused_as_it_was(pod):
    assert cache(pod).sync() is True
    assert cache(pod).sync() is False  # nothing changed: nothing written
    got = init(pod)
    assert "reused" in got.stderr
    assert sorted(os.listdir(pod["out"])) == ["inventory.json", "slurm.conf"]
    assert (pod["out"] / "slurm.conf").read_text() == "ClusterName=a\n"


@pytest.mark.parametrize("change", ["spec", "site", "id", "none-kept"])
def test_anything_else_renders_again(pod, change):
    cache(pod).sync()
    if change == "spec":
        (pod["spec"] / "spec.json").write_text('{"name": "b"}')
    elif change == "site":
        (pod["spec"] / "site.json").unlink()
    elif change == "id":
        pod["id"].write_text("def\n")  # another image's renderer
    else:
        (pod["cache"] / "complete").unlink()  # a copy cut short
    got = init(pod)
    assert "rendering" in got.stderr
    assert (pod["out"] / "slurm.conf").read_text() == "rendered\n"


def test_the_copy_follows_the_loop_and_waits_out_a_pending_reconfigure(pod):
    c = cache(pod)
    c.sync()
    (pod["conf"] / "topology.conf").write_text("SwitchName=s\n")
    (pod["conf"] / ".reconfigure-pending").touch()  # files written, slurmctld not yet reconfigured
    assert c.sync() is False
    assert not (pod["cache"] / "topology.conf").exists()
    (pod["conf"] / ".reconfigure-pending").unlink()
    (pod["conf"] / "inventory.json").unlink()
    assert c.sync() is True
    assert (pod["cache"] / "topology.conf").read_text() == "SwitchName=s\n"
    assert not (pod["cache"] / "inventory.json").exists()  # gone from the config dir: gone here
    init(pod)
    assert sorted(os.listdir(pod["out"])) == ["slurm.conf", "topology.conf"]


def test_nothing_is_kept_without_the_images_id_or_a_slurm_conf(pod):
    pod["id"].unlink()
    assert cache(pod).sync() is False
    pod["id"].write_text("abc\n")
    (pod["conf"] / "slurm.conf").unlink()
    assert cache(pod).sync() is False
    assert not pod["cache"].exists()


def test_the_loops_cache_sits_beside_the_spec_it_reads(tmp_path):
    c = cache_from_env({"SLURMK8S_SPEC": str(tmp_path / "s" / "spec.json"),
                        "SLURMK8S_CONFIG_CACHE": str(tmp_path / "k")}, str(tmp_path / "conf"))
    assert (c.spec_dir, c.cache_dir, c.conf_dir) == (tmp_path / "s", tmp_path / "k", tmp_path / "conf")
    assert str(cache_from_env({}, "/etc/slurm").cache_dir) == "/var/spool/slurmctld/slurmk8s/config"
