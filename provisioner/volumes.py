"""Static PersistentVolumes whose claim is gone, and giving the local cluster's back.

A PersistentVolume made beforehand (a class without a provisioner, such as the local cluster's
``slurmk8s-local`` in examples/localk8s/storage.yaml) may be reserved for a claim by name
(``spec.claimRef: {namespace, name}``). Once that claim binds, Kubernetes records the claim's uid
in the reference; when the claim is deleted (``slurmk8s down --purge``) and the reclaim policy is
``Retain``, the volume turns ``Released`` and keeps pointing at the deleted claim, so a new claim
of the same name never binds to it: the claim stays Pending and its pods unscheduled.

- :func:`stale_reference` and :func:`released_for` (pure, over API objects as plain dicts) find
  such volumes; the preflight checks of ``slurmk8s up`` and the watcher report them.
- :func:`reclaimable` picks the local cluster's own ones (hostPath under
  ``/var/lib/slurmk8s/volumes``) and :func:`reclaim` gives them back as a provisioner with reclaim
  policy Delete would: their old data is deleted (the claim that owned it is gone), then the uid is
  removed from the reference with a JSON patch that first tests the volume's resourceVersion (a
  volume changed meanwhile is left alone). The PV controller then makes the volume Available for a
  new claim of the same name. ``slurmk8s cluster up`` and ``cluster reclaim-volumes`` do it for
  every such volume, ``slurmk8s up`` for its own claims.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

LOCAL_VOLUME_ROOT = "/var/lib/slurmk8s/volumes"  # hostPath of the local cluster's static volumes
LOCALK8S_ROOT = "/var/lib/slurmk8s/localk8s"  # state of the local cluster (cluster.sh: LOCALK8S_ROOT)

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ref(pv: Obj) -> Mapping[str, Any]:
    return (pv.get("spec") or {}).get("claimRef") or {}


def phase(obj: Obj) -> str:
    return (obj.get("status") or {}).get("phase") or ""


def claim_uids(claims: Iterable[Obj]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> uid of every claim given."""
    return {(_meta(c).get("namespace", ""), _meta(c).get("name", "")): _meta(c).get("uid", "") for c in claims}


def stale_reference(pv: Obj, claims: Mapping[tuple[str, str], str], namespaces: Iterable[str] | None = None) -> bool:
    """The volume still points at a claim that is gone: its reference carries a uid, and no claim of
    that namespace and name exists (or one with another uid: a new claim of the same name).
    `claims` must hold every claim of the referenced namespace (`namespaces`: the namespaces it
    covers; a reference elsewhere is not judged)."""
    ref = _ref(pv)
    if not ref.get("uid") or not ref.get("name"):
        return False
    key = (ref.get("namespace", ""), ref["name"])
    if namespaces is not None and key[0] not in set(namespaces):
        return False
    return claims.get(key) != ref["uid"]


def released_for(namespace: str, claim: str, volumes: Sequence[Obj], claims: Sequence[Obj]) -> list[Obj]:
    """Volumes reserved for `namespace/claim` by name that still hold an earlier claim of that name
    (so the current claim can never bind to them)."""
    uids = claim_uids(claims)
    return [pv for pv in volumes
            if _ref(pv).get("namespace") == namespace and _ref(pv).get("name") == claim
            and stale_reference(pv, uids, [namespace])]


def host_path(pv: Obj) -> str | None:
    return ((pv.get("spec") or {}).get("hostPath") or {}).get("path")


def is_local_volume(pv: Obj, root: str = LOCAL_VOLUME_ROOT) -> bool:
    """A hostPath volume under the local cluster's volume directory."""
    path = host_path(pv)
    if not path:
        return False
    base = os.path.normpath(root)
    return os.path.normpath(path).startswith(base + os.sep)


@dataclass(frozen=True)
class Reclaim:
    """A local volume to give back: its name, data directory, the claim it held and the
    resourceVersion the patch is conditioned on."""

    volume: str
    path: str
    claim: str  # namespace/name of the deleted claim
    resource_version: str
    drop: tuple[str, ...] = ("uid",)  # fields of the reference that tie it to the deleted claim

    def describe(self) -> str:
        return f"PersistentVolume {self.volume} ({self.path}), left by the deleted claim {self.claim}"


def reclaimable(volumes: Sequence[Obj], claims: Sequence[Obj], *, namespace: str | None = None,
                names: Iterable[str] | None = None, root: str = LOCAL_VOLUME_ROOT) -> list[Reclaim]:
    """The local cluster's volumes (hostPath under `root`) whose claim is gone (Released, or about to be).
    `claims`: every claim of the namespaces concerned (all namespaces unless `namespace`); with
    `namespace` / `names`, only volumes reserved for those claims."""
    uids = claim_uids(claims)
    wanted = set(names) if names is not None else None
    out = []
    for pv in volumes:
        ref = _ref(pv)
        if namespace is not None and ref.get("namespace") != namespace:
            continue
        if wanted is not None and ref.get("name") not in wanted:
            continue
        # Released; or still Bound when the PV controller has not seen the claim go yet (the patch's
        # resourceVersion test keeps the two of us from racing)
        if phase(pv) not in ("Released", "Bound") or not is_local_volume(pv, root):
            continue
        if not stale_reference(pv, uids, [namespace] if namespace is not None else None):
            continue
        out.append(Reclaim(_meta(pv).get("name", ""), host_path(pv) or "", f"{ref.get('namespace')}/{ref.get('name')}",
                           str(_meta(pv).get("resourceVersion", "")),
                           tuple(k for k in ("uid", "resourceVersion") if k in ref)))
    return sorted(out, key=lambda r: r.volume)


