"""The configuration kept for the next start of slurmctld (provisioner/livenodes/cache.py), the
entrypoint step that reuses it (images/entrypoint/config-init.sh, run here with sh) and the wait of
the pod's other containers for it (provisioner/livenodes/ready.py)."""

from __future__ import annotations

import os
import shutil
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
    (p["conf"] / ".inputs").mkdir()  # what config-init noted it rendered from
    for n in ("spec.json", "site.json"):
        (p["conf"] / ".inputs" / n).write_bytes((p["spec"] / n).read_bytes())
    p["id"] = tmp_path / "render-id"
    p["id"].write_text("abc\n")
    # the renderer config-init falls back to: records that it ran
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
    assert sorted(os.listdir(pod["out"])) == [".inputs", ".ready", "inventory.json", "slurm.conf"]
    assert (pod["out"] / "slurm.conf").read_text() == "ClusterName=a\n"
    assert (pod["out"] / ".inputs" / "spec.json").read_text() == '{"name": "a"}'  # for the next copy


@pytest.mark.parametrize("change", ["spec", "site", "id", "none-kept", "torn"])
def test_anything_else_renders_again(pod, change):
    cache(pod).sync()
    if change == "spec":
        (pod["spec"] / "spec.json").write_text('{"name": "b"}')
    elif change == "site":
        (pod["spec"] / "site.json").unlink()
    elif change == "id":
        pod["id"].write_text("def\n")  # another image's renderer
    elif change == "none-kept":
        (pod["cache"] / "complete").unlink()  # a copy cut short
    else:
        (pod["cache"] / "slurm.conf").write_text("")  # a file lost in a crash, `complete` there
    got = init(pod)
    assert "rendering" in got.stderr
    assert (pod["out"] / "slurm.conf").read_text() == "rendered\n"
    assert (pod["out"] / ".ready").exists()
    assert (pod["out"] / ".inputs" / "spec.json").read_bytes() == (pod["spec"] / "spec.json").read_bytes()


def test_the_spec_kept_is_the_one_the_files_were_made_from(pod):
    """The spec ConfigMap changes under a running pod (which then rolls): its new spec must never
    be kept beside files made from the old one."""
    c = cache(pod)
    assert c.sync() is True
    (pod["spec"] / "spec.json").write_text('{"name": "new"}')
    (pod["conf"] / "slurm.conf").write_text("ClusterName=a\nchanged\n")
    assert c.sync() is False
    assert (pod["cache"] / "spec.json").read_text() == '{"name": "a"}'
    assert (pod["cache"] / "slurm.conf").read_text() == "ClusterName=a\n"
    assert "rendering" in init(pod).stderr  # the new pod: its spec differs from the kept one's
    shutil.rmtree(pod["conf"] / ".inputs")  # files whose spec nobody noted are not kept either
    assert cache(pod).sync() is False


def test_a_copy_leaves_nothing_of_an_earlier_configuration(pod):
    cache(pod).sync()
    pod["out"].mkdir()
    (pod["out"] / "gres.conf").write_text("old\n")  # a run cut short in the same pod
    (pod["out"] / ".ready").write_text("")
    init(pod)
    assert sorted(os.listdir(pod["out"])) == [".inputs", ".ready", "inventory.json", "slurm.conf"]


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
    assert sorted(os.listdir(pod["out"])) == [".inputs", ".ready", "slurm.conf", "topology.conf"]


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


def test_the_loop_drops_a_pinned_specs_copy_and_survives_a_failing_one(pod, tmp_path):
    from provisioner.logs import Log
    from provisioner.reconcile.main import _drop_config, _keep_config

    log_path = tmp_path / "reconcile.log"
    log = Log("reconcile", str(log_path))
    c = cache(pod)
    c.sync()
    _drop_config(c, log)
    assert not pod["cache"].exists()
    assert "a pinned pool's start renders" in log_path.read_text()

    class Broken(ConfigCache):
        def sync(self) -> bool:
            raise ValueError("'utf-8' codec can't decode byte 0xff")

    broken = Broken(pod["conf"], pod["cache"], pod["spec"], pod["id"])
    again, first = _keep_config(broken, log, "")
    assert again is broken and "cannot keep the configuration" in first  # tried again next pass
    assert _keep_config(broken, log, first) == (broken, first)
    assert log_path.read_text().count("cannot keep the configuration") == 1  # once, not every pass
    # kept (or nothing to keep): done for this pod, as nothing rewrites the files while it runs
    assert _keep_config(c, log, first) == (None, "") and (pod["cache"] / "complete").exists()


def test_a_failed_render_leaves_the_directory_not_ready(pod):
    """The renderer's exit status comes back (the container restarts and tries again) and no
    .ready tells the other containers to go on, even one left by an earlier run."""
    pod["out"].mkdir()
    (pod["out"] / ".ready").write_text("")
    pod["render"].write_text('#!/bin/sh\necho "not a valid cluster spec" >&2; exit 2\n')
    with pytest.raises(subprocess.CalledProcessError) as err:
        init(pod)
    assert err.value.returncode == 2 and "not a valid cluster spec" in err.value.stderr
    assert not (pod["out"] / ".ready").exists()


def test_the_other_containers_wait_for_the_directory_and_say_so(monkeypatch):
    """wait_for_config returns at once on a ready directory; else it looks every POLL s, says what it
    waits for at the start, every SAY_EVERY s and at the end."""
    import tempfile

    from provisioner.livenodes.ready import wait_for_config
    from tests.fakes.clock import Clock

    monkeypatch.delenv("SLURMK8S_NAMESPACE", raising=False)
    with tempfile.TemporaryDirectory() as d:
        lines: list[str] = []
        clock = Clock()
        looks = []

        def sleep(s: float) -> None:
            looks.append(s)
            clock.sleep(s)
            if clock() >= 61.0:
                Path(d, ".ready").write_text("")

        assert wait_for_config(d, lines.append, clock=clock, sleep=sleep, poll=0.5, say_every=30.0) >= 61.0
        assert set(looks) == {0.5}
        assert "waiting for the Slurm configuration in" in lines[0]
        hint = "see the slurmctld container's log (kubectl -n NAMESPACE logs slurmctld-0 -c slurmctld)"
        assert [line.split(" after ")[1] for line in lines[1:-1]] == [f"30s: {hint}", f"60s: {hint}"]
        assert lines[-1].endswith("is ready after 61.00s")
        lines.clear()
        assert wait_for_config(d, lines.append, clock=clock, sleep=sleep) == 0.0 and lines == []
        Path(d, ".ready").unlink()  # never made: a SIGTERM ends the wait
        stops = iter([False, False, True])
        assert wait_for_config(d, lines.append, clock=clock, sleep=clock.sleep, stop=lambda: next(stops)) is None
        assert lines[-1].startswith("stopped while waiting for")
