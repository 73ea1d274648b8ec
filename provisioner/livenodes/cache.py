"""The last configuration slurmctld ran with, kept on its state volume so that a start can reuse it.

Each start of the slurmctld pod, a wake from idle sleep included, renders slurm.conf and the rest
from the spec and the Kubernetes nodes in its slurmctld container, before slurmctld starts
(slurmk8s-config-init, run by the entrypoint): a Python start (about 0.9 s of imports in the
slurmctld image), a listing of the nodes and a render. The reconcile loop copies the files written
at start here, with the inputs they were made from, once per pod (until a copy succeeds: without a
pinned pool nothing rewrites them while the pod runs):

  <state>/slurmk8s/config/          (STATE_DIR, the slurmctld-state volume)
    slurm.conf, topology.conf, ...  the files of the configuration directory, as slurmctld runs them
    spec.json, site.json            the spec files they were made from: config-init's copies
                                    (<config dir>/.inputs/), taken as it rendered or copied; kept
                                    only while the mounted spec is still the same (a changed spec
                                    rolls the pod, and the new one renders)
    render-id                       a copy of the image's /opt/slurmk8s/render-id (a hash of the
                                    renderer's code and templates, written at image build)
    complete                        written last (after every file and the directory are synced to
                                    disk), removed first: `sha256sum -c` lines of every file above

slurmk8s-config-init (images/entrypoint/config-init.sh, shell: no Python) reuses the copy when
`complete` is there and spec.json, site.json and render-id are byte for byte the pod's; else it
renders as before. Only a spec without a pinned pool is kept: a pinned pool's Slurm nodes follow
Kubernetes nodes that may have changed while the pod was away, and the job that woke the tier
must not be scheduled on a node that is gone (the loop removes any copy of a pinned spec). No copy
is made while a reconfigure is pending (the loop writes the files before `scontrol reconfigure`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Mapping

from .. import names, settings
from ..settings import ClusterFiles, Reconcile
from .live import PENDING

RENDER_ID: str = settings.default(settings.RENDER_ID)
INPUTS = ("spec.json", "site.json")
INPUTS_DIR = ".inputs"  # in the config directory: the spec files config-init rendered or copied from
COMPLETE = "complete"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class ConfigCache:
    """Keeps `cache_dir` a copy of `conf_dir` (the files in names.SLURM_FILES) with the spec files they
    were made from and the image's render id beside it. :meth:`sync` writes only what changed; it
    raises OSError when the volume cannot be written."""

    def __init__(self, conf_dir: str | Path = names.SLURM_CONF_DIR, cache_dir: str | Path | None = None,
                 spec_dir: str | Path = names.SPEC_DIR, render_id: str | Path = RENDER_ID) -> None:
        self.conf_dir = Path(conf_dir)
        self.cache_dir = Path(cache_dir if cache_dir is not None else settings.default(settings.CONFIG_CACHE))
        self.spec_dir = Path(spec_dir)
        self.render_id = Path(render_id)

    def _wanted(self) -> dict[str, bytes] | None:
        """What the copy should hold now; None when there is nothing sound to copy."""
        if (self.conf_dir / PENDING).exists():
            return None
        files = {n: _read(self.conf_dir / n) for n in names.SLURM_FILES}
        if files.get("slurm.conf") is None:
            return None
        ident = _read(self.render_id)
        if ident is None:  # an image without the id: config-init could never match it
            return None
        inputs = {n: _read(self.conf_dir / INPUTS_DIR / n) for n in INPUTS}
        if inputs["spec.json"] is None:  # not said what the files were made from
            return None
        if any(_read(self.spec_dir / n) != inputs[n] for n in INPUTS):
            return None  # the spec changed under the pod (it rolls; the next one renders)
        wanted = {n: b for n, b in files.items() if b is not None}
        wanted.update({n: b for n, b in inputs.items() if b is not None})
        wanted["render-id"] = ident
        return wanted

    def sync(self) -> bool:
        """Bring the copy in line; True when it wrote anything."""
        wanted = self._wanted()
        if wanted is None:
            return False
        manifest = "".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in sorted(wanted.items()))
        if _read(self.cache_dir / COMPLETE) == manifest.encode() and all(
                _read(self.cache_dir / n) == b for n, b in wanted.items()):
            return False
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        (self.cache_dir / COMPLETE).unlink(missing_ok=True)
        _sync_dir(self.cache_dir)
        for p in self.cache_dir.iterdir():
            if p.name not in wanted and p.is_file():
                p.unlink()
        for name, data in wanted.items():
            _write_synced(self.cache_dir / name, data)
        _sync_dir(self.cache_dir)
        _write_synced(self.cache_dir / COMPLETE, manifest.encode())
        _sync_dir(self.cache_dir)
        return True

    def clear(self) -> bool:
        """Remove the copy (a pinned spec is never reused); True when there was one."""
        if not self.cache_dir.exists():
            return False
        shutil.rmtree(self.cache_dir)
        return True


def _write_synced(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file, on disk before the rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cache_from_env(env: Mapping[str, str], conf_dir: str) -> ConfigCache:
    """The loop's copy of `conf_dir`: beside the spec of SLURMK8S_SPEC; SLURMK8S_CONFIG_CACHE and
    SLURMK8S_RENDER_ID move the copy and the id (tests, benches)."""
    loop = Reconcile.from_env(env)
    return ConfigCache(conf_dir, loop.config_cache, os.path.dirname(ClusterFiles.from_env(env).spec), loop.render_id)
