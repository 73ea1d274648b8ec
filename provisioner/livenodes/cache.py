"""The last configuration slurmctld ran with, kept on its state volume so that a start can reuse it.

Each start of the slurmctld pod, a wake from idle sleep included, renders slurm.conf and the rest
from the spec and the Kubernetes nodes in its init container: a Python start (about 0.9 s of
imports in the slurmctld image), a listing of the nodes and a render, all before slurmctld may
start. The reconcile loop keeps the rendered files current while the pod runs (:mod:`.live`); after
each pass it also copies them here, with the inputs they were made from:

  <state>/slurmk8s/config/          (STATE_DIR, the slurmctld-state volume)
    slurm.conf, topology.conf, ...  the files of the configuration directory, as slurmctld runs them
    spec.json, site.json            copies of the spec ConfigMap's files they were rendered from
    render-id                       a copy of the image's /opt/slurmk8s/render-id (a hash of the
                                    renderer's code and templates, written at image build)
    complete                        written last, removed first: the copy is whole

The init container (images/entrypoint/config-init.sh, shell: no Python) reuses the copy when
`complete` is there and spec.json, site.json and render-id are byte for byte the pod's; else it
renders as before. Nodes that changed while the pod was away (a pinned pool's node cordoned, added
or removed) are the loop's to follow in its first pass, as they are while it runs. A copy is never
made while a reconfigure is pending (the loop writes the files before `scontrol reconfigure`), so
it holds only a configuration slurmctld took.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from ..manifests import names as m
from ..render import write_files
from .live import PENDING

CACHE_SUBDIR = "slurmk8s/config"
RENDER_ID = "/opt/slurmk8s/render-id"
INPUTS = ("spec.json", "site.json")
COMPLETE = "complete"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class ConfigCache:
    """Keeps `cache_dir` a copy of `conf_dir` (the files in m.SLURM_FILES) with the spec's files of
    `spec_dir` and the image's render id beside it. :meth:`sync` is cheap when nothing changed (it
    reads a few small files) and raises OSError when the volume cannot be written."""

    def __init__(self, conf_dir: str | Path = m.SLURM_CONF_DIR, cache_dir: str | Path | None = None,
                 spec_dir: str | Path = m.SPEC_DIR, render_id: str | Path = RENDER_ID) -> None:
        self.conf_dir = Path(conf_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else Path(m.STATE_DIR, CACHE_SUBDIR)
        self.spec_dir = Path(spec_dir)
        self.render_id = Path(render_id)

    def _wanted(self) -> dict[str, bytes] | None:
        """What the copy should hold now; None when there is nothing sound to copy."""
        if (self.conf_dir / PENDING).exists():
            return None
        files = {n: _read(self.conf_dir / n) for n in m.SLURM_FILES}
        if files.get("slurm.conf") is None:
            return None
        ident = _read(self.render_id)
        if ident is None:  # an image without the id: the init container could never match it
            return None
        wanted = {n: b for n, b in files.items() if b is not None}
        wanted.update({n: b for n in INPUTS if (b := _read(self.spec_dir / n)) is not None})
        wanted["render-id"] = ident
        return wanted

    def sync(self) -> bool:
        """Bring the copy in line; True when it wrote (or removed) anything."""
        wanted = self._wanted()
        if wanted is None:
            return False
        have = {p.name: p.read_bytes() for p in self.cache_dir.glob("*") if p.is_file()} \
            if self.cache_dir.is_dir() else {}
        if have.get(COMPLETE) is not None and {n: b for n, b in have.items() if n != COMPLETE} == wanted:
            return False
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        (self.cache_dir / COMPLETE).unlink(missing_ok=True)
        for name in have:
            if name not in wanted and name != COMPLETE:
                (self.cache_dir / name).unlink(missing_ok=True)
        write_files({n: b.decode() for n, b in wanted.items()}, self.cache_dir)
        write_files({COMPLETE: ""}, self.cache_dir)
        return True

    def clear(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)


def cache_from_env(env: Mapping[str, str], conf_dir: str) -> ConfigCache:
    """The loop's copy of `conf_dir`: beside the spec of SLURMK8S_SPEC; SLURMK8S_CONFIG_CACHE and
    SLURMK8S_RENDER_ID move the copy and the id (tests, benches)."""
    spec_dir = os.path.dirname(env.get("SLURMK8S_SPEC", f"{m.SPEC_DIR}/spec.json"))
    return ConfigCache(conf_dir, env.get("SLURMK8S_CONFIG_CACHE", str(Path(m.STATE_DIR, CACHE_SUBDIR))),
                       spec_dir, env.get("SLURMK8S_RENDER_ID", RENDER_ID))
