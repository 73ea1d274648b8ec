"""``slurmk8s-pod-files --out DIR``: the slurmctld pod's own files, read from the API once at the
pod's start (its slurmctld container's entrypoint runs this before anything else).

The files are the cluster spec (ConfigMap ``slurmk8s-spec``), the users (ConfigMap
``slurm-users``), the munge key (Secret ``slurm-auth``) and the JWT key (Secret ``slurm-jwt``).
They are written into an in-memory emptyDir mounted at /etc/slurmk8s, at the paths where Secret
and ConfigMap volumes were mounted before: ``spec/``, ``users/``, ``secret/``, ``jwt/``, plus
``elastic.env`` (a copy of ``spec/elastic.env``, the settings of the programs Slurm starts). The
reconcile and accounting containers mount ``spec/`` alone (a subPath).

Why not volumes: the kubelet reads a pod's Secret and ConfigMap volumes as the node. The API
server's node authorizer allows that only once its graph has seen the pod bound to the node. A
kubelet that asks first is refused ("no relationship found between node and this object") and
its reflector retries about a second later. On the local cluster 29 % of the woken slurmctld pods
lost that race; each one then started about 1.1 s later. This read uses the pod's ServiceAccount
token instead, which RBAC authorizes with no such graph (get on these names only).

What is read is what the pod was made for: `slurmk8s up` writes these objects before the
StatefulSet that starts the pod (dependencies), and Helm installs Secrets and ConfigMaps before
StatefulSets; a change of the spec or of the users rolls the pod (its template's hash annotations).
A refusal (403: the Role not yet there) or an absence (404) is read again, like an unreachable API,
until ``--wait``; then it stops, naming the object and what to fix.

Environment:
  SLURMK8S_POD_FILES   what to read: ``kind/name:dir`` entries separated by spaces, kind
                       ``configmap`` or ``secret``; e.g. ``configmap/slurmk8s-spec:spec``

Standard library only, but for provisioner.names and provisioner.settings (standard library only
themselves): it runs on every wake of an asleep tier, before slurmctld.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .names import SA_DIR
from .settings import SlurmctldStart

DONE = ".fetched"  # written last: a restarted container keeps the files its pod started with
SECRET_DIRS_MODE, SECRET_FILES_MODE = 0o700, 0o400
PUBLIC_DIRS_MODE, PUBLIC_FILES_MODE = 0o755, 0o644
ENV_FILE = "elastic.env"  # copied from spec/ to DIR: the resume/suspend programs read DIR/elastic.env


class PodFilesError(Exception):
    """What stops the program: a malformed entry or object, or a read that did not succeed in time."""


class Refused(OSError):
    """403 or 404: read again until the deadline (the Role or the object may be on its way)."""


@dataclass(frozen=True)
class Entry:
    kind: str  # "configmap" or "secret"
    name: str
    dir: str  # under --out

    @property
    def plural(self) -> str:
        return f"{self.kind}s"

    @property
    def secret(self) -> bool:
        return self.kind == "secret"


def parse_entries(text: str) -> list[Entry]:
    entries = []
    for word in text.split():
        ref, sep, subdir = word.partition(":")
        kind, slash, name = ref.partition("/")
        if not (sep and slash and name and subdir) or kind not in ("configmap", "secret") \
                or "/" in subdir or subdir in (".", ".."):
            raise PodFilesError(f"SLURMK8S_POD_FILES: {word!r} is not kind/name:dir "
                                "(kind configmap or secret, dir one name)")
        entries.append(Entry(kind, name, subdir))
    if not entries:
        raise PodFilesError("SLURMK8S_POD_FILES names nothing to read")
    return entries


def files_of(entry: Entry, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """The files one ConfigMap or Secret holds, decoded."""
    out: dict[str, bytes] = {}
    if entry.secret:
        for key, value in (obj.get("data") or {}).items():
            out[key] = base64.b64decode(value)
    else:
        for key, value in (obj.get("data") or {}).items():
            out[key] = value.encode()
        for key, value in (obj.get("binaryData") or {}).items():
            out[key] = base64.b64decode(value)
    for key in out:
        if "/" in key or key.startswith("."):
            raise PodFilesError(f"{entry.kind} {entry.name}: key {key!r} cannot be a file name")
    return out


class Api:
    """GETs with the pod's ServiceAccount token (in-cluster), nothing else; one connection for all."""

    def __init__(self, environ: Mapping[str, str], sa_dir: str = SA_DIR, timeout: float = 5.0) -> None:
        self.host = environ.get("KUBERNETES_SERVICE_HOST", "")
        self.port = int(environ.get("KUBERNETES_SERVICE_PORT", "443"))
        if not self.host:
            raise PodFilesError("KUBERNETES_SERVICE_HOST is not set: run this in a pod, or unset SLURMK8S_POD_FILES "
                                "and mount the files")
        sa = Path(sa_dir)
        try:
            self.token = (sa / "token").read_text().strip()
            self.namespace = (sa / "namespace").read_text().strip()
        except OSError as exc:
            raise PodFilesError(f"no ServiceAccount token at {sa_dir} ({exc}): the pod needs "
                                "automountServiceAccountToken: true") from exc
        self.context = ssl.create_default_context(cafile=str(sa / "ca.crt")) if (sa / "ca.crt").exists() \
            else ssl.create_default_context()
        self.timeout = timeout
        self.conn: http.client.HTTPSConnection | None = None

    def get(self, entry: Entry) -> dict[str, Any]:
        if self.conn is None:
            self.conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)
        try:
            self.conn.request("GET", f"/api/v1/namespaces/{self.namespace}/{entry.plural}/{entry.name}",
                              headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"})
            resp = self.conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = None  # the next try connects again
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        what = f"{entry.kind} {self.namespace}/{entry.name}"
        if resp.status == 403:
            raise Refused(f"{what}: forbidden: the pod's ServiceAccount needs get on it "
                          "(the Role slurmk8s-worker-pods names it)")
        if resp.status == 404:
            raise Refused(f"{what} not found: `slurmk8s up` (or the chart) writes it")
        if resp.status != 200:  # 5xx, 429: worth another try
            raise OSError(f"HTTP {resp.status} {resp.reason}")
        return json.loads(body)


def write_entry(out: Path, entry: Entry, files: Mapping[str, bytes]) -> None:
    """Replace DIR/entry.dir with the files."""
    d = out / entry.dir
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(SECRET_DIRS_MODE if entry.secret else PUBLIC_DIRS_MODE)
    for old in d.iterdir():
        if old.name not in files:
            old.unlink()
    for key, data in files.items():
        _write_file(d / key, data, SECRET_FILES_MODE if entry.secret else PUBLIC_FILES_MODE)


def fetch(out: Path, entries: list[Entry], get: Callable[[Entry], dict[str, Any]], wait: float,
          log: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep, retry: float = 0.5) -> None:
    """Read every entry (again while the API fails or refuses, up to ``wait`` s), write them, then
    DIR/elastic.env and DIR/.fetched."""
    deadline = clock() + wait
    got: dict[Entry, dict[str, bytes]] = {}
    why: dict[Entry, str] = {}
    while True:
        for entry in entries:
            if entry not in got:
                try:
                    got[entry] = files_of(entry, get(entry))
                except (OSError, ValueError) as exc:  # refused, unreachable, 5xx, a cut answer
                    why[entry] = str(exc) or type(exc).__name__
        missing = [e for e in entries if e not in got]
        if not missing:
            break
        if clock() >= deadline:
            raise PodFilesError(f"could not read {', '.join(f'{e.kind} {e.name}' for e in missing)} "
                                f"in {wait:.0f}s: " + "; ".join(why[e] for e in missing))
        sleep(retry)
    for entry in entries:
        write_entry(out, entry, got[entry])
    spec = next((e for e in entries if e.dir == "spec"), None)
    if spec is not None and ENV_FILE in got[spec]:
        _write_file(out / ENV_FILE, got[spec][ENV_FILE], PUBLIC_FILES_MODE)
    _write_file(out / DONE, b"", PUBLIC_FILES_MODE)
    log("read " + ", ".join(f"{e.kind} {e.name} -> {out / e.dir}" for e in entries))


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Written beside, then renamed; created with its mode (a key is never readable by others)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)  # past the umask
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurmk8s-pod-files", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the directory to fill (an emptyDir)")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds to read again while the API fails or refuses (default 30)")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(f"slurmk8s-pod-files: {msg}", file=sys.stderr, flush=True)

    try:
        entries = parse_entries(SlurmctldStart.from_env(os.environ).pod_files)
        api = Api(os.environ)
        fetch(Path(args.out), entries, api.get, args.wait, log)
    except PodFilesError as exc:
        log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