def release_patch(item: Reclaim) -> list[dict[str, Any]]:
    """JSON patch that frees the reference for a new claim of the same name; it fails (422) when the
    volume changed since it was read."""
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": item.resource_version},
            *({"op": "remove", "path": f"/spec/claimRef/{key}"} for key in item.drop)]


def release_fix(volume: str, *, local: bool, namespace: str | None = None) -> str:
    """What to do about a volume that still holds a deleted claim."""
    if local:
        ns = f" --namespace {namespace}" if namespace else ""
        return (f"`slurmk8s cluster reclaim-volumes{ns}` (the local cluster's own volumes: deletes the old data "
                "and makes them Available), or rerun `slurmk8s up`, which does it for its own claims")
    return ("if the old data may go to the new claim, free the volume: `kubectl patch pv "
            f"{volume} --type json -p '[{{\"op\":\"remove\",\"path\":\"/spec/claimRef/uid\"}}]'`; else delete it "
            "and create a new one (its data stays where the volume keeps it)")


# ---------------------------------------------------------------- the local cluster


def localk8s_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("LOCALK8S_ROOT") or LOCALK8S_ROOT)


def local_server(env: Mapping[str, str] | None = None) -> str | None:
    """The API server address of the local cluster (from its kubeconfig), or None without one."""
    import yaml

    try:
        doc = yaml.safe_load((localk8s_root(env) / "kubeconfig").read_text()) or {}
    except (OSError, ValueError):
        return None
    servers = [(c.get("cluster") or {}).get("server") for c in doc.get("clusters") or []]
    return next((s.rstrip("/") for s in servers if s), None)


def is_local_cluster(api_client: Any, env: Mapping[str, str] | None = None) -> bool:
    """The client talks to the local cluster of this machine (`slurmk8s cluster up`)."""
    server = local_server(env)
    host = str(getattr(getattr(api_client, "configuration", None), "host", "") or "").rstrip("/")
    return bool(server) and host == server


def read_volumes_and_claims(api_client: Any, namespace: str | None = None) -> tuple[list[dict], list[dict]]:
    """All PersistentVolumes, and the claims of `namespace` (all namespaces when None)."""
    from kubernetes import client

    from .kubeapi import raw_call

    core = client.CoreV1Api(api_client)
    timeout = (5.0, 30.0)
    volumes = raw_call(core.list_persistent_volume, timeout).get("items") or []
    if namespace is None:
        claims = raw_call(core.list_persistent_volume_claim_for_all_namespaces, timeout).get("items") or []
    else:
        claims = raw_call(core.list_namespaced_persistent_volume_claim, timeout, namespace).get("items") or []
    return volumes, claims


def wipe(path: str, root: str = LOCAL_VOLUME_ROOT) -> int:
    """Delete what the directory holds (not the directory itself); returns the number of entries.
    Refuses a path that is not under `root` once symlinks are resolved."""
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    if not real.startswith(base + os.sep):
        raise ValueError(f"{path} is not under {root}")
    if not os.path.isdir(real):
        return 0
    n = 0
    for entry in os.scandir(real):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
        n += 1
    return n


def reclaim(api_client: Any, items: Sequence[Reclaim], echo: Callable[[str], Any],
            root: str = LOCAL_VOLUME_ROOT) -> tuple[list[str], list[str]]:
    """Give the volumes back: delete their old data, then free the reference (JSON patch conditioned
    on the resourceVersion read). Returns (volumes given back, problems, each with a fix)."""
    from kubernetes import client

    from .kubeapi import ApiError, raw_call

    core = client.CoreV1Api(api_client)
    done: list[str] = []
    problems: list[str] = []
    for item in items:
        try:
            entries = wipe(item.path, root)
        except (OSError, ValueError) as err:
            problems.append(f"cannot delete the old data of {item.describe()}: {err}. Fix: run as root (the local "
                            f"cluster's volumes belong to root), or delete {item.path} by hand and rerun")
            continue
        try:
            raw_call(core.patch_persistent_volume, (5.0, 30.0), item.volume, release_patch(item),
                     _content_type="application/json-patch+json")
        except ApiError as err:
            if err.status in (409, 422):  # the test op failed: someone changed the volume since we read it
                problems.append(f"{item.describe()} changed while being given back ({err.message or err.reason}); "
                                "left alone. Fix: rerun `slurmk8s cluster reclaim-volumes`")
            elif err.status == 404:
                problems.append(f"{item.describe()} is gone")
            else:
                problems.append(f"cannot free {item.describe()}: {err}")
            continue
        echo(f"volume {item.volume}: its claim {item.claim} was deleted; old data deleted ({entries} entries under "
             f"{item.path}), Available again for a new claim {item.claim}")
        done.append(item.volume)
    return done, problems


__all__ = ["LOCAL_VOLUME_ROOT", "Reclaim", "claim_uids", "stale_reference", "released_for", "host_path",
           "is_local_volume", "reclaimable", "release_patch", "release_fix", "is_local_cluster", "local_server",
           "read_volumes_and_claims", "wipe", "reclaim"]
